"""A checkpoint's ``generation_config.json`` (transformers' ``GenerationConfig`` file): the stop ids it
adds to ``config.json``'s when a model loads, and the file a save writes."""

from __future__ import annotations

import os
import pathlib
from typing import Any

from bass_jax.checkpoints import hf as hf_ckpt

GENERATION_CONFIG_FILE = "generation_config.json"


def generation_eos_ids(directory: str | os.PathLike, vocab_size: int,
                       config_ids: int | tuple[int, ...] | None = None) -> tuple[int, ...]:
  """The stop ids that ``generation_config.json`` of checkpoint ``directory`` names in its
  ``eos_token_id`` (an id or a list of ids; Llama 3 Instruct's three: ``<|end_of_text|>``,
  ``<|eom_id|>``, ``<|eot_id|>``), in the file's order; ``()`` without the file or the field (or null).
  An id that config.json already names (``config_ids``) is not range-checked again: transformers copies
  config.json's ids into the file, and a tiny model keeps its family's default (GPT-2's 50256).

  Raises:
    ValueError: the file is not a JSON object, or its ``eos_token_id`` holds something other than ints
      (a string, a float, a bool, a nested list) or a new id outside ``[0, vocab_size)``; the file and
      the field named.
  """
  own = () if config_ids is None else (
      tuple(config_ids) if isinstance(config_ids, (tuple, list)) else (config_ids,))
  file = pathlib.Path(directory) / GENERATION_CONFIG_FILE
  if not file.is_file():
    return ()
  ids = hf_ckpt.read_json_object(file).get("eos_token_id")
  if ids is None:
    return ()
  items = ids if isinstance(ids, list) else [ids]
  for i in items:
    if not isinstance(i, int) or isinstance(i, bool):
      raise ValueError(f"{file}: eos_token_id must be a token id (an int) or a list of them, got "
                       f"{ids!r}; fix the file, or delete the field")
    if not 0 <= i < vocab_size and i not in own:
      raise ValueError(f"{file}: eos_token_id {i} is not a token id of this model (vocab_size "
                       f"{vocab_size}: ids 0 to {vocab_size - 1}); fix the file, or delete the field")
  return tuple(items)


def merge_eos_ids(config_ids: int | tuple[int, ...] | list[int] | None,
                  extra: tuple[int, ...]) -> int | tuple[int, ...] | None:
  """A config's ``eos_token_id`` with the ids of ``extra`` (a ``generation_config.json``'s) added:
  ``config_ids`` unchanged when ``extra`` adds none, else a tuple: the config's ids first, then the new
  ones in ``extra``'s order, each once."""
  own = () if config_ids is None else (
      tuple(config_ids) if isinstance(config_ids, (tuple, list)) else (config_ids,))
  if all(i in own for i in extra):
    return config_ids
  return tuple(dict.fromkeys(own + tuple(extra)))


def write_generation_config(directory: pathlib.Path, config: Any) -> None:
  """Writes ``generation_config.json`` with the config's special ids (``bos_token_id``,
  ``eos_token_id``: all stop ids, a list when several; ``pad_token_id``), as transformers'
  ``GenerationConfig`` writes and reads it; nothing when the config has no ``eos_token_id``.

  Raises:
    ImportError: transformers is not installed. OSError: the file cannot be written.
  """
  import transformers  # pylint: disable=g-import-not-at-top

  if getattr(config, "eos_token_id", None) is None:
    return
  fields = {}
  for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
    value = getattr(config, field, None)
    if value is not None:
      fields[field] = list(value) if isinstance(value, tuple) else value
  transformers.GenerationConfig(**fields).save_pretrained(str(directory))
