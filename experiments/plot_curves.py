r"""Training curves of chained draft runs (fine-tunes of fine-tunes) on one step axis, as a PNG.

    python -m experiments.plot_curves \
        --runs=stage1=results/eagle2_stage1@0,control=results/eagle2_control@1000 \
        --runs=ttt=results/eagle2_ttt@1000,two_layers=results/eagle2_deep@1400 \
        --png=docs/results/figures/eagle2_curves.png

Each run is ``name=<directory holding metrics.jsonl>@<offset>``: the run's step 0 is drawn at
``offset`` (the steps of the runs it started from). Left: the training batches' first-draft agreement
(the mean of each ``--smooth`` logged values). Middle: held-out first-draft agreement. Right: the
held-out simulated mean accepted length (l = the run's ``eval_depth``). Nothing is measured here; the
numbers are the runs' own (``bass_jax.training.distill`` writes them).
"""

import pathlib

from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from bass_jax.training import distill  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import _io  # pylint: disable=g-import-not-at-top,wrong-import-position

_RUNS = flags.DEFINE_multi_string("runs", [], "Comma-separated name=<run directory>@<step offset>.")
# Not --output: experiments.paper.report defines it, and one test process imports both modules.
_PNG = flags.DEFINE_string("png", None, "PNG to write.", required=True)
_SMOOTH = flags.DEFINE_integer("smooth", 5, "Logged training values averaged per point.", lower_bound=1)


def parse_runs(specs: list[str]) -> list[tuple[str, pathlib.Path, int]]:
  """``name=dir@offset`` items (comma-separated, repeatable) as (name, metrics file, offset).

  Raises:
    ValueError: an item not of that form, a repeated name, or a directory without metrics.jsonl.
  """
  runs, names = [], set()
  for item in (part for spec in specs for part in spec.split(",") if part):
    name, sep, rest = item.partition("=")
    path, at, offset = rest.rpartition("@")
    if not (sep and at and name and path and offset.isdigit()):
      raise ValueError(f"--runs: {item!r} is not name=<run directory>@<step offset>, e.g. "
                       "stage1=results/eagle2_stage1@0")
    if name in names:
      raise ValueError(f"--runs: the name {name!r} is given twice")
    metrics = pathlib.Path(path) / "metrics.jsonl"
    if not metrics.is_file():
      raise ValueError(f"--runs: {metrics} does not exist (a run directory of train_eagle or "
                       "train_draft, or its copy under results/)")
    names.add(name)
    runs.append((name, metrics, int(offset)))
  if not runs:
    raise ValueError("--runs: give at least one name=<run directory>@<step offset>")
  return runs


def curves(metrics: pathlib.Path, offset: int, smooth: int) -> dict[str, list[tuple[float, float]]]:
  """The run's (step + offset, value) series: ``train`` (agreement, means of ``smooth`` logged rows),
  ``eval`` (held-out agreement) and ``accepted`` (held-out simulated accepted length). Read through
  ``distill.MetricsLog``, so a resumed run's re-logged steps count once."""
  records = sorted(distill.MetricsLog(metrics).read().items())
  train = [(step + offset, r["agreement"]) for step, r in records if "agreement" in r]
  train = [(train[i + len(chunk) - 1][0], sum(v for _, v in chunk) / len(chunk))
           for i in range(0, len(train), smooth) for chunk in [train[i:i + smooth]]]
  evals = [(step + offset, r) for step, r in records if "eval_agreement" in r]
  return {"train": train,
          "eval": [(step, r["eval_agreement"]) for step, r in evals],
          "accepted": [(step, r["eval_mean_accepted_length"]) for step, r in evals
                       if "eval_mean_accepted_length" in r]}


def main(argv):
  del argv
  _io.init_script()
  try:
    runs = parse_runs(_RUNS.value)
  except ValueError as e:
    raise _io.Refusal(str(e)) from e
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  titles = ("training batches: first-draft agreement", "held out: first-draft agreement",
            "held out: simulated accepted length")
  for name, metrics, offset in runs:
    series = curves(metrics, offset, _SMOOTH.value)
    for ax, key in zip(axes, ("train", "eval", "accepted")):
      if series[key]:
        xs, ys = zip(*series[key])
        ax.plot(xs, ys, marker="o" if key != "train" else None, label=name)
  for ax, title in zip(axes, titles):
    ax.set_title(title)
    ax.set_xlabel("optimizer steps, from the first run's start")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.tight_layout()
  out = pathlib.Path(_PNG.value)
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=110)
  print(f"wrote {out}")


if __name__ == "__main__":
  _io.run(main)
