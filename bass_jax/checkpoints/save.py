"""``save_model``: a loaded model written back, atomically, in a layout ``bass_jax.load_model`` (and, for
safetensors, transformers) reads."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.checkpoints import atomic
from bass_jax.checkpoints import eagle_files
from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import generation_config
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import orbax_ckpt
from bass_jax.checkpoints.sources import ORBAX_PARAMS_DIR
from bass_jax.models import eagle, medusa
from bass_jax.models.model import Model, model_dtype

def save_model(model: Model, path: str | os.PathLike, *, format: str = "safetensors",  # pylint: disable=redefined-builtin
               overwrite: bool = False, dtype: Any = None) -> None:
  """Writes a model that :func:`load_model` (and, for safetensors, transformers) reads back.

  The directory is written whole into a temporary sibling (``.<name>.partial-<host>-<pid>-<tag>``) and
  renamed into place when complete (:func:`bass_jax.checkpoints.atomic.replace_directory`): a failed
  save leaves an existing directory byte-identical, and ``overwrite=True`` replaces it whole, so no
  config, tokenizer, shard or ``params/`` of an earlier save survives.

  ``overwrite=True`` replaces only a directory that holds nothing but what a save writes
  (``config.json``, weights and their shards, tokenizer files, ``params/`` …; the one list is
  ``SAVE_FILES``, ``SAVE_FILE_PATTERNS`` and ``SAVE_DIRECTORIES`` in :mod:`bass_jax.checkpoints.atomic`);
  any other file is refused, named, and left in place.

  A save killed midway (SIGKILL, power loss) leaves its hidden ``.<name>.partial-…`` (or
  ``.<name>.old-…``) sibling. The next save of the same ``path`` removes those of ``path``'s leftovers
  whose process is gone (same host, pid no longer alive); other paths' leftovers and those of a save
  still running are kept.

  An EAGLE draft (config an ``eagle.EagleConfig``, params ``{"draft": …, "vocab_ids": i32[V']}``) is
  written in its own layouts (``checkpoints.eagle_files.write_files``): ``config.json`` +
  ``model.safetensors`` (what ``eagle_files.save_eagle`` writes and the shipped draft holds) or ``config.json`` + orbax
  ``params/``; the stored ``vocab_ids`` are the model's (a loaded draft's are cut to its V', so the
  rest of a shipped draft's frequency order is not carried over).

  A family's safetensors directory also gets a ``generation_config.json`` with the config's special
  ids when it has an ``eos_token_id``: every stop id (a list when several), as transformers'
  ``GenerationConfig.from_pretrained`` reads them; :func:`load_model` reads the same ids back. Other
  generation settings a loaded checkpoint's file held (temperature, top-p …) are not kept. An orbax
  save keeps the stop ids in its config.json.

  Args:
    model: the model (a :class:`Model`); its tokenizer, when set, is written too.
    path: the checkpoint directory to create (or replace, with ``overwrite``).
    format: ``"safetensors"`` (an HF checkpoint directory of the family; an EAGLE draft's own
      directory) or ``"orbax"`` (config.json plus an orbax parameter checkpoint in ``params/``); for an
      EAGLE-1 or EAGLE-3 draft also a published layout, ``"safeailab"`` or ``"speculators"`` (EAGLE-3),
      which SafeAILab's and vLLM's runtimes read (``checkpoints.eagle_formats.write_published``).
    overwrite: replace an existing checkpoint directory at ``path``.
    dtype: the stored floating parameters' dtype (``float32``, ``bfloat16``, ``float16``; a name or a
      jnp dtype); None (the default) stores the model's own. Integer arrays (an EAGLE draft's
      ``vocab_ids``) stay ``int32``. A family's safetensors file holds f16 or f32 (bfloat16 is written
      as f32, exactly); an EAGLE draft's and orbax hold bfloat16 as it is.

  Raises:
    ValueError: ``model`` not a :class:`Model` or ``path`` not a path (named, with what was passed);
      unknown format or dtype; ``overwrite`` not a bool; an EAGLE draft whose params are not
      ``{"draft", "vocab_ids"}``; Medusa heads (they load but do not save).
    FileExistsError: ``path`` exists and ``overwrite`` is False; ``path`` is a file; or ``path`` is a
      non-empty directory holding files a save does not write (a few named, with their count; never
      deleted: choose an empty or new directory, or remove them). NotADirectoryError: a parent of
      ``path`` is a file. Nothing is written or removed when any of these is raised; whatever a
      failing write raises (``OSError``: disk full), after removing its temporary directory.
  """
  if not isinstance(model, Model):
    raise ValueError(f"model must be a bass_jax.Model, got {type(model).__name__}")
  if not isinstance(path, (str, os.PathLike)):
    raise ValueError(f"path must be a directory path (str or os.PathLike), got {type(path).__name__}")
  if format not in ("safetensors", "orbax") + eagle_formats.LAYOUTS:
    raise ValueError(f"unknown format {format!r}; choose 'safetensors' or 'orbax' (or, for a "
                     f"published draft kind, one of {eagle_formats.LAYOUTS})")
  if format in eagle_formats.LAYOUTS and (not isinstance(model.config, eagle.EagleConfig)
                                          or model.config.kind == "bass"):
    raise ValueError(f"format {format!r} is a published EAGLE layout; {model.name or 'this model'} is "
                     "not an EAGLE-1 or EAGLE-3 draft")
  overwrite = _checks.as_bool("overwrite", overwrite)
  if dtype is not None:
    dtype = model_dtype(dtype)
  if isinstance(model.config, medusa.MedusaConfig):
    raise ValueError(f"{model.name or 'these Medusa heads'}: Medusa heads load but do not save; keep "
                     "the directory they were loaded from")
  if isinstance(model.config, eagle.EagleConfig):
    if not hasattr(model.params, "keys") or set(model.params.keys()) != {"draft", "vocab_ids"}:
      raise ValueError(f"an EAGLE draft's params must be {{'draft': …, 'vocab_ids': …}} (as load_model "
                       f"returns), got keys {sorted(getattr(model.params, 'keys', list)())}")
    with atomic.replace_directory(path, overwrite=overwrite) as tmp:
      if format in eagle_formats.LAYOUTS:
        eagle_formats.write_published(tmp, model.config, model.params, layout=format, dtype=dtype)
      else:
        eagle_files.write_files(tmp, model.config, model.params["draft"], model.params["vocab_ids"],
                                format=format, dtype=dtype)
      if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(tmp))
    return
  model = model.with_scanned_layers(False)  # files keep one subtree per layer, as HF's
  params = model.params
  if dtype is not None:
    params = jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
  with atomic.replace_directory(path, overwrite=overwrite) as tmp:
    if format == "safetensors":
      hf_ckpt.save_hf_checkpoint(tmp, model.config, params)
      generation_config.write_generation_config(tmp, model.config)
    else:
      hf_config = model.config.to_hf_config()
      hf_config.architectures = [model.config.hf_architecture]
      hf_config.save_pretrained(str(tmp))
      orbax_ckpt.save_params(tmp / ORBAX_PARAMS_DIR, params)
    if model.tokenizer is not None:
      model.tokenizer.save_pretrained(str(tmp))
