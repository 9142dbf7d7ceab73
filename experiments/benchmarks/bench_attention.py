r"""Times ragged attention: the jnp reference, jax.nn.dot_product_attention, BASS-PAD and BASS-SPLIT.

    python -m experiments.benchmarks.bench_attention                 # GPU: compiled kernels, full sweep
    python -m experiments.benchmarks.bench_attention --quick         # CPU: interpret mode, proves the script runs

Shapes are SmolLM2's attention (9 query / 3 key-value heads, head dim 64) by default: decode (T = 1) and
verification chunks (T = 4, 16) at batch 1-16, with equal lengths (every row at --max_len) and widely spread
ones (evenly from T to --max_len), which is where PAD and SPLIT should differ. Each row of the printed
markdown table gives the time per call (--repeats calls inside one jitted loop, so that the host's
dispatch is not timed; the median of --rounds loops) and the achieved bandwidth: the bytes of K and
V a row actually needs (its own length, both tensors) plus Q and the output, over the time, next to the
device's copy bandwidth measured in the same run (a large array copied once, read + write bytes).
On a CPU the Pallas kernels run in interpret mode and their times say nothing about a GPU.
"""

import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.models.attention import reference_attention
from pallas_kernels.ragged_attention import ragged_attention
from pallas_kernels.tiling import BlockSizes
from experiments import _io

_QUICK = flags.DEFINE_bool("quick", False, "Small sizes and few repeats (CPU smoke run).")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "2", "4", "8", "16"], "Batch sizes.")
_NUM_Q = flags.DEFINE_list("num_q", ["1", "4", "16"], "New tokens per row (1 = decode, else a "
                           "verification chunk).")
_MAX_LEN = flags.DEFINE_integer("max_len", 4096, "Cache slots S (longest row).")
_HEADS = flags.DEFINE_integer("num_heads", 9, "Query heads.")
_KV_HEADS = flags.DEFINE_integer("num_kv_heads", 3, "Key/value heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dim.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "Dtype.")
_SPLITS = flags.DEFINE_integer("num_splits", 1, "Split-K partitions for the Pallas kernels.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Attention calls per timed loop (one dispatch).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed loops per cell (the median is reported).")


def _median_seconds(fn, *args, repeats):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _seconds_per_call(fn, q, k, v, lengths, *, calls: int, rounds: int) -> float:
  """Seconds per attention call: the median over ``rounds`` dispatches of one jitted loop of ``calls``
  calls, divided by ``calls``.

  One dispatch per loop, not per call: on an H200 one call at SmolLM2's sizes moves a few MB (a few
  microseconds of HBM time), far below the host's dispatch and synchronization time (60-150 us per
  call measured there on 2026-11-26, which the first GPU run of this script timed instead of the
  kernels; results/gpu_h200). Each call's queries are scaled by a factor that depends on the loop
  index, so XLA can neither hoist the call out of the loop nor merge the calls; the outputs are
  summed into the loop's carry so that none is dead code."""

  @jax.jit
  def loop(q, k, v, lengths):
    def body(i, total):
      scale = 1 + i.astype(jnp.float32) * 1e-3
      out = fn(q * scale.astype(q.dtype), k, v, lengths)
      return total + jnp.sum(out.astype(jnp.float32))
    return jax.lax.fori_loop(0, calls, body, jnp.float32(0))

  return _median_seconds(loop, q, k, v, lengths, repeats=rounds) / calls


def _copy_bandwidth(repeats: int, num_bytes: int) -> float:
  x = jnp.ones((num_bytes // 4,), jnp.float32)
  seconds = _median_seconds(jax.jit(lambda a: a * 1.0001), x, repeats=repeats)
  return 2 * x.nbytes / seconds  # read + write


def _dpa(q, k, v, lengths):
  """jax.nn.dot_product_attention with the same end-aligned causal mask (an explicit mask when T > 1).

  Takes ``k, v: [B, S, K, H]``, the layout it wants (the caller keeps a transposed copy, untimed)."""
  num_q, max_len = q.shape[1], k.shape[1]
  if num_q == 1:
    return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths)
  q_pos = lengths[:, None] - num_q + jnp.arange(num_q)
  mask = jnp.arange(max_len)[None, None, :] <= q_pos[:, :, None]
  return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")


def main(argv):
  del argv
  _io.init_script()
  quick = _QUICK.value
  batches = [1, 2] if quick else [int(b) for b in _BATCHES.value]
  # --quick runs every branch of this loop once: T = 8 (the kernels' T = 1 grids are
  # tests/test_ragged_attention.py's), B = 1 and 2 (a single row's lengths are set apart).
  num_qs = [8] if quick else [int(t) for t in _NUM_Q.value]
  max_len = 256 if quick else _MAX_LEN.value
  repeats = 2 if quick else _REPEATS.value
  dtype = jnp.dtype(_DTYPE.value)
  interpret = jax.default_backend() not in ("gpu", "cuda", "rocm")
  device = jax.devices()[0]
  bandwidth = _copy_bandwidth(repeats, (1 << 24) if quick else (1 << 30))
  blocks = BlockSizes(num_splits=_SPLITS.value)

  impls = {
      "reference (jnp)": jax.jit(reference_attention),
      "jax.nn.dot_product_attention": jax.jit(_dpa),
      # Under jit the lengths are traced, so the wrapper's host-side value check (a device sync)
      # stays out of the timing.
      "pallas PAD": jax.jit(lambda q, k, v, l: ragged_attention(
          q, k, v, l, variant="pad", block_sizes=blocks, interpret=interpret)),
      "pallas SPLIT": jax.jit(lambda q, k, v, l: ragged_attention(
          q, k, v, l, variant="split", block_sizes=blocks, interpret=interpret)),
  }
  print(f"device: {device.platform} {device.device_kind}; jax {jax.__version__}; dtype {dtype.name}; "
        f"heads {_HEADS.value}/{_KV_HEADS.value} x {_HEAD_DIM.value}; S = {max_len}; "
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; Pallas {'interpreted' if interpret else 'compiled'}")
  print()
  print("| T | B | lengths | implementation | time (us) | GB/s | of copy bandwidth |")
  print("|---|---|---|---|---|---|---|")
  rng = np.random.default_rng(0)
  for num_q in num_qs:
    for batch in batches:
      for spread in ("equal", "spread"):
        if spread == "equal":
          lengths = np.full(batch, max_len)
        else:
          lengths = np.linspace(num_q, max_len, batch).round().astype(int) if batch > 1 else \
              np.array([max_len // 2])
        shape_q = (batch, num_q, _HEADS.value, _HEAD_DIM.value)
        shape_kv = (batch, _KV_HEADS.value, max_len, _HEAD_DIM.value)  # the models' cache layout
        q = jnp.asarray(rng.normal(size=shape_q), dtype)
        k = jnp.asarray(rng.normal(size=shape_kv), dtype)
        v = jnp.asarray(rng.normal(size=shape_kv), dtype)
        k_bskh, v_bskh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        lengths_j = jnp.asarray(lengths, jnp.int32)
        needed = (2 * int(lengths.sum()) * _KV_HEADS.value * _HEAD_DIM.value
                  + 2 * int(np.prod(shape_q))) * dtype.itemsize
        for name, fn in impls.items():
          kv = (k_bskh, v_bskh) if fn is impls["jax.nn.dot_product_attention"] else (k, v)
          seconds = _seconds_per_call(fn, q, *kv, lengths_j, calls=repeats,
                                      rounds=1 if quick else _ROUNDS.value)
          print(f"| {num_q} | {batch} | {spread} | {name} | {seconds * 1e6:.0f} | "
                f"{needed / seconds / 1e9:.2f} | {needed / seconds / bandwidth:.1%} |", flush=True)


if __name__ == "__main__":
  _io.run(main)
