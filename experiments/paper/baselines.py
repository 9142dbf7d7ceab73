r"""Baselines in the same run: transformers' PyTorch ``generate`` (batched) on the same target and prompts,
and its assisted generation at batch 1 with our draft as the assistant, against bass-jax regular
decoding and BASS, same tokens and sampling settings.

    python -m experiments.paper.baselines --flagfile=configs/baselines_quick.flags
"""

from absl import app
from absl import flags

from bass_jax.evaluation import baselines, reproduce
from experiments import _common
from experiments import _decode_flags
from experiments import _io

_DECODE = _decode_flags.define("temperature", "top_p")
_TEMPERATURE, _TOP_P = _DECODE["temperature"], _DECODE["top_p"]
_HF_DRAFT = flags.DEFINE_string("hf_draft", None, "transformers directory of the draft (default: "
                                "--draft when it is a directory or the shipped draft's alias).")


def main(argv):
  del argv
  path = _common.prepare("baselines", greedy=_TEMPERATURE.value == 0)
  target, draft, problems, batches = _common.setup()
  hf_target = baselines.load_torch_model(_common.TARGET.value)
  hf_draft = baselines.load_torch_model(_HF_DRAFT.value or _common.DRAFT.value)
  _common.finish(path, reproduce.baselines(
      target, draft, problems, hf_target=hf_target, hf_draft=hf_draft, batch_sizes=batches,
      max_new_tokens=_common.MAX_NEW.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
      kernels=_common.KERNELS.value, save=_common.saver(path), earlier=_common.earlier_runs()))


if __name__ == "__main__":
  _io.run(main)
