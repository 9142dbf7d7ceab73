"""An independent draft model as a proposer (BASS §3, the paper's method): :class:`ModelProposer`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache
from bass_jax.models.common import DecoderConfig, prefill_cache
from bass_jax.models.common import forward as model_forward
from bass_jax.sampling import costs
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.tree_check import leading_true
from bass_jax.sampling.warp import first_argmax
from bass_jax.sampling.proposers.base import Proposer, draft_autoregressively


@flax.struct.dataclass
class DraftCacheState:
  """A draft model's state: its ragged cache and the drafts it fed itself in the last step.

  Attributes:
    cache: the draft's KV cache; ``cache.lengths[b]`` tokens of row b's text are in it.
    fed: ``i32[B, L]`` the drafts whose K/V the last proposal wrote (``d_1 … d_{l-1}``; the last draft
      is never fed), for the rollback, at text positions from the step's ``old_seq_len`` on.
    num_fed: ``i32[]`` how many of ``fed`` were written.
  """

  cache: KVCache
  fed: jax.Array
  num_fed: jax.Array


@dataclasses.dataclass(frozen=True)
class ModelProposer(Proposer):
  """An independent draft model sharing the target's tokenizer (BASS, §3; the paper's method).

  Each step first brings the draft's cache up to the row's text (the 1 or 2 tokens emitted since it
  last saw the text; more after plain decoding steps, two at a time), then drafts ``l`` tokens
  autoregressively, sampling from its own warped distribution (argmax when greedy). After acceptance
  its cache keeps the longest prefix of what it consumed that the text confirms.

  Attributes:
    config: the draft's architecture. dtype: its parameter/compute dtype name.
    attention_impl: attention implementation name (``bass_jax.models.attention``).
    sharding: the draft's placement on a mesh (``bass_jax.sharding.ShardingPlan``), or None.
  """

  config: DecoderConfig
  dtype: str
  attention_impl: str = "reference"
  sharding: Any = None
  drafts_with_model = True

  @property
  def name(self) -> str:
    return f"model({self.config.num_layers} layers)"

  def forward_costs(self, params, batch, cache_len, max_len):
    del max_len
    forward = functools.partial(costs.time_forward, self.config, self.dtype, self.attention_impl,
                                params, batch, cache_len=cache_len, sharding=self.sharding)
    return forward(positions=2), forward(positions=1)

  def tree_level_cost(self, params, batch, cache_len, shape):
    """One level's forward of ``top_k`` nodes, timed at the widest level's mask."""
    return costs.time_forwards(self.config, self.dtype, self.attention_impl, params, batch,
                               [shape.top_k], cache_len=cache_len, sharding=self.sharding,
                               mask_widths=[shape.draft_slots])[0]

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    del features
    batch = prompts.shape[0]
    cache = prefill_cache(self.config, params, prompts, prompt_len, cache_len=cache_len,
                          dtype=self.dtype, attention_impl=self.attention_impl,
                          sharding=self.sharding, chunk=prefill_chunk)
    return DraftCacheState(cache=cache, fed=jnp.zeros((batch, max_len), jnp.int32),
                           num_fed=jnp.zeros((), jnp.int32))

  def _forward(self, params):
    return functools.partial(model_forward, self.config, params, dtype=self.dtype,
                             attention_impl=self.attention_impl, sharding=self.sharding)

  def _catch_up(self, params, state, ctx):
    """The draft's cache brought up to each row's whole text, and its logits ``f32[B, V]`` for the
    token after it."""
    batch = ctx.tokens.shape[0]
    rows = jnp.arange(batch)
    last_slot = ctx.tokens.shape[1] - 1
    forward = self._forward(params)

    def window(lengths):  # the two text tokens at lengths, lengths + 1 (clipped to the buffer)
      return ctx.tokens[rows[:, None], jnp.minimum(lengths[:, None] + jnp.arange(2), last_slot)]

    # Catch up two tokens at a time while some row lags by more than two (only after plain decoding
    # steps or a hybrid step); a row that lags less rewrites K/V it already has, identically.
    def catch_up(cache):
      _, cache = forward(window(cache.lengths), cache)
      pending = ctx.seq_len - (cache.lengths - 2)
      return cache.with_lengths(jnp.where(pending > 2, cache.lengths, cache.lengths - 2))

    cache = jax.lax.while_loop(lambda c: jnp.any(ctx.live & (ctx.seq_len - c.lengths > 2)),
                               catch_up, state.cache)
    # The last 1 or 2 pending tokens; the first proposal comes from the logits of the last one. With 1
    # pending token the second input is a stale slot whose K/V lands past the row's length and is
    # overwritten by the first draft.
    pending = jnp.clip(ctx.seq_len - cache.lengths, 1, 2)
    logits, cache = forward(window(cache.lengths), cache)
    return cache.with_lengths(ctx.seq_len), logits[rows, pending - 1]

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    forward = self._forward(params)
    cache, logits = self._catch_up(params, state, ctx)

    def draw(logits, i):  # draft i: token i32[B] and its q f32[B, V] (None when greedy)
      if greedy:
        return first_argmax(logits), None
      log_q = ctx.warp(logits)
      return ctx.draw(log_q, i), log_q

    def step(cache, previous, i):
      logits, cache = forward(previous, cache)
      return (cache, *draw(logits[:, 0], i))

    cache, proposal = draft_autoregressively(
        step, cache, draw(logits, 0), ctx,
        max_len=max_len, chunk=chunk, vocab_size=self.config.vocab_size)
    return DraftCacheState(cache=cache, fed=proposal.drafts, num_fed=ctx.draft_len - 1), proposal

  def propose_tree(self, params, state, ctx, *, shape, prior=None):
    """EAGLE-2's growth (``tree.grow_tree``) with this model: each level is one forward of the
    expanded nodes under their ancestor mask. Nothing drafted stays in the cache: the rollback keeps
    the text, and the next catch-up feeds the accepted tokens. ``prior``: a hybrid's tree (n-gram
    branches), ranked first (``grow_tree``'s)."""
    forward = self._forward(params)
    cache, logits = self._catch_up(params, state, ctx)

    def expand(cache, tokens, parent, mask):
      del parent  # the mask says it all
      logits, cache = forward(tokens, cache, tree_mask=mask)
      return cache, jax.nn.log_softmax(logits, axis=-1)

    last = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    cache, tree = tree_lib.grow_tree(last, jax.nn.log_softmax(logits, axis=-1), expand, cache, shape,
                                     prior=prior)
    return state.replace(cache=cache.with_lengths(ctx.seq_len),
                         num_fed=jnp.zeros((), jnp.int32)), tree

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    # The step's proposal wrote K/V of fed[:, :num_fed] at old_seq_len…; keep those the text confirms.
    rows = jnp.arange(tokens.shape[0])
    width = state.fed.shape[1]
    slots = jnp.arange(width)
    pos = jnp.minimum(old_seq_len[:, None] + slots, tokens.shape[1] - 1)
    confirmed = ((tokens[rows[:, None], pos] == state.fed) & (slots < state.num_fed)
                 & (old_seq_len[:, None] + slots < new_seq_len[:, None]))
    # At most the text less its last token, which the next catch-up must feed for the next draft's
    # logits: where a hybrid or a replay verified other drafts than this model's, the target's
    # correction can equal the model's own first draft, which would otherwise count as confirmed and
    # leave the catch-up nothing to feed (it then read a stale slot: the next drafts were garbage).
    kept = jnp.minimum(old_seq_len + leading_true(confirmed), new_seq_len - 1)
    return state.replace(cache=state.cache.with_lengths(jnp.minimum(state.cache.lengths, kept)),
                         num_fed=jnp.zeros((), jnp.int32))
