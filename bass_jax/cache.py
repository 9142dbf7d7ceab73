"""Ragged key/value cache: one static buffer per layer, one length per sequence.

Axes: L layers, B batch rows, K key/value heads, S cache slots (``max_len``), H head dim.

By default each layer owns its own ``[B, K, S, H]`` key and value arrays (a tuple of L arrays, not one
stacked ``[L, …]`` array): a decode step then writes each layer's few new entries in place and attention
reads each layer's buffer directly, with no per-layer slice copied out of a stacked array (on a CPU those
copies cost as much as the attention itself; ``docs/design.md``). A model with *scanned* layers
(``models.common.run_layers``, ``load_model(..., scan_layers=True)``) keeps one stacked ``[L, B, K, S,
H]`` array instead, which its ``lax.scan`` over layers carries; its layer i is read through a
:class:`LayerSlice`. Within a layer, the S slots of one (row, kv head) are contiguous, the layout both
attention products read without a transpose.

A row's cache holds valid entries at slots ``0 … lengths[b] - 1``; everything past that is stale (a
rejected draft, prompt padding) or never written, and attention masks it. Rejecting draft tokens is
therefore only a change of ``lengths`` (BASS §3.1, Fig. 3): nothing is copied, and the next forward
overwrites the stale slots. A token-tree step is the one exception: its accepted path lies at scattered
slots and is moved to consecutive ones (:func:`keep_path`) before the lengths are reset.

A forward pass writes its new tokens' K/V at each row's own slots and then attends over the cache
(``models.common.cached_attention``); a forward without a cache returns the new K/V as a
:class:`KVUpdate`, which :meth:`KVCache.append` writes into a cache (the prefill into a fresh one).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  """Key/value cache of a decoder-only model, ragged over the batch.

  Attributes:
    k: L arrays ``[B, K, S, H]``, keys in the model's dtype, rotary already applied; or, for a model
      with scanned layers, one stacked array ``[L, B, K, S, H]`` (:attr:`scanned`).
    v: the values, laid out as ``k``.
    lengths: ``i32[B]``, number of valid slots per row.
  """

  k: tuple[jax.Array, ...] | jax.Array
  v: tuple[jax.Array, ...] | jax.Array
  lengths: jax.Array

  @classmethod
  def zeros(
      cls,
      *,
      num_layers: int,
      batch_size: int,
      max_len: int,
      num_kv_heads: int,
      head_dim: int,
      dtype: jnp.dtype = jnp.float32,
      fill_value: float = 0.0,
      scanned: bool = False,
  ) -> "KVCache":
    """An empty cache (all lengths 0) of ``max_len`` slots per row.

    Args:
      fill_value: what the unwritten slots hold; tests pass NaN so that a read of an invalid slot
        poisons the output instead of passing unnoticed.
      scanned: one stacked ``[L, B, K, S, H]`` array per k and v (a model with scanned layers) instead
        of L arrays ``[B, K, S, H]``.

    Raises:
      ValueError: if a size is not positive.
    """
    for name, size in (
        ("num_layers", num_layers),
        ("batch_size", batch_size),
        ("max_len", max_len),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
      if size < 1:
        raise ValueError(f"KVCache.zeros: {name} must be >= 1, got {size}")
    shape = (batch_size, num_kv_heads, max_len, head_dim)
    lengths = jnp.zeros((batch_size,), jnp.int32)
    if scanned:
      full = lambda: jnp.full((num_layers,) + shape, fill_value, dtype)
      return cls(k=full(), v=full(), lengths=lengths)
    return cls(
        k=tuple(jnp.full(shape, fill_value, dtype) for _ in range(num_layers)),
        v=tuple(jnp.full(shape, fill_value, dtype) for _ in range(num_layers)),
        lengths=lengths,
    )

  @property
  def scanned(self) -> bool:
    """Whether k and v are stacked ``[L, B, K, S, H]`` arrays (a model with scanned layers)."""
    return not isinstance(self.k, tuple)

  @property
  def num_layers(self) -> int:
    """L, the layers."""
    return self.k.shape[0] if self.scanned else len(self.k)

  @property
  def max_len(self) -> int:
    """S, the number of slots per row."""
    return self._layer_dim(2)

  @property
  def batch_size(self) -> int:
    return self._layer_dim(0)

  def _layer_dim(self, axis: int) -> int:
    """The size of one layer's axis ``axis`` of ``[B, K, S, H]``, in either layout."""
    return self.k.shape[axis + 1] if self.scanned else self.k[0].shape[axis]

  def with_lengths(self, lengths: jax.Array) -> "KVCache":
    """The same buffers with new valid lengths ``i32[B]``: how drafts are rejected (no copy)."""
    return self.replace(lengths=jnp.asarray(lengths, jnp.int32))

  def append(self, update: "KVUpdate") -> "KVCache":
    """Writes the T new entries of ``update`` at slots ``lengths[b] … lengths[b] + T - 1`` of each row
    and returns the cache with ``lengths + T``.

    Entries that would land past the last slot are dropped; ``generate`` sizes caches so that this never
    happens to a token it keeps.

    Raises:
      ValueError: ``update`` and the cache in different layouts (one scanned, one not).
    """
    if isinstance(update.k, tuple) == self.scanned:
      raise ValueError("KVCache.append: the update and the cache must both be scanned (stacked [L, "
                       "...] arrays) or both per-layer tuples; convert the model, not the cache")
    write = lambda cache, new: write_entries(cache, new, self.lengths)
    return KVCache(k=self._per_layer(write, self.k, update.k),
                   v=self._per_layer(write, self.v, update.v), lengths=self.lengths + update.num_new)

  def keep_path(self, base: jax.Array, path: jax.Array) -> "KVCache":
    """Every layer's K/V of a tree's accepted path moved to consecutive slots from ``base: i32[B]``
    (:func:`keep_path`); the lengths are the caller's to set."""
    move = lambda x: keep_path(x, base, path, axis=2)
    return self.replace(k=self._per_layer(move, self.k), v=self._per_layer(move, self.v))

  def _per_layer(self, fn, *arrays):
    """``fn`` applied to every layer's ``[B, K, S, H]`` array (and matching per-layer arguments):
    mapped over the tuple, or over the leading axis of a stacked array (``vmap``: one scatter over all
    layers, in place)."""
    if self.scanned:
      return jax.vmap(fn)(*arrays)
    return tuple(map(fn, *arrays))

  def stacked(self) -> tuple[jax.Array, jax.Array]:
    """``(k, v)`` as ``[L, B, K, S, H]`` arrays (a copy unless already scanned; for tests and
    inspection)."""
    if self.scanned:
      return self.k, self.v
    return jnp.stack(self.k), jnp.stack(self.v)

  def write_rows(self, rows_cache: "KVCache", rows: jax.Array) -> "KVCache":
    """:func:`write_rows` for a cache: rows ``rows: i32[A]`` replaced by ``rows_cache``'s A rows (the
    leading ``rows_cache.max_len`` slots of each), in either layout.

    Raises:
      ValueError: the two caches in different layouts.
    """
    if rows_cache.scanned != self.scanned:
      raise ValueError("KVCache.write_rows: both caches must have the same layout (scanned or not)")
    write = lambda batched, fresh: _write_leading(batched, fresh, rows)
    return KVCache(k=self._per_layer(write, self.k, rows_cache.k),
                   v=self._per_layer(write, self.v, rows_cache.v),
                   lengths=write(self.lengths, rows_cache.lengths))


@flax.struct.dataclass
class LayerSlice:
  """Layer ``layer`` of a stacked cache array: what a scanned layer (``models.common.run_layers``)
  hands its attention in place of its own ``[B, K, S, H]`` array.

  ``models.common.cached_attention`` writes the new entries into ``stack[layer]`` and reads that layer
  back, so the stack stays the scan's carry and is updated in place.

  Attributes:
    stack: ``[L, B, K, S, H]`` keys or values of every layer. layer: ``i32[]``, the layer's index.
  """

  stack: jax.Array
  layer: jax.Array

  def write(self, new: jax.Array, lengths: jax.Array) -> "LayerSlice":
    """:func:`write_entries` into this layer: ``new: [B, T, K, H]`` at slots ``lengths[b] + t``."""
    rows = jnp.arange(self.stack.shape[1])[:, None]
    pos = lengths[:, None] + jnp.arange(new.shape[1], dtype=jnp.int32)  # [B, T]
    stack = self.stack.at[self.layer, rows, :, pos].set(new.astype(self.stack.dtype), mode="drop")
    return self.replace(stack=stack)

  def read(self) -> jax.Array:
    """This layer's ``[B, K, S, H]`` array (a dynamic slice of the stack)."""
    return jax.lax.dynamic_index_in_dim(self.stack, self.layer, axis=0, keepdims=False)


def write_entries(cache: jax.Array, new: jax.Array, lengths: jax.Array) -> jax.Array:
  """Writes ``new: [B, T, K, H]`` into one layer's ``cache: [B, K, S, H]`` at slots
  ``lengths[b] … lengths[b] + T - 1`` of each row (``lengths: i32[B]``), cast to the cache's dtype.

  Entries past the last slot are dropped (``generate`` sizes caches so that this never happens to a
  token it keeps). Under ``jit`` with the cache donated or carried, XLA updates it in place.
  """
  rows = jnp.arange(cache.shape[0])[:, None]
  pos = lengths[:, None] + jnp.arange(new.shape[1], dtype=jnp.int32)  # [B, T]
  # Advanced indices (rows, pos) around a full slice: the written block is laid out [B, T, K, H].
  return cache.at[rows, :, pos].set(new.astype(cache.dtype), mode="drop")


def keep_path(buffer: jax.Array, base: jax.Array, path: jax.Array, axis: int) -> jax.Array:
  """Moves a tree's accepted path into consecutive slots: for each row b and ``i >= 1`` with
  ``path[b, i] >= 0``, entry ``base[b] + path[b, i]`` of ``buffer`` along ``axis`` (the slot axis,
  rows leading) is copied to ``base[b] + i`` (the compaction after a tree step, EAGLE-2 / SpecInfer).

  ``path: i32[B, N]`` is ``tree.TreeAcceptance.path`` (increasing, -1 after the path), so an entry
  only ever moves to a lower or equal slot; the N entries are gathered before any is written. Entries
  past the path are left as they are; under ``jit`` with the buffer donated or carried, XLA updates it
  in place (the no-copy test in ``tests/test_generate.py``).

  Args:
    buffer: ``[B, S, ...]`` (axis 1: the EAGLE feature buffer) or ``[B, K, S, H]`` (axis 2: one
      layer's cache), any dtype. base: ``i32[B]`` the tree root's slot. path: as above.
    axis: the slot axis, 1 or 2.

  Returns:
    ``buffer`` with the path's entries at ``base + 1 … base + len(path) - 1``.

  Raises:
    ValueError: an ``axis`` other than 1 or 2.
  """
  rows = jnp.arange(buffer.shape[0])[:, None]
  slots = jnp.arange(path.shape[1])[None, :]
  source = base[:, None] + jnp.maximum(path, 0)
  target = jnp.where((path >= 0) & (slots >= 1), base[:, None] + slots, buffer.shape[axis])  # else dropped
  if axis == 1:  # [B, S, ...]: a feature buffer
    return buffer.at[rows, target].set(buffer[rows, source], mode="drop")
  if axis == 2:  # [B, K, S, H]: one layer's cache
    return buffer.at[rows, :, target].set(buffer[rows, :, source], mode="drop")
  raise ValueError(f"keep_path: axis must be 1 or 2, got {axis}")


@flax.struct.dataclass
class KVUpdate:
  """The keys and values a forward pass computed for its T new tokens, to be appended to a cache.

  Attributes:
    k: L arrays ``[B, T, K, H]`` (rotary applied), or one stacked ``[L, B, T, K, H]`` array from a
      model with scanned layers. v: the values, laid out as ``k``.
  """

  k: tuple[jax.Array, ...] | jax.Array
  v: tuple[jax.Array, ...] | jax.Array

  @property
  def num_new(self) -> int:
    """T, the new tokens per row."""
    return self.k[0].shape[1] if isinstance(self.k, tuple) else self.k.shape[2]


def write_rows(state, rows_state, rows: jax.Array):
  """Writes an A-row decode state into rows ``rows`` of a batched one, in place: how continuous
  batching restarts rows on new prompts (``bass_jax.sampling.batching``).

  Args:
    state: a pytree of per-row arrays with the batch as leading axis (``[B, ...]``: token buffers), of
      :class:`KVCache` s (the batch is a scanned cache's axis 1), and of shared scalars (``[]``).
    rows_state: the same pytree built for A rows: every per-row leaf ``[A, ...]``, no larger than
      ``state``'s in any other axis (a shorter leaf fills the leading part of each row: a prompt's
      cache slots, the rest of the row left as it was).
    rows: ``i32[A]`` the rows to overwrite, distinct; an index out of ``[0, B)`` drops its row of
      ``rows_state`` (how a batched admission pads the rows it does not fill).

  Returns:
    ``state`` with every per-row leaf's rows ``rows`` replaced (cast to its dtype) and every scalar
    kept: a scalar is the batch's, not a row's. Under ``jit`` with ``state`` carried, XLA writes in
    place (a scatter of the A rows' leading parts).
  """
  def one(batched, fresh):
    if isinstance(batched, KVCache):
      return batched.write_rows(fresh, rows)
    if batched.ndim == 0:
      return batched
    return _write_leading(batched, fresh, rows)

  return jax.tree_util.tree_map(one, state, rows_state, is_leaf=lambda x: isinstance(x, KVCache))


def _write_leading(batched: jax.Array, fresh: jax.Array, rows: jax.Array) -> jax.Array:
  """``batched [B, ...]`` with ``fresh [A, ...]``'s rows written at rows ``rows``, into the leading part
  of every other axis (out-of-range rows dropped)."""
  index = (rows,) + tuple(slice(0, n) for n in fresh.shape[1:])
  return batched.at[index].set(fresh.astype(batched.dtype), mode="drop")
