"""orbax-checkpoint save/restore of a parameter tree, restored into abstract shapes (no random init).

A checkpoint whose stored parameters disagree with its ``config.json`` is refused in one line that names
the first differing parameter with both shapes and, where one config field explains every difference,
that field with both values (``checkpoints.mismatch``); a damaged checkpoint (metadata missing, an array
file truncated) is refused naming the directory.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any, Callable

from bass_jax.checkpoints.mismatch import flat_shapes, mismatch_message


def save_params(path: str | os.PathLike, params: Any) -> None:
  """Writes ``params`` (a pytree of arrays) as an orbax checkpoint directory at ``path``.

  Raises:
    FileExistsError: if ``path`` exists (orbax never overwrites; remove it first).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if path.exists():
    raise FileExistsError(f"{path} exists; orbax does not overwrite checkpoints, remove it first")
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, params)


def _damaged(path: pathlib.Path, what: str) -> ValueError:
  return ValueError(f"{path}: damaged orbax checkpoint ({what}); re-save the model, or restore "
                    f"{path.name}/ from a copy")


def _stored_tree(checkpointer: Any, path: pathlib.Path) -> Any:
  try:
    metadata = checkpointer.metadata(path)
  except Exception as e:  # pylint: disable=broad-except  # orbax raises many types for broken files
    raise _damaged(path, f"its metadata cannot be read: {type(e).__name__}") from e
  stored = getattr(metadata, "item_metadata", metadata)
  if stored is None or not hasattr(stored, "keys"):
    raise _damaged(path, "no readable parameter metadata; _METADATA or the manifest is missing")
  return stored


def stored_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
  """The shapes of the parameters stored in the orbax checkpoint at ``path``, by ``/``-joined path
  (:func:`flat_shapes`); no array is read.

  Raises:
    FileNotFoundError: no directory at ``path``. ValueError: a damaged checkpoint (no readable
      metadata; the directory named).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if not path.is_dir():
    raise FileNotFoundError(f"no orbax checkpoint directory at {path}")
  with ocp.StandardCheckpointer() as checkpointer:
    return flat_shapes(dict(_stored_tree(checkpointer, path)))


def _failing_array(error: BaseException) -> str | None:
  """The stored array a TensorStore read error names (``layers_0.mlp.up_proj.kernel``), if any."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    match = re.search(r'reading "([^"/]+)/', str(error))
    if match:
      return match[1]
    error = error.__cause__ or error.__context__
  return None


def restore_params(path: str | os.PathLike, abstract_params: Any, *, config: Any = None,
                   shapes_for: Callable[[Any], Any] | None = None) -> Any:
  """Restores an orbax parameter checkpoint into the shapes and dtypes of ``abstract_params``.

  Args:
    path: the orbax checkpoint directory (a save's ``params/``).
    abstract_params: pytree of ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the model's init, cast
      to the wanted dtype, with shardings on a mesh); the restored arrays take these dtypes.
    config: the config ``abstract_params`` was built from (``config.json``'s), or None; with
      ``shapes_for`` it lets a mismatch name the config field that explains it.
    shapes_for: ``config -> abstract parameter tree`` (``models.model.abstract_params``), called on variants
      of ``config`` only when the shapes differ (``checkpoints.mismatch``).

  Returns:
    The parameters, a pytree of ``jax.Array`` with ``abstract_params``' structure, shapes and dtypes.

  Raises:
    FileNotFoundError: no checkpoint at ``path``.
    ValueError: the checkpoint's tree or shapes differ from ``abstract_params`` (one line: the first
      differing parameter, both shapes, and the config field with both values where one explains it);
      a damaged checkpoint (metadata missing or unreadable, an array file missing or truncated), the
      directory and, where orbax says, the array named.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if not path.is_dir():
    raise FileNotFoundError(f"no orbax checkpoint directory at {path}")
  with ocp.StandardCheckpointer() as checkpointer:
    have = flat_shapes(dict(_stored_tree(checkpointer, path)))
    want = flat_shapes(abstract_params)
    if want != have:
      raise ValueError(mismatch_message(path, have, want, config=config, shapes_for=shapes_for))
    try:
      return checkpointer.restore(path, abstract_params)
    except MemoryError:
      raise
    except Exception as e:  # pylint: disable=broad-except  # TensorStore raises bare Exceptions
      array = _failing_array(e)
      raise _damaged(path, f"the stored array {array} cannot be read" if array
                     else f"a stored array cannot be read: {type(e).__name__}") from e
