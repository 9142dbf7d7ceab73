r"""Compile time of `generate`, as a notebook user meets it: first calls, and calls that should reuse.

    python -m experiments.benchmarks.bench_compile --results_dir=results
    python -m experiments.benchmarks.bench_compile --scan_layers --results_dir=results  # scanned layers

One process, the SmolLM2 target and the shipped draft, tuning prompts (``stdlib-heldout``), calls in
this order: greedy BASS (first call); greedy BASS with other prompts in the same batch and prompt
buckets and another ``max_new_tokens`` in the same output bucket (should compile nothing); sampled BASS;
sampled BASS with another temperature, top-p, seed and a smaller prompt bucket; regular decoding; and
greedy BASS with the cost-aware draft length, whose program also holds plain decoding steps.
Each row gives ``GenerateStats.compiled`` and ``compile_seconds`` (prefill and decode lowered, then
compiled in parallel; the goodput policy's one-off cost measurement is not included). ``--scan_layers``
loads both models with scanned layers (``load_model(scan_layers=True)``: one layer compiled per
forward instead of every layer) and writes ``bench_compile_scanned.json``; run the two layouts as
separate processes, alternating, since the first call of a process also pays JAX's own warm-up.
"""

from absl import app
from absl import flags

import bass_jax
from bass_jax import text
from bass_jax.evaluation import reproduce
from bass_jax.evaluation.data import load_problems
from experiments import _io

_SCAN_LAYERS = flags.DEFINE_bool("scan_layers", False, "Load the target and the draft with scanned "
                                  "layers (default: unrolled, on every backend).")
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_compile.json (default: a "
                                   "fresh outputs/bench_compile-<time>/).")


def main(argv):
  del argv
  _io.init_script()
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_compile")
    name = "bench_compile_scanned.json" if _SCAN_LAYERS.value else "bench_compile.json"
    path = _io.check_output_file(run_dir / name, flag="results_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  target = bass_jax.load_model("smollm2-135m-instruct", scan_layers=_SCAN_LAYERS.value)
  draft = bass_jax.load_draft("smollm2-135m-draft", target)  # the target's layout
  ids = text.encode_prompts(target.tokenizer, [p.prompt for p in load_problems("stdlib-heldout")])
  long = [p for p in ids if 64 < len(p) <= 128][:7]  # prompt bucket 128
  short = [p for p in ids if len(p) <= 32][:3]  # prompt bucket 32
  greedy, sampled = dict(temperature=0.0), dict(temperature=0.2, top_p=0.95, seed=1)
  cases = [
      ("BASS greedy, first call", long[:3], dict(max_new_tokens=16, **greedy)),
      ("BASS greedy, 4 other prompts, max_new_tokens 20 (same buckets)", long[3:7],
       dict(max_new_tokens=20, **greedy)),
      ("BASS T = 0.2, first sampled call", long[:3], dict(max_new_tokens=16, **sampled)),
      ("BASS T = 0.6, top-p 0.9, seed 2, prompt bucket 32", short,
       dict(max_new_tokens=30, temperature=0.6, top_p=0.9, seed=2)),
      ("regular greedy, first call", long[:3], dict(max_new_tokens=16, method="regular", **greedy)),
      ("BASS greedy, draft_len=goodput (plain steps compiled too)", long[:3],
       dict(max_new_tokens=16, draft_len="goodput", **greedy)),
  ]
  result = {"experiment": "bench_compile", "scan_layers": _SCAN_LAYERS.value, **reproduce.machine(),
            "rows": []}
  print("| call | batch bucket | prompt bucket | compiled | compile s |")
  print("|---|---|---|---|---|")
  for name, prompts, kwargs in cases:
    stats = bass_jax.generate(target, draft, prompts, **kwargs).stats
    row = {"call": name, "batch_bucket": stats.batch_bucket, "prompt_bucket": stats.prompt_bucket,
           "compiled": stats.compiled, "compile_seconds": stats.compile_seconds}
    result["rows"].append(row)
    _io.write_json_atomic(path, result)
    print(f"| {name} | {row['batch_bucket']} | {row['prompt_bucket']} | {row['compiled']} | "
          f"{row['compile_seconds']:.1f} |", flush=True)
  print(f"wrote {path}")


if __name__ == "__main__":
  _io.run(main)
