"""The attention interface every model calls, its plain-jnp reference, and the BASS-PAD/SPLIT variants.

Axes: B batch, T new tokens, S cache slots, N query heads, K key/value heads, G = N // K query heads per
key/value head (grouped-query attention), R = T * G folded query rows, H head dim.

Every implementation has the signature of :func:`reference_attention`::

    attention(q: [B, T, N, H], k_new: [B, T, K, H], v_new: [B, T, K, H],
              k_cache: [B, K, S, H] | None, v_cache: [B, K, S, H] | None,
              cache_lengths: i32[B] | None) -> [B, T, N, H]

Attention runs over two segments: the layer's cache as it was before this forward (read only: the caller
appends the new K/V afterwards, ``bass_jax.cache.KVCache.append``) and the T new tokens themselves.
Query t of row b sits at position ``p = cache_lengths[b] + t`` and attends to cache slots
``0 … cache_lengths[b] - 1`` and to new tokens ``0 … t`` (causal). Cache slots at or past
``cache_lengths[b]`` are never read into the result, whatever they hold (stale rejected drafts, NaN in
tests). Without a cache (``k_cache=None``: training, a full forward) only the new segment exists.
Keyword arguments: ``sm_scale`` (default ``1 / sqrt(H)``) and ``sliding_window`` (Mistral: a query at
position p also ignores positions ``<= p - sliding_window``; None attends to the whole prefix).

The cache is one ``[B, K, S, H]`` array per layer: for each (row, kv head) the S slots of H channels are
contiguous, so both attention products read it in place. One signature serves prefill (T = padded
prompt length), draft steps (T = 1 or 2) and verification (T = l_draft + 1): Q is dense, the cache is
ragged, as in BASS §3.1 (docs/bass.md). The variants differ only in how they treat the cache segment;
the new segment is a small dense product, merged exactly through the softmax statistics
(:func:`merge_attention`).
"""

from __future__ import annotations

import functools
from typing import Callable, Protocol

import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: no inf - inf in online softmaxes


class AttentionFn(Protocol):

  def __call__(self, q: jax.Array, k_new: jax.Array, v_new: jax.Array,
               k_cache: jax.Array | None = None, v_cache: jax.Array | None = None,
               cache_lengths: jax.Array | None = None, *, sm_scale: float | None = None,
               sliding_window: int | None = None) -> jax.Array:
    ...


def _fold(x: jax.Array, num_kv_heads: int) -> jax.Array:
  """``[B, T, N, H] -> [B, K, R, H]``, rows ordered (t, g): each (row, kv head) becomes one matrix."""
  batch, num_q, num_heads, head_dim = x.shape
  group = num_heads // num_kv_heads
  x = x.reshape(batch, num_q, num_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
  return x.reshape(batch, num_kv_heads, num_q * group, head_dim)


def _unfold(x: jax.Array, num_q: int) -> jax.Array:
  """``[B, K, R, ...] -> [B, T, N, ...]``, the inverse of :func:`_fold` (trailing axes kept)."""
  batch, num_kv_heads, rows = x.shape[:3]
  group = rows // num_q
  x = x.reshape(batch, num_kv_heads, num_q, group, *x.shape[3:])
  x = jnp.moveaxis(x, 2, 1)  # [B, T, K, G, ...]
  return x.reshape(batch, num_q, num_kv_heads * group, *x.shape[4:])


def _new_segment_mask(num_q: int, group: int, sliding_window: int | None) -> jax.Array:
  """``bool[R, T]``: folded query row r (token r // G) sees new token t' <= its own, within the window."""
  t_row = jnp.arange(num_q * group) // group
  t_key = jnp.arange(num_q)
  visible = t_key[None, :] <= t_row[:, None]
  if sliding_window is not None:
    visible &= t_key[None, :] > t_row[:, None] - sliding_window
  return visible


def _cache_segment_mask(cache_lengths: jax.Array, num_slots: int, num_q: int, group: int,
                        sliding_window: int | None) -> jax.Array:
  """``bool[B, R, S]``: slot s is valid (``< cache_lengths[b]``) and, with a window, recent enough."""
  slots = jnp.arange(num_slots)
  visible = (slots[None, :] < cache_lengths[:, None])[:, None, :]  # [B, 1, S]
  if sliding_window is not None:
    q_pos = cache_lengths[:, None] + jnp.arange(num_q * group)[None, :] // group  # [B, R]
    visible = visible & (slots[None, None, :] > q_pos[:, :, None] - sliding_window)
  return visible


def reference_attention(
    q: jax.Array,
    k_new: jax.Array,
    v_new: jax.Array,
    k_cache: jax.Array | None = None,
    v_cache: jax.Array | None = None,
    cache_lengths: jax.Array | None = None,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
) -> jax.Array:
  """Causal grouped-query attention over a ragged cache and the new tokens, in plain jnp (f32 softmax).

  Both segments' scores are concatenated and normalized by one softmax: the definition, computed
  densely (every cache slot is read; invalid ones are masked, and their values zeroed so that NaN there
  cannot reach the output).

  Args:
    q: ``[B, T, N, H]`` queries (rotary applied), any float dtype.
    k_new, v_new: ``[B, T, K, H]`` the new tokens' keys and values, ``N % K == 0``.
    k_cache, v_cache: ``[B, K, S, H]`` the cache before this forward, or None (no cache).
    cache_lengths: ``i32[B]`` valid cache slots per row (required with a cache).
    sm_scale: softmax scale, default ``1 / sqrt(H)``.
    sliding_window: if set, a query at position p sees only positions ``> p - sliding_window``.

  Returns:
    ``[B, T, N, H]`` in q's dtype.
  """
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads = k_new.shape[2]
  group = num_heads // num_kv_heads
  scale = head_dim**-0.5 if sm_scale is None else sm_scale
  q_f = _fold(q.astype(jnp.float32) * scale, num_kv_heads)  # [B, K, R, H]
  k_n = k_new.astype(jnp.float32)
  v_n = v_new.astype(jnp.float32)
  scores_new = jnp.einsum("bkrh,btkh->bkrt", q_f, k_n)
  scores_new = jnp.where(_new_segment_mask(num_q, group, sliding_window), scores_new, -jnp.inf)
  if k_cache is None:
    probs = jax.nn.softmax(scores_new, axis=-1)
    out = jnp.einsum("bkrt,btkh->bkrh", probs, v_n)
    return _unfold(out, num_q).astype(q.dtype)

  num_slots = k_cache.shape[2]
  visible = _cache_segment_mask(cache_lengths, num_slots, num_q, group, sliding_window)
  scores_cache = jnp.einsum("bkrh,bksh->bkrs", q_f, k_cache.astype(jnp.float32))
  scores_cache = jnp.where(visible[:, None], scores_cache, -jnp.inf)
  probs = jax.nn.softmax(jnp.concatenate([scores_cache, scores_new], axis=-1), axis=-1)
  # A zero probability times a NaN in an invalid slot is still NaN: zero the invalid values too.
  valid = jnp.arange(num_slots)[None, :] < cache_lengths[:, None]  # [B, S]
  v_c = jnp.where(valid[:, None, :, None], v_cache.astype(jnp.float32), 0.0)
  out = (jnp.einsum("bkrs,bksh->bkrh", probs[..., :num_slots], v_c)
         + jnp.einsum("bkrt,btkh->bkrh", probs[..., num_slots:], v_n))
  return _unfold(out, num_q).astype(q.dtype)


def new_token_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, *, sm_scale: float,
                        sliding_window: int | None = None):
  """The new-token segment alone, with its softmax statistics (for :func:`merge_attention`).

  Returns:
    ``(out f32[B, T, N, H] normalized within the segment, m f32[B, T, N] max logit, l f32[B, T, N] sum
    of exp(logit - m))``.
  """
  num_q, num_heads = q.shape[1], q.shape[2]
  num_kv_heads = k_new.shape[2]
  group = num_heads // num_kv_heads
  q_f = _fold(q.astype(jnp.float32) * sm_scale, num_kv_heads)
  scores = jnp.einsum("bkrh,btkh->bkrt", q_f, k_new.astype(jnp.float32))
  scores = jnp.where(_new_segment_mask(num_q, group, sliding_window), scores, _MASK_VALUE)
  m = jnp.max(scores, axis=-1)
  p = jnp.exp(scores - m[..., None])
  l = jnp.sum(p, axis=-1)
  out = jnp.einsum("bkrt,btkh->bkrh", p / l[..., None], v_new.astype(jnp.float32))
  return _unfold(out, num_q), _unfold(m, num_q), _unfold(l, num_q)


def merge_attention(parts) -> jax.Array:
  """Exact softmax over the union of disjoint key sets from per-set results.

  Args:
    parts: ``(out f32[..., H], m f32[...], l f32[...])`` per key set, each ``out`` normalized within its
      set; a set that holds no visible key has ``l == 0`` and weighs nothing.

  Returns:
    ``f32[..., H]``: ``sum_i w_i out_i / sum_i w_i`` with ``w_i = l_i exp(m_i - max_j m_j)``.
  """
  m_all = functools.reduce(jnp.maximum, [m for _, m, _ in parts])
  weights = [l * jnp.exp(m - m_all) for _, m, l in parts]
  total = functools.reduce(jnp.add, weights)
  out = functools.reduce(jnp.add, [w[..., None] * o for (o, _, _), w in zip(parts, weights)])
  return out / jnp.where(total > 0, total, 1.0)[..., None]


def blocked_cache_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    cache_lengths: jax.Array,
    *,
    variant: str = "pad",
    block_k: int = 64,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
):
  """The cache segment in plain JAX, BASS-PAD or BASS-SPLIT: the Pallas kernels' algorithm for backends
  without them.

  The cache is walked in ``block_k``-slot blocks with an online (flash) softmax, the query heads of a
  group and the query tokens folded into R = T * G rows. ``"pad"`` runs one batched loop to the batch's
  longest row (BASS-PAD); ``"split"`` maps over the rows, each looping only over its own blocks
  (BASS-SPLIT, one sequential pass per sequence, like the paper's one kernel per sequence). XLA compiles
  both to native code, so on a CPU they show what the two strategies cost, which the interpreted
  Pallas kernels cannot.

  Args:
    q, k_cache, v_cache, cache_lengths, sm_scale, sliding_window: as :func:`reference_attention`.
    variant: ``"pad"`` or ``"split"``.
    block_k: slots per block; must divide S.

  Returns:
    ``(out f32[B, T, N, H], m f32[B, T, N], l f32[B, T, N])`` as :func:`new_token_attention`.

  Raises:
    ValueError: an unknown variant or ``block_k`` not dividing S.
  """
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
  if variant not in ("pad", "split"):
    raise ValueError(f"variant must be 'pad' or 'split', got {variant!r}")
  block_k = min(block_k, max_len)
  if max_len % block_k:
    raise ValueError(f"block_k={block_k} must divide the cache length {max_len}")
  group = num_heads // num_kv_heads
  rows = num_q * group
  scale = head_dim**-0.5 if sm_scale is None else sm_scale
  q_f = _fold(q.astype(jnp.float32) * scale, num_kv_heads)
  q_pos = cache_lengths[:, None] + jnp.arange(rows) // group  # [B, R]

  def attend(q_f, k, v, length, q_pos, num_blocks):
    """q_f [b, K, R, H], k/v [b, K, S, H], length [b], q_pos [b, R]; loops num_blocks blocks."""
    b = q_f.shape[0]

    def body(i, carry):
      acc, m, l = carry
      kb = jax.lax.dynamic_slice_in_dim(k, i * block_k, block_k, axis=2).astype(jnp.float32)
      vb = jax.lax.dynamic_slice_in_dim(v, i * block_k, block_k, axis=2).astype(jnp.float32)
      slots = i * block_k + jnp.arange(block_k)
      valid = slots[None, :] < length[:, None]  # [b, block]
      kb = jnp.where(valid[:, None, :, None], kb, 0.0)
      vb = jnp.where(valid[:, None, :, None], vb, 0.0)
      logits = jnp.einsum("bkrh,bksh->bkrs", q_f, kb)
      visible = jnp.broadcast_to(valid[:, None, :], (b, rows, block_k))
      if sliding_window is not None:
        visible &= slots[None, None, :] > q_pos[:, :, None] - sliding_window
      logits = jnp.where(visible[:, None], logits, _MASK_VALUE)
      m_next = jnp.maximum(m, jnp.max(logits, axis=-1))
      correction = jnp.exp(m - m_next)
      p = jnp.where(visible[:, None], jnp.exp(logits - m_next[..., None]), 0.0)
      acc = correction[..., None] * acc + jnp.einsum("bkrs,bksh->bkrh", p, vb)
      return acc, m_next, correction * l + jnp.sum(p, axis=-1)

    init = (jnp.zeros((b, num_kv_heads, rows, head_dim), jnp.float32),
            jnp.full((b, num_kv_heads, rows), _MASK_VALUE, jnp.float32),
            jnp.zeros((b, num_kv_heads, rows), jnp.float32))
    acc, m, l = jax.lax.fori_loop(0, num_blocks, body, init)
    return acc / jnp.where(l > 0, l, 1.0)[..., None], m, l

  if variant == "pad":
    out, m, l = attend(q_f, k_cache, v_cache, cache_lengths, q_pos,
                       -(-jnp.max(cache_lengths) // block_k))
  else:
    def one_row(args):
      q_r, k_r, v_r, length, pos = args
      results = attend(q_r[None], k_r[None], v_r[None], length[None], pos[None],
                       -(-length // block_k))
      return tuple(x[0] for x in results)

    out, m, l = jax.lax.map(one_row, (q_f, k_cache, v_cache, cache_lengths, q_pos))
  return _unfold(out, num_q), _unfold(m, num_q), _unfold(l, num_q)


def segmented_attention(cache_part: Callable, q, k_new, v_new, k_cache=None, v_cache=None,
                        cache_lengths=None, *, sm_scale=None, sliding_window=None) -> jax.Array:
  """Attention as two merged segments: ``cache_part`` over the cache (returning ``(out, m, l)``), and the
  new tokens densely (:func:`new_token_attention`). Without a cache only the new segment runs."""
  scale = q.shape[-1]**-0.5 if sm_scale is None else sm_scale
  new = new_token_attention(q, k_new, v_new, sm_scale=scale, sliding_window=sliding_window)
  if k_cache is None:
    return new[0].astype(q.dtype)
  cached = cache_part(q, k_cache, v_cache, cache_lengths, sm_scale=scale,
                      sliding_window=sliding_window)
  return merge_attention([cached, new]).astype(q.dtype)


def _pallas_cache_part(variant: str):
  """The Pallas ragged-attention kernel over the cache segment; interpreted unless on a GPU."""
  from pallas_kernels import ragged_attention  # pylint: disable=g-import-not-at-top

  interpret = jax.default_backend() not in ("gpu", "cuda", "rocm")

  def cache_part(q, k_cache, v_cache, cache_lengths, *, sm_scale, sliding_window):
    # Queries sit after the cache (end position cache_lengths + T); only slots < cache_lengths are keys.
    out, (m, l) = ragged_attention.ragged_attention(
        q, k_cache, v_cache, cache_lengths + q.shape[1], kv_lengths=cache_lengths, variant=variant,
        sm_scale=sm_scale, sliding_window=sliding_window, interpret=interpret,
        return_residuals=True)
    return out.astype(jnp.float32), m, l

  return functools.partial(segmented_attention, cache_part)


def _blocked(variant: str) -> AttentionFn:
  return functools.partial(segmented_attention,
                           functools.partial(blocked_cache_attention, variant=variant))


# Caches used with the Pallas implementations must have a multiple of this many slots.
CACHE_ALIGNMENT = 64

_IMPLEMENTATIONS: dict[str, Callable[[], AttentionFn]] = {
    "reference": lambda: reference_attention,
    "pallas_pad": lambda: _pallas_cache_part("pad"),  # BASS-PAD (paper §3.1)
    "pallas_split": lambda: _pallas_cache_part("split"),  # BASS-SPLIT, in one launch
    # The same two strategies in plain JAX, compiled natively where Pallas GPU kernels do not run.
    "blocked_pad": lambda: _blocked("pad"),
    "blocked_split": lambda: _blocked("split"),
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
