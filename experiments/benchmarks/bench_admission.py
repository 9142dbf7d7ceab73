r"""Continuous batching's admission prefill: prompts per prefill and positions per forward, side by side.

    python -m experiments.benchmarks.bench_admission --admit_rows=1,2,4 --admit_chunks=64

One queue of the first ``--num_prompts`` tuning prompts decoded ``--batch_size`` rows at a time
(``generate(..., batch_size=)``), the backend profile's admission settings replaced by each pair of
``--admit_rows`` (the most prompts one prefill admits: rows that free up in the same step) and
``--admit_chunks`` (positions per forward of its chunked prefill). Each setting is compiled once and
then timed ``--repeats`` times, interleaved with the others (the fastest counts); the table gives the
decode's wall seconds (compilation excluded), its ratio to the first setting's, and the token
positions the admissions prefilled per model (``GenerateStats.admitted_positions``, spare rows
included).
"""

import dataclasses

from absl import app
from absl import flags

import bass_jax
from bass_jax import profiles
from experiments import _decode_flags
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_DRAFT = _io.define_draft_flag("hybrid:smollm2-135m-eagle")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set (a tuning set, not HumanEval).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 12, "First N prompts: the queue.", lower_bound=2)
_ROWS = flags.DEFINE_list("admit_rows", ["1", "2", "4"], "Prompts per admission prefill, each.")
_io.require_positive_ints("admit_rows")
_CHUNKS = flags.DEFINE_list("admit_chunks", ["64"], "Positions per forward of the prefill, each.")
_io.require_positive_ints("admit_chunks")
_DRAFT_LEN = flags.DEFINE_integer("draft_len", 3, "Fixed draft length l.", lower_bound=1)
_DECODE = _decode_flags.define(max_new_tokens=48, profile="cpu", batch_size=4)  # the profile whose
_MAX_NEW, _PROFILE = _DECODE["max_new_tokens"], _DECODE["profile"]  # admission settings are replaced
_BATCH = _DECODE["batch_size"]  # below --num_prompts: the rest queue
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per setting (the fastest counts).",
                                lower_bound=1)


def main(argv):
  del argv
  _io.init_script()
  if _BATCH.value >= _NUM_PROMPTS.value:
    raise app.UsageError(f"--batch_size ({_BATCH.value}) must be below --num_prompts "
                          f"({_NUM_PROMPTS.value}), or nothing is admitted inside the loop")
  target, draft, by_batch = _io.models_and_batches(_TARGET.value, _DRAFT.value, _PROMPTS.value,
                                                   _NUM_PROMPTS.value, [_NUM_PROMPTS.value])
  prompts = by_batch[_NUM_PROMPTS.value]
  base = profiles.PROFILES[_PROFILE.value]
  settings = [(int(r), int(c)) for c in _CHUNKS.value for r in _ROWS.value]

  def run(rows, chunk):
    profile = dataclasses.replace(base, admit_rows=rows, admit_chunk=chunk)
    return bass_jax.generate(target, draft, prompts, profile=profile, batch_size=_BATCH.value,
                             draft_len=_DRAFT_LEN.value, max_new_tokens=_MAX_NEW.value)

  positions = {s: run(*s).stats.admitted_positions for s in settings}  # compiles
  walls = {s: float("inf") for s in settings}
  for _ in range(_REPEATS.value):
    for s in settings:
      walls[s] = min(walls[s], run(*s).stats.wall_seconds)
  print(f"target {target.name}, draft {_DRAFT.value}, {len(prompts)} prompts, batch_size "
        f"{_BATCH.value}, l = {_DRAFT_LEN.value}, {_MAX_NEW.value} new tokens, greedy; profile "
        f"{base.name}'s admission replaced; wall seconds, fastest of {_REPEATS.value}\n")
  print("| admit_rows | admit_chunk | wall s | vs first | admitted positions |")
  print("|---|---|---|---|---|")
  first = walls[settings[0]]
  for s in settings:
    print(f"| {s[0]} | {s[1]} | {walls[s]:.2f} | {walls[s] / first:.2f}x | {positions[s]} |")


if __name__ == "__main__":
  _io.run(main)
