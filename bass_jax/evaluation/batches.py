"""How a run lays its prompts out in batches, and names each sequence across runs.

:func:`make_batches` and :func:`sequence_plan` arrange a prompt set into the batches
``experiment.run_problems`` decodes (distinct prompts, B samples of each, or s samples spread over
batches, grouped or interleaved); :func:`record_key` names a sequence by ``(task_id, sample_index)``,
which is how a resumed run finds the records it has (:func:`check_done`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from bass_jax import _checks
from bass_jax.evaluation.data import Problem


SAMPLE_ORDERS = ("grouped", "interleaved")


def make_batches(problems: Sequence[Problem], batch_size: int, distinct_prompts: bool,
                 samples_per_prompt: int | None = None,
                 sample_order: str = "grouped") -> list[list[Problem]]:
  """The batches a run decodes, one list of problems (one per row) each.

  ``distinct_prompts``: consecutive groups of ``batch_size`` different problems, one sequence each (the
  last group is smaller when ``batch_size`` does not divide the number of problems); otherwise one batch
  of ``batch_size`` copies per problem (the paper's B samples per prompt, which only diverge when
  sampling). ``samples_per_prompt`` s, when given, overrides it: every problem s times in a row,
  cut into consecutive batches of ``batch_size`` (s = 1 is distinct prompts without their minimum,
  s = ``batch_size`` one prompt per batch; s = 8 at B = 4 spreads a prompt's samples over two
  batches, and over the rows of a continuous batch). ``sample_order`` places those samples:
  ``"grouped"`` (a problem's s samples in a row, as above) or ``"interleaved"`` (round robin over the
  problems: every problem's first sample, then every problem's second, and so on). Interleaved, the
  queue of a continuous batch admits a problem's later samples after its earlier ones finished, so
  that sibling lookup (``SiblingProposer``'s pool) drafts them from finished text instead of from
  siblings decoding in lockstep; grouped, the siblings decode side by side.

  Raises:
    ValueError: no problems, ``batch_size < 1`` or ``samples_per_prompt < 1``, distinct prompts with
      fewer problems than ``batch_size`` (a batch of distinct prompts needs that many), or a
      ``sample_order`` other than those above (or ``"interleaved"`` without ``samples_per_prompt``).
  """
  batch_size = _checks.as_int("batch_size", batch_size, min_value=1)
  if not problems:
    raise ValueError("no problems to decode")
  if sample_order not in SAMPLE_ORDERS:
    raise ValueError(f"sample_order must be one of {SAMPLE_ORDERS}, got {sample_order!r}")
  if sample_order != "grouped" and samples_per_prompt is None:
    raise ValueError(f"sample_order={sample_order!r} orders several samples of each prompt: give "
                     "samples_per_prompt too")
  if samples_per_prompt is not None:
    samples = _checks.as_int("samples_per_prompt", samples_per_prompt, min_value=1)
    if sample_order == "grouped":
      rows = [p for p in problems for _ in range(samples)]
    else:
      rows = [p for _ in range(samples) for p in problems]
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
  if not distinct_prompts:
    return [[p] * batch_size for p in problems]
  if len(problems) < batch_size:
    raise ValueError(
        f"distinct_prompts needs at least batch_size={batch_size} prompts, got {len(problems)}; "
        "pass more prompts, or distinct_prompts=False to decode batch_size samples of each prompt")
  return [list(problems[i:i + batch_size]) for i in range(0, len(problems), batch_size)]


def sequence_plan(problems: Sequence[Problem], batch_size: int, distinct_prompts: bool,
                  samples_per_prompt: int | None = None,
                  sample_order: str = "grouped") -> list[list[tuple[Problem, int]]]:
  """:func:`make_batches` with each sequence's ``sample_index`` (its count among the sequences of the
  same ``task_id``, in batch order): ``(task_id, sample_index)`` names a sequence across runs, which is
  how a resumed run finds the records it already has.

  Raises:
    ValueError: as :func:`make_batches`.
  """
  counts: dict[str, int] = {}
  plan = []
  for batch in make_batches(problems, batch_size, distinct_prompts, samples_per_prompt, sample_order):
    rows = []
    for problem in batch:
      rows.append((problem, counts.get(problem.task_id, 0)))
      counts[problem.task_id] = rows[-1][1] + 1
    plan.append(rows)
  return plan


def check_done(plan: Sequence[Sequence[tuple[Problem, int]]],
               done: Mapping[tuple[str, int], Any]) -> None:
  """Checks that every sequence in ``done`` (keyed by :func:`record_key`) is one ``plan``
  (:func:`sequence_plan`) decodes.

  Raises:
    ValueError: ``done`` holds sequences the plan does not (a few named, and their count).
  """
  planned = {(p.task_id, k) for batch in plan for p, k in batch}
  strangers = sorted(set(done) - planned)
  if strangers:
    raise ValueError(f"done holds {len(strangers)} sequences this run does not plan, e.g. "
                     f"{strangers[:3]} (records of another prompt set or batch arrangement?)")


def record_key(record: dict[str, Any]) -> tuple[str, int]:
  """``(task_id, sample_index)``: the sequence a record belongs to (:func:`sequence_plan`)."""
  return str(record["task_id"]), int(record["sample_index"])
