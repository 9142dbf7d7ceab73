"""An EAGLE-style feature draft: one decoder layer that extrapolates the target's own features.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", §3;
docs/draft.md, "The EAGLE feature draft") drafts at the level of the target's *features*, the vector its
LM head multiplies (``models.common.FEATURES``), rather than at the level of tokens:

* at draft position i it reads the pair ``(f_i, x_{i+1})``: the target's feature at position i and the
  embedding of the token that followed (the token removes the feature's sampling uncertainty, §3.1);
* ``fc(concat(embed(x_{i+1}), f_i))`` (a ``[2E, E]`` projection with bias) goes through one Llama decoder
  layer (with its own ragged KV cache) and comes out as ``f̂_{i+1}``, its prediction of the target's
  next feature;
* the target's own LM head turns ``f̂_{i+1}`` into a distribution over ``x_{i+2}``; drafting continues
  autoregressively on the draft's own ``f̂`` and its drawn tokens.

The embedding and the LM head are the target's, frozen and not stored with the draft. The head may be
restricted to a *draft vocabulary* of V' tokens, the corpus's most frequent (FR-Spec, Zhao et al. 2025):
the draft's distribution is then 0 outside them, which leaves speculative sampling exact (its ``q`` may
be anything) and cuts the head's cost by ``V / V'``. ``vocab_ids`` are sorted by frequency, so a prefix
of them is the best smaller draft vocabulary.

Unlike EAGLE-1's layer, the decoder layer keeps its input RMSNorm (as EAGLE-3's does).

EAGLE-3's *fused features* (Li et al. 2025, §3.3) are an option (``fused_layers``): the first draft after
the text reads ``g = fuse(concat(rms(h_a), rms(h_b), …, f))`` instead of ``f``, where ``h_a, h_b`` are the
outputs of the target's decoder layers ``a, b`` (a low and a middle one), normalized without weights (so
that each enters at one scale, whatever the residual stream's magnitude), and ``fuse`` is a ``[(n+1)E, E]``
projection initialized to pass ``f`` through, so that an untrained fusion is the plain draft. Drafts
after the first read the draft's own predicted features (width E), as before; the module tells them
apart by width.

The Flax modules (``EagleDraft``, ``Eagle3Layer``) are ``models.eagle_layers``; its initial parameters
(random, or grown from a shallower draft) ``models.eagle_init``; this file holds what a draft is: its
config and checks against a target, its parameters' draws (``draw_draft_params``), binding and
forward.

Files (``checkpoints.eagle_files``: ``save_eagle``, ``load_eagle``; ``bass_jax.save_model``): ``config.json``
(``{"model_type": "bass_eagle", "draft_vocab_size": V', "layer": <transformers LlamaConfig fields>}``)
and either ``model.safetensors`` (parameters by their ``/``-joined Flax path, and ``vocab_ids``) or an
orbax ``params/`` (``{"draft": …, "vocab_ids": …}``), each written atomically.

Axes: B batch, T positions, E feature size (the target's hidden size), V vocabulary, V' draft vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bass_jax import sharding as sharding_lib
from bass_jax.cache import KVCache, KVUpdate
from bass_jax.models import common
from bass_jax.models import family as family_lib
from bass_jax.models import llama_layers
from bass_jax.models.llama import LlamaConfig
from bass_jax.models.eagle_layers import EagleDraft
from bass_jax.sharding import EMBED, NORMS, VOCAB, dense

MODEL_TYPE = "bass_eagle"
# The architectures an EagleConfig describes: this project's draft ("bass": fc with bias over
# (embedding, feature), full decoder layers, optional fusion), EAGLE-1/2's published one ("eagle1": its
# first layer has no input norm, fc may have no bias) and EAGLE-3's ("eagle3": fc over tapped target
# layers, one layer attending over (normed embedding, normed hidden), its own final norm, head and
# draft-to-target vocabulary map). bass_jax.checkpoints.eagle_formats reads the published files.
KINDS = ("bass", "eagle1", "eagle3")
DEFAULT_TAPS = 3  # an EAGLE-3 draft without explicit taps reads three target layers (resolve_taps)


def resolve_taps(config: "EagleConfig", target_config: Any) -> "EagleConfig":
  """An EAGLE-3 draft's taps fixed for its target: the config's, or the default of EAGLE, vLLM, SGLang
  and tpu-inference, the inputs of layers ``(2, L // 2, L - 3)``, i.e. the outputs of layers
  ``(1, L // 2 - 1, L - 4)`` (L the target's layers). Other drafts come back unchanged.

  Raises:
    ValueError: a target too shallow for three distinct default taps (L < 7), or a tap it lacks.
  """
  if config.kind != "eagle3":
    return config
  layers = target_config.num_hidden_layers
  taps = config.taps
  if not taps:
    taps = tuple(sorted({1, layers // 2 - 1, layers - 4}))
    if len(taps) != DEFAULT_TAPS or taps[0] < 0:
      raise ValueError(f"an EAGLE-3 draft's default taps (the inputs of layers 2, L // 2 and L - 3) are "
                       f"not three distinct layers of a {layers}-layer target; give the draft explicit "
                       "eagle_aux_hidden_state_layer_ids")
  bad = [i for i in taps if not 0 <= i < layers]
  if bad:
    raise ValueError(f"the EAGLE-3 draft taps layers {list(taps)} (outputs, 0-based) of a "
                     f"{layers}-layer target: {bad} do not exist")
  return dataclasses.replace(config, taps=taps)


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  """Architecture of an EAGLE feature draft.

  Attributes:
    layer: the decoder layers' shapes as a :class:`LlamaConfig` (hidden size = the target's feature
      size E; ``num_hidden_layers`` draft layers, 1 in EAGLE; ``vocab_size`` the target's V).
    draft_vocab_size: V', the tokens the draft's head scores (``<= V``).
    fused_layers: the target's decoder layers (0-based) whose outputs the first draft fuses with the
      feature (EAGLE-3); empty for EAGLE's feature alone.
    own_embedding: the draft carries its own token embedding ``embed_tokens [V, E]``, used instead of
      the target's (a published EAGLE-1 Vicuna draft's frozen copy, a speculators-layout EAGLE-3
      draft's: ``checkpoints.eagle_formats``); saved and read back with the draft.

  Raises:
    ValueError: from ``__post_init__`` when ``draft_vocab_size`` is not in ``[1, V]`` or a fused layer
      is negative.
  """

  layer: LlamaConfig
  draft_vocab_size: int
  fused_layers: tuple[int, ...] = ()
  kind: str = "bass"
  fc_bias: bool = True
  taps: tuple[int, ...] = ()
  tap_size: int | None = None
  norm_before_residual: bool = False
  own_embedding: bool = False
  model_type = MODEL_TYPE
  # How a draft as it runs (``bind``) lies on a mesh (bass_jax.sharding): its own layers and fc under
  # "draft/", the target's embedding, the head rows of the draft vocabulary (V' need not divide:
  # replicated) and their ids.
  PARAM_AXES = (
      *((f"draft/{pattern}", axes) for pattern, axes in llama_layers.LAYER_PARAM_AXES),
      *dense("draft/fc", None, EMBED),
      ("draft/fuse/kernel", (None, EMBED)),
      ("embedding", (VOCAB, EMBED)), ("head", (None, EMBED)),
      ("vocab_ids", (None,)),
      ("final_norm/eps", ()),  # EAGLE-3's own final norm (its scale is a norm like the others)
      # A published draft as loaded, before its bind: EAGLE-3's own head, a draft's own embedding.
      ("draft/lm_head", (None, EMBED)),
      ("draft/embed_tokens/embedding", (VOCAB, EMBED)),
      *NORMS,
  )

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"EagleConfig.kind must be one of {KINDS}, got {self.kind!r}")
    object.__setattr__(self, "taps", tuple(int(i) for i in self.taps))
    if self.taps and self.kind != "eagle3":
      raise ValueError("EagleConfig.taps: only an EAGLE-3 draft reads tapped target layers")
    if self.kind != "bass" and self.fused_layers:
      raise ValueError("EagleConfig.fused_layers is this project's fusion; a published EAGLE draft "
                       "has none")
    if not isinstance(self.draft_vocab_size, int) or not 1 <= self.draft_vocab_size <= self.vocab_size:
      raise ValueError(f"EagleConfig.draft_vocab_size must be an int in [1, {self.vocab_size}] (the "
                       f"target's vocabulary), got {self.draft_vocab_size!r}")
    object.__setattr__(self, "fused_layers", tuple(int(i) for i in self.fused_layers))
    if any(i < 0 for i in self.fused_layers):
      raise ValueError(f"EagleConfig.fused_layers must be target layer indices >= 0, got "
                       f"{self.fused_layers}")

  @property
  def vocab_size(self) -> int:
    return self.layer.vocab_size

  @property
  def eos_token_id(self):
    return self.layer.eos_token_id

  @property
  def bos_token_id(self):
    return self.layer.bos_token_id

  @property
  def feature_size(self) -> int:
    return self.layer.hidden_size

  @property
  def num_layers(self) -> int:
    return self.layer.num_hidden_layers

  @property
  def input_feature_size(self) -> int:
    """Width of the target's features the first draft reads: ``(len(fused_layers) + 1) * E``; an
    EAGLE-3 draft's: ``len(taps) * T`` (T the target's hidden size)."""
    if self.kind == "eagle3":
      return (len(self.taps) or DEFAULT_TAPS) * (self.tap_size or self.feature_size)
    return (len(self.fused_layers) + 1) * self.feature_size

  @property
  def target_taps(self) -> tuple[int, ...]:
    """The target layers (0-based; their outputs, before the final norm) whose hidden states the
    decode keeps for this draft, concatenated in this order."""
    return self.taps if self.kind == "eagle3" else self.fused_layers

  @property
  def reads_final_feature(self) -> bool:
    """Whether the decode keeps the target's final features (the LM head's input) after the taps."""
    return self.kind != "eagle3"

  @property
  def max_positions(self) -> int:
    """This project's draft: its layer's (the target's) context. A published draft's config names
    the context it was trained at (SafeAILab's 2,048), which its runtimes do not enforce: its
    rotary positions go on, so the target's context rules."""
    return self.layer.max_positions if self.kind == "bass" else 1 << 30

  def init_cache(self, batch_size: int, max_len: int, dtype: Any = jnp.float32,
                 fill_value: float = 0.0, scanned: bool = False) -> KVCache:
    """The draft's own ragged cache (as :meth:`LlamaConfig.init_cache`; its layers are never scanned).

    Raises:
      ValueError: ``scanned=True``.
    """
    if scanned:
      raise ValueError("an EAGLE draft's layers are unrolled; its cache cannot be scanned")
    return self.layer.init_cache(batch_size, max_len, dtype, fill_value)

  def with_draft_vocab_size(self, size: int) -> "EagleConfig":
    """The same draft scoring only the ``size`` most frequent of its tokens (a prefix of vocab_ids)."""
    return dataclasses.replace(self, draft_vocab_size=size)

  def logical_sizes(self) -> dict[str, int]:
    """``bass_jax.sharding.logical_sizes``: the draft layers' (heads, KV heads, MLP, vocabulary)."""
    return sharding_lib.logical_sizes(self.layer)

  def num_params(self) -> int:
    """The draft's own parameters: the fc projection and the layers, and where it has them its own
    head (EAGLE-3) and token embedding (``own_embedding``); otherwise those are the target's."""
    shapes = jax.eval_shape(lambda: draw_draft_params(self, jnp.float32, jax.random.key(0)))
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))

  @classmethod
  def for_target(cls, target_config: Any, *, draft_vocab_size: int, num_layers: int = 1,
                 fused_layers: tuple[int, ...] = ()) -> "EagleConfig":
    """The draft shaped after a Llama-family target: its hidden size, heads, MLP and rotary settings.

    Raises:
      ValueError: a target that is not of the Llama family (its features and head are read as Llama's);
        a fused layer the target does not have.
    """
    check_target(target_config)
    if any(not 0 <= i < target_config.num_hidden_layers for i in fused_layers):
      raise ValueError(f"fused_layers {tuple(fused_layers)} must lie in [0, "
                       f"{target_config.num_hidden_layers}) (the target's decoder layers)")
    return cls(dataclasses.replace(target_config, num_hidden_layers=num_layers), draft_vocab_size,
               tuple(fused_layers))

  def to_json(self) -> dict[str, Any]:
    """The ``config.json`` fields: model type, V' and the layer as transformers' LlamaConfig dict."""
    fields = {"model_type": MODEL_TYPE, "draft_vocab_size": self.draft_vocab_size,
              "layer": self.layer.to_hf_config().to_dict()}
    if self.fused_layers:
      fields["fused_layers"] = list(self.fused_layers)
    if self.kind != "bass":
      fields.update(kind=self.kind, fc_bias=self.fc_bias, taps=list(self.taps),
                    tap_size=self.tap_size, norm_before_residual=self.norm_before_residual)
    if self.own_embedding:
      fields["own_embedding"] = True
    return fields

  @classmethod
  def from_json(cls, fields: dict[str, Any]) -> "EagleConfig":
    """The inverse of :meth:`to_json` (extra fields, such as provenance, are ignored).

    Raises:
      KeyError: a missing ``layer`` or ``draft_vocab_size``. ValueError: as the configs' checks.
    """
    return cls(LlamaConfig.from_hf_config(fields["layer"]), int(fields["draft_vocab_size"]),
               tuple(fields.get("fused_layers", ())), kind=fields.get("kind", "bass"),
               fc_bias=bool(fields.get("fc_bias", True)), taps=tuple(fields.get("taps", ())),
               tap_size=fields.get("tap_size"),
               norm_before_residual=bool(fields.get("norm_before_residual", False)),
               own_embedding=bool(fields.get("own_embedding", False)))


def target_types() -> tuple[str, ...]:
  """The targets whose features and head an EAGLE draft reads as it computes them: the families marked
  ``eagle_target`` (``models.family``; Llama-like models whose embedding is unscaled and whose logits
  are uncapped, not Gemma's sqrt(D) and soft caps)."""
  return tuple(f.model_type for f in family_lib.families() if f.eagle_target)


def check_target(target_config: Any) -> None:
  """Raises ValueError unless an EAGLE draft can read the target (:func:`target_types`)."""
  model_type = getattr(target_config, "model_type", type(target_config).__name__)
  if not isinstance(target_config, LlamaConfig) or model_type not in target_types():
    raise ValueError(f"an EAGLE draft needs a target of {', '.join(target_types())} (Gemma's scaled "
                     f"embeddings and capped logits are not read yet), got model_type {model_type!r}")


def check_pair(hidden_size: int, vocab_size: int, fused_layers: tuple[int, ...], *,
               target_model_type: str, target_hidden_size: int, target_vocab_size: int,
               target_layers: int, name: str = "the EAGLE draft") -> None:
  """Checks, from the two configs alone, that an EAGLE draft reads this target: a Llama-family target
  (its features and head are read as Llama's), features of the target's width, the target's
  vocabulary, and fused layers the target has. ``bass_jax.preflight`` calls it on ``config.json``
  fields before any weight is read; ``load_draft`` and ``generate`` on loaded configs.

  Args:
    hidden_size, vocab_size, fused_layers: the draft's feature width, its layer's vocabulary (the
      target's it was trained for) and the target layers it fuses.
    target_model_type, target_hidden_size, target_vocab_size, target_layers: the target's.
    name: how the draft is named in the error.

  Raises:
    ValueError: the first mismatch, naming the field and both values.
  """
  if target_model_type not in target_types():
    raise ValueError(f"{name} needs a target of {', '.join(target_types())} (Gemma's scaled embeddings "
                     f"and capped logits are not read yet), got model_type {target_model_type!r}")
  if hidden_size != target_hidden_size:
    raise ValueError(f"{name} reads features of width hidden_size={hidden_size}, and the target's "
                     f"are {target_hidden_size} wide: it was trained for another target")
  if vocab_size != target_vocab_size:
    raise ValueError(f"{name} has vocab_size={vocab_size}, the target {target_vocab_size}: it was "
                     "trained for another target")
  bad = [i for i in fused_layers if not 0 <= i < target_layers]
  if bad:
    raise ValueError(f"{name} fuses the target's layers {list(fused_layers)}, and the target has "
                     f"{target_layers} (layers {bad} do not exist)")


def check_pair_configs(config: "EagleConfig", target_config: Any, name: str = "the EAGLE draft"
                       ) -> None:
  """:func:`check_pair` for loaded configs.

  Raises:
    ValueError: as :func:`check_pair`.
  """
  if config.kind == "eagle3":
    config = resolve_taps(config, target_config)
  check_pair(config.tap_size or config.feature_size, config.layer.vocab_size,
             tuple(config.target_taps),
             target_model_type=getattr(target_config, "model_type", type(target_config).__name__),
             target_hidden_size=getattr(target_config, "hidden_size", -1),
             target_vocab_size=target_config.vocab_size,
             target_layers=getattr(target_config, "num_hidden_layers", 0), name=name)


def draw_draft_params(config: EagleConfig, dtype: Any, key: jax.Array) -> dict[str, Any]:
  """A draft's random parameters, traced as they are drawn: ``models.eagle_init.init_draft_params``
  jits it once per config; under ``jax.eval_shape`` it gives the parameters' shapes (what
  :meth:`EagleConfig.num_params` counts).

  Returns:
    ``fc``, ``layers_*`` and ``fuse`` with fused layers (Flax's default initializers, the fusion's
    passing ``f`` through); an EAGLE-3 draft's ``lm_head [V', E]`` and final ``norm``; with
    ``own_embedding``, ``embed_tokens {"embedding" [V, E]}`` (standard normal); arrays in ``dtype``.
  """
  module = EagleDraft(config, dtype=dtype)
  tokens = jnp.zeros((1, 1), jnp.int32)
  embedding = jnp.zeros((config.vocab_size, config.feature_size), dtype)
  features = jnp.zeros((1, 1, config.input_feature_size), dtype)
  if config.kind == "eagle3":
    key, head_key = jax.random.split(key)
  if config.own_embedding:
    key, embed_key = jax.random.split(key)
  params = module.init(key, tokens, features, embedding)["params"]
  if config.kind == "eagle3":  # its own head over the draft vocabulary and final norm
    e = config.feature_size
    params = {**params,
              "lm_head": nn.initializers.lecun_normal()(head_key, (config.draft_vocab_size, e), dtype),
              "norm": {"scale": jnp.ones((e,), dtype)}}
  if config.own_embedding:
    params = {**params, "embed_tokens": {"embedding": nn.initializers.normal(1.0)(
        embed_key, (config.vocab_size, config.feature_size), dtype)}}
  return params


def lm_head_matrix(target_config: Any, target_params: Any) -> jax.Array:
  """The target's LM head as ``[V, E]`` rows (its embedding when tied).

  Raises:
    ValueError: a target outside the Llama family.
  """
  check_target(target_config)
  if target_config.tie_word_embeddings:
    return target_params["embed_tokens"]["embedding"]
  return target_params["lm_head"].T


def bind(draft_params: Any, vocab_ids: jax.Array, target_config: Any, target_params: Any,
         draft_vocab_size: int, norm_eps: float | None = None) -> dict[str, Any]:
  """What the draft runs with: its trained weights and the target's frozen embedding and head rows.

  Args:
    draft_params: ``fc`` and ``layers_*`` (an EAGLE-3 draft's also ``lm_head`` and ``norm``; a
      published draft's own ``embed_tokens``). vocab_ids: ``i32[>= V']`` draft vocabulary, most frequent
      first (an EAGLE-3 draft's: the target ids of its draft ids). draft_vocab_size: V', the prefix of
      ``vocab_ids`` the head scores. norm_eps: an EAGLE-3 draft's final-norm epsilon.

  Returns:
    ``{"draft", "embedding" [V, E], "head" [V', E], "vocab_ids" i32[V']}``, and an EAGLE-3 draft's
    ``final_norm`` (:func:`own_weights` says which tensors are the draft's own).

  Raises:
    ValueError: an EAGLE-3 head without its final norm's epsilon; a target outside the Llama family.
  """
  ids = jnp.asarray(vocab_ids, jnp.int32)[:draft_vocab_size]
  own, replaced = own_weights(draft_params, draft_vocab_size, norm_eps)
  bound = {"draft": None if draft_params is None else own,
           "embedding": target_params["embed_tokens"]["embedding"], "vocab_ids": ids}
  if "head" not in replaced:
    bound["head"] = jnp.take(lm_head_matrix(target_config, target_params), ids, axis=0)
  return {**bound, **replaced}


def own_weights(draft_params: Any, draft_vocab_size: int, norm_eps: Any = None
                ) -> tuple[dict[str, Any], dict[str, Any]]:
  """Splits a draft's parameters into what its layers read and what replaces the target's tensors.

  Args:
    draft_params: ``fc``, ``layers_*`` (and ``fuse``); a published draft's own ``embed_tokens``; an
      EAGLE-3 draft's ``lm_head [>= V', E]`` and final ``norm {"scale" [E]}``. None: nothing.
    draft_vocab_size: V', the head rows kept. norm_eps: an EAGLE-3 draft's final-norm epsilon
      (unless its ``norm`` holds ``eps``).

  Returns:
    ``(own, replaced)``: the parameters the draft module reads, and ``embedding [V, E]`` (a published
    draft's own copy, which its runtimes use), ``head [V', E]`` and ``final_norm`` (EAGLE-3's) where
    the draft has them; :func:`bind` and ``feature_draft.bound_params`` put these in place of the
    target's.

  Raises:
    ValueError: an EAGLE-3 head without the final norm's epsilon.
  """
  own, replaced = dict(draft_params or {}), {}
  if "embed_tokens" in own:
    replaced["embedding"] = own.pop("embed_tokens")["embedding"]
  if "lm_head" in own:
    norm = dict(own.pop("norm"))
    if norm_eps is None and "eps" not in norm:
      raise ValueError("bind: an EAGLE-3 draft's final norm needs its epsilon (norm_eps, the layer "
                       "config's rms_norm_eps)")
    norm.setdefault("eps", jnp.asarray(norm_eps, jnp.float32))
    replaced.update(head=own.pop("lm_head")[:draft_vocab_size], final_norm=norm)
  return own, replaced


def forward(config: EagleConfig, params: dict[str, Any], tokens: jax.Array, features: jax.Array,
            cache: KVCache | None = None, *, dtype: Any = jnp.float32,
            attention_impl: str = "reference", sharding: sharding_lib.ShardingPlan | None = None,
            tree_mask: jax.Array | None = None) -> tuple[jax.Array, KVCache | KVUpdate]:
  """One draft forward over pairs ``(f_i, x_{i+1})`` (EAGLE §3.2).

  Args:
    params: :func:`bind`'s dict. tokens: ``i32[B, T]`` the tokens ``x_{i+1}``. features:
      ``[B, T, E]`` the features ``f_i`` (the target's, or the draft's own ``f̂_i``).
    cache: the draft's ragged cache, or None for a full causal forward (training).
    sharding: the draft's placement on a mesh, or None (one device); as ``common.forward``.
    tree_mask: ``bool[B, T, M]``: the pairs are the newest T of a draft tree's M nodes per row
      (EAGLE-2's tree growth, level by level), as ``common.forward``'s; None: a chain.

  Returns:
    ``(f̂ dtype[B, T, E], cache or KVUpdate)``: the predicted next features; the cache's lengths
    advance by T.
  """
  if sharding is not None:
    attention_impl = common.ShardedAttention(attention_impl, sharding)
  module = EagleDraft(config, attention_impl=attention_impl, dtype=jnp.dtype(dtype))
  return module.apply({"params": params["draft"]}, tokens, features, params["embedding"], cache,
                      tree_mask)


def draft_logits(params: dict[str, Any], features: jax.Array) -> jax.Array:
  """``f32[..., V']``: the head rows of the draft vocabulary applied to ``features [..., E]`` (the
  target's rows; an EAGLE-3 draft's own head after its final norm, ``params["final_norm"]``)."""
  if "final_norm" in params:
    norm = params["final_norm"]
    x32 = features.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + norm["eps"])
    features = norm["scale"] * normed.astype(features.dtype)
  return jnp.einsum("...E,VE->...V", features, params["head"].astype(features.dtype),
                    preferred_element_type=jnp.float32)


def to_full_vocab(logits: jax.Array, vocab_ids: jax.Array, vocab_size: int) -> jax.Array:
  """``f32[..., V']`` draft-vocabulary logits as ``f32[..., V]``, ``-inf`` outside the draft vocabulary."""
  full = jnp.full(logits.shape[:-1] + (vocab_size,), -jnp.inf, logits.dtype)
  return full.at[..., vocab_ids].set(logits)
