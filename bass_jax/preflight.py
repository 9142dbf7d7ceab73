"""What can be checked about a model or a draft spec before any weights load: that it exists, its
architecture's context, whether it carries a tokenizer, and a draft spec's grammar.

The experiment scripts call these before loading anything, so that a typo in ``--draft`` or a prompt
too long for the target's context is a one-line error in seconds rather than a traceback after the
weights are read. Only metadata is read: a GGUF file's header, a checkpoint's ``config.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Any

from bass_jax.checkpoints import hf as hf_ckpt

_NGRAM_KEYS = ("max_n", "min_n")
_SIBLING_KEYS = ("max_n", "min_n", "pool", "max_matches", "max_siblings", "min_agreement")
_FLOAT_KEYS = ("min_agreement",)
_N_POSITIONS_FAMILIES = ("gpt2", "codegen")  # whose context field is ``n_positions``
_SPECIAL_IDS = ("bos_token_id", "eos_token_id")  # loading.SPECIAL_IDS (not imported: it loads jax)


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """A model spec resolved without loading weights.

  Attributes:
    spec: as given. path: the file or directory behind it.
    kind: ``"gguf"``, ``"hf"`` (a Hugging Face directory; orbax saves too), ``"eagle"`` (this
      project's EAGLE drafts and the published EAGLE-1/2 and EAGLE-3 layouts) or ``"medusa"``.
    context: positions the architecture supports (``max_positions`` of its config).
    vocab_size: rows of its embedding (for an EAGLE draft: the vocabulary of the target it was
      trained for).
    has_tokenizer: it ships a tokenizer (a GGUF file always does).
    model_type: the config's (an EAGLE draft's own, ``"bass_eagle"``). hidden_size: its width (an EAGLE
      draft's: the target features' width it reads). num_layers: decoder layers.
    special_ids: ``{"bos_token_id": ..., "eos_token_id": ...}`` where the config sets them.
    fused_layers: an EAGLE draft's fused target layers (empty otherwise).
    sliding_window: the attention window of a Mistral-style config (an EAGLE draft's layer's), or None.
  """

  spec: str
  path: pathlib.Path
  kind: str
  context: int
  vocab_size: int
  has_tokenizer: bool
  model_type: str = ""
  hidden_size: int = 0
  num_layers: int = 0
  special_ids: dict[str, Any] = dataclasses.field(default_factory=dict)
  fused_layers: tuple[int, ...] = ()
  sliding_window: int | None = None


def inspect_model(spec: str | os.PathLike) -> ModelSource:
  """Resolves ``spec`` as ``bass_jax.load_model`` would and reads its config, not its weights.

  Raises:
    FileNotFoundError: no alias, file or directory by that name (the fix named). ValueError: not a
      model: a file that is not ``.gguf``, a directory without ``config.json``, a config that is not a
      JSON object or names an unsupported architecture (each naming the file).
  """
  from bass_jax import loading  # pylint: disable=g-import-not-at-top
  from bass_jax.models import eagle  # pylint: disable=g-import-not-at-top

  name = str(spec)
  path = loading.model_path(spec)  # an alias, a path, a Hugging Face cache entry or repo id
  if not path.exists():
    raise FileNotFoundError(f"no model at {name!r}: not an alias ({', '.join(sorted(loading.ALIASES))}),"
                            " an existing .gguf file or checkpoint directory, nor a repository in the "
                            "local Hugging Face cache")
  if path.is_file():
    if path.suffix != ".gguf":
      raise ValueError(f"{path}: a model file must be .gguf; for a checkpoint pass its directory")
    config = _gguf_config(path)
    special = {f: getattr(config, f) for f in _SPECIAL_IDS if getattr(config, f, None) is not None}
    return ModelSource(name, path, "gguf", config.max_positions, config.vocab_size, True,
                       config.model_type, config.hidden_size, config.num_hidden_layers, special)
  fields = hf_ckpt.read_config_fields(path)
  has_tokenizer = loading.has_tokenizer(path)
  from bass_jax.checkpoints import eagle_formats  # pylint: disable=g-import-not-at-top
  from bass_jax.models import llama, medusa  # pylint: disable=g-import-not-at-top
  if medusa.is_medusa(path):  # its sizes are checked against the target when it loads
    return ModelSource(name, path, "medusa", medusa.MedusaConfig.max_positions,
                       int(fields.get("vocab_size") or 0), has_tokenizer, medusa.MODEL_TYPE,
                       int(fields.get("hidden_size") or 0))
  if eagle_formats.published_kind(path):  # EAGLE-1/2, EAGLE-3, speculators
    config = eagle_formats.published_config(path)
    return ModelSource(name, path, "eagle", config.max_positions, config.layer.vocab_size,
                       has_tokenizer, eagle.MODEL_TYPE, config.tap_size or config.feature_size,
                       config.num_layers, {}, tuple(config.target_taps),
                       config.layer.sliding_window)
  model_type = fields.get("model_type")
  outer = fields
  if model_type == eagle.MODEL_TYPE:
    kind, fields = "eagle", fields.get("layer")
  elif model_type in llama.TRAITS or model_type == "gemma3":
    # Read through the family config (transformers' defaults for absent fields, a multimodal Gemma 3's
    # text_config, longrope's shorter exact context): the fields alone would tell another story.
    config = hf_ckpt.config_from_hf(fields)
    special = {f: getattr(config, f) for f in _SPECIAL_IDS if getattr(config, f, None) is not None}
    if isinstance(special.get("eos_token_id"), tuple):
      special["eos_token_id"] = list(special["eos_token_id"])
    return ModelSource(name, path, "hf", config.max_positions, config.vocab_size, has_tokenizer,
                       config.model_type, config.hidden_size, config.num_hidden_layers, special, (),
                       config.sliding_window)
  elif model_type in hf_ckpt.CONFIG_CLASSES:
    kind = "hf"
  else:
    raise ValueError(f"{path / 'config.json'}: unsupported model_type {model_type!r}; supported: "
                     f"{', '.join(sorted(hf_ckpt.CONFIG_CLASSES))}")
  # The context field of each family (its config class's ``max_positions``), read directly: building
  # the config class would import transformers' rotary helpers (and torch), seconds for one number.
  key = "n_positions" if model_type in _N_POSITIONS_FAMILIES else "max_position_embeddings"
  context = fields.get(key) if isinstance(fields, dict) else None
  if not isinstance(context, int) or context < 1:
    raise ValueError(f"{path / 'config.json'}: no positive integer {key!r} (the model's context)")
  width_key, layers_key = (("n_embd", "n_layer") if model_type in _N_POSITIONS_FAMILIES
                           else ("hidden_size", "num_hidden_layers"))
  numbers = {}
  for key in ("vocab_size", width_key, layers_key):
    value = fields.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{path / 'config.json'}: no positive integer {key!r}")
    numbers[key] = value
  special = {f: fields[f] for f in _SPECIAL_IDS if fields.get(f) is not None}
  fused = ()
  if kind == "eagle":
    fused = outer.get("fused_layers") or ()
    if not isinstance(fused, (list, tuple)) or not all(isinstance(i, int) for i in fused):
      raise ValueError(f"{path / 'config.json'}: fused_layers must be a list of layer indices")
  window = fields.get("sliding_window") if fields.get("use_sliding_window", True) else None
  return ModelSource(name, path, kind, context, numbers["vocab_size"], has_tokenizer,
                     str(model_type), numbers[width_key], numbers[layers_key], special, tuple(fused),
                     window if isinstance(window, int) and not isinstance(window, bool) else None)


def _gguf_config(path: pathlib.Path) -> Any:
  """A GGUF file's config from its header, remembered by path, size and modification time: the
  header holds the tokenizer's arrays, whose parse takes seconds, and a process (or a test) checks the
  same file many times."""
  stat = path.stat()
  return _gguf_config_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _gguf_config_cached(path: str, size: int, mtime_ns: int) -> Any:
  del size, mtime_ns  # the cache key
  from bass_jax.checkpoints import gguf as gguf_ckpt  # pylint: disable=g-import-not-at-top

  return gguf_ckpt.read_config(gguf_ckpt._open(pathlib.Path(path)), pathlib.Path(path))  # pylint: disable=protected-access


def check_pair(target: ModelSource, draft: ModelSource) -> None:
  """Checks, from the configs alone, that ``draft`` can draft for ``target``: the same vocabulary size
  and special token ids (where both configs set them), and for an EAGLE draft the target's family,
  feature width and layers (``eagle.check_pair``). The tokenizers' full vocabularies are compared when
  the models load (``loading.check_same_tokenizer``).

  Args:
    target, draft: the two specs as :func:`inspect_model` resolved them.

  Raises:
    ValueError: the first mismatch, naming both models, the field and both values.
  """
  from bass_jax import loading  # pylint: disable=g-import-not-at-top
  from bass_jax.models import eagle  # pylint: disable=g-import-not-at-top

  where = f"draft {draft.spec!r} and target {target.spec!r}"
  if draft.kind == "eagle":
    eagle.check_pair(draft.hidden_size, draft.vocab_size, draft.fused_layers,
                     target_model_type=target.model_type, target_hidden_size=target.hidden_size,
                     target_vocab_size=target.vocab_size, target_layers=target.num_layers,
                     name=f"the EAGLE draft {draft.spec!r}")
  elif draft.kind == "medusa":  # a FasterDecoding config names no sizes: checked at load
    if draft.vocab_size and draft.vocab_size != target.vocab_size:
      raise ValueError(f"{where} have different vocabulary sizes ({draft.vocab_size} vs "
                       f"{target.vocab_size}); the heads were trained for another target")
  elif draft.vocab_size != target.vocab_size:
    raise ValueError(f"{where} have different vocabulary sizes ({draft.vocab_size} vs "
                     f"{target.vocab_size}); speculative decoding needs the target's tokenizer")
  conflict = loading.special_ids_conflict(draft.special_ids, target.special_ids)
  if conflict:
    raise ValueError(f"{where} {conflict}")


def parse_draft_spec(spec: str) -> tuple[str | None, dict[str, int] | None, dict[str, Any] | None]:
  """The parts of a draft spec (``bass_jax.load_draft_spec``): ``(model spec or None, n-gram settings
  or None, sibling-lookup settings or None)``.

  ``ngram[:max_n=4,min_n=2]`` is n-gram lookup alone; ``siblings[:max_n=8,min_n=2,pool=8,
  max_matches=32,max_siblings=15,min_agreement=0.1]`` sibling lookup alone;
  ``hybrid:<model>[:max_n=..,min_n=..]`` n-gram lookup and a model;
  ``hybrid+siblings:<model>[:max_n=..,min_n=..]`` sibling lookup (at its defaults), then n-gram
  lookup, then the model; anything else a model alone. (No commas outside
  settings: scripts take lists of specs.)

  Raises:
    ValueError: a malformed setting, an empty hybrid or one without a model (the accepted form
      named).
  """
  spec = str(spec)

  def settings(text: str, keys: tuple[str, ...], form: str) -> dict[str, Any]:
    kwargs = {}
    for item in filter(None, text.split(",")):
      key, _, value = item.partition("=")
      value = value.strip()
      number = value.isdigit() or (key in _FLOAT_KEYS and value.replace(".", "", 1).isdigit())
      if key not in keys or not number:
        raise ValueError(f"draft spec {spec!r}: {form}, got {item!r}")
      kwargs[key] = float(value) if key in _FLOAT_KEYS else int(value)
    return kwargs

  def ngram(text: str) -> dict[str, int]:
    return settings(text, _NGRAM_KEYS, "n-gram settings are max_n=<int>,min_n=<int>")

  kind, _, rest = spec.partition(":")
  if kind == "ngram":
    return None, ngram(rest), None
  if kind == "siblings":
    return None, None, settings(rest, _SIBLING_KEYS, "sibling settings are max_n=<int>,min_n=<int>,"
                                "pool=<int>,max_matches=<int>,max_siblings=<int>,"
                                "min_agreement=<float>")
  if kind in ("hybrid", "hybrid+siblings"):
    if rest == "siblings" or rest.startswith(("siblings,", "siblings:", "siblings+")):
      raise ValueError(f"draft spec {spec!r}: sibling lookup in a hybrid is written "
                       "hybrid+siblings:<model spec>[:max_n=4,min_n=2]")
    if not rest:
      raise ValueError(f"draft spec {spec!r}: write {kind}:<model spec>[:max_n=4,min_n=2]")
    model_spec, _, text = rest.rpartition(":") if "=" in rest else (rest, "", "")
    return model_spec, ngram(text), ({} if kind == "hybrid+siblings" else None)
  if not spec:
    raise ValueError("draft spec is empty: give a model, 'ngram', 'siblings' or 'hybrid:<model>'")
  return spec, None, None


def inspect_draft_spec(spec: str) -> ModelSource | None:
  """Checks a draft spec without loading it: its grammar, the n-gram settings' ranges, and the model it
  names (:func:`inspect_model`). Returns the model's source, or None for a lookup alone.

  Raises:
    FileNotFoundError, ValueError: as :func:`parse_draft_spec` and :func:`inspect_model`, the spec
      named.
  """
  # pylint: disable-next=g-import-not-at-top
  from bass_jax.sampling.proposers import NGramProposer, SiblingProposer

  model_spec, ngram, siblings = parse_draft_spec(spec)
  for kind, settings in ((NGramProposer, ngram), (SiblingProposer, siblings)):
    if settings is not None:
      try:
        kind(**settings)
      except ValueError as e:
        raise ValueError(f"draft spec {spec!r}: {e}") from e
  if model_spec is None:
    return None
  try:
    return inspect_model(model_spec)
  except (FileNotFoundError, ValueError) as e:
    raise type(e)(f"draft spec {spec!r}: {e}") from e


def load_tokenizer(source: ModelSource) -> Any:
  """The tokenizer of a model, without its weights (transformers ``AutoTokenizer``).

  Raises:
    ValueError: the model ships none.
  """
  import transformers  # pylint: disable=g-import-not-at-top

  if not source.has_tokenizer:
    raise ValueError(f"{source.spec}: ships no tokenizer")
  if source.kind == "gguf":
    return transformers.AutoTokenizer.from_pretrained(str(source.path.parent),
                                                      gguf_file=source.path.name)
  return transformers.AutoTokenizer.from_pretrained(str(source.path))


MAX_SEED = 2**63 - 1  # generate's seeds: all 64 bits of the threefry key count (generate.prng_key)


def check_seed(seed: Any, runs: int = 1) -> int:
  """Checks a run's seed: an int such that every seed the run derives from it, ``seed .. seed + runs -
  1`` (a static batch ``i`` decodes with ``seed + i``), lies in ``[0, MAX_SEED]``.

  Args:
    seed: the run's seed (a Python or NumPy int). runs: the seeds the run derives (its static batches).

  Returns:
    The seed as a Python int.

  Raises:
    ValueError: not an int, negative, or too large for ``runs`` batches (the largest allowed named).
  """
  from bass_jax import _checks  # pylint: disable=g-import-not-at-top

  runs = _checks.as_int("runs", runs, min_value=1)
  return _checks.as_int("seed" if runs == 1 else f"seed (with {runs} batches, seed + {runs - 1})",
                        seed, min_value=0, max_value=MAX_SEED - (runs - 1))


def check_speculation(method: str, draft_len: Any, draft_tree: Any, *, vocab_size: int | None = None,
                      context: int | None = None) -> tuple[Any, tuple[Any, ...]]:
  """The speculation settings of a run, checked together: the one place ``generate`` and every script
  decide them.

  Args:
    method: ``"bass"`` or ``"regular"``.
    draft_len: ``"dynamic"``, ``"goodput"``, an int in ``[1, draft_len.MAX_DRAFT_LEN]`` or a policy.
    draft_tree: None, or shapes as ``tree.tree_shapes`` takes them.
    vocab_size, context: the models' (when known), which a tree shape must fit
      (``TreeShape.check_fits``) and a fixed draft length must stay below.

  Returns:
    ``(policy, trees)``: the draft-length policy (None for regular decoding; with one tree shape and
    the default policy, a fixed length of its depth; with goodput, the policy choosing among the
    shapes) and the tree shapes (empty for chains).

  Raises:
    ValueError: an unknown method, a bad draft length or tree shape (``tree.TreeShape.parse``), a tree
      with regular decoding, several shapes without ``draft_len="goodput"``, a tree with a fixed
      length, or a shape or length that does not fit the models.
  """
  import dataclasses as dc  # pylint: disable=g-import-not-at-top,reimported

  from bass_jax.sampling import draft_len as draft_len_lib  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import tree as tree_lib  # pylint: disable=g-import-not-at-top

  if method not in ("bass", "regular"):
    raise ValueError(f"method must be 'bass' or 'regular', got {method!r}")
  trees = tree_lib.tree_shapes(draft_tree)
  if method == "regular":
    if trees:
      raise ValueError("draft_tree needs method='bass': regular decoding drafts nothing")
    return None, ()
  policy = draft_len_lib.as_policy(draft_len)
  if context is not None and isinstance(policy, draft_len_lib.FixedDraftLen):
    if policy.length >= context:
      raise ValueError(f"draft_len={policy.length} must be below the models' context of {context} "
                       "positions; lower it")
  for shape in trees:
    if vocab_size is not None and context is not None:
      shape.check_fits(vocab_size=vocab_size, context=context)
  if not trees:
    return policy, ()
  if isinstance(policy, draft_len_lib.GoodputDraftLen):
    return dc.replace(policy, trees=trees), trees
  if not (isinstance(draft_len, str) and draft_len == "dynamic"):
    raise ValueError(f"draft_len={draft_len!r} chooses chain lengths; with draft_tree leave it at its "
                     "default (every step verifies the tree) or pass 'goodput' (each step chooses "
                     "among plain steps, chains and the tree shapes)")
  if len(trees) > 1:
    raise ValueError(f"draft_tree names {len(trees)} shapes: choosing among them per step needs "
                     "draft_len='goodput' (or give one shape)")
  return draft_len_lib.as_policy(trees[0].depth), trees
