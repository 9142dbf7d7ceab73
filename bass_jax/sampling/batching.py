"""The queue every batch decodes from, inside the jitted loop: done rows retire their output into the
:class:`Queue` and, in continuous batching, take the next waiting prompts (Orca's iteration-level
scheduling, Yu et al. 2022). A static batch is the queue that holds exactly its rows' prompts: its
rows retire as they finish and nothing is admitted (admission is not compiled: :func:`refill`).

An admission restarts up to ``DecodeSpec.admit_rows`` free rows at once: one chunked prefill of their
prompts (``DecodeSpec.admit_chunk`` positions per forward, up to the longest of them, not the padded
bucket) into a scratch cache of the prompt bucket's P slots, whose entries are then written into those
rows' first P slots of the batch's cache in place (``cache.write_rows``, one scatter per layer; the
rows' later slots are stale and masked), and the proposer's state restarted for the rows.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.cache import write_rows
from bass_jax.models.common import prefill_cache
from bass_jax.sampling.state import DecodeInputs, DecodeSpec, DecodeState, Queue


def start_queue(spec: DecodeSpec, inputs: DecodeInputs) -> Queue:
  """The queue at the prefill: the live rows serve the first prompts of ``inputs.prompts`` (row r
  prompt r), the rest wait, nothing has retired."""
  inert = inputs.inert
  q, n = inputs.prompts.shape[0], spec.max_new_bucket
  started = jnp.sum(~inert).astype(jnp.int32)  # the live rows hold prompts 0 … started - 1
  ids = jnp.arange(q, dtype=jnp.int32)
  return Queue(
      prompts=inputs.prompts, prompt_len=inputs.prompt_len, size=inputs.num_prompts,
      next=started, slot=~inert,
      row_prompt=jnp.where(inert, -1, jnp.arange(inert.shape[0], dtype=jnp.int32)),
      prompt_row=jnp.where(ids < started, ids, -1), start_step=jnp.zeros((q,), jnp.int32),
      tokens=jnp.zeros((q, n), jnp.int32), logprobs=jnp.zeros((q, n), jnp.float32),
      lengths=jnp.zeros((q,), jnp.int32), eos=jnp.zeros((q,), bool),
      keys=inputs.keys if spec.keyed else None, group=inputs.group,
      prefilled=jnp.zeros((), jnp.int32), admits=spec.queue_len > inert.shape[0])


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
  # A retired row serves no prompt until it is admitted another, and so is a group of its own
  # (Queue.row_group): no sibling reads its text twice (there and in the queue).
  return state.replace(queue=queue)


def _free_rows(queue) -> jax.Array:
  """``bool[B]``: rows that take prompts and serve none."""
  return queue.slot & (queue.row_prompt < 0)


def _admit(spec: DecodeSpec, target_params: Any, draft_params: Any,
           state: DecodeState) -> DecodeState:
  """Restarts the first ``n = min(A, free rows, waiting prompts)`` free rows on the next waiting
  prompts, in row and queue order (``A = spec.admit_rows``): one chunked prefill of the A prompts
  into a scratch cache of P slots (the spare ``A - n`` rows, cut to one token so that they add no
  chunk, are computed and dropped), written into the rows' first P slots of the target's cache (and
  feature buffer); the proposer's :meth:`Proposer.admit`, its state built the same way over P slots;
  fresh token, length and output buffers. The caches are ragged, so a row simply restarts at its own
  length; the other rows are untouched. The draft-length policy's state is the batch's and is kept."""
  queue = state.queue
  a, batch, q = spec.admit_rows, state.tokens.shape[0], queue.prompts.shape[0]
  free = _free_rows(queue)
  n = jnp.minimum(jnp.minimum(jnp.sum(free), queue.size - queue.next), a)
  filled = jnp.arange(a) < n
  rows = jnp.where(filled, jnp.argsort(~free, stable=True)[:a], batch)  # out of range: dropped
  index = jnp.minimum(queue.next + jnp.arange(a, dtype=jnp.int32), queue.size - 1)
  # A spare slot holds a prompt of the queue cut to its first token: it needs no chunk of its own.
  prompts, prompt_len = queue.prompts[index], jnp.where(filled, queue.prompt_len[index], 1)
  prefilled = prefill_cache(spec.target, target_params, prompts, prompt_len,
                            cache_len=spec.prompt_len, dtype=spec.target_dtype,
                            attention_impl=spec.attention_impl, return_features=spec.keeps_features,
                            sharding=spec.target_sharding, chunk=spec.admit_chunk,
                            hidden_layers=spec.feature_taps, final_feature=spec.final_feature)
  rows_cache, prompt_features, features = prefilled, None, state.features
  if spec.keeps_features:
    rows_cache, prompt_features = prefilled
    features = write_rows(features, prompt_features, rows)
  proposer_state = spec.proposer.admit(draft_params, state.proposer_state, rows, prompts, prompt_len,
                                       cache_len=spec.prompt_len, max_len=spec.max_draft,
                                       features=prompt_features, prefill_chunk=spec.admit_chunk)
  text = jnp.concatenate([prompts, jnp.zeros((a, spec.max_new_bucket), jnp.int32)], axis=1)
  set_rows = lambda x, value: x.at[rows].set(value, mode="drop")
  admitted = jnp.where(filled, index, q)  # out of range: dropped
  chunks = -(-(jnp.max(prompt_len) - 1) // spec.admit_chunk)  # prefill_cache's loop trips
  return state.replace(
      tokens=write_rows(state.tokens, text, rows),
      prompt_len=set_rows(state.prompt_len, prompt_len),
      seq_len=set_rows(state.seq_len, prompt_len),
      target_cache=write_rows(state.target_cache, rows_cache, rows),
      proposer_state=proposer_state,
      features=features,
      logprobs=set_rows(state.logprobs, 0.0),
      done=set_rows(state.done, False),
      eos=set_rows(state.eos, False),
      queue=queue.replace(
          next=queue.next + n, row_prompt=set_rows(queue.row_prompt, index),
          prompt_row=queue.prompt_row.at[admitted].set(rows, mode="drop"),
          start_step=queue.start_step.at[admitted].set(state.step, mode="drop"),
          prefilled=queue.prefilled + a * chunks * spec.admit_chunk),
  )


def refill(spec: DecodeSpec, target_params: Any, draft_params: Any,
           state: DecodeState) -> DecodeState:
  """Retires the done rows and admits waiting prompts into free rows, up to ``spec.admit_rows`` per
  prefill, until no row is free or no prompt waits. A queue no longer than the batch (a static
  batch) never has a prompt waiting, and compiles no admission: a static shape, not a setting."""
  state = _retire(spec, state)
  if not state.queue.admits:
    return state

  def can_admit(s: DecodeState):
    return jnp.any(_free_rows(s.queue)) & (s.queue.next < s.queue.size)

  return jax.lax.while_loop(can_admit,
                            functools.partial(_admit, spec, target_params, draft_params), state)
