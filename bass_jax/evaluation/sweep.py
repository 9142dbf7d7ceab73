"""Decode benchmarks with one timing policy: variants of a decode over a grid of ``DecodeConfig``
settings, side by side in one process.

A *variant* is a draft side and the ``DecodeConfig`` settings that make it what it is (regular
decoding; BASS with a draft at some draft length; a token tree). The *grid* is the product of the
swept settings (``batch_size`` in ``1, 4, 16``; ``temperature`` in ``0, 0.6``). Every cell, a grid
point and a variant, decodes the same prompts through :func:`experiment.run_problems`, so each metric
has the definition the paper's scripts report (BASS §4.1; docs/bass.md, "Metrics").

The timing policy, the one every decode benchmark of the project follows:

- **Compile apart, then warm up**: each run compiles first (timed apart, in ``compile_seconds``)
  and decodes its first batch once untimed (``run_problems(warmup=True)``): a fresh program's first
  execution costs more.
- **Repeats in alternating order**: at a grid point the variants run in turn, ``rounds`` times, in
  reverse order every other round, so that a machine that drifts (these are shared, noisy machines)
  slows every variant alike.
- **Medians**: a cell reports each metric's median over its rounds.
- **Same-process ratios**: a variant's ``speedup`` is the median over the rounds of the baseline's
  per-token latency divided by the variant's in the same round; ratios, not absolute times, are what
  carry from one machine to another (an absolute time means something only on the machine named).

``experiments/benchmarks/sweep.py`` is the command line (flags for the variants, the grid, the
prompts; JSON and a markdown table, resumable by grid point).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from typing import Any, Callable, Mapping, Sequence

from bass_jax.evaluation import experiment
from bass_jax.evaluation.data import Problem
from bass_jax.loading import Model
from bass_jax.sampling import config as config_lib
from bass_jax.sampling.config import DecodeConfig

# The summary metrics a cell keeps per round (run_problems' summary keys), the latency first.
METRICS = ("ms_per_token_all", "ms_per_token_first", "ms_per_token_last", "tokens_per_second",
           "mean_accepted_length", "draft_acceptance_rate", "mean_draft_len", "mean_verified",
           "plain_step_share", "tree_step_share", "mean_tree_nodes", "steps", "wall_seconds",
           "compile_seconds")

# The markdown table's metric columns: (summary key, header, format). A column no cell has a value
# for (regular decoding's acceptance, a chain's tree steps) is left out.
COLUMNS = (("ms_per_token_all", "ms/token All", "{:.2f}"), ("tokens_per_second", "tokens/s", "{:.1f}"),
           ("mean_accepted_length", "accepted length", "{:.2f}"),
           ("draft_acceptance_rate", "draft acceptance", "{:.3f}"),
           ("mean_draft_len", "mean l_draft", "{:.2f}"),
           ("mean_verified", "positions verified per step", "{:.2f}"),
           ("plain_step_share", "plain steps", "{:.2f}"), ("tree_step_share", "tree steps", "{:.2f}"),
           ("mean_tree_nodes", "nodes per tree", "{:.1f}"), ("compile_seconds", "compile s", "{:.1f}"))


@dataclasses.dataclass(frozen=True)
class Variant:
  """One decode configuration of a sweep.

  Attributes:
    name: its row label, unique in the sweep.
    draft: the draft side as ``generate`` takes it (a ``Model``, a proposer, a ``Hybrid``), or None
      for regular decoding.
    settings: ``DecodeConfig`` fields (name -> value) it sets; a variant without a draft and without
      ``method`` decodes with ``method="regular"``.
  """

  name: str
  draft: Any = None
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def decode_settings(self) -> dict[str, Any]:
    """Its settings, with ``method="regular"`` where it has no draft and names no method."""
    if self.draft is None and "method" not in self.settings:
      return {"method": "regular", **self.settings}
    return dict(self.settings)


@dataclasses.dataclass(frozen=True)
class Cell:
  """What one variant measured at one grid point.

  Attributes:
    point: the swept settings (field -> value) of the grid point.
    variant: the variant's name.
    rounds: per round, the :data:`METRICS` of ``run_problems``' summary (None where it has none).
    speedup: the median over rounds of the baseline's ``ms_per_token_all`` divided by this variant's
      in the same round (1.0 for the baseline); None without a baseline.
  """

  point: dict[str, Any]
  variant: str
  rounds: list[dict[str, Any]]
  speedup: float | None

  def median(self, metric: str) -> float | None:
    """The metric's median over the rounds; None if some round lacks it."""
    values = [r.get(metric) for r in self.rounds]
    return None if not values or None in values else float(statistics.median(values))

  def to_json(self) -> dict[str, Any]:
    """A JSON-ready record: point, variant, speedup, the medians and the rounds."""
    return {"point": self.point, "variant": self.variant, "speedup": self.speedup,
            "median": {m: self.median(m) for m in METRICS}, "rounds": self.rounds}

  @classmethod
  def from_json(cls, record: Mapping[str, Any]) -> Cell:
    """The cell :meth:`to_json` wrote."""
    return cls(dict(record["point"]), record["variant"], list(record["rounds"]), record["speedup"])


def grid(axes: Mapping[str, Sequence[Any]] | None) -> list[dict[str, Any]]:
  """The grid points of ``axes`` (field -> values), the last axis varying fastest; one empty point
  without axes.

  Raises:
    ValueError: an axis that is not a ``DecodeConfig`` field, or one without values.
  """
  axes = dict(axes or {})
  fields = {f.name for f in dataclasses.fields(DecodeConfig)}
  for name, values in axes.items():
    if name not in fields:
      raise ValueError(f"swept setting {name!r} is not a DecodeConfig field; the fields are "
                       f"{sorted(fields)}")
    if not len(values):
      raise ValueError(f"swept setting {name!r} has no values; give at least one")
  return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def point_key(point: Mapping[str, Any]) -> str:
  """A grid point's stable text key (``"batch_size=4, temperature=0.6"``; ``""`` for the empty
  point), which a resumed sweep looks its finished points up by."""
  return ", ".join(f"{k}={point[k]}" for k in point)


def check(variants: Sequence[Variant], axes: Mapping[str, Sequence[Any]] | None,
          baseline: str | None, base: DecodeConfig | None = None) -> list[dict[str, Any]]:
  """Checks a sweep before anything decodes, and returns its grid points.

  Every cell's settings must make a ``DecodeConfig`` whose speculation settings agree
  (``config.check_speculation``).

  Raises:
    ValueError: no variants, a repeated or empty name, a baseline that is not a variant, a setting a
      variant fixes that is also swept, or a cell whose settings ``check_speculation`` refuses
      (naming the cell).
    TypeError: a variant's setting that is not a ``DecodeConfig`` field.
  """
  if not variants:
    raise ValueError("a sweep needs at least one variant")
  names = [v.name for v in variants]
  for name in names:
    if not name or names.count(name) > 1:
      raise ValueError(f"variant names must be unique and non-empty; got {names}")
  if baseline is not None and baseline not in names:
    raise ValueError(f"baseline {baseline!r} is not a variant; the variants are {names}")
  points = grid(axes)
  for variant in variants:
    both = sorted(set(variant.settings) & set(axes or {}))
    if both:
      raise ValueError(f"variant {variant.name!r} fixes {both[0]!r}, which the sweep also varies; "
                       "drop one of the two")
    for point in points:
      config = config_lib.with_settings(base, {**point, **variant.decode_settings()})
      try:
        config_lib.check_speculation(config.method, config.draft_len, config.draft_tree)
      except ValueError as e:
        raise ValueError(f"variant {variant.name!r} at {point_key(point) or 'the base settings'}: "
                         f"{e}") from None
      if config.method == "bass" and variant.draft is None:
        raise ValueError(f"variant {variant.name!r} decodes with method='bass' but has no draft; "
                         "give it one, or method=regular")
  return points


def run_sweep(target: Model, problems: Sequence[Problem], variants: Sequence[Variant],
              axes: Mapping[str, Sequence[Any]] | None = None, *, base: DecodeConfig | None = None,
              rounds: int = 3, warmup: bool = True, baseline: str | None = None,
              done: Mapping[str, Sequence[Cell]] | None = None,
              on_point: Callable[[str, list[Cell]], None] | None = None,
              **run_keywords: Any) -> list[Cell]:
  """Decodes every variant at every grid point under the timing policy of this module's docstring.

  Args:
    target: the target, with its tokenizer. problems: the prompts every cell decodes.
    variants: the configurations compared. axes: the swept ``DecodeConfig`` fields -> values.
    base: the settings under every cell (default ``DecodeConfig()``); a grid point, then the
      variant's settings, go over it. ``batch_size`` must be set somewhere (``run_problems``).
    rounds: repeats per cell, >= 1. warmup: decode each run's first batch once untimed first.
    baseline: the variant the others' ``speedup`` divides by; None for no ratios.
    done: cells of grid points already measured (by :func:`point_key`), kept without decoding again.
    on_point: called with the key and the cells after each grid point (to save progress).
    run_keywords: passed to every ``run_problems`` call (``distinct_prompts``, ``continuous``, …).

  Returns:
    The cells, grid point by grid point, in the variants' order.

  Raises:
    ValueError: what :func:`check` raises, or ``rounds`` < 1, before anything decodes.
  """
  if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
  points = check(variants, axes, baseline, base)
  cells: list[Cell] = []
  for point in points:
    key = point_key(point)
    if done and key in done:
      cells.extend(done[key])
      continue
    measured: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for r in range(rounds):
      for variant in (variants if r % 2 == 0 else list(variants)[::-1]):
        summary = experiment.run_problems(
            target, variant.draft, problems, base, progress=False, warmup=warmup, **run_keywords,
            **point, **variant.decode_settings()).summary
        measured[variant.name].append({m: summary.get(m) for m in METRICS})
    point_cells = [Cell(point, v.name, measured[v.name], _speedup(measured, baseline, v.name))
                   for v in variants]
    cells.extend(point_cells)
    if on_point is not None:
      on_point(key, point_cells)
  return cells


def _speedup(measured: Mapping[str, list[dict[str, Any]]], baseline: str | None,
             name: str) -> float | None:
  if baseline is None:
    return None
  pairs = [(b["ms_per_token_all"], v["ms_per_token_all"])
           for b, v in zip(measured[baseline], measured[name])]
  if any(b is None or not v for b, v in pairs):
    return None
  return float(statistics.median(b / v for b, v in pairs))


def markdown(cells: Sequence[Cell], axes: Sequence[str] = (), baseline: str | None = None) -> str:
  """A markdown table, one row per cell: the swept settings, the variant, the medians of the
  :data:`COLUMNS` some cell has, the speedup over ``baseline`` and each round's ms/token All."""
  columns = [c for c in COLUMNS if any(cell.median(c[0]) is not None for cell in cells)]
  ratio = [f"speedup vs {baseline}"] if baseline else []
  header = [*axes, "variant", *(h for _, h, _ in columns), *ratio, "rounds (ms/token All)"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for cell in cells:
    values = [str(cell.point.get(a, "")) for a in axes] + [cell.variant]
    for metric, _, fmt in columns:
      median = cell.median(metric)
      values.append("" if median is None else fmt.format(median))
    if baseline:
      values.append("" if cell.speedup is None else f"{cell.speedup:.2f}x")
    values.append(", ".join("" if r.get("ms_per_token_all") is None else
                            f"{r['ms_per_token_all']:.2f}" for r in cell.rounds))
    lines.append("| " + " | ".join(values) + " |")
  return "\n".join(lines)
