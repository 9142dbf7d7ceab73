"""The llama.cpp architectures a GGUF file may hold, each as the transformers model it was converted from.

One :class:`Architecture` row per llama.cpp architecture (``general.architecture``): the ``{arch}.*``
metadata keys it may carry and the HF field each becomes (a rename, or a named step for keys that need
more), its tensor names, and which of llama.cpp's transforms it went through. :mod:`bass_jax.checkpoints.gguf`
reads a file with them.

The rows, after llama.cpp's ``convert_hf_to_gguf.py`` (class names as there):

* ``llama`` (``LlamaModel``: Llama 1-3, Mistral, SmolLM, TinyLlama) -> ``LlamaForCausalLM``. The only
  architecture here whose Q and K projections (weights and biases) llama.cpp permutes, from HF's
  rotate-half order into GGML's interleaved pairs (``LlamaModel.permute``); :func:`unpermute_rotary`
  undoes it. Rotary scaling ``rope.scaling.type`` ``linear`` / ``yarn`` (``TextModel.set_gguf_parameters``)
  maps to ``rope_parameters``; Llama 3's ``llama3`` scaling has no keys: llama.cpp bakes it into a
  ``rope_freqs`` tensor of per-frequency divisors (``LlamaModel.generate_extra_tensors``), from which
  ``gguf_llama3.llama3_parameters`` reads the parameters back (``original_max_position_embeddings`` 8192, the
  converter's assumption; only the ratios matter). ``longrope`` has no factors in a ``llama`` file and
  ``dynamic`` leaves no trace in one (llama.cpp writes nothing for it), so neither can be read back.
* ``qwen2`` (``Qwen2Model``) -> ``Qwen2ForCausalLM``; ``qwen3`` (``Qwen3Model``) -> ``Qwen3ForCausalLM``
  with its per-head ``attn_q_norm`` / ``attn_k_norm``. Not permuted (``TextModel.modify_tensors``).
* ``gemma2`` (``Gemma2Model``) -> ``Gemma2ForCausalLM``; ``gemma3`` (``Gemma3Model``, the text model) ->
  ``Gemma3ForCausalLM`` (``model_type`` ``gemma3_text``). Not permuted. Every ``*norm.weight`` tensor
  (the four per-layer norms, the final norm, and Gemma 3's q/k norms) is stored as ``w + 1``, Gemma's
  RMSNorm scaling by ``1 + w``; 1 is subtracted back. No ``output.weight``: the head is tied. What the
  file does not store llama.cpp fixes in its loader (``llama-model.cpp``), and so does this module:
  the layer pattern (Gemma 2 alternates sliding and global layers, starting sliding; Gemma 3 has five
  sliding layers to one global) unless ``attention.sliding_window_pattern`` says otherwise, Gemma 3's
  sliding-layer rotary base 10 000 when ``rope.freq_base_swa`` is absent, Gemma 2's window 4096 and
  soft-caps 50 / 30 when absent, and ``query_pre_attn_scalar``: the head size, except
  ``hidden_size // heads`` for the 27B models, which llama.cpp tells by their layer count (46, 62).
* ``phi3`` (``Phi3MiniModel``) -> ``Phi3ForCausalLM``. Not permuted. The fused ``attn_qkv`` and ``ffn_up``
  (gate then up) are HF's fused ``qkv_proj`` and ``gate_up_proj`` unchanged (the HF name table splits
  them). Partial rotary is ``rope.dimension_count / head_dim``; LongRoPE's factors are the
  ``rope_factors_long`` / ``rope_factors_short`` tensors, its attention factor ``rope.scaling.attn_factor``
  (kept only where it differs from the one transformers derives); a ``sliding_window`` of 0 is none.

Tied heads: no ``output.weight``. Biases (``attention_bias``, ``mlp_bias``) are read off the tensors.
Special token ids come from ``tokenizer.ggml.*``; the rest of the tokenizer is transformers' business.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Callable, Mapping

import numpy as np

from bass_jax._checks import short
from bass_jax.checkpoints import gguf_llama3
from bass_jax.checkpoints._mapping import CheckpointError
from bass_jax.models import family as family_lib

# -- the tensor transforms ------------------------------------------------------------------------------


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's Q/K row permutation on ``weight: [num_heads * H, ...]`` (a weight or a bias).

  llama.cpp reshapes the rows to ``[heads, 2, H/2]`` and swaps the last two axes (so that the two
  halves of HF's rotate-half pairs become adjacent); the inverse reshapes to ``[heads, H/2, 2]`` and
  swaps them back.
  """
  rows = weight.shape[0]
  return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
          .swapaxes(1, 2).reshape(weight.shape))


# -- metadata values and tensors -------------------------------------------------------------------


def metadata_value(field) -> Any:
  """A metadata value; f32 numbers as the shortest decimal that is the same f32 (``1e-05``, not
  ``9.999999747378752e-06``)."""
  import gguf  # pylint: disable=g-import-not-at-top

  value = field.contents()
  if field.types and field.types[-1] == gguf.GGUFValueType.FLOAT32:
    canonical = lambda v: float(str(np.float32(v)))
    value = [canonical(v) for v in value] if isinstance(value, list) else canonical(value)
  return value


def _f32_list(values: np.ndarray) -> list[float]:
  return [float(str(np.float32(v))) for v in np.asarray(values).reshape(-1)]


def dequantize(tensor, path: pathlib.Path) -> np.ndarray:
  """A ``gguf.ReaderTensor`` as f32 numpy in GGML's stored shape.

  Raises:
    CheckpointError: a quantization the ``gguf`` package cannot dequantize (naming the tensor)."""
  import gguf  # pylint: disable=g-import-not-at-top

  try:
    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
  except Exception as e:
    raise CheckpointError(f"{path}: cannot dequantize {tensor.name} ({tensor.tensor_type.name}): "
                          f"{e}") from e


# -- the families ---------------------------------------------------------------------------------------

# Tensor names, GGUF stem -> HF stem (``.weight`` / ``.bias`` carried over); ``{i}`` is the layer.
LAYER = "model.layers.{i}."
_DECODER = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
    "blk.{i}.attn_norm": LAYER + "input_layernorm",
    "blk.{i}.attn_q": LAYER + "self_attn.q_proj", "blk.{i}.attn_k": LAYER + "self_attn.k_proj",
    "blk.{i}.attn_v": LAYER + "self_attn.v_proj", "blk.{i}.attn_output": LAYER + "self_attn.o_proj",
    "blk.{i}.ffn_gate": LAYER + "mlp.gate_proj", "blk.{i}.ffn_up": LAYER + "mlp.up_proj",
    "blk.{i}.ffn_down": LAYER + "mlp.down_proj",
}
_PRE_MLP_NORM = {"blk.{i}.ffn_norm": LAYER + "post_attention_layernorm"}
_QK_NORM = {"blk.{i}.attn_q_norm": LAYER + "self_attn.q_norm",
            "blk.{i}.attn_k_norm": LAYER + "self_attn.k_norm"}
_GEMMA_NORMS = {"blk.{i}.post_attention_norm": LAYER + "post_attention_layernorm",
                "blk.{i}.ffn_norm": LAYER + "pre_feedforward_layernorm",
                "blk.{i}.post_ffw_norm": LAYER + "post_feedforward_layernorm"}
_PHI3 = {**{k: v for k, v in _DECODER.items()
            if k not in ("blk.{i}.attn_q", "blk.{i}.attn_k", "blk.{i}.attn_v", "blk.{i}.ffn_gate")},
         "blk.{i}.attn_qkv": LAYER + "self_attn.qkv_proj", "blk.{i}.ffn_up": LAYER + "mlp.gate_up_proj",
         **_PRE_MLP_NORM}

# Metadata keys every family renames to an HF field as they are.
_SHAPE_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
INT_FIELDS = {"num_hidden_layers", "max_position_embeddings", "hidden_size", "intermediate_size",
              "num_attention_heads"}


class Source:
  """A GGUF file's ``{arch}.*`` metadata and tensors, recording which keys and tensors were read."""

  def __init__(self, reader, path: pathlib.Path, arch: str):
    self.path, self.arch = path, arch
    self.tensors = {t.name: t for t in reader.tensors}
    self.meta = {key[len(arch) + 1:]: metadata_value(field) for key, field in reader.fields.items()
                 if key.startswith(arch + ".")}
    self.tokenizer = {key: metadata_value(field) for key, field in reader.fields.items()
                      if key.startswith("tokenizer.ggml.") and key.endswith("_token_id")}
    self.used_keys: set[str] = set()
    self.used_tensors: set[str] = set()

  def key(self, suffix: str) -> str:
    return f"{self.arch}.{suffix}"

  def has(self, suffix: str) -> bool:
    return suffix in self.meta

  def get(self, suffix: str, default: Any = None) -> Any:
    self.used_keys.add(suffix)
    value = self.meta.get(suffix, default)
    if isinstance(value, list):  # per-layer values (head counts, FFN sizes): one value for all layers
      if len(set(value)) != 1:
        self.refuse(suffix, "differs between layers; the port has one value for all layers")
      value = value[0]
    return value

  def int(self, suffix: str, default: Any = None) -> Any:
    """An integer key's value (None where absent and no default); nothing is coerced.

    Raises:
      ValueError: a value of another type (a float, a string, a boolean), named with the key.
    """
    value = self.get(suffix, default)
    if value is None:
      return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
      self.refuse(suffix, f"is {type(value).__name__}, not an integer; re-convert the file")
    return int(value)

  def float(self, suffix: str, default: Any = None) -> Any:
    """A number key's value (None where absent and no default); an integer is that number.

    Raises:
      ValueError: a value that is no number (a string, a boolean) or not finite, named with the key.
    """
    value = self.get(suffix, default)
    if value is None:
      return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
      self.refuse(suffix, f"is {type(value).__name__}, not a number; re-convert the file")
    if not math.isfinite(float(value)):
      self.refuse(suffix, "is not a finite number; re-convert the file")
    return float(value)

  def refuse(self, suffix: str, why: str) -> None:
    raise ValueError(f"{self.path}: GGUF metadata key {self.key(suffix)!r}="
                     f"{short(self.meta.get(suffix))} {why}")

  def tensor(self, name: str) -> np.ndarray | None:
    """A tensor that carries configuration (rotary factors), dequantized; None when absent."""
    if name not in self.tensors:
      return None
    self.used_tensors.add(name)
    return dequantize(self.tensors[name], self.path)

  def rows(self, name: str) -> int:
    """The number of rows (HF's first axis) of tensor ``name``."""
    if name not in self.tensors:
      raise CheckpointError(f"{self.path}: missing tensor {name!r}")
    return int(self.tensors[name].shape[-1])  # GGML lists the dimensions innermost first


Step = Callable[[Source, dict, "Architecture"], None]


def _step(*keys: str) -> Callable[[Step], Step]:
  """Marks a step with the metadata keys (``{arch}.`` suffixes) it reads."""
  def mark(fn: Step) -> Step:
    fn.keys = keys  # type: ignore[attr-defined]
    return fn
  return mark


@dataclasses.dataclass(frozen=True)
class Architecture:
  """How one llama.cpp architecture (``general.architecture``) reads as a transformers model.

  Attributes:
    arch: llama.cpp's name (``general.architecture``); the model family that claims it
      (``models.family.Family.gguf_architectures``) gives the HF ``model_type`` and class.
    renames: metadata key (``{arch}.`` suffix) -> HF field, copied as they are.
    steps: the fields that take more than a rename, each step marked with the keys it reads
      (:func:`_step`); the family accepts exactly ``renames`` and its steps' keys.
    tensors: GGUF tensor stem -> HF tensor stem (``{i}``: the layer).
    fields: HF fields fixed by the architecture (the activation …).
    head_dim_field: the HF config has a ``head_dim`` field (else the head size is
      ``hidden_size / num_attention_heads`` and must be).
    permute_qk: llama.cpp permuted the Q and K rows (:func:`unpermute_rotary`).
    norm_shift: what llama.cpp added to every ``*norm.weight`` tensor (Gemma's ``w + 1``).
  """

  arch: str
  renames: Mapping[str, str]
  steps: tuple[Step, ...]
  tensors: Mapping[str, str]
  fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  head_dim_field: bool = True
  permute_qk: bool = False
  norm_shift: float = 0.0

  @property
  def model_type(self) -> str:
    """The HF ``model_type`` of the family that claims :attr:`arch`.

    Raises:
      ValueError: no registered family claims it."""
    return self._model_family().model_type

  @property
  def architecture(self) -> str:
    """The HF class, for ``architectures``.

    Raises:
      ValueError: no registered family claims :attr:`arch`."""
    return self._model_family().architecture

  def _model_family(self) -> family_lib.Family:
    registered = family_lib.by_gguf_architecture(self.arch)
    if registered is None:
      raise ValueError(f"no model family claims the GGUF architecture {self.arch!r} "
                       "(models.family.Family.gguf_architectures)")
    return registered

  @property
  def keys(self) -> frozenset[str]:
    """Every metadata key (``{arch}.`` suffix) this family may carry."""
    return frozenset(self.renames).union(*(step.keys for step in self.steps))


# -- the steps ------------------------------------------------------------------------------------------


@_step("attention.head_count_kv", "attention.key_length", "attention.value_length")
def _heads(src: Source, out: dict, family: Architecture) -> None:
  """KV heads (default: as many as query heads) and the head size (default: hidden / heads)."""
  heads, hidden = out["num_attention_heads"], out["hidden_size"]
  out["num_key_value_heads"] = src.int("attention.head_count_kv", heads)
  head_dim = src.int("attention.key_length", hidden // heads)
  if src.int("attention.value_length", head_dim) != head_dim:
    src.refuse("attention.value_length", f"differs from the key length {head_dim}; transformers' "
               f"{family.architecture} has one head size")
  if family.head_dim_field:
    out["head_dim"] = head_dim
  elif head_dim != hidden // heads:
    src.refuse("attention.key_length", f"is not hidden_size / heads = {hidden // heads}, which "
               f"transformers' {family.architecture} requires (it has no head_dim)")


@_step("vocab_size")
def _vocab(src: Source, out: dict, family: Architecture) -> None:
  """The vocabulary: the embedding's rows (``vocab_size`` when written must agree)."""
  del family
  rows = src.rows("token_embd.weight")
  if src.int("vocab_size", rows) != rows:
    src.refuse("vocab_size", f"differs from token_embd.weight's {rows} rows")
  out["vocab_size"] = rows


_YARN_KEYS = {"rope.scaling.yarn_attn_factor": "attention_factor",
              "rope.scaling.yarn_beta_fast": "beta_fast", "rope.scaling.yarn_beta_slow": "beta_slow"}


@_step("rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
       "rope.scale_linear", "rope.scaling.original_context_length", "rope.scaling.attn_factor",
       "rope.scaling.finetuned", "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_log_multiplier",
       *_YARN_KEYS)
def _rope(src: Source, out: dict, family: Architecture) -> None:
  """``rope_parameters`` of the (global) layers from ``rope.*`` (``TextModel.set_gguf_parameters``)."""
  del family
  head_dim = out.get("head_dim", out["hidden_size"] // out["num_attention_heads"])
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": src.float("rope.freq_base", 10000.0)}
  if src.int("rope.dimension_count", head_dim) != head_dim:
    src.refuse("rope.dimension_count", f"is not the head size {head_dim} (partial rotary is Phi-3's)")
  src.get("rope.scaling.finetuned")  # llama.cpp's note that the model was fine-tuned scaled: no effect
  kind = src.get("rope.scaling.type", "none")
  linear = src.float("rope.scale_linear", 1.0)  # the key older converters wrote for linear scaling
  if linear != 1.0:
    if kind not in ("none", "linear"):
      src.refuse("rope.scale_linear", f"contradicts rope.scaling.type {kind!r}")
    rope.update(rope_type="linear", factor=linear)
  if kind == "linear":
    rope.update(rope_type="linear", factor=src.float("rope.scaling.factor"))
  elif kind == "yarn":
    rope.update(rope_type="yarn", factor=src.float("rope.scaling.factor"),
                original_max_position_embeddings=src.int("rope.scaling.original_context_length"))
    for key, name in _YARN_KEYS.items():
      if src.has(key):
        rope[name] = src.float(key)
    if src.float("rope.scaling.yarn_ext_factor", 1.0) != 1.0:
      src.refuse("rope.scaling.yarn_ext_factor", "is not transformers' YaRN (whose is 1)")
    if src.float("rope.scaling.yarn_log_multiplier", 0.0) != 0.0:
      src.refuse("rope.scaling.yarn_log_multiplier", "(DeepSeek's mscale) has no place in this family")
  elif kind != "none":
    src.refuse("rope.scaling.type", "is not supported here ('linear' and 'yarn' are; a 'llama' file "
               "carries Llama 3 scaling as rope_freqs.weight)")
  if rope.get("factor", 1.0) is None:
    src.refuse("rope.scaling.type", "comes without rope.scaling.factor")
  if src.float("rope.scaling.attn_factor", 1.0) != 1.0:
    src.refuse("rope.scaling.attn_factor", "is not supported here (only Phi-3's LongRoPE has one)")
  out["rope_parameters"] = rope


@_step()
def _llama3_rope(src: Source, out: dict, family: Architecture) -> None:
  """Llama 3's scaling from the ``rope_freqs`` tensor (after :func:`_rope`)."""
  del family
  factors = src.tensor("rope_freqs.weight")
  if factors is None:
    return
  rope = out["rope_parameters"]
  if rope["rope_type"] != "default":
    raise ValueError(f"{src.path}: rope_freqs.weight beside rope.scaling.type "
                     f"{rope['rope_type']!r}: two rotary scalings")
  try:
    llama3 = gguf_llama3.llama3_parameters(factors, rope["rope_theta"], out["head_dim"])
  except ValueError as e:
    raise ValueError(f"{src.path}: {e}") from e
  if llama3 is not None:
    out["rope_parameters"] = llama3


@_step("expert_count", "expert_used_count", "attention.causal")
def _dense_causal(src: Source, out: dict, family: Architecture) -> None:
  """Checked only: a dense decoder (an expert count of 0, as some converters write) and causal."""
  del out, family
  for key in ("expert_count", "expert_used_count"):
    if src.int(key, 0) != 0:
      src.refuse(key, "(a mixture of experts) is not supported")
  if not src.get("attention.causal", True):
    src.refuse("attention.causal", "(bidirectional attention) is not supported")


@_step()
def _bias_and_head(src: Source, out: dict, family: Architecture) -> None:
  """``tie_word_embeddings`` (no ``output.weight``) and the bias flags, read off the tensors."""
  out["tie_word_embeddings"] = "output.weight" not in src.tensors
  if "attention_bias" in family.fields:
    out["attention_bias"] = "blk.0.attn_q.bias" in src.tensors
  if "mlp_bias" in family.fields:
    out["mlp_bias"] = "blk.0.ffn_up.bias" in src.tensors


@_step()
def _full_attention(src: Source, out: dict, family: Architecture) -> None:
  """Qwen's window fields: llama.cpp reads none, so every layer attends to the whole prefix."""
  del src, family
  out["use_sliding_window"] = False
  out["layer_types"] = ["full_attention"] * out["num_hidden_layers"]


# llama.cpp's Gemma defaults (llama-model.cpp, llm_load_hparams): the layer pattern, and the 27B
# models (told by their layer count), whose queries are scaled by hidden_size / heads, not the head size.
_GEMMA = {"gemma2": dict(pattern=2, layers_27b=46), "gemma3": dict(pattern=6, layers_27b=62)}


@_step("attention.sliding_window", "attention.sliding_window_pattern", "attn_logit_softcapping",
       "final_logit_softcapping", "rope.freq_base_swa")
def _gemma(src: Source, out: dict, family: Architecture) -> None:
  """Gemma 2 / 3's window, layer types, soft-caps, query scale and (Gemma 3) per-type rotary."""
  gemma3 = family.arch == "gemma3"
  known = _GEMMA[family.arch]
  layers = out["num_hidden_layers"]
  if gemma3 and not src.has("attention.sliding_window"):
    raise ValueError(f"{src.path}: no {src.key('attention.sliding_window')} (llama.cpp requires it)")
  out["sliding_window"] = src.int("attention.sliding_window", 4096)
  pattern = src.meta.get("attention.sliding_window_pattern", known["pattern"])
  src.used_keys.add("attention.sliding_window_pattern")
  if isinstance(pattern, list):  # one flag per layer, true where the layer slides
    if len(pattern) != layers:
      src.refuse("attention.sliding_window_pattern", f"has {len(pattern)} flags for {layers} layers")
    sliding = [bool(p) for p in pattern]
  else:  # llama.cpp's set_swa_pattern(n): every n-th layer is global, the others slide
    sliding = [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1 for i in range(layers)]
  out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
  caps = (None, None) if gemma3 else (50.0, 30.0)
  out["attn_logit_softcapping"] = src.float("attn_logit_softcapping", caps[0])
  out["final_logit_softcapping"] = src.float("final_logit_softcapping", caps[1])
  heads = out["num_attention_heads"]
  out["query_pre_attn_scalar"] = (out["hidden_size"] // heads if layers == known["layers_27b"]
                                  else out["head_dim"])
  if gemma3:
    local = {"rope_type": "default", "rope_theta": src.float("rope.freq_base_swa", 10000.0)}
    out["rope_parameters"] = {"full_attention": out["rope_parameters"], "sliding_attention": local}
  elif src.has("rope.freq_base_swa"):
    src.refuse("rope.freq_base_swa", "has no place in Gemma 2 (one rotary for all layers)")


@_step("rope.freq_base", "rope.dimension_count", "rope.scaling.original_context_length",
       "rope.scaling.attn_factor", "attention.sliding_window")
def _phi3(src: Source, out: dict, family: Architecture) -> None:
  """Phi-3's rotary (``Phi3MiniModel``: partial, LongRoPE from tensors) and its window."""
  del family
  head_dim = out["hidden_size"] // out["num_attention_heads"]
  dims = src.int("rope.dimension_count", head_dim)
  if not 0 < dims <= head_dim or dims % 2:
    src.refuse("rope.dimension_count", f"does not fit the head size {head_dim}")
  partial = dims / head_dim
  context = out["max_position_embeddings"]
  original = src.int("rope.scaling.original_context_length", context)
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": src.float("rope.freq_base", 10000.0)}
  long, short = src.tensor("rope_factors_long.weight"), src.tensor("rope_factors_short.weight")
  if (long is None) != (short is None):
    raise ValueError(f"{src.path}: one of rope_factors_long.weight / rope_factors_short.weight "
                     "without the other")
  attn_factor = src.float("rope.scaling.attn_factor")
  if long is not None:
    rope.update(rope_type="longrope", long_factor=_f32_list(long), short_factor=_f32_list(short),
                original_max_position_embeddings=original)
    scale = context / original  # transformers' LongRoPE attention factor, as Phi3MiniModel computes it
    derived = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    if attn_factor is not None and not math.isclose(attn_factor, derived, rel_tol=1e-6):
      rope["attention_factor"] = attn_factor
  elif attn_factor not in (None, 1.0):
    src.refuse("rope.scaling.attn_factor", "without LongRoPE factors (rope_factors_long.weight)")
  if partial != 1.0:
    rope["partial_rotary_factor"] = partial
  out["rope_parameters"] = rope
  out["partial_rotary_factor"] = partial
  out["original_max_position_embeddings"] = original
  out["sliding_window"] = src.int("attention.sliding_window", 0) or None


_LLAMA_LIKE_STEPS = (_heads, _vocab, _rope, _dense_causal, _bias_and_head)
_SILU = {"hidden_act": "silu"}
_GELU = {"hidden_activation": "gelu_pytorch_tanh"}

FAMILIES: dict[str, Architecture] = {family.arch: family for family in (
    Architecture("llama", _SHAPE_KEYS, (*_LLAMA_LIKE_STEPS, _llama3_rope),
           {**_DECODER, **_PRE_MLP_NORM}, {**_SILU, "attention_bias": False, "mlp_bias": False},
           permute_qk=True),
    Architecture("qwen2", _SHAPE_KEYS, (*_LLAMA_LIKE_STEPS, _full_attention),
           {**_DECODER, **_PRE_MLP_NORM}, _SILU, head_dim_field=False),
    Architecture("qwen3", _SHAPE_KEYS, (*_LLAMA_LIKE_STEPS, _full_attention),
           {**_DECODER, **_PRE_MLP_NORM, **_QK_NORM}, {**_SILU, "attention_bias": False}),
    Architecture("gemma2", _SHAPE_KEYS, (*_LLAMA_LIKE_STEPS, _gemma),
           {**_DECODER, **_GEMMA_NORMS}, {**_GELU, "attention_bias": False}, norm_shift=1.0),
    Architecture("gemma3", _SHAPE_KEYS, (*_LLAMA_LIKE_STEPS, _gemma),
           {**_DECODER, **_GEMMA_NORMS, **_QK_NORM}, {**_GELU, "attention_bias": False},
           norm_shift=1.0),
    Architecture("phi3", _SHAPE_KEYS, (_heads, _vocab, _phi3, _dense_causal, _bias_and_head), _PHI3, _SILU,
           head_dim_field=False),
)}
