r"""BASS on a mesh against one device, and the draft replicated against tensor-parallel, side by side.

    python -m experiments.benchmarks.bench_sharding --results_dir=results

The SmolLM2 target and the shipped draft, ``--batch_size`` distinct HumanEval prompts, greedy. For one
device and then each ``--meshes`` entry: regular decoding, BASS with the draft replicated over
``model`` (``generate``'s default) and BASS with the draft tensor-parallel like the target. Every
setting runs once to compile and then ``--repeats`` timed times (the median is reported); the tokens
of every mesh are checked equal to one device's.

On a CPU the mesh's devices are XLA's host devices (``--host_devices``), which share this machine's
cores: the table then shows what the partitioned program costs on top of the same arithmetic (the
collectives become copies), not what a GPU interconnect costs. A GPU cluster is needed for that.
"""

import statistics

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io

_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_sharding.json (default: a "
                                   "fresh outputs/bench_sharding-<time>/).")
_HOST_DEVICES = flags.DEFINE_integer(
    "host_devices", 8, "CPU devices to create (XLA's --xla_force_host_platform_device_count); ignored "
    "on a GPU.", lower_bound=1)
_MESHES = flags.DEFINE_list("meshes", ["8x1", "2x3"], "Meshes as DATAxMODEL.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Distinct HumanEval prompts per batch.", lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=64)["max_new_tokens"]
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per setting (median reported).",
                                lower_bound=1)


def main(argv):
  del argv  # _io.run refuses arguments that are not flags
  meshes = _io.init_mesh_script(_HOST_DEVICES.value, _MESHES.value)
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_sharding")
    path = _io.check_output_file(run_dir / "bench_sharding.json", flag="results_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e

  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax import sharding, text  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  target = bass_jax.load_model("smollm2-135m-instruct", scan_layers=False)  # a mesh needs unrolled
  draft = bass_jax.load_draft("smollm2-135m-draft", target)
  prompts = text.encode_prompts(target.tokenizer,
                                [p.prompt for p in load_problems("humaneval", _BATCH.value)])
  settings = [("regular", dict(method="regular")),
              ("BASS, draft replicated", dict(draft_sharding="replicated")),
              ("BASS, draft tensor-parallel", dict(draft_sharding="tensor_parallel"))]
  result = {"experiment": "bench_sharding", **reproduce.machine(), "batch_size": _BATCH.value,
            "max_new_tokens": _MAX_NEW.value, "rows": []}
  reference = {}
  print("| mesh (data, model) | decoding | tokens/s | vs one device | same tokens |")
  print("|---|---|---|---|---|")
  for shape in [None] + meshes:
    mesh = None if shape is None else sharding.make_mesh(*shape)
    for name, kwargs in settings:
      if shape is None and "tensor-parallel" in name:
        continue  # one device: the draft's placement does not apply
      run = lambda: bass_jax.generate(target, draft, prompts, max_new_tokens=_MAX_NEW.value,
                                      mesh=mesh, **kwargs)
      run()  # compile and warm up
      outs = [run() for _ in range(_REPEATS.value)]
      rate = statistics.median(int(o.lengths.sum()) / o.stats.wall_seconds for o in outs)
      method = kwargs.get("method", "bass")
      if shape is None:
        reference[method] = (rate, outs[0].tokens)
      same = bool(np.array_equal(outs[0].tokens, reference[method][1]))
      row = {"mesh": list(shape) if shape else None, "decoding": name, "tokens_per_second": rate,
             "vs_one_device": rate / reference[method][0], "same_tokens": same}
      result["rows"].append(row)
      _io.write_json_atomic(path, result)
      print(f"| {tuple(shape) if shape else 'one device'} | {name} | {rate:.1f} | "
            f"{row['vs_one_device']:.2f}x | {same} |", flush=True)
  print(f"wrote {path}")


if __name__ == "__main__":
  _io.run(main)
