"""The attention interface every model calls, and its plain-jnp reference implementation.

Axes: B batch, T query tokens (the newest T of each row), S cache slots, N query heads, K key/value heads,
G = N // K query heads per key/value head (grouped-query attention), R = T * G, H head dim.

Every implementation has the signature of :func:`reference_attention`::

    attention(q: [B, T, N, H], k_cache: [B, S, K, H], v_cache: [B, S, K, H], lengths: i32[B])
        -> [B, T, N, H]

``lengths[b]`` counts the valid cache slots of row b *including* the T new tokens, which the caller has
already written at slots ``lengths[b] - T … lengths[b] - 1``. Query t of row b sits at position
``lengths[b] - T + t`` and attends to slots ``0 … lengths[b] - T + t`` (end-aligned causal mask; the
``kv_len - q_len + i`` rule of JAX's TPU ragged paged attention). Slots at or past ``lengths[b]`` are never
read into the result, whatever they hold (stale rejected drafts, NaN in tests). Keyword arguments:
``sm_scale`` (default ``1 / sqrt(H)``) and ``sliding_window`` (Mistral: a query at position p also
ignores slots ``<= p - sliding_window``; None attends to the whole prefix).

One signature serves prefill (T = padded prompt length), draft steps (T = 1 or 2) and verification
(T = l_draft + 1), in the BASS-PAD sense of ../shared/BASS.md §4: Q is dense, K/V are ragged.
"""

from __future__ import annotations

from typing import Callable, Protocol

import jax
import jax.numpy as jnp


class AttentionFn(Protocol):

  def __call__(self, q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array, *,
               sm_scale: float | None = None, sliding_window: int | None = None) -> jax.Array:
    ...


def reference_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:
  """End-aligned causal grouped-query attention over a ragged cache, in plain jnp (f32 softmax).

  Args:
    q: ``[B, T, N, H]`` queries (rotary applied), any float dtype.
    k_cache: ``[B, S, K, H]`` keys, ``N % K == 0``.
    v_cache: ``[B, S, K, H]`` values.
    lengths: ``i32[B]``, valid slots per row including the T new ones; ``T <= lengths[b] <= S``.
    sm_scale: softmax scale, default ``1 / sqrt(H)``.
    sliding_window: if set, a query at position p sees only slots ``> p - sliding_window``.

  Returns:
    ``[B, T, N, H]`` in q's dtype.
  """
  batch, num_q, num_heads, head_dim = q.shape
  max_len, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
  group = num_heads // num_kv_heads
  if sm_scale is None:
    sm_scale = head_dim**-0.5

  # Fold the query heads of a group and the query tokens into one axis R = T * G, so that each (row,
  # kv head) is one [R, H] x [S, H] product read straight from the cache's [B, S, K, H] layout.
  q_bkrh = (q.astype(jnp.float32) * sm_scale).reshape(batch, num_q, num_kv_heads, group, head_dim)
  q_bkrh = q_bkrh.transpose(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, num_q * group, head_dim)
  logits = jax.lax.dot_general(q_bkrh, k_cache.astype(jnp.float32),
                               (((3,), (3,)), ((0, 1), (0, 2))))  # [B, K, R, S]

  slots = jnp.arange(max_len)
  q_pos = lengths[:, None] - num_q + jnp.arange(num_q)  # [B, T]
  causal = slots[None, None, :] <= q_pos[:, :, None]  # [B, T, S]
  if sliding_window is not None:
    causal &= slots[None, None, :] > q_pos[:, :, None] - sliding_window
  causal = jnp.repeat(causal, group, axis=1)  # [B, R, S], R ordered (t, g)
  logits = jnp.where(causal[:, None], logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)

  # A zero probability times a NaN in an invalid slot is still NaN: zero the invalid values too.
  valid = slots[None, :] < lengths[:, None]  # [B, S]
  v = jnp.where(valid[:, :, None, None], v_cache.astype(jnp.float32), 0.0)
  out = jax.lax.dot_general(probs, v, (((3,), (1,)), ((0, 1), (0, 2))))  # [B, K, R, H]
  out = out.reshape(batch, num_kv_heads, num_q, group, head_dim).transpose(0, 2, 1, 3, 4)
  return out.reshape(batch, num_q, num_heads, head_dim).astype(q.dtype)


def _pallas(variant: str) -> AttentionFn:
  """The Pallas ragged-attention kernel; interpreted unless the default backend is a GPU."""
  import functools  # pylint: disable=g-import-not-at-top

  from pallas_kernels import ragged_attention  # pylint: disable=g-import-not-at-top

  interpret = jax.default_backend() not in ("gpu", "cuda", "rocm")
  return functools.partial(ragged_attention.ragged_attention, variant=variant, interpret=interpret)


# Caches used with the Pallas implementations must have a multiple of this many slots.
CACHE_ALIGNMENT = 64

_IMPLEMENTATIONS: dict[str, Callable[[], AttentionFn]] = {
    "reference": lambda: reference_attention,
    "pallas_pad": lambda: _pallas("pad"),  # BASS-PAD (paper §3.1)
    "pallas_split": lambda: _pallas("split"),  # BASS-SPLIT, in one launch
}


def attention_implementations() -> tuple[str, ...]:
  """Names accepted by :func:`get_attention` (and by ``generate(attention_impl=...)``)."""
  return tuple(_IMPLEMENTATIONS)


def get_attention(name: str) -> AttentionFn:
  """The attention implementation registered under ``name``.

  Raises:
    ValueError: if no implementation has that name.
  """
  try:
    factory = _IMPLEMENTATIONS[name]
  except KeyError:
    raise ValueError(
        f"unknown attention_impl {name!r}; choose one of {attention_implementations()}"
    ) from None
  return factory()
