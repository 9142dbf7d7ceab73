"""The Llama family's Flax modules: RMSNorm, attention, the gated MLP, the decoder layer and the causal
LM over a ragged cache. What a family is (its config, its :data:`~bass_jax.models.llama.TRAITS` row, its
Hugging Face conversion) is ``models.llama``; these modules read it from their ``config``. References
as there: transformers' ``modeling_llama.py``, ``modeling_qwen2.py``, ``modeling_qwen3.py``,
``modeling_gemma2.py``, ``modeling_gemma3.py``, ``modeling_phi3.py``.

Axes: B batch, T new tokens, S cache slots, D hidden size, F MLP size, N query heads, K key/value heads,
H head dim, R rotated channels, V vocabulary.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache, KVUpdate
from bass_jax.models import attention as attention_lib
from bass_jax.models import common
from bass_jax.models import rope as rope_lib
from bass_jax.sharding import EMBED, HEADS, KV_HEADS, MLP, NORMS, VOCAB, dense

if TYPE_CHECKING:
  from bass_jax.models.llama import LlamaConfig

# How a Llama-like model's parameters lie on a mesh (``bass_jax.sharding``: path pattern -> logical
# axes, the first match deciding): ``LlamaConfig.PARAM_AXES``. An EAGLE draft's layers are these.
LAYER_PARAM_AXES = (
    *dense(r"layers_\d+/self_attn/q_proj", EMBED, HEADS),
    *dense(r"layers_\d+/self_attn/k_proj", EMBED, KV_HEADS),
    *dense(r"layers_\d+/self_attn/v_proj", EMBED, KV_HEADS),
    *dense(r"layers_\d+/self_attn/o_proj", HEADS, EMBED),
    *dense(r"layers_\d+/mlp/gate_proj", EMBED, MLP),
    *dense(r"layers_\d+/mlp/up_proj", EMBED, MLP),
    *dense(r"layers_\d+/mlp/down_proj", MLP, EMBED),
)
PARAM_AXES = (("embed_tokens/embedding", (VOCAB, EMBED)), *LAYER_PARAM_AXES, ("lm_head", (EMBED, VOCAB)),
              (r"layers_\d+/self_attn/(q|k)_norm/scale", (None,)),  # per head: [H], replicated
              *NORMS)


class RMSNorm(nn.Module):
  """Root-mean-square layer norm over the last axis.

  ``gemma=False``: HF Llama's order (normalize in f32, cast, then scale by ``w``); ``gemma=True``:
  Gemma's (normalize and scale by ``1 + w`` in f32, then cast; ``w`` starts at zero).
  """

  eps: float
  dtype: Any = jnp.float32
  gemma: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = nn.initializers.zeros if self.gemma else nn.initializers.ones
    scale = self.param("scale", init, (x.shape[-1],), self.dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.gemma:
      return (normed * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)
    return scale * normed.astype(self.dtype)


class LlamaAttention(nn.Module):
  """Grouped-query self-attention that writes its new K/V into its layer's cache.

  ``__call__(x [B, T, D], k_cache/v_cache [B, K, S, H] | None, cache_lengths i32[B] | None, sin/cos
  [B, T, 1, R]) -> (out [B, T, D], k, v)`` with ``k, v`` as ``common.cached_attention`` returns them
  (R the rotated channels, ``<= H``). ``sliding``: this layer attends through the config's window.
  """

  config: LlamaConfig
  attention_impl: str
  dtype: Any
  sliding: bool = False

  @nn.compact
  def __call__(self, x, k_cache, v_cache, cache_lengths, sin, cos, tree_mask=None):
    cfg = self.config
    batch, num_new, _ = x.shape
    dense = lambda features, bias, name: nn.Dense(
        features, use_bias=bias, dtype=self.dtype, param_dtype=self.dtype, name=name)
    qkv_bias = cfg.attention_bias or cfg.qkv_bias
    q = dense(cfg.num_attention_heads * cfg.head_dim, qkv_bias, "q_proj")(x)
    k = dense(cfg.num_key_value_heads * cfg.head_dim, qkv_bias, "k_proj")(x)
    v = dense(cfg.num_key_value_heads * cfg.head_dim, qkv_bias, "v_proj")(x)
    q = q.reshape(batch, num_new, cfg.num_attention_heads, cfg.head_dim)
    k = k.reshape(batch, num_new, cfg.num_key_value_heads, cfg.head_dim)
    if cfg.traits.qk_norm:
      gemma = cfg.traits.qk_norm == "gemma"
      q = RMSNorm(cfg.rms_norm_eps, self.dtype, gemma, name="q_norm")(q)
      k = RMSNorm(cfg.rms_norm_eps, self.dtype, gemma, name="k_norm")(k)
    q = rope_lib.apply_rotary(q, sin, cos)
    k = rope_lib.apply_rotary(k, sin, cos)
    v = v.reshape(batch, num_new, cfg.num_key_value_heads, cfg.head_dim)
    sm_scale = None if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar ** -0.5
    out, k, v = common.cached_attention(
        q, k, v, k_cache=k_cache, v_cache=v_cache, cache_lengths=cache_lengths,
        attention_impl=self.attention_impl, sm_scale=sm_scale,
        sliding_window=cfg.sliding_window if self.sliding else None,
        logit_soft_cap=cfg.attn_logit_softcapping, tree_mask=tree_mask)
    out = out.reshape(batch, num_new, cfg.num_attention_heads * cfg.head_dim)
    return dense(cfg.hidden_size, cfg.attention_bias, "o_proj")(out), k, v


class LlamaMLP(nn.Module):
  """Gated MLP: ``down(act(gate(x)) * up(x))``, ``[B, T, D] -> [B, T, D]`` (SwiGLU; Gemma's GeGLU)."""

  config: LlamaConfig
  dtype: Any

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    dense = lambda features, name: nn.Dense(
        features, use_bias=cfg.mlp_bias, dtype=self.dtype, param_dtype=self.dtype, name=name)
    gate = dense(cfg.intermediate_size, "gate_proj")(x)
    up = dense(cfg.intermediate_size, "up_proj")(x)
    return dense(cfg.hidden_size, "down_proj")(common.activation(cfg.hidden_act)(gate) * up)


class LlamaDecoderLayer(nn.Module):
  """One pre-norm block over its own cache: ``(x, k_cache, v_cache, cache_lengths, positions, sin, cos,
  local_sin=None, local_cos=None) -> (x, k, v)`` (the updated cache arrays, or the new K/V without a
  cache). A ``sliding`` layer attends through the window and takes the local rotary tables when
  given (Gemma 3). Gemma's layers also norm the attention's and the MLP's outputs before adding them.
  """

  config: LlamaConfig
  attention_impl: str
  dtype: Any
  sliding: bool = False
  input_norm: bool = True  # False: EAGLE-1/2's draft layer, which attends over its input unnormed

  @nn.compact
  def __call__(self, x, k_cache, v_cache, cache_lengths, positions, sin, cos, local_sin=None,
               local_cos=None, tree_mask=None):
    del positions  # carried by sin and cos
    cfg = self.config
    gemma = cfg.traits.gemma
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, self.dtype, gemma, name=name)
    if self.sliding and local_sin is not None:
      sin, cos = local_sin, local_cos
    h = norm("input_layernorm")(x) if self.input_norm else x
    attn, k, v = LlamaAttention(cfg, self.attention_impl, self.dtype, self.sliding,
                                name="self_attn")(h, k_cache, v_cache, cache_lengths, sin, cos,
                                                  tree_mask)
    if not gemma:
      x = x + attn
      h = norm("post_attention_layernorm")(x)
      return x + LlamaMLP(cfg, self.dtype, name="mlp")(h), k, v
    x = x + norm("post_attention_layernorm")(attn)
    h = norm("pre_feedforward_layernorm")(x)
    x = x + norm("post_feedforward_layernorm")(LlamaMLP(cfg, self.dtype, name="mlp")(h))
    return x, k, v


class Llama(nn.Module):
  """Llama-family causal LM over a ragged KV cache.

  ``__call__(tokens: i32[B, T], cache: KVCache | None, compute_logits=True, tree_mask=None) -> (logits:
  f32[B, T, V], KVCache | KVUpdate)``: token t of row b sits at position ``cache.lengths[b] + t``, its
  K/V are written at that slot and it attends to every slot up to its own; the returned cache has
  ``lengths + T`` (a caller that keeps fewer of the new tokens, after rejected drafts or prompt
  padding, sets the lengths back with ``cache.with_lengths``). Without a cache, token t sits at position t and attends to tokens
  ``0 … t``, and their K/V come back as a :class:`KVUpdate`. ``compute_logits=False`` (prefill) skips the
  LM head and returns ``None`` logits. ``tree_mask: bool[B, T, M]`` makes the tokens the nodes of a
  token tree (``common.forward``). Parameter names follow HF's module tree (``embed_tokens``,
  ``layers_0/self_attn/q_proj`` …).
  """

  config: LlamaConfig
  attention_impl: str = "reference"
  dtype: Any = jnp.float32
  scan_layers: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, cache: KVCache | None = None, compute_logits: bool = True,
               tree_mask: jax.Array | None = None) -> tuple[jax.Array | None, KVCache | KVUpdate]:
    cfg = self.config
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype, param_dtype=self.dtype,
                     name="embed_tokens")
    x = embed(tokens)
    if cfg.traits.gemma:
      x = x * jnp.asarray(math.sqrt(cfg.hidden_size), self.dtype)
    positions = common.positions_of(tokens, cache, tree_mask)  # [B, T] or [1, T]
    tables = cfg.rotary.sin_cos(positions, self.dtype)
    if cfg.local_rope is not None:
      tables += cfg.local_rope.sin_cos(positions, self.dtype)
    per_layer = None
    if cfg.sliding_window is not None:
      per_layer = lambda i: {"sliding": cfg.is_sliding(i)}
    x, update = common.run_layers(
        LlamaDecoderLayer, cfg.num_hidden_layers, name="layers", x=x, cache=cache,
        positions=positions, extras=tables, config=cfg, attention_impl=self.attention_impl,
        dtype=self.dtype, tree_mask=tree_mask, scan=self.scan_layers, per_layer=per_layer,
        on_layer=(lambda h: self.sow("intermediates", common.HIDDEN, h))
        if self.is_mutable_collection("intermediates") else None)

    x = RMSNorm(cfg.rms_norm_eps, self.dtype, cfg.traits.gemma, name="norm")(x)
    self.sow("intermediates", common.FEATURES, x)
    if not compute_logits and not self.is_initializing():
      return None, update
    if cfg.tie_word_embeddings:
      logits = jnp.einsum("BTD,VD->BTV", x, embed.embedding.astype(self.dtype),
                          preferred_element_type=jnp.float32)
    else:
      kernel = self.param("lm_head", nn.initializers.lecun_normal(),
                          (cfg.hidden_size, cfg.vocab_size), self.dtype)
      logits = jnp.einsum("BTD,DV->BTV", x, kernel, preferred_element_type=jnp.float32)
    return attention_lib.soft_cap(logits, cfg.final_logit_softcapping), update
