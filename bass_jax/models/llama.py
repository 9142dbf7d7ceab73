"""The Llama family (Llama 2/3, SmolLM2, TinyLlama, Qwen2, Mistral) as a Flax module over a ragged cache.

Reference implementations: transformers' ``modeling_llama.py`` (``LlamaForCausalLM``), with Qwen2's bias
on the q, k, v projections (``modeling_qwen2.py``) and Mistral's sliding-window attention
(``modeling_mistral.py``): RMSNorm, rotary embeddings in HF's rotate-half convention, grouped-query
attention, SwiGLU MLP, tied or untied LM head. The tests compare logits with transformers in f32.

Axes: B batch, T new tokens, S cache slots, L layers, D hidden size, F MLP size, N query heads, K key/value
heads, H head dim, V vocabulary.

The module knows nothing of speculation: it maps ``tokens: i32[B, T]`` and a :class:`KVCache` to
``logits: f32[B, T, V]`` and the cache with the T new entries written at each row's own offset
``cache.lengths[b]``. The layers are unrolled, each with its own parameters (``layers_{i}``) and cache
arrays, or scanned (``scan_layers``: ``layers`` stacked ``[L, ...]``, a stacked cache;
``models.common.run_layers``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache, KVUpdate
from bass_jax.models import common

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "mistral": "MistralForCausalLM"}


@dataclasses.dataclass(frozen=True)
class LlamaConfig(common.CacheFromShape):
  """Architecture of a Llama-family decoder, with transformers' config field names.

  Attributes beyond HF's ``LlamaConfig``:
    model_type: ``"llama"``, ``"qwen2"`` or ``"mistral"``: the HF family it converts to and from.
    qkv_bias: bias on the q, k and v projections only (Qwen2); ``attention_bias`` (Llama) puts one on
      the output projection too.
    sliding_window: Mistral's window: a query at position p attends to positions ``> p - window``
      (None: the whole prefix).

  Raises:
    ValueError: from ``__post_init__`` if a size is not positive, the heads do not divide, the head dim
      is odd, the activation is not SwiGLU's ``silu``, or the model type is not of the family.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  max_position_embeddings: int = 2048
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  mlp_bias: bool = False
  hidden_act: str = "silu"
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  model_type: str = "llama"
  qkv_bias: bool = False
  sliding_window: int | None = None

  FIELDS = common.FieldTable(num_layers="num_hidden_layers", max_positions="max_position_embeddings",
                             num_heads="num_attention_heads", hidden_size="hidden_size",
                             num_kv_heads="num_key_value_heads", head_dim="head_dim",
                             architecture=_ARCHITECTURES)

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"LlamaConfig: num_attention_heads={self.num_attention_heads} is not a multiple of "
          f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention needs it)")
    if self.head_dim % 2:
      raise ValueError(f"LlamaConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
    if self.hidden_act != "silu":
      raise ValueError(f"LlamaConfig.hidden_act={self.hidden_act!r} is not supported; Llama uses 'silu'")
    if self.model_type not in _ARCHITECTURES:
      raise ValueError(f"LlamaConfig.model_type must be one of {sorted(_ARCHITECTURES)}, "
                       f"got {self.model_type!r}")
    if self.sliding_window is not None and self.sliding_window < 1:
      raise ValueError(f"LlamaConfig.sliding_window must be >= 1 or None, got {self.sliding_window}")
    self._freeze_eos()

  # -- the DecoderConfig protocol ---------------------------------------------------------------------

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32,
                  scan_layers: bool = False) -> "Llama":
    """The Flax module for this config; ``attention_impl`` names an entry of the attention registry."""
    return Llama(self, attention_impl=attention_impl, dtype=dtype, scan_layers=scan_layers)


  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    q_out, kv_out = self.num_attention_heads * h, self.num_key_value_heads * h
    attn = d * (q_out + 2 * kv_out) + q_out * d
    if self.attention_bias or self.qkv_bias:
      attn += q_out + 2 * kv_out
    if self.attention_bias:
      attn += d
    mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
    per_layer = attn + mlp + 2 * d
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_hidden_layers * per_layer + d + head

  # -- Hugging Face conversion ------------------------------------------------------------------------

  @classmethod
  def from_hf_config(cls, hf_config: Any) -> "LlamaConfig":
    """Converts a transformers ``LlamaConfig``, ``Qwen2Config`` or ``MistralConfig`` (or its dict).

    Every field is accounted for: mapped, known to be irrelevant to inference, or rejected.

    Raises:
      ValueError: another ``model_type``, an unknown field (named), or an unsupported value (rope
        scaling, ``pretraining_tp != 1``, Qwen2's sliding window layers, conflicting rope thetas).
    """
    fields = dict(hf_config if isinstance(hf_config, dict) else hf_config.to_dict())
    model_type = fields.get("model_type", "llama")
    rope_theta = _pop_rope_theta(fields)
    mapped = {f.name for f in dataclasses.fields(cls)} - {"model_type", "qkv_bias", "rope_theta"}
    required: dict[str, Any] = {"pretraining_tp": 1}
    ignored: set[str] = set()
    if model_type == "qwen2":
      mapped -= {"attention_bias", "mlp_bias", "head_dim"}
      required["use_sliding_window"] = False
      ignored |= {"sliding_window", "max_window_layers"}
      layer_types = set(fields.pop("layer_types", None) or ["full_attention"])
      if layer_types != {"full_attention"}:
        raise ValueError(f"qwen2: layer_types {sorted(layer_types)} (sliding-window layers) are not "
                         "supported")
    elif model_type == "mistral":
      mapped -= {"attention_bias", "mlp_bias"}
    else:
      mapped -= {"sliding_window"}
    model_type, kwargs = common.parse_hf_fields(
        fields, model_types=tuple(_ARCHITECTURES), known=mapped, ignored=ignored, required=required)
    if kwargs.get("head_dim") is None:
      kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    if kwargs.get("num_key_value_heads") is None:
      kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    if rope_theta is not None:
      kwargs["rope_theta"] = rope_theta
    return cls(**kwargs, model_type=model_type, qkv_bias=model_type == "qwen2")

  def to_hf_config(self):
    """The equivalent transformers config (``LlamaConfig``, ``Qwen2Config`` or ``MistralConfig``)."""
    import transformers  # pylint: disable=g-import-not-at-top

    fields = self.hf_fields()
    for name in ("qkv_bias", "rope_theta"):
      fields.pop(name)
    rope = {"rope_type": "default", "rope_theta": self.rope_theta}
    if self.model_type == "qwen2":
      if self.attention_bias or self.mlp_bias or not self.qkv_bias:
        raise ValueError("a qwen2 config has bias on q, k, v only")
      for name in ("attention_bias", "mlp_bias", "sliding_window"):
        fields.pop(name)
      if self.head_dim != self.hidden_size // self.num_attention_heads:
        raise ValueError("Qwen2Config derives head_dim from hidden_size / num_attention_heads")
      fields.pop("head_dim")
      return transformers.Qwen2Config(**fields, rope_parameters=rope, use_sliding_window=False)
    if self.model_type == "mistral":
      fields.pop("attention_bias")
      fields.pop("mlp_bias")
      return transformers.MistralConfig(**fields, rope_parameters=rope)
    if self.qkv_bias or self.sliding_window is not None:
      raise ValueError("HF LlamaConfig has no qkv-only bias or sliding window; set model_type")
    fields.pop("sliding_window")
    return transformers.LlamaConfig(**fields, rope_parameters=rope)


def _pop_rope_theta(fields: dict[str, Any]) -> float | None:
  """Rotary settings live in ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling``
  (4.x); every one present must describe plain rotary embeddings and agree on theta.

  Raises:
    ValueError: rope scaling of any kind, unknown rope parameters, or conflicting thetas.
  """
  thetas = []
  if fields.get("rope_theta") is not None:
    thetas.append(float(fields["rope_theta"]))
  fields.pop("rope_theta", None)
  for key in ("rope_parameters", "rope_scaling"):
    rope = dict(fields.pop(key, None) or {})
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type != "default":
      raise ValueError(
          f"{key}: rope_type {rope_type!r} (rope scaling) is not supported; only 'default' rotary")
    if rope.get("rope_theta") is not None:
      thetas.append(float(rope["rope_theta"]))
    rope.pop("rope_theta", None)
    if rope:
      raise ValueError(f"{key}: unsupported rope parameters {sorted(rope)} for rope_type 'default'")
  if len(set(thetas)) > 1:
    raise ValueError(f"conflicting rope_theta values {thetas} in the config")
  return thetas[0] if thetas else None


class RMSNorm(nn.Module):
  """Root-mean-square layer norm, HF's order of operations (normalize in f32, cast, then scale)."""

  eps: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return scale * normed.astype(self.dtype)


def rotary_sin_cos(positions: jax.Array, head_dim: int, theta: float,
                   dtype: Any) -> tuple[jax.Array, jax.Array]:
  """Rotary tables for ``positions: i32[B, T]`` -> ``sin, cos: [B, T, 1, H]`` (HF rotate-half layout)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
  return jnp.sin(angles).astype(dtype), jnp.cos(angles).astype(dtype)


def apply_rotary(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """Rotates ``x: [B, T, heads, H]``: ``x * cos + rotate_half(x) * sin``."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


class LlamaAttention(nn.Module):
  """Grouped-query self-attention that writes its new K/V into its layer's cache.

  ``__call__(x [B, T, D], k_cache/v_cache [B, K, S, H] | None, cache_lengths i32[B] | None, sin/cos
  [B, T, 1, H]) -> (out [B, T, D], k, v)`` with ``k, v`` as ``common.cached_attention`` returns them.
  """

  config: LlamaConfig
  attention_impl: str
  dtype: Any

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
    q = apply_rotary(q.reshape(batch, num_new, cfg.num_attention_heads, cfg.head_dim), sin, cos)
    k = apply_rotary(k.reshape(batch, num_new, cfg.num_key_value_heads, cfg.head_dim), sin, cos)
    v = v.reshape(batch, num_new, cfg.num_key_value_heads, cfg.head_dim)
    out, k, v = common.cached_attention(
        q, k, v, k_cache=k_cache, v_cache=v_cache, cache_lengths=cache_lengths,
        attention_impl=self.attention_impl, sliding_window=cfg.sliding_window, tree_mask=tree_mask)
    out = out.reshape(batch, num_new, cfg.num_attention_heads * cfg.head_dim)
    return dense(cfg.hidden_size, cfg.attention_bias, "o_proj")(out), k, v


class LlamaMLP(nn.Module):
  """SwiGLU: ``down(silu(gate(x)) * up(x))``, ``[B, T, D] -> [B, T, D]``."""

  config: LlamaConfig
  dtype: Any

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    dense = lambda features, name: nn.Dense(
        features, use_bias=cfg.mlp_bias, dtype=self.dtype, param_dtype=self.dtype, name=name)
    gate = dense(cfg.intermediate_size, "gate_proj")(x)
    up = dense(cfg.intermediate_size, "up_proj")(x)
    return dense(cfg.hidden_size, "down_proj")(nn.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
  """One pre-norm block over its own cache: ``(x, k_cache, v_cache, cache_lengths, positions, sin, cos)
  -> (x, k, v)`` (the updated cache arrays, or the new K/V without a cache)."""

  config: LlamaConfig
  attention_impl: str
  dtype: Any

  @nn.compact
  def __call__(self, x, k_cache, v_cache, cache_lengths, positions, sin, cos, tree_mask=None):
    del positions  # carried by sin and cos
    cfg = self.config
    h = RMSNorm(cfg.rms_norm_eps, self.dtype, name="input_layernorm")(x)
    attn, k, v = LlamaAttention(cfg, self.attention_impl, self.dtype, name="self_attn")(
        h, k_cache, v_cache, cache_lengths, sin, cos, tree_mask)
    x = x + attn
    h = RMSNorm(cfg.rms_norm_eps, self.dtype, name="post_attention_layernorm")(x)
    x = x + LlamaMLP(cfg, self.dtype, name="mlp")(h)
    return x, k, v


class Llama(nn.Module):
  """Llama causal LM over a ragged KV cache.

  ``__call__(tokens: i32[B, T], cache: KVCache | None, compute_logits=True, tree_mask=None) -> (logits:
  f32[B, T, V], KVCache | KVUpdate)``: token t of row b sits at position ``cache.lengths[b] + t``, its K/V are written
  at that slot and it attends to every slot up to its own; the returned cache has ``lengths + T`` (a
  caller that keeps fewer of the new tokens, after rejected drafts or prompt padding, sets the lengths
  back with ``cache.with_lengths``). Without a cache, token t sits at position t and attends to tokens
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
    positions = common.positions_of(tokens, cache, tree_mask)  # [B, T] or [1, T]
    sin, cos = rotary_sin_cos(positions, cfg.head_dim, cfg.rope_theta, self.dtype)
    x, update = common.run_layers(
        LlamaDecoderLayer, cfg.num_hidden_layers, name="layers", x=x, cache=cache,
        positions=positions, extras=(sin, cos), config=cfg, attention_impl=self.attention_impl,
        dtype=self.dtype, tree_mask=tree_mask, scan=self.scan_layers,
        on_layer=(lambda h: self.sow("intermediates", common.HIDDEN, h))
        if self.is_mutable_collection("intermediates") else None)

    x = RMSNorm(cfg.rms_norm_eps, self.dtype, name="norm")(x)
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
    return logits, update
