"""The paper's experiments at this project's scale (BASS §4), as functions the thin scripts call.

Each function runs one experiment on HumanEval prompts and returns a JSON-able dict with its settings,
the machine, and every measured number; ``experiments/paper/report.py`` turns those files into
``docs/results/paper.md`` and its plots. Runs within one experiment happen in one process, one after the
other, so ratios between them are measured side by side.

Every run has a ``run_id`` (its loop values, e.g. ``greedy/B=4/bass_pad``). Each function takes
``earlier``, the runs of an interrupted result (the scripts' ``--resume``): those are kept as they are
and not measured again, and the result lists their ids under ``resumed_runs``, since they were timed
in another process than the rest. A run in progress when a process was killed is measured again whole:
a run's numbers (its latency means, its tokens/s) come from one process.
"""

from __future__ import annotations

import datetime
import pathlib
import platform
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax import loading, platforms, sharding, text
from bass_jax.evaluation import baselines as hf
from bass_jax.evaluation import batches, experiment, metrics
from bass_jax.evaluation.data import Problem
from bass_jax.loading import Model
from bass_jax.models import attention_registry
from bass_jax.sampling.generate import load_draft_spec, tree_shapes

# name -> (method, draft_len, attention strategy); "pad"/"split" resolve to the Pallas kernels on a GPU
# and to their plain-JAX counterparts elsewhere (bass_jax.models.attention_registry.find).
CONFIGS: dict[str, tuple[str, Any, str]] = {
    "regular": ("regular", None, "pad"),
    "bass_pad": ("bass", "dynamic", "pad"),
    "bass_split": ("bass", "dynamic", "split"),
    "bass_pad_l4": ("bass", 4, "pad"),
    "bass_pad_l6": ("bass", 6, "pad"),
    "bass_pad_l8": ("bass", 8, "pad"),
    # The GPU campaign's like-for-like table (docs/gpu.md): the cost-aware draft length with each
    # kernel, and a fixed l = 4 with the split kernel.
    "bass_pad_goodput": ("bass", "goodput", "pad"),
    "bass_split_goodput": ("bass", "goodput", "split"),
    "bass_split_l4": ("bass", 4, "split"),
}
# The paper's configurations: latency's default set.
PAPER_CONFIGS = ("regular", "bass_pad", "bass_split", "bass_pad_l4", "bass_pad_l6", "bass_pad_l8")
# Token-tree configurations (latency's draft_tree): every step verifies the tree, or goodput chooses
# per step among plain steps, chains and the tree shapes (docs/design.md, "Token trees").
TREE_CONFIGS: dict[str, tuple[str, Any, str]] = {
    "bass_pad_tree": ("bass", "dynamic", "pad"),
    "bass_pad_goodput_trees": ("bass", "goodput", "pad"),
}
_ALL_CONFIGS = CONFIGS | TREE_CONFIGS
SAMPLING = {"greedy": (0.0, 1.0), "t0.2": (0.2, 0.95), "t0.6": (0.6, 0.95)}


def load_pair(target: str, draft: str, draft_num_layers: int | None = None,
              scan_layers: bool | None = None) -> tuple[Model, Any]:
  """The target (with its tokenizer) and the draft side, via ``load_model`` / ``load_draft_spec``
  (a draft model, ``ngram[:…]`` or ``hybrid:<model>[:…]``). ``scan_layers`` is the target's layer
  layout (``load_model``; None: the backend profile's); a draft model follows the target's."""
  target_model = loading.load_model(target, scan_layers=scan_layers)
  return target_model, load_draft_spec(draft, target_model, num_layers=draft_num_layers)


def attention_impl(strategy: str, kernels: str = "auto") -> str:
  """The name of the attention implementation registered for ``strategy`` (``"pad"``, ``"split"``)
  on backend ``kernels`` (``"pallas"``, ``"blocked"``, or a user's backend); ``"auto"``: the Pallas
  kernels on a GPU, their plain-JAX versions elsewhere.

  Raises:
    ValueError: no implementation of that strategy on that backend (naming the registered pairs).
  """
  if kernels == "auto":
    kernels = "pallas" if platforms.is_gpu(jax.default_backend()) else "blocked"
  return attention_registry.find(strategy, kernels).name


def machine() -> dict[str, Any]:
  """Where and when: device, mesh (None: one device), host, JAX version, date, and the command line."""
  device = jax.devices()[0]
  mesh = sharding.resolve_mesh(None)
  return {"device": f"{device.platform}:{device.device_kind}",
          "mesh": None if mesh is None else dict(mesh.shape), "host": platform.processor() or
          platform.machine(), "jax_version": jax.__version__, "date": datetime.date.today().isoformat(),
          "command": " ".join(["python -m", _module_name(sys.argv[0]), *sys.argv[1:]])}


def _module_name(script: str) -> str:
  """``.../experiments/paper/latency.py`` -> ``experiments.paper.latency`` (how the scripts are run)."""
  path = pathlib.Path(script).with_suffix("")
  parts = path.parts
  if "experiments" in parts:  # the scripts' package, from its last occurrence down
    start = len(parts) - 1 - parts[::-1].index("experiments")
    return ".".join(parts[start:])
  return f"{path.parent.name}.{path.name}" if path.parent.name else path.name


def measure_peak_flops(dtype: str = "float32", size: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of a large square matrix product on the default device (the utilization denominator)."""
  a = jnp.ones((size, size), dtype) / size
  fn = jax.jit(lambda x: x @ x)
  jax.block_until_ready(fn(a))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(a))
    best = min(best, time.perf_counter() - start)
  return 2.0 * size**3 / best


def _decode(target: Model, draft: Model, problems: Sequence[Problem], *, method: str, batch: int,
            max_new_tokens: int, temperature: float, top_p: float, kernels: str,
            strategy: str = "pad", draft_len: Any = "dynamic", check: bool = False,
            distinct_prompts: bool | None = None, continuous: bool = False, draft_tree: Any = None,
            samples_per_prompt: int | None = None, sample_order: str = "grouped"):
  """One ``experiment.run_problems`` as every experiment here runs it (the draft only for BASS; distinct
  prompts per batch at temperature 0 unless ``distinct_prompts`` says otherwise; static batches get an
  untimed warm-up batch first, so a fresh program's costlier first execution is not charged to the
  first batch; ``continuous`` decodes every sequence in one continuous batch; ``draft_len`` and
  ``draft_tree`` as ``generate`` takes them, for BASS only; ``samples_per_prompt`` and
  ``sample_order`` as ``run_problems`` takes them)."""
  return experiment.run_problems(
      target, draft if method == "bass" else None, problems, batch_size=batch, method=method,
      max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, draft_len=draft_len,
      attention_impl=attention_impl(strategy, kernels), check=check, progress=True,
      distinct_prompts=distinct_prompts, warmup=True, continuous=continuous,
      draft_tree=draft_tree if method == "bass" else None, samples_per_prompt=samples_per_prompt,
      sample_order=sample_order)


Saver = Callable[[dict[str, Any]], None]


def _speculation(draft_len: Any, draft_tree: Any) -> dict[str, Any]:
  """A result header's record of BASS's draft-length policy and tree shapes (text; [] for chains)."""
  return {"draft_len": str(draft_len), "draft_tree": [str(t) for t in tree_shapes(draft_tree)]}


def _log(line: str) -> None:
  print(line, flush=True)


class _Runs:
  """An experiment's runs in order: those an earlier, interrupted process finished (``earlier``, kept
  and not measured again: ``--resume``) and this process's, each named by a ``run_id``; after every
  new run the result so far goes to ``save`` (the scripts write it to disk)."""

  def __init__(self, header: dict[str, Any], save: Saver | None, earlier: Sequence[dict[str, Any]]):
    self.header, self.save = header, save
    self.earlier = {r["run_id"]: r for r in earlier if isinstance(r, dict) and "run_id" in r}
    self.runs: list[dict[str, Any]] = []
    self.kept: list[str] = []

  def kept_run(self, run_id: str) -> dict[str, Any] | None:
    """The earlier process's run ``run_id`` (now part of this result), or None to measure it."""
    run = self.earlier.get(run_id)
    if run is not None:
      self.runs.append(run)
      self.kept.append(run_id)
    return run

  def add(self, run_id: str, run: dict[str, Any]) -> dict[str, Any]:
    run["run_id"] = run_id
    self.runs.append(run)
    if self.save is not None:
      self.save(self.result(complete=False))
    return run

  def result(self, complete: bool, **extra) -> dict[str, Any]:
    """The experiment's JSON: header, runs, and which runs an earlier process measured (they were
    not timed side by side with this process's)."""
    return {**self.header, **extra, "runs": self.runs, "resumed_runs": self.kept,
            "complete": complete}


def latency(target: Model, draft: Model, problems: Sequence[Problem], *, batch_sizes: Sequence[int],
            configs: Sequence[str], sampling: Sequence[str], max_new_tokens: int,
            kernels: str = "auto", check: bool = True, save: Saver | None = None,
            log: Callable[[str], None] = _log, earlier: Sequence[dict[str, Any]] = (),
            draft_tree: Sequence[str] = ()) -> dict[str, Any]:
  """Tables 1-3: per-token latency First/Last/All, tokens/s, acceptance, raggedness, Pass@Batch, FLOPs.

  Every (sampling, batch size, config) is one ``experiment.run_problems`` over ``problems``: greedy
  batches hold distinct prompts (identical rows would measure nothing ragged), sampled batches hold
  B samples of each prompt (the paper's setting). ``save`` receives the result so far after every run.
  The configs of :data:`TREE_CONFIGS` verify the token-tree shapes of ``draft_tree`` (text such as
  ``"top_k=4,depth=5,nodes=16"``): ``bass_pad_tree`` every step (one shape),
  ``bass_pad_goodput_trees`` where goodput chooses them.

  Raises:
    ValueError: an unknown config or sampling name; a tree config without ``draft_tree``, or
      ``bass_pad_tree`` with several shapes.
  """
  draft_tree = list(draft_tree)
  for name in configs:
    if name not in _ALL_CONFIGS:
      raise ValueError(f"unknown config {name!r}; choose from {sorted(_ALL_CONFIGS)}")
    if name in TREE_CONFIGS and not draft_tree:
      raise ValueError(f"config {name!r} verifies token trees: give their shapes (--draft_tree)")
    if name == "bass_pad_tree" and len(draft_tree) > 1:
      raise ValueError("config 'bass_pad_tree' verifies one tree shape every step; several shapes "
                       "need 'bass_pad_goodput_trees'")
  for name in sampling:
    if name not in SAMPLING:
      raise ValueError(f"unknown sampling {name!r}; choose from {sorted(SAMPLING)}")
  header = {"experiment": "latency", **machine(), "num_prompts": len(problems),
            "max_new_tokens": max_new_tokens, "target": target.name, "draft": draft.name}
  runs = _Runs(header, save, earlier)
  for sampling_name in sampling:
    temperature, top_p = SAMPLING[sampling_name]
    for batch in batch_sizes:
      for name in configs:
        run_id = f"{sampling_name}/B={batch}/{name}"
        if runs.kept_run(run_id):
          continue
        method, draft_len, strategy = _ALL_CONFIGS[name]
        summary = _decode(target, draft, problems, method=method, batch=batch,
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                          kernels=kernels, strategy=strategy, draft_len=draft_len or "dynamic",
                          check=check,
                          draft_tree=draft_tree if name in TREE_CONFIGS else None).summary
        summary.update(config=name, sampling=sampling_name)
        runs.add(run_id, summary)
        log(f"{sampling_name} B={batch} {name}: {summary['ms_per_token_all']:.1f} ms/token All, "
            f"accepted length {summary['mean_accepted_length']:.2f}")
  return runs.result(complete=True)


def utilization(target: Model, draft: Model, problems: Sequence[Problem], *,
                batch_sizes: Sequence[int], max_new_tokens: int, temperature: float = 0.2,
                top_p: float = 0.95, kernels: str = "auto", save: Saver | None = None,
                log: Callable[[str], None] = _log, earlier: Sequence[dict[str, Any]] = (),
                draft_len: Any = "dynamic", draft_tree: Any = None) -> dict[str, Any]:
  """Fig. 1: achieved FLOP/s over the device's measured peak, useful and executed, against latency.

  Regular decoding and BASS (dynamic draft length, PAD) at every batch size; BASS at batch 1 is
  single-sequence speculative decoding. ``save`` receives the result so far after every run.
  ``draft_len`` and ``draft_tree`` choose BASS's speculation as ``generate`` takes them (default:
  Algorithm 1 over chains, the paper's); they are recorded in the result's header.
  """
  peak = measure_peak_flops()
  log(f"peak: {peak / 1e9:.1f} GFLOP/s (f32 matrix product)")
  header = {"experiment": "utilization", **machine(), "peak_flops": peak,
            "num_prompts": len(problems), "max_new_tokens": max_new_tokens,
            "temperature": temperature, "top_p": top_p, "target": target.name, "draft": draft.name,
            **_speculation(draft_len, draft_tree)}
  runs = _Runs(header, save, earlier)
  for batch in batch_sizes:
    for method in ("regular", "bass"):
      run_id = f"B={batch}/{method}"
      if runs.kept_run(run_id):
        continue
      summary = _decode(target, draft, problems, method=method, batch=batch,
                        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        kernels=kernels, draft_len=draft_len, draft_tree=draft_tree).summary
      for kind in ("useful", "executed"):
        summary[f"{kind}_utilization"] = summary[f"{kind}_flops"] / summary["wall_seconds"] / peak
      runs.add(run_id, summary)
      log(f"B={batch} {method}: {summary['ms_per_token_all']:.1f} ms/token, utilization "
          f"{summary['useful_utilization']:.2%} useful, {summary['executed_utilization']:.2%} executed")
  return runs.result(complete=True)


def pass_rates_within(records: Sequence[dict[str, Any]], budget_seconds: float) -> dict[str, float]:
  """Pass@First and Pass@Finished over problems, for sequences finished within ``budget_seconds``.

  Args:
    records: ``run_problems`` records with ``passed``, grouped by ``task_id`` (B samples per problem),
      ``finish_seconds`` from the start of each sample's own decoding.

  Returns:
    ``{"pass_at_first": share of problems, "pass_at_finished": share of problems,
    "finished_share": share of the sequences (all problems' samples) complete within the budget}``.
  """
  task_ids = list(dict.fromkeys(r["task_id"] for r in records))
  first = finished = 0
  complete = metrics.finished_within(np.array([r["finish_seconds"] for r in records]), budget_seconds)
  for task_id in task_ids:
    rows = [r for r in records if r["task_id"] == task_id]
    passed = np.array([r["passed"] for r in rows])
    within = metrics.finished_within(np.array([r["finish_seconds"] for r in rows]), budget_seconds)
    first += metrics.pass_at_first(passed, np.array([r["mean_logprob"] for r in rows]), within)
    finished += metrics.pass_at_finished(passed, within)
  return {"pass_at_first": first / len(task_ids), "pass_at_finished": finished / len(task_ids),
          "finished_share": float(np.mean(complete))}


def budget(target: Model, draft: Model, problems: Sequence[Problem], *, batch_sizes: Sequence[int],
           temperatures: Sequence[float], max_new_tokens: int, budget_fraction: float,
           top_p: float = 0.95, kernels: str = "auto", continuous: bool = False,
           sample_order: str = "grouped", save: Saver | None = None,
           log: Callable[[str], None] = _log, earlier: Sequence[dict[str, Any]] = (),
           draft_len: Any = "dynamic", draft_tree: Any = None) -> dict[str, Any]:
  """Fig. 5: Pass@First and Pass@Finished within a wall-clock budget per prompt.

  Every batch holds ``B`` samples of one prompt (Pass@First ranks them), at every temperature: the
  budget is per prompt, and a prompt's B samples start together, as in the paper. With ``continuous``
  the samples of all prompts form one queue decoded ``B`` rows at a time (both methods refill), and a
  sample's time runs from its own admission; the budget then bounds each sample's latency inside a
  full batch, not a prompt's (its samples start at different times), which is why it is not the
  default. ``sample_order="interleaved"`` (with ``continuous``) queues the samples round robin over
  the prompts (``batches.make_batches``), so that a prompt's later samples start after its
  earlier ones finished, which sibling lookup drafts from.
  ``save`` receives the runs so far after every run (without the budget, which needs them all).

  Every sequence of every (method, temperature, batch size) is checked against HumanEval's tests; a
  sequence counts as finished when it was complete (EOS or ``max_new_tokens``) by the budget. The
  budget is ``budget_fraction`` times regular decoding's median time per prompt at batch 1 for the
  full ``max_new_tokens`` (measured here first), so that regular decoding cannot produce a full-length
  sequence within it, as in the paper. Pass rates are also computed on a grid of budgets for the plot.
  ``draft_len`` and ``draft_tree`` choose BASS's speculation as ``generate`` takes them (default:
  Algorithm 1 over chains, the paper's); they are recorded in the result's header.

  Raises:
    ValueError: ``sample_order="interleaved"`` without ``continuous`` (static batches hold B samples
      of one prompt here); an unknown ``sample_order`` (from ``batches.make_batches``).
  """
  if sample_order != "grouped" and not continuous:
    raise ValueError(f"sample_order={sample_order!r} orders a continuous batch's queue: pass "
                     "continuous=True (static batches hold the B samples of one prompt)")
  header = {"experiment": "budget", **machine(), "budget_fraction": budget_fraction,
            "num_prompts": len(problems), "max_new_tokens": max_new_tokens, "top_p": top_p,
            "continuous": continuous, "sample_order": sample_order, "target": target.name,
            "draft": draft.name,
            **_speculation(draft_len, draft_tree)}
  runs = _Runs(header, save, earlier)
  for temperature in temperatures:
    for batch in batch_sizes:
      for method in ("regular", "bass"):
        run_id = f"T={temperature}/B={batch}/{method}"
        if runs.kept_run(run_id):
          continue
        result = _decode(target, draft, problems, method=method, batch=batch,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                         kernels=kernels, check=True, samples_per_prompt=batch,
                         sample_order=sample_order, continuous=continuous, draft_len=draft_len,
                         draft_tree=draft_tree)
        # The budget needs every run's sequences: kept with the run, so a resumed run has them too.
        records = [{k: r[k] for k in ("task_id", "finish_seconds", "num_tokens", "passed",
                                      "mean_logprob")} for r in result.records]
        runs.add(run_id, {**result.summary, "temperature": temperature, "records": records})
        log(f"T={temperature} B={batch} {method}: pass@batch {result.summary['pass_at_batch']:.3f}")
  records_by_run = [run["records"] for run in runs.runs]
  reference = [r for r in runs.runs
               if r["method"] == "regular" and r["batch_size"] == min(batch_sizes)]
  full_length = [rec["finish_seconds"] * max_new_tokens / rec["num_tokens"]
                 for r in reference for rec in r["records"]]
  budget_seconds = budget_fraction * float(np.median(full_length))
  grid = np.linspace(0.25, 2.0, 15) * budget_seconds
  for run, recs in zip(runs.runs, records_by_run):
    run["pass_at_budget"] = pass_rates_within(recs, budget_seconds)
    curve = [pass_rates_within(recs, b) for b in grid]
    run["pass_curve"] = {"budget_seconds": [float(b) for b in grid],
                         "pass_at_first": [c["pass_at_first"] for c in curve],
                         "pass_at_finished": [c["pass_at_finished"] for c in curve]}
  return runs.result(complete=True, budget_seconds=budget_seconds)


def throughput(target: Model, draft: Any, problems: Sequence[Problem], *, batch_sizes: Sequence[int],
               temperatures: Sequence[float], max_new_tokens: int, top_p: float = 0.95,
               kernels: str = "auto", save: Saver | None = None,
               log: Callable[[str], None] = _log, earlier: Sequence[dict[str, Any]] = (),
               draft_len: Any = "dynamic", draft_tree: Any = None) -> dict[str, Any]:
  """Static batches against continuous batching, for BASS and regular decoding, side by side.

  Every prompt is decoded once (distinct prompts at every temperature: the question is the throughput
  of a set). Static: consecutive groups of B prompts, each decoded until its last row finishes while
  the finished rows idle (the paper's setting). Continuous: one queue of all prompts, B rows at a time,
  a finished row taking the next prompt inside the jitted loop (``generate(..., batch_size=B)``). For
  every (temperature, B, method) the static and the continuous run follow each other; the summaries
  carry tokens/s, per-token latency All, the wall time of the whole set (compilation excluded; for
  static batches the host's work between batches too), the mean wait before a prompt's decoding
  starts and the mean time to its first token. ``save`` receives the result so far after every run.
  ``draft_len`` and ``draft_tree`` choose BASS's speculation as ``generate`` takes them (default:
  Algorithm 1 over chains, the paper's); they are recorded in the result's header.
  """
  header = {"experiment": "throughput", **machine(), "num_prompts": len(problems),
            "max_new_tokens": max_new_tokens, "top_p": top_p, "target": target.name,
            "draft": draft.name, **_speculation(draft_len, draft_tree)}
  runs = _Runs(header, save, earlier)
  for temperature in temperatures:
    for batch in batch_sizes:
      for method in ("regular", "bass"):
        for continuous in (False, True):
          run_id = f"T={temperature}/B={batch}/{method}/{'continuous' if continuous else 'static'}"
          if runs.kept_run(run_id):
            continue
          summary = _decode(target, draft, problems, method=method, batch=batch,
                            max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p if temperature else 1.0, kernels=kernels,
                            distinct_prompts=True, continuous=continuous, draft_len=draft_len,
                            draft_tree=draft_tree).summary
          # As asked (a set no larger than B runs static anyway).
          summary["batching"] = "continuous" if continuous else "static"
          runs.add(run_id, summary)
          log(f"T={temperature} B={batch} {method} {'continuous' if continuous else 'static'}: "
              f"{summary['tokens_per_second']:.1f} tokens/s, {summary['ms_per_token_all']:.1f} "
              f"ms/token All, {summary['wall_seconds']:.1f} s")
  return runs.result(complete=True)


def baselines(target: Model, draft: Model, problems: Sequence[Problem], *, hf_target, hf_draft,
              batch_sizes: Sequence[int], max_new_tokens: int, temperature: float, top_p: float,
              kernels: str = "auto", save: Saver | None = None,
              log: Callable[[str], None] = _log, earlier: Sequence[dict[str, Any]] = ()
              ) -> dict[str, Any]:
  """Our regular decoding and BASS against transformers' batched ``generate`` and its assisted
  generation (batch 1, our draft as the assistant), same batches, tokens and sampling settings.

  Batches are ``batches.make_batches`` of the problems: distinct prompts at temperature 0, copies
  of one prompt when sampling, for every system alike. ``min_new_tokens`` is not forced, so every
  system stops at EOS; latencies are per emitted token. ``save`` receives the result so far after
  every run.
  """
  eos = target.config.eos_token_id
  eos = eos[0] if isinstance(eos, tuple) else eos
  distinct = temperature == 0
  header = {"experiment": "baselines", **machine(), "num_prompts": len(problems),
            "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
            "distinct_prompts": distinct, "target": target.name, "draft": draft.name}
  runs = _Runs(header, save, earlier)
  for batch in batch_sizes:
    for method in ("regular", "bass"):
      if runs.kept_run(f"B={batch}/bass-jax {method}"):
        continue
      summary = _decode(target, draft, problems, method=method, batch=batch,
                        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        kernels=kernels).summary
      runs.add(f"B={batch}/bass-jax {method}", {
          "system": f"bass-jax {method}", "batch_size": batch,
          "ms_per_token_last": summary["ms_per_token_last"],
          "ms_per_token_all": summary["ms_per_token_all"],
          "tokens_per_second": summary["tokens_per_second"], "tokens": summary["tokens"]})
      log(f"B={batch} bass-jax {method}: {summary['ms_per_token_all']:.1f} ms/token")
    for system, assistant in (("transformers generate", None), ("transformers assisted", hf_draft)):
      if (assistant is not None and batch != 1) or runs.kept_run(f"B={batch}/{system}"):
        continue
      walls, tokens, ms = [], 0, []
      for i, group in enumerate(batches.make_batches(problems, batch, distinct)):
        ids = text.encode_prompts(target.tokenizer, [p.prompt for p in group])
        hf.hf_generate(hf_target, ids, max_new_tokens=4, temperature=temperature, top_p=top_p,
                       seed=i, eos_token_id=eos, assistant=assistant)  # warm-up
        run = hf.hf_generate(hf_target, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, seed=i, eos_token_id=eos, assistant=assistant)
        walls.append(run.wall_seconds)
        tokens += int(run.tokens.sum())
        ms.append(run.ms_per_token)
      runs.add(f"B={batch}/{system}", {
          "system": system, "batch_size": batch, "ms_per_token_last": float(np.mean(ms)),
          "ms_per_token_all": float(np.mean(ms)), "tokens_per_second": tokens / sum(walls),
          "tokens": tokens})
      log(f"B={batch} {system}: {np.mean(ms):.1f} ms/token")
  return runs.result(complete=True)
