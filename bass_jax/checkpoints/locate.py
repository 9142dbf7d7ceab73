"""Where a model spec points and which format it holds: the one dispatch that ``bass_jax.load_model``
and the preflight (``bass_jax.preflight.inspect_model``, which reads configs and no weights) share.

:func:`locate` resolves a spec (an alias, a path, a Hugging Face cache entry or repository id:
``sources.model_path``), refuses what is not a model in one line, reads ``config.json`` once and
tells the formats apart, in this order: a ``.gguf`` file; Medusa heads; this project's EAGLE draft;
a published EAGLE draft (EAGLE-1/2, EAGLE-3, speculators: ``eagle_formats.published_kind``); else a
model of a registered family, in orbax (``save_model``'s) or Hugging Face format.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from bass_jax.checkpoints import eagle_files
from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import medusa_files
from bass_jax.checkpoints import sources

# The formats, and the kind of model each holds (``Checkpoint.model_kind``).
KINDS: dict[str, str] = {
    "gguf": "gguf", "hf": "hf", "orbax": "hf", "eagle": "eagle", "eagle1": "eagle",
    "eagle3": "eagle", "eagle3-speculators": "eagle", "medusa": "medusa"}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A model spec resolved to its files, nothing read but ``config.json``.

  Attributes:
    name: the spec as given (for messages).
    path: the ``.gguf`` file or the checkpoint directory behind it.
    kind: its format, one of :data:`KINDS`: ``"gguf"``; ``"hf"`` (safetensors or PyTorch files of a
      registered family) or ``"orbax"`` (``save_model``'s orbax layout); ``"eagle"`` (this project's
      EAGLE draft, either layout); ``"eagle1"``, ``"eagle3"``, ``"eagle3-speculators"`` (published
      EAGLE drafts); ``"medusa"`` (Medusa heads).
    fields: ``config.json``'s top-level object; empty for a GGUF file.
  """

  name: str
  path: pathlib.Path
  kind: str
  fields: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

  @property
  def model_kind(self) -> str:
    """``"gguf"``, ``"hf"`` (a family's model, orbax saves too), ``"eagle"`` or ``"medusa"``."""
    return KINDS[self.kind]

  @property
  def published_eagle(self) -> bool:
    """A published EAGLE layout (read by ``eagle_formats``), not this project's (``eagle_files``)."""
    return self.model_kind == "eagle" and self.kind != "eagle"


def locate(spec: str | os.PathLike) -> Checkpoint:
  """Resolves ``spec`` and tells its format, reading ``config.json`` once and no weights (an EAGLE-1
  draft is told by its tensor names, read from the safetensors header).

  Raises:
    FileNotFoundError: nothing at ``spec`` (a repository id gets the download command; anything else
      the aliases), a link to a missing file (an interrupted download), a directory without
      ``config.json``, or what ``sources.model_path`` raises (an alias whose package is missing, a
      cache entry without its snapshot).
    ValueError: a file that is not ``.gguf``; a ``config.json`` that is not a JSON object; a family
      directory holding weights in more than one format (which are listed); a cache entry with
      several snapshots and no ``refs/main``.
  """
  name = str(spec)
  path = sources.model_path(spec)
  if not (path.is_symlink() or path.exists()):
    if sources.looks_like_repo_id(name):
      raise FileNotFoundError(
          f"no model at {name!r}: not an alias or a local path, and not in the local Hugging Face "
          f"cache ({sources.hf_hub_cache()}; nothing is downloaded). Get it with "
          f"{sources.download_hint(name)}, or pass its checkpoint directory")
    raise FileNotFoundError(f"no model at {name!r}: not an alias ({', '.join(sorted(sources.ALIASES))})"
                            ", an existing .gguf file or checkpoint directory")
  sources.check_links(path)
  if not path.is_dir():
    if path.suffix != ".gguf":
      raise ValueError(f"{path}: a model file must be .gguf; for a checkpoint pass its directory")
    return Checkpoint(name, path, "gguf")
  fields = hf_ckpt.read_config_fields(path)
  if medusa_files.is_medusa(path, fields):
    kind = "medusa"
  elif eagle_files.is_eagle(path, fields):
    kind = "eagle"
  else:
    kind = eagle_formats.published_kind(path, fields)
  if kind is None:
    formats = sources.weight_formats(path)
    if len(formats) > 1:
      raise ValueError(
          f"{path} holds weights in {len(formats)} formats ({'; '.join(formats)}); it is ambiguous "
          "which to load (a save over an earlier one?). Keep one: re-save with "
          "save_model(..., overwrite=True), or delete the stale files")
    kind = "orbax" if (path / sources.ORBAX_PARAMS_DIR).is_dir() else "hf"
  return Checkpoint(name, path, kind, fields)
