"""``run``: a prepared decode (``plan.prepare``) compiled (once per spec and shapes,
``programs.compiled``), run on the device in one jitted ``lax.while_loop`` that returns to the host
only to time a prompt's admission, first token or finish, and read back as a :class:`GenerateOutput`
with every row timed; the second half of the public seam ``run(prepare(...))``.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from bass_jax import _checks
from bass_jax.sampling import calibration
from bass_jax.sampling.outputs import FinishedPrompt, GenerateOutput, GenerateStats
from bass_jax.sampling.plan import Plan
from bass_jax.sampling.programs import compiled
from bass_jax.sampling.state import DecodeState

PAD_TOKEN = -1  # fills ``GenerateOutput.tokens`` past each row's length; never a real token id


def run(plan: Plan, *, time_prompts: bool = True,
        on_finish: Callable[[FinishedPrompt], None] | None = None) -> GenerateOutput:
  """Runs a prepared decode and reads its outputs.

  Args:
    plan: from ``prepare(target, draft, prompts, config)``.
    time_prompts: return to the host at every admission, first token and finish to time each prompt
      (``GenerateStats.admit_seconds``, ``first_token_seconds``, ``finish_seconds``); False runs the
      whole decode as one program call and times only the total.
    on_finish: called on the host with a :class:`FinishedPrompt` for every prompt, once, as soon as
      the decode has returned with it complete (with ``time_prompts``, at the return that saw it
      finish; without, after the single call). Streaming writers (``experiments.generate``) save each
      sequence the moment it exists, so that a killed run loses only the sequences in flight. The
      values equal the prompt's entries of the returned :class:`GenerateOutput`. An exception raised
      by the callback ends the decode and propagates. The callback's own time is excluded from every
      time in the stats.

  Returns:
    :class:`GenerateOutput` with tokens ``i32[B, N]`` (``PAD_TOKEN`` past each length), lengths
    ``i32[B]``, target log-probs ``f32[B, N]``, finished flags and :class:`GenerateStats`, in the
    order of the prompts.

  A plan whose step costs are still to be measured (``Plan.calibrate``: the cost-aware draft length on
  the GPU profile) first times its plain and speculative steps in these same programs
  (``calibration.calibrate``: eight short decodes of its first batch, discarded; once per setting and
  process), ``GenerateStats.calibration_seconds`` long.

  Raises:
    ValueError: ``time_prompts`` not a bool, ``on_finish`` not callable.
    RuntimeError: the decode reached its step limit with prompts left (a bug; please report it).
  """
  time_prompts = check_run_arguments(time_prompts, on_finish)
  observe = plan.place(np.bool_(time_prompts))
  (prefill, decode), compile_seconds, source = compiled(plan.spec, plan.args_prefill,
                                                        (*plan.args_tail, observe))
  calibration_seconds = 0.0
  if plan.calibrate:  # the step costs, timed in these programs (calibration.py)
    plan, calibration_seconds = calibration.calibrate(plan, run)
  host, num_prompts, slots = plan.host, plan.num_prompts, plan.slots

  clock = _PromptClock(num_prompts, started=slots)
  reported = np.zeros(num_prompts, bool)  # prompts handed to on_finish
  start = time.perf_counter()
  state = prefill(*plan.args_prefill)
  while True:
    call_start = time.perf_counter() - start
    state = decode(state, *plan.args_tail, observe)
    done = host(state.done)
    row_prompt = host(state.queue.row_prompt)  # read once per return: the clock and the stop
    if time_prompts:
      generated = host(state.seq_len) - host(state.prompt_len)
      clock.observe(row_prompt, generated, done, call_start, time.perf_counter() - start)
      if on_finish is not None:  # the callback's time (a record written to disk) is not the decode's
        paused = time.perf_counter()
        _report_finished(on_finish, state, host, row_prompt, done, reported, clock, slots=slots)
        start += time.perf_counter() - paused
    if not ((row_prompt >= 0).any() or int(host(state.queue.next)) < num_prompts):
      break  # loop.unfinished, less the step limit
    limit = int(host(state.limits.step_limit))
    if int(host(state.step)) >= limit and not (done & (row_prompt >= 0)).any():
      raise RuntimeError(f"generate: the decode reached its step limit ({limit}) with prompts left; "
                         "this is a bug in bass_jax, please report it with the call's arguments")
  wall = time.perf_counter() - start
  output = _output(plan, state, clock, wall=wall, compile_seconds=compile_seconds,
                   calibration_seconds=calibration_seconds, source=source)
  if on_finish is not None:  # whatever no return reported (time_prompts=False)
    for i in np.flatnonzero(~reported):
      on_finish(output.prompt(int(i)))
  return output


def check_run_arguments(time_prompts: bool, on_finish: Callable | None) -> bool:
  """``time_prompts`` as a bool, ``on_finish`` callable or None.

  Raises:
    ValueError: either of the wrong type (named).
  """
  time_prompts = _checks.as_bool("time_prompts", time_prompts)
  if on_finish is not None and not callable(on_finish):
    raise ValueError(f"on_finish must be callable or None, got {type(on_finish).__name__}")
  return time_prompts


def _output(plan: Plan, state: DecodeState, clock: "_PromptClock", *, wall: float,
            compile_seconds: float, calibration_seconds: float = 0.0,
            source: str = "") -> GenerateOutput:
  """The outputs every prompt retired into the queue, and the stats from the step log."""
  spec, host, n, slots = plan.spec, plan.host, plan.num_prompts, plan.slots
  max_new, queue, log = plan.max_new_tokens, state.queue, state.log
  steps = int(host(state.step))
  out_len = host(queue.lengths)[:n]
  written = np.arange(max_new)[None] < out_len[:, None]
  tokens = np.where(written, host(queue.tokens)[:n, :max_new], PAD_TOKEN).astype(np.int32)
  logprobs = np.where(written, host(queue.logprobs)[:n, :max_new], 0.0).astype(np.float32)
  prompt_rows, prompt_start_steps = host(queue.prompt_row)[:n], host(queue.start_step)[:n]
  accepted = host(log.accepted)[:steps, :slots]
  drafted = host(log.drafted)[:steps, :slots]
  per_prompt = _per_prompt_counts(prompt_rows, prompt_start_steps, steps, accepted, drafted, out_len)
  stats = GenerateStats(
      steps=steps, draft_lens=host(log.draft_len)[:steps], accepted=accepted,
      finish_seconds=clock.finish, wall_seconds=wall, compile_seconds=compile_seconds,
      compiled=source != "memory", prompt_bucket=spec.prompt_len, batch_bucket=plan.rows,
      verify_chunk=spec.verify_chunk, attention_impl=spec.attention_impl, profile=plan.profile,
      admit_rows=spec.admit_rows, admit_chunk=spec.admit_chunk,
      admitted_positions=int(host(queue.prefilled)), verified=host(log.verified)[:steps],
      drafted=drafted, trees=host(log.tree)[:steps], draft_trees=tuple(map(str, spec.draft_trees)),
      sources=host(log.source)[:steps, :slots], proposer=spec.proposer.name,
      step_costs=plan.step_costs,
      mesh={} if spec.target_sharding is None else dict(spec.target_sharding.mesh.shape),
      admit_seconds=clock.admit, first_token_seconds=clock.first_token, batch_size=slots,
      continuous=n > slots, prompt_rows=prompt_rows, prompt_start_steps=prompt_start_steps,
      prompt_steps=per_prompt[0], prompt_drafted=per_prompt[1], prompt_accepted=per_prompt[2],
      calibration_seconds=calibration_seconds, program_source=source,
      prepare_seconds=plan.prepare_seconds)
  return GenerateOutput(tokens=tokens, lengths=out_len, logprobs=logprobs,
                        finished=host(queue.eos)[:n], stats=stats)


class _PromptClock:
  """Per-prompt wall times, read by the host whenever the decode returns (``loop.decode``'s
  ``observe``): admission (the start of the call that prefilled the prompt's row), first token, finish.
  All start NaN; the first ``started`` prompts are admitted by the prefill, at 0."""

  def __init__(self, num_prompts: int, started: int):
    self.admit = np.full(num_prompts, np.nan)
    self.admit[:started] = 0.0
    self.first_token = np.full(num_prompts, np.nan)
    self.finish = np.full(num_prompts, np.nan)

  def observe(self, row_prompt: np.ndarray, generated: np.ndarray, done: np.ndarray,
              call_start: float, now: float) -> None:
    """Stamps what the decode call that started at ``call_start`` and returned at ``now`` did: each row
    serving prompt ``row_prompt[r] >= 0`` was admitted by then, has emitted ``generated[r]`` tokens and
    is ``done[r]`` or not."""
    for prompt, count, finished in zip(row_prompt, generated, done):
      if prompt < 0:
        continue
      for stamps, happened, at in ((self.admit, True, call_start), (self.first_token, count > 0, now),
                                   (self.finish, finished, now)):
        if happened and np.isnan(stamps[prompt]):
          stamps[prompt] = at


def _report_finished(on_finish, state: DecodeState, host, row_prompt: np.ndarray, done: np.ndarray,
                     reported: np.ndarray, clock: _PromptClock, *, slots: int) -> None:
  """Hands every prompt that a done row still holds, and that was not reported yet, to
  ``on_finish``: its tokens read from the row (the queue retires it only at the next round), its
  counts from the row's log since the prompt's admission (:func:`_per_prompt_counts` up to the
  current step: the row is not live after its finish, so the steps since add nothing), its times
  from the clock. Reads the device only when something finished."""
  rows = [r for r, p in enumerate(row_prompt) if p >= 0 and done[r] and not reported[p]]
  if not rows:
    return
  tokens, logprobs = host(state.tokens), host(state.logprobs)
  prompt_len, seq_len, eos = host(state.prompt_len), host(state.seq_len), host(state.eos)
  prompts = row_prompt[rows]
  steps = int(host(state.step))
  counts = _per_prompt_counts(np.asarray(rows), host(state.queue.start_step)[prompts], steps,
                              host(state.log.accepted)[:steps, :slots],
                              host(state.log.drafted)[:steps, :slots], (seq_len - prompt_len)[rows])
  for j, (r, p) in enumerate(zip(rows, prompts)):
    n = int(seq_len[r] - prompt_len[r])
    reported[p] = True
    on_finish(FinishedPrompt(
        index=int(p), tokens=tokens[r, prompt_len[r]:seq_len[r]].astype(np.int32),
        logprobs=logprobs[r, :n].astype(np.float32), finished=bool(eos[r]), row=r,
        admit_seconds=float(clock.admit[p]), first_token_seconds=float(clock.first_token[p]),
        finish_seconds=float(clock.finish[p]), steps=int(counts[0, j]),
        drafted=int(counts[1, j]), accepted=int(counts[2, j])))


def _per_prompt_counts(prompt_rows: np.ndarray, start_steps: np.ndarray, steps: int,
                       accepted: np.ndarray, drafted: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """``i32[3, B]``: live steps, drafts and accepted drafts per prompt, from the per-row log
  ``accepted, drafted: i32[steps, rows]`` (-1 in ``accepted`` where the row was not live): prompt i's
  steps are those of its row from its start to the start of that row's next prompt. Without a log
  (H = 0: a decode without a proposer, one token per step) the steps are the prompts' ``lengths``
  (``i32[B]`` tokens emitted) and nothing was drafted."""
  counts = np.zeros((3, len(prompt_rows)), np.int32)
  if not accepted.shape[0] and steps:  # nothing logged: every step was a plain step
    counts[0] = lengths
    return counts
  if not accepted.size:
    return counts
  order = np.lexsort((start_steps, prompt_rows))  # by row, then by start
  ends = np.full(len(order), steps)
  same_row = prompt_rows[order[1:]] == prompt_rows[order[:-1]]
  ends[order[:-1][same_row]] = start_steps[order[1:][same_row]]
  live = accepted >= 0
  for k, per_step in enumerate((live, np.where(live, drafted, 0), np.where(live, accepted, 0))):
    totals = np.concatenate([np.zeros((1, per_step.shape[1]), np.int64), np.cumsum(per_step, axis=0)])
    counts[k] = totals[ends, prompt_rows] - totals[start_steps, prompt_rows]
  return counts
