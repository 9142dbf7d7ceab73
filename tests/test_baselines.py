"""The real SmolLM2 against transformers' PyTorch model of the same GGUF file, and the experiments'
transformers baselines.

The port: the GGUF SmolLM2's config and logits equal transformers' (the independent reference, which
dequantizes the file itself). The baselines: the code path of `bass_jax.evaluation.baselines` loads both
aliases the way the experiment scripts do and decodes what our decode decodes, timed apart.

These tests live in one file because transformers reads the GGUF target in about 20 s on the project's
2-core machine: `make test` hands whole files to its workers, so one file loads it once per run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bass_jax as bj
from bass_jax.evaluation import baselines


@pytest.fixture(scope="module")
def hf_target():
  """transformers' SmolLM2-135M-Instruct from the same GGUF file (f32, eval mode)."""
  return baselines.load_torch_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hf_draft():
  return baselines.load_torch_model("smollm2-135m-draft")


def test_smollm2_gguf_logits_match_transformers(smollm2, hf_target):
  tok = smollm2.tokenizer
  text = 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'
  ids = tok(text).input_ids
  rng = np.random.default_rng(0)
  tokens = np.stack([ids, rng.integers(0, smollm2.config.vocab_size, len(ids))])
  with torch.no_grad():
    want = hf_target(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(smollm2.logits(tokens))
  assert np.abs(got - want).max() <= 1e-3
  assert (got.argmax(-1) == want.argmax(-1)).all()


def test_smollm2_config_from_gguf(smollm2):
  c = smollm2.config
  assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
          c.head_dim, c.intermediate_size, c.vocab_size) == (30, 576, 9, 3, 64, 1536, 49152)
  assert c.tie_word_embeddings and c.rope_theta == 100000.0
  assert bj.loading.count_params(smollm2.params) == c.num_params()


def _prompt(smollm2) -> list[int]:
  return smollm2.tokenizer("def count_vowels(text):\n    \"\"\"Number of vowels in text.\"\"\"\n").input_ids


def test_hf_generate_decodes_what_bass_jax_decodes(hf_target, smollm2, smollm2_greedy):
  # Three prompts of different lengths (transformers left-pads them under an attention mask) and our
  # regular greedy decoding of them, the real-target tests' shared reference.
  prompts, regular = smollm2_greedy
  run = baselines.hf_generate(hf_target, prompts, max_new_tokens=32, temperature=0.0, top_p=1.0,
                              seed=0, eos_token_id=smollm2.config.eos_token_id)
  ours = regular.sequences()
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


def test_the_gguf_name_map_is_built_once_per_load_and_restored_after():
  """load_torch_model's GGUF load builds gguf's tensor-name map once per (architecture, layers)
  instead of once per module; outside the load gguf builds a fresh map per call, as before."""
  import gguf  # pylint: disable=g-import-not-at-top

  build = gguf.get_tensor_name_map
  arch = gguf.MODEL_ARCH.LLAMA
  with baselines._gguf_name_maps_built_once():  # pylint: disable=protected-access
    first = gguf.get_tensor_name_map(arch, 2)
    assert gguf.get_tensor_name_map(arch, 2) is first
    assert gguf.get_tensor_name_map(arch, 3) is not first
    name = "model.layers.1.self_attn.q_proj"
    assert first.get_name(name) == build(arch, 2).get_name(name) == "blk.1.attn_q"
  assert gguf.get_tensor_name_map is build
  assert build(arch, 2) is not build(arch, 2)
