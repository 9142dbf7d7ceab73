"""EAGLE-1/2 draft heads: reference forward and tiny checkpoints in the published layout.

Sources (read, not copied):

* SafeAILab/EAGLE @ cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b
  - ``eagle/model/cnets1.py`` (``Model``, ``LlamaDecoderLayer``, ``LlamaAttention``,
    ``topK_genrate``): the EAGLE-1/2 draft network and how it is driven;
  - ``eagle/model/ea_model.py`` (``EaModel.__init__``/``from_pretrained``/``forward``):
    ``bias = config["bias"]`` defaulting to ``True``; weights from
    ``pytorch_model.bin`` (falling back to ``model.safetensors``), loaded with
    ``strict=False`` over an ``embed_tokens`` copied from the base model, so a
    checkpoint's own ``embed_tokens.weight``, when present, wins;
    the feature handed to the draft is ``base_model.model(...)[0]``, the
    base model's last hidden state after its final norm;
  - ``eagle/model/utils.py`` (``initialize_tree``): the draft's head is the
    base model's ``lm_head``, applied with no norm in between;
  - ``eagle/model/configs.py`` (``EConfig``): ``num_key_value_heads`` defaults to
    ``num_attention_heads``; ``rope_scaling`` only ``{"type": linear|dynamic}``;
  - ``eagle/train/vicuna_7B_config.json`` and ``eagle/train/EAGLE-LLaMA3-Instruct-8B``:
    the configs the published ``yuhuili/EAGLE-Vicuna-7B-v1.3`` and
    ``yuhuili/EAGLE-LLaMA3-Instruct-8B`` heads were trained with;
    ``eagle/train/main.py`` saves the whole draft state (``accelerator.save_state``),
    frozen ``embed_tokens`` included.
* vllm-project/vllm ``vllm/model_executor/models/llama_eagle.py`` @
  00da92319af4b2ad2cde8525b7b609c779bdc52f: same network (layer 0's
  ``input_layernorm`` replaced by identity, ``fc`` of ``2H -> H`` without bias,
  ``embed_tokens`` in a checkpoint skipped in favour of the target's).

Published layout (``config.json`` + ``pytorch_model.bin``, float16):

* config: a ``LlamaConfig``-shaped dict, ``"architectures": ["LlamaForCausalLM"]``,
  ``"model_type": "llama"``, ``"num_hidden_layers": 1``, the target's
  ``hidden_size``/``intermediate_size``/heads/``vocab_size``/``rms_norm_eps``,
  ``"torch_dtype": "float16"``, ``"transformers_version": "4.28.1"``,
  ``"max_position_embeddings": 2048``, ``"pad_token_id": 0``. The Vicuna head's
  config has no ``num_key_value_heads`` (MHA), no ``rope_theta`` (so 10000) and
  no ``bias`` (so ``fc.bias`` exists); the LLaMA-3 head's has
  ``"num_key_value_heads": 8``, ``"rope_theta": 500000.0`` and ``"bias": false``
  (no ``fc.bias``).
* tensors: ``fc.weight [H, 2H]`` (+ ``fc.bias [H]`` unless ``"bias": false``);
  for each layer ``i``: ``layers.i.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.i.mlp.{gate,up,down}_proj.weight``,
  ``layers.i.post_attention_layernorm.weight`` and, for ``i != 0`` only,
  ``layers.i.input_layernorm.weight``; ``embed_tokens.weight [V, H]`` (the
  frozen copy of the target's embedding). No final norm, no ``lm_head``.

Forward (``cnets1.Model.forward``, ``LlamaDecoderLayer.forward``)::

    x = fc(cat(embed(token), feature))        # token first, then the feature
    for layer i:  h = x if i == 0 else rms(x, input_layernorm)
                  x = x + attn(h);  x = x + mlp(rms(x, post_attention_layernorm))
    logits = target.lm_head(x)                # no norm before the head

Head dim is ``hidden_size // num_attention_heads`` (the published code ignores
any ``head_dim``). Alignment: draft step ``i`` pairs the feature of position
``i`` with the token at position ``i + 1`` (``topK_genrate`` drops the first
token) and predicts the feature of, and the token at, position ``i + 2``. Its
rotary position is ``i``, the feature's position (``position_ids`` default
``arange``; tree steps use ``len_posi + depth``); vLLM's proposer does the
same. Rotary attention depends on position differences only, so one constant
offset changes nothing within one causal pass.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from ._common import (
  WeightMaker,
  causal_attention,
  linear,
  load_weights,
  read_json,
  rms_norm,
  save_weights,
  swiglu_mlp,
  target_config_dict,
  target_embedding,
  target_lm_head,
  write_json,
)

__all__ = [
  "EAGLE1_STYLES",
  "write_eagle1_checkpoint",
  "load_eagle1",
  "eagle1_forward",
  "eagle1_inputs",
  "eagle1_tensor_shapes",
]

#: The two published heads this writer imitates.
EAGLE1_STYLES = {
  # yuhuili/EAGLE-Vicuna-7B-v1.3 (eagle/train/vicuna_7B_config.json)
  "vicuna": {"fc_bias": True, "write_rope_theta": False, "write_kv_heads": "if_gqa"},
  # yuhuili/EAGLE-LLaMA3-Instruct-8B (eagle/train/EAGLE-LLaMA3-Instruct-8B)
  "llama3": {"fc_bias": False, "write_rope_theta": True, "write_kv_heads": "always"},
}


def _config_for(target_model, *, style: str, num_hidden_layers: int, dtype: torch.dtype) -> dict[str, Any]:
  t = target_config_dict(target_model)
  preset = EAGLE1_STYLES[style]
  eos = t["eos_token_id"]
  config: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": t["bos_token_id"],
    "eos_token_id": eos[0] if isinstance(eos, list) else eos,
    "hidden_act": "silu",
    "hidden_size": t["hidden_size"],
    "initializer_range": 0.02,
    "intermediate_size": t["intermediate_size"],
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": t["num_attention_heads"],
  }
  gqa = t["num_key_value_heads"] != t["num_attention_heads"]
  if preset["write_kv_heads"] == "always" or gqa:
    config["num_key_value_heads"] = t["num_key_value_heads"]
  config.update(
    {
      "num_hidden_layers": num_hidden_layers,
      "pad_token_id": 0,
      "rms_norm_eps": t["rms_norm_eps"],
      "tie_word_embeddings": False,
      "torch_dtype": str(dtype).replace("torch.", ""),
      "transformers_version": "4.28.1",
      "use_cache": True,
      "vocab_size": t["vocab_size"],
    }
  )
  if preset["write_rope_theta"] or t["rope_theta"] != 10000.0:
    config["rope_theta"] = t["rope_theta"]
  return config


def eagle1_tensor_shapes(config: Mapping[str, Any], *,
                         include_embed_tokens: bool = True) -> dict[str, tuple[int, ...]]:
  """Every tensor name of an EAGLE-1 checkpoint with its shape, from its config."""
  h = config["hidden_size"]
  heads = config["num_attention_heads"]
  kv = config.get("num_key_value_heads") or heads
  hd = h // heads
  inter = config["intermediate_size"]
  shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, 2 * h)}
  if config.get("bias", True):
    shapes["fc.bias"] = (h,)
  for i in range(config["num_hidden_layers"]):
    p = f"layers.{i}."
    shapes[p + "self_attn.q_proj.weight"] = (heads * hd, h)
    shapes[p + "self_attn.k_proj.weight"] = (kv * hd, h)
    shapes[p + "self_attn.v_proj.weight"] = (kv * hd, h)
    shapes[p + "self_attn.o_proj.weight"] = (h, heads * hd)
    shapes[p + "mlp.gate_proj.weight"] = (inter, h)
    shapes[p + "mlp.up_proj.weight"] = (inter, h)
    shapes[p + "mlp.down_proj.weight"] = (h, inter)
    shapes[p + "post_attention_layernorm.weight"] = (h,)
    if i != 0:
      shapes[p + "input_layernorm.weight"] = (h,)
  if include_embed_tokens:
    shapes["embed_tokens.weight"] = (config["vocab_size"], h)
  return shapes


def write_eagle1_checkpoint(
  directory: str | os.PathLike,
  target_model,
  *,
  seed: int = 0,
  style: str = "vicuna",
  fc_bias: bool | None = None,
  include_embed_tokens: bool = True,
  num_hidden_layers: int = 1,
  weights_file: str = "pytorch_model.bin",
  dtype: torch.dtype = torch.float16,
) -> dict[str, torch.Tensor]:
  """Write a random EAGLE-1/2 head for ``target_model`` into ``directory``.

  ``style`` picks the published config it imitates (see ``EAGLE1_STYLES``);
  ``fc_bias`` overrides the style's (``False`` writes ``"bias": false``).
  ``embed_tokens.weight``, when included, is the target's embedding, as the
  published checkpoints hold the frozen copy. Returns the state dict written.
  """
  os.makedirs(directory, exist_ok=True)
  config = _config_for(target_model, style=style, num_hidden_layers=num_hidden_layers, dtype=dtype)
  bias = EAGLE1_STYLES[style]["fc_bias"] if fc_bias is None else fc_bias
  if not bias:
    config["bias"] = False
  shapes = eagle1_tensor_shapes(config, include_embed_tokens=include_embed_tokens)
  make = WeightMaker(seed)
  state: dict[str, torch.Tensor] = {}
  for name, shape in shapes.items():
    if name == "embed_tokens.weight":
      tensor = target_embedding(target_model).clone()
    elif name.endswith("norm.weight"):
      tensor = make.norm(shape[0])
    elif name.endswith(".bias"):
      tensor = make.bias(shape[0])
    else:
      tensor = make.linear(*shape)
    state[name] = tensor.to(dtype)
  write_json(os.path.join(directory, "config.json"), config)
  save_weights(directory, weights_file, state)
  return state


def load_eagle1(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
  """Read an EAGLE-1/2 head as ``ea_model.py`` does: ``pytorch_model.bin`` first,
  else ``model.safetensors``. Returns ``(state_dict, config)``."""
  config = read_json(os.path.join(directory, "config.json"))
  for name in ("pytorch_model.bin", "model.safetensors"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return load_weights(path), config
  raise FileNotFoundError(f"no pytorch_model.bin or model.safetensors in {directory}")


@torch.no_grad()
def eagle1_inputs(target_model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
  """The draft's inputs for a token sequence ``[B, T]``: tokens ``1..T-1`` and the
  target's post-final-norm last hidden state at positions ``0..T-2``
  (both ``T - 1`` long; draft position ``i`` predicts the token at ``i + 2``)."""
  features = target_model.model(input_ids=tokens).last_hidden_state.float()
  return tokens[:, 1:], features[:, :-1]


@torch.no_grad()
def eagle1_forward(
  state_dict: Mapping[str, torch.Tensor],
  config: Mapping[str, Any],
  target_model,
  tokens: torch.Tensor,
  target_features: torch.Tensor,
  *,
  positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
  """Full causal pass of an EAGLE-1/2 head over ``T`` steps.

  ``tokens [B, T]`` are the tokens each step consumes and ``target_features
  [B, T, H]`` the target features paired with them (see ``eagle1_inputs``);
  ``positions`` default to ``arange(T)``. Returns ``(draft_hidden [B, T, H],
  logits [B, T, V])``: the draft's output features (fed back as the next
  step's feature when drafting) and the target ``lm_head`` applied to them.
  """
  b, t = tokens.shape
  h = config["hidden_size"]
  heads = config["num_attention_heads"]
  kv = config.get("num_key_value_heads") or heads
  eps = config.get("rms_norm_eps", 1e-6)
  theta = float(config.get("rope_theta", 10000.0))
  if positions is None:
    positions = torch.arange(t).expand(b, t)
  embed = state_dict.get("embed_tokens.weight")
  embed = target_embedding(target_model) if embed is None else embed.float()
  x = torch.cat([embed[tokens], target_features.float()], dim=-1)  # the token first, then the feature
  x = linear(x, state_dict["fc.weight"], state_dict.get("fc.bias"))
  for i in range(config["num_hidden_layers"]):
    p = f"layers.{i}."
    attn_in = x if i == 0 else rms_norm(x, state_dict[p + "input_layernorm.weight"], eps)
    x = x + causal_attention(
      attn_in,
      state_dict,
      p + "self_attn.",
      num_heads=heads,
      num_kv_heads=kv,
      head_dim=h // heads,
      positions=positions,
      rope_theta=theta,
      rope_scaling=config.get("rope_scaling"),
    )
    mlp_in = rms_norm(x, state_dict[p + "post_attention_layernorm.weight"], eps)
    x = x + swiglu_mlp(mlp_in, state_dict, p + "mlp.")
  return x, linear(x, target_lm_head(target_model))
