"""Shared pieces of the draft-format references: Llama-style math written out in
plain PyTorch (RMSNorm, rotary embedding, grouped-query causal attention, SwiGLU),
checkpoint file I/O, and seeded random weights.

Everything here computes in float32, whatever dtype a checkpoint was written in,
so a reference is a fixed point to compare against, not a dtype simulation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any, Mapping

import torch

__all__ = [
  "tiny_llama_target",
  "target_config_dict",
  "target_embedding",
  "target_lm_head",
  "rms_norm",
  "rope_cos_sin",
  "causal_attention",
  "swiglu_mlp",
  "linear",
  "save_weights",
  "load_weights",
  "write_json",
  "read_json",
  "WeightMaker",
  "draft_to_target_logits",
]


# --------------------------------------------------------------------------
# The target


def tiny_llama_target(
  *,
  hidden_size: int = 64,
  num_attention_heads: int = 4,
  num_key_value_heads: int = 2,
  num_hidden_layers: int = 8,
  intermediate_size: int = 128,
  vocab_size: int = 300,
  rope_theta: float = 10000.0,
  initializer_range: float = 0.1,
  seed: int = 0,
):
  """A tiny random ``transformers.LlamaForCausalLM`` in float32, eval mode.

  ``initializer_range`` is larger than Llama's 0.02 so that embeddings and the
  target's head give logits of order one (0.02 makes every token look alike).
  Eight layers by default: EAGLE-3's default taps ``(2, L // 2, L - 3)`` are
  three distinct layers only for ``L == 7`` or ``L >= 8``.
  """
  from transformers import LlamaConfig, LlamaForCausalLM

  config = LlamaConfig(
    vocab_size=vocab_size,
    hidden_size=hidden_size,
    intermediate_size=intermediate_size,
    num_hidden_layers=num_hidden_layers,
    num_attention_heads=num_attention_heads,
    num_key_value_heads=num_key_value_heads,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=rope_theta,
    initializer_range=initializer_range,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
  )
  with torch.random.fork_rng(devices=[]):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Norm weights start at one; move them so that a missing norm shows.
    for name, param in model.named_parameters():
      if name.endswith("norm.weight"):
        with torch.no_grad():
          param.add_(0.1 * torch.randn_like(param))
  return model.float().eval()


def target_config_dict(target_model) -> dict[str, Any]:
  """The fields of a target's config the draft configs copy, in plain types."""
  cfg = target_model.config
  rope = getattr(cfg, "rope_parameters", None) or {}
  theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
  heads = cfg.num_attention_heads
  head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
  return {
    "hidden_size": cfg.hidden_size,
    "intermediate_size": cfg.intermediate_size,
    "num_hidden_layers": cfg.num_hidden_layers,
    "num_attention_heads": heads,
    "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or heads,
    "head_dim": head_dim,
    "vocab_size": cfg.vocab_size,
    "rms_norm_eps": cfg.rms_norm_eps,
    "rope_theta": float(theta),
    "max_position_embeddings": cfg.max_position_embeddings,
    "bos_token_id": cfg.bos_token_id,
    "eos_token_id": cfg.eos_token_id,
    "hidden_act": getattr(cfg, "hidden_act", "silu"),
    "architectures": list(getattr(cfg, "architectures", None) or ["LlamaForCausalLM"]),
  }


def target_embedding(target_model) -> torch.Tensor:
  return target_model.get_input_embeddings().weight.detach().float()


def target_lm_head(target_model) -> torch.Tensor:
  return target_model.get_output_embeddings().weight.detach().float()


# --------------------------------------------------------------------------
# Llama math


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
  out = x @ weight.float().T
  if bias is not None:
    out = out + bias.float()
  return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
  x = x.float()
  return weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _inv_freq(head_dim: int, theta: float, rope_scaling: Mapping[str, Any] | None):
  """Inverse frequencies and the attention scaling factor of a rope config.

  ``None``/default and ``linear`` are written out here (the two kinds the
  SafeAILab EAGLE code implements itself, with ``linear`` dividing positions by
  the factor, which is the same as dividing the frequencies); every other kind
  (``llama3``, ``yarn``, ...) is delegated to transformers' rope init functions,
  which is what SpecForge (v5 path), speculators and vLLM all follow.
  """
  kind = None
  if rope_scaling:
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
  base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
  if kind in (None, "default"):
    return base.float(), 1.0
  if kind == "linear":
    return (base / float(rope_scaling["factor"])).float(), 1.0
  from transformers import LlamaConfig
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  params = dict(rope_scaling)
  params["rope_type"] = kind
  params["rope_theta"] = theta
  cfg = LlamaConfig(
    hidden_size=head_dim,
    num_attention_heads=1,
    head_dim=head_dim,
    rope_parameters=params,
    max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
  )
  inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](cfg, torch.device("cpu"))
  return inv_freq.float(), float(scaling)


def rope_cos_sin(
  positions: torch.Tensor,
  head_dim: int,
  theta: float,
  rope_scaling: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
  """``cos, sin`` of shape ``[B, T, head_dim]`` for the half-split (NeoX /
  ``rotate_half``) rotary convention every format here uses."""
  inv_freq, scaling = _inv_freq(head_dim, theta, rope_scaling)
  freqs = positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)
  emb = torch.cat([freqs, freqs], dim=-1)
  return (emb.cos() * scaling).float(), (emb.sin() * scaling).float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
  half = x.shape[-1] // 2
  return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def causal_attention(
  x: torch.Tensor,
  weights: Mapping[str, torch.Tensor],
  prefix: str,
  *,
  num_heads: int,
  num_kv_heads: int,
  head_dim: int,
  positions: torch.Tensor,
  rope_theta: float,
  rope_scaling: Mapping[str, Any] | None = None,
) -> torch.Tensor:
  """Llama self-attention over ``x [B, T, D_in]`` (full causal mask over T),
  weights ``{prefix}{q,k,v,o}_proj.weight`` (biases used when present)."""
  b, t, _ = x.shape

  def proj(name):
    return linear(x, weights[f"{prefix}{name}.weight"], weights.get(f"{prefix}{name}.bias"))

  q = proj("q_proj").view(b, t, num_heads, head_dim).transpose(1, 2)
  k = proj("k_proj").view(b, t, num_kv_heads, head_dim).transpose(1, 2)
  v = proj("v_proj").view(b, t, num_kv_heads, head_dim).transpose(1, 2)
  cos, sin = rope_cos_sin(positions, head_dim, rope_theta, rope_scaling)
  cos, sin = cos[:, None], sin[:, None]
  q = q * cos + _rotate_half(q) * sin
  k = k * cos + _rotate_half(k) * sin
  groups = num_heads // num_kv_heads
  k = k.repeat_interleave(groups, dim=1)
  v = v.repeat_interleave(groups, dim=1)
  scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
  mask = torch.ones(t, t, dtype=torch.bool).tril()
  scores = scores.masked_fill(~mask, float("-inf"))
  out = torch.softmax(scores, dim=-1) @ v
  out = out.transpose(1, 2).reshape(b, t, num_heads * head_dim)
  return linear(out, weights[f"{prefix}o_proj.weight"], weights.get(f"{prefix}o_proj.bias"))


def swiglu_mlp(x: torch.Tensor, weights: Mapping[str, torch.Tensor], prefix: str) -> torch.Tensor:
  gate = linear(x, weights[f"{prefix}gate_proj.weight"])
  up = linear(x, weights[f"{prefix}up_proj.weight"])
  return linear(torch.nn.functional.silu(gate) * up, weights[f"{prefix}down_proj.weight"])


def draft_to_target_logits(draft_logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
  """Scatter logits over a reduced draft vocabulary into the target vocabulary,
  ``-inf`` where the draft has no token: target id = draft id + ``d2t[draft id]``
  (SafeAILab ``cnets.py`` ``topK_genrate``; vLLM ``Eagle3LlamaForCausalLM.compute_logits``)."""
  ids = torch.arange(d2t.shape[0]) + d2t.long()
  out = torch.full((*draft_logits.shape[:-1], vocab_size), float("-inf"), dtype=draft_logits.dtype)
  out[..., ids] = draft_logits
  return out


# --------------------------------------------------------------------------
# Random weights


class WeightMaker:
  """Seeded random tensors of a scale that keeps activations of order one.

  Linear weights are ``N(0, 1/fan_in)``; norm weights ``1 + N(0, 0.1^2)`` (so
  that a forgotten norm changes the result); biases ``N(0, 0.1^2)``. Tensors
  are drawn in the order asked for, so two layouts of one format that ask in
  the same order get identical values.
  """

  def __init__(self, seed: int):
    self.gen = torch.Generator().manual_seed(seed)

  def linear(self, out_features: int, in_features: int) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=self.gen) / math.sqrt(in_features)

  def norm(self, size: int) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(size, generator=self.gen)

  def bias(self, size: int) -> torch.Tensor:
    return 0.1 * torch.randn(size, generator=self.gen)

  def normal(self, *shape: int, std: float = 1.0) -> torch.Tensor:
    return std * torch.randn(*shape, generator=self.gen)

  def permutation(self, n: int) -> torch.Tensor:
    return torch.randperm(n, generator=self.gen)


# --------------------------------------------------------------------------
# Files


def write_json(path: str | os.PathLike, obj: Any) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2)
    f.write("\n")


def read_json(path: str | os.PathLike) -> dict[str, Any]:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def save_weights(directory: str | os.PathLike, filename: str, state: Mapping[str, torch.Tensor]) -> str:
  """``*.safetensors`` through safetensors (with ``{"format": "pt"}`` metadata,
  as ``save_pretrained`` writes it), anything else through ``torch.save`` of a
  plain dict of tensors (as the published ``pytorch_model.bin`` and
  ``medusa_lm_head.pt`` are)."""
  path = os.path.join(os.fspath(directory), filename)
  tensors = {k: v.detach().contiguous().clone() for k, v in state.items()}
  if filename.endswith(".safetensors"):
    from safetensors.torch import save_file

    save_file(tensors, path, metadata={"format": "pt"})
  else:
    torch.save(tensors, path)
  return path


def load_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
  path = os.fspath(path)
  if path.endswith(".safetensors"):
    from safetensors.torch import load_file

    return dict(load_file(path))
  return dict(torch.load(path, map_location="cpu", weights_only=True))


@contextlib.contextmanager
def one_torch_thread():
  """Torch on one thread, restored after: matrices of 64 are far below what a second thread pays for
  (on a loaded 2-core machine two threads made every small matmul take ~15 ms instead of ~0.05 ms)."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    yield
  finally:
    torch.set_num_threads(threads)
