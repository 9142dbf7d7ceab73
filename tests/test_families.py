"""Every model family against transformers' own PyTorch implementation (f32), through its checkpoint.

For each family: tiny random HF models built here (several head counts, odd vocabularies, tied and
untied heads where the family allows, the family's variants), saved with ``save_pretrained``, loaded by
``bass_jax.load_model``, compared with transformers' logits (max |diff| <= 1e-4), decoded in ragged
chunks through the cache, and converted back to an HF directory that transformers reloads to the same
logits. Then greedy BASS against greedy regular decoding for an OPT pair and a CodeGen pair, and
corrupt checkpoints that must fail with a clear error.
"""

import json

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

import bass_jax as bj
from conftest import PYTHON, chunked_logits, right_padded

VOCAB = 97  # odd on purpose
# GPT-2's and CodeGen's configs default to the stop id 50256, outside VOCAB, which a config.json may not
# hold (checkpoints.config_schema): these tiny ones have none.
NO_EOS = dict(bos_token_id=None, eos_token_id=None)

FAMILIES = {
    "opt-pre-ln-projected": (transformers.OPTForCausalLM, transformers.OPTConfig, dict(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, ffn_dim=80, num_attention_heads=4,
        word_embed_proj_dim=32, max_position_embeddings=128)),
    "opt-post-ln-untied": (transformers.OPTForCausalLM, transformers.OPTConfig, dict(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, ffn_dim=64, num_attention_heads=6,
        do_layer_norm_before=False, tie_word_embeddings=False, max_position_embeddings=128)),
    "opt-no-bias-no-affine": (transformers.OPTForCausalLM, transformers.OPTConfig, dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
        enable_bias=False, layer_norm_elementwise_affine=False, max_position_embeddings=128)),
    "codegen": (transformers.CodeGenForCausalLM, transformers.CodeGenConfig, dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128, n_ctx=128,
        **NO_EOS)),
    "codegen-8-heads-tied": (transformers.CodeGenForCausalLM, transformers.CodeGenConfig, dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=8, rotary_dim=4, n_positions=128, n_ctx=128,
        tie_word_embeddings=True, **NO_EOS)),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config, dict(
        vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=3, n_positions=128, **NO_EOS)),
    "gpt2-untied-unscaled": (transformers.GPT2LMHeadModel, transformers.GPT2Config, dict(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, tie_word_embeddings=False,
        scale_attn_weights=False, activation_function="gelu", **NO_EOS)),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128)),
    "qwen2-tied-mha": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
        max_position_embeddings=128)),
    "mistral-window-5": (transformers.MistralForCausalLM, transformers.MistralConfig, dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, sliding_window=5,
        max_position_embeddings=128)),
    "mistral-no-window": (transformers.MistralForCausalLM, transformers.MistralConfig, dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=1, sliding_window=None,
        max_position_embeddings=128)),
    # Today's families: rotary scaling, q/k norms, Gemma's norms, soft caps and alternating windows,
    # Phi-3's fused projections and partial rotary. Windows shorter than the 23-token prompts, caps
    # small enough to bind.
    "llama3-rope": (transformers.LlamaForCausalLM, transformers.LlamaConfig, dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32})),
    "qwen2-yarn": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config, dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32, "beta_fast": 16.0})),
    "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=128)),
    "qwen3-tied-window-layers": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config, dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, tie_word_embeddings=True,
        use_sliding_window=True, sliding_window=5, max_window_layers=1,
        max_position_embeddings=128)),
    "gemma2-softcap": (transformers.Gemma2ForCausalLM, transformers.Gemma2Config, dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=5, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
        max_position_embeddings=128)),
    "gemma3-local-global": (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig, dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=5, sliding_window_pattern=3, max_position_embeddings=128,
        attn_logit_softcapping=2.0,  # inert in transformers' Gemma 3: the port must ignore it too
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 100000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    "phi3-partial-longrope": (transformers.Phi3ForCausalLM, transformers.Phi3Config, dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=7, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, max_position_embeddings=128,
        original_max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5, "short_factor": [1.0, 1.2, 1.5, 2.0],
                         "long_factor": [1.0, 2.0, 4.0, 8.0]})),
}


def _hf_model(name, seed=0, **overrides):
  model_cls, config_cls, fields = FAMILIES[name]
  config = config_cls(**{**fields, **overrides})
  config._attn_implementation = "eager"  # the plainest reference path (masks, windows)
  torch.manual_seed(seed)
  model = model_cls(config).eval()
  with torch.no_grad():  # every parameter random, norms and biases included, so a slip shows
    for pname, p in model.named_parameters():
      if pname.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
      elif p.ndim == 1:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.25 * torch.randn_like(p))
  return model


def _torch_logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens))).logits.numpy()


# Time: families whose cached decoding differs from an older family's only by their rotary tables
# (positions are the same, so the chunked decode adds nothing to the logits check), and families whose
# features no EAGLE draft reads (eagle.target_types()) or another case of the family covers.
ROTARY_ONLY = {"llama3-rope", "qwen2-yarn"}
FEATURES_ELSEWHERE = ROTARY_ONLY | {"gemma2-softcap", "gemma3-local-global",
                                    "qwen3-tied-window-layers"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def converted(request, tmp_path_factory):
  name = request.param
  hf = _hf_model(name)
  path = tmp_path_factory.mktemp(name)
  hf.save_pretrained(path)
  return name, hf, path, bj.load_model(path)


def test_logits_match_transformers(converted):
  name, hf, _, model = converted
  # The shape of test_cached_incremental_decoding_equals_full_forward's full forward (and of the
  # features test's): one model.logits program per family serves the three tests.
  tokens = np.random.default_rng(1).integers(0, VOCAB, size=(3, 30))
  want = _torch_logits(hf, tokens)
  got = np.asarray(model.logits(tokens))
  assert np.std(want) > 0.5, name  # logits that discriminate
  assert np.abs(got - want).max() <= 1e-4, (name, np.abs(got - want).max())
  assert model.config.model_type == hf.config.model_type
  assert bj.loading.count_params(model.params) == model.config.num_params()


def test_features_are_transformers_last_hidden_state_and_what_the_head_reads(converted):
  """forward(return_features=True): the LM head's input, equal to the base model's last_hidden_state
  (the feature an EAGLE draft reads), through a ragged cache as in a decode, without changing logits."""
  from bass_jax.models import common

  # Jitted, as a decode runs it: three programs, where op-by-op dispatch compiles every op's shapes.
  forward = jax.jit(common.forward, static_argnums=0,
                    static_argnames=("return_features", "compute_logits"))
  name, hf, _, model = converted
  if name in FEATURES_ELSEWHERE:
    pytest.skip("features checked on another case of the family, or not read by any EAGLE draft")
  rng = np.random.default_rng()
  tokens = rng.integers(0, VOCAB, size=(3, 30))  # test_logits_match_transformers' shape
  with torch.no_grad():
    want = hf.base_model(torch.tensor(tokens)).last_hidden_state.numpy()
  logits, _, features = forward(model.config, model.params, tokens, return_features=True)
  assert features.shape == want.shape and np.std(want) > 0.1, name
  np.testing.assert_allclose(np.asarray(features), want, atol=1e-4, rtol=1e-4, err_msg=name)
  # The same arithmetic compiled twice (here and in model.logits' jit): f32 rounding apart.
  np.testing.assert_allclose(np.asarray(logits), np.asarray(model.logits(tokens)), atol=1e-4,
                             rtol=1e-5, err_msg=name)
  # In a decode: a prefill of different lengths per row, then 3 more tokens through the cache; the
  # unwritten slots hold NaN, so a stray read shows.
  cache = model.config.init_cache(2, 64, fill_value=np.nan)
  prefill = np.array([7, 12])
  _, update = forward(model.config, model.params, tokens[:2, :12], compute_logits=False)
  cache = cache.append(update).with_lengths(prefill)
  chunk = np.stack([tokens[0, 7:10], tokens[1, 12:15]])
  _, _, step_features = forward(model.config, model.params, chunk, cache, return_features=True)
  np.testing.assert_allclose(np.asarray(step_features), np.stack([want[0, 7:10], want[1, 12:15]]),
                             atol=1e-4, rtol=1e-4, err_msg=name)


def test_cached_incremental_decoding_equals_full_forward(converted):
  name, _, _, model = converted
  if name in ROTARY_ONLY:
    pytest.skip("the same positions as the family's default-rotary case; logits checked above")
  rng = np.random.default_rng(2)
  seqs = [rng.integers(0, VOCAB, n) for n in (21, 9, 30)]
  got = chunked_logits(model, seqs, prefill=[4, 1, 8])  # a prefill of 8: the chunk-8 program
  # One full causal forward of the rows padded to the longest: a position's logits depend only on the
  # tokens up to it, so each row's own positions are its forward alone (one program, not three).
  whole = np.asarray(model.logits(right_padded(seqs)))
  for seq, row, want in zip(seqs, got, whole):
    assert np.isfinite(row).all(), name
    np.testing.assert_allclose(row, want[:len(seq)], atol=1e-4, rtol=0, err_msg=name)


def test_round_trip_back_to_transformers(converted, tmp_path):
  name, hf, _, model = converted
  bj.save_model(model, tmp_path)
  reloaded = type(hf).from_pretrained(tmp_path, attn_implementation="eager").eval()
  tokens = np.random.default_rng(3).integers(0, VOCAB, size=(2, 17))
  np.testing.assert_allclose(_torch_logits(reloaded, tokens), _torch_logits(hf, tokens), atol=1e-5,
                             err_msg=name)
  again = bj.load_model(tmp_path)
  assert again.config == model.config
  jax.tree_util.tree_map(np.testing.assert_array_equal, again.params, model.params)


def test_pytorch_bin_input(tmp_path):
  hf = _hf_model("codegen")
  hf.config.save_pretrained(tmp_path)
  torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
  tokens = np.random.default_rng(4).integers(0, VOCAB, size=(1, 12))
  got = np.asarray(bj.load_model(tmp_path).logits(tokens))
  assert np.abs(got - _torch_logits(hf, tokens)).max() <= 1e-4


@pytest.mark.parametrize("family", ["opt-pre-ln-projected", "codegen", "gpt2", "mistral-window-5",
                                    "qwen3"])
def test_scanned_layers_match_transformers_and_save_as_per_layer(family, tmp_path):
  """load_model(scan_layers=True) runs the layers in a lax.scan over stacked weights and a stacked
  cache: its logits, in a full forward and decoded through a ragged NaN-padded cache, are
  transformers'; a save writes Hugging Face's per-layer tensors back; left out, the layout is the
  backend profile's."""
  from bass_jax import profiles

  hf = _hf_model(family, seed=2)
  hf.save_pretrained(tmp_path / "hf")
  model = bj.load_model(tmp_path / "hf", scan_layers=True)
  assert model.scanned_layers
  assert bj.load_model(tmp_path / "hf").scanned_layers == profiles.backend_profile().scan_layers
  rng = np.random.default_rng()
  seqs = [rng.integers(0, VOCAB, n) for n in (19, 7, 26)]
  np.testing.assert_allclose(np.asarray(model.logits(seqs[0][None]))[0],
                             _torch_logits(hf, seqs[0][None])[0], atol=1e-4, rtol=0, err_msg=family)
  for seq, row in zip(seqs, chunked_logits(model, seqs, prefill=[5, 1, 8])):
    assert np.isfinite(row).all(), family
    np.testing.assert_allclose(row, _torch_logits(hf, seq[None])[0], atol=1e-4, rtol=0,
                               err_msg=family)
  bj.save_model(model, tmp_path / "saved")
  again = bj.load_model(tmp_path / "saved", scan_layers=False)
  jax.tree_util.tree_map(np.testing.assert_array_equal, again.params,
                         model.with_scanned_layers(False).params)


def test_scanned_drafts_cuts_and_hidden_states_follow_the_layout(tmp_path):
  """load_draft gives a draft its target's layout unless told; with_first_layers cuts a scanned model
  as an unrolled one; the sown hidden states (EAGLE-3's fused features) are the same in both
  layouts; a mesh or an EAGLE draft with scan_layers=True is refused before any weight is read."""
  from bass_jax.models.common import forward

  hf = _hf_model("qwen2", seed=3)
  hf.save_pretrained(tmp_path / "target")
  hf.save_pretrained(tmp_path / "draft")
  unrolled = bj.load_model(tmp_path / "target", scan_layers=False)
  scanned = bj.load_model(tmp_path / "target", scan_layers=True)
  assert bj.load_draft(tmp_path / "draft", scanned).scanned_layers
  assert not bj.load_draft(tmp_path / "draft", scanned, scan_layers=False).scanned_layers
  assert not bj.load_draft(str(tmp_path / "target"), scanned, scan_layers=False).scanned_layers
  tokens = np.random.default_rng().integers(0, VOCAB, size=(2, 9))
  cut = scanned.with_first_layers(1)
  assert cut.scanned_layers and cut.config.num_layers == 1
  np.testing.assert_allclose(np.asarray(cut.logits(tokens)),
                             np.asarray(unrolled.with_first_layers(1).logits(tokens)), atol=1e-5)
  want = forward(unrolled.config, unrolled.params, tokens, return_features=True, hidden_layers=(0, 1))
  got = forward(scanned.config, scanned.params, tokens, return_features=True, hidden_layers=(0, 1))
  for a, b in zip(want[2:], got[2:]):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
  mesh = jax.make_mesh((1, 1), ("data", "model"))
  with pytest.raises(ValueError, match="scanned layers do not run sharded"):
    bj.load_model(tmp_path / "nowhere", scan_layers=True, mesh=mesh)  # refused before the path


@pytest.mark.parametrize("family", ["opt-pre-ln-projected", "codegen"])
def test_greedy_bass_equals_regular_for_a_family_pair(family, tmp_path):
  """A 2-layer target and a 1-layer draft of the same family and vocabulary, both random."""
  hf_target = _hf_model(family, seed=0)
  hf_target.save_pretrained(tmp_path / "target")
  layer_field = "n_layer" if family == "codegen" else "num_hidden_layers"
  _hf_model(family, seed=1, **{layer_field: 1}).save_pretrained(tmp_path / "draft")
  target, draft = bj.load_model(tmp_path / "target"), bj.load_model(tmp_path / "draft")
  prompts = [np.random.default_rng(i).integers(0, VOCAB, n).tolist() for i, n in enumerate((3, 11, 6))]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=24, eos_token_id=())
  for draft_len in (2, "dynamic"):
    bass = bj.generate(target, draft, prompts, method="bass", max_new_tokens=24, eos_token_id=(),
                       draft_len=draft_len)
    assert np.array_equal(bass.tokens, regular.tokens), (family, draft_len)
  # the same target as its own draft: every draft accepted, still the same tokens
  bass = bj.generate(target, target, prompts, method="bass", max_new_tokens=24, eos_token_id=(),
                     draft_len=3)
  assert np.array_equal(bass.tokens, regular.tokens)
  assert (bass.stats.accepted[bass.stats.accepted >= 0] == 3).all()


@pytest.mark.parametrize("family", ["qwen3", "gemma2-softcap", "gemma3-local-global",
                                    "phi3-partial-longrope"])
def test_greedy_bass_equals_regular_for_todays_families(family, tmp_path):
  """A target and a 1-layer draft of the family, both random: q/k norms, soft caps, alternating
  windows and rotary bases, partial rotary. Prompts longer than the windows."""
  _hf_model(family, seed=0).save_pretrained(tmp_path / "target")
  _hf_model(family, seed=1, num_hidden_layers=1).save_pretrained(tmp_path / "draft")
  target, draft = bj.load_model(tmp_path / "target"), bj.load_model(tmp_path / "draft")
  prompts = [np.random.default_rng(i).integers(0, VOCAB, n).tolist() for i, n in enumerate((9, 3, 14))]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=20, eos_token_id=())
  bass = bj.generate(target, draft, prompts, method="bass", max_new_tokens=20, eos_token_id=(),
                     draft_len=3)
  assert np.array_equal(bass.tokens, regular.tokens), family
  assert len({tuple(row) for row in regular.tokens}) == 3  # the rows differ


def test_a_gemma2_target_runs_bass_pad_and_split_in_the_pallas_kernels(tmp_path):
  """Soft caps and per-layer windows through both Pallas kernels (interpreted here): greedy BASS-PAD
  and BASS-SPLIT emit the reference attention's tokens."""
  _hf_model("gemma2-softcap", seed=0).save_pretrained(tmp_path / "target")
  _hf_model("gemma2-softcap", seed=1, num_hidden_layers=1).save_pretrained(tmp_path / "draft")
  target, draft = bj.load_model(tmp_path / "target"), bj.load_model(tmp_path / "draft")
  # test_greedy_bass_equals_regular_for_todays_families[gemma2-softcap]'s prompts and draft length:
  # the reference run is its program.
  prompts = [np.random.default_rng(i).integers(0, VOCAB, n).tolist() for i, n in enumerate((9, 3, 14))]
  run = lambda impl: bj.generate(target, draft, prompts, method="bass", max_new_tokens=8,
                                 eos_token_id=(), draft_len=3, attention_impl=impl).tokens
  want = run("reference")
  for impl in ("pallas_pad", "pallas_split"):
    assert np.array_equal(run(impl), want), impl


def test_a_multimodal_gemma3_checkpoint_loads_its_text_decoder(tmp_path):
  """``Gemma3ForConditionalGeneration`` (gemma-3-4b-it and up): the ``text_config`` and the language
  model's tensors, under transformers 4's names (``language_model.model.*``, as save_pretrained
  writes them) and 5's (``model.language_model.*``); the vision tower is not read."""
  text = FAMILIES["gemma3-local-global"][2]
  vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=14)
  config = transformers.Gemma3Config(text_config=transformers.Gemma3TextConfig(**text),
                                     vision_config=vision, mm_tokens_per_image=4)
  config.text_config._attn_implementation = "eager"
  torch.manual_seed(0)
  hf = transformers.Gemma3ForConditionalGeneration(config).eval()
  with torch.no_grad():
    for p in hf.parameters():
      p.add_(0.2 * torch.randn_like(p))
  hf.save_pretrained(tmp_path)
  tokens = np.random.default_rng(5).integers(0, VOCAB, size=(2, 19))
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(tokens)).logits.numpy()
  tensors = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
  assert any(name.startswith("vision_tower.") for name in tensors)
  for layout in ("transformers 4", "transformers 5"):
    if layout == "transformers 5":
      renamed = {name.replace("language_model.model.", "model.language_model.")
                 .replace("vision_tower.", "model.vision_tower."): value
                 for name, value in tensors.items()}
      safetensors.numpy.save_file(renamed, str(tmp_path / "model.safetensors"))
    model = bj.load_model(tmp_path)
    assert model.config.model_type == "gemma3_text" and model.config.local_rope is not None
    np.testing.assert_allclose(np.asarray(model.logits(tokens)), want, atol=1e-4, rtol=0,
                               err_msg=layout)


def test_layers_of_two_kinds_cut_but_do_not_scan(tmp_path):
  """Gemma's sliding and global layers differ in a static field, so one scanned layer cannot be both:
  refused at load. A draft cut from the first layers keeps their kinds."""
  _hf_model("gemma3-local-global").save_pretrained(tmp_path)
  with pytest.raises(ValueError, match="alternates layer kinds.*scan_layers=False"):
    bj.load_model(tmp_path, scan_layers=True)
  model = bj.load_model(tmp_path)
  cut = model.with_first_layers(2)
  assert cut.config.layer_types == model.config.layer_types[:2] == ("sliding_attention",
                                                                     "sliding_attention")
  assert bj.load_model(tmp_path, num_layers=1).config.layer_types == ("sliding_attention",)
  np.testing.assert_array_equal(np.isfinite(cut.logits(np.arange(9)[None])), True)


# config.json of published checkpoints, as their authors wrote them (transformers 4.x spellings,
# remote-code fields); the long factor lists are shortened to their length's worth of ones.
_REMOTE = {"auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                        "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"}}
_BOOKKEEPING = {"torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True,
                "initializer_range": 0.02}
PUBLISHED_CONFIGS = {
    "Llama-3.2-1B-Instruct": ({
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256, **_BOOKKEEPING},
        dict(max_positions=131072, rope="llama3", window=None)),
    "Qwen3-0.6B": ({
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
        "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
        **_BOOKKEEPING}, dict(max_positions=40960, rope="default", window=None)),
    "Phi-3-mini-4k-instruct": ({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
        "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
        "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
        "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
        "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064, **_REMOTE,
        **_BOOKKEEPING}, dict(max_positions=4096, rope="default", window=2047)),
    "Phi-4-mini-instruct": ({
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
        "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
        "interpolate_factor": 1, "lm_head_bias": False, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "phi3", "num_attention_heads": 24,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "original_max_position_embeddings": 4096,
        "pad_token_id": 199999, "partial_rotary_factor": 0.75, "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": [1.0] * 48, "short_factor": [1.0] * 48, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True,
        "vocab_size": 200064, **_REMOTE, **_BOOKKEEPING},
        dict(max_positions=4096, rope="longrope", window=None)),
    "gemma-3-4b-it": ({
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                        "model_type": "gemma3_text", "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16,
                          "num_hidden_layers": 27, "patch_size": 14,
                          "vision_use_head": False}},
        dict(max_positions=131072, rope="linear", window=1024)),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_published_configs_are_read(name, tmp_path):
  """The config.json files users bring (remote-code fields, 4.x rotary spellings, a multimodal
  Gemma 3) read without weights, through load_model's reader and the command line's preflight."""
  from bass_jax import preflight
  from bass_jax.checkpoints import hf

  fields, want = PUBLISHED_CONFIGS[name]
  (tmp_path / "config.json").write_text(json.dumps(fields))
  config = hf.read_config(tmp_path)
  assert config.max_positions == want["max_positions"], name
  assert config.rotary.rope_type == want["rope"] and config.sliding_window == want["window"], name
  source = preflight.inspect_model(str(tmp_path))
  assert (source.context, source.vocab_size) == (config.max_positions, config.vocab_size)


# -- corrupt inputs -------------------------------------------------------------------------------

def _checkpoint(tmp_path, family):
  _hf_model(family).save_pretrained(tmp_path)
  return tmp_path, safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize("family,tensor", [
    ("opt-pre-ln-projected", "model.decoder.layers.1.fc2.weight"),
    ("codegen", "transformer.h.0.attn.qkv_proj.weight"),
    ("gpt2", "transformer.wpe.weight"),
    ("qwen2", "model.layers.1.self_attn.k_proj.bias"),
])
def test_missing_tensor_is_named(tmp_path, family, tensor):
  path, tensors = _checkpoint(tmp_path, family)
  del tensors[tensor]
  safetensors.numpy.save_file(tensors, str(path / "model.safetensors"))
  with pytest.raises(ValueError, match="missing tensor.*" + tensor.replace(".", r"\.")):
    bj.load_model(path)


@pytest.mark.parametrize("family,tensor", [
    ("opt-pre-ln-projected", "model.decoder.project_in.weight"),
    ("codegen", "transformer.h.1.mlp.fc_in.bias"),
    ("gpt2", "transformer.h.0.attn.c_attn.weight"),
    ("mistral-window-5", "model.layers.0.self_attn.o_proj.weight"),
])
def test_wrong_shape_is_named(tmp_path, family, tensor):
  path, tensors = _checkpoint(tmp_path, family)
  tensors[tensor] = np.ascontiguousarray(tensors[tensor][..., :-2])
  safetensors.numpy.save_file(tensors, str(path / "model.safetensors"))
  with pytest.raises(ValueError, match=tensor.replace(".", r"\.")) as error:
    bj.load_model(path)
  assert str(error.value).startswith(f"{path}: ")  # the checkpoint is named, however late the tensor


@pytest.mark.parametrize("family,field,value,match", [
    ("opt-pre-ln-projected", "model_type", "bloom", "unsupported model_type 'bloom'"),
    ("opt-pre-ln-projected", "alibi", True, "alibi"),
    ("codegen", "rotary_embedding_base", 5000, "rotary_embedding_base"),
    ("codegen", "n_head", 6, "multiple of 4"),
    ("gpt2", "scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx"),
    ("gpt2", "add_cross_attention", True, "add_cross_attention"),
    ("gemma3-local-global", "use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("qwen3", "rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                  "low_freq_factor": 1.0}, "low_freq_factor"),
    ("mistral-window-5", "rope_parameters", {"rope_type": "proportional", "rope_theta": 1e4},
     "proportional"),
    ("mistral-window-5", "model_type", None, "unsupported model_type None"),
])
def test_unsupported_config_is_rejected(tmp_path, family, field, value, match):
  path, _ = _checkpoint(tmp_path, family)
  config = json.loads((path / "config.json").read_text())
  if value is None:
    config.pop(field)
  else:
    config[field] = value
  (path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=match):
    bj.load_model(path)


def test_convert_script_round_trip(tmp_path):
  """experiments/convert.py: HF -> orbax -> HF, logits preserved end to end."""
  import os
  import subprocess

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  hf = _hf_model("gpt2")
  hf.save_pretrained(tmp_path / "hf")
  for src, dst, fmt in (("hf", "orbax", "orbax"), ("orbax", "hf2", "safetensors")):
    result = subprocess.run([PYTHON, "-m", "experiments.convert", f"--from={tmp_path / src}",
                             f"--to={tmp_path / dst}", f"--format={fmt}"], cwd=repo,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
  assert (tmp_path / "orbax" / "params").is_dir()
  tokens = np.random.default_rng(5).integers(0, VOCAB, size=(1, 9))
  again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf2").eval()
  np.testing.assert_allclose(_torch_logits(again, tokens), _torch_logits(hf, tokens), atol=1e-5)


# -- the context's last position ------------------------------------------------------------------

# One configuration of each family's model_type (the shared list: a family added later gets an entry
# here too), its context cut to CONTEXT positions; llama is built from transformers' LlamaConfig.
EDGE_FAMILIES = {"llama": None, "qwen2": "qwen2", "mistral": "mistral-window-5",
                 "opt": "opt-pre-ln-projected", "codegen": "codegen", "gpt2": "gpt2"}
CONTEXT = 48
_CONTEXT_FIELD = {"codegen": ("n_positions", "n_ctx"), "gpt2": ("n_positions",)}
_LAYERS_FIELD = {"codegen": "n_layer", "gpt2": "n_layer"}


def _edge_model(family, seed, num_layers, **overrides):
  if family == "llama":
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
      for p in model.parameters():
        p.copy_(1.0 + 0.2 * torch.randn_like(p) if p.ndim == 1 else 0.25 * torch.randn_like(p))
    return model
  fields = {f: CONTEXT for f in _CONTEXT_FIELD.get(family, ("max_position_embeddings",))}
  fields[_LAYERS_FIELD.get(family, "num_hidden_layers")] = num_layers
  return _hf_model(EDGE_FAMILIES[family], seed=seed, **fields, **overrides)


@pytest.mark.parametrize("family", sorted(EDGE_FAMILIES))
def test_bass_decodes_to_the_last_position_of_the_context(family, tmp_path):
  """Prompt + max_new_tokens equal to the context: every step's look-ahead (a chain of 7, a tree of
  depth 7) runs past the last position, which a learned position table (GPT-2, OPT) does not have.
  BASS emits regular decoding's tokens: in every family with a hybrid of sibling lookup, n-gram lookup
  and a draft model of the family (chain) and with the draft model's tree; in Llama and GPT-2 also
  with n-gram trees; in Llama with an EAGLE draft's chains and trees, in Mistral with a windowed EAGLE
  draft's chains. Every emitted log-prob is finite."""
  _edge_model(family, 0, 2).save_pretrained(tmp_path / "target")
  # A tree grows over a draft model without a sliding window (generate refuses one that has it).
  window = {"sliding_window": None} if family == "mistral" else {}
  _edge_model(family, 1, 1, **window).save_pretrained(tmp_path / "draft")
  target, draft = bj.load_model(tmp_path / "target"), bj.load_model(tmp_path / "draft")
  assert target.config.max_positions == CONTEXT
  rng = np.random.default_rng(sorted(EDGE_FAMILIES).index(family))
  max_new = 9
  a, b = (rng.integers(0, VOCAB, CONTEXT - max_new).tolist() for _ in range(2))
  prompts = [a, b, a]  # rows 0 and 2 are siblings
  common = dict(max_new_tokens=max_new, eos_token_id=())
  regular = bj.generate(target, None, prompts, method="regular", **common)
  assert np.isfinite(regular.logprobs).all()
  # Every row of the position table read, as transformers reads it: a whole context's logits.
  whole = np.asarray(a + regular.sequences()[0])[None]
  assert whole.shape[1] == CONTEXT
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "target",
                                                         attn_implementation="eager").eval()
  np.testing.assert_allclose(np.asarray(target.logits(whole)), _torch_logits(hf, whole), atol=1e-4,
                             err_msg=family)
  with pytest.raises(ValueError, match=f"exceed the model's context of {CONTEXT}"):
    target.logits(np.zeros((1, CONTEXT + 1), np.int32))
  ngram = bj.NGramProposer(max_n=2, min_n=1)
  sides = {
      "hybrid chain": (bj.Hybrid(draft, (bj.SiblingProposer(), ngram)), dict(draft_len=7)),
      "model tree": (draft, dict(draft_tree="top_k=2,depth=7,nodes=12")),
  }
  # The look-ahead past the context meets the family's positions; the other draft sides run the same
  # look-ahead through the same decode, so they run on a rotary family (Llama) and on the learned
  # position table the look-ahead overruns (GPT-2).
  if family in ("llama", "gpt2"):
    sides["n-gram tree"] = (ngram, dict(draft_tree="top_k=2,depth=7,nodes=10"))
  if family in ("llama", "mistral"):  # an EAGLE draft, and one with the target's window
    from conftest import random_eagle_draft  # pylint: disable=g-import-not-at-top

    eagle = random_eagle_draft(target)
    sides["eagle chain"] = (eagle, dict(draft_len=7))
    if family == "mistral":  # a windowed EAGLE draft's tree is refused before compiling
      with pytest.raises(ValueError, match="draft_tree: the draft model eagle has a sliding window"):
        bj.generate(target, eagle, prompts, draft_tree="top_k=2,depth=7,nodes=12", **common)
    else:
      sides["eagle tree"] = (eagle, dict(draft_tree="top_k=2,depth=7,nodes=12"))
  for name, (side, kwargs) in sides.items():
    if "tree" in name and family == "mistral":
      kwargs = {**kwargs, "attention_impl": "reference"}
    bass = bj.generate(target, side, prompts, **common, **kwargs)
    assert np.array_equal(bass.tokens, regular.tokens), (family, name)
    assert np.isfinite(bass.logprobs).all(), (family, name)
    np.testing.assert_allclose(bass.logprobs, regular.logprobs, atol=1e-4, err_msg=f"{family} {name}")


def test_learned_position_ids_are_the_positions_inside_the_table_and_its_last_row_past_it():
  from bass_jax.models.common import learned_position_ids

  positions = np.random.default_rng(0).integers(0, 60, size=(3, 7))
  for size, offset in ((50, 0), (52, 2)):  # GPT-2's table; OPT's, whose position 0 is row 2
    ids = np.asarray(learned_position_ids(positions, size, offset))
    inside = positions + offset < size
    assert inside.any() and (~inside).any()
    np.testing.assert_array_equal(ids[inside], (positions + offset)[inside])
    assert (ids[~inside] == size - 1).all()
