r"""Compile time of every decode program kind, and what a reused program costs: the table issue 52 asks for.

    python -m experiments.benchmarks.bench_compile --results_dir=results/compile_<machine>_<date>
    python -m experiments.benchmarks.bench_compile --opt_levels=default,1,0   # XLA:CPU's LLVM levels
    python -m experiments.benchmarks.bench_compile --quick                   # 2 layers, 2 kinds, seconds

One process, random weights of a published shape (``--target``, default ``random:smollm2-135m``;
compile time does not depend on the weights' values, and the GPU machine needs nothing carried) and a
random one-layer EAGLE draft of it, ``--batch_size`` rows of distinct prompts. Each program kind is
one ``DecodeConfig``, from regular decoding up to ``make run``'s setting:

* ``regular``: plain steps only (no proposer).
* ``chain``: the EAGLE draft, a fixed draft length of 4: chain steps only.
* ``goodput``: the cost-aware draft length: plain steps and chain steps in one program.
* ``goodput+tree``: the same with a token tree of ``top_k=2,depth=3,nodes=8``: plain, chain and tree.
* ``hybrid``: ``make run``'s draft side (n-gram lookup where a row matches, the EAGLE draft elsewhere)
  with the cost-aware draft length.
* ``hybrid+admission``: the same under continuous batching (twice the prompts of the batch), whose
  program also holds the admission's chunked prefill.

For each kind and each ``--opt_levels`` entry (``default``: the profile's XLA options; an int: XLA's
``xla_backend_optimization_level``, the LLVM level of XLA:CPU's generated code) the table gives the
seconds spent tracing and lowering the prefill and decode programs together, compiling each alone (one after
the other, so that each is its own), the HLO instructions of the decode program, the seconds
``generate`` waits for a first build (lowering, then both compiled in parallel: lower + the slower
compile), and the milliseconds per decode step of the built program (the fastest of three short
decodes, wall time over steps): what a cheaper compile costs at run time. The persistent compilation
cache is off for the whole process, so every figure is a real compile. Rows are written to
``bench_compile.json`` as they are measured.
"""

import dataclasses
import time

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io

KINDS = ("regular", "chain", "goodput", "goodput+tree", "hybrid", "hybrid+admission")

_TARGET = flags.DEFINE_string("target", "random:smollm2-135m", "random:<shape>[:layers=N][:vocab=V] "
                              "(experiments/_shapes.py) or a model spec load_model takes.")
_KINDS = flags.DEFINE_list("kinds", list(KINDS), f"Program kinds, of {', '.join(KINDS)}.")
_LEVELS = flags.DEFINE_list("opt_levels", ["default"], "XLA backend optimization levels to compare: "
                            "'default' (the profile's options) or integers 0-3.")
_DECODE = _decode_flags.define(max_new_tokens=32, batch_size=4)  # rows of the static batch
_NEW, _BATCH = _DECODE["max_new_tokens"], _DECODE["batch_size"]
_QUICK = flags.DEFINE_bool("quick", False, "Two layers and a 4,096-token vocabulary (of a random:"
                           " target), one level, the kinds regular and goodput (or --kinds where "
                           "given): a smoke run in seconds (the suite's).")
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_compile.json (default: "
                                   "a fresh outputs/bench_compile-<time>/).")


def _configs(kinds, batch_size, max_new_tokens):
  """``{kind: (DecodeConfig, which draft, prompts' count)}``."""
  import bass_jax  # pylint: disable=g-import-not-at-top

  base = bass_jax.DecodeConfig(max_new_tokens=max_new_tokens, eos_token_id=(), profile=None)
  make = {
      "regular": (dict(method="regular"), "none", 1),
      "chain": (dict(draft_len=4), "eagle", 1),
      "goodput": (dict(draft_len="goodput"), "eagle", 1),
      "goodput+tree": (dict(draft_len="goodput", draft_tree="top_k=2,depth=3,nodes=8"), "eagle", 1),
      "hybrid": (dict(draft_len="goodput"), "hybrid", 1),
      "hybrid+admission": (dict(draft_len="goodput", batch_size=batch_size), "hybrid", 2),
  }
  return {k: (dataclasses.replace(base, **make[k][0]), make[k][1], make[k][2] * batch_size)
          for k in kinds}


def _count_instructions(lowered) -> int:
  """The operations of a lowered (StableHLO) module: a measure of what XLA is given to compile."""
  return sum(1 for line in lowered.as_text().splitlines() if " = " in line)


def main(argv):
  del argv
  _io.init_script()
  kinds, levels = list(_KINDS.value), list(_LEVELS.value)
  unknown = sorted(set(kinds) - set(KINDS))
  if unknown:
    raise app.UsageError(f"--kinds: unknown {unknown}; choose from {', '.join(KINDS)}")
  for level in levels:
    if level != "default" and level not in ("0", "1", "2", "3"):
      raise app.UsageError(f"--opt_levels: {level!r} is neither 'default' nor 0-3")
  target_spec = _TARGET.value
  if _QUICK.value:
    kinds = kinds if _KINDS.present else ["regular", "goodput"]
    levels = levels[:1]
    if target_spec.startswith("random:"):
      target_spec = "random:smollm2-135m:layers=2:vocab=4096"
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_compile")
    path = _io.check_output_file(run_dir / "bench_compile.json", flag="results_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e

  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import compile_cache, programs  # pylint: disable=g-import-not-at-top
  from experiments import _shapes  # pylint: disable=g-import-not-at-top

  compile_cache.configure("off")  # every figure a real compile
  dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
  if target_spec.startswith("random:"):
    target = _shapes.random_model(target_spec, dtype)
  else:
    target = bass_jax.load_model(target_spec)
  eagle = _shapes.random_eagle_draft(target, draft_vocab_size=min(8192, target.config.vocab_size))
  drafts = {"none": None, "eagle": eagle, "hybrid": bass_jax.Hybrid(eagle, bass_jax.NGramProposer())}
  rng = np.random.default_rng(0)
  result = {"experiment": "bench_compile", "target": target_spec, "batch_size": _BATCH.value,
            **reproduce.machine(), "rows": []}
  print(f"bench_compile: {target_spec}, B = {_BATCH.value}, {jax.devices()[0].device_kind}, "
        f"JAX {jax.__version__}")
  print("| kind | opt level | lower s | compile s (prefill, decode) | decode ops | first build s | "
        "ms / step |")
  print("|---|---|---|---|---|---|---|")
  warm = bass_jax.prepare(target, None, [[1, 2, 3]], bass_jax.DecodeConfig(method="regular",
                                                                           max_new_tokens=4))
  programs.compiled(warm.spec, warm.args_prefill, (*warm.args_tail, warm.place(np.bool_(True))))
  for kind, (config, draft_name, count) in _configs(kinds, _BATCH.value, _NEW.value).items():
    prompts = [rng.integers(10, target.config.vocab_size, int(n)).tolist()
               for n in rng.integers(20, 100, count)]
    plan = bass_jax.prepare(target, drafts[draft_name], prompts, config)
    tail = (*plan.args_tail, plan.place(np.bool_(False)))
    for level in levels:
      options = None if level == "default" else {"xla_backend_optimization_level": level}
      start = time.perf_counter()
      low_prefill, low_decode = programs.lowered(plan.spec, plan.args_prefill, tail, options)
      lower_s = time.perf_counter() - start  # both programs (the decode's trace dominates)
      compile_s = []
      built = []
      for low in (low_prefill, low_decode):
        start = time.perf_counter()
        built.append(low.compile())
        compile_s.append(time.perf_counter() - start)
      ops = _count_instructions(low_decode)
      prefill, decode = built
      walls, steps = [], 1
      for _ in range(3):
        start = time.perf_counter()
        state = decode(prefill(*plan.args_prefill), *tail)
        jax.block_until_ready(state.tokens)
        walls.append(time.perf_counter() - start)
        steps = max(int(np.asarray(state.step)), 1)
      row = {"kind": kind, "opt_level": level, "lower_s": lower_s, "compile_prefill_s": compile_s[0],
             "compile_decode_s": compile_s[1], "decode_ops": ops,
             "first_build_s": lower_s + max(compile_s), "ms_per_step": min(walls) / steps * 1e3,
             "steps": steps, "prompt_bucket": plan.spec.prompt_len, "rows": plan.rows}
      result["rows"].append(row)
      _io.write_json_atomic(path, result)
      print(f"| {kind} | {level} | {lower_s:.1f} | {compile_s[0]:.1f}, {compile_s[1]:.1f} | {ops} | "
            f"{row['first_build_s']:.1f} | {row['ms_per_step']:.1f} |", flush=True)
      del built, prefill, decode, low_prefill, low_decode
  print(f"wrote {path}")


if __name__ == "__main__":
  _io.run(main)
