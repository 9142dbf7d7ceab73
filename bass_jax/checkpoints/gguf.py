"""GGUF (llama.cpp) Llama checkpoints -> config and Flax parameters, through the ``gguf`` package.

Reference: llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel``): tensor names ``blk.{i}.attn_q`` …,
metadata keys ``llama.*``, and its rotary re-layout of the Q and K projections, which it permutes from HF's
rotate-half order into GGML's interleaved-pair order. :func:`unpermute_rotary` undoes that permutation.
Quantized tensors (Q4_1, Q8_0, …) are dequantized to f32 with ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import functools
import os
import pathlib
from typing import Any

import numpy as np

from bass_jax.checkpoints import _mapping
from bass_jax.checkpoints._mapping import CheckpointError, Rule, transpose
from bass_jax.models.llama import LlamaConfig

# llama.* metadata keys that describe the architecture; any other llama.* key is rejected rather than
# ignored (it could be rope scaling, a sliding window, …).
_ARCH_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
    "attention.key_length": "head_dim",
}
_CHECKED_KEYS = {"rope.dimension_count", "attention.value_length"}


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation on ``weight: [num_heads * H, in]``.

  llama.cpp reshapes the rows to ``[heads, 2, H/2]`` and swaps the last two axes (so that the two
  halves of HF's rotate-half pairs become adjacent); the inverse reshapes to ``[heads, H/2, 2]`` and
  swaps them back.
  """
  rows = weight.shape[0]
  return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
          .swapaxes(1, 2).reshape(weight.shape))


def llama_rules(config: LlamaConfig) -> list[Rule]:
  """The name table GGUF ``llama`` -> :class:`bass_jax.models.llama.Llama`, with transforms."""
  blk = "blk.{layer}."
  q_unperm = functools.partial(unpermute_rotary, num_heads=config.num_attention_heads)
  k_unperm = functools.partial(unpermute_rotary, num_heads=config.num_key_value_heads)
  rules = [
      Rule(("embed_tokens", "embedding"), "token_embd.weight"),
      Rule(("norm", "scale"), "output_norm.weight"),
      Rule(("layers", "input_layernorm", "scale"), blk + "attn_norm.weight"),
      Rule(("layers", "post_attention_layernorm", "scale"), blk + "ffn_norm.weight"),
      Rule(("layers", "self_attn", "q_proj", "kernel"), blk + "attn_q.weight", (q_unperm, transpose)),
      Rule(("layers", "self_attn", "k_proj", "kernel"), blk + "attn_k.weight", (k_unperm, transpose)),
      Rule(("layers", "self_attn", "v_proj", "kernel"), blk + "attn_v.weight", (transpose,)),
      Rule(("layers", "self_attn", "o_proj", "kernel"), blk + "attn_output.weight", (transpose,)),
      Rule(("layers", "mlp", "gate_proj", "kernel"), blk + "ffn_gate.weight", (transpose,)),
      Rule(("layers", "mlp", "up_proj", "kernel"), blk + "ffn_up.weight", (transpose,)),
      Rule(("layers", "mlp", "down_proj", "kernel"), blk + "ffn_down.weight", (transpose,)),
  ]
  if not config.tie_word_embeddings:
    rules.append(Rule(("lm_head",), "output.weight", (transpose,)))
  return rules


def _open(path: pathlib.Path):
  import gguf  # pylint: disable=g-import-not-at-top

  if not path.is_file():
    raise FileNotFoundError(f"GGUF file not found: {path}")
  try:
    return gguf.GGUFReader(str(path))
  except Exception as e:  # the reader raises ValueError, struct errors, numpy errors …
    raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _field(reader, key: str):
  return reader.fields[key].contents() if key in reader.fields else None


def read_config(reader, path: pathlib.Path) -> LlamaConfig:
  """The :class:`LlamaConfig` described by a GGUF file's ``llama.*`` metadata.

  Raises:
    ValueError: another architecture, an unknown ``llama.*`` key, or inconsistent head sizes.
  """
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"{path}: general.architecture is {arch!r}; only 'llama' GGUF files are supported")
  kwargs: dict[str, Any] = {}
  for key in reader.fields:
    if not key.startswith("llama."):
      continue
    name = key[len("llama."):]
    if name in _ARCH_KEYS:
      kwargs[_ARCH_KEYS[name]] = _field(reader, key)
    elif name not in _CHECKED_KEYS:
      raise ValueError(f"{path}: unsupported GGUF metadata key {key!r} (the Llama port would ignore it)")
  kwargs.setdefault("head_dim", kwargs["hidden_size"] // kwargs["num_attention_heads"])
  for key in _CHECKED_KEYS:
    value = _field(reader, "llama." + key)
    if value is not None and value != kwargs["head_dim"]:
      raise ValueError(f"{path}: llama.{key}={value} differs from head_dim={kwargs['head_dim']} "
                       "(partial rotary or asymmetric heads are not Llama)")
  names = {t.name for t in reader.tensors}
  if "vocab_size" not in kwargs:
    kwargs["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
  for int_key in ("num_hidden_layers", "max_position_embeddings", "hidden_size",
                  "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                  "head_dim"):
    kwargs[int_key] = int(kwargs[int_key])
  return LlamaConfig(
      **kwargs,
      tie_word_embeddings="output.weight" not in names,
      bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
      eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
      pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
  )


def load_gguf(path: str | os.PathLike, *, expected: Any,
              dtype: Any) -> tuple[LlamaConfig, dict[str, Any]]:
  """Reads a Llama GGUF file into ``(config, params)``, dequantizing every tensor.

  Args:
    path: the ``.gguf`` file.
    expected: ``config -> abstract params`` callable, used to check every shape.
    dtype: dtype of the returned parameters.

  Raises:
    FileNotFoundError: no such file. CheckpointError: unreadable file, or a tensor missing, left over
      or mis-shaped. ValueError: unsupported architecture or metadata.
  """
  import gguf  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path)
  reader = _open(path)
  config = read_config(reader, path)
  tensors = {t.name: t for t in reader.tensors}

  def read(name: str) -> np.ndarray:
    tensor = tensors[name]
    try:
      return gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except Exception as e:
      raise CheckpointError(f"{path}: cannot dequantize {name} ({tensor.tensor_type.name}): {e}") from e

  params = _mapping.to_flax(
      llama_rules(config), source_names=tensors, read=read, expected=expected(config),
      num_layers=config.num_hidden_layers, dtype=dtype, where=str(path))
  return config, params
