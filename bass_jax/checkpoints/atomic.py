"""Whole-directory writes that either land complete or leave what was there untouched.

A checkpoint directory is written into a temporary sibling (``.<name>.partial-<host>-<pid>-<tag>``) and
renamed into place only once every file is complete. Replacing an existing directory
(``overwrite=True``) swaps it out whole, so nothing of the old save (config, tokenizer, leftover shards,
an orbax ``params/``) survives into the new one; a save that fails midway removes its temporary
directory and leaves the old directory byte-identical.

``overwrite=True`` replaces only a directory that holds nothing but what a save writes
(:func:`unexpected_entries`, from the one list :data:`SAVE_FILES` + :data:`SAVE_FILE_PATTERNS` +
:data:`SAVE_DIRECTORIES`): a project directory that merely has a ``config.json`` at its top is refused,
untouched.

The swap is two renames on the same file system (old -> ``.<name>.old-<host>-<pid>-<tag>``, new ->
name), each atomic. A process killed while it writes leaves its ``.partial-`` directory; one killed
between or after the renames leaves the old save under its ``.old-`` name. The next save of the same
path removes those leftovers (:func:`remove_leftovers`): only the ones named for that path, and only
those whose process is gone.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import socket
import uuid
from typing import Iterator

# -- what a save writes -------------------------------------------------------------------------------
# The one list of what a checkpoint directory may hold for ``overwrite=True`` to replace it. It is what
# bass_jax's saves write (``bass_jax.save_model``: ``hf.save_hf_checkpoint`` or config + orbax
# ``params/``, then the tokenizer's ``save_pretrained``; ``checkpoints.eagle_files.save_eagle``), plus what
# transformers' own ``save_pretrained`` writes into the HF checkpoint directories ``load_model`` reads
# (shards and their index, PyTorch ``.bin``, ``generation_config.json``), so that re-saving over a
# converted or downloaded checkpoint works. None of these saves writes metadata of its own beside them;
# orbax's lives inside ``params/``.

CONFIG_FILE = "config.json"
# Files a tokenizer's ``save_pretrained`` may write (transformers' ``tokenization_utils_base``: config,
# fast tokenizer, legacy maps, chat template; and each supported family's vocabulary files: BPE
# ``vocab.json`` + ``merges.txt`` for GPT-2/OPT/CodeGen/Qwen2, SentencePiece ``tokenizer.model``).
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model",
    "vocab.txt", "spiece.model", "sentencepiece.bpe.model",
})
SAVE_FILES = frozenset({
    CONFIG_FILE, "generation_config.json", "model.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model.bin.index.json",
}) | TOKENIZER_FILES
# Sharded weights as transformers names them: model-00001-of-00002.safetensors, pytorch_model-….bin.
SAVE_FILE_PATTERNS = (re.compile(r"model-\d+-of-\d+\.safetensors"),
                      re.compile(r"pytorch_model-\d+-of-\d+\.bin"))
_ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA")


def _is_orbax_checkpoint(path: pathlib.Path) -> bool:
  return any((path / marker).is_file() for marker in _ORBAX_MARKERS)


def _only_chat_templates(path: pathlib.Path) -> bool:
  return all(p.suffix == ".jinja" and p.is_file() for p in path.iterdir())


# Subdirectories a save writes, each with the test of its content: the orbax parameter checkpoint of
# ``save_model(format="orbax")`` and the extra chat templates a tokenizer's ``save_pretrained`` writes.
SAVE_DIRECTORIES = {"params": _is_orbax_checkpoint, "additional_chat_templates": _only_chat_templates}


def unexpected_entries(path: str | os.PathLike) -> list[str]:
  """The entries at the top of directory ``path`` that no save writes, sorted; directories end in ``/``.

  Empty for a directory written by a save (or an empty one): only such a directory may be replaced by
  ``overwrite=True``. What a save writes: a file named in :data:`SAVE_FILES` or matching
  :data:`SAVE_FILE_PATTERNS`, or a directory in :data:`SAVE_DIRECTORIES` whose content passes its test.

  Raises:
    FileNotFoundError, NotADirectoryError: ``path`` is not a directory.
  """
  found = []
  for entry in sorted(pathlib.Path(path).iterdir()):
    name = entry.name
    if entry.is_dir():
      allowed = name in SAVE_DIRECTORIES and not entry.is_symlink() and SAVE_DIRECTORIES[name](entry)
      if not allowed:
        found.append(name + "/")
    elif not (entry.is_file() and (name in SAVE_FILES or any(p.fullmatch(name) for p in SAVE_FILE_PATTERNS))):
      found.append(name)
  return found


def check_destination(path: str | os.PathLike, *, overwrite: bool) -> pathlib.Path:
  """Checks that a directory may be written at ``path``; returns it as a ``Path``. Changes nothing.

  Called by :func:`replace_directory` and by scripts that want to fail before any expensive work.

  An empty directory may always be written; a non-empty one only with ``overwrite``, and only when it
  holds nothing but what a save writes (:func:`unexpected_entries`).

  Raises:
    FileExistsError: ``path`` is a file; or it is a non-empty directory and ``overwrite`` is False; or
      it holds anything a save does not write (a few named, and their count), which is never deleted.
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
    unexpected = unexpected_entries(path)
    if unexpected:
      shown = ", ".join(unexpected[:5]) + (", …" if len(unexpected) > 5 else "")
      raise FileExistsError(
          f"refusing to replace {path}: it holds {len(unexpected)} "
          f"{'entry' if len(unexpected) == 1 else 'entries'} that a save does not write ({shown}), "
          "and overwrite=True replaces only a directory written by a save. Choose an empty or new "
          "directory, or remove those files first")
  return path


# -- temporary names and their leftovers ----------------------------------------------------------------
# A temporary directory is named ``.<name>.partial-<host>-<pid>-<tag>`` (and the swapped-out old save
# ``.<name>.old-<host>-<pid>-<tag>``): ``host`` and ``pid`` say whose save it is, ``tag`` (12 random
# hex digits) keeps two saves of one process apart. Why host + pid, and not a lock: a process killed
# with SIGKILL cleans nothing up, but its pid is then gone; ``os.kill(pid, 0)`` tells a live save from a
# dead one with no lock file to leave behind or to break. A reused pid only keeps a dead save's leftover
# until a later save (never the reverse); a leftover written on another host (a shared file system, or
# a container with its own pid namespace and host name) cannot be checked from here and is kept.
# ``host`` holds no dots, nor does anything after it, so the name parses back to exactly one path: a
# leftover of ``ckpt.v2`` can never be taken for one of ``ckpt``.
_KINDS = ("partial", "old")


def _host() -> str:
  return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname())[:32] or "host"


def _temporary_name(path: pathlib.Path, kind: str, tag: str) -> pathlib.Path:
  return path.parent / f".{path.name}.{kind}-{_host()}-{os.getpid()}-{tag}"


def _pid_alive(pid: int) -> bool:
  if pid == os.getpid() or os.name == "nt":  # on Windows os.kill would terminate the process
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # PermissionError: alive, another user's; anything else: cannot tell, so keep it
    return True
  return True


def _remove(entry: pathlib.Path) -> None:
  if entry.is_symlink() or not entry.is_dir():
    entry.unlink(missing_ok=True)
  else:
    shutil.rmtree(entry, ignore_errors=True)


def leftovers(path: str | os.PathLike) -> list[pathlib.Path]:
  """The temporary directories that killed saves of ``path`` left beside it, which
  :func:`remove_leftovers` removes: named ``.<name>.partial-<host>-<pid>-<tag>`` or
  ``.<name>.old-<host>-<pid>-<tag>`` for exactly this ``path``, by this host, of a process that is no
  longer alive; and ``.<name>.partial-<tag>`` / ``.<name>.old-<tag>``, the names of bass_jax before
  they carried a pid (such a save cannot be running beside this one unless two versions save the same
  path at once).

  Raises:
    OSError: ``path``'s parent exists but cannot be listed (a missing parent gives ``[]``).
  """
  path = pathlib.Path(path)
  parent = path.parent
  if not parent.is_dir():
    return []
  kinds = "|".join(_KINDS)
  pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:{kinds})-"
                       r"(?:(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[1-9][0-9]*)-)?[0-9a-f]{12}")
  found = []
  for entry in sorted(parent.iterdir()):
    match = pattern.fullmatch(entry.name)
    if match is None:
      continue
    if match["pid"] is not None and (match["host"] != _host() or _pid_alive(int(match["pid"]))):
      continue
    found.append(entry)
  return found


def remove_leftovers(path: str | os.PathLike) -> list[pathlib.Path]:
  """Removes :func:`leftovers` of ``path`` (what killed saves of it left); returns what it removed.

  Raises:
    OSError: as :func:`leftovers`; never for a leftover it cannot remove (another save may be removing
      it at the same time), which stays.
  """
  removed = leftovers(path)
  for entry in removed:
    _remove(entry)
  return removed


@contextlib.contextmanager
def replace_directory(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[pathlib.Path]:
  """Yields an empty temporary directory that replaces ``path`` whole when the block succeeds.

  Usage::

      with replace_directory(out, overwrite=True) as tmp:
        write_everything_into(tmp)
      # now `out` holds exactly what was written into tmp

  Once ``path`` is checked, and before anything is written, the leftovers of earlier saves of
  ``path`` that were killed (``.<name>.partial-…`` / ``.<name>.old-…`` siblings whose process is gone;
  :func:`leftovers`) are removed. A refused save removes nothing.

  Args:
    path: the directory to create or replace; its parent is created if missing.
    overwrite: replace an existing checkpoint directory (else it is an error); only one that holds
      nothing but what a save writes (:func:`check_destination`).

  Raises:
    FileExistsError, NotADirectoryError: as :func:`check_destination`, before anything is written or
      removed.
    Whatever the block raises, after removing the temporary directory (``path`` is untouched).
  """
  path = check_destination(path, overwrite=overwrite)
  path.parent.mkdir(parents=True, exist_ok=True)
  with contextlib.suppress(OSError):  # best effort: a parent we may write but not list still saves
    remove_leftovers(path)
  tag = uuid.uuid4().hex[:12]
  tmp = _temporary_name(path, "partial", tag)
  tmp.mkdir()
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  try:
    if path.exists() or path.is_symlink():
      check_destination(path, overwrite=overwrite)  # it may have changed while we wrote
      old = _temporary_name(path, "old", tag)
      os.rename(path, old)
    os.rename(tmp, path)
  except BaseException:
    if old is not None and not (path.exists() or path.is_symlink()):
      os.rename(old, path)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if old is not None:
    _remove(old)
