"""Checkpoint loading and saving: HF safetensors and PyTorch .bin, orbax, GGUF, and their failure modes.

Every model is a tiny transformers ``LlamaForCausalLM`` built here (no hub, no network). All of its
parameters, norm scales included, are redrawn at random, so a dropped, swapped or transposed tensor
changes the logits. transformers' PyTorch forward in f32 is the reference.
"""

from __future__ import annotations

import gc
import json
import pathlib
import re
import shutil

import flax.traverse_util
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

import bass_jax
from bass_jax import preflight
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints import locate
from bass_jax.checkpoints._mapping import CheckpointError
from bass_jax.checkpoints.gguf_architectures import unpermute_rotary
from bass_jax.models.llama import LlamaConfig

VOCAB = 97  # odd, so that no vocab/hidden confusion can go unnoticed
LOGITS_ATOL = 1e-4

# -- helpers ------------------------------------------------------------------------------------------


def make_hf_model(seed: int = 0, **overrides) -> transformers.LlamaForCausalLM:
  """A tiny random Llama (GQA: 4 query heads, 2 KV heads) with every parameter redrawn."""
  fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                tie_word_embeddings=False)
  fields.update(overrides)
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
  with torch.no_grad():
    for name, param in model.named_parameters():
      offset = 1.0 if name.endswith("norm.weight") else 0.0  # RMSNorm scales stay near one
      param.copy_(offset + 0.3 * torch.randn_like(param))
  return model.eval()


def random_tokens(seed: int = 0, shape: tuple[int, int] = (2, 9)) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, VOCAB, shape)


def torch_logits(model: transformers.LlamaForCausalLM, tokens: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.from_numpy(tokens)).logits.numpy()


def jax_logits(model: bass_jax.Model, tokens: np.ndarray) -> np.ndarray:
  return np.asarray(model.logits(jnp.asarray(tokens, jnp.int32)))


def assert_params_equal(a, b) -> None:
  flat_a = flax.traverse_util.flatten_dict(dict(a))
  flat_b = flax.traverse_util.flatten_dict(dict(b))
  assert flat_a.keys() == flat_b.keys()
  for path, value in flat_a.items():
    assert value.dtype == flat_b[path].dtype, path
    np.testing.assert_array_equal(np.asarray(value), np.asarray(flat_b[path]), err_msg=str(path))


def read_tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  return safetensors.numpy.load_file(str(directory / "model.safetensors"))


def write_tensors(directory: pathlib.Path, tensors: dict[str, np.ndarray]) -> None:
  safetensors.numpy.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def edit_config(directory: pathlib.Path, **changes) -> None:
  path = directory / "config.json"
  fields = json.loads(path.read_text())
  fields.update(changes)
  path.write_text(json.dumps(fields))


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp convert_hf_to_gguf.py's ``LlamaModel.permute`` (HF rotate-half -> GGML interleaved)."""
  return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
          .swapaxes(1, 2).reshape(weights.shape))


_GGUF_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_GGUF_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def write_gguf(model: transformers.LlamaForCausalLM, path: pathlib.Path) -> None:
  """Writes ``model`` as an f32 GGUF file the way llama.cpp's converter lays it out."""
  import gguf  # pylint: disable=g-import-not-at-top

  cfg = model.config
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_block_count(cfg.num_hidden_layers)
  writer.add_context_length(cfg.max_position_embeddings)
  writer.add_embedding_length(cfg.hidden_size)
  writer.add_feed_forward_length(cfg.intermediate_size)
  writer.add_head_count(cfg.num_attention_heads)
  writer.add_head_count_kv(cfg.num_key_value_heads)
  writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  writer.add_vocab_size(cfg.vocab_size)
  writer.add_rope_dimension_count(cfg.head_dim)
  for name, tensor in model.state_dict().items():
    if name == "lm_head.weight" and cfg.tie_word_embeddings:
      continue  # tied checkpoints carry no output.weight
    value = tensor.numpy()
    stem = name.removesuffix(".weight")
    if stem in _GGUF_GLOBAL:
      gguf_name = _GGUF_GLOBAL[stem]
    else:
      _, _, layer, sub = stem.split(".", 3)  # model.layers.{layer}.{sub}
      gguf_name = f"blk.{layer}.{_GGUF_LAYER[sub]}"
      if sub == "self_attn.q_proj":
        value = llama_cpp_permute(value, cfg.num_attention_heads)
      elif sub == "self_attn.k_proj":
        value = llama_cpp_permute(value, cfg.num_key_value_heads)
    writer.add_tensor(gguf_name + ".weight", np.ascontiguousarray(value))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> pathlib.Path:
  """A valid, untied HF checkpoint directory; tests that corrupt it work on a copy."""
  path = tmp_path_factory.mktemp("hf")
  make_hf_model(seed=1).save_pretrained(path)
  return path


@pytest.fixture
def ckpt(hf_dir, tmp_path) -> pathlib.Path:
  """A private copy of ``hf_dir`` to corrupt."""
  return pathlib.Path(shutil.copytree(hf_dir, tmp_path / "ckpt"))


# -- round trips against transformers -----------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    pytest.param({}, id="untied"),
    pytest.param({"tie_word_embeddings": True, "head_dim": 12}, id="tied-head_dim12"),
    pytest.param({"attention_bias": True, "mlp_bias": True, "num_key_value_heads": 1,
                  "rope_theta": 500000.0, "rms_norm_eps": 1e-5}, id="biases-mqa"),
])
def test_hf_safetensors_round_trip(tmp_path, overrides):
  hf_model = make_hf_model(seed=2, **overrides)
  tokens = random_tokens(seed=2)
  expected = torch_logits(hf_model, tokens)
  src, dst = tmp_path / "src", tmp_path / "dst"
  hf_model.save_pretrained(src)

  model = bass_jax.load_model(src)
  assert model.config == LlamaConfig.from_hf_config(hf_model.config)
  np.testing.assert_allclose(jax_logits(model, tokens), expected, rtol=0, atol=LOGITS_ATOL)

  bass_jax.save_model(model, dst)
  # Same tensor names as transformers writes (a tied head is left out), bit-identical values.
  written, original = read_tensors(dst), read_tensors(src)
  assert written.keys() == original.keys()
  for name, value in original.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)

  reloaded_hf = transformers.LlamaForCausalLM.from_pretrained(dst).eval()
  np.testing.assert_allclose(torch_logits(reloaded_hf, tokens), expected, rtol=0, atol=1e-5)
  reloaded = bass_jax.load_model(dst)
  assert reloaded.config == model.config
  assert_params_equal(reloaded.params, model.params)


def test_orbax_round_trip(hf_dir, tmp_path):
  model = bass_jax.load_model(hf_dir)
  path = tmp_path / "orbax"
  bass_jax.save_model(model, path, format="orbax")
  assert not list(path.glob("*.safetensors"))  # what loads back is the orbax checkpoint

  restored = bass_jax.load_model(path)
  assert restored.config == model.config
  assert_params_equal(restored.params, model.params)
  tokens = random_tokens(seed=3)
  np.testing.assert_array_equal(jax_logits(restored, tokens), jax_logits(model, tokens))

  with pytest.raises(FileExistsError, match="exists"):
    bass_jax.save_model(model, path, format="orbax")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_pytorch_bin_checkpoint(tmp_path, tied):
  # transformers 5 ignores save_pretrained(safe_serialization=False) and writes safetensors anyway, so
  # the legacy file is written by hand: the full state dict (a tied model's includes lm_head.weight,
  # equal to the embedding) plus a precomputed rotary buffer, as old checkpoints carried.
  hf_model = make_hf_model(seed=4, tie_word_embeddings=tied)
  state = dict(hf_model.state_dict())
  assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]) == tied
  state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.rand(4)
  torch.save(state, tmp_path / "pytorch_model.bin")
  hf_model.config.save_pretrained(tmp_path)
  assert not list(tmp_path.glob("*.safetensors"))

  tokens = random_tokens(seed=4)
  model = bass_jax.load_model(tmp_path)
  assert model.config.tie_word_embeddings == tied
  np.testing.assert_allclose(jax_logits(model, tokens), torch_logits(hf_model, tokens),
                             rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gguf_matches_transformers(tmp_path, tied):
  hf_model = make_hf_model(seed=5, tie_word_embeddings=tied)
  path = tmp_path / "tiny.gguf"
  write_gguf(hf_model, path)

  model = bass_jax.load_model(path, tokenizer=False)
  assert model.config.tie_word_embeddings == tied
  assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (4, 2)
  tokens = random_tokens(seed=5)
  np.testing.assert_allclose(jax_logits(model, tokens), torch_logits(hf_model, tokens),
                             rtol=0, atol=LOGITS_ATOL)


def test_num_layers_keeps_the_first_layers(tmp_path):
  hf_model = make_hf_model(seed=6, num_hidden_layers=3)
  hf_model.save_pretrained(tmp_path)
  tokens = random_tokens(seed=6)
  full = torch_logits(hf_model, tokens)

  model = bass_jax.load_model(tmp_path, num_layers=1)
  assert model.config.num_hidden_layers == 1
  assert sorted(k for k in model.params if k.startswith("layers_")) == ["layers_0"]

  hf_model.model.layers = hf_model.model.layers[:1]
  hf_model.config.num_hidden_layers = 1
  truncated = torch_logits(hf_model, tokens)
  assert np.abs(truncated - full).max() > 1e-2  # dropping layers must matter for this to test anything
  np.testing.assert_allclose(jax_logits(model, tokens), truncated, rtol=0, atol=LOGITS_ATOL)

  with pytest.raises(ValueError, match="num_layers"):
    bass_jax.load_model(tmp_path, num_layers=4)


# -- corrupt or unsupported inputs --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["no_such_checkpoint", "no_such_model.gguf"])
def test_nonexistent_path_raises_file_not_found(tmp_path, name):
  with pytest.raises(FileNotFoundError, match=re.escape(name)):
    bass_jax.load_model(tmp_path / name)


def test_config_without_weights_raises_file_not_found(hf_dir, tmp_path):
  shutil.copy(hf_dir / "config.json", tmp_path / "config.json")
  with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors or pytorch_model\*\.bin"):
    bass_jax.load_model(tmp_path)


@pytest.mark.parametrize("corrupt", ["truncated", "random_bytes"])
def test_unreadable_safetensors_raises_checkpoint_error(ckpt, corrupt):
  file = ckpt / "model.safetensors"
  data = file.read_bytes()
  if corrupt == "truncated":
    file.write_bytes(data[:len(data) // 2])
  else:
    file.write_bytes(np.random.default_rng(7).bytes(len(data)))
  with pytest.raises(CheckpointError, match="cannot read safetensors file") as error:
    bass_jax.load_model(ckpt)
  message = str(error.value)  # one line, the file named, and what to do
  assert "\n" not in message and str(file) in message and "damaged or truncated" in message, message


def test_missing_tensor_is_named(ckpt):
  tensors = read_tensors(ckpt)
  del tensors["model.layers.1.mlp.down_proj.weight"]
  write_tensors(ckpt, tensors)
  with pytest.raises(CheckpointError, match=r"missing tensor.*model\.layers\.1\.mlp\.down_proj\.weight"):
    bass_jax.load_model(ckpt)


def test_extra_tensor_is_named(ckpt):
  tensors = read_tensors(ckpt)
  tensors["model.layers.0.self_attn.q_norm.weight"] = np.random.default_rng(8).standard_normal(
      8).astype(np.float32)
  write_tensors(ckpt, tensors)
  with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.q_norm\.weight"):
    bass_jax.load_model(ckpt)


@pytest.mark.parametrize("names, edit, message", [
    pytest.param(["model.embed_tokens.weight"], lambda w: w[:-1], "model.embed_tokens.weight",
                 id="embedding-rows"),
    pytest.param(["model.norm.weight"], lambda w: np.concatenate([w, w[:1]]), "model.norm.weight",
                 id="final-norm-length"),
    pytest.param(["model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.k_proj.weight"],
                 lambda w: w.T, "self_attn.k_proj.weight", id="k_proj-transposed-in-every-layer"),
    pytest.param(["model.layers.1.self_attn.q_proj.weight"], lambda w: w[: w.shape[0] // 2],
                 "model.layers.1.self_attn.q_proj.weight", id="q_proj-in-one-layer-only"),
])
def test_misshaped_tensor_is_named(ckpt, names, edit, message):
  tensors = read_tensors(ckpt)
  for name in names:
    tensors[name] = np.ascontiguousarray(edit(tensors[name]))
  write_tensors(ckpt, tensors)
  with pytest.raises(CheckpointError, match=re.escape(message)):
    bass_jax.load_model(ckpt)


@pytest.mark.parametrize("changes, message", [
    pytest.param({"sliding_window": 4096}, "sliding_window", id="sliding-window"),
    pytest.param({"frobnication_level": 3}, "frobnication_level", id="made-up-field"),
    pytest.param({"model_type": "mistral"}, "mistral", id="model-type"),
    pytest.param({"rope_parameters": {"rope_type": "proportional", "factor": 2.0,
                                      "rope_theta": 10000.0}},
                 "proportional", id="rope-parameters-unsupported-type"),
    pytest.param({"rope_parameters": None, "rope_scaling": {"type": "proportional", "factor": 2.0},
                  "rope_theta": 10000.0}, "proportional", id="legacy-rope-scaling-unsupported-type"),
    pytest.param({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
                                      "low_freq_factor": 1.0}},
                 "low_freq_factor", id="rope-parameter-the-type-does-not-read"),
    pytest.param({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "factor": 2.0}},
                 "factor", id="default-rope-with-extra-parameter"),
    pytest.param({"pretraining_tp": 2}, "pretraining_tp", id="pretraining-tp"),
    pytest.param({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "conflicting rotary",
                 id="rope-scaling-beside-default-rope-parameters"),
    pytest.param({"rope_theta": 5.0}, "conflicting rope_theta", id="rope-theta-conflict"),
])
def test_unsupported_config_is_rejected(ckpt, changes, message):
  edit_config(ckpt, **changes)
  with pytest.raises(ValueError, match=re.escape(message)):
    bass_jax.load_model(ckpt)


def test_tied_config_with_a_different_lm_head_is_rejected(ckpt):
  # hf_dir is untied: its lm_head.weight is a random matrix of its own.
  tensors = read_tensors(ckpt)
  assert not np.array_equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
  edit_config(ckpt, tie_word_embeddings=True)
  with pytest.raises(CheckpointError, match=r"lm_head\.weight differs"):
    bass_jax.load_model(ckpt)


@pytest.mark.parametrize("content, message", [
    pytest.param("[1, 2, 3]", "holds an array (a list), not the JSON object", id="a-list"),
    pytest.param('"llama"', "holds a string, not the JSON object", id="a-string"),
    pytest.param('{"model_type": "llama",', "not valid JSON", id="truncated"),
    pytest.param("", "not valid JSON", id="empty"),
])
def test_a_config_json_that_is_not_an_object_is_named(ckpt, content, message):
  (ckpt / "config.json").write_text(content)
  with pytest.raises(ValueError, match=re.escape(f"{ckpt / 'config.json'}: {message}")):
    bass_jax.load_model(ckpt)


def test_save_over_a_transformers_checkpoint_replaces_it_whole(ckpt, hf_dir):
  # transformers' save_pretrained also writes generation_config.json: still a checkpoint's own file.
  assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "generation_config.json",
                                                   "model.safetensors"]
  model = bass_jax.load_model(hf_dir)
  bass_jax.save_model(model, ckpt, format="orbax", overwrite=True)
  assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "params"]
  assert_params_equal(bass_jax.load_model(ckpt).params, model.params)


@pytest.mark.parametrize("header", [b"", b"GGUF"], ids=["random-bytes", "gguf-magic-then-garbage"])
def test_garbage_gguf_raises_checkpoint_error(tmp_path, header):
  path = tmp_path / "garbage.gguf"
  path.write_bytes(header + np.random.default_rng(9).bytes(4096))
  with pytest.raises(CheckpointError, match="not a readable GGUF file"):
    bass_jax.load_model(path, tokenizer=False)


# -- pure conversions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads, head_dim, trailing", [
    (1, 4, (3,)),
    (2, 8, (5,)),
    (4, 16, (7,)),
    (3, 6, (2,)),
    (2, 8, ()),  # a bias vector
])
def test_unpermute_rotary_inverts_llama_cpp_permutation(num_heads, head_dim, trailing):
  rng = np.random.default_rng(num_heads * 100 + head_dim)
  weight = rng.standard_normal((num_heads * head_dim, *trailing)).astype(np.float32)
  permuted = llama_cpp_permute(weight, num_heads)
  assert not np.array_equal(permuted, weight)
  restored = unpermute_rotary(permuted, num_heads)
  assert restored.shape == weight.shape
  np.testing.assert_array_equal(restored, weight)


_ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "tie_word_embeddings", "max_position_embeddings")


@pytest.mark.parametrize("fields", [
    pytest.param(dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
                      rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=321),
                 id="tied-explicit-head_dim"),
    pytest.param(dict(vocab_size=1031, hidden_size=48, intermediate_size=80, num_hidden_layers=5,
                      num_attention_heads=6, num_key_value_heads=6, rms_norm_eps=3e-6,
                      rope_theta=12345.0, tie_word_embeddings=False, max_position_embeddings=77),
                 id="untied-derived-head_dim"),
])
def test_config_round_trip_preserves_architecture(fields):
  hf_config = transformers.LlamaConfig(**fields)
  config = LlamaConfig.from_hf_config(hf_config)
  assert LlamaConfig.from_hf_config(hf_config.to_dict()) == config
  back = config.to_hf_config()
  for name in _ARCH_FIELDS:
    assert getattr(back, name) == getattr(hf_config, name), name
  assert back.rope_parameters["rope_theta"] == fields["rope_theta"]
  assert back.rope_parameters["rope_type"] == "default"
  assert config.head_dim == fields.get("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
  assert LlamaConfig.from_hf_config(back) == config


# -- orbax: config.json against the stored parameters, and damaged pieces ----------------------------


@pytest.fixture(scope="module")
def orbax_dir(hf_dir, tmp_path_factory) -> pathlib.Path:
  """``hf_dir``'s model saved as orbax (config.json + params/); tests that edit it work on a copy."""
  path = tmp_path_factory.mktemp("orbax") / "ckpt"
  bass_jax.save_model(bass_jax.load_model(hf_dir), path, format="orbax")
  return path


def _one_line_naming(error: pytest.ExceptionInfo, where: pathlib.Path, *parts: str) -> str:
  """The error's message, checked to be one line naming ``where`` and ``parts``, short once the path
  is left out (a path under pytest's tmp_path is long)."""
  message = str(error.value)
  assert "\n" not in message, message
  assert str(where) in message, message
  for part in parts:
    assert part in message, (part, message)
  assert len(message.replace(str(where), "")) < 240, message
  return message


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size", "vocab_size",
                                   "num_hidden_layers", "num_key_value_heads"])
def test_orbax_config_that_disagrees_with_the_stored_params_names_the_field(orbax_dir, tmp_path,
                                                                             field):
  ckpt = pathlib.Path(shutil.copytree(orbax_dir, tmp_path / "ckpt"))
  stored = json.loads((ckpt / "config.json").read_text())[field]
  heads = json.loads((ckpt / "config.json").read_text())["num_attention_heads"]
  choices = {"num_hidden_layers": [1, 3, 4], "num_key_value_heads": [1, 4],
             # transformers' config refuses a width its heads do not divide, before any comparison
             "hidden_size": list(range(heads, 2 * stored, heads))}.get(
      field, list(range(stored // 2, 2 * stored)))
  value = int(np.random.default_rng().choice([c for c in choices if c != stored]))
  edit_config(ckpt, **{field: value})
  with pytest.raises(ValueError) as error:
    bass_jax.load_model(ckpt)
  # The field, what config.json says and what the stored tensors were saved with.
  message = _one_line_naming(error, ckpt, field, str(value), str(stored))
  assert re.search(rf"\b{field}\b[^;]*\b{value}\b[^;]*\b{stored}\b", message), message


# A truncated array leaves orbax's reading coroutines unfinished, and each raises its read error
# when it is garbage-collected: collected here (the suite's collector runs seldom, tests/conftest.py),
# the warnings are this test's expected ones instead of showing under whichever test runs next.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["metadata-missing", "array-truncated", "params-emptied"])
def test_a_damaged_orbax_checkpoint_is_named(orbax_dir, tmp_path, damage):
  ckpt = pathlib.Path(shutil.copytree(orbax_dir, tmp_path / "ckpt"))
  params = ckpt / "params"
  if damage == "metadata-missing":
    (params / "_METADATA").unlink()
  elif damage == "array-truncated":
    arrays = [p for p in params.rglob("*") if p.is_file() and p.parent.name == "d"]
    biggest = max(arrays, key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[:biggest.stat().st_size // 3])
  else:
    shutil.rmtree(params)
    params.mkdir()
  with pytest.raises(ValueError) as error:
    bass_jax.load_model(ckpt)
  _one_line_naming(error, params, "damaged")
  del error
  gc.collect()


# -- one dispatch: load_model and the preflight resolve a spec the same way -----------------------------


def test_load_model_and_the_preflight_share_one_dispatch(hf_dir, orbax_dir, tmp_path, monkeypatch):
  """``checkpoints.locate`` tells the formats apart, reading config.json once; the preflight's kind is
  its model kind; what is not a model is refused by both with the very same message."""
  assert [locate.locate(p).kind for p in (hf_dir, orbax_dir, "smollm2-135m-draft",
                                         "smollm2-135m-eagle")] == ["hf", "orbax", "hf", "eagle"]
  assert [preflight.inspect_model(p).kind for p in (hf_dir, orbax_dir, "smollm2-135m-eagle")] == [
      "hf", "hf", "eagle"]
  reads = []
  real = hf_ckpt.read_config_fields
  monkeypatch.setattr(hf_ckpt, "read_config_fields", lambda path: reads.append(path) or real(path))
  locate.locate(orbax_dir)
  assert len(reads) == 1
  monkeypatch.undo()

  both = shutil.copytree(orbax_dir, tmp_path / "both")
  shutil.copy(next(hf_dir.glob("*.safetensors")), both)
  (tmp_path / "weights.bin").write_bytes(b"x")
  (tmp_path / "empty").mkdir()
  for spec in (both, tmp_path / "weights.bin", tmp_path / "empty", tmp_path / "missing",
               "no-such-org/no-such-model"):
    with pytest.raises((ValueError, FileNotFoundError)) as loaded:
      bass_jax.load_model(spec)
    with pytest.raises(type(loaded.value)) as inspected:
      preflight.inspect_model(spec)
    assert str(inspected.value) == str(loaded.value)
    assert "\n" not in str(loaded.value)
  with pytest.raises(ValueError, match="holds weights in 2 formats"):
    preflight.inspect_model(both)  # before: the preflight passed it, and the load refused it


@pytest.mark.parametrize("fmt", ["safetensors", "orbax"])
def test_load_draft_compares_vocabularies_before_reading_the_drafts_weights(tmp_path, monkeypatch, fmt):
  """Issue 54, finding 4: a draft of another vocabulary was refused only after all its weights were
  read. Here reading any weight fails the test, so the refusal must come from the config alone."""
  from conftest import tiny_model  # pylint: disable=g-import-not-at-top

  target = tiny_model(seed=0)
  other = tiny_model(seed=1, vocab_size=target.config.vocab_size + 6)
  bass_jax.save_model(other, tmp_path / "draft", format=fmt)

  def no_reads(*args, **kwargs):
    raise AssertionError("the draft's weights were read")

  monkeypatch.setattr(hf_ckpt, "_read_tensors", no_reads)
  monkeypatch.setattr(bass_jax.loading.orbax_ckpt, "restore_params", no_reads)
  with pytest.raises(ValueError, match=rf"different vocabulary sizes \({other.config.vocab_size} vs "
                     rf"{target.config.vocab_size}\)"):
    bass_jax.load_draft(tmp_path / "draft", target)
