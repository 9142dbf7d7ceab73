"""Whole-directory writes that either land complete or leave what was there untouched.

A checkpoint directory is written into a temporary sibling (``.<name>.partial-<random>``) and renamed
into place only once every file is complete. Replacing an existing directory (``overwrite=True``)
swaps it out whole, so nothing of the old save (config, tokenizer, leftover shards, an orbax
``params/``) survives into the new one; a save that fails midway removes its temporary directory and
leaves the old directory byte-identical.

The swap is two renames on the same file system (old -> ``.<name>.old-<random>``, new -> name), each
atomic; a process killed between them leaves the complete old save under its ``.old-`` name.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import uuid
from typing import Iterator

# What a directory may hold for ``overwrite=True`` to delete it: a model checkpoint (config.json at its
# top) or nothing. Anything else is refused, so that a mistyped path cannot wipe a user's files.
_MODEL_MARKER = "config.json"


def check_destination(path: str | os.PathLike, *, overwrite: bool) -> pathlib.Path:
  """Checks that a directory may be written at ``path``; returns it as a ``Path``.

  Called by :func:`replace_directory` and by scripts that want to fail before any expensive work.

  An empty directory may always be written; a non-empty one only with ``overwrite``.

  Raises:
    FileExistsError: ``path`` is a file; or it is a non-empty directory and ``overwrite`` is False; or
      it is a non-empty directory that is not a model checkpoint (no ``config.json``), which is never
      deleted.
    NotADirectoryError: a parent of ``path`` is a file.
  """
  path = pathlib.Path(path)
  for parent in path.absolute().parents:
    if parent.exists() and not parent.is_dir():
      raise NotADirectoryError(f"cannot write {path}: its parent {parent} is a file")
  if path.exists() or path.is_symlink():
    if not path.is_dir():
      raise FileExistsError(f"{path} exists and is a file, not a checkpoint directory; choose "
                            "another path")
    if not any(path.iterdir()):
      return path  # an empty directory holds nothing to lose
    if not overwrite:
      raise FileExistsError(f"{path} already exists; pass overwrite=True (--overwrite on the command "
                            "line) to replace it whole, or choose another path")
    if not (path / _MODEL_MARKER).is_file():
      raise FileExistsError(f"{path} is a non-empty directory without {_MODEL_MARKER}, not a model "
                            "checkpoint; refusing to replace it (choose another path)")
  return path


@contextlib.contextmanager
def replace_directory(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[pathlib.Path]:
  """Yields an empty temporary directory that replaces ``path`` whole when the block succeeds.

  Usage::

      with replace_directory(out, overwrite=True) as tmp:
        write_everything_into(tmp)
      # now `out` holds exactly what was written into tmp

  Args:
    path: the directory to create or replace; its parent is created if missing.
    overwrite: replace an existing checkpoint directory (else it is an error).

  Raises:
    FileExistsError, NotADirectoryError: as :func:`check_destination`, before anything is written.
    Whatever the block raises, after removing the temporary directory (``path`` is untouched).
  """
  path = check_destination(path, overwrite=overwrite)
  path.parent.mkdir(parents=True, exist_ok=True)
  tag = uuid.uuid4().hex[:12]
  tmp = path.parent / f".{path.name}.partial-{tag}"
  tmp.mkdir()
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  if path.exists() or path.is_symlink():
    check_destination(path, overwrite=overwrite)  # it may have changed while we wrote
    old = path.parent / f".{path.name}.old-{tag}"
    os.rename(path, old)
  try:
    os.rename(tmp, path)
  except BaseException:
    if old is not None:
      os.rename(old, path)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if old is not None:
    if old.is_symlink() or not old.is_dir():
      old.unlink()
    else:
      shutil.rmtree(old)
