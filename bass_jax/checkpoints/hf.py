"""Hugging Face checkpoint directories (config.json + safetensors) <-> Flax parameters.

Reference: transformers' ``LlamaForCausalLM`` state-dict names. PyTorch ``nn.Linear`` stores
``weight: [out, in]``; Flax ``Dense`` stores ``kernel: [in, out]``, hence the transposes.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from bass_jax.checkpoints import _mapping
from bass_jax.checkpoints._mapping import CheckpointError, Rule, transpose
from bass_jax.models.llama import LlamaConfig

_T = (transpose,)


def llama_rules(config: LlamaConfig) -> list[Rule]:
  """The name table HF ``LlamaForCausalLM`` <-> :class:`bass_jax.models.llama.Llama`."""
  layer = "model.layers.{layer}."
  rules = [
      Rule(("embed_tokens", "embedding"), "model.embed_tokens.weight"),
      Rule(("norm", "scale"), "model.norm.weight"),
      Rule(("layers", "input_layernorm", "scale"), layer + "input_layernorm.weight"),
      Rule(("layers", "post_attention_layernorm", "scale"), layer + "post_attention_layernorm.weight"),
  ]
  for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
    rules.append(Rule(("layers", "self_attn", proj, "kernel"), f"{layer}self_attn.{proj}.weight", _T, _T))
    if config.attention_bias:
      rules.append(Rule(("layers", "self_attn", proj, "bias"), f"{layer}self_attn.{proj}.bias"))
  for proj in ("gate_proj", "up_proj", "down_proj"):
    rules.append(Rule(("layers", "mlp", proj, "kernel"), f"{layer}mlp.{proj}.weight", _T, _T))
    if config.mlp_bias:
      rules.append(Rule(("layers", "mlp", proj, "bias"), f"{layer}mlp.{proj}.bias"))
  if not config.tie_word_embeddings:
    rules.append(Rule(("lm_head",), "lm_head.weight", _T, _T))
  return rules


def _is_ignorable(name: str) -> bool:
  # Precomputed rotary tables that old PyTorch checkpoints carry as buffers.
  return name.endswith("rotary_emb.inv_freq")


def read_config(path: str | os.PathLike) -> LlamaConfig:
  """Reads ``config.json`` of an HF checkpoint directory.

  Raises:
    FileNotFoundError: no config.json. ValueError: unsupported model or field (see from_hf_config).
  """
  config_path = pathlib.Path(path) / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"{path}: no config.json; not a Hugging Face checkpoint directory")
  try:
    fields = json.loads(config_path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path}: not valid JSON ({e})") from e
  return LlamaConfig.from_hf_config(fields)


def _read_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of the directory's safetensors files (or PyTorch .bin files), as numpy f32/bf16."""
  files = sorted(path.glob("*.safetensors"))
  tensors: dict[str, np.ndarray] = {}
  if files:
    import safetensors.numpy  # pylint: disable=g-import-not-at-top

    for file in files:
      try:
        part = safetensors.numpy.load_file(str(file))
      except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise CheckpointError(f"{file}: cannot read safetensors file ({e}); re-export it") from e
      _merge(tensors, part, file)
    return tensors
  bins = sorted(path.glob("pytorch_model*.bin"))
  if bins:
    import torch  # pylint: disable=g-import-not-at-top

    for file in bins:
      try:
        state = torch.load(str(file), map_location="cpu", weights_only=True)
      except Exception as e:
        raise CheckpointError(f"{file}: cannot read PyTorch checkpoint ({e})") from e
      _merge(tensors, {k: v.float().numpy() for k, v in state.items()}, file)
    return tensors
  raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model*.bin weight files")


def _merge(into: dict[str, np.ndarray], part: dict[str, np.ndarray], file: pathlib.Path) -> None:
  duplicate = set(into) & set(part)
  if duplicate:
    raise CheckpointError(f"{file}: tensor(s) {sorted(duplicate)[:4]} also appear in another shard")
  into.update(part)


def load_hf_checkpoint(path: str | os.PathLike, *, expected: Any,
                       dtype: Any) -> tuple[LlamaConfig, dict[str, Any]]:
  """Reads an HF Llama checkpoint directory into ``(config, params)``.

  Args:
    path: directory with ``config.json`` and ``*.safetensors`` (or ``pytorch_model*.bin``).
    expected: ``config -> abstract params`` callable, used to check every shape.
    dtype: dtype of the returned parameters.

  Raises:
    FileNotFoundError, ValueError, CheckpointError: missing files, unsupported config, or tensors that
      do not match the config (missing, extra, mis-shaped), each naming the problem.
  """
  path = pathlib.Path(path)
  config = read_config(path)
  tensors = _read_tensors(path)
  if config.tie_word_embeddings and "lm_head.weight" in tensors:
    # Some exporters write the tied head out as well; it must be the embedding, or the config lies.
    head = tensors.pop("lm_head.weight")
    if not np.array_equal(head, tensors.get("model.embed_tokens.weight")):
      raise CheckpointError(f"{path}: tie_word_embeddings is true but lm_head.weight differs from "
                            "model.embed_tokens.weight; set tie_word_embeddings=false")
  params = _mapping.to_flax(
      llama_rules(config), source_names=tensors, read=tensors.__getitem__, expected=expected(config),
      num_layers=config.num_hidden_layers, dtype=dtype, ignore=_is_ignorable, where=str(path))
  return config, params


def save_hf_checkpoint(path: str | os.PathLike, config: LlamaConfig, params: Any) -> None:
  """Writes ``config.json`` + ``model.safetensors`` that transformers' ``LlamaForCausalLM`` loads.

  Parameters are written in f32 unless they are f16/f32 already (safetensors' numpy writer has no
  bfloat16).
  """
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  tensors = _mapping.from_flax(llama_rules(config), params, num_layers=config.num_hidden_layers)
  tensors = {k: v if v.dtype in (np.float32, np.float16) else v.astype(np.float32)
             for k, v in tensors.items()}
  safetensors.numpy.save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
  hf_config = config.to_hf_config()
  hf_config.architectures = ["LlamaForCausalLM"]
  hf_config.save_pretrained(str(path))

