"""Where bass_jax keeps what it caches for the user: one directory per kind under the user's cache
directory (``$XDG_CACHE_HOME/bass_jax/<kind>``, else ``~/.cache/bass_jax/<kind>``), each movable or
turned off by an environment variable. Used by the compilation cache (``sampling.compile_cache``,
kind ``xla``) and the GGUF tokenizer cache (``checkpoints.tokenizer_cache``, kind ``tokenizers``).
"""

from __future__ import annotations

import os
import pathlib

# Settings that turn a cache off (compared lower-cased, stripped).
OFF = ("off", "0", "false", "none", "")


def default(kind: str) -> pathlib.Path:
  """``$XDG_CACHE_HOME/bass_jax/<kind>``, or ``~/.cache/bass_jax/<kind>``."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "bass_jax" / kind


def from_text(text: str) -> pathlib.Path | None:
  """The directory a setting's text names (``~`` expanded), or None for one of :data:`OFF`."""
  return None if text.strip().lower() in OFF else pathlib.Path(text).expanduser()


def from_env(env_var: str, kind: str) -> pathlib.Path | None:
  """The directory ``$<env_var>`` names (None when it says off), else :func:`default` of ``kind``."""
  setting = os.environ.get(env_var)
  return default(kind) if setting is None else from_text(setting)
