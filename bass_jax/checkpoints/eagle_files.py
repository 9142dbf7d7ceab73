"""This project's EAGLE draft directories: write, save atomically, and read back, in two layouts.

Two layouts, both with ``config.json`` (``models.eagle.EagleConfig.to_json``, plus provenance fields):
"safetensors", ``model.safetensors`` holding each parameter under its ``/``-joined Flax path and
``vocab_ids`` (what the shipped draft uses); "orbax", ``params/`` holding the tree ``{"draft": …,
"vocab_ids": …}`` as an orbax checkpoint (as ``save_model(format="orbax")`` stores other families).

The published EAGLE layouts (SafeAILab's, SpecForge's, ``speculators``') are read by
``checkpoints.eagle_formats``; ``bass_jax.load_model`` tells them apart. The model itself (its modules,
initialization and binding to a target) is ``bass_jax.models.eagle``, which does no file I/O.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from bass_jax import _checks
from bass_jax.checkpoints import atomic
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import mismatch
from bass_jax.checkpoints import orbax_ckpt
from bass_jax.checkpoints.sources import ORBAX_PARAMS_DIR
from bass_jax.models import eagle
from bass_jax.models import eagle_init


_WEIGHTS = "model.safetensors"
FORMATS = ("safetensors", "orbax")


def write_files(directory: str | os.PathLike, config: eagle.EagleConfig, params: Any, vocab_ids: Any, *,
                format: str = "safetensors", dtype: Any = None,  # pylint: disable=redefined-builtin
                extra: dict[str, Any] | None = None) -> None:
  """Writes a draft's files into ``directory``, an existing empty directory, in place (not atomic:
  :func:`save_eagle` and ``bass_jax.save_model`` call it on the temporary directory of
  ``checkpoints.atomic.replace_directory``).

  Args:
    directory: the existing, empty directory written into.
    config: the draft's config.
    params: its trainable parameters (``fc``, ``layers_*``, ``fuse``), a nested dict of float arrays.
    vocab_ids: ``int[>= V']`` the draft vocabulary, most frequent first; stored as ``int32``.
    format: ``"safetensors"`` or ``"orbax"`` (the layouts above).
    dtype: the stored parameters' dtype (``float32``, ``bfloat16``, ``float16``; a name or a dtype);
      None keeps each parameter's own.
    extra: more ``config.json`` fields (provenance: corpus, steps).

  Raises:
    ValueError: an unknown format; ``vocab_ids`` not 1-D or shorter than V'.
  """
  if format not in FORMATS:
    raise ValueError(f"unknown format {format!r}; choose one of {FORMATS}")
  directory = pathlib.Path(directory)
  ids = np.asarray(vocab_ids)
  if ids.ndim != 1 or len(ids) < config.draft_vocab_size:
    raise ValueError(f"vocab_ids must be int[>= draft_vocab_size={config.draft_vocab_size}], got "
                     f"shape {ids.shape}")
  ids = ids.astype(np.int32)
  flat = {k: np.asarray(v) if dtype is None else np.asarray(v).astype(jnp.dtype(dtype))
          for k, v in flax.traverse_util.flatten_dict(dict(params), sep="/").items()}
  if format == "safetensors":
    safetensors.numpy.save_file({**flat, "vocab_ids": ids}, str(directory / _WEIGHTS))
  else:
    tree = flax.traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in flat.items()}, sep="/")
    orbax_ckpt.save_params(directory / ORBAX_PARAMS_DIR,
                           {"draft": tree, "vocab_ids": jnp.asarray(ids)})
  (directory / "config.json").write_text(json.dumps({**config.to_json(), **(extra or {})}, indent=2))


def save_eagle(path: str | os.PathLike, config: eagle.EagleConfig, params: Any, vocab_ids: np.ndarray, *,
               dtype: Any = np.float16, extra: dict[str, Any] | None = None,
               overwrite: bool = False) -> None:
  """Writes ``config.json`` and ``model.safetensors`` (parameters cast to ``dtype``) as directory
  ``path``, atomically: into a temporary sibling renamed into place when complete
  (``checkpoints.atomic.replace_directory``, as ``bass_jax.save_model``), so a failed save leaves no
  partial ``path`` and an existing one byte-identical.

  The default dtype, float16, is what the shipped draft is stored in (half the bytes of float32), as
  ``experiments.train_eagle`` exports it; ``bass_jax.save_model`` writes a loaded draft in its own
  dtype (or another, when told) in either layout.

  Args:
    path: the draft directory to create (or replace, with ``overwrite``).
    config: the draft's config.
    params: its trainable parameters, a nested dict of float arrays.
    vocab_ids: ``int[>= V']`` draft vocabulary, most frequent first (the whole order may be stored:
      ``load_vocab_order`` reads it back, ``load_eagle`` keeps its first V').
    dtype: the stored parameters' dtype; None keeps each parameter's own.
    extra: more ``config.json`` fields (provenance: corpus, steps).
    overwrite: replace an existing draft directory at ``path`` whole.

  Raises:
    FileExistsError: ``path`` exists and ``overwrite`` is False, or it holds files a save does not
      write (never deleted; ``checkpoints.atomic.check_destination``); NotADirectoryError: a parent is
      a file. ValueError: as :func:`write_files`; ``overwrite`` not a bool. Nothing is written when
      any of these is raised; whatever a failing write raises (``OSError``: disk full), after removing
      its temporary directory.
  """
  overwrite = _checks.as_bool("overwrite", overwrite)
  with atomic.replace_directory(path, overwrite=overwrite) as tmp:
    write_files(tmp, config, params, vocab_ids, dtype=dtype, extra=extra)


def is_eagle(path: str | os.PathLike, fields: dict[str, Any] | None = None) -> bool:
  """Whether directory ``path`` holds this project's EAGLE draft (:func:`save_eagle`'s or
  ``bass_jax.save_model``'s layout; the published layouts are ``eagle_formats.published_kind``'s), by
  its config.json or its ``fields`` when already read.

  Raises:
    ValueError: its config.json is not valid JSON or not a JSON object (the file named).
  """
  path = pathlib.Path(path)
  if fields is None:
    if not (path / atomic.CONFIG_FILE).is_file():
      return False
    fields = hf_ckpt.read_config_fields(path)
  return fields.get("model_type") == eagle.MODEL_TYPE


def _layout(path: pathlib.Path) -> str:
  """``"safetensors"`` or ``"orbax"``: which of the two layouts draft directory ``path`` holds.

  Raises:
    FileNotFoundError: neither. ValueError: both (a directory two saves mixed).
  """
  weights, params = (path / _WEIGHTS).is_file(), (path / ORBAX_PARAMS_DIR).is_dir()
  if weights and params:
    raise ValueError(f"{path} holds an EAGLE draft in 2 formats ({_WEIGHTS} and {ORBAX_PARAMS_DIR}/); "
                     "it is ambiguous which to load. Keep one: re-save with overwrite=True, or delete the "
                     "stale one")
  if not (weights or params):
    raise FileNotFoundError(f"{path}: an EAGLE draft's config.json without {_WEIGHTS} or "
                            f"{ORBAX_PARAMS_DIR}/; copy the draft's weights there or re-save it")
  return "safetensors" if weights else "orbax"


def _read_safetensors(file: pathlib.Path, name: str | None = None) -> Any:
  """All tensors of ``file`` (a dict of numpy arrays), or only tensor ``name``.

  Raises:
    ValueError: a damaged or truncated file (one line, the file named). KeyError: no tensor ``name``.
  """
  try:
    if name is None:
      return safetensors.numpy.load_file(str(file))
    with safetensors.safe_open(str(file), framework="numpy") as f:
      names = set(f.keys())
      if name not in names:
        raise KeyError(f"{file} holds no {name!r} tensor")
      return f.get_tensor(name)
  except (KeyError, FileNotFoundError, MemoryError):
    raise
  except Exception as e:  # pylint: disable=broad-except  # safetensors' own error types
    reason = (str(e).splitlines() or [type(e).__name__])[0]
    raise ValueError(f"{file}: damaged or truncated safetensors file ({reason}); re-save the draft, "
                     "or copy the file again") from e


def _expected_draft(config: eagle.EagleConfig, dtype: Any = jnp.float32) -> Any:
  return jax.eval_shape(lambda: eagle_init.init_draft_params(config, jax.random.key(0), dtype))


def _stored_orbax(path: pathlib.Path) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
  """The stored shapes of an orbax draft's ``params/`` (``{"draft/…": shape, "vocab_ids": (n,)}``) and
  its ``vocab_ids``' shape.

  Raises:
    ValueError: a damaged checkpoint, or no 1-D ``vocab_ids`` (named).
  """
  shapes = orbax_ckpt.stored_shapes(path / ORBAX_PARAMS_DIR)
  vocab = shapes.get("vocab_ids")
  if vocab is None or len(vocab) != 1:
    raise ValueError(f"{path / ORBAX_PARAMS_DIR}: no 1-D vocab_ids stored (got {vocab}); re-save the draft "
                     "with its vocabulary")
  return shapes, vocab


def load_vocab_order(path: str | os.PathLike) -> np.ndarray:
  """``i32[n]``: the whole frequency-sorted vocabulary stored with a draft (its V' is a prefix), in
  either layout.

  Raises:
    FileNotFoundError: no weights. KeyError: a model.safetensors without ``vocab_ids``. ValueError: a
      damaged weight file (named); an orbax ``params/`` without ``vocab_ids``.
  """
  path = pathlib.Path(path)
  if _layout(path) == "safetensors":
    return np.asarray(_read_safetensors(path / _WEIGHTS, "vocab_ids"), np.int32)
  shapes, _ = _stored_orbax(path)
  abstract = flax.traverse_util.unflatten_dict(  # every stored array, as stored (orbax restores whole)
      {k: jax.ShapeDtypeStruct(v, jnp.int32 if k == "vocab_ids" else jnp.float32)
       for k, v in shapes.items()}, sep="/")
  return np.asarray(orbax_ckpt.restore_params(path / ORBAX_PARAMS_DIR, abstract)["vocab_ids"], np.int32)


def load_eagle(path: str | os.PathLike, *, dtype: Any = jnp.float32,
               fields: dict[str, Any] | None = None) -> tuple[eagle.EagleConfig, dict[str, Any]]:
  """Reads a draft directory in either layout (:func:`save_eagle`'s or ``bass_jax.save_model``'s).

  Args:
    path: the draft directory (``config.json`` and ``model.safetensors`` or ``params/``).
    dtype: the returned parameters' dtype.
    fields: config.json's object when the caller already read it (``locate.Checkpoint.fields``); None reads it.

  Returns:
    ``(config, params)`` with ``params = {"draft": …, "vocab_ids": i32[V']}``: the trained weights
    cast to ``dtype`` and the draft vocabulary cut to the config's V'.

  Raises:
    FileNotFoundError: a missing file. ValueError: config.json not a JSON object; a damaged or
      truncated weight file (named); both layouts in one directory; weights that do not match the
      config (one line: the parameter, both shapes, and the config field that explains it); vocab_ids
      missing or shorter than V'.
  """
  path = pathlib.Path(path)
  config = eagle.EagleConfig.from_json(hf_ckpt.read_config_fields(path) if fields is None else fields)
  tensors = None  # safetensors' arrays, already read
  if _layout(path) == "safetensors":
    tensors = _read_safetensors(path / _WEIGHTS)
    vocab_ids = tensors.pop("vocab_ids", None)
    vocab_len = None if vocab_ids is None else len(vocab_ids)
    have = {k: tuple(v.shape) for k, v in tensors.items()}
    shapes_for = lambda c: _expected_draft(c, dtype)
  else:
    vocab_ids = None  # restored below
    have, (vocab_len,) = _stored_orbax(path)
    vocab = jax.ShapeDtypeStruct((vocab_len,), jnp.int32)
    shapes_for = lambda c: {"draft": _expected_draft(c, dtype), "vocab_ids": vocab}
  if vocab_len is None or vocab_len < config.draft_vocab_size:
    raise ValueError(f"{path}: vocab_ids missing or shorter than draft_vocab_size "
                     f"{config.draft_vocab_size}; re-save the draft with its vocabulary")
  want = mismatch.flat_shapes(shapes_for(config))
  if have != want:
    raise ValueError(mismatch.mismatch_message(path, have, want, config=config,
                                                 shapes_for=shapes_for))
  if tensors is not None:
    params = flax.traverse_util.unflatten_dict(
        {k: jnp.asarray(v, dtype) for k, v in tensors.items()}, sep="/")
  else:
    restored = orbax_ckpt.restore_params(path / ORBAX_PARAMS_DIR, shapes_for(config))
    params, vocab_ids = restored["draft"], restored["vocab_ids"]
  return config, {"draft": params,
                  "vocab_ids": jnp.asarray(vocab_ids[:config.draft_vocab_size], jnp.int32)}
