"""The model families bass-jax ports, by Hugging Face ``model_type``: one :class:`Family` record each,
declared in the family's own file (``llama.py`` for the Llama-like families, one row each of its
``TRAITS``; ``opt.py``, ``gpt2.py``, ``codegen.py``), which the loaders, the preflight, the GGUF
reader, the layer layout and the EAGLE checks read instead of lists of their own.

The pattern is levanter's and gemma's: a family's file says everything that is particular to it, and a
new Llama-like family is one row of ``llama.TRAITS`` plus its test against transformers
(docs/design.md, "Model families").
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Family:
  """What the library needs to know of one ``model_type``, beside its config class.

  Attributes:
    model_type: the Hugging Face ``config.json`` ``model_type`` (``"qwen3"``).
    config_class: the family's config class (``LlamaConfig``): its ``from_hf_config`` reads the
      ``config.json``, its ``FIELDS`` (``decoder_config.FieldTable``) names the fields that hold the context,
      the width and the depth.
    architecture: transformers' model class (``"Qwen3ForCausalLM"``), for ``architectures``.
    layers_key: the parameter key of the decoder layers (``"layers"``; ``"h"`` for GPT-2 and CodeGen).
    eagle_target: an EAGLE draft can read this family's features and head as it computes them (an
      unscaled embedding, uncapped logits).
    wrapper_types: ``model_type`` values of multimodal configs that hold this family's config as
      their ``text_config`` (Gemma 3's ``gemma3``), decoded as text only.
    gguf_architectures: llama.cpp's ``general.architecture`` names of this family
      (rows of ``bass_jax.checkpoints.gguf_architectures``).
  """

  model_type: str
  config_class: type
  architecture: str
  layers_key: str = "layers"
  eagle_target: bool = False
  wrapper_types: tuple[str, ...] = ()
  gguf_architectures: tuple[str, ...] = ()


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
  """Adds ``family`` to the registry (a family's file calls this at import).

  Raises:
    ValueError: its ``model_type`` is registered with another record (re-registering the same
      record, as a module reloaded in a notebook does, is allowed), a wrapper type or a GGUF name is
      already another family's, or a wrapper type is a registered ``model_type`` (or the reverse).
  """
  old = _FAMILIES.get(family.model_type)
  if old is not None and _identity(old) != _identity(family):
    raise ValueError(f"model_type {family.model_type!r} is already registered to "
                     f"{old.config_class.__qualname__} ({old}); give yours another model_type")
  for other in _FAMILIES.values():
    if other.model_type == family.model_type:
      continue
    shared = (set(other.wrapper_types) & set(family.wrapper_types)) | (
        set(other.gguf_architectures) & set(family.gguf_architectures))
    if shared:
      raise ValueError(f"{sorted(shared)} already belong to the family {other.model_type!r}")
    clash = ({other.model_type} & set(family.wrapper_types)) | (
        {family.model_type} & set(other.wrapper_types))
    if clash:
      raise ValueError(f"{sorted(clash)} would be both a model_type and a multimodal wrapper type")
  _FAMILIES[family.model_type] = family
  return family


def _identity(family: Family) -> tuple:
  """A record with its config class by module and name (a reloaded module's class is a new object)."""
  cls = family.config_class
  return (dataclasses.replace(family, config_class=object), cls.__module__, cls.__qualname__)


def families() -> tuple[Family, ...]:
  """Every registered family, in order of registration."""
  return tuple(_FAMILIES.values())


def model_types() -> tuple[str, ...]:
  """Every registered ``model_type`` (sorted), as error messages list them."""
  return tuple(sorted(_FAMILIES))


def supported_model_types() -> tuple[str, ...]:
  """Every ``model_type`` a config.json may name (sorted): the families' and the multimodal types
  that wrap one, as error messages list them."""
  return tuple(sorted(_FAMILIES.keys() | {t for f in _FAMILIES.values() for t in f.wrapper_types}))


def find(model_type: Any) -> Family | None:
  """The family of ``model_type``, or None (also for a value that is not a string)."""
  return _FAMILIES.get(model_type) if isinstance(model_type, str) else None


def wrapped_by(model_type: Any) -> Family | None:
  """The family whose config a multimodal ``model_type`` wraps as ``text_config``, or None."""
  return next((f for f in _FAMILIES.values() if model_type in f.wrapper_types), None)


def by_gguf_architecture(name: str) -> Family | None:
  """The family of llama.cpp's ``general.architecture`` ``name``, or None."""
  return next((f for f in _FAMILIES.values() if name in f.gguf_architectures), None)
