"""OPT (Zhang et al. 2022) as a Flax module over a ragged cache: the paper's OPT-13B / OPT-125M pair.

Reference implementation: transformers' ``modeling_opt.py`` (``OPTForCausalLM``): learned absolute
positions looked up at ``position + 2`` (OPT's offset), pre- or post-layer-norm blocks
(``do_layer_norm_before``; OPT-350m is post-LN), biased projections, ReLU MLP, ``project_in`` /
``project_out`` when ``word_embed_proj_dim`` differs from ``hidden_size``, LM head tied to the token
embedding. Multi-head attention (K = N).

Axes: B batch, T new tokens, D hidden size, E word-embedding size, F MLP size, N heads, H head dim.
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

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: row 0 of the table serves position -2


@dataclasses.dataclass(frozen=True)
class OPTConfig(decoder_config.CacheFromShape):
  """Architecture of an OPT decoder, with transformers' ``OPTConfig`` field names.

  ``remove_final_layer_norm`` is HF's ``_remove_final_layer_norm``.

  Raises:
    ValueError: from ``__post_init__`` for non-positive sizes or heads that do not divide the width.
  """

  vocab_size: int
  hidden_size: int
  num_hidden_layers: int
  ffn_dim: int
  num_attention_heads: int
  max_position_embeddings: int = 2048
  word_embed_proj_dim: int | None = None
  do_layer_norm_before: bool = True
  remove_final_layer_norm: bool = False
  activation_function: str = "relu"
  enable_bias: bool = True
  layer_norm_elementwise_affine: bool = True
  tie_word_embeddings: bool = True
  bos_token_id: int | None = 2
  eos_token_id: int | tuple[int, ...] | None = 2
  pad_token_id: int | None = 1
  model_type: str = "opt"

  FIELDS = decoder_config.FieldTable(
      num_layers="num_hidden_layers", max_positions="max_position_embeddings",
      num_heads="num_attention_heads", hidden_size="hidden_size", mlp_width="ffn_dim")
  # How the parameters lie on a mesh (bass_jax.sharding: path pattern -> logical axes).
  PARAM_AXES = (
      ("embed_tokens/embedding", (VOCAB, None)),  # [V, word_embed_proj_dim]
      ("embed_positions/embedding", (None, EMBED)),
      ("project_in/kernel", (None, EMBED)), ("project_out/kernel", (EMBED, None)),
      *dense(r"layers_\d+/q_proj", EMBED, HEADS),
      *dense(r"layers_\d+/k_proj", EMBED, KV_HEADS),
      *dense(r"layers_\d+/v_proj", EMBED, KV_HEADS),
      *dense(r"layers_\d+/out_proj", HEADS, EMBED),
      *dense(r"layers_\d+/fc1", EMBED, MLP),
      *dense(r"layers_\d+/fc2", MLP, EMBED),
      ("lm_head", (VOCAB, None)),  # untied: [V, word_embed_proj_dim]
      *NORMS,
  )

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "ffn_dim", "num_attention_heads",
                 "max_position_embeddings"):
      if getattr(self, name) < 1:
        raise ValueError(f"OPTConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"OPTConfig: hidden_size {self.hidden_size} is not a multiple of "
                       f"num_attention_heads {self.num_attention_heads}")
    if self.word_embed_proj_dim is None:
      object.__setattr__(self, "word_embed_proj_dim", self.hidden_size)
    common.activation(self.activation_function, "activation_function")  # raises for an unsupported one
    self._freeze_eos()

  @property
  def projects(self) -> bool:
    """Whether ``project_in`` / ``project_out`` exist (word embedding narrower or wider than D)."""
    return self.word_embed_proj_dim != self.hidden_size

  @property
  def final_layer_norm(self) -> bool:
    return self.do_layer_norm_before and not self.remove_final_layer_norm

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32,
                  scan_layers: bool = False) -> "OPT":
    return OPT(self, attention_impl=attention_impl, dtype=dtype, scan_layers=scan_layers)


  def num_params(self) -> int:
    d, f, e, b = self.hidden_size, self.ffn_dim, self.word_embed_proj_dim, int(self.enable_bias)
    ln = 2 * d if self.layer_norm_elementwise_affine else 0
    per_layer = 4 * d * d + 4 * d * b + 2 * d * f + (f + d) * b + 2 * ln
    total = self.vocab_size * e + (self.max_position_embeddings + POSITION_OFFSET) * d
    total += self.num_hidden_layers * per_layer + (ln if self.final_layer_norm else 0)
    total += 2 * d * e if self.projects else 0
    return total + (0 if self.tie_word_embeddings else self.vocab_size * e)

  @classmethod
  def from_hf_config(cls, hf_config: Any) -> "OPTConfig":
    """Converts a transformers ``OPTConfig`` (or its dict); every field is accounted for.

    Raises:
      ValueError: another model type or an unknown field (named).
    """
    fields = dict(hf_config if isinstance(hf_config, dict) else hf_config.to_dict())
    if "_remove_final_layer_norm" in fields:
      fields["remove_final_layer_norm"] = fields.pop("_remove_final_layer_norm")
    known = {f.name for f in dataclasses.fields(cls)} - {"model_type"}
    _, kwargs = decoder_config.parse_hf_fields(fields, model_types=("opt",), known=known)
    return decoder_config.build(cls, "opt", kwargs)

  def to_hf_config(self):
    import transformers  # pylint: disable=g-import-not-at-top

    fields = self.hf_fields()
    fields["_remove_final_layer_norm"] = fields.pop("remove_final_layer_norm")
    return transformers.OPTConfig(**fields)


class OPTDecoderLayer(nn.Module):
  """One OPT block: attention then MLP, each residual, layer norm before (pre-LN) or after each."""

  config: OPTConfig
  attention_impl: str
  dtype: Any

  @nn.compact
  def __call__(self, x, k_cache, v_cache, cache_lengths, positions, tree_mask=None):
    del positions  # OPT's are learned and added before the first layer
    cfg = self.config
    batch, num_new, _ = x.shape
    dense = lambda features, name: nn.Dense(features, use_bias=cfg.enable_bias, dtype=self.dtype,
                                            param_dtype=self.dtype, name=name)
    norm = lambda name: nn.LayerNorm(1e-5, dtype=self.dtype, param_dtype=self.dtype, name=name,
                                     use_scale=cfg.layer_norm_elementwise_affine,
                                     use_bias=cfg.layer_norm_elementwise_affine)

    attn_norm = norm("self_attn_layer_norm")
    h = attn_norm(x) if cfg.do_layer_norm_before else x
    heads = lambda t: t.reshape(batch, num_new, cfg.num_attention_heads, cfg.head_dim)
    q, k, v = (heads(dense(cfg.hidden_size, f"{n}_proj")(h)) for n in "qkv")
    out, k, v = common.cached_attention(
        q, k, v, k_cache=k_cache, v_cache=v_cache, cache_lengths=cache_lengths,
        attention_impl=self.attention_impl, tree_mask=tree_mask)
    x = x + dense(cfg.hidden_size, "out_proj")(out.reshape(batch, num_new, cfg.hidden_size))
    if not cfg.do_layer_norm_before:
      x = attn_norm(x)

    mlp_norm = norm("final_layer_norm")
    h = mlp_norm(x) if cfg.do_layer_norm_before else x
    h = dense(cfg.hidden_size, "fc2")(common.activation(cfg.activation_function)(dense(cfg.ffn_dim, "fc1")(h)))
    x = x + h
    if not cfg.do_layer_norm_before:
      x = mlp_norm(x)
    return x, k, v


class OPT(nn.Module):
  """OPT causal LM over a ragged KV cache; the call signature of
  :class:`bass_jax.models.llama_layers.Llama`."""

  config: OPTConfig
  attention_impl: str = "reference"
  dtype: Any = jnp.float32
  scan_layers: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, cache: KVCache | None = None, compute_logits: bool = True,
               tree_mask: jax.Array | None = None) -> tuple[jax.Array | None, KVCache | KVUpdate]:
    cfg = self.config
    embed = nn.Embed(cfg.vocab_size, cfg.word_embed_proj_dim, dtype=self.dtype,
                     param_dtype=self.dtype, name="embed_tokens")
    x = embed(tokens)
    if cfg.projects:
      x = nn.Dense(cfg.hidden_size, use_bias=False, dtype=self.dtype, param_dtype=self.dtype,
                   name="project_in")(x)
    positions = common.positions_of(tokens, cache, tree_mask)
    position_table = nn.Embed(cfg.max_position_embeddings + POSITION_OFFSET, cfg.hidden_size,
                              dtype=self.dtype, param_dtype=self.dtype, name="embed_positions")
    x = x + position_table(common.learned_position_ids(
        positions, cfg.max_position_embeddings + POSITION_OFFSET, POSITION_OFFSET))
    x, update = common.run_layers(
        OPTDecoderLayer, cfg.num_hidden_layers, name="layers", x=x, cache=cache,
        positions=positions, config=cfg, attention_impl=self.attention_impl, dtype=self.dtype,
        tree_mask=tree_mask, scan=self.scan_layers)
    if cfg.final_layer_norm:
      x = nn.LayerNorm(1e-5, dtype=self.dtype, param_dtype=self.dtype, name="final_layer_norm",
                       use_scale=cfg.layer_norm_elementwise_affine,
                       use_bias=cfg.layer_norm_elementwise_affine)(x)
    if cfg.projects:
      x = nn.Dense(cfg.word_embed_proj_dim, use_bias=False, dtype=self.dtype, param_dtype=self.dtype,
                   name="project_out")(x)
    self.sow("intermediates", common.FEATURES, x)
    if not compute_logits and not self.is_initializing():
      return None, update
    if cfg.tie_word_embeddings:
      head = embed.embedding.astype(self.dtype)
    else:
      head = self.param("lm_head", nn.initializers.lecun_normal(),
                        (cfg.vocab_size, cfg.word_embed_proj_dim), self.dtype)
    logits = jnp.einsum("BTE,VE->BTV", x, head, preferred_element_type=jnp.float32)
    return logits, update


family.register_family(family.Family("opt", OPTConfig, "OPTForCausalLM"))
