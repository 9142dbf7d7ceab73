r"""Regenerates docs/results/paper.md and its plots from results/*.json (one command, nothing measured here).

    python -m experiments.paper.report

Each section names the setting, machine, date and command of the JSON it renders, shows the tables,
and states what they say in sentences computed from the same numbers (which configuration is faster at
which batch size, by how much, how ragged the batches were), so the text cannot contradict the tables
of a new run. Why the numbers come out as they do is explained in docs/design.md and docs/bass.md, which
quote no run. A plot that would carry no information (every pass rate 0) is not drawn; the section says
why. A result file from an interrupted run is rendered with a warning.
"""

import json
import pathlib

from absl import flags
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from experiments import _io  # pylint: disable=g-import-not-at-top,wrong-import-position

_RESULTS = flags.DEFINE_string("results", "results", "Directory of the experiments' JSON files.")
_OUTPUT = flags.DEFINE_string("output", "docs/results/paper.md", "Markdown file to write.")
_FIGURES = flags.DEFINE_string("figures", "docs/results/figures", "Directory for the PNG plots.")

_LABELS = {"regular": "regular decoding", "bass_pad": "BASS-PAD (dynamic)",
           "bass_split": "BASS-SPLIT (dynamic)", "bass_pad_l4": "BASS-PAD, l_draft = 4",
           "bass_pad_l6": "BASS-PAD, l_draft = 6", "bass_pad_l8": "BASS-PAD, l_draft = 8"}
_METHODS = {"regular": "regular decoding", "bass": "BASS"}
_FIXED = ("bass_pad_l4", "bass_pad_l6", "bass_pad_l8")


def _provenance(result) -> str:
  text = (f"Setting **{result['setting']}**: `{result['command']}` on {result['date']}, "
          f"{result['device']} ({result['host']}), JAX {result['jax_version']}; target "
          f"`{result['target']}`, draft `{result['draft']}`, {result['num_prompts']} HumanEval prompts, "
          f"{result['max_new_tokens']} new tokens per sequence.")
  if not result.get("complete", True):
    text += (f"\n\n**Incomplete**: the run was interrupted; these are the {len(result['runs'])} runs "
             "it finished.")
  return text


def _x(ratio: float) -> str:
  return f"{ratio:.2f}x"


def _list(items) -> str:
  items = list(items)
  return ", ".join(items) if items else "none"


def _span(values, fmt: str = "{:.2f}") -> str:
  """``"a-b"`` for the range of ``values``, or one number when they are all equal."""
  lo, hi = fmt.format(min(values)), fmt.format(max(values))
  return lo if lo == hi else f"{lo}-{hi}"


def _sides(speedups: dict[int, float]) -> str:
  """Where a speed-up is above 1 and where not, as a phrase."""
  faster = [str(b) for b in speedups if speedups[b] > 1]
  slower = [str(b) for b in speedups if speedups[b] <= 1]
  if not slower:
    return f"faster than regular decoding at every batch size (B = {_list(faster)})"
  if not faster:
    return f"slower than regular decoding at every batch size (B = {_list(slower)})"
  return f"faster than regular decoding at B = {_list(faster)} and slower at B = {_list(slower)}"


def _speedups(runs, config: str) -> dict[int, float]:
  """Batch size -> regular decoding's ms/token All over ``config``'s, for the batch sizes both ran."""
  regular = {r["batch_size"]: r["ms_per_token_all"] for r in runs if r["config"] == "regular"}
  return {r["batch_size"]: regular[r["batch_size"]] / r["ms_per_token_all"]
          for r in runs if r["config"] == config and r["batch_size"] in regular}


def _latency_reading(runs) -> list[str]:
  """Sentences computed from one sampling setting's runs."""
  out = []
  bass_configs = [c for c in _LABELS if c != "regular" and any(r["config"] == c for r in runs)]
  batches = sorted({r["batch_size"] for r in runs})
  if not bass_configs or not any(r["config"] == "regular" for r in runs):
    return out
  best = []
  for b in batches:
    cands = [(s[b], c) for c in bass_configs if b in (s := _speedups(runs, c))]
    if cands:
      ratio, config = max(cands)
      best.append((b, config, ratio))
  out.append("- Fastest BASS setting per batch size (speed-up of All over regular decoding): " + "; ".join(
      f"B = {b}: {_LABELS[c]} {_x(r)}" for b, c, r in best) + ".")
  if "bass_pad" in bass_configs:
    s = _speedups(runs, "bass_pad")
    out.append(f"- BASS-PAD (dynamic) is {_sides(s)}.")
  if "bass_pad" in bass_configs and any(c in bass_configs for c in _FIXED):
    wins = [b for b, c, _ in best if c in ("bass_pad", "bass_split")]
    out.append(f"- The dynamic draft length (Algorithm 1) is the fastest BASS setting at {len(wins)} of "
               f"{len(best)} batch sizes; a fixed length at the others.")
  if "bass_pad" in bass_configs and "bass_split" in bass_configs:
    pad = {r["batch_size"]: r["ms_per_token_all"] for r in runs if r["config"] == "bass_pad"}
    split = {r["batch_size"]: r["ms_per_token_all"] for r in runs if r["config"] == "bass_split"}
    ratios = [split[b] / pad[b] for b in pad if b in split]
    out.append(f"- PAD is faster than SPLIT at {sum(r > 1 for r in ratios)} of {len(ratios)} batch sizes "
               f"(SPLIT's time over PAD's: {_span(ratios)}).")
  bass = [r for r in runs if r["config"] != "regular"]
  out.append(f"- Mean accepted length (bonus counted) "
             f"{_span([r['mean_accepted_length'] for r in bass])}; draft acceptance rate "
             f"{_span([r['draft_acceptance_rate'] for r in bass], '{:.3f}')}.")
  multi = [r for r in runs if r["batch_size"] > 1 and "length_spread" in r]
  if multi:
    if all(r["length_spread"] == 0 and r.get("accepted_spread", 0) == 0 for r in multi):
      out.append("- The rows of every batch were identical (no length or acceptance spread): these rows "
                 "measure nothing ragged.")
    else:
      gap = max(r["ms_per_token_last"] / r["ms_per_token_first"] - 1 for r in multi)
      bass_multi = [r for r in multi if r["config"] != "regular"]
      accepted = (f", accepted drafts per step by "
                  f"{_span([r['accepted_spread'] for r in bass_multi])} on average" if bass_multi else "")
      out.append(f"- Batches were ragged: final lengths within a batch differed by "
                 f"{_span([r['length_spread'] for r in multi], '{:.0f}')} tokens (mean over batches)"
                 f"{accepted}; Last was up to {gap:.0%} slower per token than First.")
  return out


def _latency(result) -> list[str]:
  first_impl = result["runs"][0]["attention_impl"].split("_")[0] if result["runs"] else "?"
  lines = ["## Latency and throughput (Tables 1-3)", "", _provenance(result), "",
           "Per-token latency per sequence in ms/token, All (First / Last), speed-up of All over "
           "regular decoding at the same batch size, tokens/s over the batch, mean accepted length "
           "(bonus counted), draft acceptance rate, raggedness (mean over batches of the spread of final "
           "sequence lengths across rows, in tokens, and of accepted drafts per step across rows), "
           "Pass@Batch. Greedy batches hold distinct prompts; sampled batches hold B samples of one "
           f"prompt. PAD and SPLIT run as `{first_impl}` attention (`blocked` = the plain-JAX versions "
           "of the Pallas kernels, used off-GPU).", ""]
  for sampling in dict.fromkeys(r["sampling"] for r in result["runs"]):
    runs = [r for r in result["runs"] if r["sampling"] == sampling]
    regular = {r["batch_size"]: r["ms_per_token_all"] for r in runs if r["config"] == "regular"}
    lines += [f"### {sampling}", "", *_latency_reading(runs), "",
              "| config | B | ms/token All (First / Last) | speed-up | tokens/s | accepted length | "
              "acceptance | length spread | accepted spread | Pass@Batch |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (list(_LABELS).index(r["config"]), r["batch_size"])):
      rate = r["draft_acceptance_rate"]
      pass_at = r.get("pass_at_batch")
      speedup = _x(regular[r["batch_size"]] / r["ms_per_token_all"]) if r["batch_size"] in regular else "-"
      lines.append(
          f"| {_LABELS[r['config']]} | {r['batch_size']} | {r['ms_per_token_all']:.1f} "
          f"({r['ms_per_token_first']:.1f} / {r['ms_per_token_last']:.1f}) | {speedup} | "
          f"{r['tokens_per_second']:.1f} | {r['mean_accepted_length']:.2f} | "
          f"{'-' if rate is None else f'{rate:.3f}'} | {r.get('length_spread', float('nan')):.1f} | "
          f"{r.get('accepted_spread', float('nan')):.2f} | "
          f"{'-' if pass_at is None else f'{pass_at:.2f}'} |")
    lines.append("")
  return lines


def _save_figure(fig, path: pathlib.Path) -> str:
  """Writes ``fig`` as PNG and returns its path relative to the figures folder's parent
  (docs/results/ by default, where the Markdown is), for the Markdown image link."""
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
  by = {(r["method"], r["batch_size"]): r for r in runs}
  batches = sorted({r["batch_size"] for r in runs})
  useful = lambda m: [by[(m, b)]["useful_utilization"] for b in batches if (m, b) in by]
  reading = []
  if useful("regular") and useful("bass"):
    higher = [b for b in batches if ("bass", b) in by and ("regular", b) in by
              and by[("bass", b)]["useful_utilization"] > by[("regular", b)]["useful_utilization"]]
    executed = [by[("bass", b)]["executed_utilization"] for b in batches if ("bass", b) in by]
    reading = [
        f"- Useful utilization: regular decoding {_span(useful('regular'), '{:.1%}')}, BASS "
        f"{_span(useful('bass'), '{:.1%}')} over B = {_list(str(b) for b in batches)}; BASS uses more of "
        f"the machine usefully at B = {_list(str(b) for b in higher)}.",
        f"- Executed utilization of BASS (every drafted and verified position): "
        f"{_span(executed, '{:.1%}')}.", ""]
  lines = ["## Utilization (Fig. 1)", "", _provenance(result), "",
           f"Peak: {result['peak_flops'] / 1e9:.1f} GFLOP/s, an f32 2048 x 2048 matrix product measured "
           "by the script. Useful FLOPs: the target's forward over the prompt and every emitted token; "
           "executed FLOPs: every computed position of both models (padding, rejected drafts, finished "
           f"rows). Sampling T = {result['temperature']}, top-p {result['top_p']}.", "", *reading,
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
  lines = ["## Accuracy within a time budget (Fig. 5)", "", _provenance(result), ""]
  if not result.get("complete", True):
    return lines + ["The budget is computed from the complete run; nothing to show yet.", ""]
  image = figures / f"budget_{result['setting']}.png"
  rates = [v for r in runs for v in (r["pass_at_budget"]["pass_at_first"],
                                     r["pass_at_budget"]["pass_at_finished"], r["pass_at_batch"])]
  curves = [v for r in runs for k in ("pass_at_first", "pass_at_finished") for v in r["pass_curve"][k]]
  lines += [f"Budget: {result['budget_seconds']:.2f} s per prompt = {result['budget_fraction']} x regular "
            "decoding's time for a full-length sequence at the smallest batch, so regular decoding cannot "
            "finish a full-length sequence within it. Samples finished: the share of all sequences "
            "complete (EOS or the token limit) within the budget. Pass@First: the finished sequence "
            "with the highest "
            "mean log-probability passes; Pass@Finished: any finished sequence passes. "
            + ("Continuous batching: the samples of all prompts form one queue that B rows decode, and a "
               "sample's time runs from its admission." if result.get("continuous") else
               "Static batches: one batch of B samples per prompt (this run predates continuous "
               "batching or ran with --nocontinuous)."), ""]
  if not any(rates) and not any(curves):
    image.unlink(missing_ok=True)
    lines += [f"- No sequence passed its unit tests, with either method, at any batch size or "
              f"temperature (Pass@Batch 0 without a budget too): the target solves none of these "
              f"{result['num_prompts']} problems within {result['max_new_tokens']} tokens. The pass-rate "
              "plot is not drawn: every curve would be flat at 0. This setting measures time to finish, "
              "not accuracy.", ""]
  else:
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
    for method in ("regular", "bass"):
      rs = [r for r in runs if r["method"] == method]
      top = max(rs, key=lambda r: r["pass_at_budget"]["pass_at_finished"])
      lines.append(f"- Best {method} Pass@Finished within the budget: "
                   f"{top['pass_at_budget']['pass_at_finished']:.2f} (T = {top['temperature']}, "
                   f"B = {top['batch_size']}).")
    lines += ["", f"![pass rates against the budget]({_save_figure(fig, image)})", ""]
  lines += ["| T | method | B | ms/token All | samples finished | Pass@First | Pass@Finished | "
            "Pass@Batch (no budget) |", "|---|---|---|---|---|---|---|---|"]
  for r in runs:
    share = r["pass_at_budget"].get("finished_share")  # absent from runs made before it was recorded
    lines.append(f"| {r['temperature']} | {r['method']} | {r['batch_size']} | {r['ms_per_token_all']:.1f} | "
                 f"{'-' if share is None else f'{share:.0%}'} | "
                 f"{r['pass_at_budget']['pass_at_first']:.2f} | "
                 f"{r['pass_at_budget']['pass_at_finished']:.2f} | {r['pass_at_batch']:.2f} |")
  return lines + [""]


def _baselines(result) -> list[str]:
  runs = result["runs"]
  ms = {(r["system"], r["batch_size"]): r["ms_per_token_all"] for r in runs}
  reading = []
  for b in sorted({r["batch_size"] for r in runs}):
    if ("bass-jax regular", b) in ms and ("transformers generate", b) in ms:
      reading.append(f"- B = {b}: bass-jax regular decoding is "
                     f"{_x(ms[('transformers generate', b)] / ms[('bass-jax regular', b)])} as fast per "
                     f"token as transformers' `generate`; BASS is "
                     f"{_x(ms[('bass-jax regular', b)] / ms[('bass-jax bass', b)])} regular decoding.")
    if ("transformers assisted", b) in ms and ("bass-jax bass", b) in ms:
      reading.append(f"- B = {b}: transformers' assisted generation with the same draft runs at "
                     f"{_x(ms[('transformers generate', b)] / ms[('transformers assisted', b)])} its own "
                     f"`generate`; BASS is {_x(ms[('transformers assisted', b)] / ms[('bass-jax bass', b)])} "
                     "as fast as assisted generation.")
  lines = ["## Against transformers in the same run", "", _provenance(result), "",
           f"Sampling T = {result['temperature']}, top-p {result['top_p']}; "
           f"{'distinct prompts per batch' if result.get('distinct_prompts') else 'B copies of a prompt'}"
           " for every system. transformers returns a batch when its last row finishes, so its First = "
           "Last = All (ms per token of the longest row).", "", *reading, "",
           "| system | B | ms/token All | tokens/s | bass-jax BASS speed-up over it |",
           "|---|---|---|---|---|"]
  for r in runs:
    bass = ms.get(("bass-jax bass", r["batch_size"]))
    lines.append(f"| {r['system']} | {r['batch_size']} | {r['ms_per_token_all']:.1f} | "
                 f"{r['tokens_per_second']:.1f} | "
                 f"{_x(r['ms_per_token_all'] / bass) if bass else '-'} |")
  return lines + [""]


def _batching(run) -> str:
  """``"static"`` or ``"continuous"`` as the run asked (older files record only what ran)."""
  return run.get("batching") or ("continuous" if run["continuous"] else "static")


def _throughput(result) -> list[str]:
  runs = result["runs"]
  key = lambda r: (r["temperature"], r["batch_size"], r["method"], _batching(r) == "continuous")
  by = {key(r): r for r in runs}
  reading = []
  for t in sorted({r["temperature"] for r in runs}):
    for b in sorted({r["batch_size"] for r in runs}):
      for method in ("bass", "regular"):
        static, continuous = by.get((t, b, method, False)), by.get((t, b, method, True))
        if static and continuous:
          reading.append(
              f"- T = {t}, B = {b}, {_METHODS[method]}: continuous batching gives "
              f"{_x(continuous['tokens_per_second'] / static['tokens_per_second'])} the tokens/s of "
              f"static batches ({static['wall_seconds']:.0f} s -> {continuous['wall_seconds']:.0f} s for "
              f"the set), per-token latency All {_x(continuous['ms_per_token_all'] / static['ms_per_token_all'])}.")
  lines = ["## Static batches against continuous batching", "", _provenance(result), "",
           "Every prompt decoded once (distinct prompts at every temperature; top-p 0.95 when sampling). "
           "Static: consecutive groups of B prompts, each decoded until its last row finishes. "
           "Continuous: one queue, B rows at a time, a finished row taking the next prompt inside the "
           "jitted loop (`generate(..., batch_size=B)`). Wall: the whole set, compilation excluded. "
           "Per-token latency All: each sequence's time from the start of its own decoding (its batch, "
           "or its admission) over its tokens, averaged. Wait and TTFT are from the start of the run.",
           "", *reading, "",
           "| T | B | method | batching | tokens/s | ms/token All | wall (s) | mean wait (s) | "
           "mean TTFT (s) | accepted length |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in sorted(runs, key=key):
    lines.append(
        f"| {r['temperature']} | {r['batch_size']} | {_METHODS[r['method']]} | "
        f"{_batching(r)} | {r['tokens_per_second']:.1f} | "
        f"{r['ms_per_token_all']:.1f} | {r['wall_seconds']:.1f} | {r['mean_wait_seconds']:.1f} | "
        f"{r['mean_ttft_seconds']:.1f} | {r['mean_accepted_length']:.2f} |")
  return lines + [""]


def main(argv):
  del argv
  results = pathlib.Path(_RESULTS.value)
  figures = pathlib.Path(_FIGURES.value)
  figures.mkdir(parents=True, exist_ok=True)
  lines = ["# Results", "",
           f"Generated by `python -m experiments.paper.report` from `{results}/*.json`; every number below was "
           "measured by the command named in its section, and every sentence under a heading is "
           "computed from that section's numbers. Why they come out this way: `docs/design.md` "
           "(\"What the CPU measurements say\"). The machines are shared and noisy: the same "
           "configuration measured minutes apart can differ by a third, so compare rows within one "
           "table, and only differences well above that.", ""]
  renderers = {"latency": _latency, "utilization": lambda r: _utilization(r, figures),
               "budget": lambda r: _budget(r, figures), "baselines": _baselines,
               "throughput": _throughput}
  for path in sorted(results.glob("*.json")):
    result = json.loads(path.read_text())
    render = renderers.get(result.get("experiment"))
    if render is not None:
      lines += render(result)
  pathlib.Path(_OUTPUT.value).write_text("\n".join(lines) + "\n")
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  _io.run(main)
