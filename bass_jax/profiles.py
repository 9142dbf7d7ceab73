"""Backend profiles: the decode's defaults for the machine it is compiled for, in one place.

A CPU and a GPU want different decode programs (docs/design.md, "Backend profiles"):

* **Verification width.** On a CPU a target forward is bound by arithmetic, so scoring 8 positions
  costs about twice 4, and verification runs in passes of ``C = 4`` that stop once every row has
  rejected (measured: docs/design.md, "The changing `l_draft` against static shapes"). On a GPU a
  forward is expected to be bound by weight reads until ``B x T`` reaches a few hundred tokens (not
  yet measured: no GPU has run this code), so a pass of ``l + 1`` positions should cost about one of
  4: the GPU profile verifies a step's drafts in one pass of
  ``L + 1`` positions, with no loop.
* **Device-side decisions.** On XLA:GPU the host reads a ``while_loop``'s predicate (and a ``cond``'s
  branch index) before it launches the next iteration: each is a round trip and exposes the launch gap
  of the next body. A CPU pays nothing for them and saves the work they skip. ``branch_free`` replaces
  them by work on the GPU: the draft loop runs its static ``L`` iterations (the drafts past ``l`` are
  padding the verification ignores), and the nucleus's threshold comes from one sort per row
  (``warp.top_p_filter``) instead of the top-k fast path and a bisection under a ``cond``.
* **Attention.** The jnp reference is XLA:CPU's fastest; on a GPU the Pallas kernel (BASS-SPLIT) reads
  each row's own blocks only, with flash-decoding splits of the cache chosen from the batch, the KV
  heads and the SM count (``pallas_kernels.tiling.split_count``).

* **Admission.** A continuous batch prefills the prompts it admits inside the loop, several rows in
  one prefill and in chunks, so that the work follows the true prompt lengths rather than the padded
  bucket. On a CPU, where a forward costs its arithmetic, one row per prefill in chunks of 64 wastes
  nothing on padding rows; on a GPU a chunk below a few hundred positions costs about a whole weight
  read, so the GPU profile prefills up to 4 rows that free up together in chunks of 512 (not yet
  measured).
* **XLA's own passes.** At one row per step a projection is a vector-matrix product, which XLA:GPU's
  ``dot-strength-reduction`` pass rewrites into a multiply and a reduction. Compiled for an H100
  without one (``experiments.benchmarks.lower_decode --compile_for=h100``, SmolLM2 at B = 1, bf16 and
  f32), the multiply then writes an array the size of the weight matrix (``bf16[1536, 576]`` for the
  gate and up projections) that the reduction reads back: three weight-sized transfers where a
  GEMM reads one, and 21 kernels per decoder layer where the GEMMs leave 16 (docs/gpu.md). The GPU
  profile compiles its programs without that pass (``compiler_options``), so every projection is a
  GEMM at any batch size; not yet timed on a GPU: ``experiments.benchmarks.bench_scale`` times both.
* **Layers.** XLA compiles every unrolled layer; a scanned model (``load_model(scan_layers=True)``)
  compiles one layer and runs it in a ``lax.scan`` over stacked weights and caches, as MaxText does on
  GPU. On a CPU each layer's dynamic slice of the stacked weights and cache is a copy that costs run
  time (docs/design.md, "Scanned layers"). On an H100 too: compiled there without a GPU
  (``experiments.benchmarks.lower_decode --compile_for=h100``, docs/gpu.md "Launches per step"), XLA copies 11
  slices per scanned layer, and the copies keep it from grouping a step's kernels into CUDA graphs: a
  plain step of the SmolLM2 target launches 787 times scanned and 3 times unrolled (B = 8, XLA's
  default command buffers), a BASS step 556 and 16. Both profiles load unrolled; unrolled layers
  compile about 5 s longer per program here. The layout is chosen at load time, not by
  ``generate``: it is the weights' layout.

Every field is a default: ``bass_jax.generate``'s own arguments (``attention_impl``, ``verify_chunk``)
override it, argument by argument, and a profile made with ``dataclasses.replace`` overrides any
field (the admission's, which ``generate`` takes no argument for). ``generate(profile=None)`` takes the profile of the backend the
program is compiled for (``jax.default_backend()``, or the platform of
``platforms.compiling_for``).
"""

from __future__ import annotations

import dataclasses

from bass_jax import platforms
from bass_jax.models import attention_registry


@dataclasses.dataclass(frozen=True)
class BackendProfile:
  """The decode's defaults for one kind of machine.

  Attributes:
    name: the profile's name (``"cpu"``, ``"gpu"``).
    attention_impl: the attention implementation (``models.attention_registry.attention_implementations()``).
    verify_chunk: C, the positions one verification pass scores; None: one pass of ``L + 1`` (the
      step's longest chain and its bonus position), which needs no verification loop.
    branch_free: run the draft loop for its static ``L`` iterations and find the nucleus with one
      sort per row, rather than a loop whose trip count is the traced ``l`` and a ``cond`` on the
      rows' nucleus width: no device-side decision in either, at the price of the work they skip.
    admit_rows: the most prompts a continuous batch admits in one prefill (rows that free up in the
      same step; a prefill with fewer computes its spare rows and drops them).
    admit_chunk: the positions per forward of an admission's chunked prefill, a power of two (a
      decode takes at most its prompt bucket's P).
    scan_layers: the layout ``load_model`` gives a model's decoder layers by default: scanned (one
      layer compiled, run in a ``lax.scan`` over stacked weights and caches) or unrolled. A layout
      belongs to the weights, so ``generate`` takes each model as it was loaded
      (``Model.with_scanned_layers`` converts).
    compiler_options: XLA options every program of the decode is compiled with (``jax.jit``'s
      ``compiler_options``: the decode, its prefill and the step-cost forwards), as ``(name, value)``
      pairs; they override ``XLA_FLAGS`` for those programs only.
  """

  name: str
  attention_impl: str
  verify_chunk: int | None
  branch_free: bool
  admit_rows: int = 1
  admit_chunk: int = 64
  scan_layers: bool = False
  compiler_options: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    options = self.compiler_options
    if not isinstance(options, tuple) or not all(
        isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) and o[0].startswith("xla_")
        and isinstance(o[1], str) for o in options):
      raise ValueError(f"BackendProfile.compiler_options must be a tuple of (name, value) string "
                       f"pairs naming XLA options ('xla_...'), got {options!r}")
    # By name only: building a Pallas implementation reads the backend, which importing this module
    # must not initialize (jax.distributed.initialize has to come first).
    if self.attention_impl not in attention_registry.attention_implementations():
      raise ValueError(f"unknown attention_impl {self.attention_impl!r}; choose one of "
                       f"{attention_registry.attention_implementations()}")
    if self.verify_chunk is not None and (not isinstance(self.verify_chunk, int)
                                          or self.verify_chunk < 1):
      raise ValueError(f"BackendProfile.verify_chunk must be None or an int >= 1, got "
                       f"{self.verify_chunk!r}")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"BackendProfile.scan_layers must be a bool, got {self.scan_layers!r}")
    for name in ("admit_rows", "admit_chunk"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"BackendProfile.{name} must be an int >= 1, got {value!r}")
    if self.admit_chunk & (self.admit_chunk - 1):
      raise ValueError(f"BackendProfile.admit_chunk must be a power of two (so that its chunks tile "
                       f"the prompt bucket, a power of two), got {self.admit_chunk}")


# One-row projections as GEMMs, not a multiply and a reduction through a weight-sized temporary
# (module docstring, "XLA's own passes").
GPU_COMPILER_OPTIONS = (("xla_disable_hlo_passes", "dot-strength-reduction"),)

PROFILES = {
    # What the CPU measurements chose (docs/design.md): the reference attention, passes of 4.
    "cpu": BackendProfile(name="cpu", attention_impl="reference", verify_chunk=4, branch_free=False,
                          admit_rows=1, admit_chunk=64, scan_layers=False),
    "gpu": BackendProfile(name="gpu", attention_impl="pallas_split", verify_chunk=None,
                          branch_free=True, admit_rows=4, admit_chunk=512, scan_layers=False,
                          compiler_options=GPU_COMPILER_OPTIONS),
}


def backend_profile(profile: str | BackendProfile | None = None) -> BackendProfile:
  """The profile named ``profile``, ``profile`` itself, or (None) the profile of the platform the
  decode is compiled for: ``platforms.compiling_for``'s, else ``jax.default_backend()``; a
  platform without a profile of its own (a TPU) takes the CPU's.

  Raises:
    ValueError: an unknown profile name, or a value that is neither a name nor a BackendProfile.
  """
  if isinstance(profile, BackendProfile):
    return profile
  if profile is None:
    return PROFILES[platform_profile(platforms.compile_platform())]
  if not isinstance(profile, str) or profile not in PROFILES:
    raise ValueError(f"profile must be None, a BackendProfile or one of {sorted(PROFILES)}, got "
                     f"{profile!r}")
  return PROFILES[profile]


def platform_profile(platform: str) -> str:
  """The name of the profile a platform (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"gpu"``, …) takes by
  default: ``"gpu"`` for a GPU, ``"cpu"`` for anything else."""
  return "gpu" if platforms.is_gpu(platform) else "cpu"
