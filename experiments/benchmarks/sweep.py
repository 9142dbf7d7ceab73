r"""Decode benchmarks: variants of a decode over a grid of settings, side by side, with one timing
policy (``bass_jax.evaluation.sweep``: compile apart, warm-up, rounds in alternating order, medians,
ratios to a baseline measured in the same rounds).

    python -m experiments.benchmarks.sweep --variant=name=regular \
        --variant="name=bass;draft=smollm2-135m-draft" \
        --variant="name=eagle tree;draft=smollm2-135m-eagle;draft_tree=top_k=4,depth=5,nodes=16" \
        --sweep=batch_size=1,4 --sweep=temperature=0,0.6 --rounds=3

A ``--variant`` is ``;``-separated ``key=value`` pairs: ``name`` (its row label), ``draft`` (a draft
spec as ``experiments.generate`` takes it; absent: regular decoding) and any decode setting, written
as its flag is (``draft_len=4``, ``draft_tree=top_k=4,depth=5,nodes=16``, ``acceptance=gumbel``). A
``--sweep`` is ``setting=v1,v2,...`` over a setting with single values (not ``draft_tree``, whose
shapes hold commas: give trees as variants). The decode flags (``--max_new_tokens``, ``--top_p``, ...)
set what is neither swept nor fixed by a variant. At temperature 0 a batch holds distinct prompts, so
``--num_prompts`` must cover the largest batch.

Writes ``sweep_<setting>.json`` (the flags, and per grid point and variant the medians, the speedup and
every round) and ``sweep_<setting>.md`` (the table) into ``--results_dir`` after every grid point;
``--resume`` measures only the points the file lacks. Tuning uses ``--prompts=stdlib-heldout`` (the
default); HumanEval only evaluates a choice made there.
"""

from __future__ import annotations

import pathlib
from typing import Any

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io
from experiments import _runs

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_VARIANTS = flags.DEFINE_multi_string(
    "variant", ["name=regular", "name=bass;draft=smollm2-135m-draft"],
    "A decode configuration: ';'-separated key=value pairs, name=<label>, draft=<draft spec> (absent: "
    "regular decoding) and decode settings as their flags take them. Repeat for several.")
_SWEEP = flags.DEFINE_multi_string(
    "sweep", ["batch_size=1,4"], "A swept decode setting: <setting>=<v1>,<v2>,... (repeat for a grid; "
    "the last varies fastest).")
_BASELINE = flags.DEFINE_string("baseline", "regular", "The variant the speedups divide by ('' for "
                                "none).")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set "
                               "(bass_jax.evaluation.data.load_problems).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Repeats of every cell, in alternating order.",
                               lower_bound=1)
_WARMUP = flags.DEFINE_bool("warmup", True, "Decode each run's first batch once, untimed, first.")
_SETTING = flags.DEFINE_string("setting", "quick", "Name of the setting (recorded, and the file "
                               "suffix).")
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for sweep_<setting>.json and .md "
                                   "(default: a fresh outputs/sweep-<time>/).")
_DECODE = _decode_flags.define(*_decode_flags.FIELDS, max_new_tokens=64, batch_size=1)


def parse_variant(text: str) -> tuple[str, str | None, dict[str, Any]]:
  """``(name, draft spec or None, settings)`` of a ``--variant``. ``draft_tree`` may repeat (several
  shapes, for ``draft_len=goodput``); no other key may.

  Raises:
    ValueError: a pair without ``=``, a key given twice, no name, or a setting its flag refuses.
  """
  pairs: dict[str, list[str]] = {}
  for part in (p.strip() for p in text.split(";")):
    key, eq, value = (s.strip() for s in part.partition("="))
    if not eq or not key:
      raise ValueError(f"--variant={text}: {part!r} is not key=value")
    if key in pairs and key != "draft_tree":
      raise ValueError(f"--variant={text}: {key!r} is given twice")
    pairs.setdefault(key, []).append(value)
  name = pairs.pop("name", [""])[0]
  if not name:
    raise ValueError(f"--variant={text}: give it a name=<label>")
  draft = pairs.pop("draft", [""])[0] or None
  return name, draft, {key: _decode_flags.parse(key, *values) for key, values in pairs.items()}


def parse_sweep(texts: list[str]) -> dict[str, list[Any]]:
  """The grid's axes (setting -> values) of the ``--sweep`` flags.

  Raises:
    ValueError: no ``=``, a setting swept twice, ``draft_tree``, an empty value, or a value its flag
      refuses.
  """
  axes: dict[str, list[Any]] = {}
  for text in texts:
    name, eq, values = (s.strip() for s in text.partition("="))
    if not eq or not name:
      raise ValueError(f"--sweep={text}: write <setting>=<v1>,<v2>,...")
    if name in axes:
      raise ValueError(f"--sweep={text}: {name!r} is swept twice; give its values in one --sweep")
    if name == "draft_tree":
      raise ValueError(f"--sweep={text}: tree shapes hold commas; give each tree as a --variant")
    parts = [v.strip() for v in values.split(",")]
    if not all(parts):
      raise ValueError(f"--sweep={text}: an empty value")
    axes[name] = [_decode_flags.parse(name, v) for v in parts]
  return axes


def _check_greedy_batches(points, variants, base) -> None:
  """At temperature 0 a batch holds distinct prompts: --num_prompts must cover every such batch."""
  for point in points:
    for _, _, settings in variants:
      merged = {**base, **point, **settings}
      if merged.get("temperature", 0.0) == 0:
        _io.require_distinct_prompts(_NUM_PROMPTS.value, merged["batch_size"],
                                     f"batch_size={merged['batch_size']}")


def main(argv):
  del argv
  _io.init_script()
  try:
    variants = [parse_variant(text) for text in _VARIANTS.value]
    axes = parse_sweep(_SWEEP.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  base = _DECODE.values()
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "sweep")
    path = _io.check_output_file(run_dir / f"sweep_{_SETTING.value}.json", flag="results_dir")
    _runs.refuse_existing(path, "a sweep result")
    earlier = _runs.read_json(path) if _runs.RESUME.value else None
    settings = _runs.settings("__main__")
    if earlier is not None:
      _runs.check_settings(path, earlier.get("settings") if isinstance(earlier, dict) else None,
                           settings)
  except (_io.OutputError, _runs.RunError) as e:
    raise app.UsageError(str(e)) from e

  from bass_jax.evaluation import sweep  # pylint: disable=g-import-not-at-top

  baseline = _BASELINE.value or None
  checked = [sweep.Variant(name, draft, settings)
             for name, draft, settings in variants]
  base_config = _DECODE.config()
  try:
    points = sweep.check(checked, axes, baseline, base_config)
  except (ValueError, TypeError) as e:
    raise app.UsageError(str(e)) from e
  _check_greedy_batches(points, variants, base)

  import bass_jax as bj  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  done: dict[str, list[sweep.Cell]] = {}
  for record in (earlier or {}).get("cells", []):
    cell = sweep.Cell.from_json(record)
    done.setdefault(sweep.point_key(cell.point), []).append(cell)
  cells = [cell for point_cells in done.values() for cell in point_cells]
  markdown = pathlib.Path(path).with_suffix(".md")
  machine = reproduce.machine()
  header = (f"{_TARGET.value}, {len(problems)} prompts of {_PROMPTS.value}, {_ROUNDS.value} rounds; "
            f"{machine['device']}, JAX {machine['jax_version']}, {machine['date']}; "
            "experiments.benchmarks.sweep")

  def write(complete: bool) -> None:
    _io.write_json_atomic(path, {"settings": settings, "setting": _SETTING.value, **machine,
                                 "complete": complete, "cells": [c.to_json() for c in cells]})
    _io.write_text_atomic(markdown, f"{header}\n\n{sweep.markdown(cells, list(axes), baseline)}\n")

  def save(key: str, point_cells: list[sweep.Cell]) -> None:
    del key
    cells.extend(point_cells)
    write(complete=False)
    print(sweep.markdown(point_cells, list(axes), baseline), flush=True)

  if all(sweep.point_key(point) in done for point in points):
    # A finished sweep resumed: nothing to decode, so no model is loaded.
    write(complete=True)
    print(f"every point was already in {path}; wrote it and {markdown}", flush=True)
    return
  target = bj.load_model(_TARGET.value)
  drafts = {spec: bj.load_draft_spec(spec, target) for _, spec, _ in variants if spec is not None}
  runs = [sweep.Variant(name, drafts.get(spec), settings) for name, spec, settings in variants]
  sweep.run_sweep(target, problems, runs, axes, base=base_config, rounds=_ROUNDS.value,
                  warmup=_WARMUP.value, baseline=baseline, done=done, on_point=save)
  write(complete=True)
  print(f"wrote {path} and {markdown}", flush=True)


if __name__ == "__main__":
  _io.run(main)
