"""What a Llama-like family's ``model_type`` fixes, as a record (:class:`Traits`), and the config fields
the rows share: one row per family in ``models.llama.TRAITS``, or added with
``bass_jax.register_llama_family`` (docs/extending.md, "Your own model family").
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The config.json fields every Llama-like family's port reads (besides transformers' generic ones and
# training-only fields); a family's own are in its Traits row, and any other field is refused by name.
COMMON_FIELDS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "rope_theta",
    "rope_scaling", "rope_parameters", "partial_rotary_factor", "hidden_act"})
GEMMA_FIELDS = frozenset({"hidden_activation", "attention_bias", "query_pre_attn_scalar",
                          "sliding_window", "layer_types", "final_logit_softcapping",
                          "attn_logit_softcapping", "use_bidirectional_attention"})
QWEN_WINDOW = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})


@dataclasses.dataclass(frozen=True)
class Traits:
  """One Llama-like family: what its ``model_type`` fixes about the architecture (no config field says
  it) and how its Hugging Face files read. A new Llama-like family is one row of ``models.llama.TRAITS``.

  Attributes:
    architecture: transformers' model class (``"Qwen3ForCausalLM"``).
    fields: the config.json fields of this family the port reads, beyond the common ones.
    qkv_bias: bias on q, k, v only, always (Qwen2).
    qk_norm: ``"rms"`` (Qwen3) or ``"gemma"`` (Gemma 3) per-head norms of q and k before rotary; None.
    gemma: Gemma's norms (``x̂ (1 + w)`` in f32), the post-attention and pre/post-feedforward norms,
      embeddings scaled by ``sqrt(D)``.
    window_everywhere: ``sliding_window`` applies to every layer (Mistral, Phi-3); otherwise only to
      the layers ``layer_types`` marks ``sliding_attention``.
    fused: the checkpoint stores ``qkv_proj`` and ``gate_up_proj`` fused (Phi-3).
    required: ``(field, value)`` pairs a family's published configs carry that must hold the value
      transformers' model assumes.
    ignored: fields with no effect on inference that the family's configs carry.
    partial_rotary: transformers' model rotates only ``partial_rotary_factor`` of each head (Phi-3,
      Gemma 3); the other families rotate the whole head and a factor below 1 is refused.
    attention_softcap: transformers' model applies ``attn_logit_softcapping`` (Gemma 2; Gemma 3's
      configs carry the field, which its attention never reads); with ``gemma`` only. A family
      with ``gemma`` and without it ignores the field, as Gemma 3 does.
    eagle_target: an EAGLE draft can read the family (unscaled embedding, uncapped logits).
    wrapper_types: multimodal ``model_type`` values holding this family's config as ``text_config``.
    gguf_architectures: llama.cpp's names of the family (``general.architecture``).
  """

  architecture: str
  fields: frozenset[str] = frozenset()
  qkv_bias: bool = False
  qk_norm: str | None = None
  gemma: bool = False
  window_everywhere: bool = False
  fused: bool = False
  required: tuple[tuple[str, Any], ...] = ()
  ignored: frozenset[str] = frozenset()
  partial_rotary: bool = False
  attention_softcap: bool = False
  eagle_target: bool = False
  wrapper_types: tuple[str, ...] = ()
  gguf_architectures: tuple[str, ...] = ()


def ported_activation(traits: Any) -> str:
  """The MLP activation the port computes for a family's traits (transformers' name)."""
  return "gelu_pytorch_tanh" if traits.gemma else "silu"


def activation(hf: Any, model_type: str, traits: Any) -> str:
  """The MLP activation a transformers config names (Gemma's ``hidden_activation``, the others'
  ``hidden_act``), checked against the one the family computes.

  Raises:
    ValueError: another activation, naming the config.json field.
  """
  field = "hidden_activation" if hasattr(hf, "hidden_activation") else "hidden_act"
  value = getattr(hf, field)
  want = ported_activation(traits)
  if value != want:
    raise ValueError(f"{model_type}: {field}={value!r} is not supported; the port computes {want!r}")
  return value
