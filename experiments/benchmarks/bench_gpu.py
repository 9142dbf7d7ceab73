r"""The GPU campaign in parts that each fit one command of 8 minutes (docs/gpu.md, the runbook): part 1
the like-for-like latency table (regular decoding against BASS-PAD and BASS-SPLIT with the Pallas
kernels and the EAGLE hybrid, greedy and T = 0.2) and the step phases; part 2 the kernel tests
compiled, the attention and forward benchmarks and the model-size sweep; part 3 launch overhead
(XLA's command buffers over loops and branches against its default, checked token for token, and
scanned against unrolled layers); part 4 the decode's census on the device, utilization and
continuous batching's admission settings.

    make bench-gpu                                        # = python -m experiments.benchmarks.bench_gpu
    python -m experiments.benchmarks.bench_gpu --part=1              # one part
    python -m experiments.benchmarks.bench_gpu --quick               # CPU smoke run (the test suite's)

Each step runs as its own process, one after another (never two benchmarks at once), under its own
timeout (:class:`Step`); a step that fails or times out is recorded and the next one runs: on a new JAX
(0.11 on the GPU machines) an API difference in one step must not cost the others. ``bench_gpu.json``
in ``--results_dir`` records the device, JAX version, date and, per step, the part, command, exit
status (or ``"timeout"``), seconds and log file; ``bench_gpu.md`` is a report section naming every
results file; both are rewritten after every step, and the latency steps write after every run, so a
command cut short keeps what it finished (``--resume`` measures the rest). ``--quick`` shrinks every
step to a smoke run of the mechanics (SmolLM2's 135M draft as the target and its first layer as the
draft, two prompts, eight tokens) and skips the kernel tests (the suite runs them interpreted).
``--compilation_cache_dir`` is passed on to every step (JAX's persistent cache), so a rerun does not
compile again.

The decoding steps need HumanEval's prompts and the SmolLM2 GGUF: on a GPU machine without a network,
join ``make gpu-bundle``'s parts first (``experiments.benchmarks.gpu_bundle``); they run without HumanEval's tests
(``--nocheck``).
"""

import dataclasses
import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl import flags

from experiments import _io

_RESULTS = flags.DEFINE_string("results_dir", None, "Directory for every step's results and logs; "
                               "default a fresh outputs/bench_gpu-<time>/.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke run of every step (CPU, the test suite).")
_PART = flags.DEFINE_list("part", ["1", "2", "3", "4"], "The campaign's parts to run, in this order "
                          "(1: the like-for-like table; 2: kernels and scale; 3: launch overhead; 4: "
                          "the decode's census on the device, utilization, admission).")
_STEPS = flags.DEFINE_list("steps", None, "Run only these steps of those parts (default: all).")
_DRAFT = _io.define_draft_flag("hybrid:smollm2-135m-eagle",
                                "BASS's draft side in the full run (--quick decodes tiny models)")
_RESUME = flags.DEFINE_bool("resume", False, "Pass --resume to the steps that keep finished runs "
                            "(latency): a part cut by its timeout, run again, measures only the rest; "
                            "the record and the logs of the earlier call in --results_dir are kept.")

_BATCHES = "1,2,4,8,16"
QUICK_DRAFT = "smollm2-135m-draft"  # --quick's target and (its first layer) draft, whatever --draft
# Part 1's configurations: regular decoding, and BASS with the Pallas kernels (PAD and SPLIT) under the
# cost-aware draft length, and SPLIT at a fixed l = 4 (bass_jax.evaluation.reproduce.CONFIGS).
LIKE_FOR_LIKE = "regular,bass_pad_goodput,bass_split_goodput,bass_split_l4"
# XLA's command buffers (CUDA graphs) over loops and branches too (opt-in; docs/gpu.md).
_WHILE_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"


@dataclasses.dataclass(frozen=True)
class Step:
  """One command of the campaign: its part, its ``python -m`` command line and its timeout (s), which
  keeps each part within one call of a GPU machine (docs/gpu.md); a step cut by it keeps what it wrote."""

  part: int
  command: list[str]
  timeout_s: float
  xla_flags: str = ""  # appended to XLA_FLAGS for this step


def steps(results: pathlib.Path, quick: bool, draft: str) -> dict[str, Step]:
  """Each step, in the order they run: part 1, then 2, 3 and 4."""
  py = [sys.executable, "-m"]
  common = [f"--results_dir={results}", f"--draft={draft}", "--nocheck"]
  if quick:  # the mechanics only: SmolLM2's 2-layer draft as the target, its first layer as the draft
    tiny = ["--target=smollm2-135m-draft", f"--draft={QUICK_DRAFT}"]
    decode = ["--num_prompts=2", "--max_new_tokens=8", "--batch_sizes=2", *tiny,
              "--draft_num_layers=1", f"--results_dir={results}"]
    return {
        "latency": Step(1, py + ["experiments.paper.latency", "--configs=regular,bass_split_goodput",
                                 "--sampling=greedy", "--nocheck", "--setting=gpu_quick", *decode],
                        600),
        "utilization": Step(1, py + ["experiments.paper.utilization", "--setting=gpu_quick", *decode], 600),
        "bench_attention": Step(2, py + ["experiments.benchmarks.bench_attention", "--quick"], 600),
        "bench_forward": Step(2, py + ["experiments.benchmarks.bench_forward", "--quick", "--notorch",
                                       "--models=smollm2-135m-draft", f"--results_dir={results}",
                                       "--setting=gpu_quick"], 600),
        "size_sweep": Step(2, py + ["experiments.benchmarks.bench_forward", "--quick", "--notorch", "--noscanned",
                                    "--project_only", f"--results_dir={results}",
                                    "--models=random:smollm2-135m:layers=2:vocab=4096,"
                                    "random:smollm2-135m:layers=1:vocab=4096",
                                    "--setting=gpu_sizes_quick"],
                           600),
        "command_buffers_while": Step(3, py + [
            "experiments.paper.latency", "--configs=regular", "--sampling=greedy", "--nocheck",
            "--setting=gpu_command_buffers_quick", *decode], 600, _WHILE_COMMAND_BUFFERS),
        "lower_decode": Step(4, py + ["experiments.benchmarks.lower_decode", "--platform=cuda", "--batch_size=2",
                                      "--max_new_tokens=32", "--nocache_copies", *tiny,
                                      f"--json={results / 'lower_decode_cuda.json'}",
                                      f"--hlo={results / 'decode_cuda.mlir'}"], 600),
    }
  decode = ["--num_prompts=16", "--max_new_tokens=128", f"--batch_sizes={_BATCHES}", "--kernels=pallas"]
  resume = ["--resume"] if _RESUME.value else []
  # Part 3's latency runs: regular decoding and BASS-SPLIT under goodput, B = 1 and 8, greedy.
  launch = py + ["experiments.paper.latency", "--configs=regular,bass_split_goodput", "--sampling=greedy",
                 "--num_prompts=8", "--max_new_tokens=128", "--batch_sizes=1,8", "--kernels=pallas",
                 *common]
  return {
      # Part 1, the like-for-like table (about 7.5 minutes: docs/gpu.md, "Part 1's time").
      "latency_greedy": Step(1, py + ["experiments.paper.latency", f"--configs={LIKE_FOR_LIKE}",
                                      "--sampling=greedy", "--setting=gpu_greedy", *decode, *common,
                                      *resume], 270),
      "latency_t0.2": Step(1, py + ["experiments.paper.latency", f"--configs={LIKE_FOR_LIKE}",
                                    "--sampling=t0.2", "--setting=gpu_t0.2", *decode, *common,
                                    *resume], 150),
      "step_phases": Step(1, py + ["experiments.benchmarks.step_phases", "--batch_sizes=1,16", "--num_prompts=16",
                                   f"--draft={draft}", "--draft_len=4"], 45),  # a table, in its log
      # Part 2, kernels and scale. Eight workers: compiling the Triton kernels is the time (53 s on an
      # H200 with 16 cores); each takes GPU memory as it needs it (XLA_PYTHON_CLIENT_PREALLOCATE).
      "kernel_tests": Step(2, py + ["pytest", "-q", "-n", "8", "tests/test_ragged_attention.py"], 150),
      "bench_attention": Step(2, py + ["experiments.benchmarks.bench_attention", "--num_splits=1"], 90),
      "bench_attention_split4": Step(2, py + ["experiments.benchmarks.bench_attention", "--num_splits=4"], 90),
      "bench_forward": Step(2, py + ["experiments.benchmarks.bench_forward", "--dtypes=bfloat16", "--notorch",
                                     "--models=smollm2-135m-instruct",
                                     f"--batch_sizes={_BATCHES}", f"--results_dir={results}",
                                     "--setting=gpu"], 120),
      # The model-size sweep: random weights of published shapes (cost only), each with a one-layer
      # draft of EAGLE's shape, plain steps and verifications of T = 2, 5, 9, 17 at B = 1-64, and the
      # accepted length per step at which BASS breaks even (bench_forward.break_even).
      "size_sweep": Step(2, py + ["experiments.benchmarks.bench_forward", "--dtypes=bfloat16", "--notorch",
                                  "--noscanned", "--project_only", "--batch_sizes=1,8,64",
                                  "--num_new=1,2,5,9,17", "--cache_lens=2048", "--repeats=10",
                                  f"--results_dir={results}", "--setting=gpu_sizes", "--models=" + ",".join(
                                      f"random:{s}{d}" for s in ("smollm2-135m", "llama-3.2-1b",
                                                                 "llama-3.2-3b", "llama-3.1-8b")
                                      for d in ("", ":layers=1"))], 240),
      # Part 3, launch overhead: XLA's command buffers over loops and branches against its default
      # (timed, and checked token for token against regular decoding), scanned against unrolled layers.
      "command_buffers_default": Step(3, launch + ["--setting=gpu_command_buffers_default"], 120),
      "command_buffers_while": Step(3, launch + ["--setting=gpu_command_buffers_while"], 120,
                                    _WHILE_COMMAND_BUFFERS),
      "command_buffers_lossless": Step(3, py + [
          "experiments.paper.lossless", f"--draft={draft}", "--draft_num_layers=0", "--num_prompts=8",
          "--batch_size=8", "--max_new_tokens=128",
          f"--summary_json={results / 'lossless_command_buffers_while.json'}"], 90,
          _WHILE_COMMAND_BUFFERS),
      "scanned_layers": Step(3, launch + ["--scan_layers", "--setting=gpu_scanned"], 120),
      # Part 4: the decode's census on the real device, utilization, admission.
      "lower_decode": Step(4, py + ["experiments.benchmarks.lower_decode", "--platform=cuda", "--batch_size=8",
                                    f"--draft={draft}", f"--json={results / 'lower_decode_cuda.json'}",
                                    f"--hlo={results / 'decode_cuda.mlir'}"], 120),
      "utilization": Step(4, py + ["experiments.paper.utilization", "--setting=gpu",
                                   "--num_prompts=16", "--max_new_tokens=128", "--batch_sizes=1,4,16",
                                   "--kernels=pallas", f"--results_dir={results}",
                                   f"--draft={draft}"], 200),
      "admission": Step(4, py + ["experiments.benchmarks.bench_admission", "--profile=gpu", f"--draft={draft}",
                                 "--num_prompts=32", "--batch_size=8", "--admit_rows=1,2,4",
                                 "--admit_chunks=64,512", "--max_new_tokens=128"], 150),
  }


def _report(results: pathlib.Path, record: dict) -> None:
  """``bench_gpu.md``: the steps so far (exit, seconds, log) and every results file, rewritten after
  each step so that a call cut short keeps its report section."""
  lines = [f"## GPU benchmarks ({record['device']}, JAX {record['jax_version']}, {record['date']})",
           "", f"`python -m experiments.benchmarks.bench_gpu{' --quick' if record['quick'] else ''} "
           f"--part={','.join(map(str, record['parts']))}`, results in `{results}`.", "",
           "| part | step | exit | seconds | log |", "|---|---|---|---|---|"]
  for name, step in record["steps"].items():
    lines.append(f"| {step['part']} | {name} | {step['returncode']} | {step['seconds']:.0f} | "
                 f"{step['log']} |")
  files = sorted(p.name for p in results.iterdir() if p.suffix in (".json", ".mlir")
                 and p.name != "bench_gpu.json")
  lines += ["", "Results files: " + ", ".join(f"`{f}`" for f in files) + "."]
  _io.write_text_atomic(results / "bench_gpu.md", "\n".join(lines) + "\n")


def main(argv):
  del argv
  _io.init_script()
  try:
    parts = [int(p) for p in _PART.value]
  except ValueError:
    raise _io.Refusal(f"--part must list parts 1 to 4, got {_PART.value}") from None
  if not parts or sorted(set(parts)) != sorted(parts) or not set(parts) <= {1, 2, 3, 4}:
    raise _io.Refusal(f"--part must list distinct parts of 1 to 4, got {_PART.value}")
  results = _io.run_directory(_RESULTS.value, "bench_gpu")
  everything = steps(results, _QUICK.value, _DRAFT.value)
  plan = {name: step for part in parts for name, step in everything.items() if step.part == part}
  if _STEPS.value:
    unknown = sorted(set(_STEPS.value) - set(plan))
    if unknown:
      raise _io.Refusal(f"--steps: {unknown} are not steps of --part={_PART.value}; choose from "
                        f"{list(plan)}")
    plan = {name: step for name, step in plan.items() if name in _STEPS.value}
  results.mkdir(parents=True, exist_ok=True)
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0]
  record = {"device": f"{device.platform}:{device.device_kind}", "jax_version": jax.__version__,
            "quick": _QUICK.value, "date": datetime.date.today().isoformat(), "parts": parts,
            "draft": f"{QUICK_DRAFT} (first layer)" if _QUICK.value else _DRAFT.value, "steps": {}}
  earlier = results / "bench_gpu.json"
  if _RESUME.value and earlier.exists():  # keep the steps an earlier call of this folder recorded
    previous = json.loads(earlier.read_text())
    record["steps"] = dict(previous.get("steps", {}))
    record["parts"] = sorted(set(previous.get("parts", [])) | set(parts))
  for name, step in plan.items():
    log = results / f"{name}.log"
    start = time.perf_counter()
    print(f"[bench_gpu] part {step.part} {name} (at most {step.timeout_s:.0f} s): "
          f"{' '.join(step.command[2:])}", flush=True)
    with open(log, "a" if _RESUME.value else "w") as out:
      env = dict(os.environ)
      if _io.COMPILATION_CACHE_DIR.value:
        env["JAX_COMPILATION_CACHE_DIR"] = str(pathlib.Path(_io.COMPILATION_CACHE_DIR.value).absolute())
      if name == "kernel_tests":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
      if step.xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {step.xla_flags}".strip()
      # Its own process group, so that a timeout ends its children too (pytest's -n workers hold GPU
      # memory); what the step wrote so far stays (latency: every finished run).
      process = subprocess.Popen(step.command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
      try:
        code = process.wait(timeout=step.timeout_s)
      except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = "timeout"
    seconds = time.perf_counter() - start
    record["steps"][name] = {"part": step.part, "command": step.command[2:], "xla_flags": step.xla_flags,
                             "returncode": code,
                             "seconds": round(seconds, 1), "timeout_s": step.timeout_s,
                             "log": log.name}
    print(f"[bench_gpu] {name}: exit {code} in {seconds:.0f} s (log {log})", flush=True)
    _io.write_json_atomic(results / "bench_gpu.json", record)
    _report(results, record)
  print(json.dumps({n: s["returncode"] for n, s in record["steps"].items()}))
  failed = [n for n, s in record["steps"].items() if s["returncode"]]
  if failed:
    raise SystemExit(f"bench_gpu: steps failed or timed out: {failed} (see their logs in {results})")


if __name__ == "__main__":
  _io.run(main)
