"""What can be checked about a model or a draft spec before any weights load: that it exists, its
architecture's context, whether it carries a tokenizer, and a draft spec's grammar.

The experiment scripts call these before loading anything, so that a typo in ``--draft`` or a prompt
too long for the target's context is a one-line error in seconds rather than a traceback after the
weights are read. Only metadata is read: a GGUF file's header, a checkpoint's ``config.json``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from bass_jax.checkpoints import hf as hf_ckpt

_NGRAM_KEYS = ("max_n", "min_n")
_SIBLING_KEYS = ("max_n", "min_n", "pool", "max_matches", "max_siblings", "min_agreement")
_FLOAT_KEYS = ("min_agreement",)
_N_POSITIONS_FAMILIES = ("gpt2", "codegen")  # whose context field is ``n_positions``


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """A model spec resolved without loading weights.

  Attributes:
    spec: as given. path: the file or directory behind it.
    kind: ``"gguf"``, ``"hf"`` (a Hugging Face directory; orbax saves too) or ``"eagle"``.
    context: positions the architecture supports (``max_positions`` of its config).
    vocab_size: rows of its embedding (for an EAGLE draft: its target's, unknown here, so 0).
    has_tokenizer: it ships a tokenizer (a GGUF file always does).
  """

  spec: str
  path: pathlib.Path
  kind: str
  context: int
  vocab_size: int
  has_tokenizer: bool


def inspect_model(spec: str | os.PathLike) -> ModelSource:
  """Resolves ``spec`` as ``bass_jax.load_model`` would and reads its config, not its weights.

  Raises:
    FileNotFoundError: no alias, file or directory by that name (the fix named). ValueError: not a
      model: a file that is not ``.gguf``, a directory without ``config.json``, a config that is not a
      JSON object or names an unsupported architecture (each naming the file).
  """
  from bass_jax import loading  # pylint: disable=g-import-not-at-top
  from bass_jax.checkpoints import gguf as gguf_ckpt  # pylint: disable=g-import-not-at-top
  from bass_jax.models import eagle  # pylint: disable=g-import-not-at-top

  name = str(spec)
  if name in loading.ALIASES:
    path = loading.resolve_alias(name)
  else:
    path = pathlib.Path(spec)
    if not path.exists():
      raise FileNotFoundError(f"no model at {name!r}: not an alias ({', '.join(sorted(loading.ALIASES))}),"
                              " nor an existing .gguf file or checkpoint directory")
  if path.is_file():
    if path.suffix != ".gguf":
      raise ValueError(f"{path}: a model file must be .gguf; for a checkpoint pass its directory")
    config = gguf_ckpt.read_config(gguf_ckpt._open(path), path)  # pylint: disable=protected-access
    return ModelSource(name, path, "gguf", config.max_positions, config.vocab_size, True)
  fields = hf_ckpt.read_config_fields(path)
  has_tokenizer = loading.has_tokenizer(path)
  model_type = fields.get("model_type")
  if model_type == eagle.MODEL_TYPE:
    kind, fields = "eagle", fields.get("layer")
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
  vocab = fields.get("vocab_size", 0) if kind == "hf" else 0
  return ModelSource(name, path, kind, context, int(vocab or 0), has_tokenizer)


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
