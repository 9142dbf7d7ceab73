"""Measured step costs for the cost-aware draft length (``GoodputDraftLen``).

For one setting (models, dtypes, attention, batch bucket, cache length, chunk) the pieces of a decode
step are timed once per process, each a jitted forward on a donated cache of the decode's shape, and
remembered: the target scoring 1 position per row (a plain step) and C positions per row (one
verification pass), and the proposer's first and further forwards of a step
(``Proposer.forward_costs``: a draft model's catch-up and single-token forwards), and with token trees
each shape's step: the proposer's catch-up and growth (``Proposer.tree_costs``) and the target's one
forward over the tree's nodes under an ancestor mask. A model-free
proposer costs 0 (an n-gram lookup is a few integer comparisons per token of the buffer, far below a
forward). Sampling and acceptance arithmetic are not timed: they add a similar amount to every kind of
step.

The measurement is made to survive a busy machine (another process on the cores), because the policy
decides by the costs' *ratios* (``E(l) / cost(l)`` against ``1 / plain``) and one inflated verification
pass can make it decode plainly for a whole run. Each piece is the **fastest** of its timed calls, not
their median: interference only ever adds time, so the minimum is the best estimate of a call's own
cost, and a load lasting through half the calls moves a median but not a minimum. And the plain step
and the verification pass are timed **interleaved** (round r times one of each, in turn,
:func:`fastest_seconds`) rather than one after the other, so a load that starts or stops during the
measurement hits both alike instead of only the piece timed last. The costs are still measured only
once, before the decode: no clock runs inside the jitted loop, and the host regains control only when a
row finishes; ``GoodputDraftLen.explore_every`` is what keeps a decode from being held to plain steps by
an unlucky measurement.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.models import decoder_config
from bass_jax.sampling import compile_cache
from bass_jax.models.common import forward
from bass_jax.sampling.draft_len import GoodputDraftLen, StepCosts

_CACHE: dict[Any, StepCosts] = {}
_LOCK = threading.Lock()
_REPEATS = 7
_OPTIONS = threading.local()  # the XLA options of the decode being measured (measure_step_costs)


def _compiler_options() -> dict[str, str] | None:
  """The XLA options the timed forwards compile with: the decode's own, while its costs are measured
  (a proposer's ``forward_costs`` times its forwards through here too), so each piece is timed as the
  decode will run it."""
  return getattr(_OPTIONS, "value", None)


@contextlib.contextmanager
def compiled_with(options: dict[str, str] | None):
  """Within the block, the forwards this module times (``time_forwards``, a proposer's
  ``forward_costs``) compile with XLA ``options`` (``jax.jit``'s ``compiler_options``; None: XLA's
  defaults), in this thread: a backend profile's, as ``measure_step_costs`` sets for the decode's."""
  previous = getattr(_OPTIONS, "value", None)
  _OPTIONS.value = options
  try:
    yield
  finally:
    _OPTIONS.value = previous


def median_seconds(call: Callable[[], Any], repeats: int = 5) -> float:
  """Median wall seconds of ``call()`` over ``repeats`` timed calls, after one untimed (compiling) call;
  each call's result is waited for (``jax.block_until_ready``). For reports of a typical time; the step
  costs use :func:`fastest_seconds`."""
  jax.block_until_ready(call())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def fastest_seconds(calls: Sequence[Callable[..., Any]], repeats: int = _REPEATS,
                    clock: Callable[[], float] = time.perf_counter, *,
                    inputs: Callable[[], tuple] | None = None) -> list[float]:
  """The fastest wall seconds of each of ``calls``, timed interleaved.

  Each call is made once untimed (compiling), then ``repeats`` rounds each time ``calls[0]``,
  ``calls[1]``, … in turn, every result waited for (``jax.block_until_ready``). The minimum, because
  interference from other work on the machine only adds time; interleaved, because a load that comes or
  goes during the measurement then affects every call alike, which keeps their ratios (what the
  cost-aware policy decides by) close to the unloaded machine's.

  Args:
    calls: callables returning what to wait for; of no argument, or with ``inputs`` of its results.
    repeats: timed rounds, >= 1.
    clock: seconds (``time.perf_counter``; a test passes a simulated clock).
    inputs: makes fresh arguments for every call (e.g. copies of a state the call donates), made and
      waited for before the clock starts; None: the calls take no argument.

  Returns:
    One float per call, in order: its fastest timed call, in seconds.
  """
  if repeats < 1:
    raise ValueError(f"fastest_seconds needs repeats >= 1, got {repeats}")
  arguments = (lambda: ()) if inputs is None else (lambda: jax.block_until_ready(inputs()))
  for call in calls:
    jax.block_until_ready(call(*arguments()))
  best = [math.inf] * len(calls)
  for _ in range(repeats):
    for i, call in enumerate(calls):
      args = arguments()
      start = clock()
      jax.block_until_ready(call(*args))
      best[i] = min(best[i], clock() - start)
  return best


def cached_forward_calls(forward_fn: Callable[..., tuple[Any, Any]], params, cache,
                         positions: Sequence[int],
                         mask_widths: Sequence[int | None] | None = None) -> list[Callable[[], Any]]:
  """One callable per entry of ``positions``: a jitted ``forward_fn(params, tokens i32[B, p], cache) ->
  (outputs, cache)`` over ``cache`` (a :class:`KVCache` whose lengths say how full it is), returning the
  outputs. The calls share the cache: it is donated and threaded from call to call, its lengths set
  back after each, as in a decode.

  ``mask_widths[i]`` (an int M >= p) makes call i a token-tree forward: ``forward_fn`` then also takes
  ``tree_mask=bool[B, p, M]`` (a chain's causal mask; any ancestor mask costs the same)."""
  state = [cache]  # donated, threaded
  batch = cache.lengths.shape[0]
  mask_widths = mask_widths or [None] * len(positions)

  def make(p: int, width: int | None) -> Callable[[], Any]:
    mask = None
    if width is not None:
      mask = jnp.broadcast_to(jnp.tril(jnp.ones((p, width), bool), k=width - p), (batch, p, width))

    @functools.partial(jax.jit, donate_argnums=2, compiler_options=_compiler_options())
    def step(params, tokens, cache):
      extra = {} if mask is None else {"tree_mask": mask}
      outputs, cache = forward_fn(params, tokens, cache, **extra)
      return outputs, cache.with_lengths(cache.lengths - p)

    tokens = jnp.ones((batch, p), jnp.int32)

    def call():
      outputs, state[0] = step(params, tokens, state[0])
      return outputs

    return call

  return [make(p, w) for p, w in zip(positions, mask_widths)]


def time_cached_forward(forward_fn: Callable[..., tuple[Any, Any]], params, cache, positions: int,
                        mask_width: int | None = None) -> float:
  """Wall seconds of one jitted ``forward_fn(params, tokens i32[B, positions], cache) -> (outputs,
  cache)`` over ``cache`` (:func:`cached_forward_calls`; ``mask_width``: a tree forward).

  Returns:
    Seconds, the fastest of 7 timed calls after one compiling call (:func:`fastest_seconds`).
  """
  return fastest_seconds(cached_forward_calls(forward_fn, params, cache, [positions],
                                              [mask_width]))[0]


def half_full_cache(config, batch: int, cache_len: int, dtype: str, scanned: bool = False):
  """``config``'s cache of ``cache_len`` slots per row, ``cache_len // 2`` of them counted as filled
  (attention then reads a realistic length); ``scanned``: stacked, for a model with scanned layers."""
  cache = config.init_cache(batch, cache_len, jnp.dtype(dtype), scanned=scanned)
  return cache.with_lengths(jnp.full((batch,), cache_len // 2, jnp.int32))


def time_forwards(config, dtype: str, attention_impl: str, params, batch: int,
                  positions: Sequence[int], cache_len: int, sharding: Any = None,
                  mask_widths: Sequence[int | None] | None = None) -> list[float]:
  """Wall seconds of a jitted ``[batch, p]`` forward over a cache half full, for each ``p`` in
  ``positions``, timed interleaved (:func:`fastest_seconds`).

  Args:
    config: the model's config. dtype: compute dtype name (``"float32"``). attention_impl: as in
      ``models.common.forward``. params: its weights.
    batch: rows. positions: tokens scored per row, one entry per forward timed. cache_len: cache slots
      per row (``cache_len // 2`` already filled, so attention reads a realistic length).
    sharding: the model's ``bass_jax.sharding.ShardingPlan`` on a mesh (timed as the decode runs it).
    mask_widths: per entry, None or the width M of a token-tree mask (a tree forward,
      :func:`cached_forward_calls`).

  Returns:
    Seconds per entry of ``positions``, each the fastest of 7 timed calls after one compiling call.
  """
  def run(params, tokens, cache, tree_mask=None):
    return forward(config, params, tokens, cache, dtype=dtype, attention_impl=attention_impl,
                   sharding=sharding, tree_mask=tree_mask)

  cache = half_full_cache(config, batch, cache_len, dtype,
                          scanned=decoder_config.scanned_layers(config, params))
  return fastest_seconds(cached_forward_calls(run, params, cache, positions, mask_widths))


def time_forward(config, dtype: str, attention_impl: str, params, batch: int, positions: int,
                 cache_len: int, sharding: Any = None) -> float:
  """Wall seconds of one jitted ``[batch, positions]`` forward over a cache half full
  (:func:`time_forwards` for one entry)."""
  return time_forwards(config, dtype, attention_impl, params, batch, [positions], cache_len,
                       sharding)[0]


def measure_step_costs(spec, target_params: Any, draft_params: Any, batch: int) -> StepCosts:
  """The :class:`StepCosts` of a decode setting, measured on first use and remembered: in memory, and
  beside the persistent compilation cache (``compile_cache.store_costs``, keyed by the setting, the
  device kind, JAX's version and bass_jax's code), so that a later process does not measure again.

  Args:
    spec: the decode's ``state.DecodeSpec`` (with a proposer).
    target_params, draft_params: the weights (``draft_params`` None for a model-free proposer).
    batch: rows the programs run (the batch bucket).

  Returns:
    Seconds per piece of a step (:class:`StepCosts`), on this machine: the fastest of 7 timed calls of
    each forward, the target's plain step, verification pass and tree forwards timed interleaved
    (module docstring); ``tree_steps`` for the decode's tree shapes when the goodput policy chooses
    among them.
  """
  trees = spec.draft_trees if isinstance(spec.draft_len, GoodputDraftLen) else ()
  key = (spec.target, spec.target_dtype, spec.attention_impl, spec.proposer, batch, spec.cache_len,
         spec.verify_chunk, spec.max_draft, spec.target_sharding, trees, spec.compiler_options)
  with _LOCK:
    if key in _CACHE:
      return _CACHE[key]
  costs = StepCosts.stored(compile_cache.load_costs("step_costs", key))
  if costs is None:
    with compiled_with(spec.xla_options):
      costs = _measure(spec, target_params, draft_params, batch, trees)
    compile_cache.store_costs("step_costs", key, costs.to_json())
  with _LOCK:
    _CACHE[key] = costs
  return costs


def _measure(spec, target_params: Any, draft_params: Any, batch: int, trees) -> StepCosts:
  """:func:`measure_step_costs`' timings, with the decode's XLA options in force."""
  # The plain step, the verification pass and each tree's verification interleaved: their ratios are
  # what the policy weighs.
  nodes = [t.nodes for t in trees]
  target = time_forwards(spec.target, spec.target_dtype, spec.attention_impl, target_params, batch,
                         [1, spec.verify_chunk] + nodes, cache_len=spec.cache_len,
                         sharding=spec.target_sharding, mask_widths=[None, None] + nodes)
  first, nxt = spec.proposer.forward_costs(draft_params, batch, spec.cache_len, spec.max_draft)
  growth = [spec.proposer.tree_costs(draft_params, batch, spec.cache_len, t) for t in trees]
  seconds = np.array(target[:2] + [first, nxt]
                     + [first + g + v for g, v in zip(growth, target[2:])])
  if jax.process_count() > 1:  # every process decides draft lengths from process 0's timings
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    seconds = np.asarray(multihost_utils.broadcast_one_to_all(seconds))
  return StepCosts(plain=float(seconds[0]), verify_pass=float(seconds[1]),
                   propose_first=float(seconds[2]), propose_next=float(seconds[3]),
                   chunk=spec.verify_chunk, tree_steps=tuple(map(float, seconds[4:])),
                   fixed_drafts=spec.max_draft if spec.branch_free else 0)


def clear() -> None:
  """Forgets every measured setting."""
  with _LOCK:
    _CACHE.clear()
