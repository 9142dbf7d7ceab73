"""Prompt lookup decoding as a proposer (Saxena 2023): :class:`NGramProposer`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.proposers.base import Proposal, Proposer
from bass_jax.sampling.proposers.registry import register_proposer


@register_proposer("ngram", summary="prompt lookup: what followed the row's last n tokens earlier "
                   "in its own text")
@dataclasses.dataclass(frozen=True)
class NGramProposer(Proposer):
  """Prompt lookup decoding: propose what followed the most recent earlier occurrence of the row's last
  n tokens in its own prompt and output, trying ``n = max_n`` down to ``min_n``.

  Deterministic (one-hot ``q``), so rejection sampling stays exact at any temperature. A row whose last
  ``min_n`` tokens occur nowhere earlier proposes nothing (``num_drafts = 0``): inside a verification
  it is a plain decoding step for that row, and when no live row matches the loop runs a plain
  decoding step (one target position per row) instead of a verification. A match proposes at most
  ``l`` tokens and never more than the text holds after it.

  Attributes:
    max_n: the longest suffix tried (>= min_n). min_n: the shortest (>= 1).

  Raises:
    ValueError: from the constructor, unless ``1 <= min_n <= max_n``.
  """

  max_n: int = 4
  min_n: int = 2
  always_proposes = False
  source = "ngram"

  def __post_init__(self):
    object.__setattr__(self, "max_n", _checks.as_int("NGramProposer.max_n", self.max_n, min_value=1))
    object.__setattr__(self, "min_n", _checks.as_int("NGramProposer.min_n", self.min_n, min_value=1))
    if self.min_n > self.max_n:
      raise ValueError(f"NGramProposer needs min_n <= max_n, got min_n={self.min_n}, "
                       f"max_n={self.max_n}")

  @property
  def name(self) -> str:
    return f"ngram({self.max_n}-{self.min_n})"

  @staticmethod
  def _occurrences(tokens: jax.Array, seq_len: jax.Array, n: int) -> jax.Array:
    """``bool[B, T]``: the earlier occurrences ``j`` of each row's last ``n`` tokens whose
    continuation is known (``tokens[b, j : j + n]`` equals the suffix and ``j + n < seq_len``; the
    suffix itself, ``j = seq_len - n``, is excluded)."""
    batch, width = tokens.shape
    rows = jnp.arange(batch)[:, None]
    suffix = tokens[rows, jnp.clip(seq_len[:, None] - n + jnp.arange(n), 0, width - 1)]  # [B, n]
    match = jnp.ones((batch, width), bool)
    for i in range(n):
      shifted = jnp.pad(tokens[:, i:], ((0, 0), (0, i)), constant_values=-1)  # tokens[b, j + i]
      match &= shifted == suffix[:, i:i + 1]
    return match & (jnp.arange(width)[None, :] + n < seq_len[:, None]) & (seq_len[:, None] >= n + 1)

  def _matches(self, tokens: jax.Array, seq_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(match bool[B, T], n i32[B])``: for each row the longest suffix length n in ``min_n … max_n``
    that occurs earlier in the row's text, and every earlier occurrence of it
    (:meth:`_occurrences`); no match, n = 0."""
    batch, width = tokens.shape
    best = jnp.zeros((batch, width), bool)
    best_n = jnp.zeros((batch,), jnp.int32)
    for n in range(self.max_n, self.min_n - 1, -1):
      match = self._occurrences(tokens, seq_len, n)
      hit = (best_n == 0) & jnp.any(match, axis=1)
      best = jnp.where(hit[:, None], match, best)
      best_n = jnp.where(hit, n, best_n)
    return best, best_n

  @staticmethod
  def _latest(match: jax.Array, n: jax.Array, seq_len: jax.Array):
    """``(last, start, available)``, each ``i32[B]``: the most recent occurrence in ``match`` (-1 for
    none), where its continuation starts and how many tokens of it the text holds (0 for none)."""
    last = jnp.max(jnp.where(match, jnp.arange(match.shape[1])[None, :], -1), axis=1)
    start = jnp.where(last >= 0, last + n, 0)
    return last, start, jnp.where(last >= 0, seq_len - start, 0)

  def lookup(self, tokens: jax.Array, seq_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Finds each row's continuation: what followed the most recent occurrence of its longest
    matching suffix.

    Args:
      tokens: ``i32[B, T]``. seq_len: ``i32[B]``.

    Returns:
      ``(start i32[B], available i32[B])``: the proposal is ``tokens[b, start : start + available]``
      (``available = 0`` where no suffix of length ``min_n … max_n`` occurs earlier).
    """
    match, n = self._matches(tokens, seq_len)
    _, start, available = self._latest(match, n, seq_len)
    return start, available

  def can_propose(self, ctx):
    # A longer suffix that occurs earlier contains the min_n suffix occurring earlier too (its last
    # min_n tokens, ending at the same known continuation), so min_n alone decides.
    return jnp.any(ctx.live & jnp.any(self._occurrences(ctx.tokens, ctx.seq_len, self.min_n), axis=1))

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    del params, chunk, greedy
    start, available = self.lookup(ctx.tokens, ctx.seq_len)
    rows = jnp.arange(ctx.tokens.shape[0])[:, None]
    pos = jnp.minimum(start[:, None] + jnp.arange(max_len), ctx.tokens.shape[1] - 1)
    num_drafts = jnp.minimum(available, ctx.draft_len).astype(jnp.int32)
    drafts = jnp.where(jnp.arange(max_len) < num_drafts[:, None], ctx.tokens[rows, pos], 0)
    return state, Proposal(drafts=drafts.astype(jnp.int32), num_drafts=num_drafts, log_q=None)

  def propose_tree(self, params, state, ctx, *, shape):
    """Several matches as several branches: the continuations of the ``shape.top_k`` most recent
    occurrences of the row's longest matching suffix whose first tokens differ (a later occurrence
    with the same first token as a more recent one would repeat its branch), each a chain of at most
    ``shape.depth`` tokens under the root, most recent first, until ``shape.nodes - 1`` drafts are
    placed. One branch is the chain :meth:`propose` drafts; deterministic, so ``q`` stays one-hot.

    Returns:
      ``(state, tree)``: :meth:`Proposer.propose_tree`'s shapes; a row with no match, or not live,
      has ``num_nodes = 1`` (the root alone).
    """
    del params
    tokens, seq_len = ctx.tokens, ctx.seq_len
    batch, width = tokens.shape
    rows = jnp.arange(batch)
    match, n = self._matches(tokens, seq_len)
    match &= ctx.live[:, None]
    after = jnp.clip(jnp.arange(width)[None, :] + n[:, None], 0, width - 1)
    first = jnp.take_along_axis(tokens, after, axis=1)  # each occurrence's first continuation token
    branch_start, branch_len = [], []
    for _ in range(shape.top_k):
      last, start, available = self._latest(match, n, seq_len)
      branch_start.append(start)
      branch_len.append(jnp.minimum(available, shape.depth))
      match &= first != jnp.take_along_axis(first, jnp.maximum(last, 0)[:, None], axis=1)
    branch_start, branch_len = jnp.stack(branch_start, 1), jnp.stack(branch_len, 1)  # [B, k]
    source = branch_start[..., None] + jnp.arange(shape.depth)  # [B, k, depth]
    branches = jnp.take_along_axis(tokens, jnp.clip(source, 0, width - 1).reshape(batch, -1),
                                   axis=1).reshape(source.shape)
    return state, tree_lib.branch_tree(tokens[rows, seq_len - 1], branches, branch_len, shape.nodes)
