"""The attention interface every model calls, its plain-jnp reference, and BASS-PAD/SPLIT in plain JAX.

Axes: B batch, T new tokens (the newest T of each row), S cache slots, N query heads, K key/value heads,
G = N // K query heads per key/value head (grouped-query attention), R = T * G folded rows, H head dim.

Every implementation has the signature of :func:`reference_attention`::

    attention(q: [B, T, N, H], k_cache: [B, K, S, H], v_cache: [B, K, S, H], lengths: i32[B])
        -> [B, T, N, H]

``lengths[b]`` counts the valid cache slots of row b *including* the T new tokens, which the caller has
already written at slots ``lengths[b] - T … lengths[b] - 1``. Query t of row b sits at position
``lengths[b] - T + t`` and attends to slots ``0 … lengths[b] - T + t`` (end-aligned causal mask; the
``kv_len - q_len + i`` rule of JAX's TPU ragged paged attention). Slots at or past ``lengths[b]`` are
never read into the result, whatever they hold (stale rejected drafts, NaN in tests). Keyword
arguments, all static:

* ``sm_scale``: the softmax scale, default ``1 / sqrt(H)``.
* ``sliding_window``: Mistral's window: a query at position p also ignores slots ``<= p -
  sliding_window``; None attends to the whole prefix. A model may pass a different window per layer
  (Gemma 2: windowed layers alternate with global ones); each value is its own static variant.
* ``logit_soft_cap``: Gemma 2's attention logit soft-capping: the scaled scores ``s = q . k * sm_scale``
  become ``cap * tanh(s / cap)`` before the mask and the softmax, which bounds every logit to
  ``(-cap, cap)`` (Gemma 2 report, "Logit soft-capping"; transformers ``modeling_gemma2.py``,
  ``eager_attention_forward``). None (the default) caps nothing and traces exactly the uncapped
  program.

The cache is one ``[B, K, S, H]`` array per layer: for each (row, kv head) the S slots of H channels are
contiguous, so both attention products read the cache in place, with no transposed copy per call.
Writing the new tokens *before* reading the cache matters on XLA: a program that reads a buffer and then
updates it in place gets a copy of the whole buffer inserted to keep the read valid, while the order
write-then-read needs none (measured: two copies of every layer's cache per call otherwise).

One signature serves prefill into a cache, draft steps (T = 1 or 2) and verification chunks: Q is
dense, K/V are ragged, in the BASS-PAD sense of the paper's §3.1 (docs/bass.md). Without a cache (a full
forward, training) :func:`causal_attention` attends the new tokens among themselves.
"""

from __future__ import annotations

from typing import Callable, Protocol

import jax
import jax.numpy as jnp

from bass_jax import platforms

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: no inf - inf in online softmaxes


class AttentionFn(Protocol):

  def __call__(self, q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array, *,
               sm_scale: float | None = None, sliding_window: int | None = None,
               logit_soft_cap: float | None = None) -> jax.Array:
    ...


def soft_cap(logits: jax.Array, cap: float | None) -> jax.Array:
  """Gemma 2's logit soft-capping, ``cap * tanh(logits / cap)`` (any shape, elementwise); ``logits``
  unchanged when ``cap`` is None. Applied to the scaled attention scores before the mask, as
  transformers' ``modeling_gemma2.py`` does (``attn_weights / softcap``, ``tanh``, ``* softcap``).

  Raises:
    ValueError: a cap that is not positive.
  """
  if cap is None:
    return logits
  if not cap > 0:
    raise ValueError(f"logit_soft_cap must be > 0 or None, got {cap}")
  return cap * jnp.tanh(logits / cap)


def _fold(x: jax.Array, num_kv_heads: int) -> jax.Array:
  """``[B, T, N, H] -> [B, K, R, H]``, rows ordered (t, g): each (row, kv head) becomes one matrix."""
  batch, num_q, num_heads, head_dim = x.shape
  group = num_heads // num_kv_heads
  x = x.reshape(batch, num_q, num_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
  return x.reshape(batch, num_kv_heads, num_q * group, head_dim)


def _unfold(x: jax.Array, num_q: int) -> jax.Array:
  """``[B, K, R, H] -> [B, T, N, H]``, the inverse of :func:`_fold`."""
  batch, num_kv_heads, rows, head_dim = x.shape
  group = rows // num_q
  x = x.reshape(batch, num_kv_heads, num_q, group, head_dim).transpose(0, 2, 1, 3, 4)
  return x.reshape(batch, num_q, num_kv_heads * group, head_dim)


def reference_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
) -> jax.Array:
  """End-aligned causal grouped-query attention over a ragged cache, in plain jnp (f32 softmax).

  Args:
    q: ``[B, T, N, H]`` queries (rotary applied), any float dtype.
    k_cache: ``[B, K, S, H]`` keys, ``N % K == 0``.
    v_cache: ``[B, K, S, H]`` values.
    lengths: ``i32[B]``, valid slots per row including the T new ones; ``T <= lengths[b] <= S``.
    sm_scale: softmax scale, default ``1 / sqrt(H)``.
    sliding_window: if set, a query at position p sees only slots ``> p - sliding_window``.
    logit_soft_cap: if set (Gemma 2), the scaled scores ``s`` become ``cap * tanh(s / cap)`` before
      the mask and the softmax (:func:`soft_cap`).

  Returns:
    ``[B, T, N, H]`` in q's dtype.
  """
  num_q, max_len = q.shape[1], k_cache.shape[2]
  slots = jnp.arange(max_len)
  q_pos = lengths[:, None] - num_q + jnp.arange(num_q)  # [B, T]
  visible = slots[None, None, :] <= q_pos[:, :, None]  # [B, T, S]
  if sliding_window is not None:
    visible &= slots[None, None, :] > q_pos[:, :, None] - sliding_window
  return _attend_visible(q, k_cache, v_cache, lengths, visible, sm_scale, logit_soft_cap)


def _attend_visible(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array,
                    visible: jax.Array, sm_scale: float | None,
                    logit_soft_cap: float | None = None) -> jax.Array:
  """Grouped-query softmax attention of ``q: [B, T, N, H]`` over the cache slots ``visible: bool[B, T,
  S]`` marks (f32), the reference implementations' shared core. The scaled scores are soft-capped
  (:func:`soft_cap`) before the mask when ``logit_soft_cap`` is set. Slots at or past ``lengths`` are
  zeroed before use, so a NaN there never reaches the result; a query that sees nothing outputs 0."""
  num_q, num_heads, head_dim = q.shape[1:]
  num_kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
  group = num_heads // num_kv_heads
  scale = head_dim**-0.5 if sm_scale is None else sm_scale
  # Fold the query heads of a group and the query tokens into one axis R = T * G, so that each (row,
  # kv head) is one [R, H] x [S, H] product read straight from the cache's [B, K, S, H] layout. Both
  # products take the cache in its own dtype and accumulate in f32 (the softmax is f32): a bf16 cache
  # is never copied to f32, as the Pallas kernels read it.
  q_f = _fold((q.astype(jnp.float32) * scale).astype(k_cache.dtype), num_kv_heads)
  logits = jnp.einsum("bkrh,bksh->bkrs", q_f, k_cache, preferred_element_type=jnp.float32)
  logits = soft_cap(logits, logit_soft_cap)  # NaN from a slot past the length is masked just below
  visible = jnp.repeat(visible, group, axis=1)  # [B, R, S], rows ordered (t, g) as _fold
  probs = jax.nn.softmax(jnp.where(visible[:, None], logits, -jnp.inf), axis=-1)
  probs = jnp.where(jnp.any(visible, axis=-1)[:, None, :, None], probs, 0.0)
  # A zero probability times a NaN in an invalid slot is still NaN: zero the invalid values too.
  slots = jnp.arange(max_len)
  valid = slots[None, :] < lengths[:, None]  # [B, S]
  v = jnp.where(valid[:, None, :, None], v_cache, jnp.zeros((), v_cache.dtype))
  out = jnp.einsum("bkrs,bksh->bkrh", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return _unfold(out, num_q).astype(q.dtype)


def reference_tree_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    tree_mask: jax.Array,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
) -> jax.Array:
  """Attention of a token tree's T newest nodes over a ragged cache, in plain jnp (f32 softmax).

  The tree verification of EAGLE-2 / SpecInfer (docs/design.md, "Token trees"): the last M slots of
  each row (``lengths[b] - M … lengths[b] - 1``) hold the nodes of one tree per row, of which the
  queries are the T newest (``M >= T``; M > T while a draft grows its tree level by level). Query t
  attends to its row's whole prefix (slots below ``lengths[b] - M``) and to the tree slots
  ``tree_mask[b, t]`` marks, its own ancestors and itself (``bass_jax.sampling.tree.ancestor_mask``),
  never to its siblings' branches. Positions follow depth, not slots: query t sits at position
  ``lengths[b] - M + depth(t)`` (:func:`mask_depths`), which is what a sliding window compares (RoPE
  takes the same positions from the caller). With M == T and the causal mask of a chain
  (``tree_mask[t, j] = j <= t``) this is :func:`reference_attention`.

  Args:
    q: ``[B, T, N, H]`` queries (rotary applied at the nodes' positions).
    k_cache, v_cache: ``[B, K, S, H]``, the tree's K/V already written at slots
      ``lengths - M … lengths - 1``.
    lengths: ``i32[B]`` valid slots including the M tree slots.
    tree_mask: ``bool[B, T, M]``, ``[b, t, j]``: query t sees tree slot j (True at its own slot, the
      last T, for a real node; a padding node's row may be all False: it sees the prefix only).
    sm_scale, sliding_window, logit_soft_cap: as :func:`reference_attention` (a window needs
      ``M == T``).

  Returns:
    ``[B, T, N, H]`` in q's dtype.

  Raises:
    ValueError: a sliding window with ``M > T``.
  """
  batch, num_q = q.shape[:2]
  num_tree = tree_mask.shape[2]
  if sliding_window is not None and num_tree != num_q:
    raise ValueError("a sliding window over a tree needs every tree node as a query (M == T)")
  max_len = k_cache.shape[2]
  slots = jnp.arange(max_len)
  base = lengths - num_tree  # [B]: the tree's first slot
  node = jnp.clip(slots[None, :] - base[:, None], 0, num_tree - 1)  # [B, S]: the node a slot holds
  is_new = (slots[None, :] >= base[:, None]) & (slots[None, :] < lengths[:, None])  # [B, S]
  sees_node = jnp.take_along_axis(tree_mask, jnp.broadcast_to(node[:, None, :], (batch, num_q, max_len)),
                                  axis=2)  # [B, T, S]: node t sees the node in slot s
  visible = (slots[None, None, :] < base[:, None, None]) | (is_new[:, None, :] & sees_node)
  if sliding_window is not None:
    depth = mask_depths(tree_mask)
    q_pos = base[:, None] + depth  # [B, T]
    slot_pos = jnp.where(is_new, base[:, None] + jnp.take_along_axis(depth, node, axis=1), slots)
    visible &= slot_pos[:, None, :] > q_pos[:, :, None] - sliding_window
  return _attend_visible(q, k_cache, v_cache, lengths, visible, sm_scale, logit_soft_cap)


def mask_depths(tree_mask: jax.Array) -> jax.Array:
  """``i32[B, T]`` each query's depth in its token tree: the number of its ancestors, i.e.
  ``sum(tree_mask[b, t]) - 1`` for ``tree_mask: bool[B, T, M]`` (which marks the node itself and its
  ancestors); 0 for a padding node, whose row is all False."""
  return jnp.maximum(jnp.sum(tree_mask, axis=-1, dtype=jnp.int32) - 1, 0)


def merged_tree_attention(prefix: Callable[..., tuple], q: jax.Array, k_cache: jax.Array,
                          v_cache: jax.Array, lengths: jax.Array, tree_mask: jax.Array, *,
                          sm_scale: float | None = None, sliding_window: int | None = None,
                          logit_soft_cap: float | None = None) -> jax.Array:
  """Tree attention as two exact segments: the row's prefix through a ragged kernel, the tree's nodes
  densely, merged by their softmax statistics (the flash-decoding merge; FlashInfer's cascade).

  ``prefix`` is a ragged attention that takes ``kv_lengths`` and ``return_residuals``
  (``pallas_kernels.ragged_attention``, :func:`blocked_attention`; it returns ``(out, (m, l))``, the
  softmax's row maxima and sums): it reads slots ``< lengths - M`` only, where every node sees every
  slot, so its causal mask never cuts. The tree's K/V (M slots per row, gathered once per layer and
  repeated over each KV head's query group, in f32) go through a dense ``[T, M]`` attention under
  ``tree_mask``. With ``logit_soft_cap`` both segments cap their scaled scores (the prefix's through
  its own ``logit_soft_cap``, passed only when set), so the merged statistics are the capped softmax's.
  The result equals :func:`reference_tree_attention` (same arguments) up to float rounding.

  Args:
    prefix: the ragged attention of the prefix (above).
    q: ``[B, T, N, H]``. k_cache, v_cache: ``[B, K, S, H]`` with the tree's K/V at slots
      ``lengths - M … lengths - 1``. lengths: ``i32[B]``, tree slots included.
    tree_mask: ``bool[B, T, M]`` as :func:`reference_tree_attention`. sm_scale, logit_soft_cap: as
      there.

  Returns:
    ``[B, T, N, H]`` in q's dtype.

  Raises:
    ValueError: a ``sliding_window``: the kernels place queries by slot, a tree by depth (use
      ``attention_impl="reference"`` for sliding-window models with trees).
  """
  if sliding_window is not None:
    raise ValueError("tree attention with a sliding window runs on attention_impl='reference' only: "
                     "the kernels place a query by its slot, a tree node sits at its depth")
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads = k_cache.shape[1]
  group = num_heads // num_kv_heads
  scale = head_dim**-0.5 if sm_scale is None else sm_scale
  base = lengths - tree_mask.shape[2]
  cap = {} if logit_soft_cap is None else {"logit_soft_cap": logit_soft_cap}
  out_p, (m_p, l_p) = prefix(q, k_cache, v_cache, lengths, kv_lengths=base, sm_scale=scale,
                             return_residuals=True, **cap)
  node_slots = (base[:, None] + jnp.arange(tree_mask.shape[2]))[:, None, :, None]  # [B, 1, M, 1]
  k_n = jnp.take_along_axis(k_cache, node_slots, axis=2).astype(jnp.float32)  # [B, K, M, H]
  v_n = jnp.take_along_axis(v_cache, node_slots, axis=2).astype(jnp.float32)
  k_n, v_n = jnp.repeat(k_n, group, axis=1), jnp.repeat(v_n, group, axis=1)  # [B, N, M, H]
  logits = soft_cap(jnp.einsum("btnh,bnjh->btnj", q.astype(jnp.float32) * scale, k_n), logit_soft_cap)
  sees = tree_mask[:, :, None, :]  # [B, T, 1, M]
  logits = jnp.where(sees, logits, _MASK_VALUE)
  m_n = jnp.max(logits, axis=-1)  # [B, T, N]
  p = jnp.where(sees, jnp.exp(logits - m_n[..., None]), 0.0)
  l_n = jnp.sum(p, axis=-1)
  acc_n = jnp.einsum("btnj,bnjh->btnh", p, v_n)
  m = jnp.maximum(m_p, m_n)
  w_p = jnp.where(l_p > 0, l_p * jnp.exp(m_p - m), 0.0)  # [B, T, N]
  w_n = jnp.exp(m_n - m)
  total = w_p + w_n * l_n
  out = out_p.astype(jnp.float32) * w_p[..., None] + acc_n * w_n[..., None]
  return (out / jnp.where(total > 0, total, 1.0)[..., None]).astype(q.dtype)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, sm_scale: float | None = None,
                     sliding_window: int | None = None, logit_soft_cap: float | None = None,
                     implementation: str | None = None) -> jax.Array:
  """Causal grouped-query attention among T tokens, without a cache (a prefill, a full forward, training).

  Args:
    q: ``[B, T, N, H]``; k, v: ``[B, T, K, H]``; sm_scale, sliding_window, logit_soft_cap: as
      :func:`reference_attention`.
    implementation: ``"reference"``: the jnp path here, which materializes ``f32[B, K, T * G, T]``
      logits (fastest on a CPU). ``"xla"`` or ``"cudnn"``: ``jax.nn.dot_product_attention`` with that
      implementation (``"cudnn"``: cuDNN's fused flash attention, GPU only, bf16 or f16, never
      materializing the logits). None: :func:`causal_implementation`'s choice for the platform the
      program is traced for and q's dtype. ``jax.nn.dot_product_attention`` has no soft cap, so with
      ``logit_soft_cap`` set every implementation runs the jnp path (logits materialized).

  Returns:
    ``[B, T, N, H]`` in q's dtype; token t attends to tokens ``0 … t``.

  Raises:
    ValueError: an unknown ``implementation``.
  """
  implementation = implementation or causal_implementation(q.dtype)
  num_q, num_heads, head_dim = q.shape[1:]
  scale = head_dim**-0.5 if sm_scale is None else sm_scale
  if implementation not in ("reference", "xla", "cudnn"):
    raise ValueError(f"causal attention implementation must be 'reference', 'xla' or 'cudnn', got "
                     f"{implementation!r}")
  if implementation != "reference" and logit_soft_cap is None:  # no soft cap in jax.nn's attention
    # A query at position p sees p - (w - 1) ... p: a left window of w - 1 tokens, none on the right.
    window = None if sliding_window is None else (sliding_window - 1, 0)
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                        local_window_size=window, implementation=implementation)
  num_kv_heads = k.shape[2]
  group = num_heads // num_kv_heads
  q_f = _fold((q.astype(jnp.float32) * scale).astype(k.dtype), num_kv_heads)
  logits = soft_cap(jnp.einsum("bkrh,btkh->bkrt", q_f, k, preferred_element_type=jnp.float32),
                    logit_soft_cap)
  t_row = jnp.arange(num_q * group) // group
  t_key = jnp.arange(num_q)
  visible = t_key[None, :] <= t_row[:, None]
  if sliding_window is not None:
    visible &= t_key[None, :] > t_row[:, None] - sliding_window
  probs = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
  out = jnp.einsum("bkrt,btkh->bkrh", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return _unfold(out, num_q).astype(q.dtype)


def causal_implementation(dtype) -> str:
  """The causal attention a prefill or full forward runs (:func:`causal_attention`): ``"cudnn"``
  (flash attention through ``jax.nn.dot_product_attention``) on a GPU platform
  (``platforms.compile_platform``) for bf16 or f16, which cuDNN's fused kernel takes (``"xla"`` when
  tracing for a GPU on a machine without one, where cuDNN is absent); ``"reference"`` elsewhere, the
  jnp path, which is the faster one on a CPU and the only one for f32 on a GPU."""
  if (platforms.is_gpu(platforms.compile_platform())
      and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)):
    # cuDNN's version is checked while tracing: lowering for a GPU on a machine without one (the
    # deviceless census, ``platforms.compiling_for``) takes XLA's own attention for the prefill instead.
    return "cudnn" if platforms.has_gpu() else "xla"
  return "reference"


def blocked_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    *,
    variant: str = "pad",
    block_k: int = 64,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    kv_lengths: jax.Array | None = None,
    return_residuals: bool = False,
):
  """BASS-PAD / BASS-SPLIT in plain JAX: the Pallas kernels' algorithm for backends without them.

  The cache is walked in ``block_k``-slot blocks with an online (flash) softmax, the query heads of a
  group and the query tokens folded into R = T * G rows. ``"pad"`` runs one batched loop to the batch's
  longest row (BASS-PAD); ``"split"`` maps over the rows, each looping only over its own blocks
  (BASS-SPLIT, one sequential pass per sequence, like the paper's one kernel per sequence). XLA compiles
  both to native code, so on a CPU they show what the two strategies cost, which the interpreted
  Pallas kernels cannot.

  Args:
    q, k_cache, v_cache, lengths, sm_scale, sliding_window, logit_soft_cap: as
      :func:`reference_attention` (the cap applies per block, before the mask and the online softmax).
    variant: ``"pad"`` or ``"split"``.
    block_k: slots per block; must divide S.
    kv_lengths: ``i32[B]`` valid slots per row when they end before ``lengths`` (which then only
      places the queries): the prefix of a tree attention (:func:`merged_tree_attention`).
    return_residuals: also return the softmax statistics ``(m, l)``, ``f32[B, T, N]`` each, as
      ``pallas_kernels.ragged_attention`` does (a row that sees nothing has ``l = 0``; ``m`` is
      over the capped logits when ``logit_soft_cap`` is set).

  Returns:
    ``[B, T, N, H]`` in q's dtype, or ``(out, (m, l))`` with ``return_residuals``.

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
  q_pos = lengths[:, None] - num_q + jnp.arange(rows) // group  # [B, R]
  kv_lengths = lengths if kv_lengths is None else kv_lengths

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
      logits = soft_cap(jnp.einsum("bkrh,bksh->bkrs", q_f, kb), logit_soft_cap)
      visible = valid[:, None, :] & (slots[None, None, :] <= q_pos[:, :, None])  # [b, R, block]
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
    out, m, l = attend(q_f, k_cache, v_cache, kv_lengths, q_pos, -(-jnp.max(kv_lengths) // block_k))
  else:
    def one_row(args):
      q_r, k_r, v_r, length, pos = args
      out, m, l = attend(q_r[None], k_r[None], v_r[None], length[None], pos[None],
                         -(-length // block_k))
      return out[0], m[0], l[0]

    out, m, l = jax.lax.map(one_row, (q_f, k_cache, v_cache, kv_lengths, q_pos))
  out = _unfold(out, num_q).astype(q.dtype)
  if not return_residuals:
    return out
  unfold = lambda x: _unfold(x[..., None], num_q)[..., 0]
  return out, (unfold(m), unfold(l))
