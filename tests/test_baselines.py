"""The transformers baselines of the experiments: the same models, the same tokens, timed apart.

Reference: bass-jax's own regular decoding of the same GGUF target (itself tested against transformers
in test_llama.py); here the baseline code path (`bass_jax.evaluation.baselines`) must load both aliases the way
the experiment scripts do and decode what our decode decodes.
"""

from __future__ import annotations

import numpy as np
import pytest

import bass_jax as bj
from bass_jax.evaluation import baselines


@pytest.fixture(scope="module")
def hf_target():
  return baselines.load_torch_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hf_draft():
  return baselines.load_torch_model("smollm2-135m-draft")


def _prompt(smollm2) -> list[int]:
  return smollm2.tokenizer("def count_vowels(text):\n    \"\"\"Number of vowels in text.\"\"\"\n").input_ids


def test_hf_generate_decodes_what_bass_jax_decodes(hf_target, smollm2):
  ids = _prompt(smollm2)
  eos = smollm2.config.eos_token_id
  prompts = [ids, ids[3:]]  # different lengths: transformers left-pads under an attention mask
  run = baselines.hf_generate(hf_target, prompts, max_new_tokens=12, temperature=0.0, top_p=1.0,
                              seed=0, eos_token_id=eos)
  ours = bj.generate(smollm2, None, prompts, method="regular", max_new_tokens=12).sequences()
  assert run.sequences == ours
  np.testing.assert_array_equal(run.tokens, [len(s) for s in ours])
  assert run.wall_seconds > 0 and run.ms_per_token > 0


def test_hf_assisted_generation_with_the_shipped_draft(hf_target, hf_draft, smollm2):
  ids = _prompt(smollm2)
  kwargs = dict(max_new_tokens=12, temperature=0.0, top_p=1.0, seed=0,
                eos_token_id=smollm2.config.eos_token_id)
  alone = baselines.hf_generate(hf_target, [ids], **kwargs)
  assisted = baselines.hf_generate(hf_target, [ids], assistant=hf_draft, **kwargs)
  assert assisted.sequences == alone.sequences
  with pytest.raises(ValueError, match="batch size 1"):
    baselines.hf_generate(hf_target, [ids, ids], assistant=hf_draft, **kwargs)
