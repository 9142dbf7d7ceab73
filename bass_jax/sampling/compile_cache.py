"""Where compiled decode programs and measured step costs outlive the process, and how often programs
were compiled, loaded from disk or reused: the persistent side of ``programs.compiled``.

**The persistent compilation cache is on by default.** The first decode of a process (``prepare``)
points JAX's persistent compilation cache (``jax_compilation_cache_dir``) at the user's cache
directory, ``$XDG_CACHE_HOME/bass_jax/xla`` or ``~/.cache/bass_jax/xla``, so that a new process loads
the programs an earlier one compiled instead of compiling them (vLLM keeps its compiled artifacts in a
user cache directory the same way). JAX keys every entry by the program's HLO, the compile options,
the JAX and jaxlib versions and the devices, so a change of code, JAX version or device compiles
afresh and never reuses a stale program. The environment variable ``BASS_JAX_COMPILATION_CACHE_DIR``
moves it (a path) or turns it off (``off``, ``0``, ``false`` or ``none``); ``generate(...,
compilation_cache=...)`` and the scripts' ``--compilation_cache_dir`` do the same per call or run
(:func:`configure`). A directory that cannot be written is one warning line and a run without the
cache, never a failure. A cache directory a user set through JAX itself (``JAX_COMPILATION_CACHE_DIR``
or ``jax.config``) is left as it is, unless ``BASS_JAX_COMPILATION_CACHE_DIR`` names another; with that
variable ``off`` it keeps serving JAX's compiles while bass_jax stores nothing (:func:`configure`).

JAX's cache is process-wide: once on, every jitted function of the process may store its programs
there (those that compile for at least :data:`MIN_COMPILE_SECONDS`).

**Measured step costs** (the cost-aware draft length's, ``costs.measure_step_costs`` and
``calibration.calibrate``) are kept beside it, in ``step_costs.json``, keyed by the setting, the
device kind, the JAX version and bass_jax's version (:func:`load_costs`, :func:`store_costs`), so that a
second process starts decoding without timing them again.

**Statistics** (:func:`stats`): settings looked up, found in memory and built, and of the XLA programs
built those JAX loaded from the persistent cache (its ``/jax/compilation_cache/cache_hits`` event) and
those XLA compiled: what tests and scripts count compiles with, instead of timing them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import pickle
import sys
import tempfile
import threading
import warnings
from typing import Any

import jax
from jax._src import config as _jax_config  # the thread-local write threshold (compile_counting)

from bass_jax import cache_dirs

ENV_VAR = "BASS_JAX_COMPILATION_CACHE_DIR"
OFF = cache_dirs.OFF
MIN_COMPILE_SECONDS = 0.2  # programs compiling faster than this are not stored
MAX_CACHE_BYTES = 8 << 30  # JAX evicts the least recently used entries beyond this
COSTS_FILE = "step_costs.json"

_LOCK = threading.Lock()


@dataclasses.dataclass
class CompileStats:
  """Counts since the process started.

  Attributes:
    lookups: decode settings asked for (``programs.compiled`` calls).
    memory_hits: settings whose programs were in the in-memory LRU (nothing compiled or loaded).
    programs_loaded: XLA programs of the settings built (:attr:`built`) that were loaded from the
      persistent cache.
    programs_compiled: XLA programs of the settings built that XLA compiled.
  """

  lookups: int = 0
  memory_hits: int = 0
  programs_loaded: int = 0
  programs_compiled: int = 0

  @property
  def built(self) -> int:
    """Settings whose programs were built: every lookup that missed memory."""
    return self.lookups - self.memory_hits


_STATS = CompileStats()
_THREAD = threading.local()  # JAX's cache events of the compile running in this thread


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  if event == "/jax/compilation_cache/cache_hits":
    _THREAD.hits = getattr(_THREAD, "hits", 0) + 1


jax.monitoring.register_event_listener(_on_event)


def stats() -> CompileStats:
  """A copy of the process's :class:`CompileStats`."""
  with _LOCK:
    return dataclasses.replace(_STATS)


def compile_counting(lowered, keep_out_of_jax_cache: bool = False) -> tuple[Any, bool]:
  """``(lowered.compile(), loaded)``: the program, and whether JAX loaded it from its persistent cache
  (a ``/jax/compilation_cache/cache_hits`` event in this thread while it compiled).

  Args:
    lowered: a ``jax.stages.Lowered`` program.
    keep_out_of_jax_cache: JAX does not write the program into its own persistent cache (it is
      stored whole instead, :func:`store_programs`): so JAX's cache never serves it later in a form
      that cannot be stored again. Uses JAX's thread-local threshold of compile time
      (``jax._src.config``, checked with JAX 0.10; where a JAX version lacks it, the program is
      written as usual).

  Returns:
    ``(jax.stages.Compiled, bool)``. Errors of compiling propagate.
  """
  _THREAD.hits = 0
  threshold = getattr(_jax_config, "persistent_cache_min_compile_time_secs", None)
  with (threshold(float("inf")) if keep_out_of_jax_cache and callable(threshold)
        else contextlib.nullcontext()):
    program = lowered.compile()
  return program, _THREAD.hits > 0


def count(*, memory_hit: bool = False, loaded: int = 0, compiled: int = 0) -> None:
  """Adds one lookup to :func:`stats`: found in memory, or built from ``loaded`` programs out of the
  persistent cache and ``compiled`` compiled ones."""
  with _LOCK:
    _STATS.lookups += 1
    if memory_hit:
      _STATS.memory_hits += 1
    else:
      _STATS.programs_loaded += loaded
      _STATS.programs_compiled += compiled


# The directory bass_jax configured (None: off, or not configured yet) and whether it was configured.
_STATE = {"configured": False, "dir": None, "ours": False}


def default_dir() -> pathlib.Path:
  """``$XDG_CACHE_HOME/bass_jax/xla``, or ``~/.cache/bass_jax/xla``."""
  return cache_dirs.default("xla")


def _requested(setting: Any) -> pathlib.Path | None:
  """The directory a setting asks for (None: off): a path; True or None for the environment
  variable's choice or the default; False or one of :data:`OFF` for off.

  Raises:
    ValueError: a setting that is none of these.
  """
  if setting is None or setting is True:
    return cache_dirs.from_env(ENV_VAR, "xla")
  if setting is False:
    return None
  if isinstance(setting, (str, os.PathLike)):
    return cache_dirs.from_text(os.fspath(setting))
  raise ValueError(f"compilation_cache must be a directory, True (the default directory), False "
                   f"(off) or None, got {type(setting).__name__}")


def _writable(path: pathlib.Path) -> str | None:
  """None if ``path`` can hold the cache (created if missing), else why not."""
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
      pass
  except OSError as e:
    return e.strerror or type(e).__name__
  return None


def configure(setting: Any = None) -> pathlib.Path | None:
  """Turns the persistent compilation cache on (in the directory ``setting`` asks for) or off, for
  every compilation of the process from now on.

  Args:
    setting: a directory; True or None: ``$BASS_JAX_COMPILATION_CACHE_DIR`` if set, else
      :func:`default_dir`; False, ``"off"``, ``"0"``, ``"false"``, ``"none"``: off.

  Returns:
    The directory in use, or None when off (asked, or not writable).

  Raises:
    ValueError: a setting of the wrong type.

  A directory that cannot be created or written gives one warning line naming it and the reason, and
  the process runs without the cache. A directory set through JAX itself (``jax_compilation_cache_dir``
  by someone other than bass_jax) is kept when ``setting`` is None and ``$BASS_JAX_COMPILATION_CACHE_DIR``
  names no directory: bass_jax stores its programs and step costs there too where that variable is
  unset; where it says off, JAX's cache keeps serving JAX's own compiles and bass_jax stores nothing
  (JAX keys by the traced program, so monkeypatched code never loads a stale one).
  """
  if _STATE["configured"] and _STATE.get("setting", object()) == setting and setting is not None:
    return _STATE["dir"]  # asked again for what is in force
  path = _requested(setting)
  with _LOCK:
    current = jax.config.jax_compilation_cache_dir
    mine = os.environ.get(ENV_VAR)
    if setting is None and current and not _STATE["ours"] and (mine is None or path is None):
      # The user's own JAX setting stays; bass_jax keeps its programs and step costs there too, unless
      # its own variable says off (then JAX's cache serves JAX's compiles and bass_jax stores nothing).
      _STATE.update(configured=True, dir=None if mine is not None else pathlib.Path(current),
                    ours=False)
      return _STATE["dir"]
    if path is not None:
      why = _writable(path)
      if why is not None:
        warnings.warn(f"bass_jax: compilation cache {path} is not writable ({why}); compiling "
                      f"without it (set {ENV_VAR} to another directory, or to 'off')", stacklevel=3)
        path = None
    wanted = None if path is None else str(path)
    if wanted != (current or None):
      from jax.experimental.compilation_cache import compilation_cache as jax_cache  # pylint: disable=g-import-not-at-top

      jax.config.update("jax_compilation_cache_dir", wanted)
      jax_cache.reset_cache()  # JAX opens its cache once; a new directory needs a new one
      if wanted is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    _STATE.update(configured=True, dir=path, ours=True, setting=setting)
    return path


def ensure_configured() -> pathlib.Path | None:
  """The cache directory in use, configuring the default (:func:`configure`) on the first call."""
  if not _STATE["configured"]:
    return configure(None)
  return _STATE["dir"]


def directory() -> pathlib.Path | None:
  """The persistent cache's directory now (None: off or not configured yet)."""
  return _STATE["dir"]


# --- Measured step costs, beside the cache -----------------------------------------------------------


@functools.lru_cache(maxsize=1)
def code_version() -> str:
  """A digest of the source files of bass_jax and its kernels (their contents): any change of the code
  is a new version."""
  package = pathlib.Path(__file__).resolve().parents[1]
  digest = hashlib.sha256()
  for root in (package, package.parent / "pallas_kernels"):
    for file in sorted(root.rglob("*.py")):
      digest.update(str(file.relative_to(root.parent)).encode())
      digest.update(file.read_bytes())
  return digest.hexdigest()[:16]


def _environment() -> tuple:
  """What besides the code and the setting decides a compiled program: the devices, JAX's version and
  the options that change what JAX traces or XLA compiles."""
  device = jax.devices()[0]
  return (device.platform, device.device_kind, jax.device_count(), jax.process_count(),
          jax.__version__, code_version(), os.environ.get("XLA_FLAGS", ""),
          jax.config.jax_enable_x64, str(jax.config.jax_default_matmul_precision),
          jax.config.jax_threefry_partitionable)


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type())


@functools.lru_cache(maxsize=256)
def _file_digest(file: str, size: int, mtime_ns: int) -> str:
  """The first 16 hex digits of ``file``'s SHA-256, remembered by path, size and modification time."""
  del size, mtime_ns  # the cache key
  return hashlib.sha256(pathlib.Path(file).read_bytes()).hexdigest()[:16]


def _user_code(setting: Any) -> tuple[str, ...] | None:
  """Digests of the source files of every class in ``setting`` (dataclass fields and tuples, walked)
  that lives outside bass_jax: a user's own proposer, draft-length policy or family, whose code
  decides the program as much as bass_jax's does. None where such a class has no source file (one
  defined in a notebook or ``__main__``): its programs are then kept in memory only."""
  digests, seen, stack = set(), set(), [setting]
  while stack:
    value = stack.pop()
    if id(value) in seen:
      continue
    seen.add(id(value))
    if isinstance(value, (tuple, list, frozenset, set)):
      stack.extend(value)
      continue
    if isinstance(value, dict):
      stack.extend(value.values())
      continue
    for cls in type(value).__mro__:
      # Python's own types report "builtins"; so does a class exec'd without a module name, which a
      # class statement made (a heap type; refused below: it has no source file).
      if cls.__module__ == "builtins" and not cls.__flags__ & _HEAP_TYPE:
        continue
      module = sys.modules.get(cls.__module__)
      name = cls.__module__.split(".")[0]
      if name in ("bass_jax", "pallas_kernels", "jax", "jaxlib", "numpy", "flax", "abc", "typing",
                  "enum"):
        continue
      file = getattr(module, "__file__", None)
      if not file or cls.__module__ in ("__main__", "builtins"):  # builtins: a class exec'd bare
        return None
      stat = os.stat(file)
      digests.add(_file_digest(file, stat.st_size, stat.st_mtime_ns))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      stack.extend(getattr(value, f.name) for f in dataclasses.fields(value))
  return tuple(sorted(digests))


def setting_key(setting: Any) -> str | None:
  """A digest of a setting (a measured one, or a program's) with the devices, JAX's version and options,
  bass_jax's code (:func:`code_version`) and the source files of any class of the user's in it
  (:func:`_user_code`); None where the setting has no stable text (an object shown by its address, a
  class without a source file), which is then kept in memory only. Code changed by monkeypatching a
  running process is not seen: turn the cache off for that (the test suite does)."""
  user_code = _user_code(setting)
  if user_code is None:
    return None
  text = repr((setting, _environment(), user_code))
  if " at 0x" in text:
    return None
  return hashlib.sha256(text.encode()).hexdigest()


def stored_key(setting: Any) -> str | None:
  """:func:`setting_key` of ``setting`` where the persistent cache is on; None (kept in memory only)
  where it is off or the setting has no stable key."""
  return None if directory() is None else setting_key(setting)


def _atomic_write(file: pathlib.Path, data: bytes, prefix: str) -> None:
  """Writes ``data`` as ``file`` through a temporary sibling renamed into place (readers see the old
  file or the new one, never a part); the temporary file is removed if the write fails (OSError
  propagates)."""
  fd, name = tempfile.mkstemp(dir=file.parent, prefix=prefix)
  try:
    with os.fdopen(fd, "wb") as out:
      out.write(data)
    os.replace(name, file)
  except BaseException:
    pathlib.Path(name).unlink(missing_ok=True)
    raise


def load_costs(kind: str, setting: Any) -> dict[str, Any] | None:
  """The fields stored for ``setting`` under ``kind`` (``"step_costs"`` or ``"calibration"``), or None
  (not stored, the cache off, an unreadable file)."""
  key = stored_key(setting)
  if key is None:
    return None
  path = _STATE["dir"]
  try:
    entries = json.loads((path / COSTS_FILE).read_text())
  except (OSError, ValueError):
    return None
  entry = entries.get(f"{kind}:{key}") if isinstance(entries, dict) else None
  return entry if isinstance(entry, dict) else None


def store_costs(kind: str, setting: Any, fields: dict[str, Any]) -> None:
  """Stores ``fields`` (JSON values) for ``setting`` under ``kind``; silent where it cannot (the cache
  off, an unwritable directory): the costs are then measured again by the next process."""
  key = stored_key(setting)
  if key is None:
    return
  path = _STATE["dir"]
  with _LOCK:
    try:
      file = path / COSTS_FILE
      try:
        entries = json.loads(file.read_text())
        entries = entries if isinstance(entries, dict) else {}
      except (OSError, ValueError):
        entries = {}
      entries[f"{kind}:{key}"] = fields
      _atomic_write(file, json.dumps(entries, indent=0, sort_keys=True).encode(), ".costs-")
    except OSError:
      pass


# --- Compiled decode programs, by setting -------------------------------------------------------------

PROGRAMS_DIR = "programs"
MAX_PROGRAM_BYTES = 4 << 30  # the oldest stored programs are deleted beyond this


def load_programs(key: str) -> tuple[Any, ...] | None:
  """The compiled programs (``jax.stages.Compiled``) stored under ``key`` (:func:`stored_key` of
  their setting; :func:`store_programs`), loaded onto this process's devices without tracing or
  lowering anything; None when not stored, the cache is off, or the file does not load (it is then
  deleted)."""
  path = _STATE["dir"]
  if path is None:
    return None
  file = path / PROGRAMS_DIR / f"{key}.pkl"
  if not file.exists():
    return None
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top

  try:
    stored = pickle.loads(file.read_bytes())
    # Loading links each executable's code (XLA:CPU), without the GIL: the programs load in parallel.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(stored)) as pool:
      programs = tuple(pool.map(lambda entry: serialize_executable.deserialize_and_load(*entry),
                                stored))
    os.utime(file)  # recently used: kept longest
    return programs
  except Exception:  # pylint: disable=broad-except  (any unreadable entry: compile instead)
    with contextlib.suppress(OSError):
      file.unlink()
    return None


def store_programs(key: str, programs: tuple[Any, ...]) -> threading.Thread | None:
  """Stores compiled programs (``jax.stages.Compiled``) under ``key`` (:func:`stored_key` of their
  setting) beside the persistent cache: serialized here, written in a background thread (the decode
  need not wait for the disk; the process waits for it before exiting; :func:`wait_for_writes`).
  Give it only executables XLA compiled in this process: one JAX loaded from its persistent cache
  serializes without all its code on XLA:CPU (JAX 0.10). Silent where it cannot: the cache off, a
  program that does not serialize, a full disk.

  Returns:
    The writing thread (tests join it), or None when nothing is written.
  """
  path = _STATE["dir"]
  if path is None:
    return None
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top

  try:  # here, before the programs first run; only the write waits for nobody
    blob = pickle.dumps(tuple(serialize_executable.serialize(p) for p in programs))
  except Exception:  # pylint: disable=broad-except  (a program that does not serialize: not stored)
    return None

  def write() -> None:
    try:
      folder = path / PROGRAMS_DIR
      folder.mkdir(parents=True, exist_ok=True)
      _atomic_write(folder / f"{key}.pkl", blob, ".program-")
      _evict(folder)
    except Exception:  # pylint: disable=broad-except  (a cache write never fails a decode)
      pass

  thread = threading.Thread(target=write, name="bass_jax-store-programs")
  thread.start()
  with _LOCK:
    _WRITERS[:] = [t for t in _WRITERS if t.is_alive()] + [thread]
  return thread


_WRITERS: list[threading.Thread] = []


def wait_for_writes() -> None:
  """Returns once every program write started so far has finished."""
  with _LOCK:
    writers = list(_WRITERS)
  for thread in writers:
    thread.join()


def _evict(folder: pathlib.Path) -> None:
  """Deletes the least recently used stored programs beyond :data:`MAX_PROGRAM_BYTES`."""
  files = sorted(folder.glob("*.pkl"), key=lambda f: f.stat().st_mtime, reverse=True)
  total = 0
  for file in files:
    total += file.stat().st_size
    if total > MAX_PROGRAM_BYTES:
      with contextlib.suppress(OSError):
        file.unlink()
