r"""Latency and throughput (BASS Tables 1-3): regular decoding, BASS-PAD, BASS-SPLIT, fixed draft
lengths 4/6/8 against the dynamic heuristic, at several batch sizes, greedy and sampled; with
``--draft_tree``, token trees too (``--configs=...,bass_pad_tree`` or ``bass_pad_goodput_trees``).

    python -m experiments.paper.latency --flagfile=configs/latency_quick.flags

Writes latency_<setting>.json into a fresh outputs/latency-<time>/ (or --results_dir=results, which
experiments/paper/report.py renders), rewritten after every run (bass_jax.evaluation.reproduce.latency).
"""

from absl import app
from absl import flags

from bass_jax.evaluation import reproduce
from experiments import _common
from experiments import _io

_CONFIGS = flags.DEFINE_list("configs", list(reproduce.PAPER_CONFIGS), "Configurations to run (the "
                             f"paper's by default; all: {', '.join(reproduce.CONFIGS)}, and the tree "
                             f"configs {', '.join(reproduce.TREE_CONFIGS)}).")
_SAMPLING = flags.DEFINE_list("sampling", ["greedy", "t0.2"], "Sampling settings.")
_CHECK = flags.DEFINE_bool("check", True, "Run HumanEval's tests (Pass@Batch).")


def main(argv):
  del argv
  path = _common.prepare("latency", greedy="greedy" in _SAMPLING.value)
  target, draft, problems, batches = _common.setup()
  _common.finish(path, reproduce.latency(
      target, draft, problems, batch_sizes=batches, configs=_CONFIGS.value, sampling=_SAMPLING.value,
      max_new_tokens=_common.MAX_NEW.value, kernels=_common.KERNELS.value, check=_CHECK.value,
      save=_common.saver(path), earlier=_common.earlier_runs(), draft_tree=_common.DRAFT_TREE.value))


if __name__ == "__main__":
  _io.run(main)
