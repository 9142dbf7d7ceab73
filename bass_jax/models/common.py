"""Pieces every model family shares: the cached attention step, the layer scan, activations, and the
checked parsing of Hugging Face config fields.

Every family (``llama.py``, ``opt.py``, ``codegen.py``, ``gpt2.py``) has a frozen config dataclass that
implements :class:`DecoderConfig` and a Flax module with the call signature
``(tokens i32[B, T], cache: KVCache, compute_logits=True) -> (logits f32[B, T, V] | None, KVCache)``:
token t of row b sits at position ``cache.lengths[b] + t``, its K/V are written at that slot of the
stacked ``[L, B, S, K, H]`` cache, and the returned cache has ``lengths + T``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache
from bass_jax.models import attention as attention_lib


class DecoderConfig(Protocol):
  """What the sampler, the loaders and the trainer need from a model family's config."""

  model_type: str  # transformers' model_type
  vocab_size: int
  eos_token_id: int | tuple[int, ...] | None

  @property
  def num_layers(self) -> int: ...

  @property
  def max_positions(self) -> int: ...

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32) -> nn.Module: ...

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32,
                 fill_value: float = 0.0) -> KVCache: ...

  def with_num_layers(self, num_layers: int) -> "DecoderConfig": ...

  def num_params(self) -> int: ...

  def to_hf_config(self) -> Any: ...


# Generic HF bookkeeping that older (4.x) transformers wrote into every config.json next to the
# PretrainedConfig base fields (labels, output flags, generation defaults): no effect on a forward pass.
_LEGACY_HF_GENERIC_FIELDS = frozenset({
    "torch_dtype", "tokenizer_class", "prefix", "sep_token_id", "decoder_start_token_id",
    "task_specific_params", "tie_encoder_decoder", "cross_attention_hidden_size",
    "is_decoder", "pruned_heads", "finetuning_task", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "quantization_config", "unk_token_id", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "gradient_checkpointing",
})
# Fields that only matter for training or for transformers' own runtime, in any family.
TRAINING_ONLY_FIELDS = frozenset({
    "initializer_range", "use_cache", "attention_dropout", "dropout", "resid_pdrop", "embd_pdrop",
    "attn_pdrop", "layerdrop", "init_std",
})


def hf_generic_fields() -> frozenset[str]:
  """Fields of transformers' PretrainedConfig base class (plus legacy ones): not architecture."""
  import transformers  # pylint: disable=g-import-not-at-top

  return frozenset(transformers.PretrainedConfig().to_dict()) | _LEGACY_HF_GENERIC_FIELDS


def parse_hf_fields(
    hf_config: Any,
    *,
    model_types: Iterable[str],
    known: Iterable[str],
    ignored: Iterable[str] = (),
    required: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
  """Splits an HF config into ``(model_type, {known field: value})``, accounting for every field.

  Args:
    hf_config: a transformers config, its ``to_dict()``, or a config.json dict.
    model_types: accepted ``model_type`` values.
    known: fields the port maps.
    ignored: family fields with no effect on a forward pass (beyond the generic ones).
    required: fields that must hold a given value (absent counts as that value), e.g.
      ``{"add_cross_attention": False}``.

  Raises:
    ValueError: another ``model_type``, a field the port would silently ignore (named), or a
      required field with another value (named).
  """
  fields = dict(hf_config if isinstance(hf_config, Mapping) else hf_config.to_dict())
  model_types = tuple(model_types)
  model_type = fields.pop("model_type", model_types[0])
  if model_type not in model_types:
    raise ValueError(f"model_type {model_type!r} is not one of {model_types}")
  for name, want in (required or {}).items():
    value = fields.pop(name, want)
    if value != want and not (value is None and want in (False, None)):
      raise ValueError(f"{model_type}: {name}={value!r} is not supported (the port needs {want!r})")
  known = set(known)
  skip = hf_generic_fields() | TRAINING_ONLY_FIELDS | set(ignored)
  out = {}
  for name, value in fields.items():
    if name in known:
      out[name] = value
    elif name not in skip:
      raise ValueError(
          f"{model_type}: unknown config field {name!r}={value!r}; the port would silently ignore "
          "it. Remove it from config.json if it has no effect, or extend the port.")
  return model_type, out


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """transformers' ``ACT2FN`` names -> functions.

  Raises:
    ValueError: an activation the ports do not implement.
  """
  table = {
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,
      "swish": jax.nn.silu,
      "gelu": lambda x: jax.nn.gelu(x, approximate=False),
      "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
      "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  }
  if name not in table:
    raise ValueError(f"activation {name!r} is not supported; one of {sorted(table)}")
  return table[name]


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, layer: jax.Array, k_all: jax.Array,
                     v_all: jax.Array, write_pos: jax.Array, attention_impl: str,
                     sm_scale: float | None = None, sliding_window: int | None = None):
  """Writes this layer's new K/V at each row's own slots, then attends over the ragged cache.

  Args:
    q: ``[B, T, N, H]``; k, v: ``[B, T, K, H]`` (rotary, if any, already applied).
    layer: ``i32[]`` index into the stacked cache ``k_all, v_all: [L, B, S, K, H]``.
    write_pos: ``i32[B, T]`` slots of the new tokens (``lengths[b] + t``); slots past S are dropped by
      the scatter, which callers rule out by sizing the cache (generate validates it).

  Returns:
    ``(out [B, T, N, H], k_all, v_all)``.
  """
  rows = jnp.arange(q.shape[0])[:, None]
  k_all = k_all.at[layer, rows, write_pos].set(k.astype(k_all.dtype), mode="drop")
  v_all = v_all.at[layer, rows, write_pos].set(v.astype(v_all.dtype), mode="drop")
  attend = attention_lib.get_attention(attention_impl)
  kwargs = {"sm_scale": sm_scale}
  if sliding_window is not None:
    kwargs["sliding_window"] = sliding_window
  out = attend(q, k_all[layer], v_all[layer], write_pos[:, -1] + 1, **kwargs)
  return out, k_all, v_all


def scan_layers(layer_cls: type[nn.Module], num_layers: int, *, name: str, carry, write_pos,
                extras: tuple = (), **layer_fields):
  """Runs ``layer_cls`` ``num_layers`` times under ``nn.scan`` (parameters stacked on a leading axis).

  The layer's ``__call__(carry, layer_index, write_pos, *extras) -> (carry, None)`` gets the index so
  that it can address its slice of the stacked cache carried in ``carry``; must be called from inside
  a compact module method.
  """
  scanned = nn.scan(
      layer_cls,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      in_axes=(0, nn.broadcast) + (nn.broadcast,) * len(extras),
      length=num_layers,
  )(**layer_fields, name=name)
  carry, _ = scanned(carry, jnp.arange(num_layers), write_pos, *extras)
  return carry


class CacheFromShape:
  """Base of the family configs: what follows from :class:`DecoderConfig`'s derived properties.

  Every family names its sizes after its Hugging Face config (``n_layer``, ``num_hidden_layers`` …) and
  exposes them as ``num_layers``, ``num_kv_heads`` and ``head_dim``; the cache and the EOS tuple are
  built from those once, here.
  """

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32,
                 fill_value: float = 0.0) -> KVCache:
    """An empty ragged cache: K/V ``dtype[L, B, max_len, K, H]``, lengths ``i32[B]`` zero.

    Raises:
      ValueError: as :meth:`KVCache.zeros` for non-positive sizes.
    """
    return KVCache.zeros(num_layers=self.num_layers, batch_size=batch_size, max_len=max_len,
                         num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, dtype=dtype,
                         fill_value=fill_value)

  def _freeze_eos(self) -> None:
    """HF configs may give ``eos_token_id`` as a list; keep it hashable (a static jit argument)."""
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
