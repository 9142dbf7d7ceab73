"""Prompt lookup decoding as a proposer (Saxena 2023): :class:`NGramProposer`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.sampling.proposers.base import Proposal, Proposer


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

  def __post_init__(self):
    object.__setattr__(self, "max_n", _checks.as_int("NGramProposer.max_n", self.max_n, min_value=1))
    object.__setattr__(self, "min_n", _checks.as_int("NGramProposer.min_n", self.min_n, min_value=1))
    if self.min_n > self.max_n:
      raise ValueError(f"NGramProposer needs min_n <= max_n, got min_n={self.min_n}, "
                       f"max_n={self.max_n}")

  @property
  def name(self) -> str:
    return f"ngram({self.max_n}-{self.min_n})"

  def lookup(self, tokens: jax.Array, seq_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Finds each row's continuation.

    Args:
      tokens: ``i32[B, T]``. seq_len: ``i32[B]``.

    Returns:
      ``(start i32[B], available i32[B])``: the proposal is ``tokens[b, start : start + available]``
      (``available = 0`` where no suffix of length ``min_n … max_n`` occurs earlier).
    """
    batch, width = tokens.shape
    rows = jnp.arange(batch)[:, None]
    starts = jnp.arange(width)[None, :]
    found = jnp.zeros((batch,), bool)
    start = jnp.zeros((batch,), jnp.int32)
    for n in range(self.max_n, self.min_n - 1, -1):
      suffix = tokens[rows, jnp.clip(seq_len[:, None] - n + jnp.arange(n), 0, width - 1)]  # [B, n]
      match = jnp.ones((batch, width), bool)
      for i in range(n):
        shifted = jnp.pad(tokens[:, i:], ((0, 0), (0, i)), constant_values=-1)  # tokens[b, j + i]
        match &= shifted == suffix[:, i:i + 1]
      # An occurrence at j must end before the suffix starts' continuation: j + n < seq_len, j + n is
      # then a known token; j = seq_len - n is the suffix itself and is excluded.
      match &= (starts + n < seq_len[:, None]) & (seq_len[:, None] >= n + 1)
      last = jnp.max(jnp.where(match, starts, -1), axis=1)
      hit = ~found & (last >= 0)
      start = jnp.where(hit, last + n, start)
      found |= hit
    available = jnp.where(found, seq_len - start, 0)
    return start, available

  def can_propose(self, ctx):
    _, available = self.lookup(ctx.tokens, ctx.seq_len)
    return jnp.any(ctx.live & (available > 0))

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    del params, chunk, greedy
    start, available = self.lookup(ctx.tokens, ctx.seq_len)
    rows = jnp.arange(ctx.tokens.shape[0])[:, None]
    pos = jnp.minimum(start[:, None] + jnp.arange(max_len), ctx.tokens.shape[1] - 1)
    num_drafts = jnp.minimum(available, ctx.draft_len).astype(jnp.int32)
    drafts = jnp.where(jnp.arange(max_len) < num_drafts[:, None], ctx.tokens[rows, pos], 0)
    return state, Proposal(drafts=drafts.astype(jnp.int32), num_drafts=num_drafts, log_q=None)
