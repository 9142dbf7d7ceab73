r"""How the changing l_draft meets static shapes: verification compiled at a few bucket sizes vs. once
at the maximum (masked), measured side by side in one process.

    python -m experiments.bench_verify_shapes --num_prompts=8 --batch_size=4 --max_new_tokens=64

Every configuration decodes the same prompts with the same drafts (greedy, distinct prompts per batch,
so the tokens are identical and only the cost differs) and prints one markdown table row: per-token latency All, mean l_draft,
compile time.
"""

from absl import app
from absl import flags

import bass_jax
from bass_jax import experiment
from bass_jax.data import load_problems
from experiments import _io

_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N HumanEval prompts (>= batch_size).")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Distinct prompts per batch.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per sequence.")
_DRAFT_LAYERS = flags.DEFINE_list("draft_num_layers", ["4", "26"],
                                  "Placeholder drafts: the target's first N layers.")
_BUCKETS = flags.DEFINE_list("buckets", ["default", "32", "1,2,3,4,5,6,8,11,16,23,32"],
                             "Verification bucket sets to compare ('default' = powers of two).")


def main(argv):
  del argv
  _io.quiet_third_party_logs()
  target = bass_jax.load_model("smollm2-135m-instruct")
  problems = load_problems("humaneval", _NUM_PROMPTS.value)
  print("| draft | verify buckets | ms/token All | mean l_draft | accepted/step | compile s |")
  print("|---|---|---|---|---|---|")
  for layers in _DRAFT_LAYERS.value:
    draft = target.with_first_layers(int(layers))
    for buckets in _BUCKETS.value:
      verify = None if buckets == "default" else [int(b) for b in buckets.split(",")]
      run = experiment.run_problems(target, draft, problems, batch_size=_BATCH.value,
                                    max_new_tokens=_MAX_NEW.value, verify_buckets=verify,
                                    progress=False)
      s = run.summary
      print(f"| first {layers} layers | {buckets} | {s['ms_per_token_all']:.1f} | "
            f"{s['mean_draft_len']:.2f} | {s['mean_accepted_length']:.2f} | "
            f"{s['compile_seconds']:.1f} |", flush=True)
  regular = experiment.run_problems(target, None, problems, batch_size=_BATCH.value, method="regular",
                                    max_new_tokens=_MAX_NEW.value, progress=False).summary
  print(f"| regular decoding | - | {regular['ms_per_token_all']:.1f} | - | 1 | "
        f"{regular['compile_seconds']:.1f} |")


if __name__ == "__main__":
  app.run(main)
