"""Model-free lookups where a row matches, a draft model elsewhere: :class:`Hybrid`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from bass_jax.sampling.proposers.base import Proposal, Proposer, WrapsModel, not_model_free
from bass_jax.sampling.proposers.draft_model import ModelProposer
from bass_jax.sampling.proposers.eagle_draft import EagleProposer
from bass_jax.sampling.proposers.ngram import NGramProposer


@dataclasses.dataclass(frozen=True)
class Hybrid(WrapsModel):
  """Per row, every step: the first of ``lookups`` that proposes anything for the row, else the draft
  model.

  The lookups are model-free proposers (no weights, no state): the built-in n-gram lookup
  (``NGramProposer``), sibling lookup (``SiblingProposer``), or a user's own (docs/extending.md).
  What a user passes to ``generate`` holds the draft *model* (a ``bass_jax.Model``);
  ``drafts.resolve_draft`` replaces it with the model's proposer (``ModelProposer`` or
  ``EagleProposer``), which is what the decode runs.

  The draft model runs every step (its cost is paid whatever matches), so the hybrid gains over the
  model alone where lookup continuations are accepted longer, e.g. in code that repeats its own
  identifiers, or text a sibling sample already wrote. Rows that took lookup drafts keep only the
  draft-model K/V the text confirms. A row's drafts keep the ``q`` they were drawn from: the
  lookup's ``log_q`` (one-hot for a deterministic lookup), else the model's, so acceptance stays
  exact whatever the mix, as long as whether a lookup proposes for a row (``num_drafts > 0``) is a
  function of the context, not of the lookup's own random draws (the same rule as for any proposer:
  docs/extending.md).

  Attributes:
    model: the draft model (a ``Model``, or once resolved its ``ModelProposer`` or
      ``EagleProposer``).
    lookups: the model-free proposers, first choice first (default: n-gram lookup at its defaults);
      a single proposer is taken as a tuple of one.

  Raises:
    ValueError: from the constructor, for a lookup that is not a model-free ``Proposer``
      (``base.not_model_free``: it keeps a state, reads the target's features or drafts with a model)
      or whose ``source`` is unknown, or for no lookup at all.
  """

  model: "Any | ModelProposer | EagleProposer"
  lookups: tuple[Proposer, ...] = (NGramProposer(),)

  def __post_init__(self):
    lookups = (self.lookups,) if isinstance(self.lookups, Proposer) else tuple(self.lookups)
    for lookup in lookups:
      if not isinstance(lookup, Proposer):
        raise ValueError(f"Hybrid.lookups holds proposers, got {type(lookup).__name__}")
      name = type(lookup).__name__
      problem = not_model_free(lookup)
      if problem is not None:
        raise ValueError(f"a Hybrid's lookups keep no state and read no features; {name} "
                         f"{problem}: decode with it alone")
      lookup.source_index  # pylint: disable=pointless-statement  # raises for an unknown source
    if not lookups:
      raise ValueError("Hybrid.lookups is empty: give at least one lookup (e.g. NGramProposer()), "
                       "or pass the draft model alone")
    object.__setattr__(self, "lookups", lookups)

  @property
  def name(self) -> str:
    """``hybrid(<lookup names>, <model name>)``, e.g. ``hybrid(siblings(8-2), ngram(4-2), m)``."""
    return f"hybrid({', '.join(p.name for p in self.lookups + (self.model,))})"

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    state, by_model = self.model.propose(params, state, ctx, max_len=max_len, chunk=chunk,
                                         greedy=greedy)
    drafts, num_drafts, log_q = by_model.drafts, by_model.num_drafts, by_model.log_q
    source = jnp.full(num_drafts.shape, self.model.source_index, jnp.int32)
    one_hot = jnp.zeros(num_drafts.shape, bool)  # rows drafted by a lookup without a q of its own
    for lookup in reversed(self.lookups):  # the first choice applied last
      _, found = lookup.propose(None, None, ctx, max_len=max_len, chunk=chunk, greedy=greedy)
      hit = found.num_drafts > 0
      drafts = jnp.where(hit[:, None], found.drafts, drafts)
      num_drafts = jnp.where(hit, found.num_drafts, num_drafts)
      source = jnp.where(hit, lookup.source_index, source)
      if log_q is not None and found.log_q is not None:  # a sampling lookup: its own q
        if found.log_q.shape != log_q.shape:
          raise ValueError(f"{lookup.name}'s log_q has shape {found.log_q.shape}; a lookup in a "
                           f"Hybrid returns the model's {log_q.shape} ([B, max_len + chunk, V]) "
                           "or None")
        log_q = jnp.where(hit[:, None, None], found.log_q, log_q)
      one_hot = jnp.where(hit, found.log_q is None, one_hot)
    if log_q is not None:  # one one-hot q, at the merged drafts, for the deterministic lookups' rows
      padded = jnp.pad(drafts, ((0, 0), (0, log_q.shape[1] - max_len)))
      at_draft = jnp.where(jnp.arange(log_q.shape[2]) == padded[..., None], 0.0, -jnp.inf)
      log_q = jnp.where(one_hot[:, None, None], at_draft, log_q)
    return state, Proposal(drafts=drafts, num_drafts=num_drafts, log_q=log_q, source=source)

  def propose_tree(self, params, state, ctx, *, shape):
    """One tree per row (:meth:`Proposer.propose_tree`'s shapes): the branches of the row's first
    lookup that found any (:meth:`SiblingProposer.propose_tree`, :meth:`NGramProposer.propose_tree`:
    up to ``shape.top_k`` continuations, each at most ``shape.depth`` tokens), kept whole, and the
    model's best EAGLE-2 nodes in the rest (``tree.grow_tree``'s ``prior``). A row that no lookup
    matches is the model's tree alone. The tree's ``source`` is the lookup's where one matched."""
    prior = None
    source = jnp.full(ctx.seq_len.shape, self.model.source_index, jnp.int32)
    for lookup in reversed(self.lookups):  # the first choice applied last
      _, found = lookup.propose_tree(None, None, ctx, shape=shape)
      hit = found.num_nodes > 1
      prior = found if prior is None else found.where(hit, prior)
      source = jnp.where(hit, lookup.source_index, source)
    state, tree = self.model.propose_tree(params, state, ctx, shape=shape, prior=prior)
    return state, tree.replace(source=source)
