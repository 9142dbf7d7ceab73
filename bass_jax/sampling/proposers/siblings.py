"""Drafting from the other samples of the same prompt (batch-shared suffix lookup):
:class:`SiblingProposer`.

Several samples of one prompt (the paper's §4 setting, best-of-N, RL rollouts) share most of their
text, and whichever sample first writes a passage holds the draft its siblings need, at no model cost.
SuffixDecoding (Oliaro et al. 2024; ArcticInference, vLLM's ``suffix`` method) drafts across requests
from a suffix tree of earlier responses, with a draft's length set by how often its continuation
followed the match; here the same lookup runs on device, inside the jitted loop, over the rows of the
batch and the finished samples a continuous batch keeps in its queue.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.proposers.base import Proposal, Proposer, StepContext
from bass_jax.sampling.proposers.registry import register_proposer


@register_proposer("siblings", summary="lookup in the other samples of the row's prompt "
                   "(SuffixDecoding's idea)")
@dataclasses.dataclass(frozen=True)
class SiblingProposer(Proposer):
  """Propose, for each row, the continuation its siblings agree on after the row's last tokens.

  A row's *siblings* are the rows that serve the same prompt (``StepContext.group``: rows of identical
  prompts share a group; a static batch of B samples of one prompt is one group; distinct prompts are
  groups of one and never propose; a row that finished keeps its text in a static batch) among the
  next ``max_siblings`` rows of the batch, cyclically (every row of a batch of up to
  ``max_siblings + 1``; beyond that, rows whose samples sit next to each other, as
  ``batches.make_batches`` places them), and, in continuous batching, the ``pool`` most recently
  admitted finished samples of that prompt (``StepContext.finished``: the queue's outputs, each with
  the last ``max_n`` tokens of its prompt, so that a row that just started matches too). Per step
  and row:

  1. **Match.** Every position of a sibling's text where the row's suffix ends is an occurrence; its
     length is how many of the row's last tokens (up to ``max_n``) it matches. The occurrences of the
     longest suffix (at least ``min_n``) are kept, at most ``max_matches`` of them, ranked by source
     (the pool's most recently admitted sample first, then the batch's nearest row) and within a text
     by position (the latest first), each with the continuation its sibling wrote after it.
  2. **Vote** (SuffixDecoding's frequency-based confidence). At each depth the draft takes the token
     most of the still-agreeing occurrences continue with; the confidence, the product over depths of
     the share that agreed, must stay at least ``min_agreement``, and the occurrences that disagreed
     drop out. So a passage every sibling wrote the same way is proposed far, one they wrote in
     different ways stops where they part.
  3. In a tree step, the ``top_k`` most voted first tokens start ``top_k`` branches, each followed as
     in 2 (:meth:`propose_tree`).

  Deterministic (one-hot ``q``), so rejection sampling stays exact at any temperature. All on device
  with static shapes: per row ``max_siblings x T`` row positions and ``pool x (max_n + N)`` finished
  positions are matched (``max_n`` comparisons each, over gathered copies of those texts), and the
  vote is over ``max_matches`` occurrences. :meth:`can_propose` runs the lookup to depth 1, and the
  loop's conditions call it once per kind of step per pass.

  Greedy rows with identical prompts decode identical text: in a static batch in lockstep (nothing
  to draft), in a continuous batch a later sample drafts the whole text from a finished one, which is
  correct and fast but measures nothing about samples that differ.

  Attributes:
    max_n: the longest suffix matched (>= min_n). min_n: the shortest (>= 1).
    min_agreement: the least confidence a draft may have, in (0, 1] (SuffixDecoding's minimum token
      probability; its default 0.1).
    max_matches: occurrences voted on per row (>= 1).
    max_siblings: rows looked up per row (>= 1): the next ones in the batch, cyclically, of which
      those that serve the same prompt are siblings (at the default 15, every row of a batch of up to
      16).
    pool: finished samples per row looked up in continuous batching (>= 0).

  Raises:
    ValueError: from the constructor, for a setting out of range (named).
  """

  max_n: int = 8
  min_n: int = 2
  min_agreement: float = 0.1
  max_matches: int = 32
  max_siblings: int = 15
  pool: int = 8
  always_proposes = False
  source = "siblings"

  def __post_init__(self):
    for field in ("max_n", "min_n", "max_matches", "max_siblings"):
      object.__setattr__(self, field, _checks.as_int(f"SiblingProposer.{field}", getattr(self, field),
                                                     min_value=1))
    object.__setattr__(self, "pool", _checks.as_int("SiblingProposer.pool", self.pool, min_value=0))
    agreement = _checks.as_float("SiblingProposer.min_agreement", self.min_agreement, min_value=0.0,
                                 min_exclusive=True)
    if agreement > 1.0:
      raise ValueError(f"SiblingProposer.min_agreement must be in (0, 1], got {agreement}")
    object.__setattr__(self, "min_agreement", agreement)
    if self.min_n > self.max_n:
      raise ValueError(f"SiblingProposer needs min_n <= max_n, got min_n={self.min_n}, "
                       f"max_n={self.max_n}")

  @property
  def name(self) -> str:
    return f"siblings({self.max_n}-{self.min_n})"

  def _occurrences(self, ctx: StepContext, depth: int):
    """Each row's kept occurrences: ``(run i32[B, R], tokens i32[B, R, D], known bool[B, R, D])``,
    R = ``max_matches``, D = ``depth``: the suffix length each matches (0: no occurrence), and the
    ``D`` tokens its sibling wrote after it (``known`` where the sibling's text holds them). Only
    occurrences of each row's longest matching suffix have ``run > 0``."""
    tokens, seq_len = ctx.tokens, ctx.seq_len
    batch, width = tokens.shape
    rows = jnp.arange(batch)
    group = rows if ctx.group is None else ctx.group
    ahead = jnp.arange(self.max_n)
    # The row's last max_n tokens, newest first; -1 (never a token) beyond its text.
    back = seq_len[:, None] - 1 - ahead
    suffix = jnp.where(back >= 0, tokens[rows[:, None], jnp.maximum(back, 0)], -1)  # [B, n]

    def runs(texts):
      """``i32[B, S, W]``: the suffix length each position of ``texts: i32[B or 1, S, W]`` ends."""
      pos = jnp.arange(texts.shape[-1])[:, None] - ahead  # [W, n]: position j - i
      shifted = jnp.where(pos >= 0, texts[..., jnp.maximum(pos, 0)], -2)  # [., S, W, n]
      same = shifted == suffix[:, None, None, :]
      return jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=-1), axis=-1)

    # Sources: those of the next max_siblings rows of the batch (cyclically) that serve the row's
    # prompt, then its pool. Each is ([B, S_i, W_i] runs, [B or 1, S_i] rank, gather); higher ranks
    # vote first.
    count = min(self.max_siblings, batch - 1)
    sib = (rows[:, None] + 1 + jnp.arange(count)) % batch  # [B, S]
    sibling = group[sib] == group[:, None]
    run = runs(tokens[sib])  # [B, S, T]
    run = jnp.where(sibling[..., None] & (jnp.arange(width) + 1 < seq_len[sib][..., None]), run, 0)

    def continuation(index):  # i32[B, R] flat row candidates -> tokens and knownness [B, R, D]
      c, j = jnp.take_along_axis(sib, index // width, axis=1), index % width
      at = j[..., None] + 1 + jnp.arange(depth)
      return (tokens[c[..., None], jnp.minimum(at, width - 1)], at < seq_len[c][..., None])

    sources = [(run, count - jnp.arange(count)[None, :], continuation)]  # the nearest row first
    finished = ctx.finished
    if finished is not None and self.pool > 0:
      size = finished.tokens.shape[0]
      k = min(self.pool, size)
      mine = (finished.lengths[None, :] > 0) & (finished.group[None, :] == group[:, None])  # [B, Q]
      # The most recently admitted finished samples (the queue is in admission order).
      recency, picked = jax.lax.top_k(jnp.where(mine, jnp.arange(size)[None, :], -1), k)
      # Each as the last max_n tokens of its prompt (-2 where the prompt is shorter) and its output,
      # so that a row's suffix that spans the end of its prompt matches too.
      tail = finished.prompt_len[:, None] - self.max_n + ahead  # [Q, n]
      tail = jnp.where(tail >= 0, jnp.take_along_axis(finished.prompts, jnp.maximum(tail, 0), axis=1),
                       -2)
      texts = jnp.concatenate([tail, finished.tokens], axis=1)[picked]  # [B, k, n + N]
      pool_len = jnp.where(recency >= 0, self.max_n + finished.lengths[picked], 0)
      out = texts.shape[2]
      pool_run = runs(texts)
      pool_run = jnp.where(jnp.arange(out) + 1 < pool_len[..., None], pool_run, 0)

      def from_pool(index):
        e, j = index // out, index % out
        at = j[..., None] + 1 + jnp.arange(depth)
        text = texts[rows[:, None], e]  # [B, R, n + N]
        return (jnp.take_along_axis(text, jnp.minimum(at, out - 1), axis=-1),
                at < jnp.take_along_axis(pool_len, e, axis=1)[..., None])

      sources.append((pool_run, count + k - jnp.arange(k)[None, :], from_pool))  # most recent first

    # Rank every occurrence: by its source's rank, then by position (the latest first).
    span = max(r.shape[2] for r, _, _ in sources) + 1
    run = jnp.concatenate([r.reshape(batch, -1) for r, _, _ in sources], axis=1)  # [B, M]
    key = jnp.concatenate([jnp.broadcast_to(rank[..., None] * span + jnp.arange(r.shape[2]),
                                            r.shape).reshape(batch, -1)
                           for r, rank, _ in sources], axis=1)
    if run.shape[1] == 0:  # a lone row without a pool: one empty candidate
      run, key = jnp.zeros((batch, 1), jnp.int32), jnp.zeros((batch, 1), jnp.int32)
    run = jnp.where(ctx.live[:, None] & (run >= self.min_n), run, 0)
    longest = jnp.max(run, axis=1, keepdims=True)
    # Keep the longest suffix's occurrences, the highest ranked first.
    score = jnp.where((run > 0) & (run == longest), key, -1)
    score, picked = jax.lax.top_k(score, min(self.max_matches, run.shape[1]))
    kept = score >= 0
    cont = jnp.zeros(picked.shape + (depth,), jnp.int32)
    known = jnp.zeros(picked.shape + (depth,), bool)
    start = 0
    for source_run, _, gather in sources:
      size = source_run.shape[1] * source_run.shape[2]
      inside = (picked >= start) & (picked < start + size)
      t, k_ = gather(jnp.clip(picked - start, 0, max(size - 1, 0)))
      cont = jnp.where(inside[..., None], t, cont)
      known = jnp.where(inside[..., None], k_, known)
      start += size
    return jnp.where(kept, jnp.take_along_axis(run, picked, axis=1), 0), cont, known & kept[..., None]

  def _follow(self, cont, known, alive, confidence):
    """The continuation the occurrences ``alive: bool[B, R]`` agree on: at each depth the most
    common token (of ``cont: i32[B, R, D]``, among those ``known``), while the confidence (starting
    at ``confidence: f32[B]``, times the share that agreed at each depth) stays at least
    ``min_agreement``. Returns ``(tokens i32[B, D], length i32[B])``."""
    drafts, taking, length = [], jnp.ones(alive.shape[:1], bool), jnp.zeros(alive.shape[:1], jnp.int32)
    for d in range(cont.shape[2]):
      tok, voting = cont[..., d], alive & known[..., d]
      best, votes, total = _vote(tok, voting)
      confidence = confidence * votes / jnp.maximum(total, 1)
      taking &= (votes > 0) & (confidence >= self.min_agreement)
      length += taking
      drafts.append(best)
      alive = voting & (tok == best[:, None])
    return jnp.stack(drafts, axis=1), length

  def can_propose(self, ctx):
    run, cont, known = self._occurrences(ctx, 1)
    _, length = self._follow(cont, known, run > 0, jnp.ones(run.shape[:1], jnp.float32))
    return jnp.any(length > 0)

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    del params, chunk, greedy
    run, cont, known = self._occurrences(ctx, max_len)
    drafts, length = self._follow(cont, known, run > 0, jnp.ones(run.shape[:1], jnp.float32))
    num_drafts = jnp.minimum(length, ctx.draft_len).astype(jnp.int32)
    drafts = jnp.where(jnp.arange(max_len) < num_drafts[:, None], drafts, 0)
    return state, Proposal(drafts=drafts.astype(jnp.int32), num_drafts=num_drafts, log_q=None)

  def propose_tree(self, params, state, ctx, *, shape):
    """The ``shape.top_k`` most voted first tokens as branches, each followed as far as its own
    occurrences agree (at most ``shape.depth`` tokens; its confidence starts at its first token's
    share), most voted first, until ``shape.nodes - 1`` drafts are placed
    (``tree.branch_tree``). Deterministic, so ``q`` stays one-hot.

    Returns:
      ``(state, tree)``: :meth:`Proposer.propose_tree`'s shapes; a row with no occurrence has
      ``num_nodes = 1``.
    """
    del params
    run, cont, known = self._occurrences(ctx, shape.depth)
    alive = (run > 0) & known[..., 0]
    first = cont[..., 0]
    total = jnp.sum(alive, axis=1)
    branches, lengths, left = [], [], alive
    for _ in range(shape.top_k):
      best, votes, _ = _vote(first, left)
      mine = left & (first == best[:, None])
      # The branch's confidence starts at its first token's share of all occurrences.
      tokens, length = self._follow(cont, known, mine, votes / jnp.maximum(total, 1))
      branches.append(tokens)
      lengths.append(jnp.where(votes > 0, length, 0))
      left = left & ~mine
    root = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    return state, tree_lib.branch_tree(root, jnp.stack(branches, 1), jnp.stack(lengths, 1),
                                       shape.nodes)


def _vote(tokens: jax.Array, voting: jax.Array):
  """The most common of ``tokens: i32[B, R]`` among ``voting: bool[B, R]`` (ties: the token of the
  first occurrence in rank order), its count and the number voting: ``(i32[B], i32[B], i32[B])``."""
  agree = (tokens[:, :, None] == tokens[:, None, :]) & voting[:, None, :]
  counts = jnp.where(voting, jnp.sum(agree, axis=2), 0)
  best = jnp.argmax(counts, axis=1)
  rows = jnp.arange(tokens.shape[0])
  return tokens[rows, best], counts[rows, best], jnp.sum(voting, axis=1)
