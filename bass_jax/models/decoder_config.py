"""What every model family's config is: the :class:`DecoderConfig` protocol, the :class:`FieldTable` of
its Hugging Face field names and the :class:`CacheFromShape` base that derives the rest from it, and the
checked parsing of Hugging Face ``config.json`` fields (:func:`parse_hf_fields`: every field is mapped,
ignored by name, or refused).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterable, Mapping, Protocol

import flax.linen as nn
import jax.numpy as jnp

from bass_jax._checks import short
from bass_jax.cache import KVCache
from bass_jax.models import family as family_lib


class DecoderConfig(Protocol):
  """What the sampler, the loaders and the trainer need from a model family's config."""

  model_type: str  # transformers' model_type
  vocab_size: int
  eos_token_id: int | tuple[int, ...] | None

  @property
  def num_layers(self) -> int: ...

  @property
  def max_positions(self) -> int: ...

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32,
                  scan_layers: bool = False) -> nn.Module: ...

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32,
                 fill_value: float = 0.0, scanned: bool = False) -> KVCache: ...

  def with_num_layers(self, num_layers: int) -> "DecoderConfig": ...

  def num_params(self) -> int: ...

  def to_hf_config(self) -> Any: ...


def layers_key(config: Any) -> str | None:
  """The parameter key of a family's decoder layers (``models.family.Family.layers_key``): ``{key}_{i}``
  per layer when unrolled (as Hugging Face's ``model.layers.{i}``), ``{key}`` stacked ``[L, ...]`` when
  scanned (:func:`run_layers`); None for a config of no registered family (an EAGLE draft, Medusa
  heads)."""
  registered = family_lib.find(getattr(config, "model_type", None))
  return None if registered is None else registered.layers_key


def scanned_layers(config: DecoderConfig, params: Any) -> bool:
  """Whether ``params`` (a family's Flax params tree, without the ``"params"`` wrapper) hold the
  decoder layers scanned, stacked under :func:`layers_key` (:func:`stack_layers`), rather than one
  subtree per layer. A model's layout is that of its weights; its caches follow it."""
  key = layers_key(config)
  return key is not None and key in params


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
    "auto_map",  # where remote modeling code lives (Phi-3's); the port is the code
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


def build(cls: type, model_type: str, kwargs: dict[str, Any]) -> Any:
  """``cls(**kwargs)``, a family config from the fields :func:`parse_hf_fields` kept, after checking
  that none of the fields the port needs (the dataclass's fields without a default) is missing.

  Raises:
    ValueError: a needed field absent from the config (named; transformers would fill in its own
      default, which the checkpoint's weights then do not fit), or what ``cls`` refuses.
  """
  missing = [f.name for f in dataclasses.fields(cls)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
             and f.name not in kwargs and f.name != "model_type"]
  if missing:
    raise ValueError(f"{model_type}: config.json lacks {', '.join(missing)}, which the port needs; add "
                     "the field(s) with the checkpoint's value(s)")
  # JSON writes 1e12 as an integer where a float is meant: such a field is made the float it is (an
  # int would enter the forward as a weakly typed integer and overflow int32).
  hints = typing.get_type_hints(cls)
  floats = {name for name, hint in hints.items() if float in (hint, *typing.get_args(hint))}
  kwargs = {k: float(v) if k in floats and type(v) is int else v for k, v in kwargs.items()}
  return cls(**kwargs)


class RefusedByTransformers(ValueError):
  """transformers' config class refused a config.json's fields (:func:`transformers_config`)."""


def transformers_config(model_type: str, fields: dict[str, Any]):
  """transformers' config object of ``model_type`` for a config.json dict (its defaults filled in, its
  rotary parameters standardized).

  Raises:
    RefusedByTransformers: transformers' config class refuses the fields (a ``ValueError``: its last
      message line, one line, and the fields without which it would accept them, each left to its
      default in turn).
  """
  import transformers  # pylint: disable=g-import-not-at-top

  fields = {k: v for k, v in fields.items() if k != "model_type"}
  from huggingface_hub import errors as hub_errors  # pylint: disable=g-import-not-at-top

  strict = getattr(hub_errors, "StrictDataclassError", ValueError)
  refusals = (ValueError, TypeError, KeyError, AttributeError, strict)
  try:
    return transformers.AutoConfig.for_model(model_type, **fields)
  except refusals as e:  # often multi-line, and a check of the whole class names no field
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    culprits = []
    for name, value in fields.items():  # the fields without which the class accepts the config
      try:
        transformers.AutoConfig.for_model(
            model_type, **{k: v for k, v in fields.items() if k != name})
      except refusals:
        continue
      culprits.append(f"{name}={short(value)}")
    blame = (f" (transformers accepts the config with its default for "
             f"{' or '.join(culprits[:3])})" if culprits else "")
    raise RefusedByTransformers(f"{model_type} config refused by transformers' {model_type} config "
                                f"class: {lines[-1] if lines else type(e).__name__}{blame}") from e


@dataclasses.dataclass(frozen=True)
class FieldTable:
  """Where a family's config keeps what the decode asks of every config: its Hugging Face field names.

  Attributes:
    num_layers, max_positions, num_heads, hidden_size: the fields holding them (``n_layer``,
      ``num_hidden_layers``, …).
    num_kv_heads: the field of the KV heads, or None: as many as the query heads.
    head_dim: the field of the head size, or None: ``hidden_size // num_heads``.
    mlp_width: the field of the MLP's hidden width (what a tensor-parallel rule splitting ``mlp``
      must divide: ``bass_jax.sharding.logical_sizes``); a None value in it means 4 x the width.
  """

  num_layers: str
  max_positions: str
  num_heads: str
  hidden_size: str
  mlp_width: str
  num_kv_heads: str | None = None
  head_dim: str | None = None


class CacheFromShape:
  """Base of the family configs: what follows from one :class:`FieldTable` (the class attribute
  ``FIELDS``) and from :class:`DecoderConfig`'s derived properties.

  Every family names its sizes after its Hugging Face config (``n_layer``, ``num_hidden_layers`` …);
  its ``FIELDS`` says which is which, and the properties ``num_layers``, ``max_positions``,
  ``num_kv_heads``, ``head_dim`` and ``hf_architecture`` and the methods :meth:`with_num_layers` and
  :meth:`hf_fields` follow from it, once, here (a family whose own field has the protocol's name,
  Llama's ``head_dim``, keeps the field). The cache and the EOS tuple are built from those.
  """

  FIELDS: FieldTable

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    table = cls.__dict__.get("FIELDS")
    if table is None:
      return
    own = set(cls.__dict__.get("__annotations__", {}))
    heads = lambda self: getattr(self, table.num_heads)
    derived = {
        "num_layers": lambda self: getattr(self, table.num_layers),
        "max_positions": lambda self: getattr(self, table.max_positions),
        "num_kv_heads": lambda self: getattr(self, table.num_kv_heads or table.num_heads),
        "head_dim": lambda self: (getattr(self, table.head_dim) if table.head_dim
                                  else getattr(self, table.hidden_size) // heads(self)),
        # transformers' class: the one its family registered (models.family), stored once there.
        "hf_architecture": lambda self: family_lib.find(self.model_type).architecture,
    }
    for name, fn in derived.items():
      if name not in own and name not in cls.__dict__:  # a field or property of that name stays
        setattr(cls, name, property(fn))

  def with_num_layers(self, num_layers: int):
    """The same config with ``num_layers`` layers (a draft cut from the target's first layers)."""
    return dataclasses.replace(self, **{self.FIELDS.num_layers: num_layers})

  def hf_fields(self) -> dict[str, Any]:
    """The config's fields as transformers' config takes them: no ``model_type``, EOS ids a list."""
    fields = dataclasses.asdict(self)
    fields.pop("model_type")
    if isinstance(fields["eos_token_id"], tuple):
      fields["eos_token_id"] = list(fields["eos_token_id"])
    return fields

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32,
                 fill_value: float = 0.0, scanned: bool = False) -> KVCache:
    """An empty ragged cache: L K/V arrays ``dtype[B, K, max_len, H]`` each (``scanned``: one stacked
    ``[L, B, K, max_len, H]`` array each, for a model with scanned layers), lengths ``i32[B]`` zero.

    Raises:
      ValueError: as :meth:`KVCache.zeros` for non-positive sizes.
    """
    return KVCache.zeros(num_layers=self.num_layers, batch_size=batch_size, max_len=max_len,
                         num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, dtype=dtype,
                         fill_value=fill_value, scanned=scanned)

  def _freeze_eos(self) -> None:
    """HF configs may give ``eos_token_id`` as a list; keep it hashable (a static jit argument)."""
    if isinstance(self.eos_token_id, list):
      object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
