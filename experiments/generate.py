r"""Main job: decode HumanEval (or a JSONL prompt file) with BASS or regular decoding and summarize.

    python -m experiments.generate --method=bass --num_prompts=3 --batch_size=4 \
        --max_new_tokens=64 --temperature=0.2 --top_p=0.95

At temperature 0 each batch holds ``--batch_size`` *different* prompts (copies of one prompt would be
identical rows); when sampling, ``--batch_size`` samples of each prompt (the paper's setting);
``--distinct_prompts`` overrides either, and ``--samples_per_prompt`` replaces both (each prompt that
many times, grouped or, with ``--sample_order=interleaved``, round robin over the prompts). By
default the sequences of all batches form one queue that ``--batch_size`` rows decode with continuous batching (a finished row takes the next sequence at once);
``--nocontinuous`` decodes the batches one after the other. Per-token latency per sequence (All, and
First / Last of each static batch, BASS paper §4.1) is the wall time from the start of its decoding
(its batch's start, or its admission) until it was complete, over its token count; compilation is
excluded and reported apart (``bass_jax.evaluation.experiment.run_problems``).

Every flag, the prompts, the model specs and the prompts' lengths against the models' context are
checked before any model loads, each failure a one-line error. Records (one JSON line per sequence)
are appended to ``--output`` (fsynced) as each sequence finishes, static or continuous, so a killed
run loses only the sequences in flight; the summary (``--summary_json``) records the settings first,
is rewritten after every ``--summary_every`` records marked ``"complete": false``, and is written
whole at the end, when the records are rewritten in plan order. Both default to a fresh directory
``outputs/generate-<method>-<time>/``. A rerun into an output that holds records is refused unless
``--resume`` (keep them, check that the settings are the same, decode only the missing sequences:
the records then equal an uninterrupted run's, except sampled ones of a continuous run with
``--acceptance=rejection``, which are other exact draws; docs/design.md, "Interrupted runs") or
``--overwrite``.

The default draft is ``smollm2-135m-draft``, the small Llama draft this project distilled from the
target and ships inside ``bass_jax/drafts`` (docs/draft.md). ``--draft=smollm2-135m-instruct
--draft_num_layers=4`` gives a placeholder instead (the target's first four layers), which agrees with
the target a few percent of the time and makes BASS slower than regular decoding.
"""

import dataclasses
import pathlib
from typing import Any

from absl import app
from absl import flags
from absl import logging

from experiments import _decode_flags
from experiments import _io
from experiments import _runs

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target: alias, .gguf, or HF dir.")
_DRAFT = _io.define_draft_flag("smollm2-135m-draft")
_DRAFT_LAYERS = flags.DEFINE_integer(
    "draft_num_layers", 0, "Keep only the draft's first N layers (0 = all). With --draft equal to "
    "--target this is the placeholder draft built from the target.", lower_bound=0)
# DecodeConfig's fields (experiments._decode_flags), read back whole by _DECODE.config(). Not the two
# sizes run_problems decides from the run's prompts (max_prompt_len: the longest; max_cache_len follows),
# whose caps could be refused only once the prompts are tokenized and the models loaded.
_DECODE = _decode_flags.define(
    *(f for f in _decode_flags.FIELDS if f not in ("max_prompt_len", "max_cache_len")), batch_size=4)
(_METHOD, _BATCH, _MAX_NEW, _TEMPERATURE, _DRAFT_LEN, _DRAFT_TREE, _SEED, _ACCEPTANCE, _ATTENTION) = (
    _DECODE[name] for name in ("method", "batch_size", "max_new_tokens", "temperature", "draft_len",
                               "draft_tree", "seed", "acceptance", "attention_impl"))
_PROMPTS = flags.DEFINE_string("prompts", "humaneval", "'humaneval' or a JSONL file with 'prompt'.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 3, "First N prompts (0 = all).", lower_bound=0)
_CONTINUOUS = flags.DEFINE_bool(
    "continuous", True, "Continuous batching: --batch_size rows decode at a time and a row that "
    "finishes takes the next waiting sequence inside the jitted loop, for both methods (the fair "
    "setting for a set larger than a batch). --nocontinuous decodes static batches, each until its "
    "last row finishes (the paper's latency setting, with First / Last per batch).")
_DISTINCT = flags.DEFINE_bool(
    "distinct_prompts", None, "Each batch holds batch_size different prompts, one sequence each "
    "(default at temperature 0); --nodistinct_prompts decodes batch_size samples of each prompt "
    "(default when sampling).")
_SAMPLES = flags.DEFINE_integer(
    "samples_per_prompt", None, "Decode each prompt this many times (overrides --distinct_prompts and "
    "its default), in the order --sample_order gives, cut into batches of --batch_size or queued; "
    "at most 10000.", lower_bound=1, upper_bound=10_000)
_SAMPLE_ORDER = flags.DEFINE_enum(
    # batches.SAMPLE_ORDERS, spelled out: bass_jax loads only after the flags are checked.
    "sample_order", "grouped", ["grouped", "interleaved"], "With --samples_per_prompt: grouped (a "
    "prompt's samples in a row) or interleaved (round robin over the prompts: with continuous "
    "batching a prompt's later samples start once its earlier ones finished, which sibling lookup "
    "drafts from; bass_jax.evaluation.batches.make_batches).")
_SCAN_LAYERS = flags.DEFINE_bool(
    "scan_layers", None, "The target's (and a draft model's) layer layout: scanned (--scan_layers, "
    "one layer compiled) or unrolled (--noscan_layers); absent: the backend profile's (unrolled on "
    "a CPU and a GPU: bass_jax.profiles).")
_DTYPE = flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16"],
                           "Parameter/compute dtype; auto: float32 on a CPU, bfloat16 on a GPU.")
_OUTPUT = flags.DEFINE_string("output", None, "JSONL file, one record per sequence, appended as each "
                              "sequence finishes (default: <fresh run directory>/records.jsonl).")
_SUMMARY = flags.DEFINE_string("summary_json", None, "JSON file for the summary (default: <fresh run "
                               "directory>/summary.json).")

_SUMMARY_EVERY = flags.DEFINE_integer(
    "summary_every", 8, "Rewrite the summary (marked incomplete) after every N records, so that a "
    "long run shows its progress on disk.", lower_bound=1)

flags.register_multi_flags_validator(
    ["samples_per_prompt", "sample_order", "distinct_prompts"],
    lambda f: (f["sample_order"] == "grouped" or f["samples_per_prompt"] is not None)
    and (f["samples_per_prompt"] is None or f["distinct_prompts"] is None),
    message="--samples_per_prompt replaces --distinct_prompts (give one of them), and "
    "--sample_order=interleaved orders several samples of each prompt (give --samples_per_prompt)")


def _outputs() -> tuple[pathlib.Path, pathlib.Path]:
  """(records, summary) paths, checked: writable, distinct, and not an earlier run's unless
  --resume or --overwrite."""
  output, summary_path = _OUTPUT.value, _SUMMARY.value
  if output is None or summary_path is None:
    run_dir = _io.run_directory(None, f"generate-{_METHOD.value}")
    output = output or run_dir / "records.jsonl"
    summary_path = summary_path or run_dir / "summary.json"
  output = _io.check_output_file(output, flag="output")
  summary_path = _io.check_output_file(summary_path, flag="summary_json")
  _runs.check_distinct(output=output, summary_json=summary_path)
  _runs.refuse_existing(output, "records")
  return output, summary_path


def _preflight(problems):
  """Everything about the models that can be known without their weights: the specs resolve, the
  target ships a tokenizer, the attention implementation exists, and every prompt plus
  --max_new_tokens fits the models' context."""
  from bass_jax import preflight  # pylint: disable=g-import-not-at-top
  from bass_jax.models import attention_registry  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import acceptance  # pylint: disable=g-import-not-at-top

  try:
    acceptance.acceptance_rule(_ACCEPTANCE.value)
  except ValueError as e:
    raise _io.Refusal(f"--acceptance: {e}") from None

  if (_ATTENTION.value is not None
      and _ATTENTION.value not in attention_registry.attention_implementations()):
    raise _io.Refusal(f"--attention_impl={_ATTENTION.value!r} is not one of "
                      f"{', '.join(attention_registry.attention_implementations())}")
  target, draft = _io.inspect_models(_TARGET.value,
                                     _DRAFT.value if _METHOD.value == "bass" else None)
  if not target.has_tokenizer:
    raise _io.Refusal(f"--target={_TARGET.value} ships no tokenizer, which the prompts need; give a "
                      "checkpoint saved with its tokenizer")
  context = min(m.context for m in (target, draft) if m is not None)
  _io.check_speculation(_METHOD.value, _DRAFT_LEN.value, _DRAFT_TREE.value, target=target,
                        draft=draft)
  if _METHOD.value == "bass" and _DRAFT_LAYERS.value:
    if draft is None or draft.kind == "eagle":
      raise _io.Refusal(f"--draft_num_layers={_DRAFT_LAYERS.value} cuts a draft model's layers, and "
                        f"--draft={_DRAFT.value} has none to cut; drop --draft_num_layers")
    if _DRAFT_LAYERS.value > draft.num_layers:
      raise _io.Refusal(f"--draft_num_layers={_DRAFT_LAYERS.value}: the draft has {draft.num_layers} "
                        "layers; give at most that many (0 keeps all)")
  windowed = draft is not None and draft.sliding_window is not None
  if windowed and _DRAFT_TREE.value:
    raise _io.Refusal(f"--draft_tree: the draft {_DRAFT.value} has a sliding window, and a tree grows "
                      "its levels as queries over earlier nodes, which a window over a tree does not "
                      "support; use a draft without a window, n-gram lookup or chains")
  if _MAX_NEW.value >= context:
    raise _io.Refusal(f"--max_new_tokens={_MAX_NEW.value} does not fit the models' context of "
                      f"{context} positions (with at least a one-token prompt); lower it")
  # A byte-level BPE token covers at least one byte (a few special tokens aside), so most prompts
  # fit without tokenizing; only a prompt that might not fit pays for loading the tokenizer.
  margin = 8
  longest = max(problems, key=lambda p: len(p.prompt.encode()))
  if len(longest.prompt.encode()) + margin + _MAX_NEW.value > context:
    tokenizer = preflight.load_tokenizer(target)
    for p in problems:
      n = len(tokenizer(p.prompt).input_ids)
      if n + _MAX_NEW.value > context:
        raise _io.Refusal(f"prompt {p.task_id!r} has {n} tokens; with --max_new_tokens="
                          f"{_MAX_NEW.value} it exceeds the models' context of {context} positions: "
                          "shorten it or lower --max_new_tokens")


@dataclasses.dataclass(frozen=True)
class _Checked:
  """What :func:`_check_run` found: the run's outputs, settings, prompts and plan, nothing loaded."""

  output: pathlib.Path
  summary_path: pathlib.Path
  settings: dict[str, Any]
  done: dict[Any, dict[str, Any]]
  problems: list[Any]
  distinct: bool | None
  plan: list[list[Any]]


def _check_run() -> _Checked:
  """Every check of a run that needs no model weights, in order of cost: the flags together, the
  outputs (and a resumed run's settings), the prompts, the seed range, then the models' configs
  (:func:`_preflight`). The CLI's refusals all come from here.

  Raises:
    _io.Refusal: the first problem, as one line naming the flag or file and the fix.
  """
  _io.check_speculation(_METHOD.value, _DRAFT_LEN.value, _DRAFT_TREE.value)
  try:
    output, summary_path = _outputs()
  except (_io.OutputError, _runs.RunError) as e:
    raise _io.Refusal(str(e)) from e

  from bass_jax.evaluation import batches  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import config  # pylint: disable=g-import-not-at-top

  records_file = _runs.RecordsFile(output)
  settings = _runs.settings(__name__)
  done = {}
  if _runs.RESUME.value:
    try:
      earlier = _runs.read_json(summary_path)
      done = records_file.read(batches.record_key)
      if earlier is not None or done:
        _runs.check_settings(summary_path, (earlier or {}).get("settings"), settings)
    except _runs.RunError as e:
      raise _io.Refusal(str(e)) from e

  try:
    problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value or None)
    # run_problems' rule: samples_per_prompt, when given, decides alone (distinct_prompts None).
    distinct = (None if _SAMPLES.value is not None else
                _DISTINCT.value if _DISTINCT.value is not None else _TEMPERATURE.value == 0)
    plan = batches.sequence_plan(problems, _BATCH.value, bool(distinct), _SAMPLES.value,
                                 _SAMPLE_ORDER.value)
    batches.check_done(plan, done)
  except (FileNotFoundError, ValueError) as e:
    raise _io.Refusal(f"--resume: {output}: {e}" if done else str(e)) from e
  try:
    config.check_seed(_SEED.value, 1 if _CONTINUOUS.value else len(plan))
  except ValueError as e:
    raise _io.Refusal(f"--seed: {e}") from e
  _preflight(problems)
  return _Checked(output, summary_path, settings, done, problems, distinct, plan)


def check(argv: list[str]) -> _Checked:
  """Parses ``argv`` (``argv[0]`` the program) and runs every check :func:`main` makes before loading a
  model, in this process, without :func:`_io.init_script`'s side effects (a mesh, a compilation cache):
  what tests of the refusals call.

  Raises:
    SystemExit: status 2 after one line on stderr, for each refusal.
  """
  return _io.check_argv(argv, _check_run)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  _io.init_script()
  run = _check_run()
  output, summary_path, settings, done = run.output, run.summary_path, run.settings, run.done
  problems, distinct, plan = run.problems, run.distinct, run.plan
  records_file = _runs.RecordsFile(output)

  from bass_jax.evaluation import batches, experiment  # pylint: disable=g-import-not-at-top

  total = sum(len(batch) for batch in plan)
  if len(done) == total:  # killed after its last record: only the summary is missing
    _io.write_json_atomic(summary_path, {"complete": True, "settings": settings, "records": total,
                                         "decoded_records": 0, "resumed_records": total})
    print(f"{output} already holds all {total} records; nothing to decode", flush=True)
    return

  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top

  dtype = None if _DTYPE.value == "auto" else jnp.dtype(_DTYPE.value)
  logging.info("loading target %s", _TARGET.value)
  target = bass_jax.load_model(_TARGET.value, dtype=dtype, scan_layers=_SCAN_LAYERS.value)
  draft = None
  if _METHOD.value == "bass":
    draft = bass_jax.load_draft_spec(_DRAFT.value, target, num_layers=_DRAFT_LAYERS.value or None,
                                     dtype=dtype)

  progress = {"complete": False, "settings": settings, "records": len(done), "of": total}
  _io.write_json_atomic(summary_path, progress)
  written = len(done)

  def on_record(record):
    nonlocal written
    sink.append(record)
    written += 1
    if written % _SUMMARY_EVERY.value == 0:
      _io.write_json_atomic(summary_path, {**progress, "records": written})

  with records_file.open(append=bool(done)) as sink:
    result = experiment.run_problems(
        target, draft, problems, _DECODE.config(), distinct_prompts=distinct,
        samples_per_prompt=_SAMPLES.value, sample_order=_SAMPLE_ORDER.value, on_record=on_record,
        continuous=_CONTINUOUS.value, done=done)
  # Every record in plan order, as an uninterrupted run leaves them.
  by_key = {**done, **{batches.record_key(r): r for r in result.records}}
  records_file.rewrite(by_key[(p.task_id, k)] for batch in plan for p, k in batch)
  summary = {**result.summary, "complete": True, "settings": settings, "records": total}
  print(experiment.format_summary(summary), flush=True)
  _io.write_json_atomic(summary_path, summary)
  print(f"records: {output}\nsummary: {summary_path}", flush=True)


if __name__ == "__main__":
  _io.run(main)
