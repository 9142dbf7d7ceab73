"""The EAGLE drafts' Flax modules: :class:`EagleDraft` (this project's draft, EAGLE-1/2's and EAGLE-3's,
by ``config.kind``) and :class:`Eagle3Layer`. What a draft is (``EagleConfig``, its checks against a
target, its parameters and binding) is ``models.eagle``; references as there (SafeAILab ``cnets.py``,
vLLM ``llama_eagle3.py``).

Axes: B batch, T new tokens, E the draft's width (the target's hidden size), V vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache, KVUpdate
from bass_jax.models import common
from bass_jax.models.llama import LlamaConfig
from bass_jax.models.llama_layers import LlamaAttention, LlamaDecoderLayer, LlamaMLP, RMSNorm

if TYPE_CHECKING:
  from bass_jax.models.eagle import EagleConfig


def _pass_last_block(key, shape, dtype=jnp.float32):
  """``[(n+1)E, E]``: zeros, and the identity on the last E rows (the fusion passes ``f`` through)."""
  del key
  e = shape[1]
  return jnp.zeros(shape, dtype).at[-e:].set(jnp.eye(e, dtype=dtype))


class EagleDraft(nn.Module):
  """``(tokens i32[B, T], features [B, T, E], embedding [V, E], cache) -> (f̂ [B, T, E], cache)``.

  Token t of row b is ``x_{i+1}`` and ``features[b, t]`` is ``f_i`` for ``i = cache.lengths[b] + t``
  (the pair's position, also its rotary position); the output is ``f̂_{i+1}``. The cache follows
  ``models.common``'s conventions (without one: a full causal forward returning a :class:`KVUpdate`).
  With ``fused_layers``, features of width ``config.input_feature_size`` (the target's hidden states
  of those layers, then ``f``) are fused first; features of width E are the draft's own.

  Raises:
    ValueError: features of another width.
  """

  config: EagleConfig
  attention_impl: str = "reference"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens, features, embedding, cache: KVCache | None = None, tree_mask=None):
    if self.config.kind == "eagle3":
      return self._eagle3(tokens, features, embedding, cache, tree_mask)
    cfg = self.config.layer
    e, width = self.config.feature_size, features.shape[-1]
    features = features.astype(self.dtype)
    if self.config.fused_layers and width != e:  # the target's fused features (init passes them)
      if width != self.config.input_feature_size:
        raise ValueError(f"EagleDraft: features of width {width}; this draft reads {e} (its own) or "
                         f"{self.config.input_feature_size} (hidden states of layers "
                         f"{self.config.fused_layers}, then the feature)")
      hidden = features[..., :-e].reshape(features.shape[:-1] + (-1, e))
      hidden = hidden * jax.lax.rsqrt(jnp.mean(hidden * hidden, axis=-1, keepdims=True) + 1e-6)
      fused = jnp.concatenate([hidden.reshape(features.shape[:-1] + (-1,)), features[..., -e:]], -1)
      features = nn.Dense(e, use_bias=False, dtype=self.dtype, param_dtype=self.dtype,
                          kernel_init=_pass_last_block, name="fuse")(fused)
    elif width != e:
      raise ValueError(f"EagleDraft: features of width {width}, this draft reads {e}")
    embedded = jnp.take(embedding, tokens, axis=0).astype(self.dtype)
    x = jnp.concatenate([embedded, features], axis=-1)
    x = nn.Dense(cfg.hidden_size, use_bias=self.config.fc_bias, dtype=self.dtype,
                 param_dtype=self.dtype, name="fc")(x)
    positions = common.positions_of(tokens, cache, tree_mask)
    sin, cos = cfg.rotary.sin_cos(positions, self.dtype)
    per_layer = None
    if self.config.kind == "eagle1":  # EAGLE-1/2's first layer has no input norm (cnets1.py)
      per_layer = lambda i: {"input_norm": i > 0}
    return common.run_layers(
        LlamaDecoderLayer, cfg.num_hidden_layers, name="layers", x=x, cache=cache,
        positions=positions, extras=(sin, cos), config=cfg, attention_impl=self.attention_impl,
        dtype=self.dtype, tree_mask=tree_mask, per_layer=per_layer)

  def _eagle3(self, tokens, features, embedding, cache, tree_mask):
    """EAGLE-3's step (SafeAILab ``cnets.py`` ``Model.forward`` with ``LlamaDecoderLayeremb``):
    ``x = fc(taps)`` for the target's tapped features (width ``input_feature_size``), the draft's own
    fed-back hidden state otherwise (width E); then one layer over ``cat(input_layernorm(embed),
    hidden_norm(x))`` with the residual ``x`` (``hidden_norm(x)`` with ``norm_before_residual``).
    Returns the pre-norm output, as the draft feeds it back."""
    cfg = self.config.layer
    e, width = self.config.feature_size, features.shape[-1]
    x = features.astype(self.dtype)
    if width == self.config.input_feature_size and width != e:
      x = nn.Dense(e, use_bias=False, dtype=self.dtype, param_dtype=self.dtype, name="fc")(x)
    elif width != e:
      raise ValueError(f"EagleDraft: features of width {width}; this EAGLE-3 draft reads "
                       f"{self.config.input_feature_size} (taps of layers {self.config.taps}) or "
                       f"{e} (its own)")
    embedded = jnp.take(embedding, tokens, axis=0).astype(self.dtype)
    positions = common.positions_of(tokens, cache, tree_mask)
    sin, cos = cfg.rotary.sin_cos(positions, self.dtype)
    layer = Eagle3Layer(cfg, self.attention_impl, self.dtype, self.config.norm_before_residual,
                        name="layers_0")
    if cache is None:
      x, k, v = layer(x, embedded, None, None, None, sin, cos)
      return x, KVUpdate(k=(k,), v=(v,))
    x, k, v = layer(x, embedded, cache.k[0], cache.v[0], cache.lengths, sin, cos, tree_mask)
    return x, KVCache(k=(k,), v=(v,), lengths=cache.lengths + tokens.shape[1])


class Eagle3Layer(nn.Module):
  """EAGLE-3's decoder layer (SafeAILab ``cnets.py`` ``LlamaDecoderLayeremb``; vLLM
  ``llama_eagle3.py``): attention whose q, k, v read ``cat(input_layernorm(embedded),
  hidden_norm(x))`` (width 2E), then the residual, the post-attention norm and the SwiGLU MLP.

  ``__call__(x [B, T, E], embedded [B, T, E], k_cache, v_cache, cache_lengths, sin, cos,
  tree_mask=None) -> (x [B, T, E], k, v)`` as ``common.cached_attention`` returns them.
  """

  config: LlamaConfig
  attention_impl: str
  dtype: Any
  norm_before_residual: bool = False

  @nn.compact
  def __call__(self, x, embedded, k_cache, v_cache, cache_lengths, sin, cos, tree_mask=None):
    cfg = self.config
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, self.dtype, name=name)
    hidden = norm("hidden_norm")(x)
    residual = hidden if self.norm_before_residual else x
    attn_in = jnp.concatenate([norm("input_layernorm")(embedded), hidden], axis=-1)
    attn, k, v = LlamaAttention(cfg, self.attention_impl, self.dtype, name="self_attn")(
        attn_in, k_cache, v_cache, cache_lengths, sin, cos, tree_mask)
    x = residual + attn
    return x + LlamaMLP(cfg, self.dtype, name="mlp")(norm("post_attention_layernorm")(x)), k, v
