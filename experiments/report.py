r"""Regenerates docs/results.md and its plots from results/*.json (one command, nothing measured here).

    python -m experiments.report

Each section names the setting, machine, date and command of the JSON it renders. The hand-written
reading of the numbers lives in docs/results_reading.md and is placed at the top.
"""

import json
import pathlib

from absl import app
from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

_RESULTS = flags.DEFINE_string("results", "results", "Directory of the experiments' JSON files.")
_OUTPUT = flags.DEFINE_string("output", "docs/results.md", "Markdown file to write.")
_FIGURES = flags.DEFINE_string("figures", "docs/figures", "Directory for the PNG plots.")
_READING = flags.DEFINE_string("reading", "docs/results_reading.md", "Hand-written reading.")

_LABELS = {"regular": "regular decoding", "bass_pad": "BASS-PAD (dynamic)",
           "bass_split": "BASS-SPLIT (dynamic)", "bass_pad_l4": "BASS-PAD, l_draft = 4",
           "bass_pad_l6": "BASS-PAD, l_draft = 6", "bass_pad_l8": "BASS-PAD, l_draft = 8"}


def _provenance(result) -> str:
  return (f"Setting **{result['setting']}**: `{result['command']}` on {result['date']}, "
          f"{result['device']} ({result['host']}), JAX {result['jax_version']}; target "
          f"`{result['target']}`, draft `{result['draft']}`, {result['num_prompts']} HumanEval prompts, "
          f"{result['max_new_tokens']} new tokens per sequence.")


def _latency(result) -> list[str]:
  lines = ["## Latency and throughput (Tables 1-3)", "", _provenance(result), "",
           "Per-token latency per sequence in ms/token, All (First / Last), speed-up of All over "
           "regular decoding at the same batch size, tokens/s over the batch, mean accepted length "
           "(bonus counted), draft acceptance rate, Pass@Batch. PAD and SPLIT run as "
           f"`{result['runs'][0]['attention_impl'].split('_')[0]}` attention "
           "(`blocked` = the plain-JAX versions of the Pallas kernels, used off-GPU).", ""]
  for sampling in dict.fromkeys(r["sampling"] for r in result["runs"]):
    runs = [r for r in result["runs"] if r["sampling"] == sampling]
    regular = {r["batch_size"]: r["ms_per_token_all"] for r in runs if r["config"] == "regular"}
    lines += [f"### {sampling}", "",
              "| config | B | ms/token All (First / Last) | speed-up | tokens/s | accepted length | "
              "acceptance | Pass@Batch |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (list(_LABELS).index(r["config"]), r["batch_size"])):
      rate = r["draft_acceptance_rate"]
      pass_at = r.get("pass_at_batch")
      lines.append(
          f"| {_LABELS[r['config']]} | {r['batch_size']} | {r['ms_per_token_all']:.1f} "
          f"({r['ms_per_token_first']:.1f} / {r['ms_per_token_last']:.1f}) | "
          f"{regular[r['batch_size']] / r['ms_per_token_all']:.2f}x | {r['tokens_per_second']:.1f} | "
          f"{r['mean_accepted_length']:.2f} | {'-' if rate is None else f'{rate:.3f}'} | "
          f"{'-' if pass_at is None else f'{pass_at:.2f}'} |")
    lines.append("")
  return lines


def _save_figure(fig, path: pathlib.Path) -> str:
  """Writes ``fig`` as PNG and returns its path relative to docs/, for the Markdown image link."""
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return str(path.relative_to(path.parents[1]))


def _utilization(result, figures: pathlib.Path) -> list[str]:
  runs = result["runs"]
  fig, ax = plt.subplots(figsize=(6, 4))
  for method, marker in (("regular", "o"), ("bass", "s")):
    rs = [r for r in runs if r["method"] == method]
    for kind, fill in (("useful", "full"), ("executed", "none")):
      ax.plot([100 * r[f"{kind}_utilization"] for r in rs], [r["ms_per_token_all"] for r in rs],
              marker=marker, fillstyle=fill, linestyle="-" if kind == "useful" else ":",
              label=f"{'BASS' if method == 'bass' else 'regular'} ({kind} FLOPs)")
      for r in rs:
        ax.annotate(f"B={r['batch_size']}", (100 * r[f"{kind}_utilization"], r["ms_per_token_all"]),
                    fontsize=6)
  ax.set_xlabel("utilization (% of measured peak FLOP/s)")
  ax.set_ylabel("per-token latency All (ms/token)")
  ax.set_title("Latency against utilization (BASS at B=1 = single-sequence SD)")
  ax.legend(fontsize=7)
  image = _save_figure(fig, figures / f"utilization_{result['setting']}.png")
  lines = ["## Utilization (Fig. 1)", "", _provenance(result), "",
           f"Peak: {result['peak_flops'] / 1e9:.1f} GFLOP/s, an f32 2048 x 2048 matrix product measured "
           "by the script. Useful FLOPs: the target's forward over the prompt and every emitted token; "
           "executed FLOPs: every computed position of both models (padding, rejected drafts, finished "
           f"rows). Sampling T = {result['temperature']}, top-p {result['top_p']}.", "",
           f"![latency against utilization]({image})", "",
           "| method | B | ms/token All | tokens/s | useful utilization | executed utilization |",
           "|---|---|---|---|---|---|"]
  for r in runs:
    lines.append(f"| {'BASS' if r['method'] == 'bass' else 'regular'} | {r['batch_size']} | "
                 f"{r['ms_per_token_all']:.1f} | {r['tokens_per_second']:.1f} | "
                 f"{r['useful_utilization']:.2%} | {r['executed_utilization']:.2%} |")
  return lines + [""]


def _budget(result, figures: pathlib.Path) -> list[str]:
  runs = result["runs"]
  temperatures = sorted({r["temperature"] for r in runs})
  fig, axes = plt.subplots(1, len(temperatures), figsize=(5 * len(temperatures), 3.6), squeeze=False)
  for ax, t in zip(axes[0], temperatures):
    for r in (r for r in runs if r["temperature"] == t):
      curve = r["pass_curve"]
      style = "-" if r["method"] == "bass" else ":"
      ax.plot(curve["budget_seconds"], curve["pass_at_first"], style,
              label=f"{r['method']} B={r['batch_size']} first")
      ax.plot(curve["budget_seconds"], curve["pass_at_finished"], style, alpha=0.5,
              label=f"{r['method']} B={r['batch_size']} finished")
    ax.axvline(result["budget_seconds"], color="grey", linewidth=0.8)
    ax.set_title(f"T = {t}")
    ax.set_xlabel("wall-clock budget per prompt (s)")
    ax.set_ylabel("pass rate")
  axes[0][-1].legend(fontsize=5, ncol=2)
  image = _save_figure(fig, figures / f"budget_{result['setting']}.png")
  lines = ["## Accuracy within a time budget (Fig. 5)", "", _provenance(result), "",
           f"Budget: {result['budget_seconds']:.2f} s per prompt = {result['budget_fraction']} x regular "
           "decoding's time for a full-length sequence at the smallest batch, so regular decoding cannot "
           "finish a full-length sequence within it. Pass@First: the finished sequence with the highest "
           "mean log-probability passes; Pass@Finished: any finished sequence passes.", "",
           f"![pass rates against the budget]({image})", "",
           "| T | method | B | Pass@First | Pass@Finished | Pass@Batch (no budget) |",
           "|---|---|---|---|---|---|"]
  for r in runs:
    lines.append(f"| {r['temperature']} | {r['method']} | {r['batch_size']} | "
                 f"{r['pass_at_budget']['pass_at_first']:.2f} | "
                 f"{r['pass_at_budget']['pass_at_finished']:.2f} | {r['pass_at_batch']:.2f} |")
  return lines + [""]


def _baselines(result) -> list[str]:
  lines = ["## Against transformers in the same run", "", _provenance(result), "",
           f"Sampling T = {result['temperature']}, top-p {result['top_p']}. transformers returns a batch "
           "when its last row finishes, so its First = Last = All (ms per token of the longest row).",
           "", "| system | B | ms/token All | tokens/s | bass-jax BASS speed-up over it |",
           "|---|---|---|---|---|"]
  for r in result["runs"]:
    bass = next(x for x in result["runs"]
                if x["system"] == "bass-jax bass" and x["batch_size"] == r["batch_size"])
    lines.append(f"| {r['system']} | {r['batch_size']} | {r['ms_per_token_all']:.1f} | "
                 f"{r['tokens_per_second']:.1f} | {r['ms_per_token_all'] / bass['ms_per_token_all']:.2f}x |")
  return lines + [""]


def main(argv):
  del argv
  results = pathlib.Path(_RESULTS.value)
  figures = pathlib.Path(_FIGURES.value)
  figures.mkdir(parents=True, exist_ok=True)
  lines = ["# Results", "", "Generated by `python -m experiments.report` from `results/*.json`; every "
           "number below was measured by the command named in its section.", ""]
  reading = pathlib.Path(_READING.value)
  if reading.exists():
    lines += [reading.read_text().strip(), ""]
  for path in sorted(results.glob("*.json")):
    result = json.loads(path.read_text())
    kind = result.get("experiment")
    if kind == "latency":
      lines += _latency(result)
    elif kind == "utilization":
      lines += _utilization(result, figures)
    elif kind == "budget":
      lines += _budget(result, figures)
    elif kind == "baselines":
      lines += _baselines(result)
  pathlib.Path(_OUTPUT.value).write_text("\n".join(lines) + "\n")
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
