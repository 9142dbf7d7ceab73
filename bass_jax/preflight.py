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

from bass_jax import loading
from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import gguf as gguf_ckpt
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import sources
from bass_jax.checkpoints import tokenizer_cache
from bass_jax.checkpoints.locate import locate
from bass_jax.models import eagle, llama, medusa
from bass_jax.models import family as family_lib
from bass_jax.sampling.drafts import parse_draft_spec



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
  """Resolves ``spec`` as ``bass_jax.load_model`` does (the same dispatch: ``checkpoints.locate``) and
  reads its config, not its weights.

  Raises:
    FileNotFoundError: no alias, file or directory by that name (the fix named), or a directory without
      ``config.json``. ValueError: not a model: a file that is not ``.gguf``, a config that is not a
      JSON object or names an unsupported architecture, a directory with weights in two formats (each
      naming the file).
  """
  found = locate(spec)
  name, path, kind = found.name, found.path, found.model_kind
  if found.kind == "gguf":
    config = _gguf_config(path)
    special = {f: getattr(config, f) for f in loading.SPECIAL_IDS
               if getattr(config, f, None) is not None}
    return ModelSource(name, path, kind, config.max_positions, config.vocab_size, True,
                       config.model_type, config.hidden_size, config.num_hidden_layers, special)
  fields = found.fields
  has_tokenizer = sources.has_tokenizer(path)
  if found.kind == "medusa":  # its sizes are checked against the target when it loads
    return ModelSource(name, path, kind, medusa.MedusaConfig.max_positions,
                       int(fields.get("vocab_size") or 0), has_tokenizer, medusa.MODEL_TYPE,
                       int(fields.get("hidden_size") or 0))
  if found.published_eagle:  # EAGLE-1/2, EAGLE-3, speculators
    config = eagle_formats.published_config(path, fields)
    return ModelSource(name, path, kind, config.max_positions, config.layer.vocab_size,
                       has_tokenizer, eagle.MODEL_TYPE, config.tap_size or config.feature_size,
                       config.num_layers, {}, tuple(config.target_taps),
                       config.layer.sliding_window)
  model_type = fields.get("model_type")
  outer = fields
  registered = family_lib.find(model_type) or family_lib.wrapped_by(model_type)
  if found.kind == "eagle":
    fields, table = fields.get("layer"), llama.LlamaConfig.FIELDS
  elif registered is not None and registered.config_class is llama.LlamaConfig:
    # Read through the family config (transformers' defaults for absent fields, a multimodal Gemma 3's
    # text_config, longrope's shorter exact context): the fields alone would tell another story.
    config = hf_ckpt.config_from_hf(fields, path / "config.json")
    special = {f: getattr(config, f) for f in loading.SPECIAL_IDS
               if getattr(config, f, None) is not None}
    if isinstance(special.get("eos_token_id"), tuple):
      special["eos_token_id"] = list(special["eos_token_id"])
    return ModelSource(name, path, kind, config.max_positions, config.vocab_size, has_tokenizer,
                       config.model_type, config.hidden_size, config.num_hidden_layers, special, (),
                       config.sliding_window)
  elif registered is not None:
    table = registered.config_class.FIELDS
  else:
    raise ValueError(f"{path / 'config.json'}: unsupported model_type {model_type!r}; supported: "
                     f"{', '.join(family_lib.supported_model_types())}")
  # The context field of each family (its config class's ``FIELDS.max_positions``), read directly:
  # building the config class would import transformers' rotary helpers (and torch), seconds for one
  # number.
  key = table.max_positions
  context = fields.get(key) if isinstance(fields, dict) else None
  if not isinstance(context, int) or context < 1:
    raise ValueError(f"{path / 'config.json'}: no positive integer {key!r} (the model's context)")
  width_key, layers_key = table.hidden_size, table.num_layers
  numbers = {}
  for key in ("vocab_size", width_key, layers_key):
    value = fields.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{path / 'config.json'}: no positive integer {key!r}")
    numbers[key] = value
  special = {f: fields[f] for f in loading.SPECIAL_IDS if fields.get(f) is not None}
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
  return gguf_ckpt.read_config(path)


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


def inspect_draft_spec(spec: str) -> ModelSource | None:
  """Checks a draft spec without loading it: its grammar, the proposers' settings (their types and
  ranges, by constructing them), and the model it names (:func:`inspect_model`). Returns the model's
  source, or None for a proposer alone.

  Raises:
    FileNotFoundError, ValueError: as ``sampling.drafts.parse_draft_spec`` and :func:`inspect_model`,
      the spec named.
  """
  model_spec = parse_draft_spec(spec).model
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
    return tokenizer_cache.load(source.path)
  return transformers.AutoTokenizer.from_pretrained(str(source.path))
