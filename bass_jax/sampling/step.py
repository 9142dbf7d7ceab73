"""One decoding step for the whole batch: the plain step (the target alone: every step of regular
decoding, and BASS's step when nothing is drafted), the chain step (propose, verify in chunks, accept
per row, emit, roll the proposer back, adapt l_draft) and the token-tree step (draft a tree per row,
verify it in one forward, accept a path, compact it). Every kind accepts with the decode's one
``acceptance.AcceptanceRule`` and ends in :func:`_advance` (emit, record the step, tell the policy).

Implements BASS §3 (docs/bass.md, "One step for the whole batch"); ``bass_jax.sampling.loop`` runs these
steps in its ``while_loop`` and states the invariants they keep between steps.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.cache import KVCache, keep_path
from bass_jax.models.attention import mask_depths
from bass_jax.models.common import feature_value, forward
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.acceptance import AcceptanceRule
from bass_jax.sampling.draft_len import CHAIN, PLAIN
from bass_jax.sampling.proposers import FinishedSamples, StepContext
from bass_jax.sampling.state import DecodeSpec, DecodeState


# The named scopes of a step's phases (``jax.named_scope``): they appear in the op names of the
# compiled program, so a profiler's trace (jax.profiler, Perfetto, TensorBoard) groups a step's time
# by phase. Everything outside them is loop control and bookkeeping.
STEP_SCOPES = ("propose", "target_forward", "accept", "advance")


@jax.named_scope("target_forward")
def _target_forward(spec: DecodeSpec, params: Any, tokens: jax.Array, cache: KVCache,
                    features: jax.Array | None, tree_mask: jax.Array | None = None):
  """The target's forward over ``tokens: i32[B, T]`` (a tree's nodes with ``tree_mask``); with a feature
  buffer, also writes the tokens' features at their slots (``cache.lengths[b] + t``). Returns
  ``(logits, cache, features)``."""
  if features is None:
    logits, cache_out = forward(spec.target, params, tokens, cache, dtype=spec.target_dtype,
                                attention_impl=spec.attention_impl, sharding=spec.target_sharding,
                                tree_mask=tree_mask)
    return logits, cache_out, None
  out = forward(spec.target, params, tokens, cache, dtype=spec.target_dtype,
                attention_impl=spec.attention_impl, return_features=True,
                hidden_layers=spec.feature_taps, sharding=spec.target_sharding, tree_mask=tree_mask)
  logits, cache_out = out[:2]
  new = feature_value(out, spec.feature_taps, spec.final_feature)
  rows = jnp.arange(tokens.shape[0])[:, None]
  pos = cache.lengths[:, None] + jnp.arange(tokens.shape[1])
  return logits, cache_out, features.at[rows, pos].set(new.astype(features.dtype), mode="drop")


@jax.named_scope("advance")
def _emit(state: DecodeState, new_tokens: jax.Array, new_logprobs: jax.Array,
          count: jax.Array) -> DecodeState:
  """Appends the first ``count[b]`` of ``new_tokens: i32[B, E]`` to each live row.

  A row's emission stops after its first EOS and at ``max_new`` tokens; the row is then done and frozen.
  """
  _, width = new_tokens.shape
  rows = jnp.arange(new_tokens.shape[0])[:, None]
  slots = jnp.arange(width)[None, :]
  live = ~state.done
  generated = state.seq_len - state.prompt_len

  is_eos = (slots < count[:, None]) & jnp.isin(new_tokens, state.limits.eos_ids)
  has_eos = jnp.any(is_eos, axis=1)
  first_eos = jnp.argmax(is_eos, axis=1)
  count = jnp.where(has_eos, first_eos + 1, count)
  count = jnp.where(live, jnp.minimum(count, state.limits.max_new - generated), 0)

  write = slots < count[:, None]
  out_of_range = state.tokens.shape[1]  # dropped by the scatter
  pos = jnp.where(write, state.seq_len[:, None] + slots, out_of_range)
  tokens = state.tokens.at[rows, pos].set(new_tokens, mode="drop")
  lp_pos = jnp.where(write, generated[:, None] + slots, out_of_range)
  logprobs = state.logprobs.at[rows, lp_pos].set(new_logprobs, mode="drop")

  seq_len = state.seq_len + count
  eos = state.eos | (live & has_eos & (first_eos < count))
  done = state.done | eos | (seq_len - state.prompt_len >= state.limits.max_new)
  return state.replace(tokens=tokens, logprobs=logprobs, seq_len=seq_len, eos=eos, done=done)


def plain_step(spec: DecodeSpec, target_params, temperature, top_p,
               state: DecodeState) -> DecodeState:
  """One token per live row from the target alone: every step of regular decoding, and a BASS step
  when nothing is drafted.

  ``temperature: f32[]`` (> 0 unless greedy) and ``top_p: f32[] | None`` warp the draw; the token is
  the acceptance rule's draw at the row's root (``AcceptanceRule.accept`` of a tree without drafts):
  the argmax, a draw from the warped law, or with Gumbel acceptance the row's Gumbel-max draw at text
  position ``seq_len``, the draw a verification would make there."""
  batch = state.tokens.shape[0]
  rows = jnp.arange(batch)
  live = ~state.done
  key, sample_key = jax.random.split(state.key)
  last = state.tokens[rows, state.seq_len - 1][:, None]
  logits, cache, features = _target_forward(spec, target_params, last, state.target_cache,
                                            state.features)
  with jax.named_scope("accept"):
    result = spec.acceptance.accept(
        tree_lib.DraftTree(tokens=last, parents=jnp.full_like(last, -1),
                           num_nodes=jnp.ones((batch,), jnp.int32)),
        logits, temperature=temperature, top_p=top_p, key=sample_key,
        row_keys=state.queue.row_keys(), seq_len=state.seq_len)
    token = result.next_token
    logprob = jax.nn.log_softmax(logits[:, 0], axis=-1)[rows, token]
  zeros = jnp.zeros((batch,), jnp.int32)
  return _advance(spec, state, token[:, None], logprob[:, None], zeros, cache, features,
                  state.proposer_state, key, kind=PLAIN, depth=zeros, log=dict(
                      verified=jnp.int32(1), accepted=jnp.where(live, 0, -1)))


def _verify_chunk(spec: DecodeSpec, target_params, temperature, top_p, state: DecodeState, inputs,
                  draft_log_probs, cache: KVCache, features, start, num_drafts, key):
  """Scores ``inputs[:, start:start + C]`` with the target and accepts over those positions: the
  chunk is the chain of its C + 1 nodes from position ``start`` (``tree.chain_tree``'s ``first``),
  checked by the decode's acceptance rule (``state`` is the decode's at the step's start: its text
  lengths and sequence keys).

  Returns:
    ``(matched i32[B], next_token i32[B], logprobs f32[B, C, 2], cache, features)``: the drafts each
    row accepted in the chunk (``matched < C``: its acceptance ends here, at position ``start +
    matched``) and the rule's token there (the correction, or the bonus at ``i = l``);
    ``logprobs[..., 0]`` is the target's raw log-probability of each position's draft and ``[..., 1]``
    of the next token (for the emitted log-probs); the cache holds the chunk's K/V, its lengths
    advanced by C; the feature buffer (or None) the chunk's features.
  """
  chunk = spec.verify_chunk
  nodes = jax.lax.dynamic_slice_in_dim(inputs, start, chunk + 1, axis=1)
  logits, cache, features = _target_forward(spec, target_params, nodes[:, :chunk], cache, features)
  with jax.named_scope("accept"):
    chain = tree_lib.chain_tree(nodes[:, 0], nodes[:, 1:], jnp.clip(num_drafts - start, 0, chunk),
                                first=start)
    log_q = (None if draft_log_probs is None
             else jax.lax.dynamic_slice_in_dim(draft_log_probs, start, chunk, axis=1))
    result = spec.acceptance.accept(chain, logits, temperature=temperature, top_p=top_p, key=key,
                                    draft_log_probs=log_q, row_keys=state.queue.row_keys(),
                                    seq_len=state.seq_len)
    matched, next_token = result.num_accepted, result.next_token
    raw = jax.nn.log_softmax(logits, axis=-1)
    of_draft = jnp.take_along_axis(raw, nodes[:, 1:, None], axis=-1)[..., 0]
    of_next = jnp.take_along_axis(
        raw, jnp.broadcast_to(next_token[:, None, None], raw.shape[:2] + (1,)), axis=-1)[..., 0]
    return matched, next_token, jnp.stack([of_draft, of_next], axis=-1), cache, features


def _verify(spec: DecodeSpec, target_params, temperature, top_p, state: DecodeState, drafts,
            num_drafts, draft_log_probs, key):
  """Scores ``[last emitted, d_1 … d_l]`` in chunks of C positions and accepts per row, chunk by chunk.

  ``num_drafts: i32[B]`` real drafts per row (a row with 0 takes the target's token at its first
  position: a plain decoding step inside the verification); ``draft_log_probs`` None means one-hot
  ``q`` (a deterministic proposer) or greedy decoding.

  Each pass writes its chunk's K/V into the target cache and attends; the loop stops once every live
  row's acceptance has ended (or all ``l + 1`` positions are scored). When one pass covers the
  longest chain (``C >= L + 1``, the GPU profile) it runs once, with no loop around it.

  Returns:
    ``(num_accepted: i32[B], emitted: i32[B, L + 1], emitted_logprobs: f32[B, L + 1], target_cache,
    features, verified: i32[])`` where row b emits ``emitted[b, :num_accepted[b] + 1]``, the cache holds
    the scored positions' K/V (the caller resets its lengths), the feature buffer (or None) their
    features, and ``verified`` counts the positions scored per row, padding included.
  """
  batch, max_draft = drafts.shape
  rows = jnp.arange(batch)
  chunk = spec.verify_chunk
  last = state.tokens[rows, state.seq_len - 1]
  # [last, d_1 … d_L, padding]: position i's input is inputs[i], its draft to check inputs[i + 1].
  inputs = jnp.concatenate([last[:, None], drafts, jnp.zeros((batch, chunk), jnp.int32)], axis=1)
  score = functools.partial(_verify_chunk, spec, target_params, temperature, top_p, state)

  def cond(carry):
    start, _, _, _, open_rows, _, _ = carry
    return jnp.any(open_rows & (start <= num_drafts))

  def body(carry):
    start, cache, features, accepted, open_rows, next_token, logprobs = carry
    # The same key for every chunk: acceptance draws are keyed by position, not by chunk.
    matched, chunk_next, chunk_lp, cache, features = score(inputs, draft_log_probs, cache, features,
                                                           start, num_drafts, key)
    closes = open_rows & (matched < chunk)
    # Emitted log-probs: the draft's below the row's first mismatch in this chunk, the next token's at it.
    slots = jnp.arange(chunk)[None, :]
    values = jnp.where(slots < matched[:, None], chunk_lp[..., 0], chunk_lp[..., 1])
    window = jax.lax.dynamic_slice_in_dim(logprobs, start, chunk, axis=1)
    logprobs = jax.lax.dynamic_update_slice_in_dim(
        logprobs, jnp.where(open_rows[:, None], values, window), start, axis=1)
    accepted = jnp.where(open_rows, accepted + matched, accepted)
    next_token = jnp.where(closes, chunk_next, next_token)
    return start + chunk, cache, features, accepted, open_rows & ~closes, next_token, logprobs

  init = (jnp.zeros((), jnp.int32), state.target_cache, state.features,
          jnp.zeros((batch,), jnp.int32), ~state.done, jnp.zeros((batch,), jnp.int32),
          jnp.zeros((batch, max_draft + 1 + chunk), jnp.float32))
  # One pass scores every position when C >= L + 1: then no device-side loop condition.
  passes = body if chunk >= max_draft + 1 else functools.partial(jax.lax.while_loop, cond, body)
  verified, cache, features, accepted, _, next_token, logprobs = passes(init)
  emitted = jnp.concatenate([drafts, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  emitted = emitted.at[rows, accepted].set(next_token)
  return accepted, emitted, logprobs[:, :max_draft + 1], cache, features, verified


def chain_step(spec: DecodeSpec, target_params, draft_params, temperature, top_p,
               state: DecodeState) -> DecodeState:
  """One BASS step for the whole batch (paper §3; docs/bass.md): propose a chain per row, verify it,
  accept per row, advance, roll the proposer back, adapt l_draft."""
  key, draft_key, accept_key = jax.random.split(state.key, 3)
  live = ~state.done
  draft_len = state.draft_len
  ctx = step_context(state, draft_key, temperature, top_p, spec.acceptance)
  with jax.named_scope("propose"):
    proposer_state, proposal = spec.proposer.propose(
        draft_params, state.proposer_state, ctx, max_len=spec.max_draft, chunk=spec.verify_chunk,
        greedy=spec.greedy)
  num_drafts = jnp.where(live, proposal.num_drafts, 0)
  accepted, emitted, emitted_logprobs, target_cache, features, verified = _verify(
      spec, target_params, temperature, top_p, state, proposal.drafts, num_drafts, proposal.log_q,
      accept_key)
  return _advance(spec, state, emitted, emitted_logprobs, accepted, target_cache, features,
                  proposer_state, key, kind=CHAIN, depth=num_drafts, log=dict(
                      draft_len=draft_len, verified=verified,
                      source=_source(spec, proposal.source, num_drafts)))


def _source(spec: DecodeSpec, source: jax.Array | None, drafted: jax.Array) -> jax.Array:
  """``i32[B]`` where each row's drafts came from (``proposers.DRAFT_SOURCES``; the proposer's own
  where ``source`` is None), -1 for a row without drafts."""
  if source is None:
    source = jnp.full(drafted.shape, spec.proposer.source_index, jnp.int32)
  return jnp.where(drafted > 0, source, -1)


@jax.named_scope("advance")
def _advance(spec: DecodeSpec, state: DecodeState, emitted, emitted_logprobs, accepted, target_cache,
             features, proposer_state, key, *, kind, depth, log) -> DecodeState:
  """The end of every step, plain, chain or tree: each live row emits ``emitted[b, :accepted[b] +
  1]`` (``i32[B, E]``, with the target's log-probs ``f32[B, E]``), the target cache keeps the text
  (rejected drafts are dropped by resetting lengths; their K/V stay in place, masked, to be
  overwritten), the proposer rolls back (after a speculative step), the step is recorded in the
  :class:`state.StepLog` (``log``: the entries this kind of step sets; the drafts and accepted
  counts per row are added here for speculative steps) and the draft-length policy is told
  (``after_step(kind, depth, accepted, live)``, ``draft_len.py``).

  Args:
    kind: static: ``draft_len.PLAIN``, ``draft_len.CHAIN`` or the tree shape's index.
    depth: ``i32[B]`` the drafts each row had checked (a chain's length, a tree's deepest node).
  """
  live = ~state.done
  old_seq_len = state.seq_len
  state = _emit(state, emitted, emitted_logprobs, accepted + 1)
  if kind != PLAIN:
    proposer_state = spec.proposer.rollback(proposer_state, state.tokens, old_seq_len, state.seq_len)
    log = dict(log, drafted=log.get("drafted", depth), accepted=jnp.where(live, accepted, -1))
  next_len, policy_state = spec.draft_len.after_step(
      state.policy_state, state.draft_len, kind=kind, depth=depth, accepted=accepted, live=live)
  return state.replace(
      target_cache=target_cache.with_lengths(state.seq_len - 1),
      proposer_state=proposer_state,
      features=features,
      step=state.step + 1,
      key=key,
      draft_len=jnp.asarray(next_len, jnp.int32),
      policy_state=policy_state,
      log=state.log.record(state.step, **log),
  )


def tree_step(spec: DecodeSpec, target_params, draft_params, temperature, top_p,
              state: DecodeState, *, tree: int = 0) -> DecodeState:
  """One tree step for the whole batch (EAGLE-2, Li et al. 2024; SpecInfer, Miao et al. 2024;
  docs/design.md "Token trees"): the proposer drafts a tree of shape ``spec.draft_trees[tree]`` (a
  static index) per row, the target scores every node in one forward under the tree's ancestor mask,
  each row accepts one root-to-node path (``AcceptanceRule.accept``) and emits it and one more token, and the path's K/V (and features)
  move into consecutive slots (``cache.keep_path``), so the next step sees an ordinary ragged cache.
  The draft-length policy learns from the accepted depths and chooses the next step's kind.

  Args:
    temperature: ``f32[]`` (> 0 unless ``spec.greedy``). top_p: ``f32[]`` in ``(0, 1)``, or None
      for no nucleus (static).
    state: the decode's state; its ``target_cache`` lags the text by one token (``loop``'s invariants).
    tree: static index into ``spec.draft_trees``.

  Returns:
    The state after the step: up to ``depth + 1`` new tokens per live row, the caches compacted, the
    step logged (``StepLog.draft_len``: the shape's depth; ``StepLog.tree``: ``tree``).
  """
  shape = spec.draft_trees[tree]
  key, draft_key, accept_key = jax.random.split(state.key, 3)
  live = ~state.done
  rows = jnp.arange(state.tokens.shape[0])
  ctx = step_context(state, draft_key, temperature, top_p, spec.acceptance)
  with jax.named_scope("propose"):
    proposer_state, draft = spec.proposer.propose_tree(draft_params, state.proposer_state, ctx,
                                                       shape=shape)
  mask = tree_lib.ancestor_mask(draft)
  logits, target_cache, features = _target_forward(spec, target_params, draft.tokens,
                                                   state.target_cache, state.features, mask)
  with jax.named_scope("accept"):
    result = spec.acceptance.accept(draft, logits, temperature=temperature, top_p=top_p,
                                    key=accept_key, row_keys=state.queue.row_keys(),
                                    seq_len=state.seq_len)
    accepted = jnp.where(live, result.num_accepted, 0)
    # Emitted: the path's draft tokens, then next_token at slot num_accepted.
    path = jnp.maximum(result.path, 0)
    slots = jnp.arange(shape.nodes)[None, :]
    on_path = jnp.take_along_axis(draft.tokens, jnp.roll(path, -1, axis=1), axis=1)
    emitted = jnp.where(slots == result.num_accepted[:, None], result.next_token[:, None], on_path)
    # The target's log-probability of each emitted token, at its emitting node (N values per row: no
    # [B, N, V] log-softmax).
    emitted_logprobs = (logits[rows[:, None], path, emitted] - jax.nn.logsumexp(
        logits, axis=-1)[rows[:, None], path]).astype(jnp.float32)

  base = state.seq_len - 1  # the root's slot: the cache lags the text by one token
  target_cache = target_cache.keep_path(base, result.path)
  if features is not None:
    features = keep_path(features, base, result.path, axis=1)
  drafted = jnp.where(live, draft.num_nodes - 1, 0)
  depth = jnp.max(mask_depths(mask), axis=-1)  # each row's deepest node (0: no drafts)
  return _advance(spec, state, emitted, emitted_logprobs, accepted, target_cache, features,
                  proposer_state, key, kind=tree, depth=depth, log=dict(
                      draft_len=jnp.int32(shape.depth), drafted=drafted,
                      verified=jnp.int32(shape.nodes), tree=jnp.int32(tree),
                      source=_source(spec, draft.source, drafted)))


def step_context(state: DecodeState, key, temperature, top_p,
                 acceptance: AcceptanceRule) -> StepContext:
  """What the proposer may read of ``state`` this step (:class:`StepContext`), with the proposal's
  PRNG ``key``, the warp's ``temperature: f32[]`` and ``top_p: f32[] | None``, and the decode's
  static acceptance rule (how sampled drafts are drawn, and whether the warps are branch-free)."""
  queue = state.queue
  finished = None  # without admission a retired row's text stays in the batch (Queue.admits)
  if queue.admits:
    finished = FinishedSamples(prompts=queue.prompts, prompt_len=queue.prompt_len,
                               tokens=queue.tokens, lengths=queue.lengths, group=queue.group)
  return StepContext(tokens=state.tokens, seq_len=state.seq_len, live=~state.done,
                     draft_len=state.draft_len, key=key, temperature=temperature, top_p=top_p,
                     features=state.features, row_keys=queue.row_keys(), group=queue.row_group(),
                     finished=finished, branch_free=acceptance.branch_free,
                     acceptance=acceptance)
