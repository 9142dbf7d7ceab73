"""Rotary scaling (``bass_jax.models.rope``) against transformers' ``modeling_rope_utils``.

Every type's inverse frequencies and attention factor equal ``ROPE_INIT_FUNCTIONS[type]`` of the same
transformers config (partial rotary included); both config spellings (4.x ``rope_scaling`` +
``rope_theta``, 5.x ``rope_parameters``, Gemma 3's per layer type) give one config; the length-dependent
types follow transformers in a full forward past their threshold, and a decode past ``longrope``'s
original length is refused saying why.
"""

import re

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import bass_jax as bj
from bass_jax.models import rope as rope_lib

BASE = dict(vocab_size=61, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
HEAD_DIM = 16

CASES = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.5},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-mscale-no-truncate": {"rope_type": "yarn", "factor": 8.0, "mscale": 0.8,
                                "mscale_all_dim": 0.5, "beta_fast": 24.0, "beta_slow": 2.0,
                                "truncate": False, "original_max_position_embeddings": 16},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 0.7,
                              "original_max_position_embeddings": 32},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 16,
                 "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.2, 2.5, 3.0],
                 "long_factor": [1.0, 2.0, 3.0, 5.0, 8.0, 9.0, 11.0, 16.0]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
}


def _hf_config(params, partial=1.0, theta=5000.0):
  rope = {**params, "rope_theta": theta}
  if partial != 1.0:
    rope["partial_rotary_factor"] = partial
    if "short_factor" in rope:
      rope["short_factor"] = rope["short_factor"][:int(HEAD_DIM * partial) // 2]
      rope["long_factor"] = rope["long_factor"][:int(HEAD_DIM * partial) // 2]
  return transformers.LlamaConfig(**BASE, rope_parameters=rope)


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("name", sorted(CASES))
def test_frequencies_and_attention_factor_match_transformers(name, partial):
  hf = _hf_config(CASES[name], partial)
  if partial == 1.0:  # through the family config
    rotary = bj.LlamaConfig.from_hf_config(hf.to_dict()).rotary
  else:  # transformers' Llama ignores partial rotary (Phi-3 and Gemma 3 read it): the rope alone
    rotary = rope_lib.from_parameters(hf.rope_parameters, head_dim=HEAD_DIM,
                                      max_position_embeddings=hf.max_position_embeddings)
  rope_type = CASES[name]["rope_type"]
  assert rotary.rope_type == rope_type and rotary.dim == int(HEAD_DIM * partial)
  want, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
  np.testing.assert_allclose(rotary.inv_freq(), want.numpy(), rtol=1e-6, err_msg=name)
  assert rotary.attention_scaling == pytest.approx(scaling, rel=1e-6)
  plain = 1.0 / 5000.0 ** (np.arange(0, rotary.dim, 2) / rotary.dim)
  assert rope_type == "dynamic" or not np.allclose(rotary.inv_freq(), plain, rtol=1e-3), name
  if rope_type in ("longrope", "dynamic"):  # up to the threshold transformers keeps these frequencies
    threshold = 16 if rope_type == "longrope" else 64
    assert rotary.exact_context == threshold
    at_threshold, _ = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu", seq_len=threshold)
    np.testing.assert_allclose(rotary.inv_freq(), at_threshold.numpy(), rtol=1e-6)
    past, _ = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu", seq_len=threshold + 1)
    assert not np.allclose(rotary.inv_freq(), past.numpy(), rtol=1e-3)  # where it would switch


@pytest.mark.parametrize("legacy, modern", [
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 300.0},
     {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0}}),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
      "rope_theta": 5e5},
     {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                          "rope_theta": 5e5}}),
])
def test_both_spellings_give_one_config(legacy, modern):
  """transformers 4's rope_scaling + rope_theta and 5's rope_parameters: one config."""
  fields = {"model_type": "llama", **BASE}
  old = bj.LlamaConfig.from_hf_config({**fields, **legacy})
  new = bj.LlamaConfig.from_hf_config({**fields, **modern})
  assert old == new and old.rope_scaling is not None


def test_gemma3_spellings_per_layer_type():
  """4.x: ``rope_scaling`` (global layers), ``rope_theta`` and ``rope_local_base_freq``; 5.x:
  ``rope_parameters`` per layer type. The local layers keep plain rotary with their own base."""
  fields = {"model_type": "gemma3_text", **BASE, "head_dim": HEAD_DIM, "num_hidden_layers": 2,
            "query_pre_attn_scalar": 16, "sliding_window": 8, "sliding_window_pattern": 2}
  old = bj.LlamaConfig.from_hf_config({**fields, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                       "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
  new = bj.LlamaConfig.from_hf_config({**fields, "rope_parameters": {
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
  assert old == new
  assert new.rotary.rope_type == "linear" and new.rotary.theta == 1e6
  assert new.local_rope == rope_lib.Rotary(theta=1e4, dim=HEAD_DIM, max_position_embeddings=64)
  assert new.layer_types == ("sliding_attention", "full_attention")
  hf = transformers.Gemma3TextConfig(**{k: v for k, v in fields.items() if k != "model_type"},
                                     rope_parameters=new.to_hf_config().rope_parameters)
  assert bj.LlamaConfig.from_hf_config(hf.to_dict()) == new  # and back through transformers
  # Gemma 3's attention never reads attn_logit_softcapping (Traits.attention_softcap is Gemma 2's).
  assert bj.LlamaConfig.from_hf_config(
      {**hf.to_dict(), "attn_logit_softcapping": 50.0}).attn_logit_softcapping is None
  # transformers' yarn reads truncate from the top level only: per layer type it is refused.
  per_type = {"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                 "truncate": False},
              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
  for config in ({**fields, "rope_parameters": per_type},
                 {"model_type": "llama", **BASE, "rope_parameters": per_type}):  # every family
    with pytest.raises(ValueError, match=re.escape("rope_parameters['full_attention']: truncate "
                                                   "is not read per layer type")):
      bj.LlamaConfig.from_hf_config(config)


def _random_hf(config_cls, model_cls, seed=0, **fields):
  config = config_cls(**fields)
  config._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = model_cls(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.2 * torch.randn_like(p))
  return model


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_length_dependent_types_match_transformers_up_to_their_threshold(kind, tmp_path):
  """Up to the threshold (dynamic: max_position_embeddings 32; longrope: the original length 16)
  transformers keeps the in-length frequencies, and so does bass-jax: logits equal. Past it bass-jax
  refuses (transformers would switch per forward), saying why."""
  if kind == "dynamic":
    hf = _random_hf(transformers.LlamaConfig, transformers.LlamaForCausalLM,
                    **{**BASE, "max_position_embeddings": 32},
                    rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 100.0})
  else:
    hf = _random_hf(transformers.Phi3Config, transformers.Phi3ForCausalLM, **BASE,
                    pad_token_id=0, bos_token_id=1, eos_token_id=2,
                    original_max_position_embeddings=16,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 100.0,
                                     **{k: CASES["longrope"][k]
                                        for k in ("short_factor", "long_factor")}})
  hf.save_pretrained(tmp_path)
  model = bj.load_model(tmp_path, tokenizer=False)
  threshold = model.config.max_positions
  assert threshold == (32 if kind == "dynamic" else 16)
  tokens = np.random.default_rng(0).integers(0, BASE["vocab_size"], (2, threshold))
  with torch.no_grad():
    want = hf(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model.logits(tokens)), want, atol=1e-4, rtol=0)
  longer = np.concatenate([tokens, tokens[:, :1]], axis=1)
  with torch.no_grad():  # one position more, and transformers' frequencies change for all of them
    switched = hf(torch.tensor(longer)).logits.numpy()[:, :threshold]
  assert np.abs(switched - want).max() > 1e-2
  with pytest.raises(ValueError, match="exceed the model's context"):
    model.logits(longer)
  if kind == "longrope":
    with pytest.raises(ValueError, match="original_max_position_embeddings=16"):
      bj.generate(model, None, [tokens[0, :10].tolist()], method="regular", max_new_tokens=8)


def test_partial_rotary_outside_the_families_that_read_it_is_refused():
  fields = {"model_type": "llama", **BASE,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                "partial_rotary_factor": 0.5}}
  with pytest.raises(ValueError, match="partial_rotary_factor < 1 is not read"):
    bj.LlamaConfig.from_hf_config(fields)
