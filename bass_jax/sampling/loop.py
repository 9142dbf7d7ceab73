"""The jitted decode: prefill, then one ``lax.while_loop`` of steps over a batch of rows served from a
queue of prompts. Regular decoding is this loop with a proposer that never proposes (every step a
plain step); a static batch is a queue that holds exactly the batch.

Implements BASS (paper §3; docs/bass.md): one step (draft, verify, accept, advance) and the draft length
for B rows at once, every row with its own length. Shapes are static: the batch, the prompt length and
the output buffer are padded to buckets (``bass_jax.sampling.plan``), the cache has
``S >= P + N + L + 1`` slots (P the padded prompt length, N the output bucket, L the maximum draft
length), and rows that finish keep riding along, frozen. The true ``max_new_tokens`` and the EOS ids are
traced values, so calls that differ only in them share a program. Nothing here talks to the host.

The queue (``state.Queue``): a row that finishes retires its output into it and, in continuous
batching (a queue longer than the batch), takes the next waiting prompt, all inside the loop
(:func:`decode`, ``batching.refill``): a chunked prefill of the admitted rows (several at once where the profile
says so) written into their cache slots, the proposer's state restarted for them, the batch's
draft-length policy kept.

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
decoding's step, ``step.plain_step``). A speculative step verifies a chain (``step.chain_step``) or, with token trees, a tree
of one of ``DecodeSpec.draft_trees`` (``step.tree_step``; the goodput policy chooses the kind per step).
The loop runs each kind as its own inner ``while_loop``, never as branches of a ``cond``, so that each
updates the caches in place.

Each forward writes its new tokens' K/V into the cache before attending over it: XLA then updates
the cache in place, where reading it first and writing after would make it copy every layer's cache
(and so does a write inside a ``lax.switch`` branch, which is why verification has one chunk size).

Axes: B batch, P padded prompt length, N output bucket, L max draft length, C chunk, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.models.common import prefill_cache
from bass_jax.sampling.batching import refill, start_queue
from bass_jax.sampling.state import DecodeInputs, DecodeSpec, DecodeState, Limits, StepLog
from bass_jax.sampling.step import chain_step, plain_step, step_context, tree_step


def prefill(spec: DecodeSpec, target_params: Any, draft_params: Any,
            inputs: DecodeInputs) -> DecodeState:
  """Fills the target's cache (and the proposer's state) with every prompt token but the last, which
  the first step consumes, for the rows' first prompts (row r serves prompt r; the batch's inert
  padding rows a one-token prompt, done from the start), in one forward over the prompt capacity P.

  Args:
    draft_params: the proposer's weights (None for a model-free proposer or regular decoding).
    inputs: the call's prompts, keys and limits (:class:`DecodeInputs`).

  Returns:
    The :class:`DecodeState` before the first step.
  """
  inert = inputs.inert
  batch = inert.shape[0]
  prompts = jnp.where(inert[:, None], 0, inputs.prompts[:batch])
  prompt_len = jnp.where(inert, 1, inputs.prompt_len[:batch]).astype(jnp.int32)
  n = spec.max_new_bucket

  # One forward over the P positions: the chunked prefill (the admission's), whose work would follow
  # the longest real prompt rather than the capacity, slowed the static decodes that ab_commits times
  # by 10-15 % (commit 8676557), so the capacity's prefill is paid whole (docs/design.md).
  prefilled = prefill_cache(spec.target, target_params, prompts, prompt_len,
                            cache_len=spec.cache_len, dtype=spec.target_dtype,
                            attention_impl=spec.attention_impl,
                            return_features=spec.keeps_features, sharding=spec.target_sharding,
                            hidden_layers=spec.feature_taps, final_feature=spec.final_feature)
  target_cache, prompt_features, features = prefilled, None, None
  if spec.keeps_features:
    target_cache, prompt_features = prefilled
    features = jnp.zeros((batch, prompts.shape[1] + n, prompt_features.shape[-1]),
                         prompt_features.dtype).at[:, :prompts.shape[1]].set(prompt_features)
  proposer_state = spec.proposer.init_state(draft_params, prompts, prompt_len,
                                            cache_len=spec.cache_len, max_len=spec.max_draft,
                                            features=prompt_features)
  l0, policy_state = spec.draft_len.start(inputs.step_costs)
  return DecodeState(
      tokens=jnp.concatenate([prompts, jnp.zeros((batch, n), jnp.int32)], axis=1),
      prompt_len=prompt_len,
      seq_len=prompt_len,
      logprobs=jnp.zeros((batch, n), jnp.float32),
      done=inert,
      eos=jnp.zeros((batch,), bool),
      target_cache=target_cache,
      features=features,
      proposer_state=proposer_state,
      draft_len=jnp.asarray(l0, jnp.int32),
      policy_state=policy_state,
      key=inputs.key,
      step=jnp.zeros((), jnp.int32),
      queue=start_queue(spec, inputs),
      limits=Limits(max_new=inputs.max_new, step_limit=inputs.step_limit, eos_ids=inputs.eos_ids),
      log=StepLog.empty(spec.history_len, batch),
  )


def unfinished(spec: DecodeSpec, state: DecodeState) -> jax.Array:
  """``bool[]``: a done row is not yet retired, or work is left (a live row or a waiting prompt) and
  the step limit is not reached."""
  del spec
  queue = state.queue
  retiring = jnp.any(state.done & (queue.row_prompt >= 0))
  return retiring | (queue.pending() & (state.step < state.limits.step_limit))


def _outlined(fn, name: str):
  """``fn`` as a nested jit named ``name``: a lowered decode holds each kind of step as its own
  function (``func.func @name``), so that ``experiments.benchmarks.lower_decode`` finds where a step begins.
  XLA inlines the call when it compiles, so the program is unchanged."""
  step = lambda state: fn(state)
  step.__name__ = name
  return jax.jit(step)


def _steps(spec: DecodeSpec, target_params: Any, draft_params: Any, temperature: jax.Array,
           top_p: jax.Array, observe: jax.Array, state: DecodeState) -> DecodeState:
  """Runs steps until at least one more row finishes (or all are done, or the step limit), and with
  ``observe`` also until a row emits its first token."""
  done_at_entry = jnp.sum(state.done)
  waiting = lambda s: jnp.sum(~s.done & (s.seq_len == s.prompt_len))  # rows before their first token
  waiting_at_entry = waiting(state)

  def running(s: DecodeState):
    return ((s.step < s.limits.step_limit) & (jnp.sum(s.done) == done_at_entry) & ~jnp.all(s.done)
            & ~(observe & (waiting(s) != waiting_at_entry)))

  plain = _outlined(functools.partial(plain_step, spec, target_params, temperature, top_p),
                    "plain_step")
  kinds = spec.step_kinds
  if not kinds:  # no proposer (regular decoding): every step is plain
    return jax.lax.while_loop(running, plain, state)

  def step_of(kind):  # a chain step (None) or a tree step of shape draft_trees[kind]
    step = chain_step if kind is None else functools.partial(tree_step, tree=kind)
    name = "chain_step" if kind is None else f"tree_step_{kind}"
    return _outlined(functools.partial(step, spec, target_params, draft_params, temperature, top_p),
                     name)

  if len(kinds) == 1 and spec.proposer.always_proposes and not spec.draft_len.may_choose_zero:
    return jax.lax.while_loop(running, step_of(kinds[0]), state)  # no plain step can occur

  def speculate(s: DecodeState):
    ctx = step_context(s, s.key, temperature, top_p, spec.acceptance)
    return (s.draft_len > 0) & spec.proposer.can_propose(ctx)

  def chosen(kind):  # whether the policy's next speculative step is of this kind
    if len(kinds) == 1:
      return lambda s: speculate(s)
    index = -1 if kind is None else kind
    return lambda s: speculate(s) & (spec.draft_len.tree_choice(s.policy_state) == index)

  def body(s: DecodeState):
    # Plain steps while speculation is off, then each kind of speculative step (chains, each tree
    # shape) while the policy chooses it: loops rather than a switch, so that every step updates the
    # caches in place (module docstring). Each pass makes progress: some loop's condition holds.
    s = jax.lax.while_loop(lambda s: running(s) & ~speculate(s), plain, s)
    for kind in kinds:
      s = jax.lax.while_loop(lambda s, kind=kind: running(s) & chosen(kind)(s), step_of(kind), s)
    return s

  return jax.lax.while_loop(running, body, state)


def decode(spec: DecodeSpec, state: DecodeState, target_params: Any, draft_params: Any,
           temperature: jax.Array, top_p: jax.Array, observe: jax.Array) -> DecodeState:
  """Decodes, in one ``lax.while_loop``, until everything is done or, with ``observe``, until the host
  can time an event.

  A round refills the rows (done rows retire their output into the queue and, in continuous batching,
  free rows take waiting prompts: :func:`refill`) and then runs steps until a row finishes. Without ``observe`` the
  rounds repeat until :func:`unfinished` is false: the whole decode, every refill included, is one
  program call. With ``observe`` the call returns after one round, and also as soon as a row emits
  its first token, so that the host can read the clock at every admission, first token and finish
  (per-prompt latency, time to first token, paper §4.1) with a few returns per prompt and no round trip
  per step; the host passes nothing back in, and calls again while :func:`unfinished`.

  Args:
    temperature: ``f32[]``, > 0 unless ``spec.greedy``. top_p: ``f32[]`` in ``(0, 1)``, or None for
      no nucleus (static: ``warp.warped_log_probs``).
    observe: ``bool[]``, return at every event.
  """
  steps = functools.partial(_steps, spec, target_params, draft_params, temperature, top_p, observe)

  def round_(carry):
    state, _ = carry
    state = refill(spec, target_params, draft_params, state)
    return steps(state), jnp.bool_(False)

  state, _ = jax.lax.while_loop(lambda c: unfinished(spec, c[0]) & (c[1] | ~observe), round_,
                                (state, jnp.bool_(True)))
  return state
