"""Measured step costs for the cost-aware draft length (``GoodputDraftLen``).

For one setting (models, dtypes, attention, batch bucket, cache length, chunk) the pieces of a decode
step are timed once per process, each a jitted forward on a donated cache of the decode's shape, and
remembered: the target scoring 1 position per row (a plain step) and C positions per row (one
verification pass), and the proposer's first and further forwards of a step
(``Proposer.forward_costs``: a draft model's catch-up and single-token forwards). A model-free
proposer costs 0 (an n-gram lookup is a few integer comparisons per token of the buffer, far below a
forward). Sampling and acceptance arithmetic are not timed: they add a similar amount to every kind of
step.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.models.common import forward
from bass_jax.sampling.draft_len import StepCosts

_CACHE: dict[Any, StepCosts] = {}
_LOCK = threading.Lock()
_REPEATS = 5


def median_seconds(call: Callable[[], Any], repeats: int = _REPEATS) -> float:
  """Median wall seconds of ``call()`` over ``repeats`` timed calls, after one untimed (compiling) call;
  each call's result is waited for (``jax.block_until_ready``)."""
  jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_cached_forward(forward_fn: Callable[[Any, jax.Array, Any], tuple[Any, Any]], params,
                        cache, positions: int) -> float:
  """Median wall seconds of one jitted ``forward_fn(params, tokens i32[B, positions], cache) ->
  (outputs, cache)`` over ``cache`` (a :class:`KVCache` whose lengths say how full it is).

  The cache is donated and threaded from call to call, its lengths set back after each, as in a decode.

  Returns:
    Seconds, the median of 5 timed calls after one compiling call (compilation excluded).
  """
  @functools.partial(jax.jit, donate_argnums=2)
  def step(params, tokens, cache):
    outputs, cache = forward_fn(params, tokens, cache)
    return outputs, cache.with_lengths(cache.lengths - positions)

  state = [cache]  # donated, threaded
  tokens = jnp.ones((cache.lengths.shape[0], positions), jnp.int32)

  def call():
    outputs, state[0] = step(params, tokens, state[0])
    return outputs

  return median_seconds(call)


def half_full_cache(config, batch: int, cache_len: int, dtype: str):
  """``config``'s cache of ``cache_len`` slots per row, ``cache_len // 2`` of them counted as filled
  (attention then reads a realistic length)."""
  cache = config.init_cache(batch, cache_len, jnp.dtype(dtype))
  return cache.with_lengths(jnp.full((batch,), cache_len // 2, jnp.int32))


def time_forward(config, dtype: str, attention_impl: str, params, batch: int, positions: int,
                 cache_len: int, sharding: Any = None) -> float:
  """Median wall seconds of one jitted ``[batch, positions]`` forward over a cache half full.

  Args:
    config: the model's config. dtype: compute dtype name (``"float32"``). attention_impl: as in
      ``models.common.forward``. params: its weights.
    batch: rows. positions: tokens scored per row. cache_len: cache slots per row (``cache_len // 2``
      already filled, so attention reads a realistic length).
    sharding: the model's ``bass_jax.sharding.ShardingPlan`` on a mesh (timed as the decode runs it).

  Returns:
    Seconds, the median of 5 timed calls after one compiling call (compilation excluded).
  """
  def run(params, tokens, cache):
    return forward(config, params, tokens, cache, dtype=dtype, attention_impl=attention_impl,
                   sharding=sharding)

  return time_cached_forward(run, params, half_full_cache(config, batch, cache_len, dtype), positions)


def measure_step_costs(spec, target_params: Any, draft_params: Any, batch: int) -> StepCosts:
  """The :class:`StepCosts` of a decode setting, measured on first use and remembered.

  Args:
    spec: the decode's ``loop.DecodeSpec`` (method ``"bass"``).
    target_params, draft_params: the weights (``draft_params`` None for a model-free proposer).
    batch: rows the programs run (the batch bucket).

  Returns:
    Seconds per piece of a step (:class:`StepCosts`), on this machine.
  """
  key = (spec.target, spec.target_dtype, spec.attention_impl, spec.proposer, batch, spec.cache_len,
         spec.verify_chunk, spec.max_draft, spec.target_sharding)
  with _LOCK:
    if key in _CACHE:
      return _CACHE[key]
  target = functools.partial(time_forward, spec.target, spec.target_dtype, spec.attention_impl,
                             target_params, batch, cache_len=spec.cache_len,
                             sharding=spec.target_sharding)
  first, nxt = spec.proposer.forward_costs(draft_params, batch, spec.cache_len, spec.max_draft)
  seconds = np.array([target(positions=1), target(positions=spec.verify_chunk), first, nxt])
  if jax.process_count() > 1:  # every process decides draft lengths from process 0's timings
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    seconds = np.asarray(multihost_utils.broadcast_one_to_all(seconds))
  costs = StepCosts(plain=float(seconds[0]), verify_pass=float(seconds[1]),
                    propose_first=float(seconds[2]), propose_next=float(seconds[3]),
                    chunk=spec.verify_chunk)
  with _LOCK:
    _CACHE[key] = costs
  return costs


def clear() -> None:
  """Forgets every measured setting."""
  with _LOCK:
    _CACHE.clear()
