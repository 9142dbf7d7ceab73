r"""Accuracy within a time budget (BASS Fig. 5): Pass@First and Pass@Finished per wall-clock budget, at
several batch sizes and temperatures, for BASS and regular decoding. HumanEval's tests run outside this
process (bass_jax.evaluation.humaneval).

    python -m experiments.paper.budget --flagfile=configs/budget_quick.flags
"""

from absl import app
from absl import flags

from bass_jax.evaluation import batches
from bass_jax.evaluation import reproduce
from experiments import _common
from experiments import _io

_TEMPERATURES = flags.DEFINE_list("temperatures", ["0.2", "0.6"], "Sampling temperatures.")
_CONTINUOUS = flags.DEFINE_bool(
    "continuous", False, "Continuous batching for both methods: the samples of all prompts form one "
    "queue that B rows decode, a finished row taking the next sample at once, and each sample's time "
    "runs from its own admission. Off by default: the budget is per prompt, whose B samples then no "
    "longer start together (bass_jax.evaluation.reproduce.budget).")
_SAMPLE_ORDER = flags.DEFINE_enum(
    "sample_order", "grouped", batches.SAMPLE_ORDERS, "With --continuous, the queue's order: "
    "grouped (a prompt's B samples in a row) or interleaved (round robin over the prompts, so that a "
    "prompt's later samples start after its earlier ones finished, which sibling lookup drafts from).")
_FRACTION = flags.DEFINE_float("budget_fraction", 0.7,
                               "Budget as a fraction of regular decoding's time for a full-length "
                               "sequence at the smallest batch (below 1: regular cannot finish one).")

flags.register_multi_flags_validator(
    ["sample_order", "continuous"], lambda f: f["sample_order"] == "grouped" or f["continuous"],
    message="--sample_order=interleaved orders a continuous batch's queue: add --continuous")


def main(argv):
  del argv
  path = _common.prepare("budget", greedy=any(float(t) == 0 for t in _TEMPERATURES.value))
  target, draft, problems, batches = _common.setup()
  _common.finish(path, reproduce.budget(
      target, draft, problems, batch_sizes=batches,
      temperatures=[float(t) for t in _TEMPERATURES.value], max_new_tokens=_common.MAX_NEW.value,
      budget_fraction=_FRACTION.value, kernels=_common.KERNELS.value, continuous=_CONTINUOUS.value,
      sample_order=_SAMPLE_ORDER.value,
      save=_common.saver(path), earlier=_common.earlier_runs(),
      **_common.speculation()))


if __name__ == "__main__":
  _io.run(main)
