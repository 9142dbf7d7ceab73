"""Ragged key/value cache: one static buffer per model, one length per sequence.

Axes: L layers, B batch rows, S cache slots (`max_len`), K key/value heads, H head dim.

A row's cache holds valid entries at slots ``0 … lengths[b] - 1``; everything past that is stale (a
rejected draft, prompt padding) or never written, and attention masks it. Rejecting draft tokens is
therefore only a change of ``lengths`` (BASS §3.1, Fig. 3): nothing is copied or compacted, and the next
forward overwrites the stale slots.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  """Key/value cache of a decoder-only model, ragged over the batch.

  Attributes:
    k: ``[L, B, S, K, H]`` keys, in the model's dtype, rotary already applied.
    v: ``[L, B, S, K, H]`` values.
    lengths: ``i32[B]``, number of valid slots per row.
  """

  k: jax.Array
  v: jax.Array
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
  ) -> "KVCache":
    """An empty cache (all lengths 0) of ``max_len`` slots per row.

    Args:
      fill_value: what the unwritten slots hold; tests pass NaN so that a read of an invalid slot
        poisons the output instead of passing unnoticed.

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
    shape = (num_layers, batch_size, max_len, num_kv_heads, head_dim)
    return cls(
        k=jnp.full(shape, fill_value, dtype),
        v=jnp.full(shape, fill_value, dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )

  @property
  def max_len(self) -> int:
    """S, the number of slots per row."""
    return self.k.shape[2]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]

  def with_lengths(self, lengths: jax.Array) -> "KVCache":
    """The same buffers with new valid lengths ``i32[B]``: how drafts are rejected (no copy)."""
    return self.replace(lengths=jnp.asarray(lengths, jnp.int32))
