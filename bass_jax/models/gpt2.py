"""GPT-2 (Radford et al. 2019) as a Flax module over a ragged cache: the common shape of small drafts.

Reference implementation: transformers' ``modeling_gpt2.py`` (``GPT2LMHeadModel``): learned absolute
positions (no offset), pre-layer-norm blocks, a fused ``c_attn`` projection whose ``Conv1D`` weight is
stored ``[in, out]`` (already Flax's kernel layout, unlike ``nn.Linear``), GELU (tanh) MLP, LM head tied to
the token embedding. Multi-head attention (K = N); ``scale_attn_weights=False`` drops the 1/sqrt(H).

Axes: B batch, T new tokens, D width (``n_embd``), N heads, H head dim.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache, KVUpdate
from bass_jax.models import common
from bass_jax.models import decoder_config
from bass_jax.models import family
from bass_jax.sharding import EMBED, HEADS, KV_HEADS, MLP, NORMS, VOCAB, dense

# GPT2Config fields with no effect on a causal LM forward (the sequence-summary head is another model).
_IGNORED = {"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
            "summary_first_dropout", "reorder_and_upcast_attn"}


@dataclasses.dataclass(frozen=True)
class GPT2Config(decoder_config.CacheFromShape):
  """Architecture of a GPT-2 decoder, with transformers' ``GPT2Config`` field names.

  Raises:
    ValueError: from ``__post_init__`` for non-positive sizes or heads that do not divide the width.
  """

  vocab_size: int
  n_embd: int
  n_layer: int
  n_head: int
  n_positions: int = 1024
  n_inner: int | None = None
  activation_function: str = "gelu_new"
  layer_norm_epsilon: float = 1e-5
  scale_attn_weights: bool = True
  tie_word_embeddings: bool = True
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  model_type: str = "gpt2"

  FIELDS = decoder_config.FieldTable(num_layers="n_layer", max_positions="n_positions",
                                     num_heads="n_head", hidden_size="n_embd", mlp_width="n_inner")
  # How the parameters lie on a mesh (bass_jax.sharding: path pattern -> logical axes).
  PARAM_AXES = (
      ("wte/embedding", (VOCAB, EMBED)), ("wpe/embedding", (None, EMBED)),
      *dense(r"h_\d+/q_proj", EMBED, HEADS),
      *dense(r"h_\d+/k_proj", EMBED, KV_HEADS),
      *dense(r"h_\d+/v_proj", EMBED, KV_HEADS),
      *dense(r"h_\d+/attn_proj", HEADS, EMBED),
      *dense(r"h_\d+/c_fc", EMBED, MLP),
      *dense(r"h_\d+/mlp_proj", MLP, EMBED),
      ("lm_head", (VOCAB, EMBED)),  # untied: [V, D]
      *NORMS,
  )

  def __post_init__(self):
    for name in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
      if getattr(self, name) < 1:
        raise ValueError(f"GPT2Config.{name} must be >= 1, got {getattr(self, name)}")
    if self.n_embd % self.n_head:
      raise ValueError(f"GPT2Config: n_head={self.n_head} does not divide n_embd={self.n_embd}")
    if self.n_inner is None:
      object.__setattr__(self, "n_inner", 4 * self.n_embd)
    common.activation(self.activation_function, "activation_function")
    self._freeze_eos()

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32,
                  scan_layers: bool = False) -> "GPT2":
    return GPT2(self, attention_impl=attention_impl, dtype=dtype, scan_layers=scan_layers)


  def num_params(self) -> int:
    d, f = self.n_embd, self.n_inner
    per_layer = 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * d * f + f + d
    total = (self.vocab_size + self.n_positions) * d + self.n_layer * per_layer + 2 * d
    return total + (0 if self.tie_word_embeddings else self.vocab_size * d)

  @classmethod
  def from_hf_config(cls, hf_config: Any) -> "GPT2Config":
    """Converts a transformers ``GPT2Config`` (or its dict); every field is accounted for.

    Raises:
      ValueError: another model type, an unknown field (named), cross-attention, or
        ``scale_attn_by_inverse_layer_idx`` (a per-layer scale the port does not implement).
    """
    known = {f.name for f in dataclasses.fields(cls)} - {"model_type"}
    _, kwargs = decoder_config.parse_hf_fields(
        hf_config, model_types=("gpt2",), known=known, ignored=_IGNORED,
        required={"add_cross_attention": False, "scale_attn_by_inverse_layer_idx": False})
    return decoder_config.build(cls, "gpt2", kwargs)

  def to_hf_config(self):
    import transformers  # pylint: disable=g-import-not-at-top

    return transformers.GPT2Config(**self.hf_fields())


class GPT2Block(nn.Module):
  """``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

  config: GPT2Config
  attention_impl: str
  dtype: Any

  @nn.compact
  def __call__(self, x, k_cache, v_cache, cache_lengths, positions, tree_mask=None):
    del positions  # GPT-2's are learned and added before the first layer
    cfg = self.config
    batch, num_new, _ = x.shape
    dense = lambda features, name: nn.Dense(features, dtype=self.dtype, param_dtype=self.dtype, name=name)
    norm = lambda name: nn.LayerNorm(cfg.layer_norm_epsilon, dtype=self.dtype, param_dtype=self.dtype,
                                     name=name)
    h = norm("ln_1")(x)
    heads = lambda t: t.reshape(batch, num_new, cfg.n_head, cfg.head_dim)
    q, k, v = (heads(dense(cfg.n_embd, f"{n}_proj")(h)) for n in "qkv")
    out, k, v = common.cached_attention(
        q, k, v, k_cache=k_cache, v_cache=v_cache, cache_lengths=cache_lengths,
        attention_impl=self.attention_impl, sm_scale=None if cfg.scale_attn_weights else 1.0,
        tree_mask=tree_mask)
    x = x + dense(cfg.n_embd, "attn_proj")(out.reshape(batch, num_new, cfg.n_embd))
    h = norm("ln_2")(x)
    h = dense(cfg.n_embd, "mlp_proj")(common.activation(cfg.activation_function)(dense(cfg.n_inner, "c_fc")(h)))
    return x + h, k, v


class GPT2(nn.Module):
  """GPT-2 causal LM over a ragged KV cache; the call signature of ``models.llama_layers.Llama``."""

  config: GPT2Config
  attention_impl: str = "reference"
  dtype: Any = jnp.float32
  scan_layers: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, cache: KVCache | None = None, compute_logits: bool = True,
               tree_mask: jax.Array | None = None) -> tuple[jax.Array | None, KVCache | KVUpdate]:
    cfg = self.config
    embed = nn.Embed(cfg.vocab_size, cfg.n_embd, dtype=self.dtype, param_dtype=self.dtype, name="wte")
    positions = common.positions_of(tokens, cache, tree_mask)
    position_table = nn.Embed(cfg.n_positions, cfg.n_embd, dtype=self.dtype, param_dtype=self.dtype,
                              name="wpe")
    x = embed(tokens) + position_table(
        common.learned_position_ids(positions, cfg.n_positions))
    x, update = common.run_layers(
        GPT2Block, cfg.n_layer, name="h", x=x, cache=cache, positions=positions,
        config=cfg, attention_impl=self.attention_impl, dtype=self.dtype, tree_mask=tree_mask,
        scan=self.scan_layers)
    x = nn.LayerNorm(cfg.layer_norm_epsilon, dtype=self.dtype, param_dtype=self.dtype, name="ln_f")(x)
    self.sow("intermediates", common.FEATURES, x)
    if not compute_logits and not self.is_initializing():
      return None, update
    if cfg.tie_word_embeddings:
      weight = embed.embedding.astype(self.dtype)
    else:
      weight = self.param("lm_head", nn.initializers.lecun_normal(), (cfg.vocab_size, cfg.n_embd),
                          self.dtype)
    return jnp.einsum("BTD,VD->BTV", x, weight, preferred_element_type=jnp.float32), update


family.register_family(family.Family("gpt2", GPT2Config, "GPT2LMHeadModel", layers_key="h"))
