"""Self-test of tests/draft_formats: the tiny-checkpoint writers write the published layouts and
read back bit for bit, and the PyTorch references run, are causal, and depend on every input they
claim to (so a comparison against them can fail). Torch only, a few seconds on CPU.
"""

import json
import os

import pytest
import torch

from draft_formats import _common, eagle1, eagle3, medusa

B, T = 2, 9


@pytest.fixture(scope="module", autouse=True)
def one_thread():
  with _common.one_torch_thread():
    yield


@pytest.fixture(scope="module")
def target():
  return _common.tiny_llama_target(num_hidden_layers=8, seed=0)


@pytest.fixture(scope="module")
def tokens(target):
  gen = torch.Generator().manual_seed(1)
  return torch.randint(3, target.config.vocab_size, (B, T), generator=gen)


def _files(directory):
  return sorted(os.listdir(directory))


def _config(directory):
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    return json.load(f)


def _assert_same_state(written, loaded):
  assert sorted(written) == sorted(loaded)  # safetensors stores names sorted
  for name, tensor in written.items():
    assert loaded[name].dtype == tensor.dtype, name
    assert torch.equal(loaded[name], tensor), name


def _non_degenerate(logits):
  finite = logits[torch.isfinite(logits)]
  assert finite.numel() > 0 and not torch.isnan(logits).any()
  assert finite.std() > 0.1, "logits are nearly constant"
  probs = torch.softmax(logits.float(), dim=-1)
  assert probs.max() < 0.999, "logits saturate to one-hot"


def _causal_and_sensitive(run, tokens, changed_at):
  """``run(tokens) -> tensor [B, T, ...]``: changing one token changes that step and leaves earlier ones."""
  base = run(tokens)
  other = tokens.clone()
  other[:, changed_at] = (other[:, changed_at] + 7) % 300
  alt = run(other)
  assert torch.allclose(base[:, :changed_at], alt[:, :changed_at], atol=1e-5)
  assert not torch.allclose(base[:, changed_at], alt[:, changed_at], atol=1e-3)


# --------------------------------------------------------------------------------------------------
# EAGLE-1/2


@pytest.mark.parametrize("style", ["vicuna", "llama3"])
def test_eagle1_checkpoint_layout_and_round_trip(tmp_path, target, style):
  written = eagle1.write_eagle1_checkpoint(tmp_path, target, seed=3, style=style)
  assert _files(tmp_path) == ["config.json", "pytorch_model.bin"]
  config = _config(tmp_path)
  assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
  assert config["num_hidden_layers"] == 1 and config["torch_dtype"] == "float16"
  assert config["vocab_size"] == 300 and config["hidden_size"] == 64
  if style == "vicuna":
    assert "bias" not in config and "rope_theta" not in config
    assert written["fc.bias"].shape == (64,)
  else:
    assert config["bias"] is False and config["rope_theta"] == 10000.0
    assert config["num_key_value_heads"] == 2 and "fc.bias" not in written
  assert written["fc.weight"].shape == (64, 128)
  assert written["layers.0.self_attn.q_proj.weight"].shape == (64, 64)
  assert written["layers.0.self_attn.k_proj.weight"].shape == (32, 64)
  assert "layers.0.input_layernorm.weight" not in written
  assert not any(k.startswith(("norm.", "lm_head.")) for k in written)
  assert torch.equal(written["embed_tokens.weight"].float(), target.model.embed_tokens.weight.half().float())
  assert all(v.dtype == torch.float16 for v in written.values())
  state, config = eagle1.load_eagle1(tmp_path)
  _assert_same_state(written, state)
  assert set(state) == set(eagle1.eagle1_tensor_shapes(config))


def test_eagle1_forward(tmp_path, target, tokens):
  eagle1.write_eagle1_checkpoint(tmp_path, target, seed=3, num_hidden_layers=2)
  state, config = eagle1.load_eagle1(tmp_path)
  assert "layers.1.input_layernorm.weight" in state
  draft_tokens, features = eagle1.eagle1_inputs(target, tokens)
  assert features.shape == (B, T - 1, 64)
  hidden, logits = eagle1.eagle1_forward(state, config, target, draft_tokens, features)
  assert hidden.shape == (B, T - 1, 64) and logits.shape == (B, T - 1, 300)
  _non_degenerate(logits)
  # The head is the target's lm_head on the draft's output, with no norm in between.
  assert torch.allclose(logits, hidden @ target.lm_head.weight.T, atol=1e-4)
  _causal_and_sensitive(
      lambda tk: eagle1.eagle1_forward(state, config, target, tk, features)[1], draft_tokens, 4)
  moved = features.clone()
  moved[:, 4] += 1.0
  changed = eagle1.eagle1_forward(state, config, target, draft_tokens, moved)[1]
  assert torch.allclose(changed[:, :4], logits[:, :4], atol=1e-5)
  assert not torch.allclose(changed[:, 4], logits[:, 4], atol=1e-3)
  # Rotary attention sees position differences only: one constant offset changes nothing.
  shifted = eagle1.eagle1_forward(
      state, config, target, draft_tokens, features, positions=torch.arange(1, T).expand(B, T - 1))[1]
  assert torch.allclose(shifted, logits, atol=1e-4)
  # Without its own embed_tokens the head uses the target's, of which the checkpoint holds a float16 copy.
  no_embed = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
  target_half = _common.tiny_llama_target(num_hidden_layers=8, seed=0).half().float()
  assert torch.allclose(
      eagle1.eagle1_forward(no_embed, config, target_half, draft_tokens, features)[0], hidden, atol=1e-5)
  # The draft layer is a Llama decoder layer without its input norm: check the reference's attention,
  # rotary and MLP against transformers' own layer.
  from transformers import LlamaConfig
  from transformers.models.llama import modeling_llama

  layer_config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                             num_key_value_heads=2, rms_norm_eps=config["rms_norm_eps"], rope_theta=10000.0)
  layer_config._attn_implementation = "eager"
  layer = modeling_llama.LlamaDecoderLayer(layer_config, layer_idx=0).eval()
  missing, unexpected = layer.load_state_dict(
      {k[len("layers.0."):]: v.float() for k, v in state.items() if k.startswith("layers.0.")}, strict=False)
  assert missing == ["input_layernorm.weight"] and not unexpected
  layer.input_layernorm = torch.nn.Identity()
  one_layer = dict(config, num_hidden_layers=1)
  x = torch.cat([state["embed_tokens.weight"].float()[draft_tokens], features], dim=-1)
  x = x @ state["fc.weight"].float().T + state["fc.bias"].float()
  positions = torch.arange(T - 1).expand(B, T - 1)
  rotary = modeling_llama.LlamaRotaryEmbedding(layer_config)(x, positions)
  mask = torch.full((T - 1, T - 1), float("-inf")).triu(1).expand(B, 1, T - 1, T - 1)
  with torch.no_grad():
    theirs = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
  theirs = theirs[0] if isinstance(theirs, tuple) else theirs
  ours = eagle1.eagle1_forward(state, one_layer, target, draft_tokens, features)[0]
  assert torch.allclose(ours, theirs, atol=1e-5)
  # fc.bias, when the config has one, is used.
  no_bias = dict(state, **{"fc.bias": torch.zeros_like(state["fc.bias"])})
  assert not torch.allclose(eagle1.eagle1_forward(no_bias, config, target, draft_tokens, features)[1], logits)


# --------------------------------------------------------------------------------------------------
# EAGLE-3


def test_eagle3_tap_conventions(target, tokens):
  hs = target.model(input_ids=tokens, output_hidden_states=True).hidden_states
  layers = target.config.num_hidden_layers  # 8
  assert eagle3.default_eagle3_layer_ids(layers, "safeailab") == [2, 4, 5]
  assert eagle3.default_eagle3_layer_ids(layers, "sglang") == [1, 3, 4]
  # The three published defaults name the same three tensors ...
  default = {c: eagle3.eagle3_taps(target, tokens, convention=c) for c in eagle3.TAP_CONVENTIONS}
  assert torch.equal(default["vllm"], default["safeailab"])
  assert torch.equal(default["vllm"], default["sglang"])
  assert torch.equal(default["vllm"], torch.cat([hs[2], hs[4], hs[5]], dim=-1))
  # ... while one explicit list means different layers to vLLM and to SGLang/SpecForge.
  assert eagle3.eagle3_hidden_state_indices([1, 3, 6], "vllm", layers) == [1, 3, 6]
  assert eagle3.eagle3_hidden_state_indices([1, 3, 6], "sglang", layers) == [2, 4, 7]
  assert not torch.equal(eagle3.eagle3_taps(target, tokens, [1, 3, 6], "vllm"),
                         eagle3.eagle3_taps(target, tokens, [1, 3, 6], "sglang"))
  # Layer order, whatever order the ids are listed in; a repeated layer is taken once.
  assert torch.equal(eagle3.eagle3_taps(target, tokens, [5, 2, 4], "vllm"), default["vllm"])
  assert eagle3.eagle3_taps(target, tokens, [2, 2, 5], "vllm").shape[-1] == 2 * 64
  # vLLM's id L is the last layer's output before the final norm; transformers' hs[L] is after it.
  last = eagle3.eagle3_taps(target, tokens, [layers], "vllm")
  assert torch.allclose(target.model.norm(last), hs[layers], atol=1e-5)
  assert not torch.allclose(last, hs[layers], atol=1e-2)
  with pytest.raises(ValueError):
    eagle3.eagle3_hidden_state_indices([layers - 1], "sglang", layers)  # SGLang never captures past L - 1
  with pytest.raises(ValueError):
    eagle3.eagle3_hidden_state_indices([layers], "safeailab", layers)


@pytest.mark.parametrize("flavor", ["llama3", "qwen3", "speculators"])
def test_eagle3_checkpoint_layout_and_round_trip(tmp_path, target, flavor):
  written = eagle3.write_eagle3_checkpoint(tmp_path, target, seed=5, flavor=flavor, layer_ids=[2, 4, 5])
  config = _config(tmp_path)
  layer = "midlayer." if flavor != "speculators" else "layers.0."
  expected = {
      "fc.weight": (64, 192),
      layer + "self_attn.q_proj.weight": (64, 128),
      layer + "self_attn.k_proj.weight": (32, 128),
      layer + "self_attn.v_proj.weight": (32, 128),
      layer + "self_attn.o_proj.weight": (64, 64),
      layer + "mlp.gate_proj.weight": (128, 64),
      layer + "mlp.up_proj.weight": (128, 64),
      layer + "mlp.down_proj.weight": (64, 128),
      layer + "input_layernorm.weight": (64,),
      layer + "hidden_norm.weight": (64,),
      layer + "post_attention_layernorm.weight": (64,),
      "norm.weight": (64,),
      "lm_head.weight": (128, 64),
      "d2t": (128,),
      "t2d": (300,),
  }
  if flavor == "speculators":
    expected["embed_tokens.weight"] = (300, 64)
  assert {k: tuple(v.shape) for k, v in written.items()} == expected
  assert written["d2t"].dtype == torch.int64 and written["t2d"].dtype == torch.bool
  float_dtype = {"llama3": torch.float16, "qwen3": torch.bfloat16, "speculators": torch.bfloat16}[flavor]
  assert all(v.dtype == float_dtype for k, v in written.items() if k not in ("d2t", "t2d"))
  # d2t and t2d describe one set of draft tokens: target id = draft id + d2t[draft id].
  ids = torch.arange(128) + written["d2t"]
  assert torch.equal(torch.nonzero(written["t2d"]).flatten(), ids) and written["t2d"].sum() == 128
  if flavor == "speculators":
    assert _files(tmp_path) == ["config.json", "model.safetensors"]
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["draft_vocab_size"] == 128 and config["norm_before_residual"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["transformer_layer_config"]["vocab_size"] == 300
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["speculators_config"]["algorithm"] == "eagle3"
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
  else:
    weights = "pytorch_model.bin" if flavor == "llama3" else "model.safetensors"
    assert _files(tmp_path) == ["config.json", weights]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["draft_vocab_size"] == 128 and config["vocab_size"] == 300
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert ("head_dim" in config) == (flavor == "qwen3") and ("rope_theta" in config) == (flavor == "qwen3")
  state, config = eagle3.load_eagle3(tmp_path)
  _assert_same_state(written, state)


def test_eagle3_forward(tmp_path, target, tokens):
  eagle3.write_eagle3_checkpoint(tmp_path, target, seed=5, flavor="llama3")
  state, config = eagle3.load_eagle3(tmp_path)
  draft_tokens, taps = eagle3.eagle3_inputs(target, tokens, convention="safeailab")
  hidden, logits = eagle3.eagle3_forward(state, config, target, draft_tokens, taps)
  assert hidden.shape == (B, T - 1, 64) and logits.shape == (B, T - 1, 128)
  _non_degenerate(logits)
  _causal_and_sensitive(lambda tk: eagle3.eagle3_forward(state, config, target, tk, taps)[1], draft_tokens, 3)
  for part in range(3):  # each of the three taps matters
    moved = taps.clone()
    moved[:, 3, part * 64:(part + 1) * 64] += 1.0
    assert not torch.allclose(eagle3.eagle3_forward(state, config, target, draft_tokens, moved)[1][:, 3],
                              logits[:, 3], atol=1e-3)
  # logits = lm_head(norm(hidden)); the fed-back hidden is pre-norm.
  normed = _common.rms_norm(hidden, state["norm.weight"], 1e-5)
  assert torch.allclose(logits, normed @ state["lm_head.weight"].float().T, atol=1e-4)
  # A later step feeds the hidden back and skips fc.
  again, again_logits = eagle3.eagle3_forward(state, config, target, draft_tokens, hidden=hidden)
  assert again.shape == hidden.shape and not torch.allclose(again_logits, logits, atol=1e-3)
  with pytest.raises(ValueError):
    eagle3.eagle3_forward(state, config, target, draft_tokens, taps[..., :128])
  # Draft logits land on the target ids d2t names, -inf elsewhere.
  full = eagle3.eagle3_target_logits(logits, state, config)
  assert full.shape == (B, T - 1, 300)
  assert torch.equal(torch.isfinite(full[0, 0]), state["t2d"])
  assert torch.equal(full.argmax(-1), logits.argmax(-1) + state["d2t"][logits.argmax(-1)])
  shifted = eagle3.eagle3_forward(
      state, config, target, draft_tokens, taps, positions=torch.arange(1, T).expand(B, T - 1))[1]
  assert torch.allclose(shifted, logits, atol=1e-4)


def test_eagle3_layouts_agree(tmp_path, target, tokens):
  """One seed, both layouts: the SafeAILab head and its speculators form compute the same thing."""
  eagle3.write_eagle3_checkpoint(tmp_path / "a", target, seed=6, flavor="llama3", dtype=torch.float32)
  eagle3.write_eagle3_checkpoint(tmp_path / "b", target, seed=6, flavor="speculators", dtype=torch.float32)
  draft_tokens, taps = eagle3.eagle3_inputs(target, tokens)
  out = [eagle3.eagle3_forward(*eagle3.load_eagle3(tmp_path / d), target, draft_tokens, taps) for d in "ab"]
  assert torch.allclose(out[0][1], out[1][1], atol=1e-5) and torch.allclose(out[0][0], out[1][0], atol=1e-5)
  # The speculators-layout reference: the library where it imports, this package's otherwise.
  from draft_formats import speculators_eagle3

  hidden, logits, source = speculators_eagle3.reference_forward(tmp_path / "b", target, draft_tokens, taps)
  assert source == ("speculators" if speculators_eagle3.available() else "draft_formats")
  assert torch.allclose(logits, out[1][1], atol=1e-4) and torch.allclose(hidden, out[1][0], atol=1e-4)
  # norm_before_residual (speculators) changes the residual, hence the result.
  eagle3.write_eagle3_checkpoint(
      tmp_path / "c", target, seed=6, flavor="speculators", dtype=torch.float32, norm_before_residual=True)
  nbr = eagle3.eagle3_forward(*eagle3.load_eagle3(tmp_path / "c"), target, draft_tokens, taps)[1]
  assert not torch.allclose(nbr, out[1][1], atol=1e-3)


def test_eagle3_variants(tmp_path, target, tokens):
  """Full vocabulary (no d2t/t2d), a draft of another width (own embed_tokens, target_hidden_size),
  and speculators' fc norms."""
  full = eagle3.write_eagle3_checkpoint(tmp_path / "full", target, flavor="speculators", draft_vocab_size=300)
  assert "d2t" not in full and "t2d" not in full and full["lm_head.weight"].shape == (300, 64)
  draft_tokens, taps = eagle3.eagle3_inputs(target, tokens)
  state, config = eagle3.load_eagle3(tmp_path / "full")
  logits = eagle3.eagle3_forward(state, config, target, draft_tokens, taps)[1]
  assert torch.equal(eagle3.eagle3_target_logits(logits, state, config), logits)

  wide = eagle3.write_eagle3_checkpoint(tmp_path / "wide", target, flavor="llama3", draft_hidden_size=96)
  config = _config(tmp_path / "wide")
  assert config["target_hidden_size"] == 64 and config["hidden_size"] == 96
  assert wide["fc.weight"].shape == (96, 192) and wide["embed_tokens.weight"].shape == (300, 96)
  assert wide["midlayer.self_attn.q_proj.weight"].shape == (96, 192)
  hidden, logits = eagle3.eagle3_forward(*eagle3.load_eagle3(tmp_path / "wide"), target, draft_tokens, taps)
  assert hidden.shape == (B, T - 1, 96)
  _non_degenerate(logits)

  normed = eagle3.write_eagle3_checkpoint(
      tmp_path / "normed", target, flavor="speculators", norm_before_fc=True, fc_norm=False, norm_output=True)
  assert normed["input_norm.weight"].shape == (192,)
  state, config = eagle3.load_eagle3(tmp_path / "normed")
  hidden, logits = eagle3.eagle3_forward(state, config, target, draft_tokens, taps)
  # norm_output: the fed-back hidden is the normed one, the very input of lm_head.
  assert torch.allclose(logits, hidden @ state["lm_head.weight"].float().T, atol=1e-4)

  fcn = eagle3.write_eagle3_checkpoint(tmp_path / "fcn", target, flavor="qwen3", fc_norm=True)
  assert [fcn[f"fc_norm.{i}.weight"].shape for i in range(3)] == [(64,)] * 3
  assert _config(tmp_path / "fcn")["fc_norm"] is True
  _non_degenerate(eagle3.eagle3_forward(*eagle3.load_eagle3(tmp_path / "fcn"), target, draft_tokens, taps)[1])


@pytest.mark.parametrize("options", [{}, {"norm_before_residual": True},
                                     {"norm_before_fc": True, "norm_output": True},
                                     {"fc_norm": True, "include_embed_tokens": False}])
def test_eagle3_speculators_library_agrees(tmp_path, target, tokens, options):
  """Where the speculators package is importable, its own Eagle3 modules compute what the reference does."""
  pytest.importorskip("speculators")
  from draft_formats import speculators_eagle3

  eagle3.write_eagle3_checkpoint(
      tmp_path, target, seed=7, flavor="speculators", dtype=torch.float32, **options)
  draft_tokens, taps = eagle3.eagle3_inputs(target, tokens)
  state, config = eagle3.load_eagle3(tmp_path)
  ours = eagle3.eagle3_forward(state, config, target, draft_tokens, taps)
  theirs = speculators_eagle3.forward(tmp_path, target, draft_tokens, taps)
  assert torch.allclose(ours[1], theirs[1], atol=1e-4) and torch.allclose(ours[0], theirs[0], atol=1e-4)
  assert speculators_eagle3.reference_forward(tmp_path, target, draft_tokens, taps)[2] == "speculators"
  # The library's training forward, one step, positions 1 + arange: the same argmax.
  library = speculators_eagle3.first_step_tokens(tmp_path, target, draft_tokens[:1], taps[:1])
  assert torch.equal(library, ours[1][:1].argmax(-1))


# --------------------------------------------------------------------------------------------------
# Medusa


def test_medusa_fasterdecoding_layout(tmp_path, target, tokens):
  written = medusa.write_medusa_checkpoint(
      tmp_path, target, seed=9, num_heads=3, num_layers=2, config_num_heads=2)
  assert _files(tmp_path) == ["config.json", "medusa_lm_head.pt"]
  assert _config(tmp_path) == {
      "base_model_name_or_path": "tiny-llama-target",
      "medusa_num_heads": 2,  # as published: the config under-counts the heads the file holds
      "medusa_num_layers": 2,
      "transformers_version": "4.31.0",
  }
  names = {f"{h}.{l}.linear.{p}" for h in range(3) for l in range(2) for p in ("weight", "bias")}
  names |= {f"{h}.2.weight" for h in range(3)}
  assert set(written) == names
  assert written["0.0.linear.weight"].shape == (64, 64) and written["0.2.weight"].shape == (300, 64)
  assert torch.equal(written["1.0.linear.weight"], written["1.1.linear.weight"])  # one shared ResBlock
  assert all(v.dtype == torch.float16 for v in written.values())
  state, config = medusa.load_medusa(tmp_path)
  _assert_same_state(written, state)
  features = medusa.medusa_features(target, tokens)
  logits = medusa.medusa_forward(state, config, features)
  assert logits.shape == (B, T, 3, 300)
  for k in range(3):
    _non_degenerate(logits[:, :, k])
  assert not torch.allclose(logits[:, :, 0], logits[:, :, 1], atol=1e-3)
  # By hand: head 2, block applied twice with its shared weights.
  w, b, head = (state[n].float() for n in ("2.0.linear.weight", "2.0.linear.bias", "2.2.weight"))
  x = features
  for _ in range(2):
    x = x + torch.nn.functional.silu(x @ w.T + b)
  assert torch.allclose(logits[:, :, 2], x @ head.T, atol=1e-4)
  moved = features.clone()
  moved[:, 5] += 0.5
  changed = medusa.medusa_forward(state, config, moved)
  assert torch.equal(changed[:, :5], logits[:, :5])
  assert not torch.allclose(changed[:, 5], logits[:, 5], atol=1e-3)
  broken = dict(state, **{"1.1.linear.weight": state["1.1.linear.weight"] + 1})
  with pytest.raises(ValueError):
    medusa.medusa_forward(broken, config, features)


def test_medusa_vllm_layout(tmp_path, target, tokens):
  written = medusa.write_medusa_checkpoint(tmp_path / "v", target, seed=9, layout="vllm", num_heads=3)
  assert _files(tmp_path / "v") == ["config.json", "model.safetensors"]
  config = _config(tmp_path / "v")
  assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
  assert (config["num_heads"], config["num_hidden_layers"], config["hidden_size"]) == (3, 1, 64)
  assert config["vocab_size"] == config["truncated_vocab_size"] == 300 and "medusa_fc_bias" not in config
  assert set(written) == ({f"blocks.{h}.layers.0.weight" for h in range(3)}
                          | {f"lm_heads.{h}.weight" for h in range(3)})
  state, config = medusa.load_medusa(tmp_path / "v")
  _assert_same_state(written, state)
  features = medusa.medusa_features(target, tokens)
  assert medusa.medusa_forward(state, config, features).shape == (B, T, 3, 300)

  # Same seed, one layer, biases on both sides: the two layouts hold the same heads.
  medusa.write_medusa_checkpoint(tmp_path / "fd", target, seed=4, num_heads=2)
  medusa.write_medusa_checkpoint(tmp_path / "vb", target, seed=4, layout="vllm", num_heads=2, fc_bias=True)
  assert _config(tmp_path / "vb")["medusa_fc_bias"] is True
  fd = medusa.medusa_forward(*medusa.load_medusa(tmp_path / "fd"), features)
  vb = medusa.medusa_forward(*medusa.load_medusa(tmp_path / "vb"), features)
  assert torch.equal(fd, vb)

  # A truncated vocabulary: token_map, heads of that many rows, -inf elsewhere.
  trunc = medusa.write_medusa_checkpoint(
      tmp_path / "t", target, seed=4, layout="vllm", num_heads=2, fc_bias=True, truncated_vocab_size=100)
  assert trunc["token_map"].dtype == torch.int64 and trunc["lm_heads.0.weight"].shape == (100, 64)
  logits = medusa.medusa_forward(*medusa.load_medusa(tmp_path / "t"), features)
  assert logits.shape == (B, T, 2, 300) and torch.isfinite(logits).sum(-1).eq(100).all()
  kept = trunc["token_map"]
  assert torch.allclose(logits[..., kept], vb[..., kept], atol=1e-5)
