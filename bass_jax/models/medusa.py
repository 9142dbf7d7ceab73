"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", §2.1): K heads on the target's last feature, head k proposing the token k + 1 places
past the target's own next token.

Head k is ``num_layers`` residual blocks ``x = x + SiLU(W x + b)`` on the target's feature ``f`` (the
LM head's input, after the final norm), then its own vocabulary projection. With the feature of
position ``n - 2`` (the newest the target has scored: it predicted the row's last token ``x_{n-1}``),
head k proposes ``x_{n+k}``; the heads do not read each other's proposals, so each draft's
distribution is the same whatever was drafted before it, which speculative sampling allows (its
``q`` may be anything; ``bass_jax.sampling.acceptance``).

Two published layouts (``checkpoints.medusa_files.load_medusa``; ``tests/draft_formats/medusa.py`` cites the code):

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
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.sharding import HEADS, KV_HEADS, MLP, VOCAB

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
  # Small: whole on every device (bass_jax.sharding).
  PARAM_AXES = (("blocks/kernel", (None, None, None, None)), ("blocks/bias", (None, None, None)),
                ("heads", (None, None, None)), ("vocab_ids", (None,)))

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

  def logical_sizes(self) -> dict[str, int]:
    """``bass_jax.sharding.logical_sizes``: nothing of the heads is split but the vocabulary."""
    return {HEADS: 1, KV_HEADS: 1, MLP: 1, VOCAB: self.vocab_size}

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
