"""GGUF files of every architecture bass_jax reads (``bass_jax.checkpoints.gguf``): llama (with Llama 3
rotary scaling), qwen2, qwen3, gemma2, gemma3 (text), phi3.

Each case builds a tiny random transformers model (every parameter redrawn), writes it as llama.cpp's
``convert_hf_to_gguf.py`` would (:func:`write_gguf`: the metadata keys of that architecture's converter
class, tensor names from ``gguf.get_tensor_name_map``, ``LlamaModel.permute`` on llama's Q and K,
Gemma's ``w + 1`` norms, Llama 3's ``rope_freqs`` and Phi-3's LongRoPE factor tensors, a vocabulary
list sized to the model), and reads it back:

* through ``gguf.read_hf``: the config dict must make transformers' config of the source on every field,
  and every tensor must equal the source state dict's;
* through transformers' own GGUF loader (``from_pretrained(dir, gguf_file=...)``), the independent
  reader, whose logits must equal the source model's, where it reads the architecture faithfully.
  transformers 5.24 reads all six architectures but not all their keys: it ignores Llama 3's
  ``rope_freqs`` (plain rotary), Phi-3's ``rope.dimension_count`` (no partial rotary) and window, and
  reads no Gemma soft-caps, query scale or Gemma 3 sliding-layer base (its config defaults stand in).
  So the Gemma cases use those defaults (head size 256, as the real 2B/9B/1B-12B models), and the
  Llama 3 and partial-rotary Phi-3 cases are checked against the source model only;
* through ``bass_jax.load_model``: its logits must equal the source model's (f32, 1e-4).

Plus a Q8_0-quantized file (looser tolerance) and the refusals: an unsupported architecture, an unknown
metadata key, a missing tensor, each one line naming it.
"""

from __future__ import annotations

import math
import pathlib

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bass_jax
from bass_jax import preflight
from bass_jax.checkpoints import gguf as gguf_ckpt
from bass_jax.checkpoints import gguf_llama3
from bass_jax.checkpoints._mapping import CheckpointError

VOCAB = 97
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 9))

# -- tiny source models ---------------------------------------------------------------------------------

_SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, rms_norm_eps=1e-5)


def _llama3(**overrides):
  # head size 32 at base 10000: two frequencies inside Llama 3's smoothing band (wavelengths 2048 to
  # 8192), three below it, so the band's parameters are determined by the rope_freqs tensor.
  rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192, rope_theta=10000.0)
  return transformers.LlamaConfig(**{**_SMALL, "num_attention_heads": 2, "num_key_value_heads": 1,
                                     "head_dim": 32, "max_position_embeddings": 16384,
                                     "rope_parameters": rope, **overrides})


CASES = {
    "llama3": (gguf.MODEL_ARCH.LLAMA, lambda: _llama3(attention_bias=True)),
    "qwen2": (gguf.MODEL_ARCH.QWEN2, lambda: transformers.Qwen2Config(
        **_SMALL, tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                             "rope_theta": 50000.0})),
    "qwen3": (gguf.MODEL_ARCH.QWEN3, lambda: transformers.Qwen3Config(
        **_SMALL, head_dim=128, tie_word_embeddings=False)),
    "gemma2": (gguf.MODEL_ARCH.GEMMA2, lambda: transformers.Gemma2Config(
        **{**_SMALL, "num_attention_heads": 2, "num_key_value_heads": 1}, head_dim=256,
        sliding_window=4)),
    "gemma3": (gguf.MODEL_ARCH.GEMMA3, lambda: transformers.Gemma3TextConfig(
        **{**_SMALL, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 7},
        head_dim=256, sliding_window=4)),
    "phi3": (gguf.MODEL_ARCH.PHI3, lambda: transformers.Phi3Config(
        **_SMALL, partial_rotary_factor=0.5, max_position_embeddings=256)),
    # LongRoPE (Phi-3-mini-128k's): factors over the 8 rotary dimensions of a head of 16, the context
    # 8 times the original (Phi3MiniModel writes the factors as tensors and the attention factor).
    "phi3-longrope": (gguf.MODEL_ARCH.PHI3, lambda: transformers.Phi3Config(
        **_SMALL, partial_rotary_factor=0.5, max_position_embeddings=512,
        original_max_position_embeddings=64,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
                             long_factor=[2.5, 3.75, 1.5, 3.25], short_factor=[1.0, 1.0625, 1.125, 1.0]))),
}


def make_model(config: transformers.PretrainedConfig, seed: int = 0):
  """transformers' model for ``config`` with every parameter redrawn (norm scales near their identity:
  1 for Llama's ``x w``, 0 for Gemma's ``x (1 + w)``)."""
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  gemma = config.model_type.startswith("gemma")
  with torch.no_grad():
    for name, param in model.named_parameters():
      offset = 1.0 if name.endswith("norm.weight") and not gemma else 0.0
      param.copy_(offset + 0.3 * torch.randn_like(param))
  return model.eval()


def source_tensors(model) -> dict[str, np.ndarray]:
  """The state dict a checkpoint directory holds: a tied head is not written."""
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  if model.config.tie_word_embeddings:
    state.pop("lm_head.weight")
  return state


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.from_numpy(tokens)).logits.numpy()


# -- writing GGUF files as llama.cpp's convert_hf_to_gguf.py does ---------------------------------------


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's ``LlamaModel.permute`` (HF rotate-half -> GGML interleaved), weights and biases."""
  return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
          .swapaxes(1, 2).reshape(weights.shape))


def _llama3_rope_freqs(cfg) -> np.ndarray:
  """``LlamaModel.generate_extra_tensors``: Llama 3's per-frequency divisors."""
  rope = cfg.rope_parameters
  base, dim = rope["rope_theta"], cfg.head_dim
  freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
  factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
  old = rope["original_max_position_embeddings"]
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < old / high:
      out.append(1)
    elif wavelen > old / low:
      out.append(factor)
    else:
      smooth = (old / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.asarray(out, np.float32)


def _set_parameters(w: gguf.GGUFWriter, cfg, arch) -> None:
  """The metadata of each architecture's converter class (``set_gguf_parameters``)."""
  rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_file_type(gguf.LlamaFileType.ALL_F32)
  if arch == gguf.MODEL_ARCH.PHI3:  # Phi3MiniModel: no TextModel.set_gguf_parameters
    w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
    w.add_rope_dimension_count(int(cfg.partial_rotary_factor * cfg.hidden_size)
                               // cfg.num_attention_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_sliding_window(cfg.sliding_window or 0)
    if rope.get("rope_type") == "longrope":
      scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
      w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale)
                                                / math.log(cfg.original_max_position_embeddings)))
    return
  if arch != gguf.MODEL_ARCH.GEMMA2:  # TextModel.set_gguf_parameters (Gemma2Model writes its own)
    if rope.get("rope_type") == "linear":
      w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
      w.add_rope_scaling_factor(rope["factor"])
    elif rope.get("rope_type") == "yarn":
      w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
      w.add_rope_scaling_factor(rope["factor"])
      w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
      for key, add in (("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                       ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                       ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
        if rope.get(key) is not None:
          add(rope[key])
    w.add_rope_freq_base(rope["rope_theta"])
    local = cfg.rope_parameters.get("sliding_attention", {}).get("rope_theta")
    if local is not None:
      w.add_rope_freq_base_swa(local)
  if getattr(cfg, "head_dim", None) is not None and arch != gguf.MODEL_ARCH.QWEN2:
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
  if arch == gguf.MODEL_ARCH.LLAMA:  # LlamaModel
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.head_dim)
  elif arch == gguf.MODEL_ARCH.GEMMA2:  # Gemma2Model
    w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
  elif arch == gguf.MODEL_ARCH.GEMMA3:  # Gemma3Model
    if cfg.final_logit_softcapping:
      w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)


def write_gguf(model, path: pathlib.Path, arch: gguf.MODEL_ARCH, *, qtype=None, drop=(),
               extra=None, extra_tensors=None, arch_name=None, eot=None, eom=None,
               typed=None) -> None:
  """Writes ``model`` as llama.cpp's converter lays out ``arch``: f32, or 2-D weights in ``qtype``
  (norms and rotary factors stay f32, as llama.cpp keeps them). To corrupt it: ``drop``, tensor names
  to leave out; ``extra``, metadata to add ({key: value}, stored as f32); ``typed``, metadata to set
  or replace ({key: (value, GGUFValueType)}); ``extra_tensors``, tensors to add; ``arch_name``,
  another ``general.architecture`` (and key prefix)."""
  cfg = model.config
  w = gguf.GGUFWriter(str(path), arch_name or gguf.MODEL_ARCH_NAMES[arch])
  _set_parameters(w, cfg, arch)
  for key, value in (extra or {}).items():
    w.add_float32(key, value)
  for key, (value, vtype) in (typed or {}).items():
    w.kv_data[0].pop(key, None)  # replaced, not warned about
    w.add_key_value(key, value, vtype)
  w.add_tokenizer_model("gpt2")
  w.add_token_list([f"<t{i}>" for i in range(cfg.vocab_size)])
  w.add_token_types([gguf.TokenType.NORMAL] * cfg.vocab_size)
  w.add_bos_token_id(cfg.bos_token_id)
  w.add_eos_token_id(cfg.eos_token_id)
  w.add_pad_token_id(cfg.pad_token_id)
  if eot is not None:  # llama.cpp's end-of-turn / end-of-message ids (Llama 3 Instruct, Gemma)
    w.add_eot_token_id(eot)
  if eom is not None:
    w.add_eom_token_id(eom)
  names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
  tensors = {}
  for name, value in source_tensors(model).items():
    if arch in (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3):
      if name == "lm_head.weight":
        continue  # Gemma2Model.filter_tensors
      if name.endswith("norm.weight"):
        value = value + 1  # Gemma2Model / Gemma3Model.modify_tensors
    if arch == gguf.MODEL_ARCH.LLAMA:  # LlamaModel.modify_tensors
      if name.endswith(("q_proj.weight", "q_proj.bias")):
        value = _permute(value, cfg.num_attention_heads)
      elif name.endswith(("k_proj.weight", "k_proj.bias")):
        value = _permute(value, cfg.num_key_value_heads)
    tensors[names.get_name(name, try_suffixes=(".weight", ".bias"))] = value
  rope = cfg.rope_parameters
  if rope.get("rope_type") == "llama3":
    tensors["rope_freqs.weight"] = _llama3_rope_freqs(cfg)
  if rope.get("rope_type") == "longrope":
    tensors["rope_factors_long.weight"] = np.asarray(rope["long_factor"], np.float32)
    tensors["rope_factors_short.weight"] = np.asarray(rope["short_factor"], np.float32)
  for name, value in {**tensors, **(extra_tensors or {})}.items():
    if name in drop:
      continue
    value = np.ascontiguousarray(value, np.float32)
    if qtype is not None and value.ndim == 2:
      w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


# -- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  """``name -> (source model, path)``: each case's model and its GGUF file, built once, on demand."""
  cache = {}

  def get(name: str):
    if name not in cache:
      arch, make = CASES[name]
      model = make_model(make())
      directory = tmp_path_factory.mktemp(name)
      path = directory / f"{name}.gguf"
      write_gguf(model, path, arch)
      cache[name] = model, path
    return cache[name]

  return get


# Fields of every transformers config that say nothing about the architecture.
_GENERIC = (set(transformers.PretrainedConfig().to_dict())
            | {"transformers_version", "architectures", "_name_or_path", "dtype", "quantization_config",
               "output_attentions"}) - {"bos_token_id", "eos_token_id", "pad_token_id",
                                        "tie_word_embeddings"}


def architecture_fields(config: transformers.PretrainedConfig) -> dict:
  return {k: v for k, v in config.to_dict().items() if k not in _GENERIC}


# -- the translation against the source ----------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_translation_is_the_source_checkpoint(written, name):
  model, path = written(name)
  view = gguf_ckpt.read_hf(path)

  # The config dict is transformers' own (a fixed point of its config class) and makes the source's
  # config on every architecture field.
  assert view.config["model_type"] == model.config.model_type
  rebuilt = transformers.AutoConfig.for_model(**view.config)
  assert {k: rebuilt.to_dict()[k] for k in view.config} == view.config
  assert architecture_fields(rebuilt) == architecture_fields(model.config)

  # Every tensor is the source's, llama.cpp's transforms undone (Gemma's w + 1 costs an f32 rounding).
  source = source_tensors(model)
  assert set(view.names) == set(source)
  for hf_name, value in source.items():
    got = view.read(hf_name)
    assert got.dtype == np.float32 and got.shape == value.shape, hf_name
    atol = 1e-6 if name.startswith("gemma") and hf_name.endswith("norm.weight") else 0
    np.testing.assert_allclose(got, value, rtol=0, atol=atol, err_msg=hf_name)


def test_the_plain_view_reader_reads_what_ggufs_own_reader_reads(tmp_path):
  """bass_jax reads a GGUF file with ``gguf.GGUFReader`` over a plain view of its memory map
  (``gguf.reader_class``): every metadata field (strings, arrays, numbers) and every tensor (f32 and
  Q4_1, fresh random values) equal what the package's own reader gives, tensor data as plain read-only
  arrays, not the memmap slices that made the read slow."""
  model = make_model(CASES["qwen3"][1](), seed=int(np.random.default_rng().integers(1 << 30)))
  path = tmp_path / "m.gguf"
  write_gguf(model, path, gguf.MODEL_ARCH.QWEN3, qtype=gguf.GGMLQuantizationType.Q4_1)
  theirs, ours = gguf.GGUFReader(str(path)), gguf_ckpt._open(path)  # pylint: disable=protected-access
  assert isinstance(ours, gguf.GGUFReader) and type(ours.data) is np.ndarray
  assert list(ours.fields) == list(theirs.fields) and len(theirs.fields) > 20
  for key, field in theirs.fields.items():
    assert ours.fields[key].types == field.types, key
    assert repr(ours.fields[key].contents()) == repr(field.contents()), key
  assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
  assert {t.tensor_type for t in theirs.tensors} >= {gguf.GGMLQuantizationType.F32,
                                                      gguf.GGMLQuantizationType.Q4_1}
  for mine, reference in zip(ours.tensors, theirs.tensors):
    assert type(mine.data) is np.ndarray and not mine.data.flags.writeable, mine.name
    assert mine.tensor_type == reference.tensor_type and list(mine.shape) == list(reference.shape)
    np.testing.assert_array_equal(mine.data, reference.data, err_msg=mine.name)


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_transformers_gguf_loader_agrees(written, name):
  """transformers' own GGUF reader on the same file: the same tensors, and where it reads the
  architecture's keys (all but Phi-3's partial rotary) the same config and logits."""
  model, path = written(name)
  reference = transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
  state = reference.state_dict()
  for hf_name, value in source_tensors(model).items():
    np.testing.assert_allclose(state[hf_name].numpy(), value, rtol=0, atol=1e-6, err_msg=hf_name)
  if name == "phi3":
    assert reference.config.rope_parameters["partial_rotary_factor"] == 1.0  # not the file's 0.5
    return
  ours = architecture_fields(transformers.AutoConfig.for_model(**gguf_ckpt.read_hf(path).config))
  theirs = architecture_fields(reference.config)
  assert theirs.pop("rms_norm_eps") == pytest.approx(ours.pop("rms_norm_eps"), rel=1e-6)  # f32
  assert ours == theirs
  np.testing.assert_allclose(torch_logits(reference, TOKENS), torch_logits(model, TOKENS),
                             rtol=0, atol=1e-5)


def jax_logits(path: pathlib.Path, tokens: np.ndarray) -> np.ndarray:
  model = bass_jax.load_model(path, tokenizer=False, dtype="float32")
  return np.asarray(model.logits(jnp.asarray(tokens, jnp.int32)))


@pytest.mark.parametrize("name", CASES)
def test_load_model_logits_equal_the_source(written, name):
  """The whole path, GGUF -> HF config and tensors -> the family's port: the source model's logits
  (windows of 4 over 9 tokens and Gemma's soft-caps bind; Llama 3's scaling and Phi-3's partial rotary
  move every position past 0)."""
  model, path = written(name)
  want = torch_logits(model, TOKENS)
  assert np.std(want) > 0.5  # logits that discriminate
  loaded = bass_jax.load_model(path, tokenizer=False, dtype="float32")
  np.testing.assert_allclose(loaded.logits(jnp.asarray(TOKENS, jnp.int32)), want, rtol=0, atol=1e-4)
  # The preflight reads the same header to the same config, without the weights.
  source = preflight.inspect_model(path)
  config = loaded.config
  assert (source.kind, source.model_type, source.vocab_size, source.hidden_size, source.num_layers,
          source.context) == ("gguf", config.model_type, config.vocab_size, config.hidden_size,
                              config.num_hidden_layers, config.max_positions)
  hf = model.config  # the source model's, which the file was written from
  assert (source.vocab_size, source.hidden_size, source.num_layers) == (
      hf.vocab_size, hf.hidden_size, hf.num_hidden_layers)


# -- Llama's rotary scaling -----------------------------------------------------------------------------


@pytest.mark.parametrize("rope", [
    pytest.param(dict(rope_type="linear", factor=4.0, rope_theta=500000.0), id="linear"),
    pytest.param(dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=4096,
                      beta_fast=16.0, beta_slow=2.0, attention_factor=1.25, rope_theta=10000.0),
                 id="yarn"),
    pytest.param(dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192, rope_theta=500000.0),
                 id="llama3-3.2"),
])
def test_llama_rope_scaling_reads_back(tmp_path, rope):
  config = _llama3(rope_parameters=rope, head_dim=128, max_position_embeddings=131072)
  model = make_model(config)
  write_gguf(model, tmp_path / "m.gguf", gguf.MODEL_ARCH.LLAMA)
  view = gguf_ckpt.read_hf(tmp_path / "m.gguf")
  assert view.config["rope_parameters"] == rope
  assert "rope_freqs.weight" not in view.names.values()


@pytest.mark.parametrize("theta,head_dim,params", [
    (500000.0, 128, (8.0, 1.0, 4.0)),   # Llama 3.1: many frequencies in the band
    (10000.0, 16, (8.0, 1.0, 4.0)),     # one frequency in the band
    (10000.0, 8, (4.0, 1.0, 2.0)),      # none: the band falls between two frequencies
    (10000.0, 32, (2.5, 0.5, 3.0)),
])
def test_llama3_parameters_give_back_the_divisors(theta, head_dim, params):
  factors = gguf_llama3.llama3_factors(theta, head_dim, *params, 8192).astype(np.float32)
  rope = gguf_llama3.llama3_parameters(factors, theta, head_dim)
  again = gguf_llama3.llama3_factors(theta, head_dim, rope["factor"], rope["low_freq_factor"],
                                     rope["high_freq_factor"], rope["original_max_position_embeddings"])
  np.testing.assert_allclose(again, factors, rtol=1e-5)
  ones = np.ones(head_dim // 2, np.float32)
  assert gguf_llama3.llama3_parameters(ones, theta, head_dim) is None
  with pytest.raises(ValueError, match="no Llama 3 scaling"):
    gguf_llama3.llama3_parameters(np.linspace(1, 3, head_dim // 2)[::-1].copy(), theta, head_dim)


# -- a quantized file -----------------------------------------------------------------------------------


def test_q8_0_llama_matches_transformers_reading(tmp_path):
  """Q8_0 matrices, dequantized and (Q, K) un-permuted: the same tensors and logits (1e-4) as
  transformers' reader of the same file, and close to the f32 source (looser: the quantization)."""
  model = make_model(_llama3(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
  path = tmp_path / "q8.gguf"
  write_gguf(model, path, gguf.MODEL_ARCH.LLAMA, qtype=gguf.GGMLQuantizationType.Q8_0)
  assert {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors} == {"Q8_0", "F32"}
  view = gguf_ckpt.read_hf(path)
  reference = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
  state = reference.state_dict()
  for hf_name, value in source_tensors(model).items():
    got = view.read(hf_name)
    np.testing.assert_array_equal(got, state[hf_name].numpy(), err_msg=hf_name)
    # Q8_0: blocks of 32 scaled to 127 steps, each value within one step of the block's largest
    np.testing.assert_allclose(got, value, rtol=0, atol=np.abs(value).max() / 127, err_msg=hf_name)
  want = torch_logits(reference, TOKENS)
  np.testing.assert_allclose(jax_logits(path, TOKENS), want, rtol=0, atol=1e-4)
  source = torch_logits(model, TOKENS)  # quantization moves the logits a little
  assert np.abs(want - source).max() < 0.1 * np.abs(source).max()


# -- refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case,arch,kwargs,error,match", [
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2, dict(arch_name="falcon"), ValueError,
                 r"general.architecture is 'falcon'; supported GGUF architectures: gemma2, gemma3, "
                 r"llama, phi3, qwen2, qwen3", id="architecture"),
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2, dict(extra={"qwen2.logit_scale": 2.0}), ValueError,
                 r"unsupported GGUF metadata key 'qwen2.logit_scale'=2.0 for a 'qwen2' model",
                 id="unknown-key"),
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2,
                 dict(extra={"qwen2.rope.scaling.yarn_beta_fast": 32.0}), ValueError,
                 r"'qwen2.rope.scaling.yarn_beta_fast'=32.0 does not apply", id="key-that-does-not-apply"),
    # Issue 54: metadata of the wrong type was coerced (a float block count truncated), and its ranges
    # went unchecked; now as config.json's, named by the HF field it becomes.
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2,
                 dict(typed={"qwen2.block_count": (2.5, gguf.GGUFValueType.FLOAT32)}), ValueError,
                 r"GGUF metadata key 'qwen2.block_count'=2.5 is float, not an integer; re-convert",
                 id="float-layers"),
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2,
                 dict(typed={"qwen2.attention.head_count": (0, gguf.GGUFValueType.UINT32)}), ValueError,
                 r"num_attention_heads=0 is refused: expected an int in \[1, ", id="zero-heads"),
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2,
                 dict(typed={"qwen2.block_count": (0, gguf.GGUFValueType.UINT32)}), ValueError,
                 r"bad.gguf: its metadata, read as config.json: num_hidden_layers=0 is refused: "
                 r"expected an int in \[1, 2147483647\]; re-convert the file", id="zero-layers"),
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2,
                 dict(typed={"qwen2.attention.layer_norm_rms_epsilon": (math.nan,
                                                                         gguf.GGUFValueType.FLOAT32)}),
                 ValueError, r"'qwen2.attention.layer_norm_rms_epsilon'=nan is not a finite number",
                 id="nan-eps"),
    pytest.param("qwen2", gguf.MODEL_ARCH.QWEN2, dict(drop=("blk.1.attn_k.weight",)),
                 CheckpointError, r"missing tensor\(s\) \['model.layers.1.self_attn.k_proj.weight' "
                 r"\(GGUF 'blk.1.attn_k.weight'\)\]", id="missing-tensor"),
])
def test_refusals_name_what_is_wrong(tmp_path, written, case, arch, kwargs, error, match):
  model, _ = written(case)
  path = tmp_path / "bad.gguf"
  write_gguf(model, path, arch, **kwargs)
  with pytest.raises(error, match=match) as info:
    bass_jax.load_model(path, tokenizer=False)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("value,refused", [(0, False), (8, True)])
def test_checked_key_passes_only_its_value(tmp_path, written, value, refused):
  """``expert_count`` = 0 (written by some converters for dense models, as llama.cpp's uint32) is
  checked, not refused."""
  model, _ = written("qwen2")
  path = tmp_path / "experts.gguf"
  write_gguf(model, path, gguf.MODEL_ARCH.QWEN2,
             typed={"qwen2.expert_count": (value, gguf.GGUFValueType.UINT32)})
  if refused:
    with pytest.raises(ValueError, match=r"'qwen2.expert_count'=8 \(a mixture of experts\) is not "):
      gguf_ckpt.read_hf(path)
  else:
    assert gguf_ckpt.read_hf(path).config == gguf_ckpt.read_hf(written("qwen2")[1]).config


def test_tensor_without_a_place_is_refused(tmp_path, written):
  model, _ = written("qwen3")
  path = tmp_path / "moe.gguf"  # a mixture-of-experts router among a dense model's tensors
  write_gguf(model, path, gguf.MODEL_ARCH.QWEN3,
             extra_tensors={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)})
  with pytest.raises(CheckpointError, match=r"GGUF tensor 'blk.0.ffn_gate_inp.weight' has no place in "
                     r"transformers' Qwen3ForCausalLM"):
    gguf_ckpt.read_hf(path)


def test_end_of_turn_and_message_ids_join_the_stop_ids(tmp_path, written):
  """``tokenizer.ggml.eot_token_id`` / ``eom_token_id`` (Llama 3 Instruct's <|eot_id|> and <|eom_id|>)
  stop a decode as the EOS does: they follow it in the loaded config's stop ids."""
  model, _ = written("qwen2")
  write_gguf(model, tmp_path / "m.gguf", gguf.MODEL_ARCH.QWEN2, eot=7, eom=9)
  eos = model.config.eos_token_id
  assert bass_jax.load_model(tmp_path / "m.gguf", tokenizer=False).config.eos_token_id == (eos, 7, 9)
