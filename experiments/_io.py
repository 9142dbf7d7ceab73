"""Output handling shared by the experiment scripts: check paths before any model is loaded, write
records as they come, replace summaries atomically, and keep fresh runs away from committed results.

Every script calls :func:`init_script` first (quiet logs, optional persistent compilation cache),
checks its output paths with :func:`check_output_file` / :func:`run_directory` before loading a model (a
bad path fails in seconds, not after a decode), writes JSON with :func:`write_json_atomic` (a temporary
file renamed over the old one: never a half-written file), and runs its ``main`` through :func:`run`
(one-line errors). Records, ``--resume`` and ``--overwrite`` live in ``experiments/_runs.py``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import sys
import tempfile
from typing import Any, Callable, Iterable, NoReturn

from absl import flags

COMPILATION_CACHE_DIR = flags.DEFINE_string(
    "compilation_cache_dir", None, "Where compiled programs persist (JAX's persistent compilation "
    "cache), so that the next run with the same settings loads instead of compiling; 'off' turns it "
    "off. Default: $BASS_JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/bass_jax/xla or "
    "~/.cache/bass_jax/xla (bass_jax.sampling.compile_cache).")

# What a --draft flag takes, in words: the flags are defined before bass_jax is imported, so this text is
# written by hand; the grammar itself is bass_jax.sampling.drafts.parse_draft_spec's, and --draft=help
# prints it with every registered proposer's settings, generated from the registry.
DRAFT_SPEC_FORMS = (
    "a draft model (alias, .gguf, HF dir or cached org/name; a published EAGLE-1/2, EAGLE-3 or Medusa "
    "directory); a proposer by name: 'ngram[:max_n=4,min_n=2]' (prompt lookup), 'siblings[:...]' "
    "(lookup in the other samples of the prompt), or your own Proposer by import path "
    "'py:<module>.<Class>[:key=value,...]'; or 'hybrid[+<lookup>...]:<model>[:max_n=4,min_n=2]' "
    "(the lookups where a row matches, the model elsewhere). --draft=help lists them all with their "
    "settings")


def define_draft_flag(default: str | None, what: str = "The draft side") -> flags.FlagHolder:
  """The --draft flag of a script (an absl ``FlagHolder[str]``): ``what`` then the spec forms it takes
  (:data:`DRAFT_SPEC_FORMS`)."""
  return flags.DEFINE_string("draft", default, f"{what}: {DRAFT_SPEC_FORMS}.")


MESH = flags.DEFINE_string(
    "mesh", None, "Decode on a jax.sharding mesh of DATA,MODEL devices (e.g. '2,4' or "
    "'data:2,model:4'): rows split over data, the target's weights tensor-parallel over model "
    "(docs/scaling.md). Default: one device.")
COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 for a run over several processes (hosts), "
    "each owning part of --mesh; with --num_processes and --process_id (jax.distributed.initialize). "
    "Only process 0 writes outputs.")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.",
                                     lower_bound=1)
PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).",
                                  lower_bound=0)


def _check_processes(values: dict[str, Any]) -> bool:
  given = [values[n] is not None for n in ("coordinator_address", "num_processes", "process_id")]
  if any(given) and not all(given):
    raise flags.ValidationError("--coordinator_address, --num_processes and --process_id go together")
  if all(given) and values["process_id"] >= values["num_processes"]:
    raise flags.ValidationError(f"--process_id={values['process_id']} must be below "
                                f"--num_processes={values['num_processes']}")
  return True


def _check_mesh(text: str | None) -> bool:
  if text is None:
    return True
  from bass_jax.sharding import parse_mesh  # pylint: disable=g-import-not-at-top

  try:
    parse_mesh(text)
  except ValueError as e:
    raise flags.ValidationError(f"--mesh: {e}") from e
  return True


flags.register_multi_flags_validator(["coordinator_address", "num_processes", "process_id"],
                                     _check_processes)
flags.register_validator("mesh", _check_mesh)

OUTPUTS = pathlib.Path("outputs")  # git-ignored; fresh runs go here unless told otherwise


def require_distinct_prompts(num_prompts: int, batch_size: int, batch: str) -> None:
  """A greedy batch holds distinct prompts (``batches.make_batches``): refuses ``--num_prompts`` fewer
  than ``batch_size``, naming the batch as ``batch`` (``"batch_size=4"``).

  Raises:
    Refusal: too few prompts, naming both and the fix.
  """
  if num_prompts < batch_size:
    raise Refusal(f"greedy batches hold distinct prompts: --num_prompts={num_prompts} is fewer than "
                  f"{batch}; raise --num_prompts or drop that batch size")


def require_positive_ints(flag_name: str) -> None:
  """Registers a validator: the list flag ``flag_name`` holds one or more ints >= 1 (batch sizes)."""
  flags.register_validator(
      flag_name, lambda v: bool(v) and all(b.isdigit() and int(b) >= 1 for b in v),
      message=f"--{flag_name} must be a comma-separated list of ints >= 1")


def require_draft_len(flag_name: str = "draft_len") -> None:
  """Registers a validator: the flag ``flag_name`` is a draft-length policy, ``dynamic``, ``goodput``
  or an int in ``[1, MAX_DRAFT_LEN]`` (what :func:`draft_len_value` turns into ``generate``'s
  ``draft_len``)."""

  def check(value: str) -> bool:
    if value in ("dynamic", "goodput"):
      return True
    from bass_jax.sampling.draft_len import MAX_DRAFT_LEN  # pylint: disable=g-import-not-at-top

    if not (value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_DRAFT_LEN):
      raise flags.ValidationError(f"--{flag_name} must be 'dynamic', 'goodput' or an int in [1, "
                                  f"{MAX_DRAFT_LEN}], got {value!r}")
    return True

  flags.register_validator(flag_name, check)


def require_tree_shapes(flag_name: str = "draft_tree") -> None:
  """Registers a validator: the multi-string flag ``flag_name`` holds token-tree shapes, each parsed
  strictly (``bass_jax.sampling.tree.tree_shapes``: no empty value, no unknown or repeated field,
  within the documented limits, no shape twice)."""

  def check(values: list[str]) -> bool:
    if not values:
      return True
    from bass_jax.sampling.tree import tree_shapes  # pylint: disable=g-import-not-at-top

    try:
      tree_shapes(values)
    except ValueError as e:
      raise flags.ValidationError(f"--{flag_name}: {e}") from e
    return True

  flags.register_validator(flag_name, check)


def check_speculation(method: str, draft_len: str, draft_tree: list[str], *, target: Any = None,
                      draft: Any = None) -> None:
  """A script's ``--method``, ``--draft_len`` and ``--draft_tree`` together
  (``bass_jax.sampling.config.check_speculation``) and, once the models' configs are read (``target``,
  ``draft``: ``preflight.ModelSource``, the draft None for a lookup), against their vocabulary and
  context.

  Raises:
    Refusal: the first problem, naming the flags.
  """
  from bass_jax.sampling import config  # pylint: disable=g-import-not-at-top

  context = None if target is None else min(m.context for m in (target, draft) if m is not None)
  try:
    config.check_speculation(method, draft_len_value(draft_len), draft_tree or None,
                             vocab_size=None if target is None else target.vocab_size,
                             context=context)
  except ValueError as e:
    raise Refusal(f"--draft_len/--draft_tree: {e}") from e


def canonical_tree_shapes(values: list[str]) -> list[str]:
  """``--draft_tree`` values in canonical form (``str(TreeShape)``), so that the same shape written in
  another field order or spacing is the same setting for ``--resume``.

  Raises:
    ValueError: a value ``tree.tree_shapes`` refuses (the flag's validator refuses it first).
  """
  if not values:
    return []
  from bass_jax.sampling.tree import tree_shapes  # pylint: disable=g-import-not-at-top

  return [str(t) for t in tree_shapes(values)]


def draft_len_value(text: str) -> int | str:
  """A ``--draft_len`` flag's text as ``generate`` takes it: digits become the fixed length, anything
  else (``dynamic``, ``goodput``) stays a name; ``generate`` rejects what it does not know."""
  return int(text) if text.isdigit() else text


class OutputError(ValueError):
  """An output path that cannot be written; the message names the flag and the fix."""


def _check_parent(path: pathlib.Path, flag: str) -> None:
  for parent in path.absolute().parents:
    if parent.exists():
      if not parent.is_dir():
        raise OutputError(f"--{flag}={path}: {parent} is a file, not a directory")
      if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"--{flag}={path}: cannot create files under {parent} (permission denied)")
      return


def check_output_file(path: str | os.PathLike | None, *, flag: str) -> pathlib.Path | None:
  """Checks that ``path`` can be written as a file, creating nothing; None passes through.

  Raises:
    OutputError: ``path`` is a directory (or ends with a separator), a parent is a file, or the nearest
      existing parent or the file itself is not writable.
  """
  if path is None or str(path) == "":
    return None
  text = str(path)
  path = pathlib.Path(path)
  if text.endswith(os.sep) or path.is_dir():
    raise OutputError(f"--{flag}={text} is a directory; give a file path such as {path / 'out.json'}")
  _check_parent(path, flag)
  if path.exists() and not os.access(path, os.W_OK):
    raise OutputError(f"--{flag}={path} exists and is not writable")
  return path


def check_output_dir(path: str | os.PathLike, *, flag: str) -> pathlib.Path:
  """Checks that ``path`` is, or can be created as, a writable directory; creates nothing.

  Raises:
    OutputError: ``path`` is a file, a parent is a file, or it cannot be written.
  """
  path = pathlib.Path(path)
  if path.exists() and not path.is_dir():
    raise OutputError(f"--{flag}={path} is a file; give a directory")
  if path.is_dir():
    if not os.access(path, os.W_OK | os.X_OK):
      raise OutputError(f"--{flag}={path} is not writable")
  else:
    _check_parent(path, flag)
  return path


def run_directory(results_dir: str | None, name: str) -> pathlib.Path:
  """Where a run writes: ``results_dir`` when given (checked), else a fresh ``outputs/<name>-<time>``.

  Fresh directories never collide with an earlier run's and never touch the committed ``results/``;
  pass ``--results_dir=results`` to update those deliberately. Nothing is created here.

  Raises:
    OutputError: as :func:`check_output_dir`.
  """
  if results_dir:
    return check_output_dir(results_dir, flag="results_dir")
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  path = OUTPUTS / f"{name}-{stamp}"
  n = 1
  while path.exists():
    n += 1
    path = OUTPUTS / f"{name}-{stamp}-{n}"
  return check_output_dir(path, flag="results_dir")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> pathlib.Path:
  """Writes ``obj`` as indented JSON with :func:`write_text_atomic`. Values JSON lacks (NumPy scalars)
  are written as floats.

  Raises:
    OSError: as :func:`write_text_atomic`.
    TypeError, ValueError: a value that is neither JSON nor convertible by ``float``.
  """
  return write_text_atomic(path, json.dumps(obj, indent=2, default=float) + "\n")


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
  """Writes ``text`` to a temporary file beside ``path``, fsyncs it and renames it over ``path``, so
  readers see the old file or the new one, never a partial one.

  In a multi-process run only process 0 writes (:func:`is_primary`); the others return at once.

  Raises:
    OSError: the directory cannot be created or written (the temporary file is removed).
  """
  path = pathlib.Path(path)
  if not is_primary():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
  return path


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def run(main: Callable[[list[str]], Any]) -> None:
  """``absl.app.run(main)`` with one-line errors: a bad flag value, an ``app.UsageError`` or a
  ``ValueError``/``FileNotFoundError`` raised before the work starts (:class:`Refusal`) prints
  ``<script>: error: <message>`` on stderr and exits with status 2, without the usage text or a
  traceback. So does an argument that is not a flag (no script takes any): a mistyped flag such as
  ``-quick`` or ``--batch_size 4`` is refused, not ignored."""
  from absl import app  # pylint: disable=g-import-not-at-top

  def parse(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      fail(str(e))

  def guarded(argv: list[str]) -> Any:
    if len(argv) > 1:
      fail(f"unexpected arguments {argv[1:]} (every setting is a flag: --name=value)")
    try:
      return main(argv)
    except (app.UsageError, Refusal) as e:
      fail(str(e))

  app.run(guarded, flags_parser=parse)


def check_argv(argv: list[str], checks: Callable[[], Any]) -> Any:
  """Parses ``argv`` into the flags (from their defaults: earlier values are forgotten) and runs a
  script's ``checks``, refusing as :func:`run` does: one line on stderr, status 2. In-process, for the
  tests of a script's refusals.

  Raises:
    SystemExit: status 2, for a bad flag, a stray argument or a refusal of ``checks``.
  """
  from absl import app  # pylint: disable=g-import-not-at-top

  flags.FLAGS.unparse_flags()
  try:
    rest = flags.FLAGS(list(argv))
  except flags.Error as e:
    fail(str(e), argv[0])
  if len(rest) > 1:
    fail(f"unexpected arguments {rest[1:]} (every setting is a flag: --name=value)", argv[0])
  try:
    return checks()
  except (app.UsageError, Refusal) as e:
    fail(str(e), argv[0])


def inspect_models(target: str, draft: str | None = None) -> tuple[Any, Any]:
  """``(target, draft)`` as ``bass_jax.preflight.ModelSource`` (the draft None for n-gram lookup alone,
  or when ``draft`` is None): the ``--target`` and ``--draft`` specs resolved and their configs read,
  no weights loaded, and the draft checked against the target (``preflight.check_pair``: vocabulary,
  special tokens, an EAGLE draft's target width and layers).

  Raises:
    Refusal: a spec that does not resolve or is malformed, or a draft that does not fit the target,
      naming the flag.
  """
  from bass_jax import preflight  # pylint: disable=g-import-not-at-top

  # The draft first: a draft model is a small config.json, where the target may be a GGUF file whose
  # header (tokenizer arrays included) takes seconds to parse.
  try:
    draft_source = None if draft is None else preflight.inspect_draft_spec(draft)
  except (FileNotFoundError, ValueError) as e:
    raise Refusal(f"--draft: {e}") from e
  try:
    target_source = preflight.inspect_model(target)
  except (FileNotFoundError, ValueError) as e:
    raise Refusal(f"--target: {e}") from e
  if draft_source is not None:
    try:
      preflight.check_pair(target_source, draft_source)
    except ValueError as e:
      raise Refusal(f"--draft: {e}") from e
  return target_source, draft_source


def models_and_batches(target: str, draft: str, prompts: str, num_prompts: int,
                       batches: Iterable[int]) -> tuple[Any, Any, dict[int, list[list[int]]]]:
  """``(target Model, draft side, {b: token ids of b prompts})`` for a script that times settings at
  several batch sizes: the ``--target`` and ``--draft`` specs loaded (``bass_jax.load_draft_spec``), the
  first ``num_prompts`` prompts of the set ``prompts`` encoded with the target's tokenizer, and for
  each batch size b the b longest of them (distinct rows; the largest prompt bucket of the set).

  Raises:
    Refusal: ``num_prompts`` is fewer than the largest batch size (checked before loading).
  """
  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax import text  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  if num_prompts < max(batches):
    raise Refusal(f"--num_prompts={num_prompts} is fewer than the largest batch size")
  model = bass_jax.load_model(target)
  draft_side = bass_jax.load_draft_spec(draft, model)
  problems = load_problems(prompts, num_prompts)
  encoded = sorted(text.encode_prompts(model.tokenizer, [p.prompt for p in problems]), key=len)
  return model, draft_side, {b: encoded[-b:] for b in batches}


class Refusal(ValueError):
  """Input a script refuses before it starts its work; :func:`run` prints it as one line."""


def fail(message: str, argv0: str | None = None) -> NoReturn:
  """Prints ``<script>: error: <message>`` (one line) on stderr and exits with status 2; the script is
  named by ``argv0`` (default ``sys.argv[0]``)."""
  argv0 = argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")
  script = pathlib.Path(argv0).stem if argv0 else "bass_jax"
  sys.stderr.write(f"{script}: error: {' '.join(str(message).split())}\n")
  sys.stderr.flush()
  raise SystemExit(2)


def init_script() -> None:
  """What every script does first: silence third-party log noise; with --draft=help, print the draft
  spec grammar and exit; with --compilation_cache_dir, move
  the persistent compilation cache or turn it off (it is on by default: ``compile_cache``); with --coordinator_address, join the other processes
  (``jax.distributed.initialize``); with --mesh, set the mesh that ``bass_jax.load_model`` and
  ``bass_jax.generate`` then use (``jax.set_mesh``)."""
  quiet_third_party_logs()
  if "draft" in flags.FLAGS and flags.FLAGS.draft == "help":
    from bass_jax.sampling import drafts  # pylint: disable=g-import-not-at-top

    print(drafts.draft_spec_help())
    sys.exit(0)
  if COMPILATION_CACHE_DIR.value is not None:  # else the first decode configures the default
    from bass_jax.sampling import compile_cache  # pylint: disable=g-import-not-at-top

    compile_cache.configure(COMPILATION_CACHE_DIR.value)
  if COORDINATOR_ADDRESS.value or MESH.value:
    import jax  # pylint: disable=g-import-not-at-top

    from bass_jax import sharding  # pylint: disable=g-import-not-at-top

    if COORDINATOR_ADDRESS.value:
      jax.distributed.initialize(coordinator_address=COORDINATOR_ADDRESS.value,
                                 num_processes=NUM_PROCESSES.value, process_id=PROCESS_ID.value)
    if MESH.value:
      data, model = sharding.parse_mesh(MESH.value)
      if data * model > jax.device_count():
        raise Refusal(f"--mesh={MESH.value} needs {data * model} devices, and this process has "
                      f"{jax.device_count()} ({jax.devices()[0].platform}); give a mesh of at most "
                      "that many, or run with more devices")
      jax.set_mesh(sharding.make_mesh(data, model))


def init_mesh_script(host_devices: int, meshes: Iterable[str]) -> list[tuple[int, int]]:
  """:func:`init_script` for a script that builds its own meshes (``--meshes``): ``--mesh`` is refused,
  a CPU gets ``host_devices`` XLA host devices (``--xla_force_host_platform_device_count``, set before
  JAX starts; a GPU ignores it), and the meshes ``DATAxMODEL`` come back as ``(data, model)`` pairs.

  Raises:
    app.UsageError: ``--mesh`` given, or a mesh not written ``DATAxMODEL``.
  """
  from absl import app  # pylint: disable=g-import-not-at-top

  if MESH.value:
    raise app.UsageError("--mesh does not apply: this script builds its own meshes (--meshes)")
  out = []
  for item in meshes:
    data, _, model = item.partition("x")
    if not (data.isdigit() and model.isdigit()):
      raise app.UsageError(f"--meshes: {item!r} is not DATAxMODEL, e.g. 2x4")
    out.append((int(data), int(model)))
  if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={host_devices}").strip()
  init_script()
  return out


def is_primary() -> bool:
  """Whether this process writes outputs: the only one, or process 0 of a multi-process run (however
  ``jax.distributed`` was initialized, once JAX is in use)."""
  if "jax" in sys.modules:
    return sys.modules["jax"].process_index() == 0
  return not PROCESS_ID.value


def quiet_third_party_logs() -> None:
  """Silences log lines that say nothing about the run: JAX probing for TPU/GPU plugins on a CPU,
  orbax's per-checkpoint INFO lines, JAX's compilation-cache lines, transformers' and absl's INFO
  chatter, and bass_jax's compile lines (which the progress bars show)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)  # "Unable to initialize backend"
  # JAX's persistent-cache INFO lines, and bass_jax's own compile lines (the scripts show those in
  # their progress bars instead).
  for name in ("orbax", "orbax.checkpoint", "etils", "transformers", "jax._src.compilation_cache",
               "bass_jax"):
    logging.getLogger(name).setLevel(logging.WARNING)
  absl_logger = logging.getLogger("absl")  # orbax logs its INFO lines through absl's logger
  if not any(isinstance(f, _QuietLibraries) for f in absl_logger.filters):
    absl_logger.addFilter(_QuietLibraries())


class _QuietLibraries(logging.Filter):
  """Drops records below WARNING that libraries (orbax, etils) log through absl's logger, keeping the
  scripts' own INFO lines."""

  _LIBRARIES = (f"{os.sep}orbax{os.sep}", f"{os.sep}etils{os.sep}")

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not any(m in record.pathname for m in self._LIBRARIES)
