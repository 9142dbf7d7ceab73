"""What ``generate`` accepts as its draft side, and how it becomes a proposer:
:func:`resolve_draft` (a model, a lookup or a hybrid to a ``Proposer`` and its weights),
:func:`parse_draft_spec` and :func:`load_draft_spec` (the scripts' ``--draft`` strings, whose grammar
the proposer registry generates: ``proposers.registry``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from bass_jax import sharding as sharding_lib
from bass_jax.loading import Model, check_same_tokenizer, load_draft
from bass_jax.models import eagle, medusa
from bass_jax.sampling.proposers import (EagleProposer, Hybrid, MedusaProposer, ModelProposer,
                                         Proposer, Replay, WrapsModel)
from bass_jax.sampling.proposers.registry import ProposerKind, proposer_kind, proposer_kinds

@dataclasses.dataclass(frozen=True)
class DraftSpec:
  """A parsed draft spec (:func:`parse_draft_spec`).

  Attributes:
    model: the draft model's spec (``bass_jax.load_draft``), or None for a proposer alone.
    proposers: ``(kind, settings)`` pairs (``proposers.registry.ProposerKind`` and a settings
      instance): the proposer alone (one pair, no model), or a hybrid's lookups, first choice first.
  """

  model: str | None
  proposers: tuple[tuple[ProposerKind, Any], ...] = ()


def _kinds_text() -> str:
  return ", ".join(kind.name for kind in proposer_kinds())


def draft_spec_help() -> str:
  """The draft spec grammar, one form per line with every registered proposer's settings: what the
  scripts print for ``--draft=help`` (generated from ``proposers.registry``)."""
  lookups = "|".join(kind.name for kind in proposer_kinds() if kind.model_free)
  forms = [("<model spec>", "a draft model: an alias, a .gguf file, a checkpoint directory, a "
            "published EAGLE or Medusa directory")]
  forms += [(kind.grammar(), kind.summary) for kind in proposer_kinds()]
  forms += [("py:<module>.<Class>[:key=value,...]", "a Proposer dataclass of yours, imported "
             "(registered or not)"),
            (f"hybrid[+{lookups}|<module>.<Class>...]:<model spec>[:key=value,...]",
             "the model with lookups in front of it: those named, in order, then n-gram lookup "
             "unless named; key=value sets n-gram lookup, <lookup>.key=value another")]
  return "Draft specs (bass_jax.load_draft_spec):\n" + "\n".join(
      f"  {form}\n      {summary}" for form, summary in forms)


def parse_draft_spec(spec: str) -> DraftSpec:
  """The parts of a draft spec (the scripts' ``--draft``; ``bass_jax.load_draft_spec``).

  Grammar (:func:`draft_spec_help` writes it with every registered kind's settings):

  * ``<kind>[:key=value,...]``: a registered proposer alone (``proposers.registry``: ``ngram``,
    ``siblings``, and the user's own), e.g. ``ngram:max_n=4,min_n=2``;
  * ``py:<module>.<Class>[:key=value,...]``: an unregistered ``Proposer`` dataclass, imported;
  * ``hybrid[+<kind>...]:<model spec>[:key=value,...]``: the draft model with model-free lookups in
    front of it: the kinds named (registered names, or import paths ``<module>.<Class>``), in order,
    then n-gram lookup unless named (``hybrid:<model>`` is n-gram lookup and the model;
    ``hybrid+siblings:<model>`` sibling lookup, n-gram lookup, the model). ``key=value`` sets the
    n-gram lookup, ``<kind>.key=value`` another lookup;
  * anything else: a draft model spec.

  No commas outside settings: scripts take lists of specs.

  Raises:
    ValueError: an unknown setting or a value of the wrong type (the accepted form named), settings
      the proposer refuses, a ``py:`` path that does not import or names no ``Proposer`` dataclass, a
      hybrid without a model, with a lookup that is not model-free, named twice or empty, or with a
      setting aimed at a lookup it lacks; an empty spec.
  """
  spec = str(spec)
  if not spec:
    raise ValueError(f"draft spec is empty: give a model, a proposer ({_kinds_text()}) or "
                     "'hybrid:<model>'")
  head, _, rest = spec.partition(":")
  if head == "py":
    path, _, rest = rest.partition(":")
    head = f"py:{path}"
  kind = proposer_kind(head, spec)
  if kind is not None:
    return DraftSpec(model=None, proposers=((kind, kind.parse(rest, spec)),))
  if head != "hybrid" and not head.startswith("hybrid+"):
    return DraftSpec(model=spec)
  names = head.split("+")[1:]
  if any(not n for n in names):
    raise ValueError(f"draft spec {spec!r}: lookups are hybrid+<kind>+<kind>:<model spec>, kinds "
                     f"from {_kinds_text()}")
  if "py" in names:
    raise ValueError(f"draft spec {spec!r}: in a hybrid, name a lookup by its import path without "
                     "'py:' (hybrid+my_module.MyLookup:<model spec>)")
  if len(set(names)) != len(names):
    raise ValueError(f"draft spec {spec!r}: a lookup is named twice; name each once")
  if "ngram" not in names:
    names.append("ngram")
  model_spec, _, text = rest.rpartition(":") if "=" in rest else (rest, "", "")
  if not model_spec:
    raise ValueError(f"draft spec {spec!r}: write {head}:<model spec>[:max_n=4,min_n=2]")
  first = model_spec.split(",")[0].split(":")[0]
  if first in names or proposer_kind(first, spec) is not None:
    raise ValueError(f"draft spec {spec!r}: a hybrid's lookups are written before its model, "
                     f"hybrid+{first}:<model spec>")
  settings: dict[str, list[str]] = {name: [] for name in names}
  for item in filter(None, text.split(",")):
    key, equals, value = item.partition("=")
    lookup, dot, setting = key.rpartition(".")
    lookup, setting = (lookup, setting + equals + value) if dot else ("ngram", item)
    if lookup not in settings:
      raise ValueError(f"draft spec {spec!r}: {item!r} sets {lookup!r}, which is not among the "
                       f"hybrid's lookups ({', '.join(names)})")
    settings[lookup].append(setting)
  kinds = {}
  for name in names:
    kind = proposer_kind(f"py:{name}" if "." in name else name, spec)
    if kind is None or not kind.model_free:
      raise ValueError(f"draft spec {spec!r}: {name!r} is not a model-free proposer; a hybrid's "
                       f"lookups are among {', '.join(k.name for k in proposer_kinds() if k.model_free)}")
    kinds[name] = kind
  for setting in settings["ngram"]:  # a bare key=value meant for another lookup: say how to aim it
    key = setting.partition("=")[0]
    owner = next((n for n in names if n != "ngram" and key in kinds[n].settable
                  and key not in kinds["ngram"].settable), None)
    if owner is not None:
      raise ValueError(f"draft spec {spec!r}: a bare {key}=... sets n-gram lookup; write "
                       f"{owner}.{setting} for {owner}")
  proposers = [(kinds[name], kinds[name].parse(",".join(settings[name]), spec)) for name in names]
  return DraftSpec(model=model_spec, proposers=tuple(proposers))


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
  if isinstance(draft, Hybrid):  # its lookups were checked when it was built
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
      "a bass_jax.Hybrid(model, lookups), or your own bass_jax.Proposer (with its weights: "
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
                    ) -> Any:
  """The draft side named by a spec string (the scripts' ``--draft``, :func:`parse_draft_spec`),
  loading models as needed: a draft ``Model``, a registered proposer built by its kind's builder (a
  ``Proposer``, or ``(proposer, params)``), or a ``Hybrid`` of a draft model and lookups.

  Specs, e.g.: ``ngram`` or ``ngram:max_n=4,min_n=2`` (prompt lookup, :class:`NGramProposer`);
  ``siblings[:pool=8,...]`` (lookup in the other samples of each row's prompt,
  :class:`SiblingProposer`); ``hybrid:<model spec>[:max_n=4,min_n=2]`` (n-gram lookup where a row
  matches, the draft model elsewhere: :class:`Hybrid`); ``hybrid+siblings:<model spec>`` (sibling
  lookup, then n-gram lookup, then the model); a user's registered proposer by its name
  (docs/extending.md); anything else a draft model spec for ``bass_jax.load_draft`` (an alias, a
  ``.gguf`` file, a checkpoint directory; the target's own name with ``num_layers`` for a
  placeholder).

  ``num_layers`` and ``dtype`` apply to the draft model, as in ``load_draft``.

  Raises:
    ValueError: as :func:`parse_draft_spec` (names the key and the accepted form); whatever
      ``load_draft`` or a kind's builder raises.
  """
  parsed = parse_draft_spec(spec)
  built = tuple(kind.build(settings, target) for kind, settings in parsed.proposers)
  if parsed.model is None:
    return built[0]
  model = load_draft(parsed.model, target, num_layers=num_layers, dtype=dtype)
  return Hybrid(model, built) if built else model
