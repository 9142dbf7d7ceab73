"""An EAGLE draft's initial parameters: random (Flax's initializers, compiled once per config) or
grown from a shallower trained draft with identity layers (``experiments.train_eagle --init_from``).

What a saved draft's weights are checked against (``checkpoints.eagle_files``) and where training
starts (``bass_jax.training.feature_draft``). The draft itself is ``models.eagle``.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.traverse_util
import jax
import jax.numpy as jnp

from bass_jax.models import eagle
from bass_jax.models.eagle import EagleConfig


def init_draft_params(config: EagleConfig, key: jax.Array, dtype: Any = jnp.float32) -> dict[str, Any]:
  """Random parameters of a draft shaped by ``config``: ``fc``, ``layers_*`` and ``fuse`` with fused
  layers (Flax's default initializers, the fusion's passing ``f`` through); an EAGLE-3 draft's
  ``lm_head [V', E]`` and final ``norm``; with ``own_embedding``, ``embed_tokens {"embedding" [V, E]}``
  (standard normal). What a saved draft's weights are checked against (``checkpoints.eagle_files``).

  One jitted program per config and dtype, as :func:`bass_jax.init_params`: a second draft of the same
  config costs its draws alone.

  Args:
    config: the draft's (hashable) config. key: a ``jax.random.key``. dtype: the parameters' dtype.

  Returns:
    A nested dict of arrays in ``dtype``.
  """
  return _draft_initializer(config, jnp.dtype(dtype))(key)


@functools.lru_cache(maxsize=32)
def _draft_initializer(config: EagleConfig, dtype: jnp.dtype):
  """:func:`init_draft_params`' jitted program for ``config`` and ``dtype``."""
  return jax.jit(functools.partial(eagle.draw_draft_params, config, dtype))


def grown_params(config: EagleConfig, start: dict[str, Any], key: jax.Array) -> dict[str, Any]:
  """A deeper draft's parameters that compute what a shallower draft ``start`` computes.

  ``start``'s layers (``layers_0 … layers_{n-1}``), ``fc`` and fusion are kept; the layers it lacks get
  Flax's initializers with their attention and MLP output projections (``o_proj``, ``down_proj``) set to
  0, so each adds nothing to the residual stream and is the identity: training starts from ``start``'s
  predictions and the new layers learn from there (zero-initialized residual branches, as in ReZero or
  the "zero-init" of deep residual networks). A fused config's fusion starts as ``init_draft_params``
  gives it (passing the feature through) when ``start`` has none.

  Args:
    config: the deeper draft's config (``num_layers`` >= ``start``'s).
    start: a draft's trainable parameters (``checkpoints.eagle_files.load_eagle(...)[1]["draft"]``), a nested dict of arrays.
    key: PRNG key for the new layers' initializers.

  Returns:
    The deeper draft's trainable parameters, float32 where new, ``start``'s own arrays (and dtypes)
    where kept.

  Raises:
    ValueError: ``start`` has more layers than ``config``, or parameters of other shapes.
  """
  fresh = init_draft_params(config, key)
  extra = sorted(set(start) - set(fresh))
  if extra:
    raise ValueError(f"the starting draft has {extra}, which a {config.num_layers}-layer draft lacks")
  fresh_flat = flax.traverse_util.flatten_dict(fresh, sep="/")
  for name, value in flax.traverse_util.flatten_dict(start, sep="/").items():
    want = fresh_flat.get(name)
    if want is None or want.shape != value.shape:
      raise ValueError(f"the starting draft's {name} has shape {value.shape}, the config needs "
                       f"{None if want is None else want.shape}")
  grown = {**fresh, **start}
  for name in set(fresh) - set(start):
    if name.startswith("layers_"):
      layer = grown[name]
      grown[name] = {**layer,
                     "self_attn": {**layer["self_attn"],
                                   "o_proj": {"kernel": jnp.zeros_like(layer["self_attn"]["o_proj"]["kernel"])}},
                     "mlp": {**layer["mlp"],
                             "down_proj": {"kernel": jnp.zeros_like(layer["mlp"]["down_proj"]["kernel"])}}}
  return grown
