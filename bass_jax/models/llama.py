"""The Llama family and its descendants as one Flax module over a ragged cache: Llama 2/3.x, SmolLM2,
TinyLlama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3 (text) and Phi-3/Phi-4.

Reference implementations, each tested in f32 against transformers' PyTorch model: ``modeling_llama.py``
(RMSNorm, rotate-half rotary, grouped-query attention, SwiGLU, tied or untied head); Qwen2's bias on q, k,
v (``modeling_qwen2.py``); Mistral's and Phi-3's sliding window (``modeling_mistral.py``,
``modeling_phi3.py``, whose fused ``qkv_proj`` / ``gate_up_proj`` are split on load); Qwen3's per-head
q/k RMSNorm before rotary (``modeling_qwen3.py``); Gemma 2's ``x̂ (1 + w)`` norms in f32, four norms per
layer, embeddings scaled by ``sqrt(D)``, GeGLU, ``query_pre_attn_scalar`` and attention and final logit
soft-capping (``modeling_gemma2.py``); Gemma 3's q/k norms and local layers with their own rotary base
(``modeling_gemma3.py``). Rotary scaling of every type lives in ``models.rope``. What differs between
the families is a fixed trait of the ``model_type`` (:data:`TRAITS`) or a config field.

Axes: B batch, T new tokens, S cache slots, L layers, D hidden size, F MLP size, N query heads, K key/value
heads, H head dim, V vocabulary.

This file is the family's description: :data:`TRAITS` (what each ``model_type`` fixes, one
:class:`Traits` row each; the record and the config fields every row shares are
``models.llama_traits``), :class:`LlamaConfig` with its Hugging Face conversion, and
:func:`register_llama_family`. The Flax modules (``Llama``, its layers) are ``models.llama_layers``.
The model knows nothing of speculation: it maps ``tokens: i32[B, T]`` and a ``KVCache`` to ``logits:
f32[B, T, V]`` and the cache with the T new entries written at each row's own offset
``cache.lengths[b]``. The layers are unrolled, each with its own parameters (``layers_{i}``) and cache
arrays, or scanned (``scan_layers``: ``layers`` stacked ``[L, ...]``, a stacked cache;
``models.common.run_layers``; not for models that alternate sliding and global layers).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import jax.numpy as jnp

from bass_jax.models import decoder_config
from bass_jax.models import family
from bass_jax.models import llama_layers
from bass_jax.models import llama_traits
from bass_jax.models.llama_traits import Traits
from bass_jax.models import rope as rope_lib

SLIDING, FULL = "sliding_attention", "full_attention"

TRAITS = {
    "llama": Traits("LlamaForCausalLM", frozenset({"attention_bias", "mlp_bias", "pretraining_tp"}),
                    eagle_target=True, gguf_architectures=("llama",)),
    "qwen2": Traits("Qwen2ForCausalLM", llama_traits.QWEN_WINDOW, qkv_bias=True, eagle_target=True,
                    gguf_architectures=("qwen2",)),
    "mistral": Traits("MistralForCausalLM", frozenset({"sliding_window"}), window_everywhere=True,
                      eagle_target=True),
    "qwen3": Traits("Qwen3ForCausalLM", llama_traits.QWEN_WINDOW | {"attention_bias"}, qk_norm="rms",
                    eagle_target=True, gguf_architectures=("qwen3",)),
    "gemma2": Traits("Gemma2ForCausalLM", llama_traits.GEMMA_FIELDS, gemma=True,
                     ignored=frozenset({"cache_implementation"}), attention_softcap=True,
                     gguf_architectures=("gemma2",)),
    "gemma3_text": Traits(
        "Gemma3ForCausalLM", llama_traits.GEMMA_FIELDS | {"rope_local_base_freq", "sliding_window_pattern"},
        qk_norm="gemma", gemma=True,
        ignored=frozenset({"cache_implementation", "_sliding_window_pattern"}), partial_rotary=True,
        wrapper_types=("gemma3",), gguf_architectures=("gemma3",)),
    # Phi-3-mini and Phi-4-mini write the required fields for their remote code; transformers' Phi3
    # has no biases.
    "phi3": Traits("Phi3ForCausalLM", frozenset({"original_max_position_embeddings",
                                                  "sliding_window"}),
                   window_everywhere=True, fused=True, partial_rotary=True, eagle_target=True,
                   required=(("attention_bias", False), ("mlp_bias", False), ("lm_head_bias", False),
                             ("full_attn_mod", 1), ("interpolate_factor", 1)),
                   gguf_architectures=("phi3",)),
}
# The config fields some branch of the port reads: what a registered family's row may name.
_PORTED_FIELDS = llama_traits.COMMON_FIELDS.union(*(traits.fields for traits in TRAITS.values()))
# The families built in, whose configs save in transformers' format whatever their traits.
_BUILT_IN = frozenset(TRAITS)


@dataclasses.dataclass(frozen=True)
class LlamaConfig(decoder_config.CacheFromShape):
  """Architecture of a Llama-family decoder, with transformers' config field names.

  Attributes beyond HF's ``LlamaConfig``:
    model_type: one of :data:`TRAITS`: the HF family it converts to and from, and its fixed traits.
    qkv_bias: bias on the q, k and v projections only (Qwen2); ``attention_bias`` (Llama, Qwen3,
      Gemma) puts one on the output projection too.
    sliding_window: the window: a query at position p attends to positions ``> p - window`` (None: the
      whole prefix), on every layer (Mistral, Phi-3) or on those ``layer_types`` marks sliding.
    layer_types: ``"sliding_attention"`` or ``"full_attention"`` per layer (Gemma 2 and 3, Qwen with
      ``use_sliding_window``); None: every layer alike.
    rope_scaling: the rotary embedding of the (global) layers when it is not plain rotary over the
      whole head with ``rope_theta`` (``models.rope.Rotary``: scaling, partial rotary); None: plain.
    local_rope: the rotary embedding of the sliding layers when it differs (Gemma 3's local base).
    query_pre_attn_scalar: Gemma's score scale ``query_pre_attn_scalar ** -0.5`` (None: ``H ** -0.5``).
    attn_logit_softcapping, final_logit_softcapping: Gemma 2's soft caps ``cap * tanh(x / cap)`` of the
      attention scores and of the logits (None: none).

  Raises:
    ValueError: from ``__post_init__`` if a size is not positive, the heads do not divide, the head dim
      is odd, the activation is not the family's, the model type is unknown, a rotary's theta
      disagrees with ``rope_theta``, or ``layer_types`` does not name every layer.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  max_position_embeddings: int = 2048
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  mlp_bias: bool = False
  hidden_act: str = "silu"
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  model_type: str = "llama"
  qkv_bias: bool = False
  sliding_window: int | None = None
  layer_types: tuple[str, ...] | None = None
  rope_scaling: rope_lib.Rotary | None = None
  local_rope: rope_lib.Rotary | None = None
  query_pre_attn_scalar: float | None = None
  attn_logit_softcapping: float | None = None
  final_logit_softcapping: float | None = None

  FIELDS = decoder_config.FieldTable(
      num_layers="num_hidden_layers", max_positions="max_position_embeddings",
      num_heads="num_attention_heads", hidden_size="hidden_size", num_kv_heads="num_key_value_heads",
      head_dim="head_dim", mlp_width="intermediate_size")
  PARAM_AXES = llama_layers.PARAM_AXES  # how the parameters lie on a mesh (bass_jax.sharding)

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"LlamaConfig: num_attention_heads={self.num_attention_heads} is not a multiple of "
          f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention needs it)")
    if self.head_dim % 2:
      raise ValueError(f"LlamaConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
    if self.model_type not in TRAITS:
      raise ValueError(f"LlamaConfig.model_type must be one of {sorted(TRAITS)}, "
                       f"got {self.model_type!r}")
    if self.hidden_act != llama_traits.ported_activation(self.traits):
      raise ValueError(f"LlamaConfig.hidden_act={self.hidden_act!r} is not supported for "
                       f"{self.model_type}; it uses {llama_traits.ported_activation(self.traits)!r}")
    if self.sliding_window is not None and self.sliding_window < 1:
      raise ValueError(f"LlamaConfig.sliding_window must be >= 1 or None, got {self.sliding_window}")
    if self.layer_types is not None:
      object.__setattr__(self, "layer_types", tuple(self.layer_types))
      if (len(self.layer_types) != self.num_hidden_layers
          or not set(self.layer_types) <= {SLIDING, FULL}):
        raise ValueError(f"LlamaConfig.layer_types must name each of the {self.num_hidden_layers} "
                         f"layers {SLIDING!r} or {FULL!r}, got {self.layer_types}")
    for name in ("rope_scaling", "local_rope"):
      rotary = getattr(self, name)
      if rotary is not None and rotary.dim > self.head_dim:
        raise ValueError(f"LlamaConfig.{name} rotates {rotary.dim} channels of a {self.head_dim}-"
                         "channel head")
    if self.rope_scaling is not None and self.rope_scaling.theta != self.rope_theta:
      raise ValueError(f"LlamaConfig: rope_scaling.theta={self.rope_scaling.theta} differs from "
                       f"rope_theta={self.rope_theta}")
    self._freeze_eos()

  # -- the family's layers ----------------------------------------------------------------------------

  @property
  def traits(self) -> Traits:
    """What the ``model_type`` fixes (:data:`TRAITS`)."""
    return TRAITS[self.model_type]

  @property
  def rotary(self) -> rope_lib.Rotary:
    """The global layers' rotary embedding."""
    return self.rope_scaling or rope_lib.Rotary(theta=self.rope_theta, dim=self.head_dim,
                                                max_position_embeddings=self.max_position_embeddings)

  def is_sliding(self, layer: int) -> bool:
    """Whether layer ``layer`` attends through the sliding window."""
    if self.sliding_window is None:
      return False
    if self.layer_types is None:
      return self.traits.window_everywhere
    return self.layer_types[layer] == SLIDING

  @property
  def uniform_layers(self) -> bool:
    """Whether every layer is of one kind (a scanned layout needs it)."""
    return len({self.is_sliding(i) for i in range(self.num_hidden_layers)}) == 1

  def with_num_layers(self, num_layers: int) -> "LlamaConfig":
    """The same config with its first ``num_layers`` layers (their ``layer_types`` too)."""
    types = None if self.layer_types is None else tuple(self.layer_types[:num_layers])
    if types is not None and len(types) < num_layers:
      raise ValueError(f"with_num_layers({num_layers}): layer_types names {len(self.layer_types)} "
                       "layers; name the new ones with dataclasses.replace(config, layer_types=...)")
    return dataclasses.replace(self, num_hidden_layers=num_layers, layer_types=types)

  @property
  def max_positions(self) -> int:
    """The context a decode may fill: ``max_position_embeddings``, or less where a length-dependent
    rotary is exact only inside its original length (``longrope``: ``models.rope``)."""
    return min(self.max_position_embeddings, self.rotary.exact_context,
               *(() if self.local_rope is None else (self.local_rope.exact_context,)))

  @property
  def context_note(self) -> str | None:
    """Why :attr:`max_positions` is below ``max_position_embeddings``, for error messages (None when
    it is not)."""
    if self.max_positions == self.max_position_embeddings:
      return None
    return (f"{self.model_type}'s longrope rotary switches to its long factors past "
            f"original_max_position_embeddings={self.max_positions}, which would make the cached "
            "keys depend on how the text was chunked; decodes stay inside it (bass_jax.models.rope)")

  # -- the DecoderConfig protocol ---------------------------------------------------------------------

  def make_module(self, *, attention_impl: str = "reference", dtype: Any = jnp.float32,
                  scan_layers: bool = False) -> llama_layers.Llama:
    """The Flax module for this config; ``attention_impl`` names an entry of the attention registry."""
    return llama_layers.Llama(self, attention_impl=attention_impl, dtype=dtype, scan_layers=scan_layers)


  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    q_out, kv_out = self.num_attention_heads * h, self.num_key_value_heads * h
    attn = d * (q_out + 2 * kv_out) + q_out * d
    if self.attention_bias or self.qkv_bias:
      attn += q_out + 2 * kv_out
    if self.attention_bias:
      attn += d
    if self.traits.qk_norm:
      attn += 2 * h
    mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
    per_layer = attn + mlp + (4 if self.traits.gemma else 2) * d
    head = 0 if self.tie_word_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_hidden_layers * per_layer + d + head

  # -- Hugging Face conversion ------------------------------------------------------------------------

  @classmethod
  def from_hf_config(cls, hf_config: Any) -> "LlamaConfig":
    """Converts a transformers config of the family (``LlamaConfig``, ``Qwen2Config``,
    ``MistralConfig``, ``Qwen3Config``, ``Gemma2Config``, ``Gemma3TextConfig``, ``Phi3Config``) or its
    dict (``config.json``).

    Every field is accounted for: mapped, known to be irrelevant to inference, or rejected. The values
    are read through transformers' own config class, so absent fields take transformers' defaults and
    both rotary spellings (4.x's ``rope_scaling`` + ``rope_theta``, 5.x's ``rope_parameters``, per layer
    type where the model has two) arrive standardized (``models.rope.from_parameters``).

    Raises:
      ValueError: another ``model_type``, an unknown field (named), or an unsupported value
        (``pretraining_tp != 1``, bidirectional attention, conflicting rope thetas, a rope type or
        parameter the port does not implement, ``partial_rotary_factor < 1`` for a family without
        ``Traits.partial_rotary``, a yarn ``truncate`` inside one layer type's rotary parameters).
    """
    fields = dict(hf_config if isinstance(hf_config, dict) else hf_config.to_dict())
    model_type = fields.get("model_type", "llama")
    if model_type not in TRAITS:
      raise ValueError(f"model_type {model_type!r} is not one of {tuple(TRAITS)}")
    rope_lib.check_spellings(fields)
    traits = TRAITS[model_type]
    known = llama_traits.COMMON_FIELDS | traits.fields
    required: dict[str, Any] = {"pretraining_tp": 1, "use_bidirectional_attention": False,
                                **dict(traits.required)}
    rope_lib.check_no_per_type_truncate(fields)
    decoder_config.parse_hf_fields(dict(fields, model_type=model_type), model_types=(model_type,),
                           known=known, ignored=traits.ignored, required=required)
    with _naming_derived_head_dim(fields.get("hidden_size"), fields.get("num_attention_heads"),
                                  fields.get("head_dim")):
      hf = decoder_config.transformers_config(model_type, fields)
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    kwargs = dict(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size, num_hidden_layers=hf.num_hidden_layers,
        num_attention_heads=heads, num_key_value_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=head_dim, max_position_embeddings=hf.max_position_embeddings,
        rms_norm_eps=float(hf.rms_norm_eps), tie_word_embeddings=bool(hf.tie_word_embeddings),
        attention_bias=bool(getattr(hf, "attention_bias", False)) and not traits.qkv_bias,
        mlp_bias=bool(getattr(hf, "mlp_bias", False)),
        hidden_act=llama_traits.activation(hf, model_type, traits),
        bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id,
        model_type=model_type, qkv_bias=traits.qkv_bias)
    kwargs["sliding_window"] = getattr(hf, "sliding_window", None)  # Llama's config has none
    types = tuple(getattr(hf, "layer_types", None) or ())
    if SLIDING in types:
      kwargs["layer_types"] = types
    elif not traits.window_everywhere:
      kwargs["sliding_window"] = None  # no layer slides
    if traits.gemma:
      kwargs["query_pre_attn_scalar"] = hf.query_pre_attn_scalar
      kwargs["attn_logit_softcapping"] = (hf.attn_logit_softcapping if traits.attention_softcap
                                          else None)
      kwargs["final_logit_softcapping"] = hf.final_logit_softcapping
    rotary = dict(head_dim=head_dim, max_position_embeddings=hf.max_position_embeddings)
    params = dict(hf.rope_parameters)
    with _naming_derived_head_dim(hf.hidden_size, heads, getattr(hf, "head_dim", None)):
      if FULL in params or SLIDING in params:
        full = rope_lib.from_parameters(params[FULL], where=f"rope_parameters[{FULL!r}]", **rotary)
        local = rope_lib.from_parameters(params[SLIDING], where=f"rope_parameters[{SLIDING!r}]",
                                         **rotary)
        kwargs["local_rope"] = None if local == full else local
      else:
        full = rope_lib.from_parameters(params, **rotary)
    if not traits.partial_rotary and any(
        r.dim != head_dim for r in (full, kwargs.get("local_rope") or full)):
      raise ValueError(f"{model_type}: partial_rotary_factor < 1 is not read by transformers' "
                       f"{model_type} model (it rotates the whole head); remove it")
    window = kwargs.get("sliding_window")
    if window is not None and window >= hf.max_position_embeddings and (
        kwargs.get("local_rope") is None):
      # It never masks a position of the context (Phi-3.5's 262144). Gemma 3's sliding layers keep
      # theirs: the window also marks the layers that take the local rotary.
      kwargs["sliding_window"] = None
      kwargs.pop("layer_types", None)
    kwargs["rope_theta"] = full.theta
    kwargs["rope_scaling"] = None if full == rope_lib.Rotary(
        theta=full.theta, dim=head_dim, max_position_embeddings=hf.max_position_embeddings) else full
    return cls(**kwargs)

  def to_hf_config(self):
    """The equivalent transformers config: transformers' config class of the ``model_type``
    (``AutoConfig.for_model``), given the common fields and those the family's :class:`Traits` row
    reads, in the forms that class takes, as its own defaults show them: a ``head_dim`` field or one
    derived from ``hidden_size / num_attention_heads``; rotary parameters for all layers or per layer
    type (Gemma 3's); Gemma's ``hidden_activation``. No branch names a family.

    Raises:
      ValueError: a value the family's config cannot express (q/k/v-only bias where the family has
        none or the reverse; a field its row does not read, such as a Llama's window or layer types
        or a Mistral's MLP bias; a Gemma field outside Gemma; a local rotary where the class has one
        rotary; a head size the class derives otherwise), a family registered with Gemma's traits
        (its names differ: orbax only), or transformers knowing no config class of the
        ``model_type``.
    """
    import transformers  # pylint: disable=g-import-not-at-top

    traits = self.traits
    if traits.gemma and self.model_type not in _BUILT_IN:
      raise ValueError(f"{self.model_type}: saving a registered family with Gemma's traits is not "
                       "supported (its config names differ); save it in orbax format")
    if self.qkv_bias != traits.qkv_bias:
      raise ValueError(f"a {self.model_type} config has {'' if traits.qkv_bias else 'no '}"
                       "q/k/v-only bias")
    fields = self.hf_fields()
    for name in ("qkv_bias", "rope_theta", "rope_scaling", "local_rope", "layer_types"):
      fields.pop(name)
    if not traits.gemma:
      for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
        if fields.pop(name) is not None:
          raise ValueError(f"{name} is a Gemma field; {self.model_type} has none")
    else:
      fields["hidden_activation"] = fields.pop("hidden_act")
    default = transformers.AutoConfig.for_model(self.model_type)
    rope = rope_lib.to_parameters(self.rotary, self.head_dim)
    if FULL in (getattr(default, "rope_parameters", None) or {}):  # one rotary per layer type
      rope = {FULL: rope, SLIDING: rope_lib.to_parameters(self.local_rope or self.rotary, self.head_dim)}
    elif self.local_rope is not None:
      raise ValueError(f"{type(default).__name__} has one rotary for every layer; a separate one for "
                       "the sliding layers is Gemma 3's")
    if not hasattr(default, "head_dim"):
      if self.head_dim != self.hidden_size // self.num_attention_heads:
        raise ValueError(f"{type(default).__name__} derives head_dim from hidden_size / "
                         "num_attention_heads")
      fields.pop("head_dim")
    optional = {"attention_bias": fields.pop("attention_bias"), "mlp_bias": fields.pop("mlp_bias"),
                "sliding_window": fields.pop("sliding_window"),
                "layer_types": None if self.layer_types is None else list(self.layer_types)}
    for name, value in optional.items():
      if name in traits.fields:
        fields[name] = value
      elif value:
        raise ValueError(f"{self.model_type} has no {name} (its Traits row does not read it)")
    if "use_sliding_window" in traits.fields:  # Qwen2/Qwen3 switch the window on beside its size
      fields["use_sliding_window"] = self.sliding_window is not None
    if "original_max_position_embeddings" in traits.fields:  # Phi-3's longrope base context
      fields["original_max_position_embeddings"] = rope.get("original_max_position_embeddings",
                                                            self.max_position_embeddings)
    return transformers.AutoConfig.for_model(self.model_type, **fields, rope_parameters=rope)


@contextlib.contextmanager
def _naming_derived_head_dim(hidden_size: Any, heads: Any, head_dim: Any) -> Iterator[None]:
  """Re-raises a ``ValueError`` of the body with how ``head_dim`` derives, where a config gives none
  and the one it derives is odd, under 2 or not a whole share of the width (the likely cause, such
  as a rotary table of no channels); otherwise as it is."""
  try:
    yield
  except ValueError as e:
    if head_dim or not all(isinstance(v, int) and v >= 1 for v in (hidden_size, heads)) or (
        hidden_size % heads == 0 and (hidden_size // heads) % 2 == 0):
      raise
    raise type(e)(f"{e} (head_dim is hidden_size {hidden_size} // num_attention_heads {heads} = "
                  f"{hidden_size // heads}, as the config gives none)") from e


def register_llama_family(model_type: str, traits: Traits) -> Traits:
  """Adds a Llama-like family: ``traits`` as the :data:`TRAITS` row of ``model_type``, and its
  ``family.Family`` record, so that ``load_model``, ``save_model``, the preflight, the layer layout and
  (with ``eagle_target``) EAGLE drafts take its checkpoints (docs/extending.md, "Your own model
  family"). The built-in rows register through it at import.

  Args:
    model_type: the Hugging Face ``config.json`` ``model_type`` (``"ministral"``).
    traits: what the ``model_type`` fixes (:class:`Traits`); the config fields it names beyond the
      common ones must be fields :class:`LlamaConfig` reads.

  Returns:
    ``traits``.

  Raises:
    ValueError: ``traits`` is not a :class:`Traits`; its ``fields`` name a config field the port does
      not read; ``attention_softcap`` without ``gemma``; ``model_type`` has another row already (the
      same row again is allowed); whatever ``family.register_family`` refuses (a GGUF name or
      wrapper type of another family).
  """
  if not isinstance(traits, Traits):
    raise ValueError(f"register_llama_family({model_type!r}): traits must be a llama.Traits, got "
                     f"{type(traits).__name__}")
  unread = sorted(set(traits.fields) - _PORTED_FIELDS)
  if unread:
    raise ValueError(f"register_llama_family({model_type!r}): the port reads no field {unread} (a "
                     f"config carrying it would be read wrong); the fields it reads beyond the "
                     f"common ones: {sorted(_PORTED_FIELDS - llama_traits.COMMON_FIELDS)}")
  if traits.attention_softcap and not traits.gemma:
    raise ValueError(f"register_llama_family({model_type!r}): attention_softcap is one of Gemma's "
                     "traits; set gemma=True with it, or leave it False")
  old = TRAITS.get(model_type)
  if old is not None and old != traits:
    raise ValueError(f"model_type {model_type!r} already has a Traits row ({old}); give yours another "
                     "model_type")
  family.register_family(family.Family(
      model_type, LlamaConfig, traits.architecture, eagle_target=traits.eagle_target,
      wrapper_types=traits.wrapper_types, gguf_architectures=traits.gguf_architectures))
  TRAITS[model_type] = traits
  return traits


for _model_type, _traits in tuple(TRAITS.items()):
  register_llama_family(_model_type, _traits)
