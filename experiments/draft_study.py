r"""The draft-design study (BASS Table 4 at this scale): drafts side by side in one run, to docs.

    python -m experiments.draft_study --drafts=runs/d192_l4/export,runs/d192_l2/export,runs/d256_l2/export

For every draft (load_model specs) and the target alone, on the first --num_prompts HumanEval prompts:

* parameters, and analytic FLOPs per token relative to the target (2 x the matrix parameters, the
  tied head included);
* draft ms/token decoding alone at batch 1 and 8 (regular decoding, greedy), and its ratio to the
  target's at batch 1;
* token acceptance rate and mean accepted length (bonus/correction counted) of greedy BASS with a fixed
  draft length of --draft_len at batch --accept_batch (the goal's setting);
* per-token latency All (ms/token, BASS §4.1) of BASS with the dynamic draft length, against regular
  decoding, at each of --batch_sizes, sampling at the paper's T = 0.2, top-p 0.95.

Every number comes from this one process on one machine; the table and the command go to --output.
"""

import datetime
import json
import platform
import sys

from absl import app
from absl import flags
import jax

import bass_jax
from bass_jax import experiment, metrics
from bass_jax.data import load_problems
from experiments import _io

_DRAFTS = flags.DEFINE_list("drafts", [], "Draft model specs (dirs, aliases).")
_NAMES = flags.DEFINE_list("names", [], "Display names (default: the specs).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 6, "First N HumanEval prompts.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per sequence.")
_DRAFT_LEN = flags.DEFINE_integer("draft_len", 4, "Fixed draft length of the acceptance measurement.")
_ACCEPT_BATCH = flags.DEFINE_integer("accept_batch", 4, "Batch of the acceptance measurement.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "4", "8"], "Batch sizes of the latency columns.")
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", None, "Directory for draft_study.json (default: a fresh outputs/draft_study-<time>/; "
    "--results_dir=results replaces the committed numbers).")
_OUTPUT = flags.DEFINE_string("output", None, "Markdown file to write (default: <results_dir>/"
                              "draft_study.md; docs/draft_study.md is the committed one).")


def main(argv):
  del argv
  _io.init_script()
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "draft_study")
    json_path = _io.check_output_file(run_dir / "draft_study.json", flag="results_dir")
    output = _io.check_output_file(_OUTPUT.value or run_dir / "draft_study.md", flag="output")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  target = bass_jax.load_model("smollm2-135m-instruct")
  problems = load_problems("humaneval", _NUM_PROMPTS.value)
  names = _NAMES.value or _DRAFTS.value
  batches = [int(b) for b in _BATCHES.value]
  # Every batch decodes copies of one prompt: the greedy runs measure cost and acceptance (identical
  # rows cost what distinct ones do), the T = 0.2 runs B samples per prompt, the paper's setting.
  run = lambda model, draft, **kw: experiment.run_problems(
      model, draft, problems, max_new_tokens=_MAX_NEW.value, progress=False, distinct_prompts=False,
      **kw).summary

  rows, raw = [], {"target": {}, "drafts": {}}
  target_ms = {b: run(target, None, batch_size=b, method="regular")["ms_per_token_all"] for b in (1, 8)}
  regular = {b: run(target, None, batch_size=b, method="regular", temperature=0.2,
                    top_p=0.95)["ms_per_token_all"] for b in batches}
  raw["target"] = {"ms_per_token_greedy": target_ms, "regular_all_ms": regular,
                   "params": target.config.num_params()}
  for spec, name in zip(_DRAFTS.value, names):
    draft = bass_jax.load_draft(spec, target)
    draft_for_timing = bass_jax.Model(draft.config, draft.params, target.tokenizer, name)
    draft_ms = {b: run(draft_for_timing, None, batch_size=b, method="regular")["ms_per_token_all"]
                for b in (1, 8)}
    accept = run(target, draft, batch_size=_ACCEPT_BATCH.value, method="bass",
                 draft_len=_DRAFT_LEN.value)
    bass = {b: run(target, draft, batch_size=b, method="bass", temperature=0.2,
                   top_p=0.95)["ms_per_token_all"] for b in batches}
    entry = {"params": draft.config.num_params(),
             "flops_ratio": (metrics.matmul_params(draft.config, draft.params)
                            / metrics.matmul_params(target.config, target.params)),
             "draft_ms_per_token": draft_ms, "time_ratio_b1": draft_ms[1] / target_ms[1],
             "acceptance_rate": accept["draft_acceptance_rate"],
             "mean_accepted_length": accept["mean_accepted_length"], "bass_all_ms": bass,
             "layers": draft.config.num_hidden_layers, "hidden_size": draft.config.hidden_size}
    raw["drafts"][name] = entry
    rows.append((name, entry))
    print(name, json.dumps(entry), flush=True)

  device = jax.devices()[0]
  header = ("| draft | layers x width | params | FLOPs/token vs target | draft ms/token B=1 | B=8 | "
            "time vs target (B=1) | acceptance rate | mean accepted length | " +
            " | ".join(f"BASS All B={b}" for b in batches) + " |")
  lines = [header, "|" + "---|" * (9 + len(batches))]
  for name, e in rows:
    lines.append(
        f"| {name} | {e['layers']} x {e['hidden_size']} | {e['params'] / 1e6:.1f} M | "
        f"{e['flops_ratio']:.3f} | {e['draft_ms_per_token'][1]:.1f} | {e['draft_ms_per_token'][8]:.1f} | "
        f"{e['time_ratio_b1']:.3f} | {e['acceptance_rate']:.3f} | {e['mean_accepted_length']:.2f} | "
        + " | ".join(f"{e['bass_all_ms'][b]:.1f} ({regular[b] / e['bass_all_ms'][b]:.2f}x)"
                     for b in batches) + " |")
  lines.append(
      f"| target alone (regular decoding) | {target.config.num_hidden_layers} x "
      f"{target.config.hidden_size} | {target.config.num_params() / 1e6:.1f} M | 1 | "
      f"{target_ms[1]:.1f} | {target_ms[8]:.1f} | 1 | - | 1 | "
      + " | ".join(f"{regular[b]:.1f}" for b in batches) + " |")
  command = "python -m experiments.draft_study " + " ".join(sys.argv[1:])
  text = "\n".join([
      "# Draft-design study",
      "",
      f"Written by `{command}` on {datetime.date.today().isoformat()}, "
      f"{device.platform} ({platform.processor() or platform.machine()}, "
      f"{jax.local_device_count()} device, JAX {jax.__version__}).",
      "",
      f"First {_NUM_PROMPTS.value} HumanEval prompts, {_MAX_NEW.value} new tokens, each prompt one "
      "batch of identical prompts (greedy: draft speed and acceptance; T = 0.2: B samples). Acceptance: greedy BASS, draft "
      f"length fixed at {_DRAFT_LEN.value}, batch {_ACCEPT_BATCH.value}. Latency: per-token latency per sequence, All (ms/token, mean over the "
      "batch), BASS with the dynamic draft length (Algorithm 1) at T = 0.2, top-p 0.95, and in "
      "parentheses the speed-up over regular decoding measured in the same run (last row).",
      "",
      *lines,
      "",
  ])
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(text)
  _io.write_json_atomic(json_path, raw)
  print(text)
  print(f"wrote {output} and {json_path}")


if __name__ == "__main__":
  app.run(main)
