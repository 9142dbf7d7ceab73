"""Published EAGLE draft checkpoints -> :class:`bass_jax.models.eagle.EagleConfig` and parameters.

Three layouts, told apart by their config and tensor names (:func:`published_kind`):

* ``eagle1``: EAGLE-1/2 heads (SafeAILab/EAGLE ``eagle/model/cnets1.py``; ``yuhuili/EAGLE-Vicuna-7B-v1.3``,
  ``yuhuili/EAGLE-LLaMA3.1-Instruct-8B``): a Llama ``config.json`` of one layer (``"bias": false``: no
  ``fc.bias``) and ``fc.weight [H, 2H]``, ``layers.{i}.*`` (no ``input_layernorm`` on layer 0), an
  optional frozen copy of the target's ``embed_tokens`` (used, as SafeAILab's loader lets it win); no
  final norm, no head: the target's head scores the draft's output.
* ``eagle3``: EAGLE-3 heads in SafeAILab's / SpecForge's layout (``eagle/model/cnets.py``;
  ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``, ``AngelSlim/Qwen3-8B_eagle3``): config
  ``architectures: ["LlamaForCausalLMEagle3"]`` with ``draft_vocab_size`` (optional
  ``target_hidden_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``); tensors ``fc.weight
  [H, 3T]``, ``midlayer.*`` (q, k, v reading 2H), ``norm``, ``lm_head [V', H]``, ``d2t [V']``, ``t2d [V]``.
* ``eagle3`` in the ``speculators`` layout (vllm-project/speculators ``models/eagle3``;
  ``RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3``): ``speculators_model_type: "eagle3"``,
  ``transformer_layer_config``, ``norm_before_residual``, ``eagle_aux_hidden_state_layer_ids``; the same
  tensors under ``layers.0.*``, ``embed_tokens``, and ``d2t``/``t2d`` only with a reduced vocabulary.

Which target layers an EAGLE-3 draft reads (its taps), as this package counts them (0-based decoder
layer *outputs*, before the final norm: ``common.HIDDEN``):

* no ids in the config: the inputs of layers ``(2, L // 2, L - 3)`` (EAGLE, vLLM, SGLang,
  tpu-inference), i.e. the outputs of layers ``(1, L // 2 - 1, L - 4)``; fixed when the draft is bound to
  its target (``eagle.resolve_taps``);
* SafeAILab / SpecForge ids (``eagle_config.eagle_aux_hidden_state_layer_ids``) follow SGLang: id ``i``
  is the *output* of layer ``i``;
* speculators ids (``eagle_aux_hidden_state_layer_ids``) follow vLLM: id ``i`` is the *input* of layer
  ``i``, the output of layer ``i - 1`` (``i = L``: the last layer's output before the final norm).

A speculators config without ``norm_before_residual`` is read as false, as the speculators library
reads it (vLLM reads a missing key as true); ``write_published`` always writes the key.

The two explicit conventions differ by one for the same list of ids; ``tests/draft_formats/eagle3.py``
cites each runtime's code. Taps are taken in ascending layer order, each once, as every runtime
appends them while it runs the layers.

Every tensor is accounted for: a missing, extra or mis-shaped one is refused by name, as is a config
option this port does not implement (``fc_norm``, ``norm_before_fc``, speculators' ``norm_output``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np

from bass_jax import dtypes
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints._mapping import CheckpointError
from bass_jax.models.eagle import EagleConfig
from bass_jax.models.llama import LlamaConfig

_EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
# Draft-specific fields of the published configs (beside the layer's Llama fields).
_EAGLE1_FIELDS = ("bias",)
_EAGLE3_FIELDS = ("draft_vocab_size", "target_hidden_size", "eagle_config", "norm_before_residual",
                  "eagle_aux_hidden_state_layer_ids", "max_window_layers", "use_sliding_window",
                  "sliding_window", "norm_output", "fc_norm")
_SPECULATORS_FIELDS = ("speculators_model_type", "speculators_version", "speculators_config",
                       "transformer_layer_config", "draft_vocab_size", "target_hidden_size",
                       "norm_before_residual", "eagle_aux_hidden_state_layer_ids", "norm_before_fc",
                       "fc_norm", "norm_output", "has_no_defaults_at_init", "architectures",
                       "torch_dtype", "dtype", "transformers_version", "auto_map")


def _weight_names(path: pathlib.Path) -> set[str] | None:
  """The tensor names of the directory's single weight file, read without the tensors where the
  format allows (safetensors' header; a PyTorch file memory-mapped); None without one."""
  if (path / "model.safetensors").is_file():
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top

    with safe_open(str(path / "model.safetensors"), framework="numpy") as f:  # names: no torch
      return set(f.keys())
  if (path / "pytorch_model.bin").is_file():
    import torch  # pylint: disable=g-import-not-at-top

    return set(torch.load(str(path / "pytorch_model.bin"), map_location="cpu", weights_only=True,
                          mmap=True))
  return None


def published_kind(path: str | os.PathLike, fields: dict[str, Any] | None = None) -> str | None:
  """``"eagle1"``, ``"eagle3"`` or ``"eagle3-speculators"`` for a directory holding a published EAGLE
  draft, else None (a model of a family, this project's own EAGLE format, or no checkpoint); by its
  config.json, or its ``fields`` when already read."""
  path = pathlib.Path(path)
  if fields is None:
    if not (path / "config.json").is_file():
      return None
    fields = hf_ckpt.read_config_fields(path)
  if fields.get("speculators_model_type") is not None:
    return "eagle3-speculators"
  if _EAGLE3_ARCHITECTURE in (fields.get("architectures") or []) or "draft_vocab_size" in fields:
    return "eagle3" if fields.get("model_type", "llama") == "llama" else None
  if fields.get("model_type") == "llama" and fields.get("num_hidden_layers", 99) <= 4:
    try:
      names = _weight_names(path)
    except Exception:  # pylint: disable=broad-except  # a damaged file: the family loader names it
      return None
    if names is not None and "fc.weight" in names and not any(n.startswith("model.") for n in names):
      return "eagle1"
  return None


def read_weights(file: pathlib.Path) -> dict[str, np.ndarray]:
  """Every tensor of one weight file as numpy: floats (bf16 included) as f32, integer and bool
  buffers as they are. A ``.safetensors`` file is read without PyTorch (safetensors' flax reader);
  a PyTorch pickle (``.bin``, ``.pt``) needs it.

  Raises:
    CheckpointError: an unreadable or truncated file (named).
  """
  try:
    if file.suffix == ".safetensors":
      import safetensors.flax  # pylint: disable=g-import-not-at-top

      state = safetensors.flax.load_file(str(file))
      return {k: np.asarray(v, np.float32) if jnp.issubdtype(v.dtype, jnp.floating)
              else np.asarray(v) for k, v in state.items()}
    import torch  # pylint: disable=g-import-not-at-top

    state = torch.load(str(file), map_location="cpu", weights_only=True)
  except Exception as e:  # safetensors and torch raise their own error types
    raise CheckpointError(f"{file}: cannot read it ({str(e).splitlines()[0] if str(e) else e!r}); "
                          "re-export it, or copy it again") from e
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def _read(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Every tensor of the directory's single weight file (:func:`read_weights`)."""
  name = "model.safetensors" if (path / "model.safetensors").is_file() else "pytorch_model.bin"
  return read_weights(path / name)


def _layer_config(fields: dict[str, Any], drop: tuple[str, ...], path: pathlib.Path) -> LlamaConfig:
  fields = {k: v for k, v in fields.items() if k not in drop}
  fields.setdefault("model_type", "llama")
  try:
    return LlamaConfig.from_hf_config(fields)
  except ValueError as e:
    raise ValueError(f"{path / 'config.json'}: {e}") from e


def _dense(tensors, flax_path: tuple[str, ...], name: str, params: dict, bias: bool = False) -> None:
  node = params
  for key in flax_path[:-1]:
    node = node.setdefault(key, {})
  node[flax_path[-1]] = {"kernel": tensors.pop(name + ".weight").T}
  if bias:
    node[flax_path[-1]]["bias"] = tensors.pop(name + ".bias")


def _norm(tensors, flax_path: tuple[str, ...], name: str, params: dict) -> None:
  node = params
  for key in flax_path[:-1]:
    node = node.setdefault(key, {})
  node[flax_path[-1]] = {"scale": tensors.pop(name + ".weight")}


def _layer(tensors, prefix: str, params: dict, *, input_norm: bool, eagle3: bool) -> None:
  """One decoder layer's tensors under ``prefix`` into ``params["layers_0"]``-style Flax names."""
  for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
    _dense(tensors, ("self_attn", proj), f"{prefix}self_attn.{proj}", params)
  for proj in ("gate_proj", "up_proj", "down_proj"):
    _dense(tensors, ("mlp", proj), f"{prefix}mlp.{proj}", params)
  _norm(tensors, ("post_attention_layernorm",), f"{prefix}post_attention_layernorm", params)
  if input_norm:
    _norm(tensors, ("input_layernorm",), f"{prefix}input_layernorm", params)
  if eagle3:
    _norm(tensors, ("hidden_norm",), f"{prefix}hidden_norm", params)


def _take(tensors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], path: pathlib.Path
          ) -> None:
  """Checks the checkpoint holds exactly ``shapes`` (names and shapes), naming the first difference.

  Raises:
    CheckpointError: a missing, extra or mis-shaped tensor.
  """
  missing = sorted(set(shapes) - set(tensors))
  extra = sorted(set(tensors) - set(shapes))
  if missing:
    raise CheckpointError(f"{path}: missing tensor {missing[0]!r} (shape {shapes[missing[0]]}) of "
                          f"this draft layout; {len(missing)} missing in all")
  if extra:
    raise CheckpointError(f"{path}: tensor {extra[0]!r} {tuple(tensors[extra[0]].shape)} has no place "
                          f"in this draft layout ({len(extra)} unplaced in all)")
  for name, shape in shapes.items():
    if tuple(tensors[name].shape) != tuple(shape):
      raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)}, the "
                            f"config says {tuple(shape)}")


def _layer_shapes(layer: LlamaConfig, prefix: str, *, in_width: int, input_norm: bool,
                  eagle3: bool) -> dict[str, tuple[int, ...]]:
  h, f = layer.hidden_size, layer.intermediate_size
  q, kv = layer.num_attention_heads * layer.head_dim, layer.num_key_value_heads * layer.head_dim
  shapes = {f"{prefix}self_attn.q_proj.weight": (q, in_width),
            f"{prefix}self_attn.k_proj.weight": (kv, in_width),
            f"{prefix}self_attn.v_proj.weight": (kv, in_width),
            f"{prefix}self_attn.o_proj.weight": (h, q),
            f"{prefix}mlp.gate_proj.weight": (f, h), f"{prefix}mlp.up_proj.weight": (f, h),
            f"{prefix}mlp.down_proj.weight": (h, f),
            f"{prefix}post_attention_layernorm.weight": (h,)}
  if input_norm:
    shapes[f"{prefix}input_layernorm.weight"] = (h,)
  if eagle3:
    shapes[f"{prefix}hidden_norm.weight"] = (h,)
  return shapes


def load_published(path: str | os.PathLike, *, dtype: Any = jnp.float32,
                   fields: dict[str, Any] | None = None) -> tuple[EagleConfig, dict[str, Any]]:
  """Reads a published EAGLE draft directory (:func:`published_kind`) into ``(config, params)``;
  ``fields``: config.json's object when the caller already read it (``locate.Checkpoint.fields``).

  Returns:
    ``params = {"draft": …, "vocab_ids": i32[V']}`` as ``eagle_files.load_eagle`` returns them; an EAGLE-3
    draft's ``draft`` also holds its ``lm_head [V', E]`` and final ``norm`` (``eagle.bind`` takes them
    as the head), and ``vocab_ids = arange(V') + d2t``.

  Raises:
    ValueError: not a published layout; a config option this port does not implement (named);
      explicit tap ids below 1 in vLLM's convention. CheckpointError: tensors that do not match the
      config (missing, extra, mis-shaped: named), a ``d2t`` mapping outside the vocabulary.
  """
  path = pathlib.Path(path)
  kind, fields = _published(path, fields)
  tensors = _read(path)
  if kind == "eagle1":
    return _eagle1(path, fields, tensors, dtype)
  return _eagle3(path, fields, tensors, dtype, speculators=kind == "eagle3-speculators")


def published_config(path: str | os.PathLike, fields: dict[str, Any] | None = None) -> EagleConfig:
  """The :class:`EagleConfig` of a published draft directory from its config.json alone (the CLI's
  preflight reads it before any weight), or from ``fields`` when the caller already read them.

  Raises:
    ValueError: not a published layout; what :func:`load_published` refuses of the config.
  """
  path = pathlib.Path(path)
  kind, fields = _published(path, fields)
  if kind == "eagle1":
    return _eagle1_config(path, fields)
  return _eagle3_config(path, fields, speculators=kind == "eagle3-speculators")


def _published(path: pathlib.Path, fields: dict[str, Any] | None
               ) -> tuple[str, dict[str, Any]]:
  """``(published_kind, config.json's fields)`` of a published draft directory, its config read once
  (not at all when ``fields`` are given).

  Raises:
    ValueError: not a published layout (no config.json, or another model).
  """
  if fields is None:
    fields = hf_ckpt.read_config_fields(path) if (path / "config.json").is_file() else {}
  kind = published_kind(path, fields) if fields else None
  if kind is None:
    raise ValueError(f"{path}: not a published EAGLE draft (EAGLE-1/2, EAGLE-3 or speculators)")
  return kind, fields


def _eagle1_config(path: pathlib.Path, fields: dict[str, Any]) -> EagleConfig:
  """An EAGLE-1/2 draft's config: its Llama layer config, and ``"bias": false`` for no ``fc.bias``."""
  layer = _layer_config(fields, _EAGLE1_FIELDS, path)
  return EagleConfig(layer, layer.vocab_size, kind="eagle1", fc_bias=bool(fields.get("bias", True)))


def _eagle3_config(path: pathlib.Path, fields: dict[str, Any], *, speculators: bool) -> EagleConfig:
  """An EAGLE-3 draft's config from either layout's config.json (module docstring: the taps)."""
  if speculators:
    for name in ("norm_before_fc", "fc_norm", "norm_output"):
      if fields.get(name):
        raise ValueError(f"{path / 'config.json'}: {name}=true is a speculators option this port does "
                         "not implement; convert the draft without it")
    unknown = sorted(set(fields) - set(_SPECULATORS_FIELDS))
    if unknown:
      raise ValueError(f"{path / 'config.json'}: unknown speculators field {unknown[0]!r}; the port "
                       "would silently ignore it")
    layer = _layer_config(dict(fields["transformer_layer_config"]), (), path)
    ids = fields.get("eagle_aux_hidden_state_layer_ids")
  else:
    if fields.get("fc_norm") or fields.get("norm_output") is False:
      raise ValueError(f"{path / 'config.json'}: fc_norm or norm_output=false (SpecForge options) are "
                       "not implemented; convert the draft without them")
    if fields.get("use_sliding_window"):
      raise ValueError(f"{path / 'config.json'}: use_sliding_window=true in an EAGLE-3 draft is not "
                       "implemented; convert the draft without it")
    layer = _layer_config(fields, _EAGLE3_FIELDS, path)
    # SpecForge writes them inside eagle_config; vLLM also reads them at the top level. Both places
    # hold SGLang's convention in this layout.
    ids = ((fields.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
           or fields.get("eagle_aux_hidden_state_layer_ids"))
  if layer.num_hidden_layers != 1:
    raise ValueError(f"{path / 'config.json'}: an EAGLE-3 draft has one layer, this config names "
                     f"{layer.num_hidden_layers}")
  taps: tuple[int, ...] = ()
  if ids:
    ids = [int(i) for i in ids]
    if speculators:  # vLLM: the input of layer i, i.e. the output of layer i - 1
      if min(ids) < 1:
        raise ValueError(f"{path / 'config.json'}: eagle_aux_hidden_state_layer_ids {ids} include the "
                         "embeddings (id 0), which this port does not tap")
      taps = tuple(sorted({i - 1 for i in ids}))
    else:  # SGLang / SpecForge: the output of layer i
      taps = tuple(sorted(set(ids)))
  tap_size = int(fields.get("target_hidden_size") or layer.hidden_size)
  return EagleConfig(layer, int(fields.get("draft_vocab_size") or layer.vocab_size), kind="eagle3",
                     fc_bias=False, taps=taps,
                     tap_size=tap_size if tap_size != layer.hidden_size else None,
                     norm_before_residual=bool(fields.get("norm_before_residual", False)))


def _eagle1(path, fields, tensors, dtype):
  config = _eagle1_config(path, fields)
  layer, fc_bias = config.layer, config.fc_bias
  h = layer.hidden_size
  shapes = {"fc.weight": (h, 2 * h), **({"fc.bias": (h,)} if fc_bias else {})}
  if "embed_tokens.weight" in tensors:
    shapes["embed_tokens.weight"] = (layer.vocab_size, h)
  for i in range(layer.num_hidden_layers):
    shapes.update(_layer_shapes(layer, f"layers.{i}.", in_width=h, input_norm=i > 0, eagle3=False))
  _take(tensors, shapes, path)
  params: dict[str, Any] = {}
  _embedding(tensors, params)
  _dense(tensors, ("fc",), "fc", params, bias=fc_bias)
  for i in range(layer.num_hidden_layers):
    _layer(tensors, f"layers.{i}.", params.setdefault(f"layers_{i}", {}), input_norm=i > 0,
           eagle3=False)
  vocab_ids = np.arange(layer.vocab_size, dtype=np.int32)
  config = dataclasses.replace(config, own_embedding="embed_tokens" in params)
  return config, {"draft": _cast(params, dtype), "vocab_ids": jnp.asarray(vocab_ids)}


def _eagle3(path, fields, tensors, dtype, *, speculators: bool):
  config = _eagle3_config(path, fields, speculators=speculators)
  layer, taps = config.layer, config.taps
  prefix = "layers.0." if speculators else "midlayer."
  h, vocab = layer.hidden_size, layer.vocab_size
  draft_vocab = config.draft_vocab_size
  tap_size = config.tap_size or h
  num_taps = len(taps) or 3
  shapes = {"fc.weight": (h, num_taps * tap_size), "norm.weight": (h,),
            "lm_head.weight": (draft_vocab, h),
            **_layer_shapes(layer, prefix, in_width=2 * h, input_norm=True, eagle3=True)}
  if "embed_tokens.weight" in tensors:
    shapes["embed_tokens.weight"] = (vocab, h)
  reduced = draft_vocab != vocab
  if reduced or not speculators:
    shapes.update({"d2t": (draft_vocab,), "t2d": (vocab,)})
  if not reduced and not speculators:  # SafeAILab drops both buffers when V' = V
    for name in ("d2t", "t2d"):
      if name not in tensors:
        shapes.pop(name)
  _take(tensors, shapes, path)
  d2t = tensors.pop("d2t", np.zeros((draft_vocab,), np.int64)).astype(np.int64)
  tensors.pop("t2d", None)
  vocab_ids = np.arange(draft_vocab, dtype=np.int64) + d2t
  if vocab_ids.min() < 0 or vocab_ids.max() >= vocab or len(set(vocab_ids.tolist())) != draft_vocab:
    raise CheckpointError(f"{path}: d2t maps the draft vocabulary outside the target's {vocab} ids, or "
                          "two draft ids to one target id")
  params: dict[str, Any] = {}
  _embedding(tensors, params)
  _dense(tensors, ("fc",), "fc", params)
  _layer(tensors, prefix, params.setdefault("layers_0", {}), input_norm=True, eagle3=True)
  params["lm_head"] = tensors.pop("lm_head.weight")
  params["norm"] = {"scale": tensors.pop("norm.weight")}
  params = _cast(params, dtype)
  config = dataclasses.replace(config, own_embedding="embed_tokens" in params)
  return config, {"draft": params, "vocab_ids": jnp.asarray(vocab_ids, jnp.int32)}


def _embedding(tensors: dict[str, np.ndarray], params: dict[str, Any]) -> None:
  """The draft's own token embedding where the checkpoint has one (speculators', EAGLE-1's frozen copy,
  stored in its dtype): vLLM and SafeAILab then use it rather than the target's, and so does the bind."""
  if "embed_tokens.weight" in tensors:
    params["embed_tokens"] = {"embedding": tensors.pop("embed_tokens.weight")}


def _cast(tree: Any, dtype: Any) -> Any:
  if isinstance(tree, dict):
    return {k: _cast(v, dtype) for k, v in tree.items()}
  return jnp.asarray(tree, dtype)


# -- export ---------------------------------------------------------------------------------------------

LAYOUTS = ("safeailab", "speculators")


def write_published(directory: str | os.PathLike, config: EagleConfig, params: dict[str, Any], *,
                    layout: str, dtype: Any = None, verifier: str | None = None) -> None:
  """Writes an EAGLE-1 or EAGLE-3 draft into ``directory`` in a published layout, which the
  published runtimes and :func:`load_published` read.

  Args:
    config, params: the draft (``{"draft": …, "vocab_ids": i32[V']}`` as ``load_model`` returns it).
    layout: ``"safeailab"`` (EAGLE-1: ``config.json`` + ``pytorch_model.bin`` as SafeAILab's
      ``cnets1.py`` loads it; EAGLE-3: SafeAILab's / SpecForge's ``midlayer.*`` with ``d2t`` and
      ``t2d``, written as ``model.safetensors``, explicit taps in SGLang's convention) or
      ``"speculators"`` (EAGLE-3 only: speculators' ``Eagle3Speculator`` config and ``layers.0.*``,
      ``model.safetensors``, explicit taps in vLLM's convention). A tap of the target's last layer
      has no SGLang id (SGLang captures before layers 0 … L - 1): write such a draft as
      ``"speculators"``.
    dtype: the stored floats' dtype (default: each parameter's own, f32, bf16 or f16).
    verifier: the target's name or path, recorded in a speculators config.

  Raises:
    ValueError: another layout or draft kind (this project's own drafts have their own layout,
      ``eagle_files.write_files``); a draft vocabulary that is not distinct target ids.
  """
  import torch  # pylint: disable=g-import-not-at-top

  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
  if config.kind == "bass" or (config.kind == "eagle1" and layout != "safeailab"):
    raise ValueError(f"an EagleConfig of kind {config.kind!r} has no {layout!r} layout (EAGLE-1: "
                     "'safeailab'; EAGLE-3: both); this project's drafts are written by "
                     "save_model(format='safetensors' or 'orbax')")
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  draft = params["draft"]
  store = lambda x: torch.from_numpy(np.array(x, np.float32)).to(
      dtypes.torch_dtype(x.dtype if dtype is None else dtype))
  state: dict[str, Any] = {}

  def dense(flax: dict, name: str) -> None:
    state[name + ".weight"] = store(np.asarray(flax["kernel"]).T)
    if "bias" in flax:
      state[name + ".bias"] = store(flax["bias"])

  def layer(flax: dict, prefix: str) -> None:
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
      dense(flax["self_attn"][proj], f"{prefix}self_attn.{proj}")
    for proj in ("gate_proj", "up_proj", "down_proj"):
      dense(flax["mlp"][proj], f"{prefix}mlp.{proj}")
    for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
      if norm in flax:
        state[f"{prefix}{norm}.weight"] = store(flax[norm]["scale"])

  fields = config.layer.to_hf_config().to_dict()
  fields["architectures"] = ["LlamaForCausalLM"]
  if config.layer.rope_scaling is None:  # 4.x's spelling too: the published runtimes read it
    fields["rope_theta"] = config.layer.rope_theta
  if "embed_tokens" in draft:
    state["embed_tokens.weight"] = store(draft["embed_tokens"]["embedding"])
  dense(draft["fc"], "fc")
  vocab_ids = np.asarray(params["vocab_ids"], np.int64)
  if config.kind == "eagle1":
    for i in range(config.num_layers):
      layer(draft[f"layers_{i}"], f"layers.{i}.")
    fields["bias"] = config.fc_bias
    (directory / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True))
    torch.save(state, str(directory / "pytorch_model.bin"))
    return
  prefix = "midlayer." if layout == "safeailab" else "layers.0."
  layer(draft["layers_0"], prefix)
  state["norm.weight"] = store(draft["norm"]["scale"])
  state["lm_head.weight"] = store(draft["lm_head"][:config.draft_vocab_size])
  vocab = config.vocab_size
  if len(set(vocab_ids.tolist())) != len(vocab_ids) or vocab_ids.max() >= vocab:
    raise ValueError(f"the draft vocabulary must be distinct ids below {vocab}")
  if layout == "safeailab" or config.draft_vocab_size != vocab:
    state["d2t"] = torch.from_numpy(vocab_ids - np.arange(len(vocab_ids)))
    t2d = np.zeros((vocab,), bool)
    t2d[vocab_ids] = True
    state["t2d"] = torch.from_numpy(t2d)
  if layout == "safeailab":  # SGLang's convention: the output of layer i
    fields.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=config.draft_vocab_size)
    if config.taps:
      fields["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(config.taps)}
    if config.tap_size:
      fields["target_hidden_size"] = config.tap_size
    if config.norm_before_residual:
      fields["norm_before_residual"] = True
  else:  # vLLM's convention: the input of layer i
    fields = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "transformer_layer_config": fields, "draft_vocab_size": config.draft_vocab_size,
              "norm_before_residual": config.norm_before_residual,
              "target_hidden_size": config.tap_size or config.feature_size,
              "speculators_config": {
                  "algorithm": "eagle3", "default_proposal_method": "greedy",
                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                        "accept_tolerance": 0.0, "verifier_accept_k": 1}],
                  "verifier": {"name_or_path": verifier, "architectures": []}}}
    if config.taps:
      fields["eagle_aux_hidden_state_layer_ids"] = [t + 1 for t in config.taps]
  (directory / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True))
  import safetensors.torch  # pylint: disable=g-import-not-at-top
  safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()},
                              str(directory / "model.safetensors"), metadata={"format": "pt"})
