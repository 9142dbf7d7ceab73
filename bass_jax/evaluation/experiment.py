"""Decode a prompt set batch by batch and summarize it with the paper's metrics (BASS §4.1).

The experiment scripts in ``experiments/`` parse flags and call :func:`run_problems`; everything they
report is computed here, so the scripts stay thin and the numbers have one definition.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from bass_jax import _checks, text
from bass_jax.evaluation import batches, humaneval, metrics
from bass_jax.evaluation.data import Problem
from bass_jax.loading import Model
from bass_jax.sampling import compile_cache, programs
from bass_jax.sampling import config as config_lib
from bass_jax.sampling import plan as plan_lib
from bass_jax.sampling import runner
from bass_jax.sampling.config import DecodeConfig
from bass_jax.sampling.tree import tree_shapes
from bass_jax.sampling.proposers import DRAFT_SOURCES

# Order of the summary table: the paper's latency metrics first.
SUMMARY_KEYS = (
    "method", "batch_size", "continuous", "num_prompts", "distinct_prompts", "max_new_tokens",
    "temperature",
    "top_p", "acceptance_rule", "draft_len", "draft_tree", "ms_per_token_first", "ms_per_token_last",
    "ms_per_token_all",
    "tokens_per_second", "mean_accepted_length", "draft_acceptance_rate", "length_spread",
    "accepted_spread", "steps", "speculative_steps", "tree_step_share", "mean_tree_nodes",
    "wall_seconds", "compile_seconds",
)


@dataclasses.dataclass(frozen=True)
class RunResult:
  """Records (one per sequence) and the summary of a run."""

  records: list[dict[str, Any]]
  summary: dict[str, Any]


def run_problems(
    target: Model,
    draft: Any,
    problems: Sequence[Problem],
    config: DecodeConfig | None = None,
    *,
    distinct_prompts: bool | None = None,
    samples_per_prompt: int | None = None,
    sample_order: str = "grouped",
    check: bool = False,
    progress: bool = True,
    warmup: bool = False,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    continuous: bool = False,
    done: Mapping[tuple[str, int], dict[str, Any]] | None = None,
    **settings: Any,
) -> RunResult:
  """Decodes the problems batch by batch (``batches.make_batches``), or with continuous batching, and
  summarizes with the paper's metrics.

  Latency per sequence is measured as in the paper (BASS §4.1; docs/bass.md, "Metrics"): a sequence's
  per-token latency is the wall time from the start of its decoding (its batch's prefill; with
  continuous batching, its admission into a row) until the decode loop returned with that sequence
  complete, divided by its number of tokens. ``generate`` returns to the host whenever a sequence
  finishes, so each completion is timed without a per-step round trip. First / Last / All are that
  latency for the first sequence to finish, the last one, and the mean over the batch; the summary
  averages each over the batches (continuous batching has no batches: All is the mean over every
  sequence, First and Last are None). Compilation is timed apart and excluded. ``tokens_per_second``
  is all emitted tokens over the summed batch wall time (continuous: the one call's wall time).

  Resuming (``done``): the sequences whose records are given are not decoded again. A static batch
  with every record given is skipped; a batch with some is decoded again whole, with its own seed and
  rows, and only its missing records are emitted, so they equal an uninterrupted run's at any
  temperature. A continuous run decodes the missing sequences as one queue: greedy records, and
  sampled ones with ``acceptance="gumbel"``, equal an uninterrupted run's; sampled ones with rejection
  sampling are exact samples but other draws, since a row's draws depend on the rows beside it
  (docs/design.md, "Interrupted runs"). Every sequence's ``generate`` sequence id is its index in the
  plan, wherever it is decoded. The summary's decode metrics cover what
  this call decoded (``decoded_records``; ``resumed_records`` came from ``done``).

  Args:
    target: the target, with its tokenizer. draft: the draft side as ``generate`` takes it (a
      ``Model`` sharing the tokenizer, an ``NGramProposer``, a ``Hybrid``).
    problems: prompts.
    config: the decode's settings (:class:`DecodeConfig`, default its defaults), with ``settings``
      (its field names as keywords, as ``generate`` takes them) over it. ``batch_size`` is required:
      rows per batch, >= 1. ``seed``: batch i uses ``seed + i`` (a continuous run: ``seed``).
      ``max_prompt_len``: at least the run's longest prompt (the programs' prompt capacity, so that
      the run compiles once per batch size). The rest go to every ``generate`` call as given (None:
      the backend profile's; the summary records what ran).
    distinct_prompts: each batch holds ``batch_size`` different prompts, one sequence each; else
      ``batch_size`` sequences of one prompt. None (default) means distinct at temperature 0, where
      copies of one prompt would be identical rows (nothing ragged, First = Last), and samples per
      prompt otherwise (the paper's setting).
    samples_per_prompt: s sequences of every prompt, consecutive, cut into batches of ``batch_size``
      (``batches.make_batches``); overrides ``distinct_prompts``, which must then be None.
    sample_order: ``"grouped"`` or ``"interleaved"`` (round robin over the prompts), the order of
      those samples in the batches and in a continuous batch's queue (``batches.make_batches``).
    check: run HumanEval's unit tests on every completion (``bass_jax.evaluation.humaneval``, outside this
      process, once per batch): records get ``passed``, the summary ``pass_at_batch`` (share of
      problems where some sequence passes, over this call's records).
    progress: show a progress bar (tqdm, on stderr) over the sequences, updated as each finishes:
      finished of the total, tokens/s so far and tokens per step per row.
    warmup: decode the first batch to decode once, untimed and discarded, before the measured batches.
      A program's first execution costs more than the next ones, beyond its compilation (seen on this
      CPU at every batch size): without a warm-up that one-time cost lands on the first batch, which at
      B = 8 with 8 prompts is the whole run.
    on_record: called with each record as soon as its sequence is complete (``generate``'s
      ``on_finish``; with ``check``, after its batch's tests), so that a script appending them to a
      file loses only the sequences in flight when killed. Its time is not the decode's.
    continuous: decode every sequence of every batch in one ``generate`` call with
      ``batch_size=batch_size``: a row that finishes takes the next waiting sequence (continuous
      batching), in the order of the batches (with no more sequences than ``batch_size`` this is one
      static batch, and the summary says ``continuous: False``). ``warmup`` is ignored (a warm-up
      would need the whole run's shapes; the first execution's extra cost is paid once, inside the
      measured run).
    done: records of sequences already decoded, keyed by ``batches.record_key`` (resuming, above).

  Returns:
    :class:`RunResult`: the records this call decoded, in plan order (``task_id, sample_index,
    batch_index, row, batch_size, prompt_tokens, completion, num_tokens, accepted_drafts, drafted,
    steps, mean_logprob, finished, finish_seconds`` (from the start of the sequence's decoding),
    ``wait_seconds`` (from the run's start until its decoding started: the summed wall time of earlier
    batches, or its wait in the queue), ``ttft_seconds`` (from the run's start until its first token,
    the wait included), and ``passed`` with ``check``; ``batch_index`` is None with ``continuous``) and
    the summary (keys :data:`SUMMARY_KEYS`; the raggedness means ``length_spread``, ``emitted_spread``,
    ``accepted_spread`` (``metrics.raggedness``); BASS's ``position_acceptance`` and ``acceptance``
    (``metrics.Acceptance``'s counts, which pool across runs), the cost-aware policy's ``step_costs``
    (``step_costs.StepCosts``, seconds), ``mean_draft_len``, ``speculative_steps`` (steps that drafted)
    and ``plain_step_share`` (steps whose draft length was 0, e.g. chosen by the cost-aware policy);
    with token trees ``tree_step_share`` (speculative steps that verified a tree) and
    ``mean_tree_nodes`` (real nodes per live row in a tree step, root included);
    ``draft_source_share`` and ``accepted_source_share`` (per draft source, ``model``, ``ngram`` or
    ``siblings``: its share of the drafted and of the accepted tokens; a hybrid tree's nodes all count
    for its lookup where one matched);
    analytic ``useful_flops`` / ``executed_flops`` (``metrics.decode_flops``); ``decoded_records``,
    ``resumed_records``; the models, attention implementation, device and JAX version).

  Raises:
    TypeError: a keyword that is neither a parameter nor a :class:`DecodeConfig` field.
    ValueError: no ``batch_size`` or ``batch_size < 1``, no problems, too few problems for distinct
      batches, no tokenizer, ``done`` holding a sequence this run does not plan; and whatever
      ``generate`` rejects.
  """
  config = config_lib.with_settings(config, settings)
  if config.batch_size is None:
    raise ValueError("run_problems needs batch_size (rows per batch); pass batch_size=B")
  method, batch_size, temperature = config.method, config.batch_size, config.temperature
  if samples_per_prompt is not None and distinct_prompts is not None:
    raise ValueError("give distinct_prompts or samples_per_prompt, not both (samples_per_prompt=1 is "
                     "distinct prompts)")
  if distinct_prompts is None:
    distinct_prompts = temperature == 0 if samples_per_prompt is None else samples_per_prompt == 1
  plan = batches.sequence_plan(problems, batch_size,
                               _checks.as_bool("distinct_prompts", distinct_prompts),
                               samples_per_prompt, sample_order)
  num_batches = len(plan)
  continuous = _checks.as_bool("continuous", continuous)
  seed = config_lib.check_seed(config.seed, 1 if continuous else num_batches)  # batch i: seed + i
  if continuous:
    plan = [[row for batch in plan for row in batch]]  # one queue, batch_size rows at a time
  done = dict(done or {})
  batches.check_done(plan, done)
  tokenizer = target.tokenizer
  if tokenizer is None:
    raise ValueError(f"target {target.name!r} has no tokenizer; load one that ships it")

  records: list[dict[str, Any]] = []
  latencies: list[metrics.Latency] = []
  ragged: list[metrics.Raggedness] = []
  accept_parts: list[metrics.Acceptance] = []
  steps = tokens = draft_len_sum = verified_sum = plain_steps = tree_steps = 0
  tree_nodes: list[np.ndarray] = []  # real nodes per live row in each tree step
  by_source = np.zeros((2, len(DRAFT_SOURCES)), np.int64)  # drafted and accepted tokens per source
  wall = compile_seconds = calibration_seconds = useful_flops = executed_flops = 0.0
  step_costs, was_continuous = None, False
  import tqdm  # pylint: disable=g-import-not-at-top  (the [experiments] extra)

  # A sequence's id (its draws under acceptance="gumbel") is its place in the plan, wherever it decodes.
  sequence_id = {(p.task_id, k): n for n, (p, k) in enumerate(row for batch in plan for row in batch)}

  # Every prompt tokenized once; the longest of the run is the programs' prompt capacity, so that the
  # run compiles once per batch size, not once per prompt-length bucket (DecodeConfig.max_prompt_len).
  unique = list({p.task_id: p for batch in plan for p, _ in batch}.values())
  token_ids = dict(zip((p.task_id for p in unique),
                       text.encode_prompts(tokenizer, [p.prompt for p in unique])))
  capacity = max(len(ids) for ids in token_ids.values())

  capacity = max(capacity, config.max_prompt_len or 0)

  def decode(rows, prompt_ids: list[list[int]], batch_seed: int, on_finish=None):
    call = dataclasses.replace(config, seed=batch_seed, max_prompt_len=capacity)
    plan = plan_lib.prepare(target, draft, prompt_ids, call,
                            sequence_ids=[sequence_id[(p.task_id, k)] for p, k in rows])
    return runner.run(plan, on_finish=on_finish)

  encode = lambda rows: [token_ids[p.task_id] for p, _ in rows]
  # What each decode call covers: (batch index, its seed, the rows it decodes, which of them to emit).
  work = []
  for i, batch in enumerate(plan):
    missing = [j for j, (p, k) in enumerate(batch) if (p.task_id, k) not in done]
    if not missing:
      continue
    if continuous:  # only the missing sequences queue
      work.append((None, seed, [batch[j] for j in missing], None))
    else:  # the whole batch, as first decoded, so that its draws repeat; only the missing are emitted
      work.append((i, seed + i, batch, set(missing)))
  before = compile_cache.stats()  # the run's builds, its warm-up's included
  if warmup and not continuous and work:  # untimed; its compilation is still reported
    warm = decode(work[0][2], encode(work[0][2]), work[0][1]).stats
    compile_seconds, calibration_seconds = warm.compile_seconds, warm.calibration_seconds
  # Progress by sequence, as records stream: finished of the total, tokens/s of wall time since the
  # bar started (compilation included) and tokens per step per row (the accepted length plus the bonus
  # token; 1 for regular decoding).
  description = f"{method} B={batch_size}"
  bar = tqdm.tqdm(total=sum(len(rows) if emit is None else len(emit) for _, _, rows, emit in work),
                  desc=description, unit="seq", disable=not progress)
  streamed = {"tokens": 0, "steps": 0, "start": time.perf_counter()}
  startups: list[float] = []

  def show_compile(event: str, program: str, seconds: float, source: str) -> None:
    """A build in the bar's description while it runs, and one line when it is done."""
    if event == "start":
      bar.set_description(f"{description} (compiling the {program})")
      return
    bar.set_description(description)
    if progress:
      bar.write(f"bass_jax: {program}: {programs.outcome(source, seconds)}")

  with programs.reporting(show_compile):
    try:
      for batch_index, batch_seed, rows, emit in work:
        prompt_ids = encode(rows)
        prompt_lengths = np.array([len(p) for p in prompt_ids])
        run_start = wall  # the run's clock: the summed wall time of the batches before this one
        held: list[dict[str, Any]] = []

        def finished(result):  # called during this iteration's decode
          if emit is not None and result.index not in emit:
            return  # a resumed batch's sequence that is already on disk
          problem, sample_index = rows[result.index]
          record = {
              "task_id": problem.task_id,
              "sample_index": sample_index,
              "batch_index": batch_index,
              "row": result.row,
              "batch_size": batch_size,
              "prompt_tokens": int(prompt_lengths[result.index]),
              "completion": tokenizer.decode(result.tokens.tolist(), skip_special_tokens=True),
              "num_tokens": len(result.tokens),
              "accepted_drafts": result.accepted if method == "bass" else None,
              "drafted": result.drafted if method == "bass" else None,
              "steps": result.steps,
              "mean_logprob": float(np.mean(result.logprobs)) if len(result.tokens) else 0.0,
              "finished": result.finished,
              "finish_seconds": result.finish_seconds - result.admit_seconds,
              "wait_seconds": run_start + result.admit_seconds,
              "ttft_seconds": run_start + result.first_token_seconds,
          }
          held.append(record)
          streamed["tokens"] += record["num_tokens"]
          streamed["steps"] += record["steps"]
          bar.update(1)
          bar.set_postfix_str(
              f"{streamed['tokens'] / max(time.perf_counter() - streamed['start'], 1e-9):.1f} tok/s, "
              f"{streamed['tokens'] / max(streamed['steps'], 1):.2f} tokens/step")
          if on_record is not None and not check:
            on_record(record)

        out = decode(rows, prompt_ids, batch_seed, finished)
        stats = out.stats
        startups.append(stats.startup_seconds)
        if progress and (len(startups) == 1 or stats.startup_seconds >= 0.5):
          bar.write(f"bass_jax: {method} call {len(startups)} started decoding after "
                    f"{stats.startup_seconds:.1f} s (prepare {stats.prepare_seconds:.1f} s, programs "
                    f"{stats.compile_seconds:.1f} s from {stats.program_source}, calibration "
                    f"{stats.calibration_seconds:.1f} s)")
        step_costs = stats.step_costs  # the same for every batch of a run (measured once per setting)
        was_continuous = stats.continuous
        # Each sequence from the start of its own decoding: its batch's start, or its admission.
        own_seconds = stats.finish_seconds - stats.admit_seconds
        latencies.append(metrics.per_token_latency(own_seconds, out.lengths))
        if not stats.continuous:  # a continuous batch has no batches to be ragged within
          ragged.append(metrics.raggedness(prompt_lengths, out.lengths,
                                           stats.accepted if method == "bass" else None))
        if method == "bass":
          accept_parts.append(metrics.acceptance(stats.draft_lens, stats.accepted, stats.drafted))
          is_tree = stats.trees >= 0
          tree_steps += int(is_tree.sum())
          tree_nodes.append((stats.drafted + 1)[is_tree][stats.accepted[is_tree] >= 0])
          for code in range(len(DRAFT_SOURCES)):
            mine = (stats.sources == code) & (stats.accepted >= 0)
            by_source[:, code] += (int(stats.drafted[mine].sum()), int(stats.accepted[mine].sum()))
        flops = metrics.decode_flops(target, draft, prompt_lengths, out, method=method)
        useful_flops += flops.useful
        executed_flops += flops.executed
        steps += stats.steps
        draft_len_sum += int(stats.draft_lens.sum())
        plain_steps += int((stats.draft_lens == 0).sum())
        verified_sum += int(stats.verified.sum())
        tokens += int(out.lengths.sum())
        wall += stats.wall_seconds
        compile_seconds += stats.compile_seconds
        calibration_seconds += stats.calibration_seconds
        order = {(p.task_id, k): n for n, (p, k) in enumerate(rows)}
        held.sort(key=lambda r: order[batches.record_key(r)])
        if check:
          passed = humaneval.check_completions([rows[order[batches.record_key(r)]][0] for r in held],
                                               [r["completion"] for r in held])
          for record, ok in zip(held, passed):
            record["passed"] = ok
            if on_record is not None:
              on_record(record)
        records.extend(held)
    finally:
      bar.close()
  built = compile_cache.stats()

  pass_at_batch = None
  if check and records:
    task_ids = list(dict.fromkeys(r["task_id"] for r in records))
    pass_at_batch = float(np.mean([
        metrics.pass_at_batch([r["passed"] for r in records if r["task_id"] == t]) for t in task_ids]))
  accept = metrics.Acceptance.pooled(accept_parts) if accept_parts else None
  nodes = np.concatenate(tree_nodes) if tree_nodes else np.zeros(0)
  mean = lambda values: float(np.mean(values)) if len(values) else None
  bass = method == "bass" and steps > 0
  # Per draft source (proposers.DRAFT_SOURCES), its share of some tokens; None without tokens.
  shares = lambda counts: ({name: float(c / counts.sum()) for name, c in zip(DRAFT_SOURCES, counts)}
                           if bass and counts.sum() else None)
  device = jax.devices()[0]
  summary = {
      "method": method,
      "batch_size": batch_size,
      "num_prompts": len(problems),
      "distinct_prompts": distinct_prompts,
      "samples_per_prompt": samples_per_prompt,
      "sample_order": sample_order,
      "num_batches": num_batches,
      "max_new_tokens": config.max_new_tokens,
      "temperature": temperature,
      "top_p": config.top_p,
      "acceptance_rule": ((config.acceptance if isinstance(config.acceptance, str)
                           else repr(config.acceptance)) if temperature > 0 else None),
      "draft_len": str(config.draft_len) if method == "bass" else None,
      "draft_tree": ("; ".join(map(str, tree_shapes(config.draft_tree)))
                     if method == "bass" and config.draft_tree is not None else None),
      "continuous": was_continuous,
      "ms_per_token_first": None if was_continuous else mean([l.first for l in latencies]),
      "ms_per_token_last": None if was_continuous else mean([l.last for l in latencies]),
      "ms_per_token_all": mean([l.all for l in latencies]),
      "mean_wait_seconds": mean([r["wait_seconds"] for r in records]),
      "mean_ttft_seconds": mean([r["ttft_seconds"] for r in records]),
      "tokens_per_second": tokens / wall if wall else None,
      "mean_accepted_length": accept.mean_accepted_length if accept else 1.0,
      "draft_acceptance_rate": accept.draft_acceptance_rate if accept else None,
      "position_acceptance": list(accept.position_acceptance) if accept else None,
      "acceptance": dataclasses.asdict(accept) if accept else None,
      # Raggedness within a batch (None with continuous batching, which has no batches).
      "length_spread": mean([r.length_spread for r in ragged]) if ragged else None,
      "emitted_spread": mean([r.emitted_spread for r in ragged]) if ragged else None,
      "accepted_spread": mean([r.accepted_spread for r in ragged]) if ragged else None,
      "steps": steps,
      "mean_draft_len": draft_len_sum / steps if bass else None,
      "speculative_steps": steps - plain_steps if bass else None,
      "plain_step_share": plain_steps / steps if bass else None,
      "tree_step_share": tree_steps / (steps - plain_steps) if bass and steps > plain_steps else None,
      "mean_tree_nodes": float(np.mean(nodes)) if bass and nodes.size else None,
      "draft_source_share": shares(by_source[0]),
      "accepted_source_share": shares(by_source[1]),
      "step_costs": dataclasses.asdict(step_costs) if step_costs is not None else None,
      "mean_verified": verified_sum / steps if bass else None,
      "wall_seconds": wall,
      "compile_seconds": compile_seconds,
      # Measuring the cost-aware policy's step costs in the decode's programs (sampling.calibration).
      "calibration_seconds": calibration_seconds,
      # Before each call's decode: prepare (step costs included), programs, calibration.
      "first_startup_seconds": startups[0] if startups else None,
      "startup_seconds": float(sum(startups)),
      "prompt_capacity": capacity,
      # The decode programs this run built (compile_cache.stats()): settings, and XLA programs
      # loaded from the persistent cache or compiled (a setting is a prefill and a decode program).
      "settings_built": built.built - before.built,
      "programs_loaded": built.programs_loaded - before.programs_loaded,
      "programs_compiled": built.programs_compiled - before.programs_compiled,
      "tokens": tokens,
      "pass_at_batch": pass_at_batch,
      "useful_flops": useful_flops,
      "executed_flops": executed_flops,
      "decoded_records": len(records),
      "resumed_records": len(done),
      "target": target.name,
      "draft": draft.name if method == "bass" else None,
      # What ran (the backend profile's choice where the call left them None).
      "attention_impl": stats.attention_impl if work else config.attention_impl,
      "verify_chunk": (stats.verify_chunk or None) if work else config.verify_chunk,
      "profile": stats.profile if work else None,
      "device": f"{device.platform}:{device.device_kind}",
      # The mesh generate ran on (None: one device, or nothing decoded).
      "mesh": (stats.mesh or None) if work else None,
      "processes": jax.process_count(),
      "jax_version": jax.__version__,
  }
  return RunResult(records, summary)


def format_summary(summary: dict[str, Any]) -> str:
  """The summary as an aligned two-column table (the keys of :data:`SUMMARY_KEYS` first)."""
  keys = list(SUMMARY_KEYS) + [k for k in summary if k not in SUMMARY_KEYS]
  width = max(len(k) for k in keys)

  def fmt(v):
    if isinstance(v, float):
      return "nan" if math.isnan(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)

  return "\n".join(f"{k:<{width}}  {fmt(summary.get(k))}" for k in keys)
