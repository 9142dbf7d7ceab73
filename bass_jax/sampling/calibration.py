"""Step costs measured inside the decode's own program, for the cost-aware draft length on a GPU.

``costs.measure_step_costs`` times each piece of a step (a plain forward, a verification pass, the
draft's forwards) as a program of its own. On a CPU that is what a step costs. On a GPU it is not: a
program of its own pays every kernel launch and a host round trip, which inside the decode's one
``while_loop`` XLA groups into CUDA graphs, and a speculative step also pays its drafting loop, its
acceptance and its bookkeeping, which no piece times. On one H200 (2026-11-28, SmolLM2 with its EAGLE
hybrid, B = 16; ``results/gpu_h200_2026-11-28/``) the plain forward timed alone took 1.79 ms where
regular decoding's steps took 1.26 ms, and the policy chose to speculate in every step of a decode
that then ran 19 % below regular decoding in tokens/s.

So where the decode is branch-free (the GPU profile: every chain step runs the draft loop's static
``L`` iterations and verifies ``L + 1`` positions in one pass, whatever its length, so a speculative
step costs the same for every ``l``), :func:`calibrate` times the two kinds of step *in the decode
program itself*, with the very programs the decode will run (no other compile): it decodes a few
tokens of the plan's own first batch with step costs that force every step to be plain, and with costs
that force every step to speculate, at two lengths each (8 and 32 tokens per row, the fastest of two
decodes each: eight short decodes), and takes each kind's seconds per step as the difference of the
two wall times over the difference of their step counts (the prefill and the fixed costs of a call
cancel). The calibration decodes run to 32 tokens whatever ``max_new_tokens`` is (within the output
bucket the programs hold); their tokens are discarded. The policy then weighs ``plain`` against one
speculative step's whole cost (``StepCosts(plain, verify_pass=speculative step, 0, 0, C,
fixed_drafts=L)``), so it speculates only where the accepted tokens pay for everything a step does,
and decodes plainly, as regular decoding does, elsewhere. The costs are remembered per setting for the
process (:func:`clear`).

The decodes it runs are discarded: the plan's own decode, run afterwards, draws from the same key, so
calibration changes no output.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np

from bass_jax.sampling import compile_cache
from bass_jax.sampling.draft_len import GoodputDraftLen, StepCosts

_CACHE: dict[Any, StepCosts] = {}
_LOCK = threading.Lock()
# Held while measuring: two threads calibrating at once would each time the other's decodes.
_MEASURING = threading.Lock()
_NEVER = 1e30  # seconds: a step kind that must never win (finite: no inf - inf in the policy)
SHORT, LONG = 8, 32  # tokens per row of the two calibration decodes of each kind (at most the bucket)


def needs_calibration(spec, policy: Any) -> bool:
  """Whether a decode's costs come from :func:`calibrate`: a cost-aware draft length without given
  costs, a branch-free decode (the GPU profile) that verifies a whole chain in one pass (a step then
  costs the same for every ``l``), and chains only (a tree step of each shape would need its own
  forced decodes)."""
  return (isinstance(policy, GoodputDraftLen) and policy.costs is None and spec.branch_free
          and spec.verify_chunk >= spec.max_draft + 1 and not spec.draft_trees)


def forced(spec, *, speculate: bool) -> StepCosts:
  """Step costs under which the cost-aware policy chooses one kind of step every time: every step
  speculative (its whole loop, ``l = L``) or every step plain (and no exploration, since no
  acceptance could make speculation pay)."""
  plain, step = (_NEVER, 1.0) if speculate else (1.0, _NEVER)
  return StepCosts(plain=plain, verify_pass=step, propose_first=0.0, propose_next=0.0,
                   chunk=spec.verify_chunk, fixed_drafts=spec.max_draft)


def calibrate(plan, run: Callable[..., Any], *, repeats: int = 2) -> tuple[Any, float]:
  """The plan with its step costs measured in its own decode program (module docstring).

  Args:
    plan: a ``plan.Plan`` whose policy :func:`needs_calibration`.
    run: ``runner.run`` (passed in: the runner calls this module).
    repeats: timed decodes of each kind and length; the fastest counts (interference only adds time).

  Returns:
    ``(plan, seconds)``: the plan with ``step_costs`` (and its traced copy in the inputs) set to the
    measured :class:`StepCosts` (``plain`` and ``verify_pass`` the seconds of a plain and of a
    speculative step in the loop, ``fixed_drafts`` the loop's ``L``), and the wall seconds the
    measurement took (0 when the setting's costs were remembered).
  """
  spec = plan.spec
  shapes = jax.tree_util.tree_map(lambda x: (np.shape(x), str(getattr(x, "dtype", ""))),
                                  plan.args_prefill)
  key = (spec, plan.rows, str(shapes))
  started = time.perf_counter()
  seconds = 0.0
  with _MEASURING:
    with _LOCK:
      costs = _CACHE.get(key)
    if costs is None:
      costs = StepCosts.stored(compile_cache.load_costs("calibration", key))
    if costs is None:
      timed = np.array([_seconds_per_step(plan, run, forced(spec, speculate=s), repeats)
                        for s in (False, True)])
      if jax.process_count() > 1:  # every process decides from process 0's timings (costs.py too)
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

        timed = np.asarray(multihost_utils.broadcast_one_to_all(timed))
      costs = StepCosts(plain=float(timed[0]), verify_pass=float(timed[1]), propose_first=0.0,
                        propose_next=0.0, chunk=spec.verify_chunk, fixed_drafts=spec.max_draft)
      compile_cache.store_costs("calibration", key, costs.to_json())
      seconds = time.perf_counter() - started
    with _LOCK:
      _CACHE[key] = costs
  return with_costs(plan, costs), seconds


def with_costs(plan, costs: StepCosts):
  """``plan`` deciding its draft lengths from ``costs``: its ``step_costs`` and the traced copy the
  decode reads (``DecodeInputs.step_costs``; the programs do not change)."""
  target_params, draft_params, inputs = plan.args_prefill
  inputs = inputs.replace(step_costs=plan.place(np.asarray(costs.as_array())))
  return dataclasses.replace(plan, args_prefill=(target_params, draft_params, inputs),
                             step_costs=costs, calibrate=False)


def _seconds_per_step(plan, run: Callable[..., Any], costs: StepCosts, repeats: int) -> float:
  """Seconds per step of the plan's decode under ``costs``, from two decodes of the plan's first
  batch of different lengths: the difference of their walls over the difference of their steps."""
  walls, steps = [], []
  for tokens in (min(SHORT, plan.spec.max_new_bucket), min(LONG, plan.spec.max_new_bucket)):
    short = _shortened(with_costs(plan, costs), tokens)
    best = None
    for _ in range(repeats):
      out = run(short, time_prompts=False)
      if best is None or out.stats.wall_seconds < best.stats.wall_seconds:
        best = out
    walls.append(best.stats.wall_seconds)
    steps.append(best.stats.steps)
  whole = walls[1] / max(steps[1], 1)  # the longer call over its steps: prefill included
  if steps[1] > steps[0]:
    per_step = (walls[1] - walls[0]) / (steps[1] - steps[0])
    if 0 < per_step <= whole:  # a per-step cost can only be below the whole call's average
      return per_step
  warnings.warn(f"bass_jax calibration: a decode of {steps[1]} steps was not slower than one of "
                f"{steps[0]} (a busy machine?); taking {whole * 1e3:.3f} ms per step, the longer "
                "call's average, prefill included", stacklevel=2)
  return whole


def _shortened(plan, tokens: int):
  """The plan's first batch only (no admission of the queue's later prompts), ``tokens`` per row."""
  prompts = min(plan.num_prompts, plan.slots)
  target_params, draft_params, inputs = plan.args_prefill
  place = lambda x: plan.place(np.int32(x))
  inputs = inputs.replace(max_new=place(tokens), step_limit=place(tokens),
                          num_prompts=place(prompts))
  return dataclasses.replace(plan, args_prefill=(target_params, draft_params, inputs),
                             num_prompts=prompts, max_new_tokens=tokens)


def clear() -> None:
  """Forgets every calibrated setting."""
  with _LOCK:
    _CACHE.clear()
