"""Hugging Face checkpoint directories (config.json + safetensors or .bin) <-> Flax parameters.

One name table per family, against transformers' state-dict names (``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``MistralForCausalLM``, ``OPTForCausalLM``, ``CodeGenForCausalLM``,
``GPT2LMHeadModel``). PyTorch ``nn.Linear`` stores ``weight: [out, in]`` and Flax ``Dense`` stores
``kernel: [in, out]``, hence the transposes; GPT-2's ``Conv1D`` already stores ``[in, out]`` and is not
transposed; CodeGen's and GPT-2's fused qkv tensors are split into three projections and merged back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Any, Callable, Iterable

import numpy as np

from bass_jax.checkpoints import _mapping
from bass_jax.checkpoints import config_schema
from bass_jax.checkpoints import mismatch
from bass_jax.checkpoints import multimodal
from bass_jax.checkpoints._mapping import CheckpointError, Fused, Rule, transpose
from bass_jax.models.codegen import MP_NUM, CodeGenConfig
from bass_jax.models.gpt2 import GPT2Config
from bass_jax.models.llama import LlamaConfig
from bass_jax.models.opt import OPTConfig
from bass_jax.models import decoder_config
from bass_jax.models import family as family_lib

_T = (transpose,)
# Buffers that PyTorch checkpoints of some versions carry: precomputed tables, not parameters.
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_BUFFER = re.compile(r"(rotary_emb\.(original_)?inv_freq|attn\.(bias|masked_bias|causal_mask|embed_positions))$")


def _phi3_fused(config: LlamaConfig) -> list[Fused]:
  """Phi-3's ``qkv_proj.weight [(N + 2K) H, D]`` (rows q, then k, then v) and ``gate_up_proj.weight
  [2F, D]`` (rows gate, then up), as the separate projections of :class:`Llama`
  (``modeling_phi3.py``: ``Phi3Attention.forward`` slices q, k, v; ``Phi3MLP`` chunks gate, up)."""
  q_rows = config.num_attention_heads * config.head_dim
  kv_rows = config.num_key_value_heads * config.head_dim

  def split_qkv(w):
    q, k, v = np.split(w, [q_rows, q_rows + kv_rows], axis=0)
    return q.T.copy(), k.T.copy(), v.T.copy()

  def split_gate_up(w):
    gate, up = np.split(w, 2, axis=0)
    return gate.T.copy(), up.T.copy()

  merge = lambda parts: np.concatenate([p.T for p in parts], axis=0)
  layer = "model.layers.{layer}."
  return [Fused(tuple(("layers", "self_attn", f"{n}_proj", "kernel") for n in "qkv"),
                layer + "self_attn.qkv_proj.weight", split_qkv, merge),
          Fused((("layers", "mlp", "gate_proj", "kernel"), ("layers", "mlp", "up_proj", "kernel")),
                layer + "mlp.gate_up_proj.weight", split_gate_up, merge)]


def llama_rules(config: LlamaConfig) -> list[Rule | Fused]:
  """The name table HF ``LlamaForCausalLM`` (and the family's ``Qwen2``, ``Mistral``, ``Qwen3``,
  ``Gemma2``, ``Gemma3``, ``Phi3`` ``ForCausalLM``) <-> ``Llama``."""
  layer = "model.layers.{layer}."
  traits = config.traits
  norms = ["input_layernorm", "post_attention_layernorm"]
  if traits.gemma:
    norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
  rules: list[Rule | Fused] = [
      Rule(("embed_tokens", "embedding"), "model.embed_tokens.weight"),
      Rule(("norm", "scale"), "model.norm.weight"),
      *(Rule(("layers", n, "scale"), f"{layer}{n}.weight") for n in norms),
  ]
  if traits.qk_norm:
    rules += [Rule(("layers", "self_attn", n, "scale"), f"{layer}self_attn.{n}.weight")
              for n in ("q_norm", "k_norm")]
  if traits.fused:
    rules += _phi3_fused(config)
  for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
    if not traits.fused or proj == "o_proj":
      rules.append(Rule(("layers", "self_attn", proj, "kernel"), f"{layer}self_attn.{proj}.weight",
                        _T, _T))
    if config.attention_bias or (config.qkv_bias and proj != "o_proj"):
      rules.append(Rule(("layers", "self_attn", proj, "bias"), f"{layer}self_attn.{proj}.bias"))
  for proj in ("gate_proj", "up_proj", "down_proj"):
    if not traits.fused or proj == "down_proj":
      rules.append(Rule(("layers", "mlp", proj, "kernel"), f"{layer}mlp.{proj}.weight", _T, _T))
    if config.mlp_bias:
      rules.append(Rule(("layers", "mlp", proj, "bias"), f"{layer}mlp.{proj}.bias"))
  if not config.tie_word_embeddings:
    rules.append(Rule(("lm_head",), "lm_head.weight", _T, _T))
  return rules


def _norm(flax_name: str, source: str, affine: bool = True) -> list[Rule]:
  if not affine:
    return []
  return [Rule((*flax_name.split("/"), "scale"), source + ".weight"),
          Rule((*flax_name.split("/"), "bias"), source + ".bias")]


def _linear(flax_name: str, source: str, bias: bool, transform=_T) -> list[Rule]:
  rules = [Rule((*flax_name.split("/"), "kernel"), source + ".weight", transform, transform)]
  if bias:
    rules.append(Rule((*flax_name.split("/"), "bias"), source + ".bias"))
  return rules


def opt_rules(config: OPTConfig) -> list[Rule]:
  """The name table HF ``OPTForCausalLM`` <-> :class:`bass_jax.models.opt.OPT`."""
  dec, layer = "model.decoder.", "model.decoder.layers.{layer}."
  affine = config.layer_norm_elementwise_affine
  rules = [Rule(("embed_tokens", "embedding"), dec + "embed_tokens.weight"),
           Rule(("embed_positions", "embedding"), dec + "embed_positions.weight")]
  if config.projects:
    rules += _linear("project_in", dec + "project_in", False) + _linear("project_out", dec + "project_out", False)
  if config.final_layer_norm:
    rules += _norm("final_layer_norm", dec + "final_layer_norm", affine)
  rules += _norm("layers/self_attn_layer_norm", layer + "self_attn_layer_norm", affine)
  rules += _norm("layers/final_layer_norm", layer + "final_layer_norm", affine)
  for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
    rules += _linear(f"layers/{proj}", f"{layer}self_attn.{proj}", config.enable_bias)
  rules += _linear("layers/fc1", layer + "fc1", config.enable_bias)
  rules += _linear("layers/fc2", layer + "fc2", config.enable_bias)
  if not config.tie_word_embeddings:
    rules.append(Rule(("lm_head",), "lm_head.weight"))
  return rules


def _codegen_qkv(config: CodeGenConfig) -> Fused:
  """CodeGen's ``qkv_proj.weight [3D, D]``: 4 model-parallel shards, each ``[q | v | k]`` of D/4 rows."""
  d = config.n_embd

  def split(w):
    shards = w.reshape(MP_NUM, 3, d // MP_NUM, d)  # [shard, (q, v, k), rows, in]
    q, v, k = (shards[:, i].reshape(d, d) for i in range(3))
    return q.T.copy(), k.T.copy(), v.T.copy()

  def merge(parts):
    q, k, v = (p.T.reshape(MP_NUM, d // MP_NUM, d) for p in parts)
    return np.stack([q, v, k], axis=1).reshape(3 * d, d)

  paths = tuple(("h", f"{n}_proj", "kernel") for n in "qkv")
  return Fused(paths, "transformer.h.{layer}.attn.qkv_proj.weight", split, merge)


def codegen_rules(config: CodeGenConfig) -> list[Rule | Fused]:
  """The name table HF ``CodeGenForCausalLM`` <-> :class:`bass_jax.models.codegen.CodeGen`."""
  layer = "transformer.h.{layer}."
  rules: list[Rule | Fused] = [Rule(("wte", "embedding"), "transformer.wte.weight"), _codegen_qkv(config)]
  rules += _norm("ln_f", "transformer.ln_f") + _norm("h/ln_1", layer + "ln_1")
  rules += _linear("h/out_proj", layer + "attn.out_proj", False)
  rules += _linear("h/fc_in", layer + "mlp.fc_in", True) + _linear("h/fc_out", layer + "mlp.fc_out", True)
  rules.append(Rule(("lm_head_bias",), "lm_head.bias"))
  if not config.tie_word_embeddings:
    rules.append(Rule(("lm_head",), "lm_head.weight"))
  return rules


def _gpt2_fused(kind: str) -> Fused:
  """GPT-2's ``c_attn`` (``Conv1D``: weight ``[D, 3D]`` in Flax layout, bias ``[3D]``) as q, k, v."""
  axis = -1
  split = lambda w: tuple(np.split(w, 3, axis=axis))
  merge = lambda parts: np.concatenate(parts, axis=axis)
  paths = tuple(("h", f"{n}_proj", kind) for n in "qkv")
  source = "transformer.h.{layer}.attn.c_attn." + ("weight" if kind == "kernel" else "bias")
  return Fused(paths, source, split, merge)


def gpt2_rules(config: GPT2Config) -> list[Rule | Fused]:
  """The name table HF ``GPT2LMHeadModel`` <-> :class:`bass_jax.models.gpt2.GPT2` (Conv1D: no transposes)."""
  layer = "transformer.h.{layer}."
  rules: list[Rule | Fused] = [Rule(("wte", "embedding"), "transformer.wte.weight"),
                               Rule(("wpe", "embedding"), "transformer.wpe.weight"),
                               _gpt2_fused("kernel"), _gpt2_fused("bias")]
  rules += _norm("ln_f", "transformer.ln_f") + _norm("h/ln_1", layer + "ln_1") + _norm("h/ln_2", layer + "ln_2")
  rules += _linear("h/attn_proj", layer + "attn.c_proj", True, transform=())
  rules += _linear("h/c_fc", layer + "mlp.c_fc", True, transform=())
  rules += _linear("h/mlp_proj", layer + "mlp.c_proj", True, transform=())
  if not config.tie_word_embeddings:
    rules.append(Rule(("lm_head",), "lm_head.weight"))
  return rules


_RULES: dict[type, Callable[[Any], list]] = {LlamaConfig: llama_rules, OPTConfig: opt_rules,
                                             CodeGenConfig: codegen_rules, GPT2Config: gpt2_rules}
# Where a tied head's weight would be, and the embedding it must equal.
_TIED = {LlamaConfig: "model.embed_tokens.weight", OPTConfig: "model.decoder.embed_tokens.weight",
         CodeGenConfig: "transformer.wte.weight", GPT2Config: "transformer.wte.weight"}


def rules_for(config) -> list[Rule | Fused]:
  """The conversion table of ``config``'s family."""
  return _RULES[type(config)](config)


def config_from_hf(fields: dict[str, Any], where: str | os.PathLike | None = None):
  """The family config for an HF config dict (``config.json``): its ``model_type``'s family
  (``models.family``), or the text config a multimodal one wraps (Gemma 3's ``gemma3``).

  Args:
    fields: the parsed config.json.
    where: the config.json they were read from: every refusal then starts with it, and one from
      transformers' config class names the sizes it filled in (``config_schema.lacking_sizes``).

  Raises:
    ValueError: no or an unsupported ``model_type`` (the supported ones are named), or what the
      family's ``from_hf_config`` rejects.
  """
  try:
    return _config_from_hf(fields)
  except ValueError as e:
    message = str(e)
    if where is not None and isinstance(e, decoder_config.RefusedByTransformers):
      lacking = config_schema.lacking_sizes(fields, message)
      message += config_schema.lacking_note(lacking) if lacking else ""
    if where is not None and not message.startswith(str(where)):
      message = f"{where}: {message}"
    if message == str(e):
      raise
    raise ValueError(message) from e


def _config_from_hf(fields: dict[str, Any]):
  model_type = fields.get("model_type")
  outer = family_lib.wrapped_by(model_type)
  if outer is not None:
    fields = multimodal.text_config(fields, model_type, outer.model_type)
    model_type = fields["model_type"]
  registered = family_lib.find(model_type)
  if registered is None:
    raise ValueError(f"unsupported model_type {model_type!r}; supported: "
                     f"{list(family_lib.supported_model_types())}")
  return registered.config_class.from_hf_config(fields)


def read_json_object(file: str | os.PathLike) -> dict[str, Any]:
  """The JSON object (a dict) in ``file``: a config.json, a tokenizer's JSON file.

  Raises:
    FileNotFoundError: no such file. ValueError: the file is not valid JSON, or holds a JSON value that
      is not an object (a list, a string …); the message names the file and what is wrong.
  """
  file = pathlib.Path(file)
  try:
    text = file.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{file}: not valid JSON (not UTF-8 text: {e}); fix or re-export it") from e
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}: not valid JSON ({e}); fix or re-export it") from e
  if not isinstance(value, dict):
    kind = {list: "an array (a list)", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}[type(value)]
    raise ValueError(f"{file}: holds {kind}, not the JSON object ({{\"key\": value, …}}) it must "
                     "be; fix or re-export it")
  return value


def read_config_fields(path: str | os.PathLike) -> dict[str, Any]:
  """The fields of ``config.json`` in checkpoint directory ``path``, a dict, each of the type and in the
  range transformers' config class declares (``checkpoints.config_schema``), checked before anything
  reads them.

  Raises:
    FileNotFoundError: no config.json. ValueError: it is not valid JSON or not a JSON object (named);
      a field of the wrong type or out of range (the file, the field, its value and what is expected).
  """
  config_path = pathlib.Path(path) / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"{path}: no config.json; not a Hugging Face checkpoint directory")
  fields = read_json_object(config_path)
  config_schema.check(fields, str(config_path))
  return fields


def read_config(path: str | os.PathLike):
  """Reads ``config.json`` of an HF checkpoint directory into the family's config.

  Raises:
    FileNotFoundError: no config.json. ValueError: config.json is not valid JSON or not a JSON object
      (the file named); an unsupported model or field.
  """
  return config_from_hf(read_config_fields(path), pathlib.Path(path) / "config.json")


def _read_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of the directory's safetensors files (or PyTorch .bin files), as numpy arrays.

  With a ``model.safetensors.index.json`` (a sharded save), exactly the files its weight map names are
  read, as transformers does; other ``*.safetensors`` files are not part of the checkpoint.

  Raises:
    CheckpointError: a damaged or truncated weight file (one line, the file named); two saves mixed in
      one directory; an invalid index or one naming missing shards. FileNotFoundError: no weights.
  """
  index = path / _SAFETENSORS_INDEX
  if index.is_file() and (path / "model.safetensors").is_file():
    raise CheckpointError(f"{path} holds both model.safetensors and a sharded {_SAFETENSORS_INDEX}: two "
                          "saves mixed in one directory; keep one, or re-save with overwrite=True")
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
    files = [path / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
      raise CheckpointError(f"{index} names shard(s) {missing[:4]} that are not in {path}")
  else:
    files = sorted(path.glob("*.safetensors"))
  tensors: dict[str, np.ndarray] = {}
  if files:
    import safetensors.numpy  # pylint: disable=g-import-not-at-top

    for file in files:
      try:
        part = safetensors.numpy.load_file(str(file))
      except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{file}: cannot read safetensors file: damaged or truncated "
                              f"({reason}); re-export it, or copy it again") from e
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
    raise CheckpointError(
        f"{file}: tensor(s) {sorted(duplicate)[:4]} also appear in another weight file of "
        f"{file.parent} (leftover shards of an earlier save?); keep one set of files, or re-save with "
        "bass_jax.save_model(..., overwrite=True)")
  into.update(part)


def load_hf_checkpoint(path: str | os.PathLike, *, expected: Any, dtype: Any,
                       fields: dict[str, Any] | None = None, config: Any = None
                       ) -> tuple[Any, dict[str, Any]]:
  """Reads an HF checkpoint directory of a supported family into ``(config, params)``.

  Args:
    path: directory with ``config.json`` and ``*.safetensors`` (or ``pytorch_model*.bin``).
    expected: ``config -> abstract params`` callable, used to check every shape.
    dtype: dtype of the returned parameters.
    fields: config.json's object when the caller already read it (``locate.Checkpoint.fields``); None reads it.
    config: the family config of ``fields`` (:func:`config_from_hf`) when the caller already built
      it (``load_model`` does, before the weights); None builds it.

  Raises:
    FileNotFoundError, ValueError, CheckpointError: missing files, unsupported config, or tensors that
      do not match the config (missing, extra, mis-shaped), each naming the problem.
  """
  path = pathlib.Path(path)
  fields = read_config_fields(path) if fields is None else fields
  config = config_from_hf(fields, path / "config.json") if config is None else config
  tensors = multimodal.text_decoder_tensors(fields, _read_tensors(path))
  params = params_from_tensors(config, tensors, tensors.__getitem__, expected=expected, dtype=dtype,
                               where=str(path), fields=fields)
  return config, params


def params_from_tensors(config, names: Iterable[str], read: Callable[[str], np.ndarray], *,
                        expected: Any, dtype: Any, where: str, source: str = "config.json",
                        fields: dict[str, Any] | None = None,
                        shape_of: Callable[[str], tuple[int, ...]] | None = None) -> dict[str, Any]:
  """The Flax parameters of ``config`` from tensors under transformers' state-dict names.

  The HF path of every checkpoint format: :func:`load_hf_checkpoint` reads a directory's weight files,
  ``checkpoints.gguf`` translates a GGUF file's tensors to these names; both end here.

  Args:
    config: the family config (:func:`config_from_hf`).
    names: every tensor name in the source (``model.layers.0.self_attn.q_proj.weight`` …).
    read: one tensor by name, as a numpy array (it may load or dequantize on demand).
    expected: ``config -> abstract params`` callable, used to check every shape.
    dtype: dtype of the returned parameters.
    where: the source's name, for error messages.
    source: where ``config`` was read (``"config.json"``, ``"the GGUF metadata"``), for the words.
    fields: the config dict ``config`` was read from (:func:`config_from_hf`), where there is one: a
      mismatch is then explained by configs read again with one field changed, and a field the dict
      lacks (or holds as null) is named so.
    shape_of: a tensor's shape by name without reading it (a GGUF header's): after the first tensor
      that does not fit, the rest are not read (or dequantized), only their shapes converted.

  Raises:
    CheckpointError: a tensor missing, left over or mis-shaped (one line: the first such tensor and,
      where one config field explains every difference, that field with both values:
      ``checkpoints.mismatch.explain``); a tied config whose source also holds an ``lm_head.weight``
      that differs from the embedding.
  """
  names = set(names)
  if getattr(config, "tie_word_embeddings", False) and "lm_head.weight" in names:
    # Some exporters write the tied head out as well; it must be the embedding, or the config lies.
    names.discard("lm_head.weight")
    embedding = _TIED[type(config)]
    if embedding not in names or not np.array_equal(read("lm_head.weight"), read(embedding)):
      raise CheckpointError(f"{where}: tie_word_embeddings is true but lm_head.weight differs from "
                            f"{embedding}; set tie_word_embeddings=false")
  want = expected(config)
  try:
    return _mapping.to_flax(
        rules_for(config), source_names=names, read=read, expected=want,
        num_layers=config.num_layers, dtype=dtype, ignore=lambda n: bool(_BUFFER.search(n)),
        where=where, shape_of=shape_of)
  except _mapping.ShapesDiffer as e:
    why = _explain(e.stored, config, names, expected, source, fields)
    if why is not None:
      fix = mismatch.FIX if source == "config.json" else "re-convert the file"
      raise CheckpointError(f"{where}: {why} ({str(e).removeprefix(f'{where}: ')}); {fix}") from e
    # A tensor of another shape (not one missing or left over) may come from a size left to its default.
    lacking = config_schema.lacking_sizes(fields, str(e)) if fields and e.misshaped else []
    if not lacking:
      raise
    raise CheckpointError(f"{e}{config_schema.lacking_note(lacking, source)}") from e


def _explain(stored: dict[str, tuple], config, names: set[str], expected: Any, source: str,
             fields: dict[str, Any] | None) -> str | None:
  """The config field behind tensors that do not fit ``config`` (``checkpoints.mismatch.explain``).

  A candidate config (``fields`` read again with one field changed, or the dataclass with it
  replaced) fits when its rules read exactly the source's tensors and every parameter both it and the
  source's conversion under ``config``'s rules know has the stored shape: a parameter only the
  candidate has (OPT's ``project_in`` for a narrower embedding) is read from a tensor that is there."""
  wrapped = fields is not None and family_lib.wrapped_by(fields.get("model_type")) is not None
  given = fields.get("text_config") if wrapped else fields
  given = given if isinstance(given, dict) else None

  def rebuild(name: str, value: Any):
    if given is None:
      return dataclasses.replace(config, **{name: value})
    changed = {**given, name: value}
    return config_from_hf({**fields, "text_config": changed} if wrapped else changed)

  def fits(candidate) -> bool:
    shapes = mismatch.flat_shapes(expected(candidate))
    read = _mapping.source_names(rules_for(candidate), candidate.num_layers)
    if not read <= names or not all(_BUFFER.search(n) for n in names - read):
      return False
    return all(shapes.get(k, shape) == shape for k, shape in stored.items()) and (
        set(shapes) >= set(stored))

  return mismatch.explain(stored, mismatch.flat_shapes(expected(config)), config, expected,
                          source=source, given=given, rebuild=rebuild, fits=fits)


def save_hf_checkpoint(path: str | os.PathLike, config, params: Any) -> None:
  """Writes ``config.json`` + ``model.safetensors`` that transformers' ``AutoModelForCausalLM`` loads.

  Parameters are written in their dtype when it is f16 or f32, else in f32 (safetensors' numpy writer
  has no bfloat16).
  """
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  tensors = _mapping.from_flax(rules_for(config), params, num_layers=config.num_layers)
  tensors = {k: v if v.dtype in (np.float32, np.float16) else v.astype(np.float32)
             for k, v in tensors.items()}
  safetensors.numpy.save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
  hf_config = config.to_hf_config()
  hf_config.architectures = [config.hf_architecture]
  hf_config.save_pretrained(str(path))
