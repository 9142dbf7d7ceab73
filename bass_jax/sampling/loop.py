"""The jitted decode: prefill, then one ``lax.while_loop`` of regular or BASS steps over a batch of rows,
refilled from a queue of waiting prompts when the batch is continuous.

Implements BASS (paper §3; docs/bass.md): one step (draft, verify, accept, advance) and the draft length
for B rows at once, every row with its own length. Shapes are static: the batch, the prompt length and
the output buffer are padded to buckets (``bass_jax.sampling.generate``), the cache has
``S >= P + N + L + 1`` slots (P the padded prompt length, N the output bucket, L the maximum draft
length), and rows that finish keep riding along, frozen. The true ``max_new_tokens`` and the EOS ids are
traced values, so calls that differ only in them share a program. Nothing here talks to the host.

Continuous batching (``DecodeSpec.queue_len > 0``): a row that finishes retires its output into the
:class:`Queue` and takes the next waiting prompt, all inside the loop (:func:`decode`, :func:`_admit`):
a chunked one-row prefill written into that row's cache slots, the proposer's state restarted for the
row, the batch's draft-length policy kept.

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
from bass_jax.cache import KVCache, write_row
from bass_jax.models.attention import CACHE_ALIGNMENT
from bass_jax.models.common import DecoderConfig, forward, prefill_cache
from bass_jax.sampling import acceptance
from bass_jax.sampling.draft_len import DraftLenPolicy
from bass_jax.sampling.proposers import Proposer, StepContext
from bass_jax.sampling.warp import coupled_choice, sample, warped_log_probs


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
    queue_len: Q, the prompts of a continuous batch's queue (:class:`Queue`, padded); 0 for a static
      batch, which decodes the rows it starts with and nothing else.
    history_len: H, the steps the per-step histories hold; 0 means N (a static batch takes at most N
      steps: every live row emits at least one token per step).
    acceptance: ``"rejection"`` (speculative rejection sampling, Leviathan et al. 2023) or ``"gumbel"``
      (drafter-invariant: every token is the target's Gumbel-max draw with per-sequence, per-position
      noise, ``acceptance.coupled_accept_chunk``). Greedy decoding ignores it.
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
  queue_len: int = 0
  history_len: int = 0
  acceptance: str = "rejection"

  @property
  def coupled(self) -> bool:
    """Whether sampled tokens are Gumbel-max draws keyed by (sequence, text position)."""
    return self.acceptance == "gumbel" and not self.greedy

  @property
  def continuous(self) -> bool:
    """Whether finished rows take the next waiting prompt (continuous batching)."""
    return self.queue_len > 0

  @property
  def max_steps(self) -> int:
    """H, the length of the per-step histories."""
    return self.history_len or self.max_new_bucket

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
class Queue:
  """Continuous batching's device-side queue: the prompts waiting for a row, which prompt each row
  serves, and the outputs of the prompts that finished (Orca's iteration-level scheduling, Yu et al.
  2022, inside the jitted loop: no host round trip per refill).

  Attributes:
    prompts: ``i32[Q, P]`` right-padded prompts in input order (rows past ``size`` are padding of the
      queue bucket, never admitted). prompt_len: ``i32[Q]``.
    size: ``i32[]`` the real prompts. next: ``i32[]`` the first prompt not yet admitted.
    slot: ``bool[B]`` rows that take prompts (False for the batch bucket's inert padding rows).
    row_prompt: ``i32[B]`` the prompt each row serves, -1 for none.
    prompt_row: ``i32[Q]`` the row each admitted prompt ran in (-1 before admission).
    start_step: ``i32[Q]`` ``DecodeState.step`` when the prompt was admitted: its steps in its row's
      histories start there and end where the row's next prompt starts.
    tokens: ``i32[Q, N]`` each retired prompt's output (valid below ``lengths``).
    logprobs: ``f32[Q, N]`` their target log-probabilities (``DecodeState.logprobs``).
    lengths: ``i32[Q]`` tokens emitted. eos: ``bool[Q]`` ended by an EOS token.
    keys: ``u32[Q, 2]`` each prompt's sequence key data (``DecodeSpec.coupled``), else None.
  """

  prompts: jax.Array
  prompt_len: jax.Array
  size: jax.Array
  next: jax.Array
  slot: jax.Array
  row_prompt: jax.Array
  prompt_row: jax.Array
  start_step: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  eos: jax.Array
  keys: jax.Array | None = None

  def pending(self) -> jax.Array:
    """``bool[]``: a prompt is waiting or a row still serves one (decoding, or done and not retired)."""
    return jnp.any(self.row_prompt >= 0) | (self.next < self.size)


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
    step_limit: ``i32[]`` steps the decode may take (``<= H``): ``max_new`` for a static batch; for a
      continuous one ``ceil(prompts * max_new / slots) + max_new`` (while prompts wait every slot is
      live and emits a token per step, then every row drains within ``max_new`` steps).
    eos_ids: ``i32[E]`` tokens that end a row, padded with -1 (never a token).
    step: ``i32[]`` steps taken.
    draft_len: ``i32[]`` l_draft of the next step (0: a plain step). policy_state: the draft-length
      policy's state (``bass_jax.sampling.draft_len``).
    draft_len_history: ``i32[H]`` l_draft of each step (0 for plain steps and past ``step``).
    drafted_history: ``i32[H, B]`` drafts proposed per row per step (0 past ``step``).
    verified_history: ``i32[H]`` positions the target scored per row in each step, padding of the last
      chunk included (0 past ``step``).
    accepted_history: ``i32[H, B]`` accepted drafts per row per step (bonus/correction not counted; -1
      for a row that was already done, and past ``step``).
    key: PRNG key.
    queue: the continuous batch's :class:`Queue`, or None for a static batch.
    row_keys: ``u32[B, 2]`` the sequence key data of each row's prompt (``DecodeSpec.coupled``: its
      noise, ``warp.gumbel_noise``), else None.
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
  step_limit: jax.Array
  eos_ids: jax.Array
  step: jax.Array
  draft_len: jax.Array
  policy_state: Any
  draft_len_history: jax.Array
  drafted_history: jax.Array
  verified_history: jax.Array
  accepted_history: jax.Array
  key: jax.Array
  queue: Queue | None = None
  row_keys: jax.Array | None = None


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
            prompt_len: jax.Array, inert: jax.Array, row_keys: jax.Array, max_new: jax.Array,
            eos_ids: jax.Array, key: jax.Array, step_costs: jax.Array,
            queue_prompts: jax.Array | None = None, queue_prompt_len: jax.Array | None = None,
            queue_keys: jax.Array | None = None, num_prompts: jax.Array | None = None,
            step_limit: jax.Array | None = None) -> DecodeState:
  """Fills the target's cache (and the proposer's state) with every prompt token but the last, which
  the first step consumes.

  Args:
    draft_params: the proposer's weights (None for a model-free proposer or regular decoding).
    prompts: ``i32[B, P]`` right-padded prompts. prompt_len: ``i32[B]``, each ``>= 1``.
    inert: ``bool[B]`` padding rows of the batch bucket: done from the start, they never emit (nor,
      in a continuous batch, take prompts).
    row_keys: ``u32[B, 2]`` the rows' sequence key data (used when ``spec.coupled``).
    max_new: ``i32[]`` tokens per row at most (``<= spec.max_new_bucket``).
    eos_ids: ``i32[E]`` EOS ids padded with -1.
    key: PRNG key for the whole decode.
    step_costs: ``f32[5]`` :meth:`StepCosts.as_array` for a cost-aware policy (ignored by others).
    queue_prompts: ``i32[Q, P]`` every prompt of a continuous batch (``spec.continuous``; None for a
      static one), of which the live rows of ``prompts`` are the first. queue_prompt_len: ``i32[Q]``.
    queue_keys: ``u32[Q, 2]`` their sequence key data (of which ``row_keys`` are the first).
    num_prompts: ``i32[]`` the real prompts among the Q.
    step_limit: ``i32[]`` :attr:`DecodeState.step_limit` of a continuous batch.
  """
  batch = prompts.shape[0]
  n = spec.max_new_bucket
  h = spec.max_steps

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
  queue = None
  if spec.continuous:
    q = queue_prompts.shape[0]
    started = jnp.sum(~inert).astype(jnp.int32)  # the live rows hold prompts 0 … started - 1
    ids = jnp.arange(q, dtype=jnp.int32)
    queue = Queue(
        prompts=queue_prompts, prompt_len=queue_prompt_len, size=num_prompts, next=started,
        slot=~inert, row_prompt=jnp.where(inert, -1, jnp.arange(batch, dtype=jnp.int32)),
        prompt_row=jnp.where(ids < started, ids, -1), start_step=jnp.zeros((q,), jnp.int32),
        tokens=jnp.zeros((q, n), jnp.int32), logprobs=jnp.zeros((q, n), jnp.float32),
        lengths=jnp.zeros((q,), jnp.int32), eos=jnp.zeros((q,), bool),
        keys=queue_keys if spec.coupled else None)
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
      step_limit=max_new if step_limit is None else step_limit,
      eos_ids=eos_ids,
      step=jnp.zeros((), jnp.int32),
      draft_len=jnp.asarray(l0, jnp.int32),
      policy_state=policy_state,
      draft_len_history=jnp.zeros((h,), jnp.int32),
      drafted_history=jnp.zeros((h, batch), jnp.int32),
      verified_history=jnp.zeros((h,), jnp.int32),
      accepted_history=jnp.full((h, batch), -1, jnp.int32),
      key=key,
      queue=queue,
      row_keys=row_keys if spec.coupled else None,
  )


def state_shardings(spec: DecodeSpec, state: DecodeState) -> DecodeState:
  """Where every part of the decode state lies on ``spec.target_sharding``'s mesh: per-row arrays split
  over ``"data"``; the target's cache as its plan says, the proposer's as the proposer's plan says
  (the target's when it has none); counters, histories, the key and the queue's per-prompt arrays
  replicated.

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
      logprobs=rows, done=rows, eos=rows, max_new=replicated, step_limit=replicated,
      eos_ids=replicated, step=replicated, draft_len=replicated,
      policy_state=every(state.policy_state), draft_len_history=replicated,
      drafted_history=replicated, verified_history=replicated, accepted_history=replicated,
      key=replicated, queue=None if state.queue is None else every(state.queue).replace(
          slot=rows, row_prompt=rows), row_keys=None if state.row_keys is None else rows)


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
  if spec.coupled:  # the token at text position seq_len: the same draw as a verification's there
    token = coupled_choice(warped_log_probs(logits, temperature, top_p), state.row_keys,
                           state.seq_len)
  else:
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


def _verify_chunk(spec: DecodeSpec, target_params, temperature, top_p, state: DecodeState, inputs,
                  draft_log_probs, cache: KVCache, features, start, num_drafts, key):
  """Scores ``inputs[:, start:start + C]`` with the target and accepts over those positions (``state``
  is the decode's at the step's start: its text lengths and sequence keys).

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
  elif spec.coupled:
    matched, next_token = acceptance.coupled_accept_chunk(
        warped_log_probs(logits, temperature, top_p), state.row_keys, state.seq_len, next_drafts,
        positions, num_drafts)
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
                     features=state.features, row_keys=state.row_keys)


def _retire(spec: DecodeSpec, state: DecodeState) -> DecodeState:
  """Copies the output of every done row that still serves a prompt into the queue, and frees the row."""
  queue = state.queue
  retiring = state.done & (queue.row_prompt >= 0)
  dest = jnp.where(retiring, queue.row_prompt, queue.prompts.shape[0])  # out of range: dropped
  outputs = jnp.take_along_axis(
      state.tokens, state.prompt_len[:, None] + jnp.arange(spec.max_new_bucket), axis=1)
  queue = queue.replace(
      tokens=queue.tokens.at[dest].set(outputs, mode="drop"),
      logprobs=queue.logprobs.at[dest].set(state.logprobs, mode="drop"),
      lengths=queue.lengths.at[dest].set(state.seq_len - state.prompt_len, mode="drop"),
      eos=queue.eos.at[dest].set(state.eos, mode="drop"),
      row_prompt=jnp.where(retiring, -1, queue.row_prompt))
  return state.replace(queue=queue)


# Positions per forward of an admitted row's prefill (``prefill_cache``'s chunk): the work follows the
# prompt's true length rather than its padded bucket.
ADMIT_CHUNK = 64


def _admit(spec: DecodeSpec, target_params: Any, draft_params: Any,
           state: DecodeState) -> DecodeState:
  """Restarts the first free row on the next waiting prompt: a one-row prefill written into that row's
  slots of the target's cache (and feature buffer), the proposer's :meth:`Proposer.admit`, and fresh
  token, length and output buffers. The caches are ragged, so the row simply restarts at its own
  length; the other rows are untouched. The draft-length policy's state is the batch's and is kept."""
  queue = state.queue
  row = jnp.argmax(queue.slot & (queue.row_prompt < 0)).astype(jnp.int32)
  index = queue.next
  prompt = jax.lax.dynamic_slice_in_dim(queue.prompts, index, 1, axis=0)  # [1, P]
  prompt_len = jax.lax.dynamic_slice_in_dim(queue.prompt_len, index, 1)  # [1]
  prefilled = prefill_cache(spec.target, target_params, prompt, prompt_len,
                            cache_len=spec.cache_len, dtype=spec.target_dtype,
                            attention_impl=spec.attention_impl, return_features=spec.keeps_features,
                            sharding=spec.target_sharding, chunk=ADMIT_CHUNK)
  row_cache, prompt_features, features = prefilled, None, state.features
  if spec.keeps_features:
    row_cache, prompt_features = prefilled
    features = write_row(features, prompt_features, row)
  proposer_state = state.proposer_state
  if spec.method == "bass":
    proposer_state = spec.proposer.admit(draft_params, proposer_state, row, prompt, prompt_len,
                                         cache_len=spec.cache_len, max_len=spec.max_draft,
                                         features=prompt_features, prefill_chunk=ADMIT_CHUNK)
  text = jnp.concatenate([prompt, jnp.zeros((1, spec.max_new_bucket), jnp.int32)], axis=1)
  length = prompt_len[0]
  return state.replace(
      tokens=write_row(state.tokens, text, row),
      prompt_len=state.prompt_len.at[row].set(length),
      seq_len=state.seq_len.at[row].set(length),
      target_cache=write_row(state.target_cache, row_cache, row),
      proposer_state=proposer_state,
      features=features,
      logprobs=state.logprobs.at[row].set(0.0),
      done=state.done.at[row].set(False),
      eos=state.eos.at[row].set(False),
      row_keys=None if queue.keys is None else state.row_keys.at[row].set(queue.keys[index]),
      queue=queue.replace(next=index + 1, row_prompt=queue.row_prompt.at[row].set(index),
                          prompt_row=queue.prompt_row.at[index].set(row),
                          start_step=queue.start_step.at[index].set(state.step)),
  )


def _refill(spec: DecodeSpec, target_params: Any, draft_params: Any,
            state: DecodeState) -> DecodeState:
  """Retires the done rows and admits waiting prompts into free rows, one at a time, until no row is
  free or no prompt waits."""
  state = _retire(spec, state)

  def can_admit(s: DecodeState):
    return jnp.any(s.queue.slot & (s.queue.row_prompt < 0)) & (s.queue.next < s.queue.size)

  return jax.lax.while_loop(can_admit,
                            functools.partial(_admit, spec, target_params, draft_params), state)


def unfinished(spec: DecodeSpec, state: DecodeState) -> jax.Array:
  """``bool[]``: work is left (a live row; for a continuous batch also a waiting or unretired prompt)
  and the step limit is not reached."""
  left = state.queue.pending() if spec.continuous else ~jnp.all(state.done)
  return left & (state.step < state.step_limit)


def _steps(spec: DecodeSpec, target_params: Any, draft_params: Any, temperature: jax.Array,
           top_p: jax.Array, observe: jax.Array, state: DecodeState) -> DecodeState:
  """Runs steps until at least one more row finishes (or all are done, or the step limit), and with
  ``observe`` also until a row emits its first token."""
  done_at_entry = jnp.sum(state.done)
  waiting = lambda s: jnp.sum(~s.done & (s.seq_len == s.prompt_len))  # rows before their first token
  waiting_at_entry = waiting(state)

  def running(s: DecodeState):
    return ((s.step < s.step_limit) & (jnp.sum(s.done) == done_at_entry) & ~jnp.all(s.done)
            & ~(observe & (waiting(s) != waiting_at_entry)))

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


def decode(spec: DecodeSpec, state: DecodeState, target_params: Any, draft_params: Any,
           temperature: jax.Array, top_p: jax.Array, observe: jax.Array) -> DecodeState:
  """Decodes, in one ``lax.while_loop``, until everything is done or, with ``observe``, until the host
  can time an event.

  A round refills the rows (a continuous batch: done rows retire their output into the queue and take
  waiting prompts, :func:`_refill`) and then runs steps until a row finishes. Without ``observe`` the
  rounds repeat until :func:`unfinished` is false: the whole decode, every refill included, is one
  program call. With ``observe`` the call returns after one round, and also as soon as a row emits
  its first token, so that the host can read the clock at every admission, first token and finish
  (per-prompt latency, time to first token, paper §4.1) with a few returns per prompt and no round trip
  per step; the host passes nothing back in, and calls again while :func:`unfinished`.

  Args:
    temperature: ``f32[]``, > 0 unless ``spec.greedy``. top_p: ``f32[]`` in ``(0, 1]``.
    observe: ``bool[]``, return at every event.
  """
  steps = functools.partial(_steps, spec, target_params, draft_params, temperature, top_p, observe)

  def round_(carry):
    state, _ = carry
    if spec.continuous:
      state = _refill(spec, target_params, draft_params, state)
    return steps(state), jnp.bool_(False)

  state, _ = jax.lax.while_loop(lambda c: unfinished(spec, c[0]) & (c[1] | ~observe), round_,
                                (state, jnp.bool_(True)))
  return state
