"""An EAGLE-style feature draft as a proposer (Li et al. 2024): :class:`EagleProposer`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache
from bass_jax.models import eagle
from bass_jax.sampling import costs
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.warp import first_argmax
from bass_jax.sampling.proposers.base import Proposer, draft_autoregressively


@flax.struct.dataclass
class EagleState:
  """An EAGLE draft's state: its ragged cache.

  Attributes:
    cache: the draft's KV cache over pairs ``(f_i, x_{i+1})``; between steps ``cache.lengths[b]`` is
      ``seq_len[b] - 1`` of the step before, the pairs of the text whose features the target had then
      computed. A step's own drafted pairs (read with the draft's predicted features) are dropped by the
      rollback and replaced by the catch-up, which reads the target's true features.
  """

  cache: KVCache


@dataclasses.dataclass(frozen=True)
class EagleProposer(Proposer):
  """An EAGLE-style feature draft (Li et al. 2024, §3; ``bass_jax.models.eagle``).

  Each step, for every row:

  1. **catch-up**: the pairs ``(f_i, x_{i+1})`` the text gained since the last step (a step that
     accepted a drafts adds a + 1), with the target's true features (``StepContext.features``), in one
     forward of ``W = min(L + 1, catch_up_width)`` positions; a row that lags by more (after a long
     acceptance or plain decoding steps) first takes forwards of W pairs in a loop. The last forward
     ends at the row's last pair (re-feeding already cached pairs, identically, when fewer are new), so
     that every row has the prediction ``f̂_{n-1}`` of its next position (n = ``seq_len``);
  2. **drafting**: ``d_1`` from the head on ``f̂_{n-1}``; then the pair ``(f̂_{n-1}, d_1)`` gives
     ``f̂_n`` and ``d_2``, and so on, ``l`` drafts per row, sampled from the draft's own warped
     distribution (0 outside its draft vocabulary; argmax when greedy);
  3. **rollback**: the cache goes back to the text's pairs (``old_seq_len - 1``); the next catch-up
     rewrites the accepted positions with the target's features, as EAGLE does.

  A one-token prompt has no pair before its first step; its first proposal reads a stale pair (and is
  verified like any other, so the output stays exact).

  Attributes:
    config: the draft's architecture (:class:`eagle.EagleConfig`). dtype: its compute dtype name.
    attention_impl: attention implementation name (``bass_jax.models.attention``).
    catch_up_width: the most pairs one catch-up forward takes (W above); each step pays one forward
      of W positions, so it trades that cost against extra forwards after long acceptances.
    sharding: the draft's placement on a mesh (``bass_jax.sharding.ShardingPlan``), or None.
  """

  config: eagle.EagleConfig
  dtype: str
  attention_impl: str = "reference"
  catch_up_width: int = 5
  sharding: Any = None
  needs_features = True
  drafts_with_model = True

  @property
  def feature_taps(self) -> tuple[int, ...]:
    """The target layers the draft reads (EAGLE-3's taps, this project's fused layers)."""
    return self.config.target_taps

  @property
  def final_feature(self) -> bool:
    return self.config.reads_final_feature

  @property
  def name(self) -> str:
    return f"eagle({self.config.num_layers} layer, V'={self.config.draft_vocab_size})"

  def _forward(self, params, tokens, features, cache, tree_mask=None):
    return eagle.forward(self.config, params, tokens, features, cache, dtype=self.dtype,
                         attention_impl=self.attention_impl, sharding=self.sharding,
                         tree_mask=tree_mask)

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    del max_len, prefill_chunk  # one layer: a pass over all P pairs costs little
    if features is None:
      raise ValueError("EagleProposer.init_state needs the target's prompt features")
    cache = self.config.init_cache(prompts.shape[0], cache_len, jnp.dtype(self.dtype))
    if prompts.shape[1] > 1:  # pairs (f_i, x_{i+1}), i = 0 … P - 2
      _, update = self._forward(params, prompts[:, 1:], features[:, :-1], None)
      cache = cache.append(update)
    return EagleState(cache=cache.with_lengths(jnp.maximum(prompt_len - 1, 0)))

  def _time_forward(self, params, batch: int, cache_len: int, positions: int,
                    mask_width: int | None = None) -> float:
    """Seconds of one forward of ``positions`` pairs (placeholder features) and the head on the last
    one, or on every one of a tree level's (``mask_width``: a tree forward)."""
    e = self.config.feature_size

    def run(params, tokens, cache, tree_mask=None):
      features = jnp.ones(tokens.shape + (e,), jnp.dtype(self.dtype))
      predicted, cache = self._forward(params, tokens, features, cache, tree_mask=tree_mask)
      return eagle.draft_logits(params, predicted if tree_mask is not None else predicted[:, -1]), cache

    return costs.time_cached_forward(
        run, params, costs.half_full_cache(self.config, batch, cache_len, self.dtype), positions,
        mask_width=mask_width)

  def forward_costs(self, params, batch, cache_len, max_len):
    timed = functools.partial(self._time_forward, params, batch, cache_len)
    return timed(min(max_len + 1, self.catch_up_width)), timed(1)

  def tree_level_cost(self, params, batch, cache_len, shape):
    """One level's forward of ``top_k`` pairs and their heads, timed at the widest level's mask."""
    return self._time_forward(params, batch, cache_len, shape.top_k, mask_width=shape.draft_slots)

  def _catch_up(self, params, state, ctx, max_len):
    """The draft's cache over every pair of the text (the target's features), and the predicted
    feature ``f̂_{n-1}: [B, E]`` of each row's next position (step 1 of the class docstring)."""
    batch, width = ctx.tokens.shape
    rows = jnp.arange(batch)[:, None]
    window = min(max_len + 1, self.catch_up_width)

    def pairs(start):  # tokens x_{i+1} and features f_i for i = start … start + window - 1
      i = start[:, None] + jnp.arange(window)
      return (ctx.tokens[rows, jnp.clip(i + 1, 0, width - 1)],
              ctx.features[rows, jnp.clip(i, 0, width - 1)])

    def catch_up(cache):
      _, cache = self._forward(params, *pairs(cache.lengths), cache)
      behind = ctx.seq_len - 1 - (cache.lengths - window) > window
      return cache.with_lengths(jnp.where(behind, cache.lengths, cache.lengths - window))

    cache = jax.lax.while_loop(
        lambda c: jnp.any(ctx.live & (ctx.seq_len - 1 - c.lengths > window)), catch_up,
        state.cache)
    # The last window ends at the row's last pair, n - 2, and re-feeds at least that one.
    start = jnp.maximum(jnp.minimum(cache.lengths, ctx.seq_len - 2), 0)
    predicted, cache = self._forward(params, *pairs(start), cache.with_lengths(start))
    last = jnp.clip(ctx.seq_len - 2 - start, 0, window - 1)
    feature = predicted[rows[:, 0], last]  # f̂_{n-1}: [B, E]
    return cache.with_lengths(jnp.maximum(ctx.seq_len - 1, 0)), feature

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    vocab_ids = params["vocab_ids"]
    cache, feature = self._catch_up(params, state, ctx, max_len)

    def draw(feature, i):  # draft i: token i32[B] in the full vocabulary; its q as f32[B, V] (sampled)
      logits = eagle.draft_logits(params, feature)
      if greedy:
        return vocab_ids[first_argmax(logits)], None
      log_q = ctx.warp(logits)  # over the draft vocabulary
      full = eagle.to_full_vocab(log_q, vocab_ids, self.config.vocab_size)
      if ctx.row_keys is None:
        return vocab_ids[ctx.draw(log_q, i)], full
      return ctx.draw(full, i), full  # a keyed rule couples draws by full-vocabulary id

    def step(carry, previous, i):  # the pair (f̂ of the last draft, the last draft) -> next draft
      cache, feature = carry
      predicted, cache = self._forward(params, previous, feature[:, None], cache)
      return ((cache, predicted[:, 0]), *draw(predicted[:, 0], i))

    (cache, _), proposal = draft_autoregressively(
        step, (cache, feature), draw(feature, 0), ctx,
        max_len=max_len, chunk=chunk, vocab_size=self.config.vocab_size)
    return EagleState(cache=cache), proposal

  def propose_tree(self, params, state, ctx, *, shape, prior=None):
    """EAGLE-2's growth (``tree.grow_tree``): each level forwards the pairs ``(f̂ of the parent,
    token)`` of its expanded nodes under their ancestor mask, whose predicted features score their
    children and feed the next level. The rollback drops every drafted pair, as after a chain.
    ``prior``: a hybrid's tree (n-gram branches), ranked first (``grow_tree``'s)."""
    cache, feature = self._catch_up(params, state, ctx, shape.depth)

    def expand(carry, tokens, parent, mask):
      cache, parent_features = carry  # [B, k or 1, E]: the previous level's predictions
      features = jnp.take_along_axis(parent_features, parent[..., None], axis=1)
      predicted, cache = self._forward(params, tokens, features, cache, tree_mask=mask)
      return (cache, predicted), jax.nn.log_softmax(eagle.draft_logits(params, predicted), axis=-1)

    last = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    first = jax.nn.log_softmax(eagle.draft_logits(params, feature), axis=-1)
    (cache, _), tree = tree_lib.grow_tree(last, first, expand, (cache, feature[:, None]), shape,
                                          token_of=lambda ids: params["vocab_ids"][ids], prior=prior)
    return EagleState(cache=cache), tree

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    del tokens, new_seq_len
    return EagleState(cache=state.cache.with_lengths(jnp.maximum(old_seq_len - 1, 0)))
