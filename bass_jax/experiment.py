"""Decode a prompt set batch by batch and summarize it with the paper's metrics (BASS.md §5).

The experiment scripts in ``experiments/`` parse flags and call :func:`run_problems`; everything they
report is computed here, so the scripts stay thin and the numbers have one definition.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
import tqdm

from bass_jax import humaneval, metrics
from bass_jax.data import Problem
from bass_jax.loading import Model
from bass_jax.sampling.generate import generate

# Order of the summary table (and of the JSON keys the issue fixes).
SUMMARY_KEYS = (
    "method", "batch_size", "num_prompts", "max_new_tokens", "temperature", "top_p", "draft_len",
    "ms_per_token_first", "ms_per_token_last", "ms_per_token_all", "tokens_per_second",
    "mean_accepted_length", "draft_acceptance_rate", "steps", "wall_seconds", "compile_seconds",
)


@dataclasses.dataclass(frozen=True)
class RunResult:
  """Records (one per sequence) and the summary of a run."""

  records: list[dict[str, Any]]
  summary: dict[str, Any]


def run_problems(
    target: Model,
    draft: Model | None,
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
    verify_buckets: Sequence[int] | None = None,
    check: bool = False,
    progress: bool = True,
) -> RunResult:
  """Decodes ``batch_size`` sequences of every problem (one batch per problem) and summarizes.

  Latency per sequence is measured as in the paper (BASS §4.1, ../shared/BASS.md §5): a sequence's
  per-token latency is the wall time from the start of its batch's prefill until the decode loop
  returned with that sequence complete, divided by its number of tokens. ``generate`` returns to the
  host whenever a sequence finishes, so each completion is timed without a per-step round trip. First
  / Last / All are that latency for the first sequence to finish, the last one, and the mean over the
  batch; the summary averages each over the problems. Compilation is timed apart and excluded.
  ``tokens_per_second`` is all emitted tokens over the summed batch wall time.

  Args:
    target, draft: models sharing a tokenizer; ``target.tokenizer`` must be set.
    problems: prompts; each becomes one batch of ``batch_size`` identical prompts.
    batch_size: sequences per prompt, >= 1.
    method, max_new_tokens, temperature, top_p, draft_len, attention_impl, verify_buckets: as in
      ``generate``.
    seed: problem i uses seed ``seed + i``.
    check: run HumanEval's unit tests on every completion (``bass_jax.humaneval``, outside this
      process): records get ``passed``, the summary ``pass_at_batch`` (share of problems where some
      sequence passes).
    progress: show a progress bar over problems.

  Returns:
    :class:`RunResult`: per-sequence records (``task_id, sample_index, completion, num_tokens,
    mean_logprob, finished, finish_seconds``, and ``passed`` with ``check``) and the summary (keys
    :data:`SUMMARY_KEYS` plus analytic ``useful_flops`` / ``executed_flops`` (``metrics.decode_flops``),
    the models, attention implementation, device and JAX version).

  Raises:
    ValueError: ``batch_size < 1``, no problems, no tokenizer; and whatever ``generate`` rejects.
  """
  if not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
  if not problems:
    raise ValueError("no problems to decode")
  tokenizer = target.tokenizer
  if tokenizer is None:
    raise ValueError(f"target {target.name!r} has no tokenizer; load one that ships it")

  records: list[dict[str, Any]] = []
  latencies: list[metrics.Latency] = []
  accept_parts: list[metrics.Acceptance] = []
  steps = tokens = draft_len_sum = 0
  wall = compile_seconds = useful_flops = executed_flops = 0.0
  bar = tqdm.tqdm(problems, desc=f"{method} B={batch_size}", unit="prompt", disable=not progress)
  for i, problem in enumerate(bar):
    prompt_ids = tokenizer(problem.prompt).input_ids
    out = generate(target, draft, [prompt_ids] * batch_size, method=method,
                   max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                   draft_len=draft_len, seed=seed + i, attention_impl=attention_impl,
                   verify_buckets=verify_buckets)
    stats = out.stats
    latencies.append(metrics.per_token_latency(stats.finish_seconds, out.lengths))
    if method == "bass":
      accept_parts.append(metrics.acceptance(stats.draft_lens, stats.accepted))
    flops = metrics.decode_flops(target, draft, np.full(batch_size, len(prompt_ids)), out,
                                 method=method)
    useful_flops += flops.useful
    executed_flops += flops.executed
    steps += stats.steps
    draft_len_sum += int(stats.draft_lens.sum())
    tokens += int(out.lengths.sum())
    wall += stats.wall_seconds
    compile_seconds += stats.compile_seconds
    for j, seq in enumerate(out.sequences()):
      records.append({
          "task_id": problem.task_id,
          "sample_index": j,
          "completion": tokenizer.decode(seq, skip_special_tokens=True),
          "num_tokens": len(seq),
          "mean_logprob": float(np.mean(out.logprobs[j, :len(seq)])),
          "finished": bool(out.finished[j]),
          "finish_seconds": float(stats.finish_seconds[j]),
      })
    bar.set_postfix(ms_per_token=f"{latencies[-1].all:.1f}")

  pass_at_batch = None
  if check:
    by_id = {p.task_id: p for p in problems}
    passed = humaneval.check_completions([by_id[r["task_id"]] for r in records],
                                         [r["completion"] for r in records])
    for record, ok in zip(records, passed):
      record["passed"] = ok
    pass_at_batch = float(np.mean([
        metrics.pass_at_batch([r["passed"] for r in records if r["task_id"] == p.task_id])
        for p in problems]))
  accept = metrics.Acceptance.pooled(accept_parts) if accept_parts else None
  device = jax.devices()[0]
  summary = {
      "method": method,
      "batch_size": batch_size,
      "num_prompts": len(problems),
      "max_new_tokens": max_new_tokens,
      "temperature": temperature,
      "top_p": top_p,
      "draft_len": str(draft_len) if method == "bass" else None,
      "ms_per_token_first": float(np.mean([l.first for l in latencies])),
      "ms_per_token_last": float(np.mean([l.last for l in latencies])),
      "ms_per_token_all": float(np.mean([l.all for l in latencies])),
      "tokens_per_second": tokens / wall,
      "mean_accepted_length": accept.mean_accepted_length if accept else 1.0,
      "draft_acceptance_rate": accept.draft_acceptance_rate if accept else None,
      "steps": steps,
      "mean_draft_len": draft_len_sum / steps if method == "bass" else None,
      "wall_seconds": wall,
      "compile_seconds": compile_seconds,
      "tokens": tokens,
      "pass_at_batch": pass_at_batch,
      "useful_flops": useful_flops,
      "executed_flops": executed_flops,
      "target": target.name,
      "draft": draft.name if (draft is not None and method == "bass") else None,
      "attention_impl": attention_impl,
      "verify_buckets": list(verify_buckets) if verify_buckets else "default",
      "device": f"{device.platform}:{device.device_kind}",
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
