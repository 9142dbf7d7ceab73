r"""Cost of the top-p nucleus on a real vocabulary: full sort vs. lax.top_k vs. bisection, side by side;
and of the argmax every draw ends with (XLA's variadic argmax vs. ``warp.first_argmax``).

    python -m experiments.benchmarks.bench_top_p --rows=36 --vocab=49152

Prints one markdown table row per method (median ms over --repeats calls on the default device).
"""

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.sampling import warp
from experiments import _io

_ROWS = flags.DEFINE_integer("rows", 36, "Distributions per call (e.g. B * verified positions).")
_VOCAB = flags.DEFINE_integer("vocab", 49152, "Vocabulary size (SmolLM2: 49152).")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls per method.")


def _median_ms(fn, x):
  jax.block_until_ready(fn(x))
  times = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(fn(x))
    times.append(time.perf_counter() - start)
  return 1000 * float(np.median(times))


def main(argv):
  del argv
  _io.init_script()
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(_ROWS.value, _VOCAB.value)) * 3,
                       jnp.float32)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  methods = {
      "full sort (jnp.sort)": jax.jit(lambda x: jnp.sort(x, axis=-1)),
      f"lax.top_k({warp.TOP_K_FAST_PATH})": jax.jit(lambda x: jax.lax.top_k(x, warp.TOP_K_FAST_PATH)),
      "bisection over bit patterns": jax.jit(lambda x: warp._bisect_threshold(jnp.exp(x), 0.95)),  # pylint: disable=protected-access
      "top_p_filter (top_p=0.95)": jax.jit(lambda x: warp.top_p_filter(x, 0.95)),
      "jnp.argmax": jax.jit(lambda x: jnp.argmax(x, axis=-1)),
      "warp.first_argmax": jax.jit(warp.first_argmax),
  }
  print(f"| method | ms per call ({_ROWS.value} rows x {_VOCAB.value}, {jax.devices()[0].platform}) |")
  print("|---|---|")
  for name, fn in methods.items():
    print(f"| {name} | {_median_ms(fn, log_probs):.1f} |", flush=True)


if __name__ == "__main__":
  _io.run(main)
