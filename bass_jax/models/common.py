"""Pieces every model family's module shares: the cached attention step, the layer loop, activations.

Every family (``llama.py``, ``opt.py``, ``codegen.py``, ``gpt2.py``) has a frozen config dataclass that
implements ``models.decoder_config.DecoderConfig`` (where the checked parsing of Hugging Face config
fields lives too) and a Flax module with the call signature
``(tokens i32[B, T], cache: KVCache | None, compute_logits=True, tree_mask=None) -> (logits f32[B, T,
V] | None, KVCache | KVUpdate)``: token t of row b sits at position ``cache.lengths[b] + t``, its K/V
are written at that slot of each layer's ``[B, K, S, H]`` cache, and it attends to every slot up to its
own; the returned cache has ``lengths + T``. With a ``tree_mask`` the tokens are nodes of a token tree
instead, placed by depth and attending to their ancestors (:func:`forward`). Without a cache (a full
forward, training, a prefill into a fresh cache) token t sits at position t, attends to tokens
``0 … t``, and the new K/V come back as a :class:`KVUpdate` for ``cache.append``.

By default layers are unrolled, each with its own parameters (``layers_0``, ``layers_1``, … as in
Hugging Face's ``model.layers.{i}``) and its own cache arrays: no layer reads its weights or its cache
through a slice of a stacked array, which XLA:CPU materializes as a copy inside a scanned loop
(``docs/design.md``, "Scanned layers": a scanned forward costs 0.90-1.42x an unrolled one here). Each
layer's call is wrapped in ``nn.jit``, so the layer is traced and lowered once; XLA still compiles
every unrolled layer, so compile time grows with depth. A model loaded with ``scan_layers=True`` runs
its layers in a ``lax.scan`` over weights and caches stacked ``[L, ...]`` instead
(:func:`run_layers`, :func:`stack_layers`): one layer compiled.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from bass_jax import sharding as sharding_lib
from bass_jax.cache import KVCache, KVUpdate, LayerSlice, write_entries
from bass_jax.models import attention as attention_lib
from bass_jax.models import attention_registry
from bass_jax.models.decoder_config import DecoderConfig, scanned_layers


def activation(name: str, field: str = "activation") -> Callable[[jax.Array], jax.Array]:
  """transformers' ``ACT2FN`` names -> functions.

  Args:
    name: the activation's name. field: the config field that holds it, for the message.

  Raises:
    ValueError: an activation the ports do not implement (the field and its value named).
  """
  table = {
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,
      "swish": jax.nn.silu,
      "gelu": lambda x: jax.nn.gelu(x, approximate=False),
      "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
      "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  }
  if name not in table:
    raise ValueError(f"{field}={name!r} is not supported; one of {sorted(table)}")
  return table[name]


@dataclasses.dataclass(frozen=True)
class ShardedAttention:
  """An attention implementation run per shard (``jax.shard_map``): each device writes its rows' (and
  heads') new K/V into its part of the cache and attends over it, with no communication.

  Models take it where they take an ``attention_impl`` name (``common.forward(..., sharding=plan)``
  passes it); hashable, so it is part of a compiled module's identity.

  Attributes:
    impl: the attention registry name run on every shard (``"reference"``, ``"pallas_pad"`` …).
    plan: the model's ``sharding.ShardingPlan``: rows over data; heads over model iff ``plan.kv_sharded``
      (else every model shard computes all heads of its rows).
  """

  impl: str
  plan: sharding_lib.ShardingPlan

  def per_shard(self, write_and_attend):
    """``write_and_attend`` (``common.cached_attention``'s: ``(q [B, T, N, H], k, v [B, T, K, H],
    k_cache, v_cache [B, K, S, H], cache_lengths i32[B], *row_extras) -> (out [B, T, N, H], k_cache,
    v_cache)``) run on every device over its own rows, and heads where the plan splits them;
    ``row_extras`` (a tree mask ``bool[B, T, M]``) split over rows like the lengths.

    The returned function raises ValueError when B does not split over the data axis
    (``sharding.check_rows``).
    """
    heads = sharding_lib.MODEL if self.plan.kv_sharded else None
    tokens, cache = P(sharding_lib.DATA, None, heads, None), P(sharding_lib.DATA, heads, None, None)

    def run(q, k, v, k_cache, v_cache, cache_lengths, *row_extras):
      sharding_lib.check_rows(q.shape[0], self.plan.mesh, "the attention's batch")
      mapped = jax.shard_map(write_and_attend, mesh=self.plan.mesh,
                             in_specs=(tokens, tokens, tokens, cache, cache, P(sharding_lib.DATA))
                             + (P(sharding_lib.DATA),) * len(row_extras),
                             out_specs=(tokens, cache, cache), check_vma=False)
      return mapped(q, k, v, k_cache, v_cache, cache_lengths, *row_extras)

    return run


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, k_cache: jax.Array | None,
                     v_cache: jax.Array | None, cache_lengths: jax.Array | None,
                     attention_impl: str | ShardedAttention,
                     sm_scale: float | None = None, sliding_window: int | None = None,
                     logit_soft_cap: float | None = None, tree_mask: jax.Array | None = None):
  """Attends the T new tokens over this layer's cache (after writing them into it) or, without a cache,
  among themselves.

  Args:
    q: ``[B, T, N, H]``; k, v: ``[B, T, K, H]`` (rotary, if any, already applied).
    k_cache, v_cache: this layer's ``[B, K, S, H]`` cache, a :class:`LayerSlice` of a stacked one (a
      scanned layer), or None.
    cache_lengths: ``i32[B]`` valid cache slots per row before the new tokens (None without a cache).
    sm_scale: the scores' scale (None: ``1 / sqrt(H)``). sliding_window: the layer's window (None: the
      whole prefix). logit_soft_cap: Gemma 2's attention logit soft-capping, ``cap * tanh(s / cap)``
      on the scaled scores before the mask (None: none).
    attention_impl: a name in the attention registry, or a :class:`ShardedAttention` (that
      name run per shard of a mesh, writing and reading each device's part of the cache).
    tree_mask: ``bool[B, T, M]``: the T new tokens are the newest nodes of a token tree per row whose
      M nodes end the cache (``bass_jax.sampling.tree.ancestor_mask``), each attending to the cache's
      prefix and its own ancestors (``attention.reference_tree_attention`` and its kernel versions);
      None: causal.

  Returns:
    ``(out [B, T, N, H], k_out, v_out)``: with a cache, the cache arrays with the new entries written
    at slots ``cache_lengths[b] + t`` (written *before* the cache is read: XLA then updates it in
    place; a :class:`LayerSlice` comes back as one, its stack written); without one, the new tokens'
    ``k``, ``v`` themselves.

  Raises:
    ValueError: a ``tree_mask`` without a cache; a :class:`LayerSlice` with a sharded attention.
  """
  kwargs = {"sm_scale": sm_scale}
  if sliding_window is not None:
    kwargs["sliding_window"] = sliding_window
  if logit_soft_cap is not None:
    kwargs["logit_soft_cap"] = logit_soft_cap
  if k_cache is None:
    if tree_mask is not None:
      raise ValueError("a tree_mask needs a cache: a tree's nodes attend over a row's prefix")
    return attention_lib.causal_attention(q, k, v, **kwargs), k, v
  sharded = isinstance(attention_impl, ShardedAttention)
  name = attention_impl.impl if sharded else attention_impl
  attend = (attention_registry.get_attention(name) if tree_mask is None
            else attention_registry.get_tree_attention(name))

  def write_and_attend(q, k, v, k_cache, v_cache, cache_lengths, *mask):
    k_cache = write_entries(k_cache, k, cache_lengths)
    v_cache = write_entries(v_cache, v, cache_lengths)
    out = attend(q, k_cache, v_cache, cache_lengths + q.shape[1], *mask, **kwargs)
    return out, k_cache, v_cache

  if sharded:  # the same on every device, over its own rows (and heads) of the cache
    write_and_attend = attention_impl.per_shard(write_and_attend)
  mask = () if tree_mask is None else (tree_mask,)
  if isinstance(k_cache, LayerSlice):
    if sharded:
      raise ValueError("scanned layers (a stacked cache) do not run sharded; load the model with "
                       "scan_layers=False to shard it")
    k_cache, v_cache = k_cache.write(k, cache_lengths), v_cache.write(v, cache_lengths)
    out = attend(q, k_cache.read(), v_cache.read(), cache_lengths + q.shape[1], *mask, **kwargs)
    return out, k_cache, v_cache
  return write_and_attend(q, k, v, k_cache, v_cache, cache_lengths, *mask)


def run_layers(layer_cls: type[nn.Module], num_layers: int, *, name: str, x: jax.Array,
               cache: KVCache | None, positions: jax.Array, extras: tuple = (),
               on_layer: Callable[[jax.Array], Any] | None = None,
               tree_mask: jax.Array | None = None, scan: bool = False,
               per_layer: Callable[[int], Mapping[str, Any]] | None = None,
               **layer_fields) -> tuple[jax.Array, KVCache | KVUpdate]:
  """Runs ``num_layers`` instances of ``layer_cls`` in order. ``x: [B, T, D]`` are the embedded tokens,
  ``positions: i32[B, T]`` their positions.

  Unrolled (``scan=False``, the default), layer i is named ``{name}_{i}`` (Hugging Face's
  ``model.layers.{i}``), has its own parameters and its own cache arrays, and is called under
  ``nn.jit``. Scanned (``scan=True``, MaxText's ``scan_layers``), one layer named ``{name}`` runs in a
  ``lax.scan`` (Flax ``nn.scan``) over parameters stacked ``[L, ...]`` and a stacked cache
  (:attr:`KVCache.scanned`) carried through the scan: XLA compiles one layer instead of L, at the cost
  of a dynamic slice per layer (of the weights and of the cache that attention reads; a copy on this
  CPU, ``docs/design.md``). :func:`stack_layers` converts one parameter layout into the other.

  The layer's ``__call__(x, k_cache, v_cache, cache_lengths, positions, *extras) -> (x, k, v)`` gets its
  layer's ``[B, K, S, H]`` cache arrays (a :class:`LayerSlice` when scanned; None without a cache) and
  returns what :func:`cached_attention` returns for them; it must be called from inside a compact module
  method. ``on_layer`` (if given) is called with every layer's output ``[B, T, D]`` in order: a family
  sows them as :data:`HIDDEN` with it. ``tree_mask`` (``bool[B, T, M]`` or None) goes to every layer as
  the keyword ``tree_mask``, for :func:`cached_attention`. ``per_layer(i)`` (if given) adds layer i's
  own static fields to ``layer_fields`` (Gemma's sliding and global layers); ``nn.jit`` traces one
  layer per distinct set.

  Returns:
    ``(x [B, T, D], cache_or_update)``: the hidden states after the last layer, and the cache with the new
    tokens written and ``lengths + T`` or, without a cache, the new tokens' K/V (a :class:`KVUpdate`),
    stacked when scanned.

  Raises:
    ValueError: a cache whose layout (:attr:`KVCache.scanned`) is not ``scan``'s; ``scan`` with
      layers whose ``per_layer`` fields differ (one scanned layer cannot be two kinds).
  """
  if per_layer is not None and scan:
    kinds = {tuple(sorted(per_layer(i).items())) for i in range(num_layers)}
    if len(kinds) > 1:
      raise ValueError("scanned layers need identical layers, and this model alternates layer kinds "
                       f"({len(kinds)}: sliding-window and global attention); load it with "
                       "scan_layers=False")
    layer_fields = {**layer_fields, **per_layer(0)}
  if cache is not None and cache.scanned != scan:
    raise ValueError(f"run_layers: a {'scanned' if cache.scanned else 'per-layer'} cache for "
                     f"{'scanned' if scan else 'unrolled'} layers; build the cache with the model's "
                     "layout (config.init_cache(..., scanned=...), common.prefill_cache)")
  lengths = None if cache is None else cache.lengths
  if scan:
    return _scan_layers(layer_cls, num_layers, name, x, cache, positions, extras, on_layer,
                        tree_mask, layer_fields)
  layer = nn.jit(layer_cls)
  ks, vs = [], []
  for i in range(num_layers):
    k_cache = None if cache is None else cache.k[i]
    v_cache = None if cache is None else cache.v[i]
    fields = layer_fields if per_layer is None else {**layer_fields, **per_layer(i)}
    x, k, v = layer(**fields, name=f"{name}_{i}")(x, k_cache, v_cache, lengths, positions, *extras,
                                                  tree_mask=tree_mask)
    ks.append(k)
    vs.append(v)
    if on_layer is not None:
      on_layer(x)
  if cache is None:
    return x, KVUpdate(k=tuple(ks), v=tuple(vs))
  return x, KVCache(k=tuple(ks), v=tuple(vs), lengths=cache.lengths + x.shape[1])


def _scan_layers(layer_cls, num_layers, name, x, cache, positions, extras, on_layer, tree_mask,
                 layer_fields):
  """:func:`run_layers`'s scanned path: carry ``(x, layer index, k stack, v stack)``; without a
  cache the layers' new K/V come out stacked as the scan's outputs."""
  lengths = None if cache is None else cache.lengths

  def body(layer, carry, _):
    x, i, k_stack, v_stack = carry
    if cache is None:
      x, k, v = layer(x, None, None, None, positions, *extras, tree_mask=tree_mask)
      return (x, i + 1, k_stack, v_stack), (x, k, v)
    x, k, v = layer(x, LayerSlice(k_stack, i), LayerSlice(v_stack, i), lengths, positions, *extras,
                    tree_mask=tree_mask)
    return (x, i + 1, k.stack, v.stack), (x, None, None)

  scanned = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True},
                    length=num_layers)
  stacks = (None, None) if cache is None else (cache.k, cache.v)
  (x, _, k_stack, v_stack), (hidden, ks, vs) = scanned(
      layer_cls(**layer_fields, name=name), (x, jnp.zeros((), jnp.int32)) + stacks, None)
  if on_layer is not None:
    for i in range(num_layers):
      on_layer(hidden[i])
  if cache is None:
    return x, KVUpdate(k=ks, v=vs)
  return x, KVCache(k=k_stack, v=v_stack, lengths=cache.lengths + x.shape[1])


def stack_layers(params: Any, name: str, num_layers: int) -> Any:
  """Parameters with unrolled layers (``{name}_0 … {name}_{L-1}``) -> scanned (``{name}``, every leaf
  stacked ``[L, ...]``), the layout :func:`run_layers` reads with ``scan=True``.

  Raises:
    ValueError: a layer missing, or the tree already scanned.
  """
  keys = [f"{name}_{i}" for i in range(num_layers)]
  missing = [k for k in keys if k not in params]
  if missing or name in params:
    raise ValueError(f"stack_layers: expected unrolled layers {keys[0]} … {keys[-1]}; "
                     f"{'missing ' + str(missing[:3]) if missing else name + ' is already stacked'}")
  rest = {k: v for k, v in params.items() if k not in keys}
  return {**rest, name: jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[params[k] for k in keys])}


def unstack_layers(params: Any, name: str, num_layers: int) -> Any:
  """The inverse of :func:`stack_layers`: scanned ``{name}: [L, ...]`` -> ``{name}_0 … {name}_{L-1}``.

  Raises:
    ValueError: ``name`` missing or its leading axis not ``num_layers``.
  """
  if name not in params:
    raise ValueError(f"unstack_layers: no stacked {name!r} in the parameters (already unrolled?)")
  lead = {x.shape[0] for x in jax.tree_util.tree_leaves(params[name])}
  if lead != {num_layers}:
    raise ValueError(f"unstack_layers: {name!r} leaves lead with {sorted(lead)}, not {num_layers}")
  rest = {k: v for k, v in params.items() if k != name}
  return {**rest, **{f"{name}_{i}": jax.tree_util.tree_map(lambda x, i=i: x[i], params[name])
                     for i in range(num_layers)}}


# The name under which every family sows its *features*: the vector its LM head multiplies (after the
# final norm, and OPT's ``project_out``), ``dtype[B, T, E]``; an EAGLE-style draft reads it.
FEATURES = "features"
# The name under which a family sows every decoder layer's output (the residual stream, before the final
# norm), in layer order: an EAGLE-3 draft fuses a low, a middle and a high one.
HIDDEN = "hidden_states"


def forward(config: DecoderConfig, params: Any, tokens: jax.Array, cache: KVCache | None = None, *,
            dtype: Any = jnp.float32, attention_impl: str = "reference", compute_logits: bool = True,
            return_features: bool = False, hidden_layers: tuple[int, ...] = (),
            sharding: sharding_lib.ShardingPlan | None = None, tree_mask: jax.Array | None = None):
  """One forward pass of any family: ``tokens: i32[B, T]`` written into and attended over ``cache``.

  Args:
    config: the family's config (``decoder_config.DecoderConfig``). params: its weights (a Flax params tree).
    tokens: ``i32[B, T]``; token t of row b sits at position ``cache.lengths[b] + t``.
    cache: the ragged :class:`KVCache` (``dtype[B, K, S, H]`` per layer), or None for a full forward.
    dtype: compute dtype. attention_impl: a name in ``bass_jax.models.attention``'s registry.
    compute_logits: False skips the LM head (a prefill) and returns None logits.
    return_features: also return the features (:data:`FEATURES`): the LM head's input at every
      position, ``dtype[B, T, E]`` (E the hidden size, OPT's ``word_embed_proj_dim``). It equals
      transformers' ``last_hidden_state`` of the family's base model, the feature an EAGLE draft reads
      (Li et al. 2024, §3). Without it the features are never materialized.
    hidden_layers: with ``return_features``, also return the outputs of these decoder layers
      (0-based, before the final norm), concatenated: ``dtype[B, T, len(hidden_layers) * D]`` (the
      fused features of EAGLE-3, Li et al. 2025, §3.3). Only the Llama family sows them.
    sharding: the model's :class:`sharding.ShardingPlan` when its weights and cache lie on a mesh
      (``bass_jax.sharding``): the attention over the cache then runs per shard. XLA partitions the
      rest from the arrays' placements; the result is the same as on one device, up to the order of
      float sums.
    tree_mask: ``bool[B, T, M]``, ``M >= T``: the tokens are the newest T nodes of one token tree per
      row (a tree verification, EAGLE-2 / SpecInfer, with M = T; a draft growing its tree level by
      level, with the earlier levels' ``M - T`` nodes already in the cache; ``bass_jax.sampling.tree``):
      ``[b, t, j]`` says node t sees the tree's node j, the one in slot ``tree_base[b] + j`` with
      ``tree_base = cache.lengths - (M - T)`` (its ancestors and itself, ``tree.ancestor_mask``). Node t
      is still written at slot ``cache.lengths[b] + t`` but sits at position ``tree_base[b] +
      depth(t)`` (RoPE, learned positions), ``depth(t) = sum(tree_mask[b, t]) - 1`` (0 for an
      all-False padding node), and attends to the prefix and its ancestors only. None: the causal
      chain above. Needs a cache.

  Returns:
    ``(logits f32[B, T, V] | None, cache)`` with the cache's lengths advanced by T; without a cache,
    ``(logits | None, KVUpdate)`` of the tokens attended among themselves (causally). With
    ``return_features``, ``(logits | None, cache or KVUpdate, features)``, and with ``hidden_layers``
    ``(logits | None, cache or KVUpdate, features, hidden)``.

  Raises:
    ValueError: an unknown ``attention_impl`` (from the attention registry); ``hidden_layers`` without
      ``return_features``, out of range, or of a family that does not sow them; a ``tree_mask``
      without a cache or not of shape ``[B, T, M >= T]``.
  """
  if hidden_layers and not return_features:
    raise ValueError("forward: hidden_layers needs return_features=True")
  if any(not 0 <= i < config.num_layers for i in hidden_layers):
    raise ValueError(f"forward: hidden_layers {hidden_layers} must lie in [0, {config.num_layers})")
  if sharding is not None:
    sharding_lib.check_rows(tokens.shape[0], sharding.mesh)
    attention_impl = ShardedAttention(attention_impl, sharding)
  module = config.make_module(attention_impl=attention_impl, dtype=jnp.dtype(dtype),
                              scan_layers=scanned_layers(config, params))
  if not return_features:
    return module.apply({"params": params}, tokens, cache, compute_logits, tree_mask)
  (logits, cache), sown = module.apply({"params": params}, tokens, cache, compute_logits, tree_mask,
                                       mutable=["intermediates"])
  features, = sown["intermediates"][FEATURES]
  if not hidden_layers:
    return logits, cache, features
  if HIDDEN not in sown["intermediates"]:
    raise ValueError(f"forward: model_type {getattr(config, 'model_type', '?')!r} does not sow its "
                     "hidden states (hidden_layers is for the Llama family)")
  hidden = sown["intermediates"][HIDDEN]
  return logits, cache, features, jnp.concatenate([hidden[i] for i in hidden_layers], axis=-1)


def feature_value(out: tuple, hidden_layers: tuple[int, ...], final_feature: bool) -> jax.Array:
  """What a decode keeps per position for its proposer, from :func:`forward`'s output with
  ``return_features`` (and ``hidden_layers``): the tapped layers' hidden states, then the final
  features when ``final_feature``, concatenated (``dtype[B, T, len(hidden_layers) * D + E?]``)."""
  parts = ([out[3]] if hidden_layers else []) + ([out[2]] if final_feature else [])
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)


def prefill_cache(config: DecoderConfig, params: Any, prompts: jax.Array, prompt_len: jax.Array, *,
                  cache_len: int, dtype: Any = jnp.float32, attention_impl: str = "reference",
                  return_features: bool = False, sharding: sharding_lib.ShardingPlan | None = None,
                  chunk: int | None = None, hidden_layers: tuple[int, ...] = (),
                  final_feature: bool = True):
  """A fresh ragged cache of ``cache_len`` slots holding every prompt token but the last, which the
  first decode step consumes (the paper's Fig. 3: the cache lags the text by one token).

  Args:
    prompts: ``i32[B, P]`` right-padded prompts. prompt_len: ``i32[B]``, each ``>= 1``.
    return_features: also return the prompts' features (:func:`forward`), ``dtype[B, P, E]``; with
      ``hidden_layers``, :func:`feature_value`'s concatenation (the taps an EAGLE-3 draft reads,
      without the final features unless ``final_feature``).
    sharding: the model's placement on a mesh (:func:`forward`); the new cache is laid out by it.
    chunk: None runs one forward over all P positions. An int runs cached forwards of ``chunk``
      positions in a ``lax.while_loop`` until the longest row's ``prompt_len - 1`` tokens are in (a
      chunked prefill): the work then follows the true prompt length, not its padded bucket, which is
      what an admission prefill of continuous batching needs. Features at positions from
      ``prompt_len - 1`` on are then those of padding tokens, or zeros past the last chunk.

  Returns:
    The cache with ``lengths = prompt_len - 1`` (the padding's K/V lie past each row's length); with
    ``return_features``, ``(cache, features)``.
  """
  cache = config.init_cache(prompts.shape[0], cache_len, jnp.dtype(dtype),
                            scanned=scanned_layers(config, params))
  taps = tuple(hidden_layers) if return_features else ()
  run = functools.partial(forward, config, params, dtype=dtype, attention_impl=attention_impl,
                          compute_logits=False, return_features=return_features, sharding=sharding,
                          hidden_layers=taps)
  value = lambda out: feature_value(out, taps, final_feature)
  if chunk is None:
    out = run(prompts, None)
    cache, features = cache.append(out[1]), value(out) if return_features else None
  else:
    batch, width = prompts.shape
    padded = jnp.pad(prompts, ((0, 0), (0, chunk)))
    features = None
    if return_features:
      shape = jax.eval_shape(lambda *a: value(run(*a)), padded[:, :chunk], cache)
      features = jnp.zeros((batch, width + chunk, shape.shape[-1]), shape.dtype)

    def fill(carry):
      start, cache, features = carry
      out = run(jax.lax.dynamic_slice_in_dim(padded, start, chunk, axis=1),
                cache.with_lengths(jnp.full((batch,), start, jnp.int32)))
      if features is not None:
        features = jax.lax.dynamic_update_slice_in_dim(features, value(out), start, axis=1)
      return start + chunk, out[1], features

    needed = jnp.max(prompt_len) - 1
    _, cache, features = jax.lax.while_loop(lambda c: c[0] < needed, fill,
                                            (jnp.zeros((), jnp.int32), cache, features))
    features = None if features is None else features[:, :width]
  cache = cache.with_lengths(prompt_len - 1)
  if sharding is not None:
    cache = jax.lax.with_sharding_constraint(
        cache, sharding_lib.state_shardings(cache, sharding, prompts.shape[0]))
  return (cache, features) if return_features else cache


def learned_position_ids(positions: jax.Array, table_size: int, offset: int = 0) -> jax.Array:
  """Row ids into a learned position table (GPT-2's ``wpe``, OPT's ``embed_positions``) for
  ``positions: i32[B, T]``: ``positions + offset``, clipped to the table's last row.

  A decode computes positions past the context it never emits: a verification pass of ``l + 1``
  positions (or a tree of depth ``l``) starting within ``l`` of the end, and the proposers' own
  look-ahead. ``nn.Embed``'s lookup fills an out-of-range id with NaN, and a NaN value in a slot the
  same pass wrote reaches every earlier query of that pass (softmax weight 0 times NaN), so it
  changed emitted tokens and log-probs. Clipping keeps those values finite. It changes nothing
  emitted: ``generate`` refuses prompt + ``max_new_tokens`` beyond the context, so every emitted
  token's logits come from a query at a position inside the table, and by causality (chain or tree
  mask) such a query never reads a slot at a later position.

  Args:
    positions: ``i32[B, T]`` (or ``[1, T]``), as :func:`positions_of` returns.
    table_size: rows of the table. offset: the family's row of position 0 (OPT's 2).

  Returns:
    ``i32`` of ``positions``' shape, in ``[0, table_size)``.
  """
  return jnp.minimum(positions + offset, table_size - 1)


def positions_of(tokens: jax.Array, cache: KVCache | None,
                 tree_mask: jax.Array | None = None) -> jax.Array:
  """The tokens' positions, which every family and the EAGLE draft take from here (RoPE, learned
  positions, sliding windows).

  Args:
    tokens: ``i32[B, T]``. cache: the cache they extend, or None (a forward from position 0).
    tree_mask: ``bool[B, T, M]``, ``M >= T``: the tokens are the newest T nodes of a token tree per
      row (:func:`forward`); needs a cache.

  Returns:
    ``i32[B, T]``: token t of row b at ``cache.lengths[b] + t``; ``i32[1, T]`` (``t``) without a
    cache; with a tree, node t at ``cache.lengths[b] - (M - T) + depth(t)``
    (``attention.mask_depths``: a padding node's 0).

  Raises:
    ValueError: a ``tree_mask`` without a cache, or not ``bool`` of shape ``[B, T, M >= T]``.
  """
  if tree_mask is not None:
    shape = tuple(tree_mask.shape)
    if (cache is None or len(shape) != 3 or shape[:2] != tokens.shape or shape[2] < tokens.shape[1]
        or tree_mask.dtype != jnp.bool_):
      raise ValueError(f"forward: tree_mask must be bool{list(tokens.shape)} + [M >= "
                       f"{tokens.shape[1]}] over a cache, got {tree_mask.dtype}{list(shape)} with "
                       f"cache={cache is not None}")
    depth = attention_lib.mask_depths(tree_mask)
    return cache.lengths[:, None] - (tree_mask.shape[2] - tree_mask.shape[1]) + depth
  offsets = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
  return offsets if cache is None else cache.lengths[:, None] + offsets


def layer_index(key: str, name: str) -> int | None:
  """``"layers_12"`` -> 12 for ``name="layers"``; None for keys that are not one of its layers."""
  prefix = f"{name}_"
  if key.startswith(prefix) and key[len(prefix):].isdigit():
    return int(key[len(prefix):])
  return None
