"""CodeGen (Nijkamp et al. 2023) as a Flax module over a ragged cache: the paper's CodeGen-Mono pair.

Reference implementation: transformers' ``modeling_codegen.py`` (``CodeGenForCausalLM``): GPT-J-style
blocks where attention and MLP read the same layer-normed input and are added in parallel, rotary
embeddings on the first ``rotary_dim`` channels of each head with *interleaved* pairs
(``rotate_every_two``, sin/cos repeated per pair, base 10000), no positional embedding table, a GELU
(tanh) MLP, and an untied LM head with a bias. The checkpoint fuses q, k, v into one ``qkv_proj`` laid
out for 4-way model parallelism; the conversion (``checkpoints/hf.py``) splits it into ``q_proj``,
``k_proj`` and ``v_proj``.

Axes: B batch, T new tokens, D width (``n_embd``), N heads, H head dim, R rotary dims.
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

MP_NUM = 4  # CodeGen's fused qkv is laid out as 4 model-parallel shards of [q | v | k]


@dataclasses.dataclass(frozen=True)
class CodeGenConfig(decoder_config.CacheFromShape):
  """Architecture of a CodeGen decoder, with transformers' ``CodeGenConfig`` field names.

  Raises:
    ValueError: from ``__post_init__`` for non-positive sizes, heads not divisible by 4 (the fused
      qkv layout needs it) or not dividing the width, or an odd / oversized ``rotary_dim``.
  """

  vocab_size: int
  n_embd: int
  n_layer: int
  n_head: int
  rotary_dim: int
  n_positions: int = 2048
  n_ctx: int = 2048
  n_inner: int | None = None
  activation_function: str = "gelu_new"
  layer_norm_epsilon: float = 1e-5
  tie_word_embeddings: bool = False
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  model_type: str = "codegen"

  FIELDS = decoder_config.FieldTable(num_layers="n_layer", max_positions="n_positions",
                                     num_heads="n_head", hidden_size="n_embd", mlp_width="n_inner")
  # How the parameters lie on a mesh (bass_jax.sharding: path pattern -> logical axes).
  PARAM_AXES = (
      ("wte/embedding", (VOCAB, EMBED)),
      *dense(r"h_\d+/q_proj", EMBED, HEADS),
      *dense(r"h_\d+/k_proj", EMBED, KV_HEADS),
      *dense(r"h_\d+/v_proj", EMBED, KV_HEADS),
      *dense(r"h_\d+/out_proj", HEADS, EMBED),
      *dense(r"h_\d+/fc_in", EMBED, MLP),
      *dense(r"h_\d+/fc_out", MLP, EMBED),
      ("lm_head", (VOCAB, EMBED)), ("lm_head_bias", (VOCAB,)),  # CodeGen's head is [V, D]
      *NORMS,
  )

  def __post_init__(self):
    for name in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
      if getattr(self, name) < 1:
        raise ValueError(f"CodeGenConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.n_embd % self.n_head or self.n_head % MP_NUM:
      raise ValueError(f"CodeGenConfig: n_head={self.n_head} must divide n_embd={self.n_embd} and be "
                       f"a multiple of {MP_NUM} (CodeGen's fused qkv layout)")
    if self.rotary_dim is None or self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
      raise ValueError(f"CodeGenConfig.rotary_dim must be even and in (0, head_dim={self.head_dim}], "
                       f"got {self.rotary_dim}")
    if self.n_inner is None:
      object.__setattr__(self, "n_inner", 4 * self.n_embd)
    common.activation(self.activation_function, "activation_function")
    self._freeze_eos()

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32,
                  scan_layers: bool = False) -> "CodeGen":
    return CodeGen(self, attention_impl=attention_impl, dtype=dtype, scan_layers=scan_layers)


  def num_params(self) -> int:
    d, f = self.n_embd, self.n_inner
    per_layer = 2 * d + 4 * d * d + 2 * d * f + f + d
    head = (0 if self.tie_word_embeddings else self.vocab_size * d) + self.vocab_size
    return self.vocab_size * d + self.n_layer * per_layer + 2 * d + head

  @classmethod
  def from_hf_config(cls, hf_config: Any) -> "CodeGenConfig":
    """Converts a transformers ``CodeGenConfig`` (or its dict); every field is accounted for.

    Raises:
      ValueError: another model type, an unknown field (named), or ``rotary_dim`` unset.
    """
    known = {f.name for f in dataclasses.fields(cls)} - {"model_type"}
    _, kwargs = decoder_config.parse_hf_fields(hf_config, model_types=("codegen",), known=known)
    return decoder_config.build(cls, "codegen", kwargs)

  def to_hf_config(self):
    import transformers  # pylint: disable=g-import-not-at-top

    return transformers.CodeGenConfig(**self.hf_fields())


def interleaved_rotary(x: jax.Array, positions: jax.Array, rotary_dim: int) -> jax.Array:
  """GPT-J rotary on the first ``rotary_dim`` channels of ``x: [B, T, N, H]``, pairs (0,1), (2,3) …

  ``x_rot * cos + rotate_every_two(x_rot) * sin`` with ``rotate_every_two(x)[2i, 2i+1] =
  (-x[2i+1], x[2i])`` and each frequency's sin/cos repeated for its pair; the rest passes through.
  """
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, R/2]
  sin = jnp.repeat(jnp.sin(angles), 2, axis=-1)[:, :, None, :].astype(x.dtype)
  cos = jnp.repeat(jnp.cos(angles), 2, axis=-1)[:, :, None, :].astype(x.dtype)
  rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
  pairs = rot.reshape(*rot.shape[:-1], rotary_dim // 2, 2)
  rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(rot.shape)
  return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1)


class CodeGenBlock(nn.Module):
  """``x + attn(ln_1(x)) + mlp(ln_1(x))`` (parallel residual)."""

  config: CodeGenConfig
  attention_impl: str
  dtype: Any

  @nn.compact
  def __call__(self, x, k_cache, v_cache, cache_lengths, positions, tree_mask=None):
    cfg = self.config
    batch, num_new, _ = x.shape
    dense = lambda features, bias, name: nn.Dense(features, use_bias=bias, dtype=self.dtype,
                                                  param_dtype=self.dtype, name=name)
    h = nn.LayerNorm(cfg.layer_norm_epsilon, dtype=self.dtype, param_dtype=self.dtype, name="ln_1")(x)
    heads = lambda t: t.reshape(batch, num_new, cfg.n_head, cfg.head_dim)
    q, k, v = (heads(dense(cfg.n_embd, False, f"{n}_proj")(h)) for n in "qkv")
    q = interleaved_rotary(q, positions, cfg.rotary_dim)
    k = interleaved_rotary(k, positions, cfg.rotary_dim)
    out, k, v = common.cached_attention(
        q, k, v, k_cache=k_cache, v_cache=v_cache, cache_lengths=cache_lengths,
        attention_impl=self.attention_impl, tree_mask=tree_mask)
    attn = dense(cfg.n_embd, False, "out_proj")(out.reshape(batch, num_new, cfg.n_embd))
    mlp = dense(cfg.n_embd, True, "fc_out")(
        common.activation(cfg.activation_function)(dense(cfg.n_inner, True, "fc_in")(h)))
    return x + attn + mlp, k, v


class CodeGen(nn.Module):
  """CodeGen causal LM over a ragged KV cache; the call signature of ``models.llama_layers.Llama``."""

  config: CodeGenConfig
  attention_impl: str = "reference"
  dtype: Any = jnp.float32
  scan_layers: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, cache: KVCache | None = None, compute_logits: bool = True,
               tree_mask: jax.Array | None = None) -> tuple[jax.Array | None, KVCache | KVUpdate]:
    cfg = self.config
    embed = nn.Embed(cfg.vocab_size, cfg.n_embd, dtype=self.dtype, param_dtype=self.dtype, name="wte")
    x = embed(tokens)
    x, update = common.run_layers(
        CodeGenBlock, cfg.n_layer, name="h", x=x, cache=cache,
        positions=common.positions_of(tokens, cache, tree_mask), config=cfg,
        attention_impl=self.attention_impl, dtype=self.dtype, tree_mask=tree_mask,
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
    bias = self.param("lm_head_bias", nn.initializers.zeros, (cfg.vocab_size,), self.dtype)
    logits = jnp.einsum("BTD,VD->BTV", x, weight, preferred_element_type=jnp.float32)
    return logits + bias.astype(jnp.float32), update


family.register_family(family.Family("codegen", CodeGenConfig, "CodeGenForCausalLM",
                                     layers_key="h"))
