"""The platforms a decode is compiled for, each of a kind, and the platform being compiled for now.

JAX names a backend by platform (``jax.default_backend()``: ``"cpu"``, ``"gpu"``, ``"cuda"``,
``"rocm"``, ``"tpu"``). What the library does differently depends only on the platform's *kind*
(:data:`PLATFORMS`): on a ``"gpu"`` the Pallas kernels lower natively and split the cache over the
SMs, the prefill takes cuDNN's flash attention, and the ``"gpu"`` backend profile is the default
(``bass_jax.profiles``); any other kind interprets the kernels and takes the CPU's profile. A new
platform is one :func:`register_platform` call.

:func:`compiling_for` traces programs as for another platform than this process's (lowering a GPU
program on a machine without one: ``experiments.benchmarks.lower_decode``); :func:`compile_platform`
is the platform being traced for.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import jax

KINDS = ("cpu", "gpu", "tpu")
# JAX's platform names, each with its kind.
PLATFORMS: dict[str, str] = {}
H100_SM_COUNT = 132  # the SMs assumed when lowering for a GPU on a machine that has none
_compile_target = threading.local()


def register_platform(name: str, kind: str) -> None:
  """Adds JAX platform ``name`` (as ``jax.default_backend()`` names it) of ``kind`` (one of
  :data:`KINDS`).

  Raises:
    ValueError: an unknown kind, or a name registered already with another kind.
  """
  if kind not in KINDS:
    raise ValueError(f"register_platform({name!r}): kind must be one of {KINDS}, got {kind!r}")
  if PLATFORMS.get(name, kind) != kind:
    raise ValueError(f"platform {name!r} is registered already as a {PLATFORMS[name]!r}")
  PLATFORMS[name] = kind


for _name, _kind in (("cpu", "cpu"), ("gpu", "gpu"), ("cuda", "gpu"), ("rocm", "gpu"),
                     ("tpu", "tpu")):
  register_platform(_name, _kind)


def kind(platform: str) -> str:
  """The kind of ``platform`` (:data:`PLATFORMS`); ``"cpu"`` for a platform not registered, which is
  treated as the CPU is (interpreted kernels, the CPU's profile)."""
  return PLATFORMS.get(platform, "cpu")


def is_gpu(platform: str) -> bool:
  """Whether ``platform`` is a GPU's (``"gpu"``, ``"cuda"``, ``"rocm"``)."""
  return kind(platform) == "gpu"


@contextlib.contextmanager
def compiling_for(platform: str, *, sm_count: int = H100_SM_COUNT):
  """Traces the models as for ``platform`` (``"cuda"``, ``"cpu"``) within the block, whatever the
  default backend: the Pallas kernels lower natively for a GPU platform (interpreted for any other)
  and their cache splits assume ``sm_count`` SMs, and ``bass_jax.generate``'s default profile is
  that platform's. For lowering a GPU program on a machine without one (``jax.export`` with
  ``platforms=[platform]``, ``experiments.benchmarks.lower_decode``); the programs are not runnable here.
  """
  previous = getattr(_compile_target, "value", None)
  _compile_target.value = (platform, sm_count)
  try:
    yield
  finally:
    _compile_target.value = previous


def compile_platform() -> str:
  """The platform programs are traced for: :func:`compiling_for`'s, else ``jax.default_backend()``."""
  target = getattr(_compile_target, "value", None)
  return jax.default_backend() if target is None else target[0]


def sm_count() -> int:
  """The SMs of the GPU the kernels are compiled for (:func:`compiling_for`'s, else device 0's)."""
  target = getattr(_compile_target, "value", None)
  if target is not None:
    return target[1]
  return getattr(jax.devices()[0], "core_count", None) or H100_SM_COUNT


@functools.cache
def has_gpu() -> bool:
  """Whether this process has a GPU device (cuDNN is then installed with JAX's CUDA plugin)."""
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False
