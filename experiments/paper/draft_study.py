r"""The draft-side study: every proposer and draft-length policy against regular decoding, in one run.

    python -m experiments.paper.draft_study --results_dir=results --output=docs/results/draft_study.md

For each proposer (``--proposers``: draft specs as ``bass_jax.load_draft_spec`` reads them, e.g. a draft
model, ``ngram``, ``hybrid:<model>``) it writes to ``--output``:

* parameters, and the draft cost per proposed token against one target forward at the same batch size
  (both jitted single-position forwards over a half-full cache, median of 5; a lookup's cost is its
  on-device lookup per step over the whole token buffer, a hybrid's is the model's and its lookups'),
  and each lookup's own cost;
* for each draft-length policy (``--draft_lens``: ``dynamic`` is BASS Algorithm 1, an int a fixed length,
  ``goodput`` the cost-aware policy, which with ``--draft_tree`` also chooses among token-tree
  shapes), each temperature and each ``--samples_per_prompt`` (a sampled temperature gets a section
  per s): token acceptance rate, mean accepted length (bonus/correction token counted), per-position
  acceptance alpha_k, the mean draft length, the share of plain (0-draft) steps, and where the drafts
  came from (model, n-gram or sibling lookup);
* per-token latency All (ms/token, BASS §4.1) at each batch size against regular decoding.

Each run decodes its first batch once, untimed, before the measured ones (``run_problems(warmup=True)``):
a fresh program's first execution costs more than later ones on this CPU. With
``--samples_per_prompt=1`` (the default) every batch holds distinct prompts, at every temperature, so
each column decodes the same sequences and rows differ (a batch of copies of one prompt is not ragged
at T = 0); an s > 1 section decodes s samples of each prompt in a row, cut into batches (sampled
temperatures only). Regular decoding is timed before and after each
cell's BASS runs, and the speed-ups are taken against the faster of the two (conservative: the first run
of a process stays slower for a while, even after its warm-up batch). Each (temperature, batch size)
cell runs in a fresh child process: one process that compiles dozens of decode programs runs out of
memory maps in XLA:CPU's JIT (``vm.max_map_count``). ``--resume`` keeps finished cells.

The prompts default to the tuning set (``stdlib-heldout``), never HumanEval, because this study picks
``make run``'s configuration; ``--prompts=humaneval`` evaluates. Text after a ``## Reading`` heading in an
existing ``--output`` is kept, so a hand-written reading survives a rerun.
"""

import datetime
import json
import platform
import subprocess
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

import bass_jax
from bass_jax import text
from bass_jax.evaluation import batches, experiment, metrics
from bass_jax.evaluation.data import load_problems
from bass_jax.sampling import costs
from bass_jax.sampling import generate as generate_lib
from bass_jax.sampling.draft_len import GoodputDraftLen, as_policy
from bass_jax.sampling.step_costs import StepCosts, break_even_acceptance
from bass_jax.sampling.proposers import DRAFT_SOURCES
from experiments import _decode_flags
from experiments import _io

_PROPOSERS = flags.DEFINE_list(
    "proposers", ["smollm2-135m-draft", "ngram", "hybrid:smollm2-135m-draft"],
    "Draft specs (bass_jax.load_draft_spec; the grammar: --draft=help of experiments.generate), "
    "comma-separated, so without settings: model specs, ngram, siblings, hybrid:<model>.")
_NAMES = flags.DEFINE_list("names", [], "Display names of the proposers (default: the specs).")
_DRAFT_LENS = flags.DEFINE_list("draft_lens", ["dynamic", "4", "goodput"],
                                "Draft-length policies: dynamic, goodput, or a fixed int >= 1.")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout",
                               "Prompt set (bass_jax.evaluation.data.load_problems): the tuning set by default.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts (>= the largest batch).",
                                    lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=64)["max_new_tokens"]
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "2", "4", "8"], "Batch sizes.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "0.2"], "Sampling temperatures (0 = greedy).")
_TOP_P = _decode_flags.define(top_p=0.95)["top_p"]  # when sampling (BASS §4: 0.95)
_SAMPLES = flags.DEFINE_list(
    "samples_per_prompt", ["1"], "Samples of each prompt: 1 means every batch holds distinct "
    "prompts; s > 1 decodes each prompt s times in a row, cut into batches (a section of its own per "
    "sampled temperature; at T = 0 the samples would be identical rows, so only s = 1 runs there).")
_CONTINUOUS = flags.DEFINE_bool(
    "continuous", False, "Continuous batching: each run decodes its sequences as one queue, B rows at "
    "a time, a finished row taking the next sequence (run_problems(continuous=True)); latency All "
    "then runs from each sequence's admission. Default: static batches.")
_SAMPLE_ORDER = flags.DEFINE_enum(
    "sample_order", "grouped", batches.SAMPLE_ORDERS, "Order of the samples of each prompt "
    "(batches.make_batches): grouped (a prompt's samples in a row) or interleaved (round robin over "
    "the prompts; with --continuous a prompt's later samples start after its earlier ones finished).")
_DRAFT_TREE = flags.DEFINE_multi_string(
    "draft_tree", [], "Token-tree shapes (e.g. top_k=4,depth=5,nodes=16; repeat for several): the "
    "goodput runs then choose per step among plain steps, chains and these shapes; other policies "
    "stay chains.")
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir", None, "Directory for draft_study.json (default: a fresh outputs/draft_study-<time>/; "
    "--results_dir=results replaces the committed numbers).")
_OUTPUT = flags.DEFINE_string("output", None, "Markdown file to write (default: <results_dir>/"
                              "draft_study.md; docs/results/draft_study.md is the committed one).")
_io.require_tree_shapes()


def _is_temperature(value: str) -> bool:
  try:
    return float(value) >= 0
  except ValueError:
    return False


_io.require_positive_ints("batch_sizes")
_io.require_positive_ints("samples_per_prompt")
flags.register_validator("temperatures", lambda v: bool(v) and all(map(_is_temperature, v)),
                         message="--temperatures must be a comma-separated list of numbers >= 0")

_RESUME = flags.DEFINE_bool(
    "resume", False, "Keep the (temperature, batch size) cells already in <results_dir>/draft_study.json "
    "(written with the same settings, --samples_per_prompt included: a study cannot gain sections by "
    "resuming) and run only the missing ones.")
_CELL = flags.DEFINE_string("cell", None, "Internal: run one cell 'T,B,samples' in this process.")
_CELL_OUTPUT = flags.DEFINE_string("cell_output", None, "Internal: where --cell writes its JSON.")

_READING = "## Reading"


def _lookup_seconds(ngram, batch: int, width: int) -> float:
  """Median seconds of the jitted n-gram lookup over ``i32[batch, width]`` random tokens, half full."""
  lookup = jax.jit(ngram.lookup)
  tokens = jax.random.randint(jax.random.key(0), (batch, width), 0, 64, jnp.int32)
  seq_len = jnp.full((batch,), width // 2, jnp.int32)
  return costs.median_seconds(lambda: lookup(tokens, seq_len))


def _sibling_seconds(siblings, batch: int, width: int) -> float:
  """Median seconds of the jitted sibling lookup (a whole proposal of 8 drafts) over ``i32[batch,
  width]`` random tokens, half full, every row a sample of one prompt (the most siblings)."""
  from bass_jax.sampling.proposers import StepContext  # pylint: disable=g-import-not-at-top

  tokens = jax.random.randint(jax.random.key(0), (batch, width), 0, 64, jnp.int32)
  ctx = StepContext(tokens=tokens, seq_len=jnp.full((batch,), width // 2, jnp.int32),
                    live=jnp.ones((batch,), bool), draft_len=jnp.int32(8), key=None,
                    temperature=jnp.float32(1), top_p=jnp.float32(1),
                    group=jnp.zeros((batch,), jnp.int32))
  propose = jax.jit(lambda c: siblings.propose(None, None, c, max_len=8, chunk=1, greedy=False)[1])
  return costs.median_seconds(lambda: propose(ctx))


def _proposal_cost(draft, target, batch: int, cache_len: int) -> dict[str, float]:
  """Seconds of one target forward and of proposing one token (a draft model's further-draft forward,
  ``Proposer.forward_costs``, plus an n-gram lookup and a sibling lookup, each per step), at ``batch``
  rows; the lookups' own seconds too."""
  proposer, params, _ = generate_lib.resolve_draft(draft, target, "reference")
  _, seconds = proposer.forward_costs(params, batch, cache_len, 4)
  lookups = {}
  ngram = draft if isinstance(draft, bass_jax.NGramProposer) else getattr(draft, "ngram", None)
  if ngram is not None:
    lookups["ngram_lookup_s"] = _lookup_seconds(ngram, batch, cache_len)
  siblings = draft if isinstance(draft, bass_jax.SiblingProposer) else getattr(draft, "siblings", None)
  if siblings is not None:
    lookups["sibling_lookup_s"] = _sibling_seconds(siblings, batch, cache_len)
  seconds += sum(lookups.values())
  target_forward = costs.time_forward(target.config, jnp.dtype(target.dtype).name, "reference",
                                      target.params, batch, positions=1, cache_len=cache_len)
  return {"target_forward_s": target_forward, "propose_token_s": seconds, **lookups}


def _problems_and_target():
  target = bass_jax.load_model(_TARGET.value)
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  return target, problems


def _proposer_table(names, batches) -> dict:
  """Parameters and measured cost per proposed token of every proposer, at each batch size."""
  target, problems = _problems_and_target()
  longest = max(len(p) for p in text.encode_prompts(target.tokenizer, [q.prompt for q in problems]))
  cache_len = -(-(longest + _MAX_NEW.value) // 128) * 128
  table = {}
  for name, spec in zip(names, _PROPOSERS.value):
    draft = bass_jax.load_draft_spec(spec, target)
    model = draft if isinstance(draft, bass_jax.Model) else getattr(draft, "model", None)
    table[name] = {"spec": spec, "params": model.config.num_params() if model is not None else 0,
                   "cache_len": cache_len,
                   "cost": {str(b): _proposal_cost(draft, target, b, cache_len) for b in batches}}
    print(name, table[name], flush=True)
  return table


def _run_cell(names, policies, temperature: float, batch: int, samples: int) -> dict:
  """Regular decoding, every proposer under every policy, regular decoding again: one cell (``samples``
  of each prompt, ``run_problems``' ``samples_per_prompt``)."""
  target, problems = _problems_and_target()
  drafts = [bass_jax.load_draft_spec(spec, target) for spec in _PROPOSERS.value]

  def run(draft, **kw):
    return experiment.run_problems(
        target, draft, problems, batch_size=batch, max_new_tokens=_MAX_NEW.value,
        temperature=temperature, top_p=_TOP_P.value if temperature > 0 else 1.0,
        samples_per_prompt=samples, sample_order=_SAMPLE_ORDER.value, continuous=_CONTINUOUS.value,
        warmup=True, **kw).summary

  cell = {"regular": [run(None, method="regular")["ms_per_token_all"]], "bass": {}}
  for name, draft in zip(names, drafts):
    for pol in policies:
      trees = _DRAFT_TREE.value if pol == "goodput" and _DRAFT_TREE.value else None
      s = run(draft, method="bass", draft_len=pol, draft_tree=trees)
      cell["bass"][f"{name}|{pol}"] = {k: s[k] for k in (
          "ms_per_token_all", "ms_per_token_first", "ms_per_token_last", "tokens_per_second",
          "draft_acceptance_rate", "mean_accepted_length", "position_acceptance", "acceptance",
          "mean_draft_len", "plain_step_share", "step_costs", "steps", "compile_seconds",
          "draft_tree", "tree_step_share", "mean_tree_nodes", "draft_source_share",
          "accepted_source_share")}
      print(f"T={temperature:g} B={batch} s={samples} {name} {pol}: {s['ms_per_token_all']:.1f} "
            f"ms/token, accepted length {s['mean_accepted_length']:.2f}, plain steps "
            f"{s['plain_step_share']:.0%}", flush=True)
  cell["regular"].append(run(None, method="regular")["ms_per_token_all"])
  print(f"T={temperature:g} B={batch} regular before / after: {cell['regular']}", flush=True)
  return cell


def _sources(summaries) -> str:
  """Each draft source's share of the drafted tokens, pooled over runs (weighted by their drafts);
  ``-`` for runs made before the summaries recorded sources."""
  shares = [s.get("draft_source_share") for s in summaries]
  if not all(shares):
    return "-"
  weights = [s["acceptance"]["drafted"] for s in summaries]
  total = sum(weights)
  return "/".join(f"{sum(w * sh[k] for w, sh in zip(weights, shares)) / total:.0%}"
                  for k in DRAFT_SOURCES)


def _batching(settings) -> str:
  """How the study's runs batched their sequences, as text after the sentence on distinct prompts."""
  order = ""
  if "samples_per_prompt" in settings:
    order = (" (interleaved: round robin over the prompts)"
             if settings.get("sample_order") == "interleaved" else
             " (grouped: a prompt's samples in a row)")
  if settings.get("continuous"):
    return (order + "; continuous batching: each run is one queue decoded B rows at a time, a "
            "sequence's latency running from its admission")
  return order + "; static batches"


def _sections() -> list[tuple[str, str, int]]:
  """``(key, temperature as given, samples per prompt)`` of each section of the study, in order: per
  temperature, distinct prompts (key: the temperature), then each ``--samples_per_prompt`` s > 1
  when it samples (key ``<T>x<s>``)."""
  out = []
  for t in _TEMPERATURES.value:
    for s in map(int, _SAMPLES.value):
      if s == 1 or float(t) > 0:
        out.append((t if s == 1 else f"{t}x{s}", t, s))
  return out


def _cell(ms: float, regular: float, best: bool) -> str:
  value = f"{ms:.1f} ({regular / ms:.2f}x)"
  return f"**{value}**" if best else value


def _cost_table(raw, names, batches, sections) -> list[str]:
  """What each goodput run measured (``run_problems``' ``step_costs``): a verification pass over a
  plain step, and the break-even acceptance (``step_costs.break_even_acceptance``); nothing when no
  goodput run recorded its costs."""
  header = ["", "## What the cost-aware policy measured", "",
           "Per goodput run: one verification pass (C positions) over one plain step, and the break-even "
           "acceptance rate above which some draft length beats a plain step (`-`: a cell measured "
           "before runs recorded their step costs).", "",
           "| T | proposer | " + " | ".join(f"B={b}" for b in batches) + " |",
           "|---|---|" + "---|" * len(batches)]
  rows = []
  max_len = GoodputDraftLen().max_len
  for key, t, samples in sections:
    for name in names:
      cells = []
      for b in batches:
        run = raw["runs"][key][str(b)]["bass"].get(f"{name}|goodput") or {}
        if not run.get("step_costs"):
          cells.append("-")
          continue
        c = StepCosts(**run["step_costs"])
        alpha, _ = break_even_acceptance(c, max_len)
        cells.append(f"{c.verify_pass / c.plain:.2f}x, alpha* {alpha:.2f}")
      if any(cell != "-" for cell in cells):
        label = t if samples == 1 else f"{t}, {samples} samples"
        rows.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
  return header + rows if rows else []


def _render(raw, names, policies, batches, sections) -> str:
  device = jax.devices()[0]
  settings = raw["settings"]
  commands = raw["commands"]
  lines = [
      "# Draft-side study: proposers and draft-length policies",
      "",
      f"Written by `{commands[-1]}` on {datetime.date.today().isoformat()}, {device.platform} "
      f"({platform.processor() or platform.machine()}, {jax.local_device_count()} device, JAX "
      f"{jax.__version__})" + (
          "; the cells came from these invocations, in order (each cell is measured whole in one "
          "process): " + "; ".join(f"`{c}`" for c in commands) if len(commands) > 1 else "") +
      ". The numbers are in `draft_study.json` beside the run." + "".join(
          f" {note}" for note in raw.get("notes", [])),
      "",
      f"Target {settings['target']}; first {settings['num_prompts']} prompts of "
      f"`{settings['prompts']}`, {settings['max_new_tokens']} new tokens each; every batch holds "
      f"distinct prompts unless its section decodes several samples of each prompt{_batching(settings)}"
      ". Sampling: top-p "
      f"{settings['top_p']} at T > 0. Latency is per-token latency "
      "All (ms/token, mean over the sequences, compilation and a warm-up batch excluded, BASS §4.1); in "
      "parentheses the speed-up over regular decoding, timed just before and just after each cell's "
      "BASS runs, against the faster of the two (both are in the last row; the first is usually the "
      "slower, so this is the conservative reference). Bold: the fastest BASS configuration per "
      "column.",
      "",
      "## Proposers",
      "",
      "Draft cost per proposed token, as a fraction of one target forward at the same batch size (both one "
      "jitted position per row over a half-full cache, median of 5).",
      "",
      "| proposer | parameters | " + " | ".join(f"cost/token B={b}" for b in batches) + " |",
      "|---|---|" + "---|" * len(batches),
  ]
  for name in names:
    p = raw["proposers"][name]
    lines.append(f"| {name} | {p['params'] / 1e6:.1f} M | " + " | ".join(
        f"{p['cost'][str(b)]['propose_token_s'] / p['cost'][str(b)]['target_forward_s']:.3f}"
        for b in batches) + " |")
  lookups = [(name, kind) for name in names for kind in ("ngram_lookup_s", "sibling_lookup_s")
             if kind in raw["proposers"][name]["cost"][str(batches[0])]]
  if lookups:
    lines += ["", "Of that, each lookup's cost per step (n-gram: over the row's own text; siblings: "
              "every row a sample of one prompt, the most siblings), as a fraction of one target "
              "forward:", "",
              "| proposer | lookup | " + " | ".join(f"B={b}" for b in batches) + " |",
              "|---|---|" + "---|" * len(batches)]
    for name, kind in lookups:
      cost = raw["proposers"][name]["cost"]
      lines.append(f"| {name} | {kind.split('_')[0]} | " + " | ".join(
          f"{cost[str(b)][kind] / cost[str(b)]['target_forward_s']:.3f}" for b in batches) + " |")
  for key, t, samples in sections:
    runs = raw["runs"][key]
    heading = f"## T = {t}" + (" (greedy)" if float(t) == 0 else "") + (
        f", {samples} samples of each prompt" if samples > 1 else "")
    lines += ["", heading, "",
              "Per-token latency All, ms/token (speed-up over regular decoding):", "",
              "| proposer | draft length | " + " | ".join(f"B={b}" for b in batches) + " |",
              "|---|---|" + "---|" * len(batches)]
    # The faster of the two regular timings: a conservative reference, because the first run of a
    # process stays slower for a while even after its warm-up batch (the "before" column).
    regular = {b: min(runs[str(b)]["regular"]) for b in batches}
    best = {b: min(runs[str(b)]["bass"].values(), key=lambda s: s["ms_per_token_all"])
            ["ms_per_token_all"] for b in batches}
    for name in names:
      for pol in policies:
        cells = []
        for b in batches:
          ms = runs[str(b)]["bass"][f"{name}|{pol}"]["ms_per_token_all"]
          cells.append(_cell(ms, regular[b], ms == best[b]))
        lines.append(f"| {name} | {pol} | " + " | ".join(cells) + " |")
    lines.append("| regular decoding (before / after) | - | " + " | ".join(
        " / ".join(f"{v:.1f}" for v in runs[str(b)]["regular"]) for b in batches) + " |")
    lines += ["", "Acceptance, pooled over the batch sizes; mean draft length and plain (0-draft) steps "
              "per batch size:", "",
              "| proposer | draft length | acceptance rate | mean accepted length | alpha_1..alpha_k | "
              "mean l_draft " + "/".join(f"B={b}" for b in batches) + " | plain steps " +
              "/".join(f"B={b}" for b in batches) + " | drafts from model/n-gram/siblings |",
              "|---|---|---|---|---|---|---|---|"]
    for name in names:
      for pol in policies:
        summaries = [runs[str(b)]["bass"][f"{name}|{pol}"] for b in batches]
        pooled = metrics.Acceptance.pooled([metrics.Acceptance(**s["acceptance"]) for s in summaries])
        alphas = " ".join(f"{a:.2f}" for a, o in zip(pooled.position_acceptance,
                                                       pooled.position_offered) if o >= 20)
        lines.append(
            f"| {name} | {pol} | {pooled.draft_acceptance_rate:.3f} | "
            f"{pooled.mean_accepted_length:.2f} | {alphas or '-'} | "
            + "/".join(f"{s['mean_draft_len']:.1f}" for s in summaries) + " | "
            + "/".join(f"{s['plain_step_share']:.0%}" for s in summaries) + " | "
            + _sources(summaries) + " |")
  lines += ["", "alpha_k: of the steps where a row's draft k was tested (drafts 1..k-1 accepted), the "
            "share that accepted it; positions tested fewer than 20 times are left out. Drafts from: "
            "each source's share of the drafted tokens (a hybrid's per row and step: sibling lookup, "
            "else n-gram lookup, else the model), pooled over the batch sizes."]
  lines += _cost_table(raw, names, batches, sections)
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  _io.init_script()
  batches = [int(b) for b in _BATCHES.value]
  sections = _sections()
  if not sections:
    raise app.UsageError("--samples_per_prompt > 1 runs at sampled temperatures only (greedy samples "
                         "of one prompt are identical rows): add 1 or a temperature > 0")
  policies = [_io.draft_len_value(v) for v in _DRAFT_LENS.value]
  names = _NAMES.value or _PROPOSERS.value
  if len(names) != len(_PROPOSERS.value):
    raise app.UsageError(f"--names has {len(names)} entries for {len(_PROPOSERS.value)} --proposers")
  try:
    for pol in policies:
      as_policy(pol)
  except ValueError as e:
    raise app.UsageError(f"--draft_lens: {e}") from e
  if any(s == 1 for _, _, s in sections) and _NUM_PROMPTS.value < max(batches):
    raise app.UsageError(f"every batch holds distinct prompts: --num_prompts={_NUM_PROMPTS.value} is "
                         f"fewer than the largest batch size {max(batches)}")
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "draft_study")
    json_path = _io.check_output_file(run_dir / "draft_study.json", flag="results_dir")
    output = _io.check_output_file(_OUTPUT.value or run_dir / "draft_study.md", flag="output")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e

  settings = {"target": _TARGET.value, "prompts": _PROMPTS.value, "num_prompts": _NUM_PROMPTS.value,
              "max_new_tokens": _MAX_NEW.value, "top_p": _TOP_P.value,
              "proposers": dict(zip(names, _PROPOSERS.value)), "draft_lens": _DRAFT_LENS.value}
  if _SAMPLES.value != ["1"]:  # absent from studies made before the flag
    settings["samples_per_prompt"] = _SAMPLES.value
  if _CONTINUOUS.value:  # absent from studies made before the flags, or with their defaults
    settings["continuous"] = True
  if _SAMPLE_ORDER.value != "grouped":
    settings["sample_order"] = _SAMPLE_ORDER.value
  if _CELL.value:  # a child: one (temperature, batch size) cell, written to --cell_output
    t, b, s = _CELL.value.split(",")
    _io.write_json_atomic(_CELL_OUTPUT.value, _run_cell(names, policies, float(t), int(b), int(s)))
    return
  raw = {"settings": settings, "proposers": {}, "runs": {}, "commands": [], "complete": False}
  if _RESUME.value and json_path.exists():
    raw = json.loads(json_path.read_text())
    if raw.get("settings") != settings:
      raise app.UsageError(f"--resume: {json_path} was written with other settings "
                           f"({raw.get('settings')}); drop --resume or pass the same flags")
  command = "python -m experiments.paper.draft_study " + " ".join(sys.argv[1:])
  if command not in raw["commands"]:
    raw["commands"].append(command)
  if set(raw["proposers"]) != set(names):
    raw["proposers"] = _proposer_table(names, batches)
    _io.write_json_atomic(json_path, raw)
  for key, t, samples in sections:
    for b in batches:
      if str(b) in raw["runs"].get(key, {}):
        print(f"T={t} B={b} s={samples}: already in {json_path}, kept", flush=True)
        continue
      # Each cell runs in a fresh process: a long process that compiles dozens of decode programs
      # exhausts the kernel's memory-map limit in XLA:CPU's JIT (vm.max_map_count).
      cell_path = run_dir / f"draft_study_cell_{key}_{b}.json"
      subprocess.run([sys.executable, "-m", "experiments.paper.draft_study", *sys.argv[1:],
                      f"--cell={t},{b},{samples}", f"--cell_output={cell_path}"],
                     check=True)
      raw["runs"].setdefault(key, {})[str(b)] = json.loads(cell_path.read_text())
      cell_path.unlink()
      _io.write_json_atomic(json_path, raw)

  raw["complete"] = True
  body = _render(raw, names, policies, batches, sections)
  reading = ""
  if output.exists() and _READING in output.read_text():
    reading = output.read_text()[output.read_text().index(_READING):]
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(body + ("\n" + reading if reading else ""))
  _io.write_json_atomic(json_path, raw)
  print(body)
  print(f"wrote {output} and {json_path}")


if __name__ == "__main__":
  _io.run(main)
