"""What ``generate`` accepts as its draft side, and how it becomes a proposer:
:func:`resolve_draft` (a model, a lookup or a hybrid to a ``Proposer`` and its weights) and
:func:`load_draft_spec` (the scripts' ``--draft`` strings)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from bass_jax import sharding as sharding_lib
from bass_jax.loading import Model, check_same_tokenizer, load_draft
from bass_jax.models import eagle, medusa
from bass_jax.sampling.proposers import (EagleProposer, Hybrid, MedusaProposer, ModelProposer,
                                         NGramProposer, Proposer, Replay, SiblingProposer,
                                         WrapsModel)

_NGRAM_KEYS = ("max_n", "min_n")
_SIBLING_KEYS = ("max_n", "min_n", "pool", "max_matches", "max_siblings", "min_agreement")
_FLOAT_KEYS = ("min_agreement",)


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


def resolve_draft(draft: Any, target: Model, attention_impl: str, *, mesh: Any = None,
                  draft_sharding: str = "replicated") -> tuple[Proposer, Any, list[Model]]:
  """``(proposer, its weights, its models)`` from what :func:`generate` accepts as ``draft``: a draft
  ``Model`` (an independent draft, an EAGLE draft or Medusa heads), a lookup proposer, a ``Hybrid``,
  a ``Replay``, or any other ``Proposer`` (a user's own, docs/extending.md), alone or as ``(proposer,
  params)`` with its weights (a pytree of arrays, traced).

  With a ``mesh``, the proposer of a draft model carries the plan of the rules ``draft_sharding`` names
  (``bass_jax.sharding.RULES``); ``generate`` places the weights by it.

  Raises:
    ValueError: anything else, or a draft model whose tokenizer differs from the target's; sharding
      rules the draft's shapes do not allow (``bass_jax.sharding.plan``); as :func:`_own_proposer`
      for a proposer of the user's.
  """
  def model_proposer(model):
    """An independent draft model's proposer and weights, or an EAGLE draft's with the target's head."""
    if not isinstance(model, Model):
      raise ValueError(f"a draft model must be a bass_jax.Model, got {type(model).__name__}")
    check_same_tokenizer(target, model)
    dtype = jnp.dtype(model.dtype).name
    plan = None if mesh is None else sharding_lib.plan(model.config, mesh, draft_sharding,
                                                        name="the draft")
    if isinstance(model.config, medusa.MedusaConfig):
      medusa.check_pair(model.config, target.config, name=f"the Medusa heads {model.name!r}")
      return MedusaProposer(model.config, dtype, sharding=plan), model.params
    if isinstance(model.config, eagle.EagleConfig):
      eagle.check_pair_configs(model.config, target.config, name=f"the EAGLE draft {model.name!r}")
      config = eagle.resolve_taps(model.config, target.config)
      params = eagle.bind(model.params["draft"], model.params["vocab_ids"], target.config,
                          target.params, config.draft_vocab_size,
                          norm_eps=config.layer.rms_norm_eps)
      return EagleProposer(config, dtype, attention_impl, sharding=plan), params
    return ModelProposer(model.config, dtype, attention_impl, sharding=plan), model.params

  if isinstance(draft, Model):
    proposer, params = model_proposer(draft)
    return proposer, params, [draft]
  if isinstance(draft, (NGramProposer, SiblingProposer)):
    return draft, None, []
  if isinstance(draft, Hybrid):
    if not isinstance(draft.ngram, NGramProposer):
      raise ValueError(f"Hybrid.ngram must be an NGramProposer, got {type(draft.ngram).__name__}")
    if draft.siblings is not None and not isinstance(draft.siblings, SiblingProposer):
      raise ValueError(f"Hybrid.siblings must be None or a SiblingProposer, got "
                       f"{type(draft.siblings).__name__}")
    proposer, params = model_proposer(draft.model)
    return dataclasses.replace(draft, model=proposer), params, [draft.model]
  if isinstance(draft, Replay):
    if mesh is not None:
      raise ValueError("a Replay draft runs on one device (its recording is not sharded); decode "
                       "without a mesh")
    if draft.text is None:
      raise ValueError("Replay.text is None: pass the recording (bass_jax.sampling.proposers."
                       "replay_text of a regular decode)")
    proposer, params = model_proposer(draft.model)
    if isinstance(proposer, MedusaProposer):
      raise ValueError("Replay wraps a draft model or an EAGLE draft; Medusa heads draft trees of "
                       "their own")
    vocab = target.config.vocab_size
    if vocab < 2 or int(np.max(draft.text)) >= vocab:
      raise ValueError(f"Replay.text holds token ids up to {int(np.max(draft.text))}, outside the "
                       f"target's vocabulary of {vocab}; record it with this target")
    # The recording, the rates and the seed are data, not part of the program's key: another
    # recording, rate or seed reuses the compiled decode.
    params = {"model": params, "text": jnp.asarray(draft.text, jnp.int32),
              "acceptance": jnp.asarray(draft.acceptance, jnp.float32),
              "seed": jnp.asarray(draft.seed, jnp.uint32)}
    return dataclasses.replace(draft, model=proposer, text=None), params, [draft.model]
  if isinstance(draft, tuple) and len(draft) == 2 and isinstance(draft[0], Proposer):
    return _own_proposer(*draft, mesh=mesh)
  if isinstance(draft, Proposer):
    return _own_proposer(draft, None, mesh=mesh)
  raise ValueError(
      "draft must be a bass_jax.Model (a draft model), a bass_jax.NGramProposer (model-free prompt "
      "lookup), a bass_jax.SiblingProposer (model-free lookup in the other samples of the prompt), "
      "a bass_jax.Replay(model, text) (a recorded continuation at set acceptance rates), "
      "a bass_jax.Hybrid(model, ngram, siblings), or your own bass_jax.Proposer (with its weights: "
      f"(proposer, params); docs/extending.md); got {type(draft).__name__} (scripts take a spec "
      "string: see bass_jax.load_draft_spec)")


def _own_proposer(proposer: Proposer, params: Any, *, mesh: Any) -> tuple[Proposer, Any, list[Model]]:
  """A user's own proposer (docs/extending.md) and its weights, as :func:`resolve_draft` returns them.

  Raises:
    ValueError: a built-in model proposer without its weights (the ``bass_jax.Model`` is the way to
      pass it), a ``Hybrid`` or ``Replay`` in a pair (they carry their models: pass them alone),
      weights on a mesh without the proposer's ``sharding`` plan.
  """
  if isinstance(proposer, WrapsModel):
    raise ValueError(f"{type(proposer).__name__} carries its draft model: pass it alone, not as "
                     "(proposer, params)")
  if params is None and isinstance(proposer, (ModelProposer, EagleProposer, MedusaProposer)):
    raise ValueError(f"{type(proposer).__name__} drafts with a model's weights: pass the draft "
                     "bass_jax.Model itself (or (proposer, params))")
  if params is not None and mesh is not None and proposer.sharding is None:
    raise ValueError(f"{proposer.name} has weights but no sharding plan (Proposer.sharding) for the "
                     "mesh; give it one (bass_jax.sharding.plan) or decode without a mesh")
  return proposer, params, []


def load_draft_spec(spec: str, target: Model, *, num_layers: int | None = None, dtype: Any = None
                    ) -> Model | NGramProposer | SiblingProposer | Hybrid:
  """The draft side named by a spec string (the scripts' ``--draft``), loading models as needed.

  Specs:
    * ``ngram`` or ``ngram:max_n=4,min_n=2``: model-free prompt lookup (:class:`NGramProposer`);
    * ``siblings`` or ``siblings:max_n=8,min_n=2,pool=8,max_matches=32,max_siblings=15,
      min_agreement=0.1``: model-free
      lookup in the other samples of each row's prompt (:class:`SiblingProposer`);
    * ``hybrid:<model spec>`` or ``hybrid:<model spec>:max_n=4,min_n=2``: n-gram where a row matches,
      the draft model elsewhere (:class:`Hybrid`); ``hybrid+siblings:<model spec>[:...]`` puts sibling
      lookup (at its defaults) before the n-gram lookup;
    * anything else: a draft model spec for ``bass_jax.load_draft`` (an alias, a ``.gguf`` file, a
      checkpoint directory; the target's own name with ``num_layers`` for a placeholder).

  ``num_layers`` and ``dtype`` apply to the draft model, as in ``load_draft``.

  Raises:
    ValueError: a malformed lookup setting or spec (names the key and the accepted form);
      whatever ``load_draft`` raises for the model.
  """
  model_spec, ngram, siblings = parse_draft_spec(spec)
  lookup = None if ngram is None else NGramProposer(**ngram)
  from_siblings = None if siblings is None else SiblingProposer(**siblings)
  if model_spec is None:
    return lookup or from_siblings
  model = load_draft(model_spec, target, num_layers=num_layers, dtype=dtype)
  return model if lookup is None else Hybrid(model, lookup, from_siblings)
