"""Llama-architecture decoder (SmolLM2, Llama 2/3, TinyLlama …) as a Flax module over a ragged KV cache.

Reference implementation: transformers' ``modeling_llama.py`` (``LlamaForCausalLM``): RMSNorm, rotary
embeddings in HF's rotate-half convention, grouped-query attention, SwiGLU MLP, tied or untied LM head.
The tests compare logits with it in f32.

Axes: B batch, T new tokens, S cache slots, L layers, D hidden size, F MLP size, N query heads, K key/value
heads, H head dim, V vocabulary.

The module knows nothing of speculation: it maps ``tokens: i32[B, T]`` and a :class:`KVCache` to
``logits: f32[B, T, V]`` and the cache with the T new entries written at each row's own offset
``cache.lengths[b]``. The layers run under ``nn.scan`` (parameters stacked along a leading L axis), so
compile time does not grow with depth.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache
from bass_jax.models import attention as attention_lib

# Generic HF bookkeeping that older (4.x) transformers wrote into every config.json next to the
# PretrainedConfig base fields (labels, output flags, generation defaults): no effect on a forward pass.
_LEGACY_HF_GENERIC_FIELDS = frozenset({
    "torch_dtype", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "tie_encoder_decoder", "cross_attention_hidden_size",
    "add_cross_attention", "is_decoder", "pruned_heads", "finetuning_task", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "quantization_config", "unk_token_id", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
})


def _hf_generic_fields() -> frozenset[str]:
  """Fields of transformers' PretrainedConfig base class (plus legacy ones): not architecture."""
  import transformers  # pylint: disable=g-import-not-at-top

  return frozenset(transformers.PretrainedConfig().to_dict()) | _LEGACY_HF_GENERIC_FIELDS


# Llama fields that only matter for training or for HF's own runtime.
_HF_LLAMA_IGNORED_FIELDS = frozenset({"initializer_range", "use_cache", "attention_dropout"})


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Architecture of a Llama-family decoder, with transformers' ``LlamaConfig`` field names.

  Raises:
    ValueError: from ``__post_init__`` if a size is not positive, the heads do not divide, the head dim
      is odd, or the activation is not SwiGLU's ``silu``.
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
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

  # -- the model protocol used by the sampler ---------------------------------------------------------

  @property
  def num_layers(self) -> int:
    return self.num_hidden_layers

  @property
  def num_kv_heads(self) -> int:
    return self.num_key_value_heads

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32) -> "Llama":
    """The Flax module for this config; ``attention_impl`` names an entry of the attention registry."""
    return Llama(self, attention_impl=attention_impl, dtype=dtype)

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32,
                 fill_value: float = 0.0) -> KVCache:
    """An empty ragged cache ``[L, B, max_len, K, H]`` for this architecture."""
    return KVCache.zeros(num_layers=self.num_hidden_layers, batch_size=batch_size, max_len=max_len,
                         num_kv_heads=self.num_key_value_heads, head_dim=self.head_dim, dtype=dtype,
                         fill_value=fill_value)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    q_out, kv_out = self.num_attention_heads * h, self.num_key_value_heads * h
    attn = d * (q_out + 2 * kv_out) + q_out * d
    if self.attention_bias:
      attn += q_out + 2 * kv_out + d
    mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
    per_layer = attn + mlp + 2 * d
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_hidden_layers * per_layer + d + head

  # -- Hugging Face conversion ------------------------------------------------------------------------

  @classmethod
  def from_hf_config(cls, hf_config: Any) -> "LlamaConfig":
    """Converts a transformers ``LlamaConfig`` (or its ``to_dict()`` / config.json dict).

    Every field is accounted for: mapped, known to be irrelevant to inference, or rejected.

    Raises:
      ValueError: for another ``model_type``, an unknown field (named), or an unsupported value
        (rope scaling, ``pretraining_tp != 1``).
    """
    fields = dict(hf_config if isinstance(hf_config, Mapping) else hf_config.to_dict())
    model_type = fields.pop("model_type", "llama")
    if model_type != "llama":
      raise ValueError(f"LlamaConfig.from_hf_config: model_type {model_type!r} is not 'llama'")

    # Rotary settings live in `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (4.x);
    # every one present must describe plain rotary embeddings and agree on theta.
    thetas = []
    if fields.get("rope_theta") is not None:
      thetas.append(float(fields.pop("rope_theta")))
    fields.pop("rope_theta", None)
    for key in ("rope_parameters", "rope_scaling"):
      rope = dict(fields.pop(key, None) or {})
      rope_type = rope.pop("rope_type", rope.pop("type", "default"))
      if rope_type != "default":
        raise ValueError(
            f"{key}: rope_type {rope_type!r} (rope scaling) is not supported; only 'default' rotary")
      if rope.get("rope_theta") is not None:
        thetas.append(float(rope.pop("rope_theta")))
      rope.pop("rope_theta", None)
      if rope:
        raise ValueError(f"{key}: unsupported rope parameters {sorted(rope)} for rope_type 'default'")
    if len(set(thetas)) > 1:
      raise ValueError(f"conflicting rope_theta values {thetas} in the config")
    rope_theta = thetas[0] if thetas else None

    if fields.pop("pretraining_tp", 1) not in (1, None):
      raise ValueError("pretraining_tp != 1 is not supported (it changes the forward's numerics)")

    known = {f.name for f in dataclasses.fields(cls)}
    ignored = _hf_generic_fields() | _HF_LLAMA_IGNORED_FIELDS
    kwargs = {}
    for name, value in fields.items():
      if name in known:
        kwargs[name] = value
      elif name not in ignored:
        raise ValueError(
            f"LlamaConfig.from_hf_config: unknown config field {name!r}={value!r}; the port would "
            "silently ignore it. Remove it from config.json if it has no effect, or extend LlamaConfig.")
    if kwargs.get("head_dim") is None:
      kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    if kwargs.get("num_key_value_heads") is None:
      kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    if rope_theta is not None:
      kwargs["rope_theta"] = float(rope_theta)
    return cls(**kwargs)

  def to_hf_config(self):
    """The equivalent transformers ``LlamaConfig``."""
    import transformers  # pylint: disable=g-import-not-at-top

    fields = dataclasses.asdict(self)
    rope_theta = fields.pop("rope_theta")
    if isinstance(fields["eos_token_id"], tuple):
      fields["eos_token_id"] = list(fields["eos_token_id"])
    return transformers.LlamaConfig(
        **fields, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})


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
  """Grouped-query self-attention that writes its new K/V into the stacked cache at ``layer``.

  ``__call__(x [B, T, D], layer i32[], k_all/v_all [L, B, S, K, H], write_pos i32[B, T], sin/cos
  [B, T, 1, H]) -> (out [B, T, D], k_all, v_all)``.
  """

  config: LlamaConfig
  attention_impl: str
  dtype: Any

  @nn.compact
  def __call__(self, x, layer, k_all, v_all, write_pos, sin, cos):
    cfg = self.config
    batch, num_new, _ = x.shape
    dense = lambda features, name: nn.Dense(
        features, use_bias=cfg.attention_bias, dtype=self.dtype, param_dtype=self.dtype, name=name)
    q = dense(cfg.num_attention_heads * cfg.head_dim, "q_proj")(x)
    k = dense(cfg.num_key_value_heads * cfg.head_dim, "k_proj")(x)
    v = dense(cfg.num_key_value_heads * cfg.head_dim, "v_proj")(x)
    q = apply_rotary(q.reshape(batch, num_new, cfg.num_attention_heads, cfg.head_dim), sin, cos)
    k = apply_rotary(k.reshape(batch, num_new, cfg.num_key_value_heads, cfg.head_dim), sin, cos)
    v = v.reshape(batch, num_new, cfg.num_key_value_heads, cfg.head_dim)

    # Each row writes its T new entries at its own offset (a scatter); slots past S are dropped, which
    # callers rule out by sizing the cache (generate validates it).
    rows = jnp.arange(batch)[:, None]
    k_all = k_all.at[layer, rows, write_pos].set(k.astype(k_all.dtype), mode="drop")
    v_all = v_all.at[layer, rows, write_pos].set(v.astype(v_all.dtype), mode="drop")

    attend = attention_lib.get_attention(self.attention_impl)
    out = attend(q, k_all[layer], v_all[layer], write_pos[:, -1] + 1)
    out = out.reshape(batch, num_new, cfg.num_attention_heads * cfg.head_dim)
    return dense(cfg.hidden_size, "o_proj")(out), k_all, v_all


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
  """One pre-norm block; scanned over layers with the whole cache carried and updated in place."""

  config: LlamaConfig
  attention_impl: str
  dtype: Any

  @nn.compact
  def __call__(self, carry, layer, write_pos, sin, cos):
    x, k_all, v_all = carry
    cfg = self.config
    h = RMSNorm(cfg.rms_norm_eps, self.dtype, name="input_layernorm")(x)
    attn, k_all, v_all = LlamaAttention(cfg, self.attention_impl, self.dtype, name="self_attn")(
        h, layer, k_all, v_all, write_pos, sin, cos)
    x = x + attn
    h = RMSNorm(cfg.rms_norm_eps, self.dtype, name="post_attention_layernorm")(x)
    x = x + LlamaMLP(cfg, self.dtype, name="mlp")(h)
    return (x, k_all, v_all), None


class Llama(nn.Module):
  """Llama causal LM over a ragged KV cache.

  ``__call__(tokens: i32[B, T], cache, compute_logits=True) -> (logits: f32[B, T, V], KVCache)``: token t
  of row b sits at position ``cache.lengths[b] + t``, its K/V are written at that slot, and it attends to
  every slot up to and including its own. ``compute_logits=False`` (prefill) skips the LM head and
  returns ``None`` logits. The returned cache has ``lengths + T``; a caller that keeps fewer of the new
  tokens (rejected drafts, prompt padding) sets the lengths back with ``cache.with_lengths``.
  Parameter names follow HF's module tree (``embed_tokens``, ``layers/self_attn/q_proj`` …), with the
  layer axis first.
  """

  config: LlamaConfig
  attention_impl: str = "reference"
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: jax.Array, cache: KVCache,
               compute_logits: bool = True) -> tuple[jax.Array | None, KVCache]:
    cfg = self.config
    num_new = tokens.shape[1]
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype, param_dtype=self.dtype,
                     name="embed_tokens")
    x = embed(tokens)
    write_pos = cache.lengths[:, None] + jnp.arange(num_new, dtype=jnp.int32)  # [B, T]
    sin, cos = rotary_sin_cos(write_pos, cfg.head_dim, cfg.rope_theta, self.dtype)

    layers = nn.scan(
        LlamaDecoderLayer,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
        length=cfg.num_hidden_layers,
    )(cfg, self.attention_impl, self.dtype, name="layers")
    (x, k_all, v_all), _ = layers(
        (x, cache.k, cache.v), jnp.arange(cfg.num_hidden_layers), write_pos, sin, cos)

    x = RMSNorm(cfg.rms_norm_eps, self.dtype, name="norm")(x)
    new_cache = KVCache(k=k_all, v=v_all, lengths=cache.lengths + num_new)
    if not compute_logits and not self.is_initializing():
      return None, new_cache
    if cfg.tie_word_embeddings:
      logits = jnp.einsum("BTD,VD->BTV", x, embed.embedding.astype(self.dtype),
                          preferred_element_type=jnp.float32)
    else:
      kernel = self.param("lm_head", nn.initializers.lecun_normal(),
                          (cfg.hidden_size, cfg.vocab_size), self.dtype)
      logits = jnp.einsum("BTD,DV->BTV", x, kernel, preferred_element_type=jnp.float32)
    return logits, new_cache
