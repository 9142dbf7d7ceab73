"""Every config.json field is checked by type and range before use (issue 54; bass_jax.checkpoints.
config_schema): a wrong one is one ValueError naming the file, the field, the value and what is
expected, through ``load_model`` and the command line's preflight alike; nothing is coerced. Weights
that do not fit a config name the config field that explains them (checkpoints.mismatch).

The mutations below are the probe's findings, each of which failed before the schema (a bare
TypeError from ``published_kind``, a ``ZeroDivisionError`` deep in the model, a string loaded as a
number, an out-of-vocabulary stop id accepted until ``generate``), and what the property test found
after it. The property test mutates the config.json of tiny checkpoints of each of the ten families
at random: every mutation either loads, with logits equal to transformers' where transformers loads it
too, or is refused in one line that names the mutated field.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import subprocess

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest
import torch
import transformers

import bass_jax as bj
from bass_jax import preflight
from bass_jax.checkpoints import config_schema
from conftest import PYTHON

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 61
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 7))

CONFIGS = {
    "llama": transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "gemma2": transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        sliding_window=4, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gpt2": transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                    bos_token_id=1, eos_token_id=2),
    "qwen2": transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, tie_word_embeddings=True),
    "qwen3": transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "mistral": transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, sliding_window=4, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2),
    "gemma3": transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=4, sliding_window_pattern=2, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0),
    "phi3": transformers.Phi3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        original_max_position_embeddings=32, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "short_factor": [1.0, 1.5], "long_factor": [1.0, 4.0]}),
    "opt": transformers.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=48,
                                  num_attention_heads=4, word_embed_proj_dim=16,
                                  max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0),
    "codegen": transformers.CodeGenConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                          n_positions=64, n_ctx=64, bos_token_id=1, eos_token_id=2),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """``family -> directory`` of a tiny random checkpoint saved by transformers."""
  out = {}
  for family, config in CONFIGS.items():
    torch.manual_seed(len(family))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
      for param in model.parameters():
        param.add_(0.05 * torch.randn_like(param))
    path = tmp_path_factory.mktemp(family)
    model.save_pretrained(path)
    out[family] = path
  return out


def _mutated(source: pathlib.Path, where: pathlib.Path, change) -> pathlib.Path:
  """A copy of checkpoint ``source`` (weights linked) whose config.json ``change(fields)`` edits."""
  where.mkdir(parents=True, exist_ok=True)
  for file in source.iterdir():
    if file.name != "config.json":
      (where / file.name).symlink_to(file)
  fields = json.loads((source / "config.json").read_text())
  change(fields)
  (where / "config.json").write_text(json.dumps(fields))
  return where


def _setter(**changes):
  def change(fields):
    for name, value in changes.items():
      node = fields
      *parents, leaf = name.split(".")
      for parent in parents:
        node = node[parent]
      node[leaf] = value
  return change


# (family, change, the field the message must name, a piece of what is expected)
FINDINGS = {
    "layers as a string": ("llama", _setter(num_hidden_layers="2"), "num_hidden_layers='2'", "an int"),
    "layers null": ("llama", _setter(num_hidden_layers=None), "num_hidden_layers=None", "an int"),
    "layers a list": ("llama", _setter(num_hidden_layers=[2]), "num_hidden_layers=[2]", "an int"),
    "layers true": ("llama", _setter(num_hidden_layers=True), "num_hidden_layers=True", "an int"),
    "architectures a number": ("llama", _setter(architectures=5), "architectures=5", "strings"),
    "model_type a list": ("llama", _setter(model_type=["llama"]), "model_type=['llama']", "a string"),
    "rope_theta a string": ("llama", _setter(**{"rope_parameters.rope_theta": "500"}),
                            "rope_parameters.rope_theta='500'", "a number"),
    "rope factor a string": ("llama", _setter(rope_parameters={"rope_type": "linear",
                                                               "rope_theta": 1e4, "factor": "2"}),
                             "rope_parameters.factor='2'", "a number"),
    "heads zero": ("llama", _setter(num_attention_heads=0), "num_attention_heads=0", "[1, "),
    "eps not a number": ("llama", _setter(rms_norm_eps=math.nan), "rms_norm_eps=nan", "finite"),
    "stop id outside the vocabulary": ("llama", _setter(eos_token_id=VOCAB), f"eos_token_id={VOCAB}",
                                       f"[0, {VOCAB})"),
    "gemma scalar zero": ("gemma2", _setter(query_pre_attn_scalar=0), "query_pre_attn_scalar=0", "> 0"),
    "gemma soft cap zero": ("gemma2", _setter(attn_logit_softcapping=0.0),
                            "attn_logit_softcapping=0.0", "> 0 or null"),
    "gpt2 layers a float": ("gpt2", _setter(n_layer=2.0), "n_layer=2.0", "an int"),
}


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_each_finding_is_one_line_naming_file_field_value_and_expectation(finding, checkpoints,
                                                                          tmp_path):
  family, change, named, expected = FINDINGS[finding]
  path = _mutated(checkpoints[family], tmp_path / "m", change)
  for load in (lambda: bj.load_model(path, tokenizer=False), lambda: preflight.inspect_model(path)):
    with pytest.raises(ValueError) as caught:
      load()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path / 'config.json'}: {named} "), message
    assert expected in message, message


def _delete(name):
  return lambda fields: fields.pop(name)


# Weights that no longer fit a changed or missing field: (family, change, a piece of the message)
MISFITS = {
    "heads missing": ("llama", _delete("num_attention_heads"),
                      "config.json gives no num_attention_heads (so it is 32), the stored parameters "
                      "fit 4 (tensor model.layers.0.self_attn.q_proj.weight"),
    "positions offset": ("opt", _setter(max_position_embeddings=32),
                         "max_position_embeddings is 32 in config.json, the stored parameters fit 64"),
    "head missing for untied": ("gpt2", _setter(tie_word_embeddings=False),
                                "tie_word_embeddings is False in config.json, the stored parameters "
                                "fit True (missing tensor(s) ['lm_head.weight']"),
    "final norm left over": ("opt", _setter(do_layer_norm_before=False),
                             "do_layer_norm_before is False in config.json, the stored parameters "
                             "fit True"),
    "fewer layers": ("gpt2", _setter(n_layer=1), "n_layer is 1 in config.json, the stored "
                     "parameters fit 2 (11 tensor(s) the model has no place for"),
    "head size missing": ("gemma3", _delete("head_dim"),
                          "config.json gives no head_dim (so it is 256), the stored parameters fit 16"),
    "fused kv heads missing": ("phi3", _delete("num_key_value_heads"),
                               "(config.json gives no num_key_value_heads: transformers' default used"),
    "derived head size": ("phi3", _setter(hidden_size=3),
                          "(head_dim is hidden_size 3 // num_attention_heads 4 = 0, as the config "
                          "gives none)"),
    "activation": ("gpt2", _setter(activation_function="U"), "activation_function='U' is not "
                   "supported"),
}


@pytest.mark.parametrize("misfit", sorted(MISFITS))
def test_weights_that_do_not_fit_name_the_config_field(misfit, checkpoints, tmp_path):
  family, change, expected = MISFITS[misfit]
  path = _mutated(checkpoints[family], tmp_path / "m", change)
  with pytest.raises(ValueError) as caught:
    bj.load_model(path, tokenizer=False)
  message = str(caught.value)
  assert "\n" not in message and message.startswith(str(path)) and expected in message, message


def test_only_sizes_transformers_fills_in_are_named_and_only_beside_its_refusals(checkpoints,
                                                                                 tmp_path):
  """A null transformers keeps (Mistral's window) is no default it filled in; a null it replaces
  (Phi-3's key/value heads) is. A refusal of the port's own (an activation) names none of them,
  though the config gives no head_dim, which transformers derives."""
  base = {"model_type": "mistral", "hidden_size": 32, "num_attention_heads": 4}
  assert "sliding_window" not in config_schema.lacking_sizes({**base, "sliding_window": None}, "")
  assert "num_key_value_heads" in config_schema.lacking_sizes(
      {**base, "model_type": "phi3", "num_key_value_heads": None}, "")
  path = _mutated(checkpoints["llama"], tmp_path / "m", lambda f: (f.pop("head_dim"),
                                                                  f.update(hidden_act="foo")))
  with pytest.raises(ValueError, match="hidden_act") as caught:
    bj.load_model(path, tokenizer=False)
  assert "gives no" not in str(caught.value), caught.value


def test_a_gemma3_window_past_the_context_keeps_the_local_rotary(checkpoints, tmp_path):
  """A window no shorter than the context masks nothing, but Gemma 3's sliding layers still take the
  local rotary: found by the property test (transformers' default window, 4096, over a 64-token
  context), where the window was dropped with the layer types that choose the rotary."""
  path = _mutated(checkpoints["gemma3"], tmp_path / "m", _setter(sliding_window=64))
  model = bj.load_model(path, tokenizer=False)
  assert model.config.local_rope is not None
  reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  with torch.no_grad():
    want = reference(torch.as_tensor(TOKENS)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model.logits(TOKENS)), want, atol=2e-4, rtol=2e-4)


def test_longrope_past_its_original_context_is_refused_saying_why(checkpoints):
  """docs/models.md, "Rotary scaling": Phi-3's longrope switches to its long factors past
  original_max_position_embeddings (32 here, of 64 positions), which transformers decides per forward;
  a decode or a scoring that would go past it is refused, and the message says why."""
  model = bj.load_model(checkpoints["phi3"], tokenizer=False)
  assert model.config.max_positions == 32 and model.config.max_position_embeddings == 64
  why = "longrope rotary switches to its long factors past original_max_position_embeddings=32"
  with pytest.raises(ValueError, match="exceeds the models' context of 32 positions") as caught:
    bj.generate(model, None, [list(range(20))], method="regular", max_new_tokens=13)
  assert why in str(caught.value), caught.value
  with pytest.raises(ValueError, match="33 tokens exceed the model's context of 32 positions") as caught:
    model.logits(np.zeros((1, 33), np.int32))
  assert why in str(caught.value), caught.value


def test_the_command_line_refuses_a_wrong_field_in_one_line(checkpoints, tmp_path):
  path = _mutated(checkpoints["llama"], tmp_path / "m", _setter(num_hidden_layers="2"))
  run = subprocess.run([PYTHON, "-m", "experiments.generate", f"--target={path}",
                        "--method=regular", "--num_prompts=1", "--batch_size=1"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  assert run.returncode == 2 and "num_hidden_layers='2' is refused" in run.stderr, run.stderr[-2000:]
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_real_configs_pass_and_json_numbers_are_not_coerced():
  """The published configs' values pass; an int is a float (JSON's 10000 for 10000.0), but no string
  is a number and no boolean an int."""
  config_schema.check({"model_type": "llama", "rope_theta": 500000, "rms_norm_eps": 1e-5,
                       "vocab_size": 128256, "eos_token_id": [128001, 128009],
                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                        "original_max_position_embeddings": 8192}}, "c.json")
  for bad in ({"rms_norm_eps": "1e-5"}, {"tie_word_embeddings": 0}, {"vocab_size": True},
              {"eos_token_id": [1, "2"]}):
    with pytest.raises(ValueError, match="^c.json: "):
      config_schema.check({"model_type": "llama", **bad}, "c.json")


# -- the property test ------------------------------------------------------------------------------

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0, 10**12, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True, width=32), st.text(max_size=4),
    st.lists(st.integers(-1, 3), max_size=2), st.dictionaries(st.sampled_from(["a", "rope_type"]),
                                                              st.integers(0, 2), max_size=1))


@st.composite
def _mutations(draw):
  family = draw(st.sampled_from(sorted(CONFIGS)))
  names = sorted(json.loads(CONFIGS[family].to_json_string()))
  field = draw(st.sampled_from(names + ["an_unknown_field"]))
  delete = field != "an_unknown_field" and draw(st.booleans()) and draw(st.booleans())
  return family, field, None if delete else draw(_VALUES), delete


def _logits_equal(path: pathlib.Path, model: bj.Model) -> None:
  tokens = TOKENS[:, :model.config.max_positions]  # a context cut to 1 position loads, and scores 1
  try:
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
      want = reference(torch.as_tensor(tokens)).logits.numpy()
  except Exception:  # pylint: disable=broad-except  # transformers refuses it, or cannot run it
    return
  np.testing.assert_allclose(np.asarray(model.logits(tokens)), want, atol=2e-4, rtol=2e-4)


@hypothesis.settings(max_examples=300, deadline=None, database=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture,
                                            hypothesis.HealthCheck.too_slow])
@hypothesis.given(mutation=_mutations())
def test_a_mutated_config_loads_as_transformers_does_or_is_refused_naming_the_field(
    mutation, checkpoints, tmp_path_factory):
  family, field, value, delete = mutation
  change = (lambda f: f.pop(field, None)) if delete else _setter(**{field: value})
  path = _mutated(checkpoints[family], tmp_path_factory.mktemp("mutant"), change)
  try:
    model = bj.load_model(path, tokenizer=False)
  except ValueError as e:
    message = str(e)
    assert "\n" not in message and field in message, (mutation, message)
  else:
    _logits_equal(path, model)
  finally:
    shutil.rmtree(path)
