"""Medusa heads, both published layouts: reference forward and tiny checkpoints.

Sources (read, not copied):

* FasterDecoding/Medusa @ e2a5d20c048a9b0a4092e6933c34313687422518
  - ``medusa/model/medusa_model.py``: ``MedusaConfig`` (``medusa_num_heads``,
    ``medusa_num_layers``, ``base_model_name_or_path``); ``ResBlock``
    (``x + SiLU(linear(x))``, ``nn.Linear(H, H)`` *with* bias); each head is
    ``nn.Sequential(*([ResBlock(H)] * medusa_num_layers), nn.Linear(H, V,
    bias=False))``; ``from_pretrained`` reads ``medusa_lm_head.pt`` with
    ``torch.load`` and ``load_state_dict(strict=False)``, and forces five heads
    ("TODO: fix the uploaded config (only include 2 heads)"); ``forward`` feeds
    each head ``base_model.model(...)[0]``, the base model's last hidden state
    after its final norm;
  - ``medusa/model/medusa_model_legacy.py`` / ``medusa/train/train_legacy.py``:
    the same heads; ``MedusaConfig.save_pretrained`` writes ``config.json``.
  The published ``FasterDecoding/medusa-vicuna-7b-v1.3`` is ``config.json``
  (``base_model_name_or_path``, ``medusa_num_heads`` -- 2, while the file holds
  five heads --, ``medusa_num_layers``, ``transformers_version``; no hidden or
  vocabulary size, those are the base model's) + ``medusa_lm_head.pt``.
* vllm-project/vllm
  - ``vllm/model_executor/models/medusa.py`` @ 01dbb08195ca9c70ac9044786a906a353e07fcdf:
    ``blocks.{h}.layers.{l}.weight`` (+ ``.bias`` only with config
    ``medusa_fc_bias``), ``lm_heads.{h}.weight`` (or a single shared
    ``lm_heads.0.weight`` with ``original_lm_head``), optional ``token_map``
    with ``truncated_vocab_size < vocab_size`` (logits scattered to the full
    vocabulary, ``-inf`` elsewhere; a full-size head is sliced by the map); a
    ``medusa_heads.`` prefix is stripped on load;
  - ``vllm/transformers_utils/configs/medusa.py`` @ 0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f:
    ``MedusaConfig`` (``model_type: "medusa"``, ``hidden_size``, ``vocab_size``,
    ``num_heads``, ``num_hidden_layers``, ``max_paths``, ``topk``,
    ``truncated_vocab_size``, ``architectures: ["MedusaModel"]``); on load every
    key containing "num" and "heads"/"layers" is renamed to
    ``num_heads``/``num_hidden_layers``.

Layouts written here:

* ``"fasterdecoding"``: ``config.json`` + ``medusa_lm_head.pt`` (``torch.save``
  of a dict, float16): ``{h}.{l}.linear.weight [H, H]``, ``{h}.{l}.linear.bias
  [H]`` for ``l < L``, ``{h}.{L}.weight [V, H]``. Because the published code
  repeats *one* ``ResBlock`` object ``L`` times, its state dict holds ``L``
  identical copies and the block is applied ``L`` times with those weights; the
  writer writes identical copies and the reader refuses copies that differ.
* ``"vllm"``: ``config.json`` + ``model.safetensors``: ``blocks.{h}.layers.{l}.weight
  [H, H]`` (``.bias`` with ``medusa_fc_bias``), ``lm_heads.{h}.weight [V', H]``,
  ``token_map [V']`` int64 when ``truncated_vocab_size`` ``V' < V``.

Forward, head ``k`` (0-based) on the target feature ``f`` of position ``t``::

    x = f;  for each block:  x = x + SiLU(W x + b);  logits_k = head_k(x)

and ``logits_k`` proposes the token at ``t + k + 2`` (the target's own head
gives ``t + 1``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import torch

from ._common import (
  WeightMaker,
  linear,
  load_weights,
  read_json,
  save_weights,
  target_config_dict,
  write_json,
)

__all__ = [
  "MEDUSA_LAYOUTS",
  "write_medusa_checkpoint",
  "load_medusa",
  "medusa_forward",
  "medusa_features",
  "canonical_medusa_state",
]

MEDUSA_LAYOUTS = ("fasterdecoding", "vllm")


@torch.no_grad()
def medusa_features(target_model, tokens: torch.Tensor) -> torch.Tensor:
  """The feature Medusa heads read: the target's last hidden state after its final norm."""
  return target_model.model(input_ids=tokens).last_hidden_state.float()


def write_medusa_checkpoint(
  directory: str | os.PathLike,
  target_model,
  *,
  seed: int = 0,
  layout: str = "fasterdecoding",
  num_heads: int = 3,
  num_layers: int = 1,
  fc_bias: bool | None = None,
  truncated_vocab_size: int | None = None,
  config_num_heads: int | None = None,
  base_model_name_or_path: str = "tiny-llama-target",
  dtype: torch.dtype = torch.float16,
  weights_file: str | None = None,
) -> dict[str, torch.Tensor]:
  """Write random Medusa heads for ``target_model`` into ``directory``.

  ``fc_bias`` defaults to the layout's own (FasterDecoding always has biases;
  vLLM's default ``medusa_fc_bias`` is false). ``truncated_vocab_size``
  (vLLM layout only) writes a ``token_map`` of that many target ids.
  ``config_num_heads`` writes a different head count into the FasterDecoding
  config than the file holds, as the published Vicuna-7B head does.
  Values are drawn in one order for both layouts, so one seed gives the same
  heads in either when ``num_layers == 1`` and ``fc_bias`` agree (with more
  layers FasterDecoding shares one block per head, vLLM has one per layer).
  Returns the state dict written.
  """
  if layout not in MEDUSA_LAYOUTS:
    raise ValueError(f"layout is one of {MEDUSA_LAYOUTS}")
  t = target_config_dict(target_model)
  hidden, vocab = t["hidden_size"], t["vocab_size"]
  if fc_bias is None:
    fc_bias = layout == "fasterdecoding"
  if layout == "fasterdecoding" and not fc_bias:
    raise ValueError("FasterDecoding's ResBlock always has a bias")
  if truncated_vocab_size is not None and layout != "vllm":
    raise ValueError("truncated_vocab_size is vLLM's option")
  out_vocab = truncated_vocab_size or vocab
  make = WeightMaker(seed)
  blocks: list[list[tuple[torch.Tensor, torch.Tensor | None]]] = []
  heads: list[torch.Tensor] = []
  shared_copies = layout == "fasterdecoding"
  for _ in range(num_heads):
    layers = []
    for l in range(num_layers):
      if shared_copies and l > 0:
        layers.append(layers[0])
        continue
      w = make.linear(hidden, hidden)
      b = make.bias(hidden) if fc_bias else None
      layers.append((w, b))
    blocks.append(layers)
    heads.append(make.linear(vocab, hidden))
  token_map = None
  if out_vocab < vocab:
    token_map = make.permutation(vocab)[:out_vocab].sort().values.to(torch.int64)
    heads = [hd[token_map] for hd in heads]

  state: dict[str, torch.Tensor] = {}
  if layout == "fasterdecoding":
    for h in range(num_heads):
      for l, (w, b) in enumerate(blocks[h]):
        state[f"{h}.{l}.linear.weight"] = w.to(dtype)
        state[f"{h}.{l}.linear.bias"] = b.to(dtype)
      state[f"{h}.{num_layers}.weight"] = heads[h].to(dtype)
    config = {
      "base_model_name_or_path": base_model_name_or_path,
      "medusa_num_heads": config_num_heads or num_heads,
      "medusa_num_layers": num_layers,
      "transformers_version": "4.31.0",
    }
    weights_file = weights_file or "medusa_lm_head.pt"
  else:
    for h in range(num_heads):
      for l, (w, b) in enumerate(blocks[h]):
        state[f"blocks.{h}.layers.{l}.weight"] = w.to(dtype)
        if b is not None:
          state[f"blocks.{h}.layers.{l}.bias"] = b.to(dtype)
    for h in range(num_heads):
      state[f"lm_heads.{h}.weight"] = heads[h].to(dtype)
    if token_map is not None:
      state["token_map"] = token_map
    config = {
      "architectures": ["MedusaModel"],
      "hidden_size": hidden,
      "max_paths": 64,
      "model_type": "medusa",
      "num_heads": num_heads,
      "num_hidden_layers": num_layers,
      "topk": 10,
      "torch_dtype": str(dtype).replace("torch.", ""),
      "truncated_vocab_size": out_vocab,
      "vocab_size": vocab,
    }
    if fc_bias:
      config["medusa_fc_bias"] = True
    weights_file = weights_file or "model.safetensors"
  os.makedirs(directory, exist_ok=True)
  write_json(os.path.join(directory, "config.json"), config)
  save_weights(directory, weights_file, state)
  return state


def load_medusa(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
  """Read either layout: ``medusa_lm_head.pt`` (FasterDecoding; also
  ``medusa_lm_head.safetensors`` as ``train_legacy.py`` saves it) or
  ``model.safetensors``/``pytorch_model.bin`` (vLLM). Returns ``(state_dict,
  config)`` with names as stored."""
  config = read_json(os.path.join(directory, "config.json"))
  for name in ("medusa_lm_head.pt", "medusa_lm_head.safetensors", "model.safetensors", "pytorch_model.bin"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return load_weights(path), config
  raise FileNotFoundError(f"no Medusa weights in {directory}")


_FD_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_FD_HEAD = re.compile(r"^(\d+)\.(\d+)\.weight$")


def canonical_medusa_state(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
  """Both layouts as ``{"blocks": [[(W, b|None), ...] per head], "heads": [W_k],
  "token_map": tensor|None}``, in float32."""
  sd = {k.replace("medusa_heads.", "", 1): v for k, v in state_dict.items()}
  if any(_FD_BLOCK.match(k) for k in sd) or all(_FD_HEAD.match(k) for k in sd):
    per_head: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    head_w: dict[int, tuple[int, torch.Tensor]] = {}
    for k, v in sd.items():
      m = _FD_BLOCK.match(k)
      if m:
        per_head.setdefault(int(m[1]), {}).setdefault(int(m[2]), {})[m[3]] = v.float()
        continue
      m = _FD_HEAD.match(k)
      if not m:
        raise ValueError(f"unexpected FasterDecoding Medusa tensor {k}")
      head_w[int(m[1])] = (int(m[2]), v.float())
    blocks, heads = [], []
    for h in range(len(head_w)):
      n_layers, w = head_w[h]
      layers = [(per_head[h][l]["weight"], per_head[h][l].get("bias")) for l in range(n_layers)]
      for w_l, b_l in layers[1:]:
        if not (torch.equal(w_l, layers[0][0]) and torch.equal(b_l, layers[0][1])):
          raise ValueError(
            "FasterDecoding Medusa repeats one ResBlock object, so its copies must be equal"
          )
      blocks.append(layers)
      heads.append(w)
    return {"blocks": blocks, "heads": heads, "token_map": None}
  n_heads = 1 + max(int(m[1]) for k in sd if (m := re.match(r"^blocks\.(\d+)\.", k)))
  blocks = []
  for h in range(n_heads):
    n_layers = 1 + max(int(m[1]) for k in sd if (m := re.match(rf"^blocks\.{h}\.layers\.(\d+)\.weight$", k)))
    blocks.append(
      [
        (
          sd[f"blocks.{h}.layers.{l}.weight"].float(),
          sd[f"blocks.{h}.layers.{l}.bias"].float() if f"blocks.{h}.layers.{l}.bias" in sd else None,
        )
        for l in range(n_layers)
      ]
    )
  if f"lm_heads.{n_heads - 1}.weight" in sd:
    heads = [sd[f"lm_heads.{h}.weight"].float() for h in range(n_heads)]
  else:  # original_lm_head: one shared head
    heads = [sd["lm_heads.0.weight"].float()] * n_heads
  return {"blocks": blocks, "heads": heads, "token_map": sd.get("token_map")}


@torch.no_grad()
def medusa_forward(
  state_dict: Mapping[str, torch.Tensor],
  config: Mapping[str, Any],
  features: torch.Tensor,
  *,
  vocab_size: int | None = None,
) -> torch.Tensor:
  """Logits ``[B, T, K, V]`` of all ``K`` heads on ``features [B, T, H]``.

  ``V`` is the target vocabulary: ``config["vocab_size"]`` (vLLM layout) or
  ``vocab_size`` (FasterDecoding configs carry none; defaults to the heads'
  row count). With a ``token_map`` the logits outside it are ``-inf``.
  """
  c = canonical_medusa_state(state_dict)
  vocab = config.get("vocab_size") or vocab_size or c["heads"][0].shape[0]
  f = features.float()
  out = []
  for layers, head in zip(c["blocks"], c["heads"]):
    x = f
    for w, b in layers:
      x = x + torch.nn.functional.silu(linear(x, w, b))
    logits = linear(x, head)
    tm = c["token_map"]
    if tm is not None:
      if head.shape[0] > tm.shape[0]:  # a full-vocabulary head sliced by the map
        logits = logits[..., tm]
      full = torch.full((*logits.shape[:-1], vocab), float("-inf"))
      full[..., tm.long()] = logits
      logits = full
    out.append(logits)
  return torch.stack(out, dim=-2)
