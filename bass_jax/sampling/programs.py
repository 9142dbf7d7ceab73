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
import functools
import os
import threading
import time
from typing import Any, Callable

import jax

from bass_jax import _checks
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
    self._lock = threading.Lock()

  def get(self, key):
    """The programs under ``key`` (now the most recently used), or None."""
    with self._lock:
      if key in self._programs:
        self._programs.move_to_end(key)
        return self._programs[key]
      return None

  def put(self, key, programs) -> None:
    """Stores ``programs`` under ``key`` as the most recently used, evicting beyond ``max_size``."""
    with self._lock:
      self._programs[key] = programs
      self._programs.move_to_end(key)
      while len(self._programs) > self.max_size:
        self._programs.popitem(last=False)

  def clear(self) -> None:
    """Drops every entry."""
    with self._lock:
      self._programs.clear()

  def resize(self, max_size: int) -> None:
    """Keeps at most ``max_size`` entries from now on, evicting the least recently used."""
    with self._lock:
      self.max_size = max_size
      while len(self._programs) > self.max_size:
        self._programs.popitem(last=False)

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
                                        min_compile_seconds: float = 0.5) -> str:
  """Stores compiled programs on disk so that a new process reuses them (JAX's persistent cache).

  The same as setting JAX's ``jax_compilation_cache_dir`` (or the environment variable
  ``JAX_COMPILATION_CACHE_DIR`` before starting Python); scripts take ``--compilation_cache_dir``.

  Args:
    path: the cache directory; default ``$BASS_JAX_COMPILATION_CACHE_DIR`` or
      ``~/.cache/bass_jax/xla``. Call before the first compilation.
    min_compile_seconds: programs that compiled faster than this are not stored.

  Returns:
    The directory in use.

  Raises:
    ValueError: ``min_compile_seconds`` not a number >= 0.
  """
  min_compile_seconds = _checks.as_float("min_compile_seconds", min_compile_seconds, min_value=0.0)
  path = str(path or os.environ.get("BASS_JAX_COMPILATION_CACHE_DIR")
             or os.path.join(os.path.expanduser("~"), ".cache", "bass_jax", "xla"))
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def _fresh(fn: Callable) -> Callable:
  """A new function object that calls ``fn`` (same name and signature, so the same HLO module name
  and persistent-cache key): JAX's caches are keyed weakly on it, and it dies after compiling."""

  @functools.wraps(fn)
  def call(*args):
    return fn(*args)

  return call


def compiled(spec: state_lib.DecodeSpec, args_prefill: tuple,
             args_decode_tail: tuple) -> tuple[tuple[Any, Any], float]:
  """Compiled ``(prefill, decode)`` for this spec and these shapes, and the seconds spent compiling.

  Args:
    spec: the static settings of the decode.
    args_prefill: the arguments of ``loop.prefill`` after ``spec`` (arrays or
      ``jax.ShapeDtypeStruct``; only shapes, dtypes and shardings count).
    args_decode_tail: the arguments of ``loop.decode`` after ``spec`` and the state.

  Returns:
    ``((prefill, decode), seconds)``: the two ``jax.stages.Compiled`` programs, and the wall seconds
    spent lowering and compiling them (0.0 when they came from the cache).

  The two programs are lowered here and compiled in two threads (XLA compiles without holding the
  GIL), so a first call waits for the slower of the two, not for both. On a mesh both programs return
  the state laid out by ``state.state_shardings``, and the decode takes it so. The programs are jitted
  from fresh function objects, so that JAX keeps nothing of them once the LRU drops them (module
  docstring). Errors of tracing, lowering or compiling propagate (nothing is cached then).
  """
  # An executable takes its inputs in one layout: where they lie is part of the key.
  shapes = jax.tree_util.tree_map(lambda x: (x.shape, str(x.dtype), str(getattr(x, "sharding", ""))),
                                  (args_prefill, args_decode_tail))
  key = (spec, str(shapes))
  cached = _PROGRAMS.get(key)
  if cached is not None:
    return cached, 0.0
  start = time.perf_counter()
  mesh = None if spec.target_sharding is None else spec.target_sharding.mesh
  # Traced under the decode's own mesh (Auto axes), whatever mesh the caller set with jax.set_mesh.
  with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):
    state_shape = jax.eval_shape(lambda *a: loop.prefill(spec, *a), *args_prefill)
    placed = {}
    if mesh is not None:
      shardings = state_lib.state_shardings(spec, state_shape)
      placed = {"out_shardings": shardings}
      state_shape = jax.tree_util.tree_map(
          lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_shape, shardings)
    placed["compiler_options"] = spec.xla_options  # the profile's (None: XLA's defaults)
    prefill = jax.jit(_fresh(loop.prefill), static_argnums=0, **placed).lower(spec, *args_prefill)
    decode = jax.jit(_fresh(loop.decode), static_argnums=0, donate_argnums=1, **placed).lower(
        spec, state_shape, *args_decode_tail)
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    programs = tuple(pool.map(lambda lowered: lowered.compile(), (prefill, decode)))
  del prefill, decode  # the lowered stages hold the fresh functions
  _PROGRAMS.put(key, programs)
  return programs, time.perf_counter() - start
