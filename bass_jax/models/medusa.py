"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", §2.1): K heads on the target's last feature, head k proposing the token k + 1 places
past the target's own next token.

Head k is ``num_layers`` residual blocks ``x = x + SiLU(W x + b)`` on the target's feature ``f`` (the
LM head's input, after the final norm), then its own vocabulary projection. With the feature of
position ``n - 2`` (the newest the target has scored: it predicted the row's last token ``x_{n-1}``),
head k proposes ``x_{n+k}``; the heads do not read each other's proposals, so each draft's
distribution is the same whatever was drafted before it, which speculative sampling allows (its
``q`` may be anything; ``bass_jax.sampling.acceptance``).

Two published layouts (:func:`load_medusa`; ``tests/draft_formats/medusa.py`` cites the code):

* FasterDecoding/Medusa (``medusa/model/medusa_model.py``): ``config.json`` with ``medusa_num_heads``,
  ``medusa_num_layers`` and ``base_model_name_or_path``, and ``medusa_lm_head.pt`` (or
  ``.safetensors``) holding ``{h}.{l}.linear.weight/bias`` per block and ``{h}.{L}.weight`` per head.
  The published code builds a head's ``L`` blocks from one block, so its copies are equal; the heads
  the file holds are read (the published Vicuna-7B head's config names 2 of its 5).
* vLLM (``vllm/model_executor/models/medusa.py``): ``config.json`` with ``model_type: "medusa"``,
  ``num_heads``, ``num_hidden_layers``, ``hidden_size``, ``vocab_size``, ``truncated_vocab_size``
  (``medusa_fc_bias``), and ``model.safetensors`` holding ``blocks.{h}.layers.{l}.weight/bias``,
  ``lm_heads.{h}.weight`` and, with a truncated vocabulary, ``token_map`` (the target ids of the
  heads' rows).

Parameters: ``{"blocks": {"kernel": [K, L, H, H] (in, out), "bias": [K, L, H]}, "heads": [K, V', H],
"vocab_ids": i32[V']}``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MODEL_TYPE = "medusa"


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  """Medusa heads for one target.

  Attributes:
    num_heads: K, the heads (the longest chain they propose).
    num_layers: residual blocks per head.
    hidden_size: the target's feature size H. vocab_size: the target's vocabulary V.
    draft_vocab_size: V', the rows of each head (V, or vLLM's truncated vocabulary).
    bias: the blocks' linear layers have a bias.

  Raises:
    ValueError: a non-positive size, or V' above V.
  """

  num_heads: int
  num_layers: int
  hidden_size: int
  vocab_size: int
  draft_vocab_size: int
  bias: bool = True
  model_type = MODEL_TYPE
  eos_token_id = None
  bos_token_id = None
  max_positions = 1 << 30  # the heads have no positions: the target's context rules

  def __post_init__(self):
    for name in ("num_heads", "num_layers", "hidden_size", "vocab_size", "draft_vocab_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"MedusaConfig.{name} must be a positive int, got {value!r}")
    if self.draft_vocab_size > self.vocab_size:
      raise ValueError(f"MedusaConfig.draft_vocab_size={self.draft_vocab_size} exceeds vocab_size="
                       f"{self.vocab_size}")

  @property
  def num_hidden_layers(self) -> int:
    return self.num_layers

  def num_params(self) -> int:
    h = self.hidden_size
    block = h * h + (h if self.bias else 0)
    return self.num_heads * (self.num_layers * block + self.draft_vocab_size * h)


def head_logits(params: dict[str, Any], features: jax.Array) -> jax.Array:
  """``f32[..., K, V']``: every head's logits on ``features [..., H]`` (over the heads' rows)."""
  kernel, bias = params["blocks"]["kernel"], params["blocks"].get("bias")
  x = jnp.broadcast_to(features[..., None, :], features.shape[:-1] + (kernel.shape[0],
                                                                       features.shape[-1]))
  for layer in range(kernel.shape[1]):
    y = jnp.einsum("...KH,KHO->...KO", x, kernel[:, layer].astype(x.dtype),
                   preferred_element_type=jnp.float32).astype(x.dtype)
    if bias is not None:
      y = y + bias[:, layer].astype(x.dtype)
    x = x + jax.nn.silu(y)
  return jnp.einsum("...KH,KVH->...KV", x, params["heads"].astype(x.dtype),
                    preferred_element_type=jnp.float32)


def check_pair(config: MedusaConfig, target_config: Any, name: str = "the Medusa heads") -> None:
  """The heads read the target's features and score its vocabulary.

  Raises:
    ValueError: another feature width or vocabulary (both values named).
  """
  width = getattr(target_config, "hidden_size", None) or getattr(target_config, "n_embd", None)
  if config.hidden_size != width:
    raise ValueError(f"{name} read features of width {config.hidden_size}, and the target's are "
                     f"{width} wide: they were trained for another target")
  if config.vocab_size != target_config.vocab_size:
    raise ValueError(f"{name} score a vocabulary of {config.vocab_size}, the target's has "
                     f"{target_config.vocab_size}: they were trained for another target")


_FD_BLOCK = re.compile(r"^(?:medusa_heads\.)?(\d+)\.(\d+)\.linear\.(weight|bias)$")
_FD_HEAD = re.compile(r"^(?:medusa_heads\.)?(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_HEAD = re.compile(r"^lm_heads\.(\d+)\.weight$")


def is_medusa(path: str | os.PathLike) -> bool:
  """Whether directory ``path`` holds Medusa heads in either layout (by its config.json)."""
  from bass_jax.checkpoints import hf as hf_ckpt  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path)
  if not (path / "config.json").is_file():
    return False
  fields = hf_ckpt.read_config_fields(path)
  return fields.get("model_type") == MODEL_TYPE or "medusa_num_heads" in fields


def _read_state(path: pathlib.Path) -> dict[str, np.ndarray]:
  from bass_jax.checkpoints import eagle_formats  # pylint: disable=g-import-not-at-top

  for name in ("medusa_lm_head.safetensors", "model.safetensors", "medusa_lm_head.pt",
               "pytorch_model.bin"):
    if (path / name).is_file():
      return eagle_formats.read_weights(path / name)
  raise FileNotFoundError(f"{path}: no medusa_lm_head.pt, medusa_lm_head.safetensors, "
                          "model.safetensors or pytorch_model.bin")


def load_medusa(path: str | os.PathLike, *, vocab_size: int | None = None, dtype: Any = jnp.float32
                ) -> tuple[MedusaConfig, dict[str, Any]]:
  """Reads Medusa heads in either published layout (module docstring).

  Args:
    path: the directory. vocab_size: the target's vocabulary, where the config has none
      (FasterDecoding's); None takes the heads' rows.
    dtype: the parameters' dtype.

  Raises:
    FileNotFoundError: no weight file. ValueError: a tensor that is not a block or head of the
      layout (named); heads of different shapes; a head whose blocks are missing; a FasterDecoding
      head whose block copies differ (the published code shares one).
  """
  from bass_jax.checkpoints import hf as hf_ckpt  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path)
  fields = hf_ckpt.read_config_fields(path)
  state = _read_state(path)
  vllm = fields.get("model_type") == MODEL_TYPE
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
  config = MedusaConfig(num_heads=k, num_layers=layers, hidden_size=hidden, vocab_size=vocab,
                        draft_vocab_size=len(vocab_ids), bias=bias)
  blocks_params = {"kernel": jnp.asarray(kernel, dtype)}
  if bias:
    blocks_params["bias"] = jnp.asarray(
        np.stack([np.stack([blocks[(h, l)]["bias"] for l in range(layers)]) for h in range(k)]),
        dtype)
  return config, {"blocks": blocks_params, "heads": jnp.asarray(head_rows, dtype),
                  "vocab_ids": jnp.asarray(vocab_ids, jnp.int32)}
