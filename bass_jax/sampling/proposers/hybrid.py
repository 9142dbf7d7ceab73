"""N-gram lookup where a row matches, a draft model elsewhere: :class:`HybridProposer`."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from bass_jax.sampling.proposers.base import Proposal, Proposer
from bass_jax.sampling.proposers.draft_model import ModelProposer
from bass_jax.sampling.proposers.eagle_draft import EagleProposer
from bass_jax.sampling.proposers.ngram import NGramProposer


@dataclasses.dataclass(frozen=True)
class HybridProposer(Proposer):
  """N-gram lookup where a row matches, the draft model elsewhere (per row, every step).

  The draft model runs every step (its cost is paid whatever matches), so the hybrid gains over the
  model alone where n-gram continuations are accepted longer, e.g. in code that repeats its own
  identifiers. Rows that took n-gram drafts keep only the draft-model K/V the text confirms.

  Attributes:
    ngram: the lookup. model: the draft model (independent or EAGLE).
  """

  ngram: NGramProposer
  model: "ModelProposer | EagleProposer"

  @property
  def name(self) -> str:
    return f"hybrid({self.ngram.name}, {self.model.name})"

  @property
  def needs_features(self) -> bool:
    return self.model.needs_features

  @property
  def sharding(self):
    return self.model.sharding

  def forward_costs(self, params, batch, cache_len, max_len):
    return self.model.forward_costs(params, batch, cache_len, max_len)

  def tree_level_cost(self, params, batch, cache_len, shape):
    return self.model.tree_level_cost(params, batch, cache_len, shape)

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    return self.model.init_state(params, prompts, prompt_len, cache_len=cache_len, max_len=max_len,
                                 features=features, prefill_chunk=prefill_chunk)

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    state, by_model = self.model.propose(params, state, ctx, max_len=max_len, chunk=chunk,
                                         greedy=greedy)
    _, by_ngram = self.ngram.propose(None, None, ctx, max_len=max_len, chunk=chunk, greedy=greedy)
    use_ngram = by_ngram.num_drafts > 0
    drafts = jnp.where(use_ngram[:, None], by_ngram.drafts, by_model.drafts)
    num_drafts = jnp.where(use_ngram, by_ngram.num_drafts, by_model.num_drafts)
    log_q = by_model.log_q
    if log_q is not None:  # one-hot q for the n-gram rows
      padded = jnp.pad(drafts, ((0, 0), (0, log_q.shape[1] - max_len)))
      one_hot = jnp.where(jnp.arange(log_q.shape[2]) == padded[..., None], 0.0, -jnp.inf)
      log_q = jnp.where(use_ngram[:, None, None], one_hot, log_q)
    return state, Proposal(drafts=drafts, num_drafts=num_drafts, log_q=log_q)

  def propose_tree(self, params, state, ctx, *, shape):
    """One tree per row (:meth:`Proposer.propose_tree`'s shapes): the row's n-gram branches
    (:meth:`NGramProposer.propose_tree`: the continuations of up to ``shape.top_k`` earlier matches,
    each at most ``shape.depth`` tokens), kept whole, and the model's best EAGLE-2 nodes in the rest
    (``tree.grow_tree``'s ``prior``). A row with no match is the model's tree alone."""
    _, branches = self.ngram.propose_tree(None, None, ctx, shape=shape)
    return self.model.propose_tree(params, state, ctx, shape=shape, prior=branches)

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    return self.model.rollback(state, tokens, old_seq_len, new_seq_len)
