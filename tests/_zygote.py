"""Python processes for the suite's command-line tests, forked from one that has already imported the
libraries (a zygote), so that each saves the seconds a fresh interpreter spends importing them.

A test that runs a script starts ``[PYTHON, "-m", module, ...]`` with :mod:`subprocess` as before,
where ``PYTHON`` (``conftest.PYTHON``) is a launcher written by :func:`start`: a light client
(``python -S``, the standard library only) that passes its argv, working directory, environment and
its stdin, stdout and stderr (as file descriptors) to the zygote over a Unix socket. The zygote forks
a monitor, which forks the worker: the worker takes the client's descriptors, directory and
environment, and runs the module, ``-c`` code or script as ``__main__`` as ``python`` would; the
client forwards the catchable signals it receives (SIGINT, SIGTERM, ...) to the worker, and ends
with the worker's exit status (or by the same signal). A worker whose client goes away is killed.

What it saves, per test file, is in docs/testing.md ("Scripts start from a zygote"), from two
``make test`` runs.

What a forked worker does not share with a fresh interpreter, and how it is handled:
- state read from the environment when a preloaded module was imported: JAX's configuration
  (``JAX_*``) is read again from the worker's environment; a worker whose environment differs from
  the zygote's in anything else that a preloaded library reads at import (:data:`IMPORT_TIME_ENV`)
  is not forked: the client runs the real interpreter instead (also when no zygote is running, or
  for an interpreter option other than ``-m``, ``-c`` or a script path);
- the random generators of ``random`` and NumPy's global state are reseeded;
- SIGKILL cannot be forwarded: a test that kills a script with it signals the worker itself
  (:func:`worker_pid`, ``conftest.send_signal``).

Set ``BASS_JAX_TEST_ZYGOTE=off`` to run every script in a fresh interpreter.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys

ENV_VAR = "BASS_JAX_TEST_ZYGOTE"  # the zygote's socket path; "off": no zygote
LAUNCHER_ENV_VAR = "BASS_JAX_TEST_PYTHON"  # the launcher's path, for processes that inherit the zygote
# Variables that libraries the zygote preloads read when they are imported (prefixes): a worker whose
# value differs from the zygote's runs in a fresh interpreter instead.
IMPORT_TIME_ENV = ("HF_", "TRANSFORMERS_", "HUGGINGFACE_", "TOKENIZERS_", "TORCH", "PYTORCH_", "OMP_",
                   "MKL_", "OPENBLAS_", "PYTHON", "XDG_", "HOME", "TF_", "CUDA_", "NVIDIA_", "FLAX_",
                   "ABSL_", "TQDM_", "TZ", "LANG", "LC_")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
_MAX_MESSAGE = 1 << 24


# Of those, the ones a worker applies again (the scripts set TRANSFORMERS_VERBOSITY for their children),
# and the ones read only when used, never at import (PyTorch's compiler sets its cache directory in
# the environment of a test process that ran it).
REAPPLIED = ("TRANSFORMERS_VERBOSITY",)
READ_WHEN_USED = ("TORCHINDUCTOR_", "TRITON_")


def _import_time_env(env: dict[str, str], jax_names=()) -> dict[str, str]:
  """The variables of :data:`IMPORT_TIME_ENV` but :data:`REAPPLIED` and :data:`READ_WHEN_USED`, and
  those of ``jax_names`` (JAX's, set in the zygote's environment: one a worker removes or changes
  cannot be applied to JAX's configuration again)."""
  return {k: v for k, v in env.items()
          if (k.startswith(IMPORT_TIME_ENV) and k not in REAPPLIED and not k.startswith(READ_WHEN_USED))
          or k in jax_names}


def _send(sock: socket.socket, payload: dict, fds: list[int]) -> None:
  data = json.dumps(payload).encode()
  sock.sendmsg([struct.pack("!I", len(data)), data],
               [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _recv(sock: socket.socket) -> tuple[dict, list[int]]:
  fds = array.array("i")
  head, ancillary, _, _ = sock.recvmsg(4, socket.CMSG_LEN(16 * fds.itemsize))
  for level, kind, data in ancillary:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
      fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
  (size,) = struct.unpack("!I", head)
  if size > _MAX_MESSAGE:
    raise ValueError(f"zygote: a request of {size} bytes")
  body = b""
  while len(body) < size:
    chunk = sock.recv(size - len(body))
    if not chunk:
      raise EOFError("zygote: the client went away mid-request")
    body += chunk
  return json.loads(body), list(fds)


# -- the client: what the launcher runs in place of python --------------------------------------------


def _forkable(args: list[str]) -> bool:
  if not args:
    return False
  if args[0] in ("-m", "-c"):
    return len(args) >= 2
  return not args[0].startswith("-")


def _wait_until_ready(path: str, limit_s: float = 60.0) -> None:
  """Waits while the zygote is alive and still importing (its socket not there yet)."""
  import time  # pylint: disable=g-import-not-at-top

  try:
    with open(os.path.join(os.path.dirname(path), "zygote.pid")) as f:
      pid = int(f.read())
  except (OSError, ValueError):
    return
  deadline = time.monotonic() + limit_s
  while not os.path.exists(path) and time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except OSError:
      return  # it died: a fresh interpreter
    time.sleep(0.05)


def client(args: list[str]) -> None:
  """Runs ``python args`` in a worker forked from the zygote (or in a fresh interpreter where it
  cannot), and exits as that worker did."""
  path = os.environ.get(ENV_VAR, "off")
  real = [sys.executable, *args]
  if path == "off" or not _forkable(args):
    os.execv(sys.executable, real)
  # A signal that arrives before the worker's pid is known is delivered once it is. Signals this
  # process inherited ignored (a suite run in the background ignores SIGINT) stay ignored in the
  # worker, as in a fresh interpreter.
  ignored = [int(sig) for sig in FORWARDED if signal.getsignal(sig) == signal.SIG_IGN]
  worker = None
  pending = []

  def forward(sig, frame):
    del frame
    if worker is None:
      pending.append(sig)
      return
    try:
      os.kill(worker, sig)
    except ProcessLookupError:
      pass

  for sig in FORWARDED:
    signal.signal(sig, forward)
  _wait_until_ready(path)
  sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    sock.connect(path)
    _send(sock, {"argv": args, "cwd": os.getcwd(), "env": dict(os.environ), "ignored": ignored},
          [0, 1, 2])
    reply = sock.makefile("rb")
    first = reply.readline().decode().split()
  except OSError:
    first = []
  if not first or first[0] != "pid":  # no zygote, or it declined ("fresh"): a real interpreter
    sock.close()
    for sig in FORWARDED:
      signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    for sig in pending:  # what a fresh interpreter would have received first
      os.kill(os.getpid(), sig)
    os.execv(sys.executable, real)
  with open(os.path.join(os.path.dirname(path), f"worker.{os.getpid()}"), "w") as f:
    f.write(first[1])
  worker = int(first[1])
  for sig in pending:
    forward(sig, None)
  line = reply.readline().decode().split()
  try:
    os.unlink(os.path.join(os.path.dirname(path), f"worker.{os.getpid()}"))
  except OSError:
    pass
  if len(line) != 2 or line[0] != "exit":
    sys.stderr.write("zygote: the worker's exit status was lost\n")
    os._exit(1)
  status = int(line[1])
  if status < 0:  # killed by a signal: by the same one, so that the parent sees the same status
    if -status not in (signal.SIGKILL, signal.SIGSTOP):
      signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
  os._exit(status)


def worker_pid(client_pid: int, wait_s: float = 10.0) -> int | None:
  """The pid of the worker that runs a client's script (None: it runs in the client itself).

  The client writes the pid once the zygote names the worker, and the worker may already be running
  the script by then (a script's first output can reach the caller first on a busy machine): while
  the client is still the launcher (not the fresh interpreter it becomes where the zygote declines),
  this waits up to ``wait_s`` seconds for it.
  """
  import time  # pylint: disable=g-import-not-at-top

  path = os.environ.get(ENV_VAR, "off")
  if path == "off":
    return None
  deadline = time.monotonic() + wait_s
  while True:
    try:
      with open(os.path.join(os.path.dirname(path), f"worker.{client_pid}")) as f:
        return int(f.read())
    except (OSError, ValueError):
      pass
    if time.monotonic() > deadline or not _is_launcher(client_pid):
      return None
    time.sleep(0.01)


def _is_launcher(pid: int) -> bool:
  """Whether process ``pid`` still runs this file's client, as the launcher :func:`start` writes
  starts it (``python -S <this file> client ...``), from its command line."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      argv = f.read().split(b"\0")
  except OSError:
    return False
  return argv[2:4] == [os.path.abspath(__file__).encode(), b"client"]


# -- the zygote -------------------------------------------------------------------------------------


PRELOAD = ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "safetensors.numpy", "torch",
           "transformers", "transformers.models.auto.configuration_auto",
           "transformers.models.auto.tokenization_auto", "transformers.tokenization_utils_fast",
           "transformers.models.llama.configuration_llama", "absl.app", "absl.flags", "absl.logging",
           "tqdm", "orbax.checkpoint", "gguf", "pytest", "bass_jax", "bass_jax.checkpoints.config_schema")


def _apply_env(env: dict[str, str]) -> None:
  """JAX reads ``JAX_*`` into its configuration when it is imported, transformers its verbosity:
  read them again."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformers.utils import logging as hf_logging  # pylint: disable=g-import-not-at-top

  level = env.get("TRANSFORMERS_VERBOSITY")
  if level in hf_logging.log_levels:
    hf_logging.set_verbosity(hf_logging.log_levels[level])

  for key, text in env.items():
    name = key.lower()
    if not key.startswith("JAX_") or name not in jax.config.values:
      continue
    current = jax.config.values[name]
    if isinstance(current, bool):
      value = text.lower() in ("y", "yes", "t", "true", "on", "1")
    elif isinstance(current, int):
      value = int(text)
    elif isinstance(current, float):
      value = float(text)
    else:
      value = text
    jax.config.update(name, value)


def _run_worker(request: dict, fds: list[int], launcher: str) -> None:
  """In the forked worker: become ``python argv`` and never return."""
  import atexit  # pylint: disable=g-import-not-at-top
  import random  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  import numpy as np  # pylint: disable=g-import-not-at-top

  # The zygote's sys.stdin, sys.stdout and sys.stderr (and every logging handler made at import
  # over them) write to descriptors 0-2, which now are the client's.
  for target, fd in zip((0, 1, 2), fds):
    os.dup2(fd, target)
  for fd in fds:
    if fd > 2:
      os.close(fd)
  for sig in FORWARDED + (signal.SIGCHLD,):
    signal.signal(sig, signal.SIG_IGN if sig in request.get("ignored", ()) else signal.SIG_DFL)
  if signal.SIGINT not in request.get("ignored", ()):
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as at start-up
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  _apply_env(request["env"])
  random.seed()
  np.random.seed()
  sys.executable = launcher  # the script's own children come here too
  argv = request["argv"]
  code = 0
  try:
    if argv[0] == "-m":
      sys.argv = [argv[1], *argv[2:]]
      sys.path[0] = os.getcwd()
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
      sys.argv = ["-c", *argv[2:]]
      sys.path[0] = ""
      main = {"__name__": "__main__", "__builtins__": __builtins__}
      exec(compile(argv[1], "<string>", "exec"), main)  # pylint: disable=exec-used
    else:
      sys.argv = list(argv)
      sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
      runpy.run_path(argv[0], run_name="__main__")
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except KeyboardInterrupt:
    sys.excepthook(*sys.exc_info())
    code = -signal.SIGINT
  except BaseException:  # pylint: disable=broad-except
    sys.excepthook(*sys.exc_info())
    code = 1
  try:
    threading._shutdown()  # pylint: disable=protected-access  # as the interpreter does at exit
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    if code < 0:
      signal.signal(-code, signal.SIG_DFL)
      os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def _monitor(conn: socket.socket, request: dict, fds: list[int], launcher: str) -> None:
  """In the forked monitor: fork the worker, report its pid and its exit status; kill it if the
  client goes away first. Never returns."""
  import select  # pylint: disable=g-import-not-at-top

  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  pid = os.fork()
  if pid == 0:
    conn.close()
    _run_worker(request, fds, launcher)
  for fd in fds:
    os.close(fd)
  try:
    conn.sendall(f"pid {pid}\n".encode())
    while True:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        break
      readable, _, _ = select.select([conn], [], [], 0.05)
      if readable and not conn.recv(1):  # the client went away
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os._exit(0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    conn.sendall(f"exit {code}\n".encode())
  finally:
    os._exit(0)


def serve(path: str, launcher: str) -> None:
  """The zygote: preload, then fork a monitor per request until killed."""
  import gc  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  jax_names = tuple(k for k in os.environ if k.startswith("JAX_"))
  mine = _import_time_env(dict(os.environ), jax_names)  # before the imports, some of which set some
  for name in PRELOAD:
    try:
      importlib.import_module(name)
    except ImportError:
      pass
  # A variable an import set (TF_CPP_MIN_LOG_LEVEL, say) is as good as the value it was set to: a
  # fresh interpreter started with that value imports the same way.
  after = _import_time_env(dict(os.environ), jax_names)
  threads = threading.active_count()
  # The preloaded modules' objects to the permanent generation: a worker's garbage collections skip
  # them (as they would not be there in a fresh interpreter that imports less), and its pages stay
  # shared with the zygote's.
  gc.collect()
  gc.freeze()
  signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
  server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  server.bind(path + ".tmp")
  server.listen(64)
  os.rename(path + ".tmp", path)  # ready
  parent = os.getppid()
  server.settimeout(1.0)
  while True:
    try:
      conn, _ = server.accept()
    except socket.timeout:
      if os.getppid() != parent:  # the suite that started it has ended
        return
      continue
    conn.settimeout(None)
    try:
      request, fds = _recv(conn)
    except (OSError, ValueError, EOFError):
      conn.close()
      continue
    theirs = _import_time_env(request["env"], jax_names)
    diff = sorted(k for k in set(theirs) | set(mine) | set(after)
                  if theirs.get(k) not in (mine.get(k), after.get(k)))
    if diff or threads != 1:
      print(f"zygote: a fresh interpreter for {request['argv'][:2]}: threads {threads}, "
            f"environment differs in {diff}", file=sys.stderr, flush=True)
      conn.sendall(b"fresh\n")
      conn.close()
      for fd in fds:
        os.close(fd)
      continue
    if os.fork() == 0:
      server.close()
      _monitor(conn, request, fds, launcher)
    conn.close()
    for fd in fds:
      os.close(fd)


def start(directory: str) -> str:
  """Starts a zygote serving ``directory/socket`` and writes its launcher, ``directory/python``.

  Returns:
    The launcher's path: use it in place of ``sys.executable``. The zygote is ready when the socket
    exists; until then (and if it fails) the launcher runs a fresh interpreter.
  """
  import subprocess  # pylint: disable=g-import-not-at-top

  launcher = os.path.join(directory, "python")
  with open(launcher, "w") as f:
    f.write(f'#!/bin/sh\nexec "{sys.executable}" -S "{os.path.abspath(__file__)}" client "$@"\n')
  os.chmod(launcher, 0o755)
  socket_path = os.path.join(directory, "socket")
  with open(os.path.join(directory, "zygote.log"), "w") as log:
    zygote = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", socket_path, launcher],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                              start_new_session=True)
  with open(os.path.join(directory, "zygote.pid"), "w") as f:
    f.write(str(zygote.pid))
  return launcher


def stop(directory: str) -> None:
  """Stops the zygote that :func:`start` started in ``directory`` (its workers end with their clients)."""
  try:
    with open(os.path.join(directory, "zygote.pid")) as f:
      os.kill(int(f.read()), signal.SIGTERM)
  except (OSError, ValueError):
    pass


if __name__ == "__main__":
  if sys.argv[1] == "client":
    client(sys.argv[2:])
  elif sys.argv[1] == "serve":
    serve(sys.argv[2], sys.argv[3])
