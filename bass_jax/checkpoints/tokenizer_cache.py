"""A GGUF file's tokenizer, converted once: transformers builds it from the file's metadata (seconds
for SmolLM2's 49,152 tokens, most of it reading the metadata a second time), and a tokenizer saved
with ``save_pretrained`` loads back in a fraction of a second.

The converted tokenizer is kept in ``$BASS_JAX_TOKENIZER_CACHE_DIR``, by default
``$XDG_CACHE_HOME/bass_jax/tokenizers`` or ``~/.cache/bass_jax/tokenizers``; ``off`` (or another of
``cache_dirs.OFF``) turns the cache off. An entry's key is a SHA-256 of the file's first
:data:`KEY_BYTES` bytes (GGUF's header and metadata, where the tokenizer lives, come first; the tensor
data follows them), the file's size and transformers' version, so an edited or replaced file, or
another transformers, converts afresh. Entries are written to a temporary directory and renamed into
place, so a reader sees a whole entry or none. A cache that cannot be read or written warns once and
the tokenizer is converted as without it: the cache is never a failure.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile
import warnings
from typing import Any

from bass_jax import cache_dirs

ENV_VAR = "BASS_JAX_TOKENIZER_CACHE_DIR"
KEY_BYTES = 64 << 20  # the metadata of any published GGUF fits in its first 64 MiB


def directory() -> pathlib.Path | None:
  """The cache directory: ``$BASS_JAX_TOKENIZER_CACHE_DIR`` if set (None when it says off), else
  ``$XDG_CACHE_HOME/bass_jax/tokenizers`` or ``~/.cache/bass_jax/tokenizers``."""
  return cache_dirs.from_env(ENV_VAR, "tokenizers")


def key(path: pathlib.Path) -> str:
  """The entry name of the GGUF file at ``path``: SHA-256 of its first :data:`KEY_BYTES` bytes, its
  size and transformers' version.

  Raises:
    OSError: the file cannot be read.
  """
  import transformers  # pylint: disable=g-import-not-at-top

  digest = hashlib.sha256()
  with open(path, "rb") as f:
    digest.update(f.read(KEY_BYTES))
  digest.update(f"|{path.stat().st_size}|{transformers.__version__}".encode())
  return digest.hexdigest()


# The tokenizer keys transformers' GGUF conversion reads unchecked, and what needs each.
_TOKENIZER_KEYS = {"tokens": "of any kind", "scores": "without merges, or a unigram one",
                   "merges": "of byte-level BPE", "token_type": "with its special tokens"}


def load(path: str | os.PathLike) -> Any:
  """The tokenizer of the GGUF file at ``path``, as ``AutoTokenizer.from_pretrained(parent,
  gguf_file=name)`` builds it: from the cache when an entry for this file is there, else converted
  and stored.

  Raises:
    ValueError: the file's tokenizer lacks a key transformers reads (``tokenizer.ggml.scores`` of a
      vocabulary without merges: named, one line). Otherwise what ``AutoTokenizer.from_pretrained``
      raises for the file (the cache's own errors only warn).
  """
  import transformers  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path)
  cache = directory()
  entry = None
  if cache is not None:
    try:
      entry = cache / key(path)
      if (entry / "tokenizer_config.json").is_file():
        return transformers.AutoTokenizer.from_pretrained(str(entry))
    except Exception as e:  # pylint: disable=broad-except
      _warn(f"bass_jax: tokenizer cache {cache} could not be read ({type(e).__name__}: {e}); "
            f"converting the tokenizer of {path.name} (set {ENV_VAR} to another directory, or "
            "to 'off')")
  try:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  except KeyError as e:  # transformers reads the tokenizer's metadata keys without a check
    missing = e.args[0] if e.args else None
    if missing not in _TOKENIZER_KEYS:
      raise
    raise ValueError(f"{path}: its tokenizer has no tokenizer.ggml.{missing}, which transformers needs "
                     f"to build it (a vocabulary {_TOKENIZER_KEYS[missing]}); re-convert the file with its "
                     "tokenizer's full metadata, or load it with tokenizer=False") from e
  if entry is not None:
    _store(tokenizer, entry)
  return tokenizer


def _store(tokenizer: Any, entry: pathlib.Path) -> None:
  """Saves ``tokenizer`` as ``entry``, through a temporary directory renamed into place; warns
  instead of raising."""
  tmp = None
  try:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-")
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, entry)
    tmp = None
  except OSError as e:
    if not entry.is_dir():  # another process renaming the same entry first is no failure
      _warn(f"bass_jax: tokenizer cache {entry.parent} could not be written ({e}); set {ENV_VAR} "
            "to another directory, or to 'off'")
  finally:
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)


_WARNED: set[str] = set()


def _warn(message: str) -> None:
  if message not in _WARNED:
    _WARNED.add(message)
    warnings.warn(message, stacklevel=3)
