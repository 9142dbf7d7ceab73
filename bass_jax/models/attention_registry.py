"""The attention implementations, registered by name and keyed by strategy and backend.

An implementation is an :class:`AttentionImpl`: a ``build`` that returns an attention function with
:func:`bass_jax.models.attention.reference_attention`'s signature, the *strategy* it computes
(``"reference"``, BASS-PAD's ``"pad"`` or BASS-SPLIT's ``"split"``: paper §3.1) and the *backend* it is written for
(``"jnp"``, ``"pallas"``, ``"blocked"``: the same strategies in plain JAX). The names are what
``generate(attention_impl=...)``, the backend profiles and the scripts' ``--attention_impl`` take; the
paper's scripts name a strategy and a backend and get the implementation registered for the pair
(:func:`find`). Token trees attend through ``tree`` (default: the implementation's ragged attention of
the prefix merged with the tree's nodes, ``attention.merged_tree_attention``).

A user's kernel is one file that calls :func:`register_attention` (docs/extending.md, "Your own
attention implementation"); the library's are registered below.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Callable

import jax

from bass_jax import platforms
from bass_jax.models import attention
from bass_jax.models.attention import AttentionFn
from pallas_kernels import ragged_attention
from pallas_kernels import tiling

# Caches used with the Pallas implementations must have a multiple of this many slots; the decode
# rounds every cache to it (sampling.state).
CACHE_ALIGNMENT = 64


@dataclasses.dataclass(frozen=True)
class AttentionImpl:
  """One attention implementation.

  Attributes:
    name: the registry name (``"pallas_split"``).
    strategy: what it computes over a ragged cache: ``"reference"``, ``"pad"`` (BASS-PAD) or
      ``"split"`` (BASS-SPLIT), or a strategy of the user's own.
    backend: what it is written in: ``"jnp"``, ``"pallas"``, ``"blocked"`` or the user's own.
    build: ``() -> AttentionFn``, called where a model traces its attention (so it may read
      :func:`bass_jax.platforms.compile_platform`).
    tree: ``() -> tree attention`` with ``attention.reference_tree_attention``'s signature; None:
      ``attention.merged_tree_attention`` over ``build()``.
    head_dims: ``head_dim -> bool``, the head sizes it takes; None: all.
    head_dims_rule: those sizes in words, for the messages (``"head dims that are multiples of 16"``).
    fallback: the implementation a backend profile's default becomes for head sizes it cannot take
      (``"blocked_split"`` for ``"pallas_split"``); None: such heads are refused.
  """

  name: str
  strategy: str
  backend: str
  build: Callable[[], AttentionFn]
  tree: Callable[[], Callable[..., jax.Array]] | None = None
  head_dims: Callable[[int], bool] | None = None
  head_dims_rule: str = "only some head sizes"
  fallback: str | None = None


_REGISTRY: dict[str, AttentionImpl] = {}


def register_attention(impl: AttentionImpl) -> AttentionImpl:
  """Adds ``impl`` under ``impl.name`` (the same record again is allowed).

  Returns:
    ``impl``.

  Raises:
    ValueError: ``impl`` is not an :class:`AttentionImpl`; its name or its (strategy, backend) pair
      is another implementation's; its fallback is not registered.
  """
  if not isinstance(impl, AttentionImpl):
    raise ValueError(f"register_attention takes an AttentionImpl, got {type(impl).__name__}")
  old = _REGISTRY.get(impl.name)
  if old is not None and old != impl:
    raise ValueError(f"attention_impl {impl.name!r} is registered already ({old}); give yours "
                     "another name")
  twin = _of_pair(impl.strategy, impl.backend)
  if twin is not None and twin.name != impl.name:
    raise ValueError(f"{impl.name!r}: strategy {impl.strategy!r} on backend {impl.backend!r} is "
                     f"{twin.name!r}'s already")
  if impl.fallback is not None and impl.fallback not in _REGISTRY:
    raise ValueError(f"{impl.name!r}: its fallback {impl.fallback!r} is not registered; register it "
                     "first")
  _REGISTRY[impl.name] = impl
  return impl


def attention_implementations() -> tuple[str, ...]:
  """Names accepted by :func:`get_attention` (and by ``generate(attention_impl=...)``)."""
  return tuple(_REGISTRY)


def lookup(name: str) -> AttentionImpl:
  """The record registered under ``name``.

  Raises:
    ValueError: if no implementation has that name (naming the registered ones).
  """
  try:
    return _REGISTRY[name]
  except (KeyError, TypeError):
    raise ValueError(f"unknown attention_impl {name!r}; choose one of "
                     f"{attention_implementations()}") from None


def _of_pair(strategy: str, backend: str) -> AttentionImpl | None:
  return next((impl for impl in _REGISTRY.values()
               if (impl.strategy, impl.backend) == (strategy, backend)), None)


def find(strategy: str, backend: str) -> AttentionImpl:
  """The implementation of ``strategy`` on ``backend`` (``find("split", "pallas")`` is
  ``"pallas_split"``'s record).

  Raises:
    ValueError: none is registered, naming the pairs that are.
  """
  impl = _of_pair(strategy, backend)
  if impl is not None:
    return impl
  pairs = sorted((impl.strategy, impl.backend) for impl in _REGISTRY.values())
  raise ValueError(f"no attention implementation of strategy {strategy!r} on backend {backend!r}; "
                   f"registered (strategy, backend) pairs: {pairs}")


def get_attention(name: str) -> AttentionFn:
  """The attention function of implementation ``name``.

  Raises:
    ValueError: if no implementation has that name.
  """
  return lookup(name).build()


def get_tree_attention(name: str) -> Callable[..., jax.Array]:
  """The tree attention of implementation ``name``, with ``attention.reference_tree_attention``'s
  signature: the record's ``tree``, or its ragged attention of the prefix merged with the tree's
  nodes (``attention.merged_tree_attention``, which refuses a ``sliding_window``).

  Raises:
    ValueError: if no implementation has that name.
  """
  impl = lookup(name)
  if impl.tree is not None:
    return impl.tree()
  return functools.partial(attention.merged_tree_attention, impl.build())


def implementation_for_heads(name: str, head_dims: dict[str, int], *, chosen_by_user: bool) -> str:
  """The attention implementation to trace for models whose heads have ``head_dims`` channels.

  An implementation may take only some head sizes (the Pallas kernels: multiples of 16, as
  ``pallas_kernels.tiling.supports_head_dim`` says). For another size a profile's default
  is replaced, before anything is traced, by its ``fallback`` (the same strategy in plain JAX), with a
  one-line warning; an implementation the caller asked for by name is refused.

  Args:
    name: the implementation chosen (a profile's default, or the caller's ``attention_impl``).
    head_dims: ``{model name: head dim}`` of the models that will attend with it.
    chosen_by_user: whether the caller named ``name`` (then a mismatch is an error).

  Returns:
    ``name``, or its fallback.

  Raises:
    ValueError: an unknown name; a head size it cannot take, with ``chosen_by_user`` or no fallback.
  """
  impl = lookup(name)
  bad = {model: dim for model, dim in head_dims.items()
         if impl.head_dims is not None and not impl.head_dims(dim)}
  if not bad:
    return name
  which = ", ".join(f"{model} (head_dim {dim})" for model, dim in bad.items())
  instead = f"attention_impl={impl.fallback!r} or " if impl.fallback else ""
  if chosen_by_user or impl.fallback is None:
    raise ValueError(f"attention_impl={name!r} takes {impl.head_dims_rule}, and {which} is not; use "
                     f"{instead}'reference'")
  warnings.warn(f"{which}: {name!r} takes {impl.head_dims_rule}; attending with {impl.fallback!r} "
                "(the same strategy in plain JAX) instead", stacklevel=3)
  return impl.fallback


def _pallas(variant: str) -> AttentionFn:
  """The Pallas ragged-attention kernel: native on a GPU, with flash-decoding splits of the cache
  chosen from the shape and the SM count (``tiling.split_count``); interpreted, unsplit,
  on any other platform (``platforms.compile_platform``). The keywords (``sm_scale``,
  ``sliding_window``, ``logit_soft_cap``, ``kv_lengths``, ``return_residuals``) go to the kernel as
  they are."""
  if not platforms.is_gpu(platforms.compile_platform()):
    return functools.partial(ragged_attention.ragged_attention, variant=variant, interpret=True)
  sm_count = platforms.sm_count()

  def attend(q, k_cache, v_cache, lengths, **kwargs):
    batch, num_q, num_heads, _ = q.shape
    num_kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    splits = tiling.split_count(batch, num_kv_heads, num_q, num_heads // num_kv_heads,
                                          max_len, sm_count=sm_count)
    return ragged_attention.ragged_attention(
        q, k_cache, v_cache, lengths, variant=variant,
        block_sizes=tiling.BlockSizes(num_splits=splits), **kwargs)

  return attend


register_attention(AttentionImpl("reference", "reference", "jnp",
                                 lambda: attention.reference_attention,
                                 tree=lambda: attention.reference_tree_attention))
for _strategy in ("pad", "split"):  # BASS-PAD and BASS-SPLIT (paper §3.1)
  # The two strategies in plain JAX, compiled natively where the Pallas GPU kernels do not run.
  register_attention(AttentionImpl(
      f"blocked_{_strategy}", _strategy, "blocked",
      functools.partial(functools.partial, attention.blocked_attention, variant=_strategy)))
  register_attention(AttentionImpl(
      f"pallas_{_strategy}", _strategy, "pallas", functools.partial(_pallas, _strategy),
      head_dims=tiling.supports_head_dim,
      head_dims_rule="head dims that are multiples of 16", fallback=f"blocked_{_strategy}"))
