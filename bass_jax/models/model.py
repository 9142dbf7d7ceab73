"""The model object: a causal LM's architecture, weights and tokenizer (:class:`Model`), and its
parameters' shapes or random initialization from a config. Loading is ``bass_jax.loading``'s, saving
``bass_jax.checkpoints.save``'s; the families are ``bass_jax.models``'s."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax import dtypes
from bass_jax.models import common
from bass_jax.models import decoder_config
from bass_jax.models.common import forward as model_forward
from bass_jax.models.common import layer_index


@dataclasses.dataclass(frozen=True)
class Model:
  """A loaded causal LM: architecture, weights and (optionally) its tokenizer.

  Attributes:
    config: the architecture, a family config (``LlamaConfig``, ``OPTConfig``, ``CodeGenConfig``,
      ``GPT2Config``; static and hashable, so jit treats it as a compile-time constant).
    params: nested dict of arrays, one subtree per layer (``layers_0``, … ; ``h_0``, … for CodeGen
      and GPT-2; see ``models.common``), or the layers scanned: one subtree stacked ``[L, ...]``
      (``layers`` or ``h``; :attr:`scanned_layers`).
    tokenizer: a transformers tokenizer, or None when the checkpoint has none.
    name: where it came from (alias or path), for logs.
  """

  config: Any
  params: Any
  tokenizer: Any = None
  name: str = ""

  @property
  def dtype(self) -> jnp.dtype:
    """The dtype of the weights: of the first floating leaf (a loaded model's weights share one;
    EAGLE drafts and Medusa heads also keep ``int32`` vocabulary maps)."""
    leaves = jax.tree_util.tree_leaves(self.params)
    return next((x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)), leaves[0].dtype)

  def logits(self, tokens: jax.Array) -> jax.Array:
    """Full causal forward without a persistent cache (the tokens attend among themselves), for
    scoring and tests.

    Args:
      tokens: ``i32[B, T]`` token ids in ``[0, vocab_size)``.

    Returns:
      ``f32[B, T, V]`` logits.

    Raises:
      ValueError: tokens not 2-D, longer than the model's context, or out of the vocabulary.
    """
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be i32[batch, time], got shape {tokens.shape}")
    if tokens.shape[1] > self.config.max_positions:
      note = getattr(self.config, "context_note", None)
      raise ValueError(f"{tokens.shape[1]} tokens exceed the model's context of "
                       f"{self.config.max_positions} positions{f' ({note})' if note else ''}; score "
                       "at most that many")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
      raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}); got "
                       f"[{int(tokens.min())}, {int(tokens.max())}]")
    return _full_forward(self.params, tokens.astype(jnp.int32), config=self.config, dtype=self.dtype)

  def with_first_layers(self, num_layers: int) -> "Model":
    """The model cut to its first ``num_layers`` decoder layers, sharing embedding, final norm and head.

    A placeholder draft (docs/bass.md, "Models"): cheap, but for SmolLM2 its first layers agree with
    the full model's greedy token only 1-10 % of the time.

    Raises:
      ValueError: a model of no decoder family (an EAGLE draft, Medusa heads: ``decoder_config.layers_key``
        is None), or unless ``1 <= num_layers <= config.num_layers``.
    """
    name = decoder_config.layers_key(self.config)
    if name is None:
      raise ValueError(f"{self.name or 'this model'} ({type(self.config).__name__}) has no decoder "
                       "layers to cut (only the decoder families do)")
    total = self.config.num_layers
    if not 1 <= num_layers <= total:
      raise ValueError(f"num_layers must be in [1, {total}], got {num_layers}")
    if self.scanned_layers:  # the stacked leaves' first num_layers entries
      params = {**self.params,
                name: jax.tree_util.tree_map(lambda x: x[:num_layers], self.params[name])}
    else:
      params = {k: v for k, v in self.params.items()
                if (i := layer_index(k, name)) is None or i < num_layers}
    config = self.config.with_num_layers(num_layers)
    return Model(config, params, self.tokenizer, f"{self.name}[:{num_layers} layers]")

  @property
  def scanned_layers(self) -> bool:
    """Whether the decoder layers are scanned (``models.common.run_layers``): weights stacked ``[L,
    ...]`` under one key, caches stacked ``[L, B, K, S, H]``; XLA then compiles one layer, not L."""
    return decoder_config.scanned_layers(self.config, self.params)

  def with_scanned_layers(self, scanned: bool = True) -> "Model":
    """The same model with its layers scanned (weights stacked ``[L, ...]``) or unrolled (one subtree
    per layer, HF's layout): a copy of the layer weights, unless already in that layout.

    Raises:
      ValueError: a ``scanned`` that is not a bool; a model of no decoder family (an EAGLE draft,
        Medusa heads: their layers are always unrolled); ``scanned=True`` for a model whose layers
        alternate kinds (Gemma's sliding and global layers).
    """
    scanned = _checks.as_bool("scanned", scanned)
    if scanned == self.scanned_layers:
      return self
    key = decoder_config.layers_key(self.config)
    if key is None:
      raise ValueError(f"{self.name or 'this model'} ({type(self.config).__name__}) has no scanned "
                       "layout (only the decoder families do); load it with scan_layers=False")
    if scanned and not getattr(self.config, "uniform_layers", True):
      raise ValueError(f"{self.name or 'this model'} alternates layer kinds (sliding-window and "
                       "global attention), and scanned layers need identical layers; load it with "
                       "scan_layers=False")
    convert = common.stack_layers if scanned else common.unstack_layers
    return dataclasses.replace(self, params=convert(self.params, key, self.config.num_layers))


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _full_forward(params, tokens, *, config, dtype):
  logits, _ = model_forward(config, params, tokens, dtype=dtype)
  return logits


def abstract_params(config, dtype: Any = jnp.float32) -> dict[str, Any]:
  """The parameter tree's shapes and dtypes, without allocating weights.

  Args:
    config: a decoder family's config (``LlamaConfig``, ``OPTConfig``, ``CodeGenConfig``,
      ``GPT2Config``: anything with ``make_module``). dtype: the parameters' dtype.

  Returns:
    The tree :func:`init_params` returns (one subtree per layer, HF's unrolled layout), with
    ``jax.ShapeDtypeStruct`` leaves.

  Raises:
    AttributeError: a config without ``make_module`` (an EAGLE draft's or Medusa heads').
  """
  module = config.make_module(dtype=dtype)

  def init():
    return module.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]

  return jax.eval_shape(init)


def init_params(config, key: jax.Array, dtype: Any = jnp.float32) -> dict[str, Any]:
  """Randomly initialized parameters (for tests and for training a draft from scratch): the Flax
  modules' own initializers, traced on an ``i32[1, 1]`` input, in one jitted program per config and
  dtype (compiled once: a second model of the same config costs its draws alone, where Flax's eager
  ``init`` ran the forward op by op and compiled its inner jitted functions again, about 0.6 s for a
  2-layer test model on a 2-core CPU).

  Args:
    config: as :func:`abstract_params` (hashable, as every family's config is). key: a
      ``jax.random.key``. dtype: the parameters' dtype.

  Returns:
    A nested dict of arrays in ``dtype``, one subtree per layer (``layers_i``; ``h_i`` for CodeGen
    and GPT-2).

  Raises:
    AttributeError: a config without ``make_module``.
  """
  return _initializer(config, jnp.dtype(dtype))(key)


@functools.lru_cache(maxsize=32)
def _initializer(config, dtype: jnp.dtype):
  """:func:`init_params`' jitted program for ``config`` and ``dtype``, named ``init_params_program``
  (:data:`INIT_PROGRAM`): JAX's tracing events and logs carry that name, its lowering and compile
  events ``jit(init_params_program)``, HLO dumps the module ``jit_init_params_program``."""
  module = config.make_module(dtype=dtype)

  def init_params_program(key):
    return module.init(key, jnp.zeros((1, 1), jnp.int32))["params"]

  return jax.jit(init_params_program)


# init_params' jitted function's name, as JAX's compile events report it (tests/_compile_census.py).
INIT_PROGRAM = "init_params_program"


def model_dtype(dtype: Any) -> jnp.dtype:
  """``dtype`` (a name or a dtype) as a ``jnp.dtype``, one of ``bass_jax.dtypes.PARAMETER_DTYPES``.

  Raises:
    ValueError: anything else (names the parameter and the choices).
  """
  return jnp.dtype(dtypes.dtype_name(dtype))
