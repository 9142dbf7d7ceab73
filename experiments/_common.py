"""Flags and I/O shared by the paper's experiment scripts (absl flags live only in experiments/).

Each script calls :func:`prepare` first (flags checked, output directory decided, an earlier result
refused or, with ``--resume``, checked and read; nothing loaded), then :func:`setup` (models and
prompts), and passes :func:`saver` and :func:`earlier_runs` to its ``bass_jax.evaluation.reproduce`` function,
which calls the saver after every run: the JSON file always holds every finished run (``"complete":
false`` until the last one) and the settings it was made with, so an interrupted experiment loses at
most the run in progress, and ``--resume`` measures only the runs it lacks.
"""

import pathlib
from typing import Any, Callable

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io
from experiments import _runs

SETTING = flags.DEFINE_string("setting", "quick", "Name of the setting (recorded, and the file suffix).")
TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
DRAFT = flags.DEFINE_string("draft", "smollm2-135m-draft", "Draft model spec.")
DRAFT_LAYERS = flags.DEFINE_integer("draft_num_layers", 0, "Keep the draft's first N layers (0 = all).",
                                    lower_bound=0)
SCAN_LAYERS = flags.DEFINE_bool(
    "scan_layers", None, "Load the target (and a draft model, which follows it) with scanned layers "
    "(--scan_layers) or unrolled (--noscan_layers); absent: the backend profile's layout (unrolled "
    "on a CPU and a GPU; docs/design.md, 'Scanned layers').")
NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 2, "First N HumanEval prompts.", lower_bound=1)
MAX_NEW = _decode_flags.define(max_new_tokens=64)["max_new_tokens"]
BATCHES = flags.DEFINE_list("batch_sizes", ["1", "2", "4", "8", "16"], "Batch sizes.")
KERNELS = flags.DEFINE_string(
    "kernels", "auto", "The backend of the PAD/SPLIT attention: 'pallas' (the kernels), 'blocked' (their "
    "plain-JAX versions) or any backend with both strategies registered "
    "(bass_jax.models.attention_registry); 'auto': pallas on a GPU, blocked elsewhere.")
DRAFT_LEN = flags.DEFINE_string(
    "draft_len", "dynamic", "BASS's draft-length policy in budget, throughput and utilization: "
    "'dynamic' (Algorithm 1, the paper's), 'goodput' (per step the kind and length that maximize "
    "expected tokens per second) or an int >= 1. Latency's --configs name their own.")
DRAFT_TREE = flags.DEFINE_multi_string(
    "draft_tree", [], "Token-tree shapes, e.g. top_k=4,depth=5,nodes=16 (repeat for several). Budget, "
    "throughput, utilization: BASS verifies the one shape on every step, or with --draft_len=goodput "
    "chooses per step among plain steps, chains and the shapes. Latency: the shapes of its configs "
    "bass_pad_tree and bass_pad_goodput_trees. Absent: chains.")
RESULTS_DIR = flags.DEFINE_string(
    "results_dir", None, "Directory for <experiment>_<setting>.json. Default: a fresh "
    "outputs/<experiment>-<time>/; pass --results_dir=results to replace the committed results that "
    "experiments.paper.report renders.")

_io.require_positive_ints("batch_sizes")
_io.require_draft_len()
_io.require_tree_shapes()

_RUN_DIR: pathlib.Path | None = None
_EARLIER: list[dict[str, Any]] = []


def prepare(experiment: str, *, greedy: bool = False) -> pathlib.Path:
  """Checks the flags and the output directory before anything is loaded, and silences third-party
  log noise.

  Args:
    greedy: the experiment decodes at temperature 0, where a batch holds distinct prompts
      (``batches.make_batches``), so ``--num_prompts`` must cover the largest batch.

  Returns:
    The JSON file this run will write.

  Raises:
    app.UsageError: the results directory cannot be written, too few prompts for a greedy batch, a
      result on disk without ``--resume``/``--overwrite``, or one made with other settings.
    _io.Refusal: ``--target`` or ``--draft`` does not resolve.
  """
  global _RUN_DIR, _EARLIER
  _io.init_script()
  _check_speculation(experiment)
  if greedy:
    _io.require_distinct_prompts(NUM_PROMPTS.value, max(batch_sizes()),
                                 f"the largest of --batch_sizes={','.join(BATCHES.value)}")
  try:
    _RUN_DIR = _io.run_directory(RESULTS_DIR.value, experiment)
    path = _io.check_output_file(_RUN_DIR / f"{experiment}_{SETTING.value}.json", flag="results_dir")
    _runs.refuse_existing(path, f"a {experiment} result")
    if _runs.RESUME.value:
      earlier = _runs.read_json(path)
      if earlier is not None:
        _runs.check_settings(path, earlier.get("settings") if isinstance(earlier, dict) else None,
                             settings())
        _EARLIER = list(earlier.get("runs", []))
  except (_io.OutputError, _runs.RunError) as e:
    raise app.UsageError(str(e)) from e
  # The specs resolve and fit each other (configs read, no weights); the speculation fits them.
  _check_speculation(experiment, *_io.inspect_models(TARGET.value, DRAFT.value))
  return path


def _check_speculation(experiment: str, target: Any = None, draft: Any = None) -> None:
  """``--draft_len`` and ``--draft_tree`` make sense together, for this experiment and, once the
  models' configs are read (``target``, ``draft``: ``preflight.ModelSource``), for their vocabulary
  and context (``bass_jax.sampling.config.check_speculation``)."""
  if experiment == "latency":
    if DRAFT_LEN.present:
      raise app.UsageError("--draft_len: latency's --configs name their draft lengths (bass_pad, "
                           "bass_pad_l4, ..., bass_pad_goodput_trees); drop --draft_len")
    return
  _io.check_speculation("bass", DRAFT_LEN.value, DRAFT_TREE.value, target=target, draft=draft)


def speculation() -> dict[str, Any]:
  """``{"draft_len", "draft_tree"}`` for ``reproduce``'s BASS runs, from ``--draft_len`` and
  ``--draft_tree`` (None: chains)."""
  return {"draft_len": _io.draft_len_value(DRAFT_LEN.value), "draft_tree": DRAFT_TREE.value or None}


def settings() -> dict[str, Any]:
  """The flags this experiment's result depends on (its own module's and the shared ones)."""
  return _runs.settings("__main__", __name__)


def earlier_runs() -> list[dict[str, Any]]:
  """With ``--resume``, the runs the result on disk already holds (checked by :func:`prepare`)."""
  return list(_EARLIER)


def batch_sizes() -> list[int]:
  """``--batch_sizes`` as ints."""
  return [int(b) for b in BATCHES.value]


def setup():
  """(target, draft, problems, batch sizes) from the shared flags."""
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  problems = load_problems("humaneval", NUM_PROMPTS.value)
  target, draft = reproduce.load_pair(TARGET.value, DRAFT.value, DRAFT_LAYERS.value or None,
                                      scan_layers=SCAN_LAYERS.value)
  return target, draft, problems, batch_sizes()


def saver(path: pathlib.Path) -> Callable[[dict[str, Any]], None]:
  """A callback that writes the experiment's result so far, atomically, to ``path``."""

  def save(result: dict[str, Any]) -> None:
    _io.write_json_atomic(path, {**result, "setting": SETTING.value, "settings": settings()})

  return save


def finish(path: pathlib.Path, result: dict[str, Any]) -> None:
  """Writes the complete result and says where."""
  saver(path)(result)
  print(f"wrote {path}", flush=True)
