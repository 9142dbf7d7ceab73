"""Decode a prompt set batch by batch and summarize it with the paper's metrics (BASS §4.1).

The experiment scripts in ``experiments/`` parse flags and call :func:`run_problems`; everything they
report is computed here, so the scripts stay thin and the numbers have one definition.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

from bass_jax import _checks, humaneval, metrics, text
from bass_jax.data import Problem
from bass_jax.loading import Model
from bass_jax.sampling.generate import generate

# Order of the summary table: the paper's latency metrics first.
SUMMARY_KEYS = (
    "method", "batch_size", "continuous", "num_prompts", "distinct_prompts", "max_new_tokens",
    "temperature",
    "top_p", "draft_len", "ms_per_token_first", "ms_per_token_last", "ms_per_token_all",
    "tokens_per_second", "mean_accepted_length", "draft_acceptance_rate", "length_spread",
    "accepted_spread", "steps", "wall_seconds", "compile_seconds",
)


@dataclasses.dataclass(frozen=True)
class RunResult:
  """Records (one per sequence) and the summary of a run."""

  records: list[dict[str, Any]]
  summary: dict[str, Any]


def make_batches(problems: Sequence[Problem], batch_size: int,
                 distinct_prompts: bool) -> list[list[Problem]]:
  """The batches a run decodes, one list of problems (one per row) each.

  ``distinct_prompts``: consecutive groups of ``batch_size`` different problems, one sequence each (the
  last group is smaller when ``batch_size`` does not divide the number of problems); otherwise one batch
  of ``batch_size`` copies per problem (the paper's B samples per prompt, which only diverge when
  sampling).

  Raises:
    ValueError: no problems, ``batch_size < 1``, or distinct prompts with fewer problems than
      ``batch_size`` (a batch of distinct prompts needs that many).
  """
  batch_size = _checks.as_int("batch_size", batch_size, min_value=1)
  if not problems:
    raise ValueError("no problems to decode")
  if not distinct_prompts:
    return [[p] * batch_size for p in problems]
  if len(problems) < batch_size:
    raise ValueError(
        f"distinct_prompts needs at least batch_size={batch_size} prompts, got {len(problems)}; "
        "pass more prompts, or distinct_prompts=False to decode batch_size samples of each prompt")
  return [list(problems[i:i + batch_size]) for i in range(0, len(problems), batch_size)]


def run_problems(
    target: Model,
    draft: Any,
    problems: Sequence[Problem],
    *,
    batch_size: int,
    method: str = "bass",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    draft_len: int | str = "dynamic",
    seed: int = 0,
    attention_impl: str = "reference",
    verify_chunk: int | None = None,
    distinct_prompts: bool | None = None,
    check: bool = False,
    progress: bool = True,
    warmup: bool = False,
    on_batch: Callable[[list[dict[str, Any]]], None] | None = None,
    continuous: bool = False,
) -> RunResult:
  """Decodes the problems batch by batch (:func:`make_batches`), or with continuous batching, and
  summarizes with the paper's metrics.

  Latency per sequence is measured as in the paper (BASS §4.1; docs/bass.md, "Metrics"): a sequence's
  per-token latency is the wall time from the start of its decoding (its batch's prefill; with
  continuous batching, its admission into a row) until the decode loop returned with that sequence
  complete, divided by its number of tokens. ``generate`` returns to the host whenever a sequence
  finishes, so each completion is timed without a per-step round trip. First / Last / All are that
  latency for the first sequence to finish, the last one, and the mean over the batch; the summary
  averages each over the batches (continuous batching has no batches: All is the mean over every
  sequence, First and Last are None). Compilation is timed apart and excluded. ``tokens_per_second``
  is all emitted tokens over the summed batch wall time (continuous: the one call's wall time).

  Args:
    target: the target, with its tokenizer. draft: the draft side as ``generate`` takes it (a
      ``Model`` sharing the tokenizer, an ``NGramProposer``, a ``Hybrid``).
    problems: prompts.
    batch_size: rows per batch, >= 1.
    method, max_new_tokens, temperature, top_p, draft_len, attention_impl, verify_chunk: as in
      ``generate``.
    seed: batch i uses seed ``seed + i``.
    distinct_prompts: each batch holds ``batch_size`` different prompts, one sequence each; else
      ``batch_size`` sequences of one prompt. None (default) means distinct at temperature 0, where
      copies of one prompt would be identical rows (nothing ragged, First = Last), and samples per
      prompt otherwise (the paper's setting).
    check: run HumanEval's unit tests on every completion (``bass_jax.humaneval``, outside this
      process): records get ``passed``, the summary ``pass_at_batch`` (share of problems where some
      sequence passes).
    progress: show a progress bar over batches.
    warmup: decode the first batch once, untimed and discarded, before the measured batches. A program's
      first execution costs more than the next ones, beyond its compilation (seen on this CPU at every
      batch size): without a warm-up that one-time cost lands on the first batch, which at B = 8 with 8
      prompts is the whole run.
    on_batch: called with each batch's records as soon as the batch is decoded (scripts append them to
      their JSONL file, so an interrupted run keeps every finished batch).
    continuous: decode every sequence of every batch in one ``generate`` call with
      ``batch_size=batch_size``: a row that finishes takes the next waiting sequence (continuous
      batching), in the order of the batches (with no more sequences than ``batch_size`` this is one
      static batch, and the summary says ``continuous: False``). ``on_batch`` then receives all records at the end, and
      ``warmup`` is ignored (a warm-up would need the whole run's shapes; the first execution's extra
      cost is paid once, inside the measured run).

  Returns:
    :class:`RunResult`: per-sequence records (``task_id, sample_index, batch_index, row, batch_size,
    prompt_tokens, completion, num_tokens, accepted_drafts, mean_logprob, finished, finish_seconds``
    (from the start of the sequence's decoding), ``wait_seconds`` (from the run's start until its
    decoding started: the summed wall time of earlier batches, or its wait in the queue),
    ``ttft_seconds`` (from the run's start until its first token, the wait included), and ``passed``
    with ``check``; ``batch_index`` is None with ``continuous``) and the summary (keys :data:`SUMMARY_KEYS`; the raggedness means
    ``length_spread``, ``emitted_spread``, ``accepted_spread`` (``metrics.raggedness``); BASS's
    ``position_acceptance`` and ``acceptance`` (``metrics.Acceptance``'s counts, which pool across
    runs), the cost-aware policy's ``step_costs`` (``draft_len.StepCosts``, seconds),
    ``mean_draft_len`` and ``plain_step_share`` (steps whose draft length was 0, e.g. chosen by the
    cost-aware policy); analytic
    ``useful_flops`` / ``executed_flops`` (``metrics.decode_flops``); the models, attention
    implementation, device and JAX version).

  Raises:
    ValueError: ``batch_size < 1``, no problems, too few problems for distinct batches, no tokenizer;
      and whatever ``generate`` rejects.
  """
  if distinct_prompts is None:
    distinct_prompts = temperature == 0
  batches = make_batches(problems, batch_size, _checks.as_bool("distinct_prompts", distinct_prompts))
  if _checks.as_bool("continuous", continuous):
    batches = [[p for batch in batches for p in batch]]  # one queue, batch_size rows at a time
  tokenizer = target.tokenizer
  if tokenizer is None:
    raise ValueError(f"target {target.name!r} has no tokenizer; load one that ships it")

  records: list[dict[str, Any]] = []
  latencies: list[metrics.Latency] = []
  ragged: list[metrics.Raggedness] = []
  accept_parts: list[metrics.Acceptance] = []
  steps = tokens = draft_len_sum = verified_sum = plain_steps = 0
  wall = compile_seconds = useful_flops = executed_flops = 0.0
  sample_counts: dict[str, int] = {}
  step_costs = None
  import tqdm  # pylint: disable=g-import-not-at-top  (the [experiments] extra)

  def decode(prompt_ids: list[list[int]], batch_seed: int):
    return generate(target, draft, prompt_ids, method=method, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, draft_len=draft_len, seed=batch_seed,
                    attention_impl=attention_impl, verify_chunk=verify_chunk, batch_size=batch_size)

  encode = lambda batch: text.encode_prompts(tokenizer, [p.prompt for p in batch])
  if warmup and not continuous:  # untimed; its compilation is still reported
    compile_seconds = decode(encode(batches[0]), seed).stats.compile_seconds
  bar = tqdm.tqdm(batches, desc=f"{method} B={batch_size}", unit="batch", disable=not progress)
  for i, batch in enumerate(bar):
    prompt_ids = encode(batch)
    out = decode(prompt_ids, seed + i)
    stats = out.stats
    step_costs = stats.step_costs  # the same for every batch of a run (measured once per setting)
    prompt_lengths = np.array([len(p) for p in prompt_ids])
    # Each sequence from the start of its own decoding: its batch's start, or its admission.
    own_seconds = stats.finish_seconds - stats.admit_seconds
    latencies.append(metrics.per_token_latency(own_seconds, out.lengths))
    if not stats.continuous:  # a continuous batch has no batches to be ragged within
      ragged.append(metrics.raggedness(prompt_lengths, out.lengths,
                                       stats.accepted if method == "bass" else None))
    if method == "bass":
      accept_parts.append(metrics.acceptance(stats.draft_lens, stats.accepted, stats.drafted))
    flops = metrics.decode_flops(target, draft, prompt_lengths, out, method=method)
    useful_flops += flops.useful
    executed_flops += flops.executed
    steps += stats.steps
    draft_len_sum += int(stats.draft_lens.sum())
    plain_steps += int((stats.draft_lens == 0).sum())
    verified_sum += int(stats.verified.sum())
    tokens += int(out.lengths.sum())
    run_start = wall  # the run's clock: the summed wall time of the batches before this one
    wall += stats.wall_seconds
    compile_seconds += stats.compile_seconds
    batch_records = []
    for j, (problem, seq) in enumerate(zip(batch, out.sequences())):
      sample_index = sample_counts.get(problem.task_id, 0)
      sample_counts[problem.task_id] = sample_index + 1
      batch_records.append({
          "task_id": problem.task_id,
          "sample_index": sample_index,
          "batch_index": None if continuous else i,
          "row": int(stats.prompt_rows[j]),
          "batch_size": stats.batch_size,
          "prompt_tokens": int(prompt_lengths[j]),
          "completion": tokenizer.decode(seq, skip_special_tokens=True),
          "num_tokens": len(seq),
          "accepted_drafts": int(stats.prompt_accepted[j]) if method == "bass" else None,
          "mean_logprob": float(np.mean(out.logprobs[j, :len(seq)])),
          "finished": bool(out.finished[j]),
          "finish_seconds": float(own_seconds[j]),
          "wait_seconds": run_start + float(stats.admit_seconds[j]),
          "ttft_seconds": run_start + float(stats.first_token_seconds[j]),
      })
    if check:
      passed = humaneval.check_completions(batch, [r["completion"] for r in batch_records])
      for record, ok in zip(batch_records, passed):
        record["passed"] = ok
    records.extend(batch_records)
    if on_batch is not None:
      on_batch(batch_records)
    bar.set_postfix(ms_per_token=f"{latencies[-1].all:.1f}")

  pass_at_batch = None
  if check:
    task_ids = list(dict.fromkeys(r["task_id"] for r in records))
    pass_at_batch = float(np.mean([
        metrics.pass_at_batch([r["passed"] for r in records if r["task_id"] == t]) for t in task_ids]))
  accept = metrics.Acceptance.pooled(accept_parts) if accept_parts else None
  device = jax.devices()[0]
  summary = {
      "method": method,
      "batch_size": batch_size,
      "num_prompts": len(problems),
      "distinct_prompts": distinct_prompts,
      "num_batches": len(batches),
      "max_new_tokens": max_new_tokens,
      "temperature": temperature,
      "top_p": top_p,
      "draft_len": str(draft_len) if method == "bass" else None,
      "continuous": stats.continuous,
      "ms_per_token_first": None if stats.continuous else float(np.mean([l.first for l in latencies])),
      "ms_per_token_last": None if stats.continuous else float(np.mean([l.last for l in latencies])),
      "ms_per_token_all": float(np.mean([l.all for l in latencies])),
      "mean_wait_seconds": float(np.mean([r["wait_seconds"] for r in records])),
      "mean_ttft_seconds": float(np.mean([r["ttft_seconds"] for r in records])),
      "tokens_per_second": tokens / wall,
      "mean_accepted_length": accept.mean_accepted_length if accept else 1.0,
      "draft_acceptance_rate": accept.draft_acceptance_rate if accept else None,
      "position_acceptance": list(accept.position_acceptance) if accept else None,
      "acceptance": dataclasses.asdict(accept) if accept else None,
      # Raggedness within a batch (None with continuous batching, which has no batches).
      "length_spread": float(np.mean([r.length_spread for r in ragged])) if ragged else None,
      "emitted_spread": float(np.mean([r.emitted_spread for r in ragged])) if ragged else None,
      "accepted_spread": float(np.mean([r.accepted_spread for r in ragged])) if ragged else None,
      "steps": steps,
      "mean_draft_len": draft_len_sum / steps if method == "bass" else None,
      "plain_step_share": plain_steps / steps if method == "bass" else None,
      "step_costs": dataclasses.asdict(step_costs) if step_costs is not None else None,
      "mean_verified": verified_sum / steps if method == "bass" else None,
      "wall_seconds": wall,
      "compile_seconds": compile_seconds,
      "tokens": tokens,
      "pass_at_batch": pass_at_batch,
      "useful_flops": useful_flops,
      "executed_flops": executed_flops,
      "target": target.name,
      "draft": draft.name if method == "bass" else None,
      "attention_impl": attention_impl,
      "verify_chunk": verify_chunk or "default",
      "device": f"{device.platform}:{device.device_kind}",
      "mesh": stats.mesh or None,  # the mesh generate ran on (None: one device)
      "processes": jax.process_count(),
      "jax_version": jax.__version__,
  }
  return RunResult(records, summary)


def format_summary(summary: dict[str, Any]) -> str:
  """The summary as an aligned two-column table (the keys of :data:`SUMMARY_KEYS` first)."""
  keys = list(SUMMARY_KEYS) + [k for k in summary if k not in SUMMARY_KEYS]
  width = max(len(k) for k in keys)

  def fmt(v):
    if isinstance(v, float):
      return "nan" if math.isnan(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)

  return "\n".join(f"{k:<{width}}  {fmt(summary.get(k))}" for k in keys)
