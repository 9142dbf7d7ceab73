r"""Static batches against continuous batching: tokens/s, per-token latency All and the wall time of a
whole prompt set, for BASS and regular decoding, at several batch sizes and temperatures, in one run.

    python -m experiments.paper.throughput --flagfile=configs/throughput_full.flags

Writes throughput_<setting>.json into a fresh outputs/throughput-<time>/ (or --results_dir=results,
which experiments/paper/report.py renders), rewritten after every run (bass_jax.evaluation.reproduce.throughput).
"""

from absl import app
from absl import flags

from bass_jax.evaluation import reproduce
from experiments import _common
from experiments import _io

_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "0.2"], "Sampling temperatures (top-p 0.95 "
                                  "when sampling).")


def main(argv):
  del argv
  path = _common.prepare("throughput", greedy=True)  # every batch holds distinct prompts
  target, draft, problems, batches = _common.setup()
  _common.finish(path, reproduce.throughput(
      target, draft, problems, batch_sizes=batches,
      temperatures=[float(t) for t in _TEMPERATURES.value], max_new_tokens=_common.MAX_NEW.value,
      kernels=_common.KERNELS.value, save=_common.saver(path), earlier=_common.earlier_runs(),
      **_common.speculation()))


if __name__ == "__main__":
  _io.run(main)
