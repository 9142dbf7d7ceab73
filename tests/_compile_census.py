"""Where the suite's time goes: seconds JAX spends tracing, lowering and compiling, per test file.

``BASS_JAX_COMPILE_CENSUS=<directory> make test``, with a fresh directory, turns it on
(tests/conftest.py registers :class:`Census` in every pytest process: xdist's workers, the 8-device
child suite, test_cli's child). Each process that saw a compile writes ``<directory>/<pid>.json``
when it ends::

    {"test_generate.py": {"trace": s, "lower": s, "compile": s, "init": s}, ...}

- ``trace``, ``lower``, ``compile``: JAX's own compile events (``jax.monitoring``'s
  ``/jax/core/compile/jaxpr_trace_duration``, ``jaxpr_to_mlir_module_duration`` and
  ``backend_compile_duration``: building the jaxpr, lowering it to StableHLO, XLA's passes and code
  generation), in seconds, summed over the file's tests (setup and teardown included). They are
  summed over threads: bass_jax compiles a setting's prefill and decode programs in two threads at
  once, so a file's sum can exceed its wall time.
- ``init``: the part of those three spent on :func:`bass_jax.init_params`' programs (one per model
  config and process: random weights for the tests' tiny models), told apart by the name JAX's
  events carry (``bass_jax.models.model.INIT_PROGRAM``, or ``jit(...)`` of it).

Events outside any test (collection) go under ``"(outside tests)"``. Scripts the tests run as
subprocesses are their own processes and are not counted. ``python tests/suite_times.py
--census=<directory>`` prints the per-file table (docs/testing.md, "Measuring").
"""

from __future__ import annotations

import collections
import json
import os
import threading

import pytest

ENV_VAR = "BASS_JAX_COMPILE_CENSUS"
OUTSIDE = "(outside tests)"
PHASES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "compile"}


class Census:
  """A pytest plugin summing JAX's compile events per test file, written to
  ``directory``/<pid>.json when pytest ends (:meth:`pytest_unconfigure`).

  Args:
    directory: where each process writes its file (created if missing); give a fresh one per
      run, since suite_times.py --census sums every file it finds there.
  """

  def __init__(self, directory: str):
    from jax import monitoring  # pylint: disable=g-import-not-at-top

    from bass_jax.models import model  # pylint: disable=g-import-not-at-top

    self.init_names = (model.INIT_PROGRAM, f"jit({model.INIT_PROGRAM})")
    self.directory = directory
    self.file = OUTSIDE
    self.seconds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    self._lock = threading.Lock()  # compiles report from several threads
    self._open = True
    monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_duration(self, event: str, seconds: float, fun_name: str = "", **kwargs) -> None:
    del kwargs
    phase = PHASES.get(event)
    if phase:
      with self._lock:
        self.seconds[self.file][phase] += seconds
        if fun_name in self.init_names:
          self.seconds[self.file]["init"] += seconds

  @pytest.hookimpl(wrapper=True)
  def pytest_runtest_protocol(self, item, nextitem):
    del nextitem
    self.file = item.path.name
    try:
      return (yield)
    finally:
      self.file = OUTSIDE

  def write(self) -> str:
    """Writes the sums so far to ``directory``/<pid>.json; returns its path."""
    os.makedirs(self.directory, exist_ok=True)
    path = os.path.join(self.directory, f"{os.getpid()}.json")
    with self._lock, open(path, "w") as f:
      json.dump({k: dict(v) for k, v in self.seconds.items()}, f, indent=1)
    return path

  def close(self) -> None:
    """Stops counting (JAX's listener removed); a second call does nothing."""
    from jax import monitoring  # pylint: disable=g-import-not-at-top

    if self._open:
      monitoring.unregister_event_duration_listener(self._on_duration)
      self._open = False

  def pytest_unconfigure(self, config) -> None:
    del config
    if self.seconds:  # xdist's controller compiles nothing and writes nothing
      self.write()
    self.close()
