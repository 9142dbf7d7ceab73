"""Every ``config.json`` field checked by type and range before anything reads it.

A field's type is the one transformers declares for it: the annotation of the field in the config
class of the file's ``model_type`` (transformers' configs are typed dataclasses), and for the rotary
parameters (``rope_parameters``, ``rope_scaling``) the annotations of transformers' ``RopeParameters``.
JSON's types are taken as they are, with no coercion: a string is not a number, ``true`` is not the
integer 1, ``2.0`` is not an int; an integer is a float (JSON writes ``10000`` for ``10000.0``). A
field a config class does not declare is left to the family's parser, which maps it or refuses it
by name (``models.decoder_config.parse_hf_fields``).

Ranges: the sizes and counts of :data:`POSITIVE` are integers in ``[1, 2**31 - 1]``; the scales of
:data:`POSITIVE_OR_NULL` are numbers > 0 or null (Gemma's soft caps: null turns them off); every
float is finite; the stop ids (``eos_token_id``) lie in ``[0, vocab_size)``, as they must in
``generation_config.json``.

A nested config (``text_config``, a speculators draft's ``transformer_layer_config``, this project's
EAGLE ``layer``) is checked by its own ``model_type``.

The first field that fails is one ``ValueError``: the file, the field (dotted path), its value and
what is expected.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types
import typing
from typing import Any, Mapping

from bass_jax._checks import short
from bass_jax.models import family as family_lib

# Integer sizes and counts that must be >= 1, under every family's name for them.
POSITIVE = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "n_layer", "n_head", "n_embd",
    "n_positions", "n_ctx", "n_inner", "ffn_dim", "word_embed_proj_dim", "original_max_position_embeddings",
    "sliding_window", "rotary_dim", "draft_vocab_size",
})
MAX_SIZE = 2**31 - 1  # sizes index int32 arrays (JAX's default index type)
# Scales that must be > 0 where given; null keeps their meaning of "off" (a soft cap) or "default".
POSITIVE_OR_NULL = frozenset({"query_pre_attn_scalar", "attn_logit_softcapping",
                              "final_logit_softcapping", "rope_theta", "factor"})
# Token ids that must lie in the vocabulary: the stop ids the decode compares every token with. (A
# ``bos`` or ``pad`` id outside it, which transformers' defaults write into tiny configs, is never
# looked up by a decode.)
TOKEN_IDS = ("eos_token_id",)
# The fields every config may hold, whatever its class declares.
GENERIC = {"model_type": str, "architectures": list[str] | None,
           "bos_token_id": int | list[int] | None, "eos_token_id": int | list[int] | None,
           "pad_token_id": int | list[int] | None}
# The stored weights' dtype, by PyTorch's name (transformers looks it up on ``torch``).
DTYPE_FIELDS = ("dtype", "torch_dtype")
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "auto")
ROPE_FIELDS = ("rope_parameters", "rope_scaling")
NESTED_CONFIGS = ("text_config", "transformer_layer_config", "layer")


def _resolve(annotation: Any, module: str) -> Any:
  """An annotation, a string one evaluated in its class's module (None where that fails)."""
  if not isinstance(annotation, str):
    return annotation
  try:
    return eval(annotation, vars(sys.modules[module]))  # pylint: disable=eval-used
  except Exception:  # pylint: disable=broad-except  # names of an optional import (torch)
    return None


@functools.lru_cache(maxsize=None)
def declared_types(model_type: str) -> Mapping[str, Any]:
  """``{field: annotation}`` of transformers' config class for ``model_type``, :data:`GENERIC` over it
  (:data:`GENERIC` alone for a type transformers does not know, or a class that is not a dataclass)."""
  import transformers  # pylint: disable=g-import-not-at-top

  try:
    cls = transformers.CONFIG_MAPPING[model_type]
  except (KeyError, TypeError):
    return dict(GENERIC)
  hints = {}
  if dataclasses.is_dataclass(cls):
    for field in dataclasses.fields(cls):
      owner = next((k for k in cls.__mro__ if field.name in getattr(k, "__annotations__", {})), cls)
      annotation = _resolve(field.type, owner.__module__)
      if annotation is not None:
        hints[field.name] = annotation
  return {**hints, **GENERIC}


@functools.lru_cache(maxsize=None)
def defaulted(model_type: str) -> frozenset[str]:
  """The fields transformers' config class for ``model_type`` fills with a value (not None) when a
  config.json lacks them (its defaults, and what it derives from them, as ``num_key_value_heads``
  from ``num_attention_heads``).

  Returns:
    The names; empty for a type transformers does not know. Never raises.
  """
  import transformers  # pylint: disable=g-import-not-at-top

  try:
    default = transformers.CONFIG_MAPPING[model_type]()
  except Exception:  # pylint: disable=broad-except  # unknown type, or a class that needs arguments
    return frozenset()
  return frozenset(k for k, v in default.to_dict().items() if v is not None)


@functools.lru_cache(maxsize=1)
def rope_types() -> Mapping[str, Any]:
  """``{key: annotation}`` of transformers' ``RopeParameters``."""
  from transformers import modeling_rope_utils  # pylint: disable=g-import-not-at-top

  cls = modeling_rope_utils.RopeParameters
  return {k: _resolve(v, cls.__module__) for k, v in cls.__annotations__.items()}


def matches(value: Any, annotation: Any) -> bool:
  """Whether a JSON value is of ``annotation`` (int, float, bool, str, None, ``list[X]``, ``dict``,
  unions, ``Literal``, a TypedDict), without coercion: a bool is no number, an int is a float."""
  if annotation is Any:
    return True
  if annotation is type(None):
    return value is None
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType):
    return any(matches(value, a) for a in typing.get_args(annotation))
  if origin is typing.Literal:
    return value in typing.get_args(annotation) and type(value) in {type(a) for a in
                                                                    typing.get_args(annotation)}
  if origin in (list, tuple):
    args = typing.get_args(annotation)
    return isinstance(value, list) and (not args or all(matches(v, args[0]) for v in value))
  if origin is dict or annotation is dict:
    return isinstance(value, dict)
  if typing.is_typeddict(annotation):
    return isinstance(value, dict)
  if annotation is bool:
    return isinstance(value, bool)
  if annotation is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if annotation is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if annotation is str:
    return isinstance(value, str)
  if isinstance(annotation, type):
    return isinstance(value, annotation)
  return True  # an annotation this check does not read: left to the family's parser


def describe(annotation: Any) -> str:
  """``annotation`` in words: ``"an int or null"``, ``"a list of strings"``."""
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType):
    parts = [describe(a) for a in typing.get_args(annotation) if a is not type(None)]
    null = type(None) in typing.get_args(annotation)
    return " or ".join(list(dict.fromkeys(parts)) + (["null"] if null else []))
  if origin in (list, tuple):
    args = typing.get_args(annotation)
    plural = {int: "ints", float: "numbers", str: "strings", bool: "booleans"}
    return f"a list of {plural.get(args[0], describe(args[0]))}" if args else "a list"
  if origin is typing.Literal:
    return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
  if origin is dict or annotation is dict or typing.is_typeddict(annotation):
    return "an object"
  names = {int: "an int", float: "a number", bool: "true or false", str: "a string",
           type(None): "null"}
  return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _refuse(where: str, name: str, value: Any, expected: str, fix: str = "fix config.json") -> None:
  raise ValueError(f"{where}: {name}={short(value)} is refused: expected {expected}; {fix}")


def _check_field(where: str, name: str, key: str, value: Any, annotation: Any,
                 fix: str = "fix config.json") -> None:
  """One field (``key`` as stored, ``name`` its dotted path): its declared type where there is one,
  then finite floats (a list's too) and the ranges of :data:`POSITIVE` and :data:`POSITIVE_OR_NULL`."""
  if annotation is not None and not matches(value, annotation):
    _refuse(where, name, value, describe(annotation), fix)
  if isinstance(value, list):
    if any(isinstance(v, float) and not math.isfinite(v) for v in value):
      _refuse(where, name, value, "finite numbers", fix)
    return
  if isinstance(value, float) and not math.isfinite(value):
    _refuse(where, name, value, "a finite number", fix)
  if key in POSITIVE and isinstance(value, int) and not isinstance(value, bool) and not (
      1 <= value <= MAX_SIZE):
    _refuse(where, name, value, f"an int in [1, {MAX_SIZE}]", fix)
  if (key in POSITIVE_OR_NULL and isinstance(value, (int, float)) and not isinstance(value, bool)
      and not value > 0):
    _refuse(where, name, value, "a number > 0" + (" or null" if key != "factor" else ""), fix)


def check(fields: Mapping[str, Any], where: str, prefix: str = "", *,
          fix: str = "fix config.json") -> None:
  """Checks a config.json object (see the module's docstring).

  Args:
    fields: the parsed ``config.json``.
    where: the file, for the message.
    prefix: the dotted path of a nested config (``"text_config."``).
    fix: the message's last words (a GGUF file's metadata: ``"re-convert the file"``).

  Raises:
    ValueError: the first field of a wrong type or out of range (one line: file, field, value, what
      is expected).
  """
  model_type = fields.get("model_type")
  if "model_type" in fields and not isinstance(model_type, str):
    _refuse(where, prefix + "model_type", model_type, "a string", fix)
  declared = declared_types(model_type) if isinstance(model_type, str) else GENERIC
  for key, value in fields.items():
    name = prefix + key
    _check_field(where, name, key, value, declared.get(key), fix)
    if key in DTYPE_FIELDS and value is not None and value not in DTYPE_NAMES:
      _refuse(where, name, value, "null or one of " + ", ".join(DTYPE_NAMES), fix)
    if key in ROPE_FIELDS and isinstance(value, dict):
      _check_rope(value, where, name, fix)
    if key in NESTED_CONFIGS and isinstance(value, dict):
      check(value, where, name + ".", fix=fix)
  vocab = fields.get("vocab_size")
  for key in TOKEN_IDS:
    ids = fields.get(key)
    for token in ids if isinstance(ids, list) else [ids]:
      if isinstance(token, int) and not isinstance(token, bool) and (
          token < 0 or isinstance(vocab, int) and vocab >= 1 and token >= vocab):
        bound = f"[0, {vocab}) ({prefix}vocab_size={vocab})" if isinstance(vocab, int) else ">= 0"
        _refuse(where, prefix + key, ids, f"token ids in {bound}", fix)


def _check_rope(rope: Mapping[str, Any], where: str, name: str, fix: str) -> None:
  declared = rope_types()
  for key, value in rope.items():
    _check_field(where, f"{name}.{key}", key, value, declared.get(key), fix)


def lacking_sizes(fields: dict[str, Any], message: str) -> list[str]:
  """The sizes (:data:`POSITIVE`) that transformers' config class fills in for ``fields`` (or the
  text config a multimodal one wraps): absent ones it gives a value, and nulls it replaces (Phi-3's
  ``num_key_value_heads``; Mistral's null ``sliding_window`` stays null and is not named). Those
  ``message`` already names are left out. Named beside a refusal they may explain.

  Returns:
    The field names, sorted; empty for a ``model_type`` of no registered family. Never raises.
  """
  import transformers  # pylint: disable=g-import-not-at-top

  text = fields.get("text_config")
  if family_lib.wrapped_by(fields.get("model_type")) is not None and isinstance(text, dict):
    fields = text
  model_type = fields.get("model_type")
  if not isinstance(model_type, str) or family_lib.find(model_type) is None:
    return []
  try:
    config = transformers.AutoConfig.for_model(
        model_type, **{k: v for k, v in fields.items() if k != "model_type"}).to_dict()
    filled = {name for name, value in config.items() if value is not None}
  except Exception:  # pylint: disable=broad-except  # refused: what the class fills in on its own
    filled = defaulted(model_type)
  return [name for name in sorted(POSITIVE)
          if name in filled and fields.get(name) is None and name not in message]


def lacking_note(lacking: list[str], source: str = "config.json") -> str:
  """`` (config.json gives no X: transformers' default used; …)`` for :func:`lacking_sizes`."""
  return (f" ({source} gives no {', '.join(lacking)}: transformers' default used; add the "
          "checkpoint's value)")
