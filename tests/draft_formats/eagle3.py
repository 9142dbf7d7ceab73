"""EAGLE-3 draft heads, both published layouts: reference forward, target taps,
and tiny checkpoints.

Sources (read, not copied):

* SafeAILab/EAGLE @ cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b
  - ``eagle/model/cnets.py``: ``Model`` (``fc``: ``3 * (target_hidden_size or
    hidden_size) -> hidden_size``, no bias; ``midlayer``; ``norm``; ``lm_head``
    ``hidden -> draft_vocab_size``; buffers ``d2t [draft_vocab_size]`` int64 and
    ``t2d [vocab_size]`` bool), ``LlamaDecoderLayeremb`` (the midlayer),
    ``LlamaAttention`` (q/k/v take ``2 * hidden_size``; head dim
    ``hidden_size // num_attention_heads``), ``forward`` (``fc`` only when the
    input is wider than the embedding), ``topK_genrate`` (logits
    ``lm_head(norm(h))``; target id = draft id + ``d2t[draft id]``; the fed-back
    hidden is the pre-norm output);
  - ``eagle/model/modeling_llama_kv.py`` ``LlamaModel.forward``: the taps are the
    residual stream *entering* layers ``idx`` with ``idx == 2 or idx == L // 2 or
    idx == L - 3``, appended in layer order; ``eagle/model/utils.py``
    ``initialize_tree`` concatenates them in that order;
  - ``eagle/model/ea_model.py``: the target's embedding is loaded unless
    ``target_hidden_size`` is set; the checkpoint is loaded ``strict=False``
    over it (a checkpoint ``embed_tokens.weight`` wins); ``d2t``/``t2d`` dropped
    when ``draft_vocab_size == vocab_size``;
  - ``eagle/traineagle3/config.json`` (the config of the published
    ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``: no ``rope_theta``, so 10000, and no
    ``head_dim``); ``eagle/traineagle3/main.py`` saves with
    ``save_16bit_model(exclude_frozen_parameters=True)``: float16, buffers
    kept, the frozen ``embed_tokens`` left out.
* sgl-project/SpecForge @ a6b6b0230009d15ec2a97a57384e6f53f0f96946
  - ``specforge/modeling/draft/llama3_eagle.py`` ``LlamaForCausalLMEagle3``: the
    same tensor names (``midlayer.*``); head dim ``config.head_dim`` when given;
    optional ``fc_norm`` (``fc_norm.{0,1,2}.weight``, one RMSNorm per tap before
    ``fc``) and ``norm_output`` (default true: ``lm_head(norm(h))``, false:
    ``lm_head(h)``);
  - ``configs/llama3-8B-eagle3.json`` (= the SafeAILab one) and
    ``configs/qwen3-8b-eagle3.json`` (Qwen3-style fields with ``head_dim``,
    bfloat16; the ``AngelSlim/Qwen3-*_eagle3`` heads share this shape);
  - ``specforge/algorithms/model_providers.py`` ``resolve_eagle_capture_layers``:
    ids from ``eagle_config.eagle_aux_hidden_state_layer_ids``, default
    ``[1, L // 2 - 1, L - 4]``.
* sgl-project/sglang ``python/sglang/srt/models/llama.py`` @
  00239548f1cd1a06ca145a5447a86738090a48f1 ``set_eagle3_layers_to_capture``:
  explicit ids are captured at ``id + 1`` ("for the ith layer, it takes the
  output of the (i-1)th layer"), the default at ``(2, L // 2, L - 3)``; capture is
  ``hidden_states + residual`` before layer ``i`` runs.
* vllm-project/speculators @ c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (main) and
  tag v0.1.0 = 8a490952e6bd58c8a7203af3f3a22214c4705295
  - ``src/speculators/models/eagle3.py`` (v0.1.0), ``src/speculators/models/eagle3/
    {config,core,model_definitions}.py`` (main): ``Eagle3SpeculatorConfig``
    (``speculators_model_type: "eagle3"``, ``transformer_layer_config``,
    ``draft_vocab_size``, ``norm_before_residual`` default false,
    ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``, and on main
    ``norm_before_fc``, ``fc_norm``, ``norm_output``); tensors ``embed_tokens``,
    ``fc``, ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``/``t2d`` (only with a
    reduced vocabulary), ``input_norm`` (``norm_before_fc``), ``fc_norm.{i}``;
    the first layer splits ``cat(embeds, hidden)``, keeps ``residual = hidden``
    (or ``hidden_norm(hidden)`` with ``norm_before_residual``);
  - ``src/speculators/convert/eagle/eagle3_converter.py``: SafeAILab -> speculators
    is ``midlayer.`` -> ``layers.0.`` and a config rewrite;
  - ``src/speculators/models/utils.py`` ``resolve_target_layer_ids`` (default
    ``[2, L // 2, L - 3]``), ``scripts/launch_vllm.py`` (ids handed to vLLM's
    hidden-state extraction, plus ``L`` for the last layer),
    ``src/speculators/models/eagle3/data.py`` ``shift_batch`` (pairs token
    ``i + 1`` with taps ``i`` at position ``i + 1``).
* vllm-project/vllm
  - ``vllm/model_executor/models/llama_eagle3.py`` @ 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190:
    ``midlayer.`` -> ``layers.0.``; ``norm_before_residual`` from the config
    (default false); ``embed_tokens`` shared with the target unless the
    checkpoint has one; logits scattered to the target vocabulary via ``d2t``;
  - ``vllm/v1/worker/gpu_model_runner.py`` ``_get_eagle3_aux_layers_from_config``
    (reads ``eagle_aux_hidden_state_layer_ids`` at the top level or inside
    ``eagle_config``) and ``EagleModelMixin._maybe_add_hidden_state`` in
    ``vllm/model_executor/models/interfaces.py`` (the id is the layer whose
    *input* is taken: ``hidden_states + residual`` before it runs, no ``+1``);
    ``vllm/transformers_utils/configs/speculators/algos.py`` ``update_eagle3``
    (note: it defaults a *missing* ``norm_before_residual`` to true, the
    speculators library to false; the writer here always writes the key).

Tap conventions, as indices into transformers' ``output_hidden_states``
(``hs[0]`` = embeddings, ``hs[i]`` = the residual stream entering layer ``i``
for ``i < L``, ``hs[L]`` = the last layer's output *after* the final norm in
transformers 5.x -- checked against ``last_hidden_state``):

============  ============================  ================================  ==============
convention    an id means                   published default ids             hidden_states
============  ============================  ================================  ==============
safeailab     input of layer id             (2, L//2, L-3)                    hs[id]
vllm          input of layer id; id == L:   (2, L//2, L-3), speculators too   hs[id]; L: the
              the last layer's output                                         pre-norm output
              before the final norm
sglang        output of layer id            (1, L//2-1, L-4) (SpecForge)      hs[id + 1]
============  ============================  ================================  ==============

So the three defaults name the same three tensors, while one explicit list of
ids in ``eagle_aux_hidden_state_layer_ids`` means different layers to vLLM and
to SGLang/SpecForge (off by one). Every runtime appends taps in layer order
while it runs the layers, so the concatenation is in ascending layer order
whatever order the ids are listed in, and a repeated layer is taken once.

Forward of one step (``cnets.Model.forward`` + ``LlamaDecoderLayeremb``)::

    x = fc(cat(h_a, h_b, h_c))            # first step; later steps: x = fed-back hidden
    residual = x                          # = hidden_norm(x) with norm_before_residual
    a = cat(input_layernorm(embed(token)), hidden_norm(x))     # embedding first
    x = residual + o_proj(attn(q/k/v_proj(a)))
    x = x + mlp(post_attention_layernorm(x))
    logits = lm_head(norm(x))             # over the draft vocabulary
    fed back: x (pre-norm); norm(x) with speculators' norm_output

Alignment and positions: as EAGLE-1 (see ``eagle1``): step ``i`` pairs the taps
of position ``i`` with the token at ``i + 1``. SafeAILab, SpecForge and vLLM
give it rotary position ``i``; speculators trains it at ``i + 1``
(``shift_batch``; ``Eagle3DraftModel.forward`` defaults to ``1 + arange``). One
constant offset cancels inside a single causal rotary pass.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch

from ._common import (
  WeightMaker,
  causal_attention,
  draft_to_target_logits,
  linear,
  load_weights,
  read_json,
  rms_norm,
  save_weights,
  swiglu_mlp,
  target_config_dict,
  target_embedding,
  write_json,
)

__all__ = [
  "EAGLE3_LAYOUTS",
  "EAGLE3_FLAVORS",
  "TAP_CONVENTIONS",
  "default_eagle3_layer_ids",
  "eagle3_hidden_state_indices",
  "eagle3_taps",
  "eagle3_inputs",
  "write_eagle3_checkpoint",
  "load_eagle3",
  "eagle3_spec",
  "eagle3_forward",
  "eagle3_target_logits",
  "canonical_eagle3_state",
]

EAGLE3_LAYOUTS = ("safeailab", "speculators")
TAP_CONVENTIONS = ("safeailab", "vllm", "sglang")

#: Published heads the writer imitates (layout, weights file, dtype, config style).
EAGLE3_FLAVORS = {
  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (eagle/traineagle3/config.json,
  # SpecForge configs/llama3-8B-eagle3.json)
  "llama3": dict(layout="safeailab", weights_file="pytorch_model.bin", dtype=torch.float16, embed=False),
  # AngelSlim/Qwen3-8B_eagle3 / SpecForge configs/qwen3-8b-eagle3.json
  "qwen3": dict(layout="safeailab", weights_file="model.safetensors", dtype=torch.bfloat16, embed=False),
  # RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3 (speculators save_pretrained)
  "speculators": dict(layout="speculators", weights_file="model.safetensors", dtype=torch.bfloat16,
                      embed=True),
}


# --------------------------------------------------------------------------
# Taps


def default_eagle3_layer_ids(num_layers: int, convention: str = "vllm") -> list[int]:
  """The ids a runtime uses when a checkpoint names none, in its own convention."""
  if convention in ("safeailab", "vllm"):
    return [2, num_layers // 2, num_layers - 3]
  if convention == "sglang":
    return [1, num_layers // 2 - 1, num_layers - 4]
  raise ValueError(f"unknown tap convention {convention!r}; one of {TAP_CONVENTIONS}")


def eagle3_hidden_state_indices(layer_ids: Sequence[int], convention: str, num_layers: int) -> list[int]:
  """Map tap ids of a convention to indices into transformers'
  ``output_hidden_states`` (``num_layers`` standing for the last layer's
  *pre-norm* output), ascending and without repeats, as the runtimes take them."""
  if convention == "sglang":
    indices = [int(i) + 1 for i in layer_ids]
    top = num_layers - 1  # SGLang captures before layers 0..L-1 only
  elif convention == "safeailab":
    indices = [int(i) for i in layer_ids]
    top = num_layers - 1
  elif convention == "vllm":
    indices = [int(i) for i in layer_ids]
    top = num_layers
  else:
    raise ValueError(f"unknown tap convention {convention!r}; one of {TAP_CONVENTIONS}")
  bad = [i for i in indices if not 0 <= i <= top]
  if bad:
    raise ValueError(
        f"{convention} ids {list(layer_ids)} reach no captured state of a {num_layers}-layer target")
  return sorted(set(indices))


@torch.no_grad()
def eagle3_taps(
  target_model,
  tokens: torch.Tensor,
  layer_ids: Sequence[int] | None = None,
  convention: str = "vllm",
) -> torch.Tensor:
  """The concatenated tapped target hidden states ``[B, T, n * H]`` for ``tokens``.

  ``layer_ids`` default to the convention's published default. Fewer than three
  distinct layers (the SafeAILab default for ``L < 8``, except ``L == 7``)
  gives a narrower tensor, as the published code would, and the draft's ``fc``
  then refuses it.
  """
  num_layers = target_model.config.num_hidden_layers
  if layer_ids is None:
    layer_ids = default_eagle3_layer_ids(num_layers, convention)
  indices = eagle3_hidden_state_indices(layer_ids, convention, num_layers)
  captured: dict[str, torch.Tensor] = {}
  handle = target_model.model.norm.register_forward_pre_hook(
    lambda _m, args: captured.__setitem__("prenorm", args[0].detach())
  )
  try:
    out = target_model.model(input_ids=tokens, output_hidden_states=True)
  finally:
    handle.remove()
  hs = out.hidden_states
  parts = [captured["prenorm"] if i == num_layers else hs[i] for i in indices]
  return torch.cat([p.float() for p in parts], dim=-1)


@torch.no_grad()
def eagle3_inputs(
  target_model,
  tokens: torch.Tensor,
  layer_ids: Sequence[int] | None = None,
  convention: str = "vllm",
) -> tuple[torch.Tensor, torch.Tensor]:
  """Draft inputs for a sequence ``[B, T]``: tokens ``1..T-1`` and the taps of
  positions ``0..T-2``."""
  taps = eagle3_taps(target_model, tokens, layer_ids, convention)
  return tokens[:, 1:], taps[:, :-1]


# --------------------------------------------------------------------------
# Config normalisation


def _layout_of(config: Mapping[str, Any]) -> str:
  return "speculators" if config.get("speculators_model_type") == "eagle3" else "safeailab"


def eagle3_spec(config: Mapping[str, Any]) -> dict[str, Any]:
  """The model fields of either layout's config, normalised.

  ``head_dim`` follows SpecForge and speculators (the config's, else
  ``hidden_size // num_attention_heads``); SafeAILab's ``cnets.py`` always takes
  the latter, so a SafeAILab-layout head whose ``head_dim`` differs (SpecForge's
  Qwen3-0.6B-style configs) only loads in SpecForge, SGLang and vLLM.
  ``norm_output`` means different things: SpecForge's (default true) puts
  ``norm`` before ``lm_head``; speculators' (default false) feeds the normed
  hidden back.
  """
  layout = _layout_of(config)
  if layout == "speculators":
    layer = config["transformer_layer_config"]
    vocab = layer["vocab_size"]
    rope_scaling = layer.get("rope_scaling") or layer.get("rope_parameters")
    theta = layer.get("rope_theta", (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    head_dim = layer.get("head_dim")
    extras = {
      "norm_before_residual": bool(config.get("norm_before_residual", False)),
      "norm_before_fc": bool(config.get("norm_before_fc", False)),
      "fc_norm": bool(config.get("fc_norm", False)),
      "norm_output_feedback": bool(config.get("norm_output", False)),
      "norm_before_head": True,
      "layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
      "convention": "vllm",
    }
  else:
    layer = config
    vocab = config["vocab_size"]
    rope_scaling = config.get("rope_scaling")
    theta = config.get("rope_theta", 10000.0)
    head_dim = config.get("head_dim")
    eagle_cfg = config.get("eagle_config") or {}
    extras = {
      "norm_before_residual": bool(config.get("norm_before_residual", False)),
      "norm_before_fc": False,
      "fc_norm": bool(config.get("fc_norm", False)),
      "norm_output_feedback": False,
      "norm_before_head": bool(config.get("norm_output", True)),
      "layer_ids": (config.get("eagle_aux_hidden_state_layer_ids")
                    or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")),
      "convention": "sglang",
    }
  kind = None
  if isinstance(rope_scaling, Mapping):
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
  if kind in (None, "default"):
    rope_scaling = None
  hidden = layer["hidden_size"]
  heads = layer["num_attention_heads"]
  return {
    "layout": layout,
    "hidden_size": hidden,
    "target_hidden_size": config.get("target_hidden_size") or hidden,
    "num_attention_heads": heads,
    "num_key_value_heads": layer.get("num_key_value_heads") or heads,
    "head_dim": head_dim or hidden // heads,
    "intermediate_size": layer["intermediate_size"],
    "rms_norm_eps": layer.get("rms_norm_eps", 1e-6),
    "rope_theta": float(theta),
    "rope_scaling": rope_scaling,
    "vocab_size": vocab,
    "draft_vocab_size": config.get("draft_vocab_size") or vocab,
    **extras,
  }


def canonical_eagle3_state(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
  """Rename SafeAILab/SpecForge ``midlayer.*`` to ``layers.0.*`` (what the
  speculators converter and vLLM's loader do); other names are shared."""
  return {(k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k): v
          for k, v in state_dict.items()}


# --------------------------------------------------------------------------
# Writer / reader


def _safeailab_config(t: dict[str, Any], *, flavor: str, hidden: int, dtype: torch.dtype) -> dict[str, Any]:
  eos = t["eos_token_id"]
  eos = eos[0] if isinstance(eos, list) else eos
  common_tail = {
    "tie_word_embeddings": False,
    "torch_dtype": str(dtype).replace("torch.", ""),
  }
  if flavor == "qwen3":
    return {
      "architectures": ["LlamaForCausalLMEagle3"],
      "attention_bias": False,
      "attention_dropout": 0.0,
      "bos_token_id": t["bos_token_id"],
      "eos_token_id": eos,
      "head_dim": t["head_dim"],
      "hidden_act": "silu",
      "hidden_size": hidden,
      "initializer_range": 0.02,
      "intermediate_size": t["intermediate_size"],
      "max_position_embeddings": t["max_position_embeddings"],
      "max_window_layers": t["num_hidden_layers"],
      "model_type": "llama",
      "num_attention_heads": t["num_attention_heads"],
      "num_hidden_layers": 1,
      "num_key_value_heads": t["num_key_value_heads"],
      "rms_norm_eps": t["rms_norm_eps"],
      "rope_scaling": None,
      "rope_theta": t["rope_theta"],
      "sliding_window": None,
      **common_tail,
      "transformers_version": "4.51.0",
      "use_cache": True,
      "use_sliding_window": False,
      "vocab_size": t["vocab_size"],
    }
  return {
    "architectures": ["LlamaForCausalLMEagle3"],
    "bos_token_id": t["bos_token_id"],
    "eos_token_id": eos,
    "hidden_act": "silu",
    "hidden_size": hidden,
    "initializer_range": 0.02,
    "intermediate_size": t["intermediate_size"],
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": t["num_attention_heads"],
    "num_key_value_heads": t["num_key_value_heads"],
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": t["rms_norm_eps"],
    **common_tail,
    "transformers_version": "4.28.1",
    "use_cache": True,
    "vocab_size": t["vocab_size"],
  }


def _speculators_config(
  t: dict[str, Any],
  *,
  hidden: int,
  dtype: torch.dtype,
  draft_vocab_size: int,
  target_hidden_size: int | None,
  norm_before_residual: bool,
  layer_ids: Sequence[int] | None,
  norm_before_fc: bool,
  fc_norm: bool,
  norm_output: bool,
  verifier_name_or_path: str,
  speculative_tokens: int,
) -> dict[str, Any]:
  dtype_name = str(dtype).replace("torch.", "")
  layer_config = {
    "attention_bias": False,
    "head_dim": t["head_dim"],
    "hidden_act": "silu",
    "hidden_size": hidden,
    "intermediate_size": t["intermediate_size"],
    "max_position_embeddings": t["max_position_embeddings"],
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": t["num_attention_heads"],
    "num_hidden_layers": 1,
    "num_key_value_heads": t["num_key_value_heads"],
    "rms_norm_eps": t["rms_norm_eps"],
    "rope_scaling": None,
    "rope_theta": t["rope_theta"],
    "tie_word_embeddings": False,
    "torch_dtype": dtype_name,
    "vocab_size": t["vocab_size"],
  }
  config: dict[str, Any] = {
    "architectures": ["Eagle3Speculator"],
    "draft_vocab_size": draft_vocab_size,
  }
  if layer_ids is not None:
    config["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in layer_ids]
  if fc_norm:
    config["fc_norm"] = True
  config["has_no_defaults_at_init"] = False
  if norm_before_fc:
    config["norm_before_fc"] = True
  config["norm_before_residual"] = bool(norm_before_residual)
  if norm_output:
    config["norm_output"] = True
  config.update(
    {
      "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [
          {
            "accept_tolerance": 0.0,
            "proposal_type": "greedy",
            "speculative_tokens": speculative_tokens,
            "verifier_accept_k": 1,
          }
        ],
        "verifier": {"architectures": t["architectures"], "name_or_path": verifier_name_or_path},
      },
      "speculators_model_type": "eagle3",
      "speculators_version": "0.2.0",
      "target_hidden_size": target_hidden_size,
      "torch_dtype": dtype_name,
      "transformer_layer_config": layer_config,
      "transformers_version": "4.56.2",
    }
  )
  return config


def write_eagle3_checkpoint(
  directory: str | os.PathLike,
  target_model,
  *,
  seed: int = 0,
  flavor: str = "llama3",
  draft_vocab_size: int | None = None,
  draft_hidden_size: int | None = None,
  include_embed_tokens: bool | None = None,
  layer_ids: Sequence[int] | None = None,
  norm_before_residual: bool = False,
  norm_before_fc: bool = False,
  fc_norm: bool = False,
  norm_output: bool = False,
  weights_file: str | None = None,
  dtype: torch.dtype | None = None,
  verifier_name_or_path: str = "tiny-llama-target",
  speculative_tokens: int = 3,
) -> dict[str, torch.Tensor]:
  """Write a random EAGLE-3 head for ``target_model`` into ``directory``.

  ``flavor`` (see ``EAGLE3_FLAVORS``) picks layout, weights file, dtype and
  config style: ``"llama3"`` and ``"qwen3"`` write the SafeAILab/SpecForge
  layout (``midlayer.*``), ``"speculators"`` the speculators one
  (``layers.0.*``). ``draft_vocab_size`` defaults to ``min(V, 128)``
  (a reduced vocabulary, with ``d2t``/``t2d``, when ``V > 128``); with
  ``draft_vocab_size == V`` no mapping is written. ``draft_hidden_size``
  different from the target's writes ``target_hidden_size`` and (SafeAILab
  then loads no target embedding) the draft's own ``embed_tokens``.
  ``layer_ids`` are written in the layout's own convention: SafeAILab layout
  as ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang/SpecForge
  reading), speculators as ``eagle_aux_hidden_state_layer_ids`` (vLLM
  reading). ``norm_before_residual``/``norm_before_fc``/``fc_norm``/
  ``norm_output`` are written as config flags (``fc_norm`` in both layouts;
  the rest speculators only, except that SafeAILab accepts
  ``norm_before_residual`` as vLLM reads it).

  Values are drawn in one order for every layout, so one seed gives the same
  weights in either layout. Returns the state dict written.
  """
  preset = EAGLE3_FLAVORS[flavor]
  layout = preset["layout"]
  dtype = preset["dtype"] if dtype is None else dtype
  weights_file = preset["weights_file"] if weights_file is None else weights_file
  t = target_config_dict(target_model)
  target_hidden = t["hidden_size"]
  hidden = draft_hidden_size or target_hidden
  vocab = t["vocab_size"]
  draft_vocab = draft_vocab_size or min(vocab, 128)
  if include_embed_tokens is None:
    include_embed_tokens = preset["embed"] or hidden != target_hidden
  if hidden != target_hidden and not include_embed_tokens:
    raise ValueError("a draft narrower or wider than its target needs its own embed_tokens")
  heads, kv = t["num_attention_heads"], t["num_key_value_heads"]
  head_dim = t["head_dim"] if flavor != "llama3" else hidden // heads
  if flavor == "llama3" and hidden % heads:
    raise ValueError("the SafeAILab code takes head_dim = hidden_size // num_attention_heads")
  inter = t["intermediate_size"]
  n_taps = 3

  make = WeightMaker(seed)
  s: dict[str, torch.Tensor] = {}
  if include_embed_tokens:
    s["embed_tokens.weight"] = (
      target_embedding(target_model).clone() if hidden == target_hidden else make.normal(vocab, hidden)
    )
  if norm_before_fc:
    s["input_norm.weight"] = make.norm(n_taps * target_hidden)
  if fc_norm:
    for i in range(n_taps):
      s[f"fc_norm.{i}.weight"] = make.norm(target_hidden)
  s["fc.weight"] = make.linear(hidden, n_taps * target_hidden)
  p = "layers.0."
  s[p + "self_attn.q_proj.weight"] = make.linear(heads * head_dim, 2 * hidden)
  s[p + "self_attn.k_proj.weight"] = make.linear(kv * head_dim, 2 * hidden)
  s[p + "self_attn.v_proj.weight"] = make.linear(kv * head_dim, 2 * hidden)
  s[p + "self_attn.o_proj.weight"] = make.linear(hidden, heads * head_dim)
  s[p + "mlp.gate_proj.weight"] = make.linear(inter, hidden)
  s[p + "mlp.up_proj.weight"] = make.linear(inter, hidden)
  s[p + "mlp.down_proj.weight"] = make.linear(hidden, inter)
  s[p + "input_layernorm.weight"] = make.norm(hidden)
  s[p + "hidden_norm.weight"] = make.norm(hidden)
  s[p + "post_attention_layernorm.weight"] = make.norm(hidden)
  s["norm.weight"] = make.norm(hidden)
  s["lm_head.weight"] = make.linear(draft_vocab, hidden)
  ids = make.permutation(vocab)[:draft_vocab].sort().values
  state = {k: v.to(dtype) for k, v in s.items()}
  if draft_vocab < vocab:
    state["d2t"] = (ids - torch.arange(draft_vocab)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d

  if layout == "safeailab":
    state = {(k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k): v
             for k, v in state.items()}
    if norm_before_fc:
      raise ValueError("norm_before_fc is a speculators-only option")
    config = _safeailab_config(t, flavor=flavor, hidden=hidden, dtype=dtype)
    config["draft_vocab_size"] = draft_vocab
    if hidden != target_hidden:
      config["target_hidden_size"] = target_hidden
    if fc_norm:
      config["fc_norm"] = True
    if norm_before_residual:
      config["norm_before_residual"] = True
    if norm_output:
      raise ValueError("norm_output (fed-back normed hidden) is a speculators-only option")
    if layer_ids is not None:
      config["eagle_config"] = {
        "eagle_aux_hidden_state_layer_ids": [int(i) for i in layer_ids],
        "use_aux_hidden_state": True,
      }
  else:
    config = _speculators_config(
      t,
      hidden=hidden,
      dtype=dtype,
      draft_vocab_size=draft_vocab,
      target_hidden_size=target_hidden if hidden != target_hidden else None,
      norm_before_residual=norm_before_residual,
      layer_ids=layer_ids,
      norm_before_fc=norm_before_fc,
      fc_norm=fc_norm,
      norm_output=norm_output,
      verifier_name_or_path=verifier_name_or_path,
      speculative_tokens=speculative_tokens,
    )
    if head_dim != t["head_dim"]:
      config["transformer_layer_config"]["head_dim"] = head_dim
  os.makedirs(directory, exist_ok=True)
  write_json(os.path.join(directory, "config.json"), config)
  save_weights(directory, weights_file, state)
  return state


def load_eagle3(directory: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
  """Read either layout (``pytorch_model.bin`` first, as SafeAILab's loader
  tries it first, else ``model.safetensors``). Returns ``(state_dict, config)``
  with the names as stored."""
  config = read_json(os.path.join(directory, "config.json"))
  for name in ("pytorch_model.bin", "model.safetensors"):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return load_weights(path), config
  raise FileNotFoundError(f"no pytorch_model.bin or model.safetensors in {directory}")


# --------------------------------------------------------------------------
# Forward


@torch.no_grad()
def eagle3_forward(
  state_dict: Mapping[str, torch.Tensor],
  config: Mapping[str, Any],
  target_model,
  tokens: torch.Tensor,
  taps: torch.Tensor | None = None,
  *,
  hidden: torch.Tensor | None = None,
  positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
  """One full causal pass of an EAGLE-3 head over ``T`` steps, either layout.

  Give ``taps [B, T, 3 * target_hidden]`` (first step: through ``fc``) or
  ``hidden [B, T, H]`` (a later step: the fed-back draft hidden, no ``fc``).
  ``positions`` default to ``arange(T)``. Returns ``(hidden_out [B, T, H],
  draft_logits [B, T, draft_vocab_size])``; ``hidden_out`` is what the next
  step is fed (pre-norm, or normed with speculators' ``norm_output``). Use
  ``eagle3_target_logits`` to move the logits to the target vocabulary.
  """
  if (taps is None) == (hidden is None):
    raise ValueError("give exactly one of taps (first step) or hidden (later steps)")
  spec = eagle3_spec(config)
  sd = canonical_eagle3_state(state_dict)
  b, t = tokens.shape
  eps = spec["rms_norm_eps"]
  if positions is None:
    positions = torch.arange(t).expand(b, t)
  if taps is not None:
    x = taps.float()
    width = sd["fc.weight"].shape[1]
    if x.shape[-1] != width:
      raise ValueError(f"taps are {x.shape[-1]} wide, fc takes {width} (three distinct tapped layers?)")
    if spec["norm_before_fc"]:
      x = rms_norm(x, sd["input_norm.weight"], eps)
    if spec["fc_norm"]:
      chunks = x.chunk(3, dim=-1)
      x = torch.cat([rms_norm(c, sd[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(chunks)], dim=-1)
    x = linear(x, sd["fc.weight"])
  else:
    x = hidden.float()
  embed = sd.get("embed_tokens.weight")
  embed = target_embedding(target_model) if embed is None else embed.float()
  p = "layers.0."
  normed_hidden = rms_norm(x, sd[p + "hidden_norm.weight"], eps)
  residual = normed_hidden if spec["norm_before_residual"] else x
  attn_in = torch.cat([rms_norm(embed[tokens], sd[p + "input_layernorm.weight"], eps), normed_hidden], dim=-1)
  x = residual + causal_attention(
    attn_in,
    sd,
    p + "self_attn.",
    num_heads=spec["num_attention_heads"],
    num_kv_heads=spec["num_key_value_heads"],
    head_dim=spec["head_dim"],
    positions=positions,
    rope_theta=spec["rope_theta"],
    rope_scaling=spec["rope_scaling"],
  )
  x = x + swiglu_mlp(rms_norm(x, sd[p + "post_attention_layernorm.weight"], eps), sd, p + "mlp.")
  normed = rms_norm(x, sd["norm.weight"], eps)
  logits = linear(normed if spec["norm_before_head"] else x, sd["lm_head.weight"])
  return (normed if spec["norm_output_feedback"] else x), logits


def eagle3_target_logits(
  draft_logits: torch.Tensor, state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> torch.Tensor:
  """Draft-vocabulary logits scattered into the target vocabulary (``-inf``
  elsewhere); the identity when the head has the full vocabulary."""
  spec = eagle3_spec(config)
  d2t = state_dict.get("d2t")
  if d2t is None or spec["draft_vocab_size"] == spec["vocab_size"]:
    return draft_logits
  return draft_to_target_logits(draft_logits, d2t, spec["vocab_size"])
