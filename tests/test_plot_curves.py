"""experiments.plot_curves: chained runs on one step axis, and its refusals."""

import json

import numpy as np
import pytest

from experiments import plot_curves


def _write_run(directory, rng, steps=(10, 20, 30, 40), evals=(0, 40)):
  directory.mkdir()
  train = {s: float(rng.uniform(0.3, 0.9)) for s in steps}
  held = {s: (float(rng.uniform(0.3, 0.9)), float(rng.uniform(1, 3))) for s in evals}
  rows = [{"step": s, "agreement": a, "loss": 1.0} for s, a in train.items()]
  rows += [{"step": s, "eval_loss": 1.0, "eval_agreement": a, "eval_mean_accepted_length": m}
           for s, (a, m) in held.items()]
  (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return train, held


def test_curves_shift_by_the_offset_and_average_the_training_rows(tmp_path):
  rng = np.random.default_rng()
  train, held = _write_run(tmp_path / "run", rng)
  [(name, metrics, offset)] = plot_curves.parse_runs([f"stage2={tmp_path / 'run'}@1000"])
  assert (name, offset) == ("stage2", 1000)
  series = plot_curves.curves(metrics, offset, smooth=3)
  values = list(train.values())
  assert series["train"] == [(1030, pytest.approx(np.mean(values[:3]))), (1040, values[3])]
  assert series["eval"] == [(1000 + s, a) for s, (a, _) in held.items()]
  assert series["accepted"] == [(1000 + s, m) for s, (_, m) in held.items()]


@pytest.mark.parametrize("spec,match", [
    ("stage1=results/x", "name=<run directory>@<step offset>"),
    ("stage1=RUN@ten", "name=<run directory>@<step offset>"),
    ("=RUN@0", "name=<run directory>@<step offset>"),
    ("a=RUN@0,a=RUN@5", "given twice"),
    ("a=MISSING@0", "does not exist"),
])
def test_bad_runs_are_refused_by_name(tmp_path, spec, match):
  _write_run(tmp_path / "run", np.random.default_rng())
  spec = spec.replace("RUN", str(tmp_path / "run")).replace("MISSING", str(tmp_path / "none"))
  with pytest.raises(ValueError, match=match):
    plot_curves.parse_runs([spec])
