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
* The draft cache holds K/V of ``tokens[b, :draft_len_b]`` with ``draft_len_b`` = ``seq_len - 1`` or,
  after a step that accepted every draft, ``seq_len - 2`` (the last draft was never fed to the draft).
  Its next step starts with a two-token catch-up forward that covers both cases.

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

from bass_jax.cache import KVCache
from bass_jax.models.attention import CACHE_ALIGNMENT
from bass_jax.models.common import DecoderConfig
from bass_jax.sampling import acceptance
from bass_jax.sampling.draft_len import DraftLenPolicy
from bass_jax.sampling.warp import warped_log_probs


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Everything static about a decode (a new value compiles a new program).

  Attributes:
    method: ``"bass"`` or ``"regular"``.
    target: target architecture. draft: draft architecture (None for ``regular``).
    target_dtype, draft_dtype: parameter/compute dtype names (``"float32"``, ``"bfloat16"``).
    attention_impl: name in the attention registry, used by both models.
    prompt_len: P, prompts are right-padded to it.
    max_new_bucket: N, the size of the output buffer (the true limit is ``DecodeState.max_new``).
    greedy: temperature 0 (argmax draft and verification).
    draft_len: the draft-length policy (fixed or Algorithm 1).
    verify_chunk: C, the positions one verification forward scores; ``l + 1`` positions take
      ``ceil((l + 1) / C)`` passes at most.
  """

  method: str
  target: DecoderConfig
  draft: DecoderConfig | None
  target_dtype: str
  draft_dtype: str
  attention_impl: str
  prompt_len: int
  max_new_bucket: int
  greedy: bool
  draft_len: DraftLenPolicy | None
  verify_chunk: int

  @property
  def max_draft(self) -> int:
    return self.draft_len.max_len if self.method == "bass" else 0

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
    target_cache, draft_cache: ragged caches (``draft_cache`` is None for regular decoding).
    logprobs: ``f32[B, N]`` target log-probability (temperature 1, no top-p) of each emitted token.
    done: ``bool[B]`` row finished (EOS or ``max_new`` tokens, or a padding row); its outputs are frozen.
    eos: ``bool[B]`` row finished by emitting an EOS token.
    max_new: ``i32[]`` tokens a row may emit (``<= N``).
    eos_ids: ``i32[E]`` tokens that end a row, padded with -1 (never a token).
    step: ``i32[]`` steps taken.
    draft_len: ``i32[]`` l_draft of the next step. heuristic_s: ``i32[]`` Algorithm 1's ``s``.
    draft_len_history: ``i32[N]`` l_draft of each step (0 past ``step``).
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
  draft_cache: KVCache | None
  logprobs: jax.Array
  done: jax.Array
  eos: jax.Array
  max_new: jax.Array
  eos_ids: jax.Array
  step: jax.Array
  draft_len: jax.Array
  heuristic_s: jax.Array
  draft_len_history: jax.Array
  verified_history: jax.Array
  accepted_history: jax.Array
  key: jax.Array


def _forward(config: DecoderConfig, dtype: str, attention_impl: str, params: Any, tokens: jax.Array,
             cache: KVCache | None, compute_logits: bool = True):
  """``(logits | None, cache)`` of ``tokens`` written into and attended over ``cache``; without a cache,
  ``(logits | None, KVUpdate)``."""
  module = config.make_module(attention_impl=attention_impl, dtype=jnp.dtype(dtype))
  return module.apply({"params": params}, tokens, cache, compute_logits)


def prefill(spec: DecodeSpec, target_params: Any, draft_params: Any, prompts: jax.Array,
            prompt_len: jax.Array, inert: jax.Array, max_new: jax.Array, eos_ids: jax.Array,
            key: jax.Array) -> DecodeState:
  """Fills both caches with every prompt token but the last, which the first step consumes.

  Args:
    prompts: ``i32[B, P]`` right-padded prompts. prompt_len: ``i32[B]``, each ``>= 1``.
    inert: ``bool[B]`` padding rows of the batch bucket: done from the start, they never emit.
    max_new: ``i32[]`` tokens per row at most (``<= spec.max_new_bucket``).
    eos_ids: ``i32[E]`` EOS ids padded with -1.
    key: PRNG key for the whole decode.
  """
  batch = prompts.shape[0]
  n = spec.max_new_bucket

  def fill(config, dtype, params):
    cache = config.init_cache(batch, spec.cache_len, jnp.dtype(dtype))
    _, update = _forward(config, dtype, spec.attention_impl, params, prompts, None,
                         compute_logits=False)
    return cache.append(update).with_lengths(prompt_len - 1)

  draft_cache = None
  if spec.method == "bass":
    draft_cache = fill(spec.draft, spec.draft_dtype, draft_params)
  l0, s0 = spec.draft_len.initial() if spec.method == "bass" else (0, 0)
  return DecodeState(
      tokens=jnp.concatenate([prompts, jnp.zeros((batch, n), jnp.int32)], axis=1),
      prompt_len=prompt_len,
      seq_len=prompt_len,
      target_cache=fill(spec.target, spec.target_dtype, target_params),
      draft_cache=draft_cache,
      logprobs=jnp.zeros((batch, n), jnp.float32),
      done=inert,
      eos=jnp.zeros((batch,), bool),
      max_new=max_new,
      eos_ids=eos_ids,
      step=jnp.zeros((), jnp.int32),
      draft_len=jnp.asarray(l0, jnp.int32),
      heuristic_s=jnp.asarray(s0, jnp.int32),
      draft_len_history=jnp.zeros((n,), jnp.int32),
      verified_history=jnp.zeros((n,), jnp.int32),
      accepted_history=jnp.full((n, batch), -1, jnp.int32),
      key=key,
  )


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


def _sample(logits: jax.Array, key: jax.Array, temperature, top_p, spec: DecodeSpec):
  """Samples ``i32[B]`` from ``logits: f32[B, V]``; also returns the warped log-probs (None if greedy)."""
  if spec.greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
  log_probs = warped_log_probs(logits, temperature, top_p)
  return jax.random.categorical(key, log_probs, axis=-1).astype(jnp.int32), log_probs


def _regular_step(spec: DecodeSpec, target_params, temperature, top_p,
                  state: DecodeState) -> DecodeState:
  """One token per live row from the target alone: the optimized baseline."""
  batch = state.tokens.shape[0]
  rows = jnp.arange(batch)
  key, sample_key = jax.random.split(state.key)
  last = state.tokens[rows, state.seq_len - 1][:, None]
  logits, cache = _forward(spec.target, spec.target_dtype, spec.attention_impl, target_params, last,
                           state.target_cache)
  logits = logits[:, 0]
  token, _ = _sample(logits, sample_key, temperature, top_p, spec)
  logprob = jax.nn.log_softmax(logits, axis=-1)[rows, token]
  state = _emit(state, token[:, None], logprob[:, None], jnp.ones((batch,), jnp.int32))
  return state.replace(target_cache=cache.with_lengths(state.seq_len - 1), step=state.step + 1,
                       key=key)


def _draft(spec: DecodeSpec, draft_params, temperature, top_p, state: DecodeState, key):
  """Proposes ``state.draft_len`` tokens per row, autoregressively and batched.

  Returns:
    ``(draft_cache, drafts: i32[B, L], draft_log_probs: f32[B, L + C_max, V] | None)``; slots at and
    past ``draft_len`` hold zeros (the log-probs are padded by the largest verification chunk, so that
    a chunk's slice never runs off the end).
  """
  batch = state.tokens.shape[0]
  rows = jnp.arange(batch)
  max_draft = spec.max_draft
  forward = functools.partial(_forward, spec.draft, spec.draft_dtype, spec.attention_impl,
                              draft_params)

  # Catch up on the 1 or 2 emitted tokens the draft has not seen; the first proposal comes from the
  # logits of the last one. With 1 pending token the second input is a stale slot whose K/V lands past
  # the row's length and is overwritten by the first draft.
  cache = state.draft_cache
  pending = state.seq_len - cache.lengths  # 1 or 2
  catch_up = state.tokens[rows[:, None], jnp.minimum(cache.lengths[:, None] + jnp.arange(2),
                                                     state.tokens.shape[1] - 1)]
  logits, cache = forward(catch_up, cache)
  cache = cache.with_lengths(state.seq_len)
  token, log_q = _sample(logits[rows, pending - 1], jax.random.fold_in(key, 0), temperature, top_p,
                         spec)

  drafts = jnp.zeros((batch, max_draft), jnp.int32).at[:, 0].set(token)
  draft_log_probs = None
  if not spec.greedy:
    draft_log_probs = jnp.zeros((batch, max_draft + spec.verify_chunk, spec.draft.vocab_size),
                                jnp.float32)
    draft_log_probs = draft_log_probs.at[:, 0].set(log_q)

  def body(i, carry):
    cache, drafts, draft_log_probs = carry
    logits, cache = forward(jax.lax.dynamic_slice_in_dim(drafts, i - 1, 1, axis=1), cache)
    token, log_q = _sample(logits[:, 0], jax.random.fold_in(key, i), temperature, top_p, spec)
    drafts = jax.lax.dynamic_update_slice_in_dim(drafts, token[:, None], i, axis=1)
    if draft_log_probs is not None:
      draft_log_probs = jax.lax.dynamic_update_slice_in_dim(draft_log_probs, log_q[:, None], i, axis=1)
    return cache, drafts, draft_log_probs

  return jax.lax.fori_loop(1, state.draft_len, body, (cache, drafts, draft_log_probs))


def _verify_chunk(spec: DecodeSpec, target_params, temperature, top_p, inputs, draft_log_probs,
                  cache: KVCache, start, num_drafts, key):
  """Scores ``inputs[:, start:start + C]`` with the target and accepts over those positions.

  Returns:
    ``(matched i32[B], next_token i32[B], logprobs f32[B, C, 2], cache)``: see
    :func:`acceptance.greedy_accept_chunk`; ``logprobs[..., 0]`` is the target's raw log-probability of
    each position's draft and ``[..., 1]`` of its argmax/drawn token (for the emitted log-probs); the
    cache holds the chunk's K/V, its lengths advanced by C.
  """
  chunk = spec.verify_chunk
  tokens = jax.lax.dynamic_slice_in_dim(inputs, start, chunk, axis=1)
  next_drafts = jax.lax.dynamic_slice_in_dim(inputs, start + 1, chunk, axis=1)
  positions = start + jnp.arange(chunk, dtype=jnp.int32)
  logits, cache = _forward(spec.target, spec.target_dtype, spec.attention_impl, target_params,
                           tokens, cache)
  if spec.greedy:
    matched, next_token = acceptance.greedy_accept_chunk(logits, next_drafts, positions, num_drafts)
  else:
    log_q = jax.lax.dynamic_slice_in_dim(draft_log_probs, start, chunk, axis=1)
    matched, next_token = acceptance.speculative_accept_chunk(
        key, warped_log_probs(logits, temperature, top_p), log_q, next_drafts, positions, num_drafts)
  raw = jax.nn.log_softmax(logits, axis=-1)
  of_draft = jnp.take_along_axis(raw, next_drafts[..., None], axis=-1)[..., 0]
  of_next = jnp.take_along_axis(raw, jnp.broadcast_to(next_token[:, None, None], raw.shape[:2] + (1,)),
                                axis=-1)[..., 0]
  return matched, next_token, jnp.stack([of_draft, of_next], axis=-1), cache


def _verify(spec: DecodeSpec, target_params, temperature, top_p, state: DecodeState, drafts,
            draft_log_probs, key):
  """Scores ``[last emitted, d_1 … d_l]`` in chunks of C positions and accepts per row, chunk by chunk.

  Each pass writes its chunk's K/V into the target cache and attends; the loop stops once every live
  row's acceptance has ended (or all ``l + 1`` positions are scored).

  Returns:
    ``(num_accepted: i32[B], emitted: i32[B, L + 1], emitted_logprobs: f32[B, L + 1], target_cache,
    verified: i32[])`` where row b emits ``emitted[b, :num_accepted[b] + 1]``, the cache holds the
    scored positions' K/V (the caller resets its lengths), and ``verified`` counts the positions scored
    per row, padding included.
  """
  batch, max_draft = drafts.shape
  rows = jnp.arange(batch)
  num_drafts = state.draft_len
  chunk = spec.verify_chunk
  last = state.tokens[rows, state.seq_len - 1]
  # [last, d_1 … d_L, padding]: position i's input is inputs[i], its draft to check inputs[i + 1].
  inputs = jnp.concatenate([last[:, None], drafts, jnp.zeros((batch, chunk), jnp.int32)], axis=1)
  score = functools.partial(_verify_chunk, spec, target_params, temperature, top_p)

  def cond(carry):
    start, _, _, open_rows, _, _ = carry
    return (start <= num_drafts) & jnp.any(open_rows)

  def body(carry):
    start, cache, accepted, open_rows, next_token, logprobs = carry
    # The same key for every chunk: acceptance draws are keyed by position, not by chunk.
    matched, chunk_next, chunk_lp, cache = score(inputs, draft_log_probs, cache, start, num_drafts,
                                                 key)
    closes = open_rows & (matched < chunk)
    # Emitted log-probs: the draft's below the row's first mismatch in this chunk, the next token's at it.
    slots = jnp.arange(chunk)[None, :]
    values = jnp.where(slots < matched[:, None], chunk_lp[..., 0], chunk_lp[..., 1])
    window = jax.lax.dynamic_slice_in_dim(logprobs, start, chunk, axis=1)
    logprobs = jax.lax.dynamic_update_slice_in_dim(
        logprobs, jnp.where(open_rows[:, None], values, window), start, axis=1)
    accepted = jnp.where(open_rows, accepted + matched, accepted)
    next_token = jnp.where(closes, chunk_next, next_token)
    return start + chunk, cache, accepted, open_rows & ~closes, next_token, logprobs

  init = (jnp.zeros((), jnp.int32), state.target_cache, jnp.zeros((batch,), jnp.int32), ~state.done,
          jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, max_draft + 1 + chunk), jnp.float32))
  verified, cache, accepted, _, next_token, logprobs = jax.lax.while_loop(cond, body, init)
  emitted = jnp.concatenate([drafts, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  emitted = emitted.at[rows, accepted].set(next_token)
  return accepted, emitted, logprobs[:, :max_draft + 1], cache, verified


def _bass_step(spec: DecodeSpec, target_params, draft_params, temperature, top_p,
               state: DecodeState) -> DecodeState:
  """One BASS step for the whole batch (paper §3; docs/bass.md): draft, verify, accept, advance,
  adapt l_draft."""
  key, draft_key, accept_key = jax.random.split(state.key, 3)
  live = ~state.done
  draft_len = state.draft_len
  draft_cache, drafts, draft_log_probs = _draft(spec, draft_params, temperature, top_p, state,
                                                draft_key)
  accepted, emitted, emitted_logprobs, target_cache, verified = _verify(
      spec, target_params, temperature, top_p, state, drafts, draft_log_probs, accept_key)

  old_seq_len = state.seq_len
  state = _emit(state, emitted, emitted_logprobs, accepted + 1)
  # Rejected drafts are dropped by resetting lengths; their K/V stay in place, masked, to be
  # overwritten. The draft never saw its own last proposal, hence min(accepted, l_draft - 1).
  target_cache = target_cache.with_lengths(state.seq_len - 1)
  draft_cache = draft_cache.with_lengths(old_seq_len + jnp.minimum(accepted, draft_len - 1))

  max_accepted = jnp.max(jnp.where(live, accepted, 0))
  next_len, next_s = spec.draft_len.update(draft_len, state.heuristic_s, max_accepted)
  return state.replace(
      target_cache=target_cache,
      draft_cache=draft_cache,
      step=state.step + 1,
      draft_len=jnp.asarray(next_len, jnp.int32),
      heuristic_s=jnp.asarray(next_s, jnp.int32),
      draft_len_history=state.draft_len_history.at[state.step].set(draft_len),
      verified_history=state.verified_history.at[state.step].set(verified),
      accepted_history=state.accepted_history.at[state.step].set(jnp.where(live, accepted, -1)),
      key=key,
  )


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
  if spec.method == "bass":
    step = functools.partial(_bass_step, spec, target_params, draft_params, temperature, top_p)
  else:
    step = functools.partial(_regular_step, spec, target_params, temperature, top_p)

  def cond(s: DecodeState):
    return (s.step < s.max_new) & (jnp.sum(s.done) == done_at_entry) & ~jnp.all(s.done)

  return jax.lax.while_loop(cond, step, state)
