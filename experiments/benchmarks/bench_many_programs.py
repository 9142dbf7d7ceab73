r"""Memory of a long session: many distinct decode settings compiled one after another in one process.

    python -m experiments.benchmarks.bench_many_programs                       # 100 settings, tiny random model
    python -m experiments.benchmarks.bench_many_programs --target=smollm2-135m-instruct --configs=30

Issue 24: a notebook that decoded setting after setting died with "LLVM compilation error: Cannot
allocate memory" once the process ran out of memory maps (``vm.max_map_count``), because JAX kept
every compiled program whatever ``bass_jax``'s LRU evicted (``bass_jax.sampling.programs``). This
decodes ``--configs`` settings in turn, each a new combination of proposer (a draft model, n-gram
lookup, the hybrid of both), fixed draft length (1-30), ``verify_chunk`` (1-4) and batch arrangement
(one prompt; three prompts, batch bucket 4; five prompts two at a time, continuous), in a fixed
shuffled order, with the LRU at ``--cache_size`` settings, so each call compiles a prefill and a
decode program and evicts the oldest setting. Every ``--every`` settings it prints a Markdown row:
settings decoded, settings compiled, the lines of ``/proc/self/maps``, VmRSS and the seconds spent
compiling; then a verdict (bounded, or the maps each setting adds and after how many settings
``vm.max_map_count`` would end the process).

The default target is a random 2-layer Llama (vocab 61, hidden 32; no download) and the draft model a
second one; with ``--target`` (an alias or path, ``bass_jax.load_model``) the draft model is the
target's first 2 layers. Writes ``bench_many_programs.json`` (``--results_dir``). Linux only.
"""

from __future__ import annotations

import itertools
import os
import time

from absl import app
from absl import flags
import jax
import numpy as np

import bass_jax
from bass_jax.evaluation import reproduce
from experiments import _decode_flags
from experiments import _io

_CONFIGS = flags.DEFINE_integer("configs", 100, "Distinct settings to decode one after another "
                                "(at most 1,080).", lower_bound=1, upper_bound=1080)
_TARGET = flags.DEFINE_string("target", None, "Target model alias or path (default: a tiny random "
                              "Llama, no download).")
_CACHE_SIZE = flags.DEFINE_integer("cache_size", 8, "Settings the compile cache keeps "
                                   "(bass_jax.set_compile_cache_size).", lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=8)["max_new_tokens"]
_EVERY = flags.DEFINE_integer("every", 10, "Print a row every N settings.", lower_bound=1)
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_many_programs.json "
                                   "(default: a fresh outputs/bench_many_programs-<time>/).")

PROPOSERS = ("model", "ngram", "hybrid")
DRAFT_LENS = tuple(range(1, 31))
VERIFY_CHUNKS = (1, 2, 3, 4)
# name -> (prompts, batch_size): one row; a static batch of 3 (bucket 4); 5 prompts, 2 rows at a time.
ARRANGEMENTS = {"1 prompt": (1, None), "3 prompts": (3, None), "5 prompts, 2 rows": (5, 2)}
GROWING_MAPS_PER_SETTING = 10  # above this slope the verdict is "growing"


def settings(n: int) -> list[tuple[str, int, int, str]]:
  """The first ``n`` of every (proposer, draft_len, verify_chunk, arrangement), shuffled with seed 0 so
  that any prefix mixes them all; each is a distinct compiled setting."""
  every = list(itertools.product(PROPOSERS, DRAFT_LENS, VERIFY_CHUNKS, ARRANGEMENTS))
  order = np.random.default_rng(0).permutation(len(every))
  return [every[i] for i in order[:n]]


def memory() -> tuple[int, float]:
  """``(memory maps, RSS in MiB)`` of this process, from /proc/self."""
  with open("/proc/self/maps") as f:
    maps = sum(1 for _ in f)
  with open("/proc/self/status") as f:
    rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
  return maps, rss


def max_map_count() -> int | None:
  """The kernel's per-process limit on memory maps (``vm.max_map_count``), or None if unreadable."""
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return None


def tiny_llama(seed: int) -> bass_jax.Model:
  """A random 2-layer GQA Llama (the tests' tiny model): compiles in seconds, needs no download."""
  config = bass_jax.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=8, rope_theta=500.0, eos_token_id=None)
  return bass_jax.Model(config, bass_jax.init_params(config, jax.random.key(seed)),
                        name=f"tiny-{seed}")


def verdict(rows: list[dict], limit: int | None) -> str:
  """Bounded or growing, from the maps and RSS of the second row on (the first holds one-off costs)."""
  first, last = rows[min(1, len(rows) - 1)], rows[-1]
  span = last["settings"] - first["settings"]
  if span <= 0:
    return "too few rows for a verdict (decode at least three times --every settings)"
  slope = (last["maps"] - first["maps"]) / span
  growth = (f"from setting {first['settings']} to {last['settings']}: {last['maps'] - first['maps']:+d} "
            f"maps ({slope:+.1f} per setting), RSS {last['rss_mib'] - first['rss_mib']:+.0f} MiB")
  if slope <= GROWING_MAPS_PER_SETTING:
    return f"bounded: {growth}"
  left = "" if limit is None else (f"; vm.max_map_count = {limit} would be reached after about "
                                   f"{last['settings'] + int((limit - last['maps']) / slope)} settings")
  return f"growing: {growth}{left}"


def main(argv):
  del argv
  _io.init_script()
  if not os.path.exists("/proc/self/maps"):
    raise app.UsageError("this benchmark reads /proc/self/maps and /proc/self/status (Linux only)")
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_many_programs")
    path = _io.check_output_file(run_dir / "bench_many_programs.json", flag="results_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  if _TARGET.value:
    target = bass_jax.load_model(_TARGET.value)
    draft = target.with_first_layers(2)
  else:
    target, draft = tiny_llama(0), tiny_llama(1)
  bass_jax.set_compile_cache_size(_CACHE_SIZE.value)
  drafts = {"model": draft, "ngram": bass_jax.NGramProposer(), "hybrid": bass_jax.Hybrid(draft)}
  rng = np.random.default_rng(1)
  vocab = target.config.vocab_size
  # Prompts that repeat themselves, so the n-gram lookup finds matches and proposes.
  prompts = [np.tile(rng.integers(0, vocab, 4), 3)[: 6 + i].tolist() for i in range(5)]
  limit = max_map_count()
  result = {"experiment": "bench_many_programs", **reproduce.machine(), "target": target.name,
            "cache_size": _CACHE_SIZE.value, "max_map_count": limit, "rows": []}
  maps, rss = memory()
  print(f"target {target.name}, compile cache {_CACHE_SIZE.value} settings, vm.max_map_count {limit}; "
        f"before the first decode: {maps} maps, {rss:.0f} MiB")
  print(f"| settings decoded | settings compiled | memory maps | RSS MiB "
        f"| compile s (last {_EVERY.value}) | wall s |")
  print("|---|---|---|---|---|---|")
  start, compiled, compile_seconds = time.perf_counter(), 0, 0.0
  for i, (proposer, draft_len, chunk, arrangement) in enumerate(settings(_CONFIGS.value), 1):
    num_prompts, batch_size = ARRANGEMENTS[arrangement]
    stats = bass_jax.generate(target, drafts[proposer], prompts[:num_prompts], method="bass",
                              max_new_tokens=_MAX_NEW.value, draft_len=draft_len, verify_chunk=chunk,
                              batch_size=batch_size).stats
    compiled += stats.compiled
    compile_seconds += stats.compile_seconds
    if i % _EVERY.value == 0 or i == _CONFIGS.value:
      maps, rss = memory()
      row = {"settings": i, "compiled": compiled, "maps": maps, "rss_mib": round(rss, 1),
             "compile_seconds": round(compile_seconds, 1),
             "wall_seconds": round(time.perf_counter() - start, 1)}
      result["rows"].append(row)
      _io.write_json_atomic(path, result)
      print(f"| {i} | {compiled} | {maps} | {rss:.0f} | {compile_seconds:.1f} | "
            f"{row['wall_seconds']:.0f} |", flush=True)
      compile_seconds = 0.0
  result["verdict"] = verdict(result["rows"], limit)
  _io.write_json_atomic(path, result)
  print(result["verdict"])
  print(f"wrote {path}")


if __name__ == "__main__":
  _io.run(main)
