r"""Utilization (BASS Fig. 1): achieved FLOP/s over the device's peak (measured here with a large matrix
product), useful and executed, for regular decoding, single-sequence speculative decoding (BASS at
batch 1) and BASS, against per-token latency.

    python -m experiments.paper.utilization --flagfile=configs/utilization_quick.flags
"""

from absl import app

from bass_jax.evaluation import reproduce
from experiments import _common
from experiments import _decode_flags
from experiments import _io

_DECODE = _decode_flags.define(temperature=0.2, top_p=0.95)
_TEMPERATURE, _TOP_P = _DECODE["temperature"], _DECODE["top_p"]


def main(argv):
  del argv
  path = _common.prepare("utilization", greedy=_TEMPERATURE.value == 0)
  target, draft, problems, batches = _common.setup()
  _common.finish(path, reproduce.utilization(
      target, draft, problems, batch_sizes=batches, max_new_tokens=_common.MAX_NEW.value,
      temperature=_TEMPERATURE.value, top_p=_TOP_P.value, kernels=_common.KERNELS.value,
      save=_common.saver(path), earlier=_common.earlier_runs(),
      **_common.speculation()))


if __name__ == "__main__":
  _io.run(main)
