"""orbax-checkpoint save/restore of a parameter tree, restored into abstract shapes (no random init)."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax


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


def restore_params(path: str | os.PathLike, abstract_params: Any) -> Any:
  """Restores an orbax parameter checkpoint into the shapes and dtypes of ``abstract_params``.

  Args:
    abstract_params: pytree of ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the model's init, cast
      to the wanted dtype); the restored arrays take these dtypes.

  Raises:
    FileNotFoundError: no checkpoint at ``path``. ValueError: the checkpoint's tree or shapes differ.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if not path.is_dir():
    raise FileNotFoundError(f"no orbax checkpoint directory at {path}")
  with ocp.StandardCheckpointer() as checkpointer:
    metadata = checkpointer.metadata(path)
    stored = getattr(metadata, "item_metadata", metadata)
    want = jax.tree_util.tree_map(lambda x: tuple(x.shape), abstract_params)
    have = jax.tree_util.tree_map(lambda x: tuple(x.shape), dict(stored))
    if want != have:
      raise ValueError(f"{path}: checkpoint parameters {have} do not match the model's {want}")
    return checkpointer.restore(path, abstract_params)
