"""The Flax Llama port against transformers' LlamaForCausalLM (PyTorch, f32): the independent reference."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bass_jax as bj


def _hf_model(seed, **kw):
  torch.manual_seed(seed)
  fields = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                num_attention_heads=6, num_key_value_heads=6, rope_theta=1000.0,
                max_position_embeddings=256)
  fields.update(kw)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).eval()
  # HF's default init makes tiny logits; widen them so a layout slip shows up clearly.
  with torch.no_grad():
    for p in model.parameters():
      p.mul_(3.0)
  return model


def _torch_logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens))).logits.numpy()


@pytest.mark.parametrize("name,kw", [
    ("mha", dict(num_key_value_heads=6)),
    ("gqa", dict(num_key_value_heads=2)),
    ("mqa_tied", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    ("head_dim_16_bias", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              attention_bias=True, mlp_bias=True)),
])
def test_tiny_logits_match_transformers(tmp_path, name, kw):
  hf = _hf_model(seed=len(name), **kw)
  hf.save_pretrained(tmp_path)
  model = bj.load_model(tmp_path)
  tokens = np.random.default_rng(1).integers(0, 97, size=(3, 17))
  want = _torch_logits(hf, tokens)
  got = np.asarray(model.logits(tokens))
  assert np.std(want) > 0.5  # logits that actually discriminate
  np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
  assert np.abs(got - want).max() < 1e-4  # in practice f32 rounding only


def test_config_round_trips_through_transformers():
  config = bj.LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                          rope_theta=12345.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                          eos_token_id=(2, 7), max_position_embeddings=512)
  assert bj.LlamaConfig.from_hf_config(config.to_hf_config()) == config
  assert bj.LlamaConfig.from_hf_config(config.to_hf_config().to_dict()) == config


@pytest.mark.parametrize("field,value,match", [
    ("sliding_window", 128, "sliding_window"),
    ("model_type", "mistral", "mistral"),
    ("rope_parameters", {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4},
     "proportional"),
    ("pretraining_tp", 2, "pretraining_tp"),
    ("hidden_act", "gelu", "gelu"),
])
def test_config_rejects_what_the_port_would_ignore(field, value, match):
  fields = bj.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1,
                          head_dim=4).to_hf_config().to_dict()
  fields[field] = value
  with pytest.raises(ValueError, match=match):
    bj.LlamaConfig.from_hf_config(fields)


@pytest.mark.parametrize("kw,match", [
    (dict(num_attention_heads=3, num_key_value_heads=2), "multiple"),
    (dict(head_dim=5), "even"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_config_validates(kw, match):
  fields = dict(vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=4)
  fields.update(kw)
  with pytest.raises(ValueError, match=match):
    bj.LlamaConfig(**fields)


def test_logits_reject_out_of_vocabulary_tokens(tmp_path):
  _hf_model(0).save_pretrained(tmp_path)
  model = bj.load_model(tmp_path)
  with pytest.raises(ValueError, match="token ids"):
    model.logits(jnp.array([[0, 97]]))


def test_hidden_states_match_transformers(tmp_path):
  """The layers' outputs an EAGLE-3 draft fuses are transformers' ``hidden_states[i + 1]`` (before the
  final norm), and the features its last, normed entry."""
  hf = _hf_model(seed=3, num_key_value_heads=2)
  hf.save_pretrained(tmp_path)
  model = bj.load_model(tmp_path)
  tokens = np.random.default_rng(2).integers(0, 97, size=(2, 11))
  with torch.no_grad():
    want = [h.numpy() for h in hf(torch.tensor(tokens), output_hidden_states=True).hidden_states]
  _, _, features, hidden = bj.models.common.forward(model.config, model.params, jnp.asarray(tokens),
                                                    return_features=True, hidden_layers=(1, 0))
  np.testing.assert_allclose(hidden[..., :48], want[2], atol=2e-4, rtol=1e-5)
  np.testing.assert_allclose(hidden[..., 48:], want[1], atol=2e-4, rtol=1e-5)
  np.testing.assert_allclose(features, want[-1], atol=2e-4, rtol=1e-5)
  with pytest.raises(ValueError, match="return_features"):
    bj.models.common.forward(model.config, model.params, jnp.asarray(tokens), hidden_layers=(0,))
  with pytest.raises(ValueError, match=r"\[0, 3\)"):
    bj.models.common.forward(model.config, model.params, jnp.asarray(tokens), return_features=True,
                             hidden_layers=(3,))


def test_init_params_compiles_once_per_config_and_draws_flax_s_initializers():
  """init_params runs Flax's initializers as one jitted program per (config, dtype): a second model of
  the same config compiles nothing and draws other weights for another key; the weights are Flax's
  eager init's up to f32 rounding (XLA fuses the draws' arithmetic)."""
  import jax  # pylint: disable=g-import-not-at-top

  from bass_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top

  config = bj.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, head_dim=8)
  first = bj.init_params(config, jax.random.key(0))
  program = model_lib._initializer(config, jnp.dtype(jnp.float32))  # pylint: disable=protected-access
  compiled = program._cache_size()  # pylint: disable=protected-access
  second = bj.init_params(config, jax.random.key(1))
  assert program._cache_size() == compiled == 1  # pylint: disable=protected-access
  assert not np.array_equal(first["embed_tokens"]["embedding"], second["embed_tokens"]["embedding"])
  eager = config.make_module().init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), first, eager)
  assert bj.init_params(config, jax.random.key(0), "bfloat16")["norm"]["scale"].dtype == jnp.bfloat16
