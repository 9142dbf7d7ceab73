"""The jitted decode: prefill, then one ``lax.while_loop`` of regular or BASS steps over a static batch.

Implements BASS (paper §3; docs/bass.md): one step (draft, verify, accept, advance) and the draft length
for B rows at once, every row with its own length. Shapes are static: the batch, the prompt length and
the output buffer are padded to buckets (``bass_jax.sampling.generate``), the cache has
``S >= P + N + L + 1`` slots (P the padded prompt length, N the output bucket, L the maximum draft
length), and rows that finish keep riding along, frozen. The true ``max_new_tokens`` and the EOS ids are
traced values, so calls that differ only in them share a program. Nothing here talks to the host.

Verification scores the ``l + 1`` positions ``[last emitted, d_1 … d_l]`` in chunks of C positions
(``DecodeSpec.verify_chunk``): one compiled target forward, run once per chunk, accepting chunk by chunk
and stopping as soon as every row has rejected. One target forward is compiled whatever the draft
length, and a step whose rows all reject early skips the rest of its verification.

Invariants between steps (for every live row):

* ``tokens[b, :seq_len[b]]`` is the prompt followed by everything emitted so far.
* The target cache holds K/V of ``tokens[b, :seq_len[b] - 1]``: it lags the text by the last emitted
  token, which is the first input of the next verification (the paper's Fig. 3).
* The proposer's state (a draft model's cache, or nothing) is its own business
  (``bass_jax.sampling.proposers``): it is told the text after every step and brings itself up to date.
* For a proposer that reads the target's features (EAGLE), ``features[b, i]`` holds the target's
  feature at every text position ``i < seq_len[b] - 1``: every target forward (prefill, plain step,
  verification chunk) writes the features of the positions it scores, as it writes their K/V.

A step is speculative (propose, verify, accept) when the policy's ``l_draft`` is at least 1 and some live
row has a proposal; otherwise it is a plain decoding step (one target position per row, exactly regular
decoding's step). The loop runs the two kinds as two inner ``while_loop`` s, never as branches of a
``cond``, so that each updates the caches in place.

Each forward writes its new tokens' K/V into the cache before attending over it: XLA then updates
the cache in place, where reading it first and writing after would make it copy every layer's cache
(and so does a write inside a ``lax.switch`` branch, which is why verification has one chunk size).

Axes: B batch, P padded prompt length, N output bucket, L max draft length, C chunk, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax import sharding as sharding_lib
from bass_jax.cache import KVCache
from bass_jax.models.attention import CACHE_ALIGNMENT
from bass_jax.models.common import DecoderConfig, forward, prefill_cache
from bass_jax.sampling import acceptance
from bass_jax.sampling.draft_len import DraftLenPolicy
from bass_jax.sampling.proposers import Proposer, StepContext
from bass_jax.sampling.warp import sample, warped_log_probs


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Everything static about a decode (a new value compiles a new program).

  Attributes:
    method: ``"bass"`` or ``"regular"``.
    target: target architecture. proposer: the draft side (None for ``regular``).
    target_dtype: parameter/compute dtype name of the target (``"float32"``, ``"bfloat16"``).
    attention_impl: name in the attention registry, used by the target (and by a draft model).
    prompt_len: P, prompts are right-padded to it.
    max_new_bucket: N, the size of the output buffer (the true limit is ``DecodeState.max_new``).
    greedy: temperature 0 (argmax draft and verification).
    draft_len: the draft-length policy (fixed, Algorithm 1 or goodput; ``draft_len.py``).
    verify_chunk: C, the positions one verification forward scores; ``l + 1`` positions take
      ``ceil((l + 1) / C)`` passes at most.
    target_sharding: the target's placement on a mesh (``bass_jax.sharding.ShardingPlan``); None on
      one device. The proposer carries its own (``Proposer.sharding``).
  """

  method: str
  target: DecoderConfig
  proposer: Proposer | None
  target_dtype: str
  attention_impl: str
  prompt_len: int
  max_new_bucket: int
  greedy: bool
  draft_len: DraftLenPolicy | None
  verify_chunk: int
  target_sharding: Any = None

  @property
  def max_draft(self) -> int:
    return self.draft_len.max_len if self.method == "bass" else 0

  @property
  def keeps_features(self) -> bool:
    """Whether the decode keeps the target's features for the proposer (an EAGLE draft)."""
    return self.method == "bass" and self.proposer.needs_features

  @property
  def cache_len(self) -> int:
    """S: prompt, every new token and the verification's look-ahead past the last one, rounded up to
    a multiple of ``CACHE_ALIGNMENT`` so that the Pallas kernels tile it."""
    needed = self.prompt_len + self.max_new_bucket + self.max_draft + 1
    return -(-needed // CACHE_ALIGNMENT) * CACHE_ALIGNMENT


@flax.struct.dataclass
class DecodeState:
  """All decoding state, fixed-size (gemma's ``SamplingState`` pattern).

  Attributes:
    tokens: ``i32[B, P + N]`` prompt then emitted tokens.
    prompt_len: ``i32[B]`` true prompt lengths.
    seq_len: ``i32[B]`` prompt plus emitted tokens.
    target_cache: the target's ragged cache. proposer_state: the proposer's (None for regular decoding).
    features: ``[B, P + N, E]`` the target's feature at each text position it has scored (in its
      compute dtype), or None unless ``spec.keeps_features``.
    logprobs: ``f32[B, N]`` target log-probability (temperature 1, no top-p) of each emitted token.
    done: ``bool[B]`` row finished (EOS or ``max_new`` tokens, or a padding row); its outputs are frozen.
    eos: ``bool[B]`` row finished by emitting an EOS token.
    max_new: ``i32[]`` tokens a row may emit (``<= N``).
    eos_ids: ``i32[E]`` tokens that end a row, padded with -1 (never a token).
    step: ``i32[]`` steps taken.
    draft_len: ``i32[]`` l_draft of the next step (0: a plain step). policy_state: the draft-length
      policy's state (``bass_jax.sampling.draft_len``).
    draft_len_history: ``i32[N]`` l_draft of each step (0 for plain steps and past ``step``).
    drafted_history: ``i32[N, B]`` drafts proposed per row per step (0 past ``step``).
    verified_history: ``i32[N]`` positions the target scored per row in each step, padding of the last
      chunk included (0 past ``step``).
    accepted_history: ``i32[N, B]`` accepted drafts per row per step (bonus/correction not counted; -1
      for a row that was already done, and past ``step``).
    key: PRNG key.
  """

  tokens: jax.Array
  prompt_len: jax.Array
  seq_len: jax.Array
  target_cache: KVCache
  proposer_state: Any
  features: jax.Array | None
  logprobs: jax.Array
  done: jax.Array
  eos: jax.Array
  max_new: jax.Array
  eos_ids: jax.Array
  step: jax.Array
  draft_len: jax.Array
  policy_state: Any
  draft_len_history: jax.Array
  drafted_history: jax.Array
  verified_history: jax.Array
  accepted_history: jax.Array
  key: jax.Array


def _target_forward(spec: DecodeSpec, params: Any, tokens: jax.Array, cache: KVCache,
                    features: jax.Array | None):
  """The target's forward over ``tokens: i32[B, T]``; with a feature buffer, also writes the tokens'
  features at their positions (``cache.lengths[b] + t``). Returns ``(logits, cache, features)``."""
  if features is None:
    logits, cache_out = forward(spec.target, params, tokens, cache, dtype=spec.target_dtype,
                                attention_impl=spec.attention_impl, sharding=spec.target_sharding)
    return logits, cache_out, None
  logits, cache_out, new = forward(spec.target, params, tokens, cache, dtype=spec.target_dtype,
                                   attention_impl=spec.attention_impl, return_features=True,
                                   sharding=spec.target_sharding)
  rows = jnp.arange(tokens.shape[0])[:, None]
  pos = cache.lengths[:, None] + jnp.arange(tokens.shape[1])
  return logits, cache_out, features.at[rows, pos].set(new.astype(features.dtype), mode="drop")


def prefill(spec: DecodeSpec, target_params: Any, draft_params: Any, prompts: jax.Array,
            prompt_len: jax.Array, inert: jax.Array, max_new: jax.Array, eos_ids: jax.Array,
            key: jax.Array, step_costs: jax.Array) -> DecodeState:
  """Fills the target's cache (and the proposer's state) with every prompt token but the last, which
  the first step consumes.

  Args:
    draft_params: the proposer's weights (None for a model-free proposer or regular decoding).
    prompts: ``i32[B, P]`` right-padded prompts. prompt_len: ``i32[B]``, each ``>= 1``.
    inert: ``bool[B]`` padding rows of the batch bucket: done from the start, they never emit.
    max_new: ``i32[]`` tokens per row at most (``<= spec.max_new_bucket``).
    eos_ids: ``i32[E]`` EOS ids padded with -1.
    key: PRNG key for the whole decode.
    step_costs: ``f32[5]`` :meth:`StepCosts.as_array` for a cost-aware policy (ignored by others).
  """
  batch = prompts.shape[0]
  n = spec.max_new_bucket

  prefilled = prefill_cache(spec.target, target_params, prompts, prompt_len,
                            cache_len=spec.cache_len, dtype=spec.target_dtype,
                            attention_impl=spec.attention_impl,
                            return_features=spec.keeps_features, sharding=spec.target_sharding)
  target_cache, prompt_features, features = prefilled, None, None
  if spec.keeps_features:
    target_cache, prompt_features = prefilled
    features = jnp.zeros((batch, prompts.shape[1] + n, prompt_features.shape[-1]),
                         prompt_features.dtype).at[:, :prompts.shape[1]].set(prompt_features)
  proposer_state, policy_state = None, None
  l0 = 0
  if spec.method == "bass":
    proposer_state = spec.proposer.init_state(draft_params, prompts, prompt_len,
                                              cache_len=spec.cache_len, max_len=spec.max_draft,
                                              features=prompt_features)
    l0, policy_state = spec.draft_len.start(step_costs)
  return DecodeState(
      tokens=jnp.concatenate([prompts, jnp.zeros((batch, n), jnp.int32)], axis=1),
      prompt_len=prompt_len,
      seq_len=prompt_len,
      target_cache=target_cache,
      proposer_state=proposer_state,
      features=features,
      logprobs=jnp.zeros((batch, n), jnp.float32),
      done=inert,
      eos=jnp.zeros((batch,), bool),
      max_new=max_new,
      eos_ids=eos_ids,
      step=jnp.zeros((), jnp.int32),
      draft_len=jnp.asarray(l0, jnp.int32),
      policy_state=policy_state,
      draft_len_history=jnp.zeros((n,), jnp.int32),
      drafted_history=jnp.zeros((n, batch), jnp.int32),
      verified_history=jnp.zeros((n,), jnp.int32),
      accepted_history=jnp.full((n, batch), -1, jnp.int32),
      key=key,
  )


def state_shardings(spec: DecodeSpec, state: DecodeState) -> DecodeState:
  """Where every part of the decode state lies on ``spec.target_sharding``'s mesh: per-row arrays split
  over ``"data"``; the target's cache as its plan says, the proposer's as the proposer's plan says
  (the target's when it has none); counters, histories and the key replicated.

  Args:
    state: a :class:`DecodeState` of arrays or ``ShapeDtypeStruct`` (``jax.eval_shape`` of
      :func:`prefill`).

  Returns:
    A :class:`DecodeState` of ``NamedSharding`` (the jitted programs' output shardings).
  """
  plan = spec.target_sharding
  batch = state.tokens.shape[0]
  rows, replicated = plan.rows, plan.replicate
  every = lambda tree: jax.tree_util.tree_map(lambda _: replicated, tree)
  proposer_state = None
  if state.proposer_state is not None:
    proposer_state = sharding_lib.state_shardings(
        state.proposer_state, spec.proposer.sharding or plan, batch)
  return DecodeState(
      tokens=rows, prompt_len=rows, seq_len=rows,
      target_cache=sharding_lib.state_shardings(state.target_cache, plan, batch),
      proposer_state=proposer_state, features=None if state.features is None else rows,
      logprobs=rows, done=rows, eos=rows, max_new=replicated, eos_ids=replicated, step=replicated,
      draft_len=replicated, policy_state=every(state.policy_state),
      draft_len_history=replicated, drafted_history=replicated, verified_history=replicated,
      accepted_history=replicated, key=replicated)


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

  is_eos = (slots < count[:, None]) & jnp.isin(new_tokens, state.eos_ids)
  has_eos = jnp.any(is_eos, axis=1)
  first_eos = jnp.argmax(is_eos, axis=1)
  count = jnp.where(has_eos, first_eos + 1, count)
  count = jnp.where(live, jnp.minimum(count, state.max_new - generated), 0)

  write = slots < count[:, None]
  out_of_range = state.tokens.shape[1]  # dropped by the scatter
  pos = jnp.where(write, state.seq_len[:, None] + slots, out_of_range)
  tokens = state.tokens.at[rows, pos].set(new_tokens, mode="drop")
  lp_pos = jnp.where(write, generated[:, None] + slots, out_of_range)
  logprobs = state.logprobs.at[rows, lp_pos].set(new_logprobs, mode="drop")

  seq_len = state.seq_len + count
  eos = state.eos | (live & has_eos & (first_eos < count))
  done = state.done | eos | (seq_len - state.prompt_len >= state.max_new)
  return state.replace(tokens=tokens, logprobs=logprobs, seq_len=seq_len, eos=eos, done=done)


def _regular_step(spec: DecodeSpec, target_params, temperature, top_p,
                  state: DecodeState) -> DecodeState:
  """One token per live row from the target alone: the optimized baseline, and BASS's plain step."""
  batch = state.tokens.shape[0]
  rows = jnp.arange(batch)
  key, sample_key = jax.random.split(state.key)
  last = state.tokens[rows, state.seq_len - 1][:, None]
  logits, cache, features = _target_forward(spec, target_params, last, state.target_cache,
                                            state.features)
  logits = logits[:, 0]
  token, _ = sample(logits, sample_key, greedy=spec.greedy, temperature=temperature, top_p=top_p)
  logprob = jax.nn.log_softmax(logits, axis=-1)[rows, token]
  state = _emit(state, token[:, None], logprob[:, None], jnp.ones((batch,), jnp.int32))
  return state.replace(target_cache=cache.with_lengths(state.seq_len - 1), features=features,
                       step=state.step + 1, key=key)


def _plain_step(spec: DecodeSpec, target_params, temperature, top_p,
                state: DecodeState) -> DecodeState:
  """A BASS step without drafts: regular decoding's step, recorded in the histories, and the policy
  told (its state decays)."""
  live = ~state.done
  old_step = state.step
  state = _regular_step(spec, target_params, temperature, top_p, state)
  next_len, policy_state = spec.draft_len.after_plain_step(state.policy_state, state.draft_len)
  return state.replace(
      draft_len=jnp.asarray(next_len, jnp.int32),
      policy_state=policy_state,
      verified_history=state.verified_history.at[old_step].set(1),
      accepted_history=state.accepted_history.at[old_step].set(jnp.where(live, 0, -1)),
  )


def _verify_chunk(spec: DecodeSpec, target_params, temperature, top_p, inputs, draft_log_probs,
                  cache: KVCache, features, start, num_drafts, key):
  """Scores ``inputs[:, start:start + C]`` with the target and accepts over those positions.

  Returns:
    ``(matched i32[B], next_token i32[B], logprobs f32[B, C, 2], cache)``: see
    :func:`acceptance.greedy_accept_chunk`; ``logprobs[..., 0]`` is the target's raw log-probability of
    each position's draft and ``[..., 1]`` of its argmax/drawn token (for the emitted log-probs); the
    cache holds the chunk's K/V, its lengths advanced by C; the feature buffer (or None) the chunk's
    features.
  """
  chunk = spec.verify_chunk
  tokens = jax.lax.dynamic_slice_in_dim(inputs, start, chunk, axis=1)
  next_drafts = jax.lax.dynamic_slice_in_dim(inputs, start + 1, chunk, axis=1)
  positions = start + jnp.arange(chunk, dtype=jnp.int32)
  logits, cache, features = _target_forward(spec, target_params, tokens, cache, features)
  if spec.greedy:
    matched, next_token = acceptance.greedy_accept_chunk(logits, next_drafts, positions, num_drafts)
  else:
    log_q = (None if draft_log_probs is None
             else jax.lax.dynamic_slice_in_dim(draft_log_probs, start, chunk, axis=1))
    matched, next_token = acceptance.speculative_accept_chunk(
        key, warped_log_probs(logits, temperature, top_p), log_q, next_drafts, positions, num_drafts)
  raw = jax.nn.log_softmax(logits, axis=-1)
  of_draft = jnp.take_along_axis(raw, next_drafts[..., None], axis=-1)[..., 0]
  of_next = jnp.take_along_axis(raw, jnp.broadcast_to(next_token[:, None, None], raw.shape[:2] + (1,)),
                                axis=-1)[..., 0]
  return matched, next_token, jnp.stack([of_draft, of_next], axis=-1), cache, features


def _verify(spec: DecodeSpec, target_params, temperature, top_p, state: DecodeState, drafts,
            num_drafts, draft_log_probs, key):
  """Scores ``[last emitted, d_1 … d_l]`` in chunks of C positions and accepts per row, chunk by chunk.

  ``num_drafts: i32[B]`` real drafts per row (a row with 0 takes the target's token at its first
  position: a plain decoding step inside the verification); ``draft_log_probs`` None means one-hot
  ``q`` (a deterministic proposer) or greedy decoding.

  Each pass writes its chunk's K/V into the target cache and attends; the loop stops once every live
  row's acceptance has ended (or all ``l + 1`` positions are scored).

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
  score = functools.partial(_verify_chunk, spec, target_params, temperature, top_p)

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
  verified, cache, features, accepted, _, next_token, logprobs = jax.lax.while_loop(cond, body, init)
  emitted = jnp.concatenate([drafts, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  emitted = emitted.at[rows, accepted].set(next_token)
  return accepted, emitted, logprobs[:, :max_draft + 1], cache, features, verified


def _bass_step(spec: DecodeSpec, target_params, draft_params, temperature, top_p,
               state: DecodeState) -> DecodeState:
  """One BASS step for the whole batch (paper §3; docs/bass.md): propose, verify, accept, advance,
  roll the proposer back, adapt l_draft."""
  key, draft_key, accept_key = jax.random.split(state.key, 3)
  live = ~state.done
  draft_len = state.draft_len
  ctx = _context(state, draft_key, temperature, top_p)
  proposer_state, proposal = spec.proposer.propose(
      draft_params, state.proposer_state, ctx, max_len=spec.max_draft, chunk=spec.verify_chunk,
      greedy=spec.greedy)
  num_drafts = jnp.where(live, proposal.num_drafts, 0)
  accepted, emitted, emitted_logprobs, target_cache, features, verified = _verify(
      spec, target_params, temperature, top_p, state, proposal.drafts, num_drafts, proposal.log_q,
      accept_key)

  old_seq_len = state.seq_len
  state = _emit(state, emitted, emitted_logprobs, accepted + 1)
  # Rejected drafts are dropped by resetting lengths; their K/V stay in place, masked, to be
  # overwritten.
  target_cache = target_cache.with_lengths(state.seq_len - 1)
  proposer_state = spec.proposer.rollback(proposer_state, state.tokens, old_seq_len, state.seq_len)
  next_len, policy_state = spec.draft_len.after_step(state.policy_state, draft_len, num_drafts,
                                                     accepted, live)
  return state.replace(
      target_cache=target_cache,
      proposer_state=proposer_state,
      features=features,
      step=state.step + 1,
      draft_len=jnp.asarray(next_len, jnp.int32),
      policy_state=policy_state,
      draft_len_history=state.draft_len_history.at[state.step].set(draft_len),
      drafted_history=state.drafted_history.at[state.step].set(num_drafts),
      verified_history=state.verified_history.at[state.step].set(verified),
      accepted_history=state.accepted_history.at[state.step].set(jnp.where(live, accepted, -1)),
      key=key,
  )


def _context(state: DecodeState, key, temperature, top_p) -> StepContext:
  return StepContext(tokens=state.tokens, seq_len=state.seq_len, live=~state.done,
                     draft_len=state.draft_len, key=key, temperature=temperature, top_p=top_p,
                     features=state.features)


def decode(spec: DecodeSpec, state: DecodeState, target_params: Any, draft_params: Any,
           temperature: jax.Array, top_p: jax.Array) -> DecodeState:
  """Runs steps in one ``lax.while_loop`` until at least one more row finishes (or all are done).

  Stopping at every finish lets the host time each row's completion (per-sequence latency, paper
  §4.1) with at most B returns per batch and no host round trip per step; calling it until ``all(done)``
  decodes the whole batch.

  Args:
    temperature: ``f32[]``, > 0 unless ``spec.greedy``. top_p: ``f32[]`` in ``(0, 1]``.
  """
  done_at_entry = jnp.sum(state.done)

  def running(s: DecodeState):
    return (s.step < s.max_new) & (jnp.sum(s.done) == done_at_entry) & ~jnp.all(s.done)

  if spec.method == "regular":
    return jax.lax.while_loop(
        running, functools.partial(_regular_step, spec, target_params, temperature, top_p), state)

  bass = functools.partial(_bass_step, spec, target_params, draft_params, temperature, top_p)
  if spec.proposer.always_proposes and not spec.draft_len.may_choose_zero:
    return jax.lax.while_loop(running, bass, state)  # no plain step can occur: none is compiled

  def speculate(s: DecodeState):
    ctx = _context(s, s.key, temperature, top_p)
    return (s.draft_len > 0) & spec.proposer.can_propose(ctx)

  plain = functools.partial(_plain_step, spec, target_params, temperature, top_p)

  def body(s: DecodeState):
    # Plain steps while speculation is off, then speculative steps while it is on: two loops rather than
    # a cond, so that both update the caches in place (module docstring).
    s = jax.lax.while_loop(lambda s: running(s) & ~speculate(s), plain, s)
    return jax.lax.while_loop(lambda s: running(s) & speculate(s), bass, s)

  return jax.lax.while_loop(running, body, state)
