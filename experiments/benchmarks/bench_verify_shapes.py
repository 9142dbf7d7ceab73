r"""How the changing l_draft meets static shapes: verification chunk sizes measured side by side.

    python -m experiments.benchmarks.bench_verify_shapes --num_prompts=8 --batch_size=4 --setting=b4

The prompts are the tuning set (``--prompts=stdlib-heldout``, ``bass_jax.evaluation.data``): the default chunk size
is chosen here, so never on HumanEval, the evaluation set.

A step with ``l_draft`` drafts scores ``l_draft + 1`` positions in passes of a compiled chunk of C
positions (``generate(verify_chunk=C)``) and stops once every row has rejected: a small C wastes less
on padding, a large one needs fewer passes when drafts are accepted often. Every configuration decodes
the same prompts with the same drafts (greedy, distinct prompts per batch, so the tokens are identical
and only the cost differs) and prints one markdown table row: per-token latency All, mean l_draft, positions scored per step, compile time.
"""

from absl import app
from absl import flags

import bass_jax
from bass_jax.evaluation import experiment, reproduce
from bass_jax.evaluation.data import load_problems
from experiments import _decode_flags
from experiments import _io

_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set (bass_jax.evaluation.data.load_problems).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts (>= batch_size).")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Distinct prompts per batch.")
_MAX_NEW = _decode_flags.define(max_new_tokens=64)["max_new_tokens"]
_DRAFT = _io.define_draft_flag("smollm2-135m-draft")
_CHUNKS = flags.DEFINE_list("chunks", ["2", "4", "8", "16"], "Chunk sizes to compare.")
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_verify_shapes_<setting>.json "
                                   "(default: a fresh outputs/bench_verify_shapes-<time>/).")
_SETTING = flags.DEFINE_string("setting", "b4", "Name of the run (the file suffix).")


def main(argv):
  del argv
  _io.init_script()
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_verify_shapes")
    path = _io.check_output_file(run_dir / f"bench_verify_shapes_{_SETTING.value}.json",
                                 flag="results_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  target = bass_jax.load_model("smollm2-135m-instruct")
  draft = bass_jax.load_draft_spec(_DRAFT.value, target)
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  result = {"experiment": "bench_verify_shapes", "setting": _SETTING.value, **reproduce.machine(),
            "prompts": _PROMPTS.value, "num_prompts": len(problems), "batch_size": _BATCH.value,
            "max_new_tokens": _MAX_NEW.value, "draft": draft.name, "runs": []}
  print("| verify chunk | ms/token All | mean l_draft | positions scored per step | compile s |")
  print("|---|---|---|---|---|")
  for chunks in _CHUNKS.value:
    s = experiment.run_problems(target, draft, problems, batch_size=_BATCH.value,
                                max_new_tokens=_MAX_NEW.value, verify_chunk=int(chunks),
                                progress=False).summary
    result["runs"].append(s)
    _io.write_json_atomic(path, result)
    print(f"| {chunks} | {s['ms_per_token_all']:.1f} | {s['mean_draft_len']:.2f} | "
          f"{s['mean_verified']:.2f} | {s['compile_seconds']:.1f} |", flush=True)
  regular = experiment.run_problems(target, None, problems, batch_size=_BATCH.value, method="regular",
                                    max_new_tokens=_MAX_NEW.value, progress=False).summary
  result["runs"].append(regular)
  _io.write_json_atomic(path, result)
  print(f"| regular decoding | {regular['ms_per_token_all']:.1f} | - | 1 | "
        f"{regular['compile_seconds']:.1f} |")
  print(f"wrote {path}")


if __name__ == "__main__":
  _io.run(main)
