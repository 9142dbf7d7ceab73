"""The suite's zygote (tests/_zygote.py): a script started with conftest.PYTHON runs as `python` would
run it (argv, directory, environment, streams, exit status, signals), in a forked worker where it
can and in a fresh interpreter where it cannot."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import _zygote
from conftest import PYTHON, script_pid, send_signal

pytestmark = pytest.mark.skipif(os.environ.get(_zygote.ENV_VAR, "off") == "off",
                                reason=f"{_zygote.ENV_VAR}=off: every script runs in a fresh interpreter")

# What a script reports of itself: whether it started with the zygote's libraries imported, and what
# a fresh interpreter would have set up.
_REPORT = """
import json, os, sys
preloaded = "transformers" in sys.modules
import jax
print(json.dumps({"preloaded": preloaded, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "mine": os.environ.get("ZYGOTE_TEST_VALUE"), "x64": jax.config.jax_enable_x64,
                  "pid": os.getpid(), "name": __name__}))
"""


def _run(args, **kw):
  kw.setdefault("env", dict(os.environ))
  return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=120, **kw)


def test_a_script_runs_forked_with_its_own_argv_directory_environment_and_jax_settings(tmp_path):
  env = dict(os.environ, ZYGOTE_TEST_VALUE="42", JAX_ENABLE_X64="1")
  run = _run(["-c", _REPORT, "a", "b c"], cwd=tmp_path, env=env)
  assert run.returncode == 0, run.stderr
  got = json.loads(run.stdout)
  assert got["preloaded"], "the script did not start in the zygote's worker"
  assert got["argv"] == ["-c", "a", "b c"] and got["path0"] == "" and got["name"] == "__main__"
  assert got["cwd"] == str(tmp_path) and got["mine"] == "42"
  assert got["x64"] is True  # JAX_* read again from the worker's environment
  quiet = _run(["-c", "from transformers.utils import logging; print(logging.get_verbosity())"],
               env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"))
  assert quiet.stdout == "40\n"  # and transformers' verbosity, which the scripts set for their children
  # -m and a script path, as python takes them
  (tmp_path / "script.py").write_text(_REPORT)
  (tmp_path / "zygote_test_module.py").write_text(_REPORT)
  by_path = json.loads(_run([str(tmp_path / "script.py"), "x"], cwd=tmp_path).stdout)
  assert by_path["argv"] == [str(tmp_path / "script.py"), "x"] and by_path["path0"] == str(tmp_path)
  by_module = json.loads(_run(["-m", "zygote_test_module", "y"], cwd=tmp_path).stdout)
  assert by_module["argv"] == [str(tmp_path / "zygote_test_module.py"), "y"]
  assert by_module["x64"] is False and by_module["preloaded"]  # nothing leaks from the other worker


def test_exit_statuses_exceptions_and_streams_are_pythons():
  assert _run(["-c", "import sys; sys.exit(3)"]).returncode == 3
  said = _run(["-c", "import sys; sys.exit('a message')"])
  assert said.returncode == 1 and said.stderr == "a message\n"
  raised = _run(["-c", "print('out'); raise ValueError('bad value')"])
  assert raised.returncode == 1 and raised.stdout == "out\n"
  assert "Traceback" in raised.stderr and raised.stderr.strip().endswith("ValueError: bad value")
  echoed = subprocess.run([PYTHON, "-c", "import sys; print(sys.stdin.read()[::-1])"], input="abc",
                          capture_output=True, text=True, timeout=60)
  assert echoed.stdout == "cba\n"
  exited = _run(["-c", "import atexit; atexit.register(print, 'at exit')"])
  assert exited.stdout == "at exit\n"


def test_signals_reach_the_script():
  """SIGINT through the launcher is the script's KeyboardInterrupt (its handler runs); SIGKILL sent
  with send_signal kills the script itself, and the launcher reports it as the script's status."""
  waits = ("import signal, sys, time\n"
           "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
           "try:\n  print('ready', flush=True)\n  time.sleep(60)\n"
           "except KeyboardInterrupt:\n  print('interrupted', flush=True)\n"
           "  sys.exit(5)\n")
  for sig, status in ((signal.SIGINT, 5), (signal.SIGKILL, -signal.SIGKILL)):
    proc = subprocess.Popen([PYTHON, "-c", waits], stdout=subprocess.PIPE, text=True)
    try:
      assert proc.stdout.readline() == "ready\n"
      worker = script_pid(proc)
      assert worker != proc.pid  # forked: the launcher's pid is not the script's
      (proc.send_signal if sig == signal.SIGINT else lambda s: send_signal(proc, s))(sig)
      assert proc.wait(timeout=30) == status
    finally:
      proc.kill()
      proc.stdout.close()
    if sig == signal.SIGKILL:
      deadline = time.time() + 10
      while os.path.exists(f"/proc/{worker}") and time.time() < deadline:
        time.sleep(0.05)
      assert not os.path.exists(f"/proc/{worker}")


def test_a_worker_whose_launcher_is_killed_is_killed_too():
  proc = subprocess.Popen([PYTHON, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                          stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline() == "ready\n"
    worker = script_pid(proc)
    proc.kill()
    proc.wait(timeout=30)
  finally:
    proc.stdout.close()
  deadline = time.time() + 10
  while os.path.exists(f"/proc/{worker}") and time.time() < deadline:
    time.sleep(0.05)
  assert not os.path.exists(f"/proc/{worker}"), "the worker outlived its launcher"


@pytest.mark.parametrize("change", [{"HF_HOME": "/nonexistent/hf"}, {"PYTHONPATH": "/nonexistent"}])
def test_an_environment_the_preloaded_libraries_read_at_import_gets_a_fresh_interpreter(change):
  """transformers reads HF_HOME when imported, Python PYTHONPATH at start: a script whose values
  differ from the zygote's is not forked."""
  run = _run(["-c", _REPORT], env=dict(os.environ, **change))
  assert run.returncode == 0, run.stderr
  assert not json.loads(run.stdout)["preloaded"]
  off = _run(["-c", _REPORT], env=dict(os.environ, **{_zygote.ENV_VAR: "off"}))
  assert not json.loads(off.stdout)["preloaded"]


def test_the_launcher_is_the_scripts_own_python():
  """A script's children (bench_gpu's steps, say) start from the zygote too."""
  run = _run(["-c", "import sys; print(sys.executable)"])
  assert run.stdout.strip() == PYTHON != sys.executable
