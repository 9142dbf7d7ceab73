"""Medusa heads' published files -> :class:`bass_jax.models.medusa.MedusaConfig` and parameters, in
the two layouts ``models.medusa``'s docstring describes (FasterDecoding's and vLLM's): which layout a
directory holds (:func:`is_medusa`) and reading it (:func:`load_medusa`). The heads themselves are
``bass_jax.models.medusa``, which does no file I/O.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import jax.numpy as jnp
import numpy as np

from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.models import medusa


_FD_BLOCK = re.compile(r"^(?:medusa_heads\.)?(\d+)\.(\d+)\.linear\.(weight|bias)$")
_FD_HEAD = re.compile(r"^(?:medusa_heads\.)?(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_HEAD = re.compile(r"^lm_heads\.(\d+)\.weight$")


def is_medusa(path: str | os.PathLike, fields: dict[str, Any] | None = None) -> bool:
  """Whether directory ``path`` holds Medusa heads in either layout (by its config.json, or its
  ``fields`` when already read).

  Raises:
    ValueError: a config.json that is not a JSON object (``hf.read_config_fields``).
  """
  path = pathlib.Path(path)
  if fields is None:
    if not (path / "config.json").is_file():
      return False
    fields = hf_ckpt.read_config_fields(path)
  return fields.get("model_type") == medusa.MODEL_TYPE or "medusa_num_heads" in fields


def _read_state(path: pathlib.Path) -> dict[str, np.ndarray]:
  for name in ("medusa_lm_head.safetensors", "model.safetensors", "medusa_lm_head.pt",
               "pytorch_model.bin"):
    if (path / name).is_file():
      return eagle_formats.read_weights(path / name)
  raise FileNotFoundError(f"{path}: no medusa_lm_head.pt, medusa_lm_head.safetensors, "
                          "model.safetensors or pytorch_model.bin")


def load_medusa(path: str | os.PathLike, *, vocab_size: int | None = None, dtype: Any = jnp.float32,
                fields: dict[str, Any] | None = None) -> tuple[medusa.MedusaConfig, dict[str, Any]]:
  """Reads Medusa heads in either published layout (``models.medusa``'s docstring).

  Args:
    path: the directory. vocab_size: the target's vocabulary, where the config has none
      (FasterDecoding's); None takes the heads' rows.
    dtype: the parameters' dtype.
    fields: config.json's object when the caller already read it (``locate.Checkpoint.fields``); None reads it.

  Returns:
    ``(config, params)``: ``params = {"blocks": {"kernel": [K, L, H, H] (in, out), "bias": [K, L, H]
    (when the layout has biases)}, "heads": [K, V', H], "vocab_ids": i32[V']}``, floats in
    ``dtype``; K heads, L blocks per head, H the target's feature width, V' the heads' vocabulary.

  Raises:
    FileNotFoundError: no weight file. ValueError: a tensor that is not a block or head of the
      layout (named); heads of different shapes; a head whose blocks are missing or lie outside
      the heads x layers the config names; a block of the wrong shape; head rows that disagree with
      the ``token_map``, or ``token_map`` ids out of range or repeated; a FasterDecoding head whose
      block copies differ (the published code shares one). CheckpointError: an unreadable weight
      file.
  """
  path = pathlib.Path(path)
  fields = hf_ckpt.read_config_fields(path) if fields is None else fields
  state = _read_state(path)
  vllm = fields.get("model_type") == medusa.MODEL_TYPE
  token_map = state.pop("token_map", None) if vllm else None
  block_re, head_re = (_VLLM_BLOCK, _VLLM_HEAD) if vllm else (_FD_BLOCK, _FD_HEAD)
  blocks: dict[tuple[int, int], dict[str, np.ndarray]] = {}
  heads: dict[int, np.ndarray] = {}
  for name, value in state.items():
    if m := block_re.match(name):
      blocks.setdefault((int(m.group(1)), int(m.group(2))), {})[m.group(3)] = value
    elif m := head_re.match(name):
      heads[int(m.group(1))] = value
    else:
      raise ValueError(f"{path}: tensor {name!r} is not a block or head of the "
                       f"{'vLLM' if vllm else 'FasterDecoding'} Medusa layout")
  if not heads or sorted(heads) != list(range(len(heads))):
    raise ValueError(f"{path}: heads {sorted(heads)} are not 0 .. K-1")
  k = len(heads)
  if not vllm:
    layers = int(fields.get("medusa_num_layers", 1))
  else:
    layers = int(fields.get("num_hidden_layers", 1))
  missing = [(h, l) for h in range(k) for l in range(layers) if (h, l) not in blocks]
  if missing:
    raise ValueError(f"{path}: head {missing[0][0]} has no block {missing[0][1]} of the "
                     f"{layers} its config names")
  if not vllm:
    for h in range(k):
      for l in range(1, layers):
        if any(not np.array_equal(blocks[(h, l)][x], blocks[(h, 0)][x]) for x in blocks[(h, 0)]):
          raise ValueError(f"{path}: head {h}'s block copies differ; FasterDecoding's Medusa shares "
                           "one block per head")
  extra = sorted(set(blocks) - {(h, l) for h in range(k) for l in range(layers)})
  if extra:
    raise ValueError(f"{path}: block {extra[0]} lies outside the {k} heads x {layers} layers")
  shapes = {w.shape for w in heads.values()}
  if len(shapes) != 1:
    raise ValueError(f"{path}: heads of different shapes {sorted(shapes)}")
  rows, hidden = shapes.pop()
  bias = "bias" in blocks[(0, 0)]
  kernel = np.stack([np.stack([blocks[(h, l)]["weight"].T for l in range(layers)]) for h in range(k)])
  if kernel.shape[2:] != (hidden, hidden):
    raise ValueError(f"{path}: blocks of shape {kernel.shape[2:]}, the heads read {hidden}")
  vocab = int(fields.get("vocab_size") or vocab_size or rows)
  if token_map is not None:
    vocab_ids = np.asarray(token_map, np.int64)
    head_rows = np.stack([heads[h] for h in range(k)])
    if rows == vocab and len(vocab_ids) < vocab:  # full-vocabulary heads cut by the map (vLLM)
      head_rows = head_rows[:, vocab_ids]
  else:
    vocab_ids = np.arange(rows, dtype=np.int64)
    head_rows = np.stack([heads[h] for h in range(k)])
  if head_rows.shape[1] != len(vocab_ids):
    raise ValueError(f"{path}: the heads have {head_rows.shape[1]} rows and token_map names "
                     f"{len(vocab_ids)} ids; they must agree (or the heads span the vocabulary)")
  if vocab_ids.max() >= vocab or len(set(vocab_ids.tolist())) != len(vocab_ids):
    raise ValueError(f"{path}: token_map names ids outside the {vocab}-token vocabulary, or twice")
  config = medusa.MedusaConfig(num_heads=k, num_layers=layers, hidden_size=hidden, vocab_size=vocab,
                        draft_vocab_size=len(vocab_ids), bias=bias)
  blocks_params = {"kernel": jnp.asarray(kernel, dtype)}
  if bias:
    blocks_params["bias"] = jnp.asarray(
        np.stack([np.stack([blocks[(h, l)]["bias"] for l in range(layers)]) for h in range(k)]),
        dtype)
  return config, {"blocks": blocks_params, "heads": jnp.asarray(head_rows, dtype),
                  "vocab_ids": jnp.asarray(vocab_ids, jnp.int32)}
