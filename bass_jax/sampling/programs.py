"""The compiled decode programs of :func:`bass_jax.generate`: a bounded LRU whose eviction frees them.

A setting (a :class:`state.DecodeSpec` and the argument shapes) compiles into two XLA programs, the
prefill and the decode. :func:`compiled` lowers and compiles them once and keeps them in a bounded LRU
(:func:`set_compile_cache_size`, default 8 settings; :func:`clear_compile_cache`).

Why a fresh function per setting. ``jax.jit(f).lower(...).compile()`` leaves the program in JAX's own
in-memory caches, a chain of weakref-keyed LRUs (``jax._src``, JAX 0.10): ``pjit._infer_params_cached``
is keyed weakly on ``f`` and holds the traced jaxpr; ``pxla._cached_lowering_to_hlo`` and
``pjit._pjit_lower`` are keyed weakly on that jaxpr and hold the lowered MLIR module;
``pxla._cached_compilation`` is keyed weakly on that module and holds the XLA executable. Every link is
freed only when its key dies, and each of these caches keeps up to 2,048 entries. Jitting the
module-level ``loop.prefill`` and ``loop.decode``, which never die, therefore kept every program ever
compiled: dropping it from our LRU released nothing, each setting kept its JIT-compiled code (a few
hundred memory maps on XLA:CPU; ``python -m experiments.benchmarks.bench_many_programs`` counts them) and a
process died after about a hundred settings, out of maps (``vm.max_map_count``, 65,530: "LLVM compilation error: Cannot allocate
memory"). :func:`compiled` jits a new function object per setting, which dies as soon as the
compilation returns; the chain above then falls away link by link, the LRU holds the only reference to
the executables, and evicting them releases their memory. Other users' jitted functions and their
caches are left alone (no ``jax.clear_caches()``). A setting that was evicted and comes back compiles
again (or loads from the persistent cache, :func:`enable_persistent_compilation_cache`), where JAX's
caches used to hand the kept executable back.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

import jax

from bass_jax import _checks
from bass_jax.sampling import compile_cache
from bass_jax.sampling import loop
from bass_jax.sampling import state as state_lib

DEFAULT_CACHE_SIZE = 8  # settings (a prefill and a decode program each) kept by default


class _ProgramCache:
  """A bounded LRU of compiled ``(prefill, decode)`` programs, keyed by spec and argument shapes.

  The cache holds the only references to its programs (see the module docstring), so an entry that
  leaves it (eviction, :meth:`resize`, :meth:`clear`) frees its executables by reference counting,
  at once, unless a caller still holds them (a :func:`bass_jax.generate` call that is running them).
  """

  def __init__(self, max_size: int = DEFAULT_CACHE_SIZE):
    self.max_size = max_size
    self._programs: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    self._families: dict[Any, tuple[Any, int]] = {}
    self._lock = threading.Lock()

  def get(self, key):
    """The programs under ``key`` (now the most recently used), or None."""
    with self._lock:
      if key in self._programs:
        self._programs.move_to_end(key)
        return self._programs[key]
      return None

  def put(self, key, programs, family: Any = None, prompt_len: int = 0) -> None:
    """Stores ``programs`` under ``key`` as the most recently used, evicting beyond ``max_size``;
    ``family`` and ``prompt_len`` are what :meth:`largest` finds them by."""
    with self._lock:
      self._programs[key] = programs
      self._programs.move_to_end(key)
      self._families[key] = (family, prompt_len)
      while len(self._programs) > self.max_size:
        self._families.pop(self._programs.popitem(last=False)[0], None)

  def largest(self, family: Any) -> int:
    """The largest ``prompt_len`` stored with ``family``, 0 if none."""
    with self._lock:
      return max((p for f, p in self._families.values() if f == family), default=0)

  def clear(self) -> None:
    """Drops every entry."""
    with self._lock:
      self._programs.clear()
      self._families.clear()

  def resize(self, max_size: int) -> None:
    """Keeps at most ``max_size`` entries from now on, evicting the least recently used."""
    with self._lock:
      self.max_size = max_size
      while len(self._programs) > self.max_size:
        self._families.pop(self._programs.popitem(last=False)[0], None)

  def __len__(self) -> int:
    return len(self._programs)


_PROGRAMS = _ProgramCache()


def clear_compile_cache() -> None:
  """Forgets every compiled decode program and frees its memory (the XLA executables and what JAX
  kept for them); the next :func:`bass_jax.generate` call of any setting compiles afresh.

  Other jitted functions keep their compiled programs (JAX's caches are not cleared).
  """
  _PROGRAMS.clear()


def set_compile_cache_size(max_programs: int) -> None:
  """Keeps at most ``max_programs`` compiled settings (each a prefill and a decode program), evicting
  the least recently used now and from now on; an evicted setting's programs are freed.

  Raises:
    ValueError: ``max_programs`` not an int >= 1.
  """
  _PROGRAMS.resize(_checks.as_int("max_programs", max_programs, min_value=1))


def enable_persistent_compilation_cache(path: str | os.PathLike | None = None, *,
                                        min_compile_seconds: float | None = None) -> str | None:
  """Stores compiled programs on disk so that a new process reuses them (JAX's persistent cache).

  The cache is on by default (``compile_cache``: ``$XDG_CACHE_HOME/bass_jax/xla`` or
  ``~/.cache/bass_jax/xla``, or ``$BASS_JAX_COMPILATION_CACHE_DIR``); call this to move it or, with
  ``path="off"``, to turn it off. Scripts take ``--compilation_cache_dir``, ``generate`` its
  ``compilation_cache`` keyword.

  Args:
    path: the cache directory; None: ``$BASS_JAX_COMPILATION_CACHE_DIR`` or the default; ``"off"``:
      no persistent cache.
    min_compile_seconds: programs JAX's cache holds only if they compiled for at least this many
      seconds (default ``compile_cache.MIN_COMPILE_SECONDS``); a one-device decode's programs are
      stored whole whatever their compile time.

  Returns:
    The directory in use, or None when off (asked, or not writable: one warning line).

  Raises:
    ValueError: ``min_compile_seconds`` not a number >= 0, ``path`` of the wrong type.
  """
  if min_compile_seconds is not None:
    min_compile_seconds = _checks.as_float("min_compile_seconds", min_compile_seconds, min_value=0.0)
  directory = compile_cache.configure(True if path is None else path)
  if min_compile_seconds is not None and directory is not None:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
  return None if directory is None else str(directory)


def largest_prompt_len(family: Any) -> int:
  """The largest prompt capacity P of the programs in memory for ``family`` (:func:`family_key`),
  0 if none: a call whose prompts fit it reuses those programs instead of compiling smaller ones."""
  return _PROGRAMS.largest(family)


def family_key(spec: state_lib.DecodeSpec, rows: int) -> Any:
  """What the programs of ``spec`` share with those of the same setting at any prompt capacity: the
  spec less its prompt length (and the admission chunk that follows it), and the rows."""
  return (dataclasses.replace(spec, prompt_len=0, admit_chunk=0), rows)


def _fresh(fn: Callable) -> Callable:
  """A new function object that calls ``fn`` (same name and signature, so the same HLO module name
  and persistent-cache key): JAX's caches are keyed weakly on it, and it dies after compiling."""

  @functools.wraps(fn)
  def call(*args):
    return fn(*args)

  return call


class Built(NamedTuple):
  """What :func:`compiled` returns.

  Attributes:
    programs: ``(prefill, decode)``, two ``jax.stages.Compiled``.
    seconds: wall seconds spent lowering and compiling or loading them (0.0 from memory).
    source: ``"memory"`` (the LRU), ``"disk"`` (every XLA program from the persistent cache),
      ``"compiled"`` (XLA compiled them) or ``"partly disk"``.
  """

  programs: tuple[Any, Any]
  seconds: float
  source: str


# Called as fn(event, description, seconds, source) with event "start" (seconds 0, source "") or
# "done": what scripts show while a program compiles (:func:`reporting`).
_REPORTERS: list[Callable[[str, str, float, str], None]] = []
_LOG = logging.getLogger("bass_jax")


@contextlib.contextmanager
def reporting(fn: Callable[[str, str, float, str], None]):
  """Within the block, ``fn(event, description, seconds, source)`` is called when a decode's programs
  start to build (``event="start"``) and when they are built (``"done"``, with :class:`Built`'s
  seconds and source); programs found in memory report nothing. The same lines go to the
  ``bass_jax`` logger at INFO whatever the block."""
  _REPORTERS.append(fn)
  try:
    yield
  finally:
    _REPORTERS.remove(fn)


def printing(stream: Any = None):
  """:func:`reporting` that writes one line per build to ``stream`` (default ``sys.stderr``):
  ``bass_jax: compiling the BASS decode, 4 rows, prompts <= 128 tokens ... compiled in 7.2 s`` (or
  ``loaded from the compilation cache in 0.9 s``), the start written as it begins so that a compile is
  never mistaken for a hang."""

  def show(event: str, description: str, seconds: float, source: str) -> None:
    out = sys.stderr if stream is None else stream
    if event == "start":
      out.write(f"bass_jax: compiling the {description} ...")
    else:
      out.write(f" {outcome(source, seconds)}\n")
    out.flush()

  return reporting(show)


def describe(spec: state_lib.DecodeSpec, rows: int) -> str:
  """``"BASS decode, 4 rows, prompts <= 128 tokens"``: what a program is, in a user's terms."""
  kind = "BASS" if spec.proposer.proposes else "regular"
  return f"{kind} decode, {rows} rows, prompts <= {spec.prompt_len} tokens"


def outcome(source: str, seconds: float) -> str:
  """How a build ended, in words: ``"compiled in 7.2 s"``, ``"loaded from the compilation cache in
  0.9 s"`` (``source`` as :class:`Built` gives it; ``seconds`` of wall time)."""
  how = "loaded from the compilation cache" if source == "disk" else source
  return f"{how} in {seconds:.1f} s"


def _report(event: str, description: str, seconds: float = 0.0, source: str = "") -> None:
  if event == "start":
    _LOG.info("compiling the %s ...", description)
  else:
    _LOG.info("%s: %s", description, outcome(source, seconds))
  for fn in list(_REPORTERS):
    fn(event, description, seconds, source)


def compiled(spec: state_lib.DecodeSpec, args_prefill: tuple, args_decode_tail: tuple) -> Built:
  """Compiled ``(prefill, decode)`` for this spec and these shapes, and how long they took.

  Args:
    spec: the static settings of the decode.
    args_prefill: the arguments of ``loop.prefill`` after ``spec`` (arrays or
      ``jax.ShapeDtypeStruct``; only shapes, dtypes and shardings count); the last is the
      ``DecodeInputs``, whose ``inert`` gives the rows.
    args_decode_tail: the arguments of ``loop.decode`` after ``spec`` and the state.

  Returns:
    :class:`Built`: the two ``jax.stages.Compiled`` programs, the wall seconds spent lowering and
    compiling (or loading) them, 0.0 when they came from memory, and where they came from.

  Programs an earlier process built for this key on one device are loaded as they were stored
  (``compile_cache.load_programs``: nothing traced, lowered or compiled); otherwise the two programs
  are lowered here and compiled in two threads (XLA compiles without holding the GIL), so a first
  call waits for the slower of the two, not for both, and stored whole for the next process in the
  background (kept out of JAX's own persistent cache then; a mesh's programs, a process with several
  devices and a setting without a stable key use JAX's cache instead). On a mesh both programs
  return the state laid out by ``state.state_shardings``, and the decode takes it so. The programs are
  jitted from fresh function objects, so that JAX keeps nothing of them once the LRU drops them
  (module docstring). Every call counts in ``compile_cache.stats()``. Errors of tracing, lowering or
  compiling propagate (nothing is cached then).
  """
  # An executable takes its inputs in one layout: where they lie is part of the key.
  shapes = jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype), str(getattr(x, "sharding", ""))),
                                  (args_prefill, args_decode_tail))
  key = (spec, str(shapes))
  cached = _PROGRAMS.get(key)
  if cached is not None:
    compile_cache.count(memory_hit=True)
    return Built(cached, 0.0, "memory")
  rows = int(args_prefill[-1].inert.shape[0])
  description = describe(spec, rows)
  # A mesh's programs, and any program of a process with several devices (an executable is loaded
  # onto the devices it names), are left to JAX's own cache.
  # A setting without a stable key (a notebook's class) is kept in memory, and in JAX's cache.
  one_device = spec.target_sharding is None and jax.device_count() == 1
  digest = compile_cache.stored_key(key) if one_device else None
  _report("start", description)
  start = time.perf_counter()
  programs = None if digest is None else compile_cache.load_programs(digest)
  if programs is not None:
    loaded = len(programs)
  else:
    programs, loaded = _build(spec, args_prefill, args_decode_tail, stored=digest is not None)
    # Only programs XLA compiled here: an executable JAX loaded from its own cache serializes without
    # all of its code on XLA:CPU, and a program stored from it fails when run ("Function ... not
    # found"; tests/test_compile_cache.py).
    if digest is not None and not loaded:
      compile_cache.store_programs(digest, programs)
  seconds = time.perf_counter() - start
  source = ("disk" if loaded == len(programs) else "partly disk" if loaded else "compiled")
  compile_cache.count(loaded=loaded, compiled=len(programs) - loaded)
  _PROGRAMS.put(key, programs, family_key(spec, rows), spec.prompt_len)
  _report("done", description, seconds, source)
  return Built(programs, seconds, source)


def _build(spec: state_lib.DecodeSpec, args_prefill: tuple, args_decode_tail: tuple,
           stored: bool = False):
  """:func:`compiled`'s lowering and compiling: ``((prefill, decode), programs loaded from disk)``;
  ``stored``: the programs will be stored whole, so JAX does not write them into its own cache."""
  prefill, decode = lowered(spec, args_prefill, args_decode_tail)
  compile_one = functools.partial(compile_cache.compile_counting, keep_out_of_jax_cache=stored)
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    built = list(pool.map(compile_one, (prefill, decode)))
  del prefill, decode  # the lowered stages hold the fresh functions
  return tuple(b[0] for b in built), sum(b[1] for b in built)


def lowered(spec: state_lib.DecodeSpec, args_prefill: tuple, args_decode_tail: tuple,
            compiler_options: dict[str, str] | None = None) -> tuple[Any, Any]:
  """The prefill and decode programs of ``spec`` traced and lowered (``jax.stages.Lowered``), as
  :func:`compiled` compiles them (``experiments.benchmarks.bench_compile`` times the two stages).

  Args:
    spec, args_prefill, args_decode_tail: as :func:`compiled`.
    compiler_options: XLA options over the spec's own (``DecodeSpec.xla_options``), name -> value.

  Returns:
    ``(prefill, decode)``, two ``jax.stages.Lowered``; the decode donates its state.

  Raises:
    Whatever tracing or lowering raises (a shape the model does not take, an unknown XLA option
    only when compiled).
  """
  mesh = None if spec.target_sharding is None else spec.target_sharding.mesh
  # The profile's options (None: XLA's defaults), and the caller's over them.
  placed = {"compiler_options": {**(spec.xla_options or {}), **(compiler_options or {})} or None}
  # Traced under the decode's own mesh (Auto axes), whatever mesh the caller set with jax.set_mesh.
  with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
    if mesh is not None:  # the prefill's outputs placed by shardings computed from their shapes
      shapes = jax.eval_shape(lambda *a: loop.prefill(spec, *a), *args_prefill)
      placed["out_shardings"] = state_lib.state_shardings(spec, shapes)
    traced = jax.jit(_fresh(loop.prefill), static_argnums=0, **placed).trace(spec, *args_prefill)
    prefill = traced.lower()
    # The decode's state is what the prefill returns: its shapes, and on a mesh its shardings.
    decode = jax.jit(_fresh(loop.decode), static_argnums=0, donate_argnums=1, **placed).lower(
        spec, traced.out_info, *args_decode_tail)
  return prefill, decode
