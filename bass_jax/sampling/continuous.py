"""Continuous batching inside the jitted loop: done rows retire their output into the :class:`Queue` and
take the next waiting prompts (Orca's iteration-level scheduling, Yu et al. 2022), with a chunked
one-row prefill into the row's cache slots and the proposer's state restarted for the row.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.cache import write_row
from bass_jax.models.common import prefill_cache
from bass_jax.sampling.state import DecodeInputs, DecodeSpec, DecodeState, Queue


def start_queue(spec: DecodeSpec, inputs: DecodeInputs) -> Queue:
  """The queue of a continuous batch at its prefill: the live rows of ``inputs.prompts`` serve the first
  prompts of ``inputs.queue_prompts`` (row r prompt r), the rest wait, nothing has retired."""
  inert = inputs.inert
  q, n = inputs.queue_prompts.shape[0], spec.max_new_bucket
  started = jnp.sum(~inert).astype(jnp.int32)  # the live rows hold prompts 0 … started - 1
  ids = jnp.arange(q, dtype=jnp.int32)
  return Queue(
      prompts=inputs.queue_prompts, prompt_len=inputs.queue_prompt_len, size=inputs.num_prompts,
      next=started, slot=~inert,
      row_prompt=jnp.where(inert, -1, jnp.arange(inert.shape[0], dtype=jnp.int32)),
      prompt_row=jnp.where(ids < started, ids, -1), start_step=jnp.zeros((q,), jnp.int32),
      tokens=jnp.zeros((q, n), jnp.int32), logprobs=jnp.zeros((q, n), jnp.float32),
      lengths=jnp.zeros((q,), jnp.int32), eos=jnp.zeros((q,), bool),
      keys=inputs.queue_keys if spec.coupled else None, group=inputs.queue_group)


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
  # A retired row serves no prompt until it is admitted another: no sibling reads its text twice
  # (there and in the queue).
  group = jnp.where(retiring, -1 - jnp.arange(state.group.shape[0], dtype=state.group.dtype),
                    state.group)
  return state.replace(queue=queue, group=group)


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
      group=state.group.at[row].set(queue.group[index]),
      queue=queue.replace(next=index + 1, row_prompt=queue.row_prompt.at[row].set(index),
                          prompt_row=queue.prompt_row.at[index].set(row),
                          start_step=queue.start_step.at[index].set(state.step)),
  )


def refill(spec: DecodeSpec, target_params: Any, draft_params: Any,
           state: DecodeState) -> DecodeState:
  """Retires the done rows and admits waiting prompts into free rows, one at a time, until no row is
  free or no prompt waits."""
  state = _retire(spec, state)

  def can_admit(s: DecodeState):
    return jnp.any(s.queue.slot & (s.queue.row_prompt < 0)) & (s.queue.next < s.queue.size)

  return jax.lax.while_loop(can_admit,
                            functools.partial(_admit, spec, target_params, draft_params), state)
