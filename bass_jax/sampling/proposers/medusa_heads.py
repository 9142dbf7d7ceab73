"""Medusa heads as a proposer (Cai et al. 2024; ``bass_jax.models.medusa``): :class:`MedusaProposer`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.models import medusa
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.proposers.base import Proposal, Proposer
from bass_jax.sampling.warp import first_argmax


@dataclasses.dataclass(frozen=True)
class MedusaProposer(Proposer):
  """K Medusa heads on the target's newest feature.

  Each step, for every row with text ``x_0 … x_{n-1}``: the target's feature at position ``n - 2``
  (the one that predicted ``x_{n-1}``; the decode keeps it, ``needs_features``) goes through every
  head once; head k's distribution is draft k + 1's (``x_{n+k}``): its argmax when greedy, a draw from
  it, warped, when sampling, with that distribution as the draft's ``q``. A chain has at most K drafts
  (``num_drafts = min(l, K)``). A tree (``propose_tree``) takes, level by level, the top children of
  head ``depth - 1`` under every expanded node (Medusa's tree of top-k candidates per head, grown
  by ``tree.grow_tree``'s path scores); levels past K reuse the last head. A one-token prompt has no
  scored feature yet: its first proposal reads a stale one, verified like any other.

  Attributes:
    config: the heads (:class:`medusa.MedusaConfig`). dtype: their compute dtype name.
    sharding: their placement on a mesh (``bass_jax.sharding.ShardingPlan``), or None.
  """

  config: medusa.MedusaConfig
  dtype: str = "float32"
  sharding: Any = None
  needs_features = True
  drafts_with_model = True

  @property
  def name(self) -> str:
    return f"medusa({self.config.num_heads} heads)"

  def _logits(self, params, ctx) -> jax.Array:
    """``f32[B, K, V']``: every head on each row's feature at position ``n - 2``."""
    rows = jnp.arange(ctx.tokens.shape[0])
    feature = ctx.features[rows, jnp.maximum(ctx.seq_len - 2, 0)].astype(jnp.dtype(self.dtype))
    return medusa.head_logits(params, feature)

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    logits = self._logits(params, ctx)
    batch, heads = logits.shape[0], logits.shape[1]
    vocab_ids = params["vocab_ids"]
    head_of = jnp.minimum(jnp.arange(max_len), heads - 1)
    per_draft = logits[:, head_of]  # [B, L, V']
    if greedy:
      drafts, log_q = vocab_ids[first_argmax(per_draft)], None
    else:
      warped = ctx.warp(per_draft)  # over the heads' rows
      full = jnp.full((batch, max_len, self.config.vocab_size), -jnp.inf,
                      warped.dtype).at[..., vocab_ids].set(warped)
      draws = []
      for i in range(max_len):
        if ctx.row_keys is None:
          draws.append(vocab_ids[ctx.draw(warped[:, i], i)])
        else:  # a keyed rule (Gumbel acceptance) couples draws by full-vocabulary id
          draws.append(ctx.draw(full[:, i], i))
      drafts = jnp.stack(draws, axis=1)
      log_q = jnp.concatenate([full, jnp.zeros((batch, chunk, self.config.vocab_size),
                                               full.dtype)], axis=1)
    num_drafts = jnp.broadcast_to(jnp.minimum(ctx.draft_len, heads), (batch,)).astype(jnp.int32)
    return state, Proposal(drafts=drafts.astype(jnp.int32), num_drafts=num_drafts, log_q=log_q)

  def propose_tree(self, params, state, ctx, *, shape, prior=None):
    logits = jax.nn.log_softmax(self._logits(params, ctx), axis=-1)  # [B, K, V']
    heads = logits.shape[1]

    def expand(level, tokens, parent, mask):
      del parent, mask
      level = level + 1  # the level being scored: head ``level``
      head = jnp.take(logits, jnp.minimum(level, heads - 1), axis=1)  # [B, V']
      return level, jnp.broadcast_to(head[:, None], (tokens.shape[0], tokens.shape[1],
                                                     head.shape[-1]))

    last = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    _, tree = tree_lib.grow_tree(last, logits[:, 0], expand, jnp.zeros((), jnp.int32), shape,
                                 token_of=lambda ids: params["vocab_ids"][ids], prior=prior)
    return state, tree
