"""Sharding on a ``jax.sharding.Mesh``: rows of the batch over ``"data"``, weights tensor-parallel over
``"model"``, through one rule table per model family (the logical-axis rules of MaxText).

A mesh has two named axes (``jax.make_mesh((2, 4), ("data", "model"))``):

* ``"data"`` splits the B rows of a decode: tokens, lengths, the decode state and every KV cache. Rows
  do not depend on each other inside a step (each accepts its own drafts), so data parallelism
  communicates only where the loop looks at every row (its stopping test, the draft-length policy, the
  histories) and when the host reads the results.
* ``"model"`` splits each weight matrix Megatron-style (Shoeybi et al. 2019, §3): the query, key and value
  projections and the MLP's up/gate projections by output columns (heads, hidden units), the attention
  and MLP output projections by input rows, followed by one all-reduce each; the embedding and LM head
  by vocabulary. The KV cache of a layer is split by key/value head when the model axis divides the head
  count, so that every shard attends over its own heads with no communication; otherwise it is replicated
  (each model shard holds every head; vLLM instead duplicates each KV head onto the shards that read it,
  which saves memory and is not built here).

How a parameter is split is written once per parameter layout (a config class: the Llama-like families
share ``LlamaConfig``'s) as a table from parameter paths to *logical* axes, the config class's
``PARAM_AXES`` in its family's file (``q_proj/kernel`` is ``("embed", "heads")``), and the logical axes
map to mesh axes by a rule table (:data:`TENSOR_PARALLEL`, :data:`REPLICATED`), as in MaxText's
``logical_axis_rules``. A logical axis whose size the mesh axis does not divide is replicated instead
(named in :attr:`ShardingPlan.replicated`); a model axis that divides neither the attention heads nor
the MLP is an error, since it would shard nothing of the layers.

The decode itself is one jitted program partitioned by XLA (GSPMD/Shardy) from these placements; the
attention over the cache, the one part written as a kernel, runs per shard under ``jax.shard_map``
(``models.common.ShardedAttention``), so that the Pallas kernels see their local rows and heads.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Iterable

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from bass_jax.cache import KVCache

DATA = "data"
MODEL = "model"
MESH_AXES = (DATA, MODEL)

# Logical axes. Anything else (positions, head dim, cache slots, features) is never split.
BATCH, VOCAB, EMBED, HEADS, KV_HEADS, MLP = "batch", "vocab", "embed", "heads", "kv_heads", "mlp"

Rules = tuple[tuple[str, str | None], ...]
# Logical axis -> mesh axis. The target's default: rows over data, every layer tensor-parallel.
TENSOR_PARALLEL: Rules = ((BATCH, DATA), (VOCAB, MODEL), (HEADS, MODEL), (KV_HEADS, MODEL), (MLP, MODEL))
# Rows over data, every weight whole on every device: a small draft runs with no communication.
REPLICATED: Rules = ((BATCH, DATA),)
RULES: dict[str, Rules] = {"tensor_parallel": TENSOR_PARALLEL, "replicated": REPLICATED}


# -- building a model's table: parameter path (a regex over "a/b/c") -> logical axes of its dimensions --
#
# Each config class holds its models' table as its class attribute ``PARAM_AXES`` (a tuple of
# ``(pattern, logical axes)`` pairs, the first match deciding), written in the family's own file with
# these helpers: a new architecture brings its table, and this module names no family.

ParamAxes = tuple[tuple[str, tuple[str | None, ...]], ...]


def dense(name: str, inputs: str | None, outputs: str | None) -> ParamAxes:
  """The rules of a ``nn.Dense`` at path pattern ``name``: kernel ``[in, out]``, bias ``[out]``."""
  return ((rf"{name}/kernel", (inputs, outputs)), (rf"{name}/bias", (outputs,)))


# Every layer norm's scale and bias, whole on every device (not the per-head q/k norms).
NORMS: ParamAxes = ((r"(.*/)?(?![qk]_norm/)[^/]*(norm|ln_[^/]*)/(scale|bias)", (EMBED,)),)


def layout(config: Any) -> str:
  """The parameter layout of a config, for messages: its class's name (every Llama-like family shares
  ``LlamaConfig``'s table)."""
  return type(config).__name__


def param_axes_table(config: Any) -> ParamAxes:
  """The rule table of a config's models: its class's ``PARAM_AXES``.

  Raises:
    ValueError: a config class without one (named, with the fix), or one that is not a non-empty
      tuple of ``(pattern, axes tuple)`` pairs (hashable: plans are static parts of programs).
  """
  table = getattr(type(config), "PARAM_AXES", None)
  if table is None:
    raise ValueError(f"no sharding rules for {layout(config)} (model_type "
                     f"{getattr(config, 'model_type', None)!r}); give the config class a PARAM_AXES "
                     "table (bass_jax.sharding.dense and NORMS build one; docs/scaling.md)")
  if not (isinstance(table, tuple) and table and all(
      isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str)
      and isinstance(rule[1], tuple) for rule in table)):
    raise ValueError(f"{layout(config)}.PARAM_AXES must be a non-empty tuple of (path pattern, "
                     "logical axes tuple) pairs, tuples all through")
  return table


@functools.lru_cache(maxsize=4096)
def _rule(table: ParamAxes, name: str) -> tuple[str | None, ...] | None:
  """The logical axes of parameter ``name`` from a layout's table (the first rule matching it)."""
  return next((axes for pattern, axes in table if re.fullmatch(pattern, name)), None)


def logical_sizes(config: Any) -> dict[str, int]:
  """The sizes a rule must divide to split a logical axis: ``heads`` (N), ``kv_heads`` (K), ``mlp``
  (F) and ``vocab`` (V) of a family config (an EAGLE draft: its layer's).

  A config whose models are not one decoder (an EAGLE draft, Medusa heads) gives its own by a
  ``logical_sizes()`` method.

  Raises:
    ValueError: a config class without a ``PARAM_AXES`` table (:func:`param_axes_table`).
  """
  param_axes_table(config)  # a config with no rules is refused here, before any size is read
  own = getattr(config, "logical_sizes", None)
  if own is not None:
    return own()
  fields = config.FIELDS  # models.decoder_config.FieldTable: which field holds what
  mlp = getattr(config, fields.mlp_width) or 4 * getattr(config, fields.hidden_size)
  return {HEADS: getattr(config, fields.num_heads), KV_HEADS: config.num_kv_heads, MLP: mlp,
          VOCAB: config.vocab_size}


# -- the mesh ------------------------------------------------------------------------------------------


def make_mesh(data: int, model: int, devices: Iterable[jax.Device] | None = None) -> Mesh:
  """A ``(data, model)`` mesh over ``data * model`` devices, axes typed Auto (XLA propagates
  shardings; ``jax.make_mesh``'s default, Explicit, would put them in every array's type).

  Args:
    data, model: the axis sizes.
    devices: exactly ``data * model`` devices; default the first ``data * model`` of
      ``jax.devices()`` (all processes' devices, in process order).

  Raises:
    ValueError: a size below 1, more devices asked for than exist, or ``devices`` of another count.
  """
  for name, size in ((DATA, data), (MODEL, model)):
    if not isinstance(size, int) or size < 1:
      raise ValueError(f"make_mesh: the {name} axis size must be an int >= 1, got {size!r}")
  available = jax.devices()
  if devices is None:
    if data * model > len(available):
      raise ValueError(f"make_mesh: a ({data}, {model}) mesh needs {data * model} devices, there are "
                       f"{len(available)}")
    devices = available[:data * model]
  devices = list(devices)
  if data * model != len(devices):
    raise ValueError(f"make_mesh: a ({data}, {model}) mesh needs {data * model} devices, got "
                     f"{len(devices)}")
  return Mesh(np.array(devices).reshape(data, model), MESH_AXES,
              axis_types=(jax.sharding.AxisType.Auto,) * 2)


def parse_mesh(text: str) -> tuple[int, int]:
  """``"2,4"`` or ``"data:2,model:4"`` -> ``(2, 4)`` (the scripts' ``--mesh``).

  Raises:
    ValueError: any other form (says the accepted ones).
  """
  parts = [p.strip() for p in str(text).split(",")]
  sizes = {}
  for i, part in enumerate(parts):
    name, _, value = part.rpartition(":")
    name = name or (MESH_AXES[i] if i < 2 else "")
    if name not in MESH_AXES or name in sizes or not value.isdigit() or int(value) < 1:
      sizes = None
      break
    sizes[name] = int(value)
  if not sizes or len(sizes) != 2:
    raise ValueError(f"mesh {text!r}: write 'DATA,MODEL' (e.g. '2,4') or 'data:2,model:4', sizes >= 1")
  return sizes[DATA], sizes[MODEL]


def check_mesh(mesh: Any) -> Mesh:
  """``mesh`` as bass_jax uses it: a ``jax.sharding.Mesh`` with exactly the axes ``"data"`` and
  ``"model"``, re-typed Auto (so that a mesh from ``jax.make_mesh``, Explicit by default, works too).

  Raises:
    ValueError: not a Mesh, or other axis names (says how to build one).
  """
  if not isinstance(mesh, Mesh):
    raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}; build one with "
                     "bass_jax.sharding.make_mesh(data, model)")
  if set(mesh.axis_names) != set(MESH_AXES) or len(mesh.axis_names) != 2:
    raise ValueError(
        f"mesh axes {tuple(mesh.axis_names)} must be exactly {MESH_AXES}: rows split over 'data', "
        "weights over 'model' (use size 1 for an axis you do not split), e.g. "
        "jax.make_mesh((2, 4), ('data', 'model')) or bass_jax.sharding.make_mesh(2, 4)")
  devices = mesh.devices if tuple(mesh.axis_names) == MESH_AXES else mesh.devices.T
  return Mesh(devices, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)


def resolve_mesh(mesh: Any) -> Mesh | None:
  """The mesh a call runs on: ``mesh`` itself (checked), else the mesh set with ``jax.set_mesh`` when
  it has the axes ``"data"`` and ``"model"``, else None (one device).

  Raises:
    ValueError: as :func:`check_mesh` for an explicit ``mesh``.
  """
  if mesh is not None:
    return check_mesh(mesh)
  context = jax.sharding.get_mesh()
  if not context.empty and set(context.axis_names) == set(MESH_AXES):
    return check_mesh(context)
  return None


# -- how one model lies on a mesh --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
  """One model's placement on a mesh: its family's table resolved against the rules and the sizes.

  Hashable (a static part of compiled programs).

  Attributes:
    mesh: the ``("data", "model")`` mesh (Auto axes).
    layout: the parameter layout (:func:`layout`: the config class's name), for messages.
    table: its ``PARAM_AXES`` (:func:`param_axes_table`), which places the parameters.
    axes: logical axis -> mesh axis (or None), after divisibility.
    replicated: logical axes the rules split but whose size the mesh axis does not divide, so they are
      replicated instead (e.g. ``("kv_heads",)`` for 3 KV heads on a model axis of 2).
    sizes: the model's :func:`logical_sizes`, against which every parameter's dimensions are checked.
  """

  mesh: Mesh
  layout: str
  table: ParamAxes
  axes: tuple[tuple[str, str | None], ...]
  replicated: tuple[str, ...] = ()
  sizes: tuple[tuple[str, int], ...] = ()

  def mesh_axis(self, logical: str | None) -> str | None:
    return dict(self.axes).get(logical) if logical else None

  def spec(self, *logical: str | None) -> P:
    """The ``PartitionSpec`` of an array whose dimensions have these logical axes."""
    return P(*(self.mesh_axis(a) for a in logical))

  def sharding(self, *logical: str | None) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(*logical))

  @property
  def kv_sharded(self) -> bool:
    """Whether the KV caches (and the attention) are split by key/value head over ``"model"``."""
    return self.mesh_axis(KV_HEADS) == MODEL

  @property
  def rows(self) -> NamedSharding:
    """Per-row arrays (leading axis B): split over ``"data"``."""
    return self.sharding(BATCH)

  @property
  def replicate(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def cache_sharding(self) -> NamedSharding:
    """A layer's ``[B, K, S, H]`` cache: rows over data, key/value heads over model when divisible."""
    return self.sharding(BATCH, KV_HEADS, None, None)

  def param_axes(self, params: Any) -> dict[tuple[str, ...], tuple[str | None, ...]]:
    """Every parameter's logical axes from the family table.

    Raises:
      ValueError: a parameter no rule matches, or one whose shape its rule does not fit: another rank,
      or a dimension of a sized axis (``heads``, ``kv_heads``, ``mlp``, ``vocab``) that is not that
      size (``mlp``, ``vocab``) or a multiple of it (heads times head dim). Names it.
    """
    sizes = dict(self.sizes)
    out = {}
    for path, leaf in flax.traverse_util.flatten_dict(dict(params)).items():
      name = "/".join(path)
      axes = _rule(self.table, name)
      if axes is None:
        raise ValueError(f"no sharding rule for parameter {name!r} of a {self.layout} model; add "
                         f"one to the table {self.layout}.PARAM_AXES holds (in its family's file)")
      exact = lambda axis, dim: dim == sizes[axis] if axis in (MLP, VOCAB) else dim % sizes[axis] == 0
      if len(axes) != len(leaf.shape) or not all(
          exact(axis, dim) for axis, dim in zip(axes, leaf.shape) if axis in sizes):
        raise ValueError(f"sharding rule {axes} for {name!r} does not fit its shape {leaf.shape} "
                         f"(sizes {sizes})")
      out[path] = axes
    return out

  def param_shardings(self, params: Any) -> Any:
    """A tree like ``params`` (arrays or ``ShapeDtypeStruct``) of ``NamedSharding``."""
    flat = {path: self.sharding(*axes) for path, axes in self.param_axes(params).items()}
    return flax.traverse_util.unflatten_dict(flat)


def plan(config: Any, mesh: Mesh, rules: str | Rules = "tensor_parallel", *,
         name: str = "the model") -> ShardingPlan:
  """Resolves ``rules`` for a model of ``config`` on ``mesh``.

  Args:
    config: a family config (or an ``EagleConfig``).
    mesh: a ``("data", "model")`` mesh (:func:`check_mesh`).
    rules: ``"tensor_parallel"`` (:data:`TENSOR_PARALLEL`), ``"replicated"`` (:data:`REPLICATED`), or
      a tuple of ``(logical axis, mesh axis or None)`` pairs. Only the sized axes (``heads``,
      ``kv_heads``, ``mlp``, ``vocab``) fall back to replication when the mesh axis does not divide
      them; a rule that splits another axis must divide it.
    name: what the model is, for error messages (``generate`` says "the target" or "the draft").

  Raises:
    ValueError: an unknown rule name or mesh axis; a family without a table; a ``model`` axis larger
      than 1 that divides neither the attention heads nor the MLP (names both, and the fix).
  """
  mesh = check_mesh(mesh)
  if isinstance(rules, str):
    if rules not in RULES:
      raise ValueError(f"unknown sharding rules {rules!r}; one of {sorted(RULES)} or a tuple of "
                       "(logical axis, mesh axis) pairs")
    rules = RULES[rules]
  rules = tuple((str(a), m) for a, m in rules)
  for logical, axis in rules:
    if axis not in (*MESH_AXES, None):
      raise ValueError(f"sharding rule {logical!r} -> {axis!r}: the mesh axes are {MESH_AXES}")
  sizes = logical_sizes(config)
  resolved, replicated = [], []
  for logical, axis in rules:
    size = sizes.get(logical)
    if axis is not None and size is not None and size % mesh.shape[axis]:
      replicated.append(logical)
      axis = None
    resolved.append((logical, axis))
  model = mesh.shape[MODEL]
  wanted = {a for a, m in rules if m == MODEL}
  if model > 1 and wanted & {HEADS, MLP} and not {HEADS, MLP} & {a for a, m in resolved if m}:
    raise ValueError(
        f"a model axis of {model} divides neither the {sizes[HEADS]} attention heads nor the MLP's "
        f"{sizes[MLP]} hidden units of {name} ({config.model_type}), so it would split nothing of "
        f"its layers; choose a model axis size that divides {sizes[HEADS]} or {sizes[MLP]}, and give "
        "the other devices to 'data'")
  return ShardingPlan(mesh=mesh, layout=layout(config), table=param_axes_table(config),
                      axes=tuple(resolved), replicated=tuple(replicated), sizes=tuple(sorted(sizes.items())))


def mesh_of(params: Any) -> Mesh | None:
  """The ``("data", "model")`` mesh a parameter tree lies on (``load_model(..., mesh=...)``), or None
  for weights on one device or on the host."""
  leaves = jax.tree_util.tree_leaves(params)
  where = getattr(leaves[0], "sharding", None) if leaves else None
  if isinstance(where, NamedSharding) and set(where.mesh.axis_names) == set(MESH_AXES):
    return check_mesh(where.mesh)
  return None


def check_rows(batch: int, mesh: Mesh, what: str = "the batch") -> None:
  """Raises ValueError unless ``batch`` rows split evenly over the ``"data"`` axis."""
  data = mesh.shape[DATA]
  if batch % data:
    raise ValueError(f"{what} has {batch} rows, which do not split over the data axis of size {data}; "
                     f"pad it to {-(-batch // data) * data} rows (generate pads with inert rows itself)")


# -- placement ----------------------------------------------------------------------------------------


def put(x: Any, sharding: NamedSharding) -> jax.Array:
  """``x`` (a host or device array) as a global array with ``sharding``: each device receives only its
  own shard, built from the host copy's slice (``jax.make_array_from_callback``), which also works
  when the mesh spans several processes (every process passes the same ``x``). An array already laid
  out so is returned as it is."""
  if isinstance(x, jax.Array):
    if x.sharding.is_equivalent_to(sharding, x.ndim):
      return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding), impl=impl)
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    if not x.is_fully_addressable:  # a global array: reshard it on the devices
      return jax.jit(lambda a: a, out_shardings=sharding)(x)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_params(params: Any, plan_: ShardingPlan) -> Any:
  """``params`` placed as ``plan_`` says (:func:`put` per leaf)."""
  return jax.tree_util.tree_map(put, params, plan_.param_shardings(params))


def to_host(x: jax.Array) -> np.ndarray:
  """A global array's value on this host: its shards gathered from every process when the mesh spans
  several (``multihost_utils.process_allgather``); a plain copy otherwise."""
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def state_shardings(tree: Any, plan_: ShardingPlan, batch: int) -> Any:
  """Shardings for a tree of per-row decode state (arrays or ``ShapeDtypeStruct``): KV caches as
  :meth:`ShardingPlan.cache_sharding` lays them out, other leaves whose leading axis is ``batch`` split
  over data, the rest (counters, keys) replicated."""
  def one(leaf):
    if isinstance(leaf, KVCache) and leaf.scanned:
      raise ValueError("a stacked cache (a model with scanned layers) has no sharding rules yet; "
                       "load the model with scan_layers=False to run it on a mesh")
    if isinstance(leaf, KVCache):
      return KVCache(k=tuple(plan_.cache_sharding() for _ in leaf.k),
                     v=tuple(plan_.cache_sharding() for _ in leaf.v), lengths=plan_.rows)
    return plan_.rows if leaf.ndim >= 1 and leaf.shape[0] == batch else plan_.replicate

  return jax.tree_util.tree_map(one, tree, is_leaf=lambda x: isinstance(x, KVCache))


# -- memory ---------------------------------------------------------------------------------------------


def bytes_per_device(tree: Any, shardings: Any) -> int:
  """Bytes one device holds of ``tree`` (arrays or ``ShapeDtypeStruct``) laid out by ``shardings``:
  the shard shape of every leaf, from the sharding alone (nothing is allocated). Every device holds the
  same amount under a ``NamedSharding`` whose axes divide the shapes."""
  total = 0
  for leaf, sharding in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)):
    shape = sharding.shard_shape(tuple(leaf.shape))
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


__all__ = ["BATCH", "DATA", "EMBED", "HEADS", "KV_HEADS", "MESH_AXES", "MLP", "MODEL", "NORMS",
           "REPLICATED", "RULES", "TENSOR_PARALLEL", "VOCAB", "ParamAxes", "ShardingPlan",
           "bytes_per_device", "check_mesh", "check_rows", "dense", "layout", "logical_sizes",
           "make_mesh", "param_axes_table", "parse_mesh",
           "mesh_of", "plan", "put", "resolve_mesh", "shard_params", "state_shardings", "to_host"]
