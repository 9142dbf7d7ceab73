"""Ragged attention for batched speculative decoding, as a Pallas GPU kernel (Triton lowering).

BASS (Qian et al. 2024, §3.1, Fig. 4; docs/bass.md): after every step each sequence of the batch
has its own length, so attention runs over K/V caches of per-row length while Q is dense (every row
scores the same number T of new tokens: 1 in a draft step, ``l_draft + 1`` in verification, the padded
prompt in prefill). Query t of row b sits at position ``lengths[b] - T + t`` and attends to cache slots
``0 … lengths[b] - T + t`` (end-aligned causal mask, the ``kv_len - q_len + i`` rule of JAX's TPU ragged
paged attention).

Two variants, as in the paper:

* ``"pad"`` (BASS-PAD): every program walks K/V blocks up to the longest row of the batch and masks
  what lies past its own row's length.
* ``"split"`` (BASS-SPLIT, in one launch): every program walks only its own row's blocks; the loop bound
  is read from ``lengths[b]`` (and from the causal limit of its query block).

Both take the same static options: ``sliding_window`` (Mistral; a model may pass a different window per
layer, each a variant of its own) and ``logit_soft_cap`` (Gemma 2: the scaled scores ``s`` become ``cap *
tanh(s / cap)`` inside the kernel, before the mask and the online softmax, so the softmax statistics and
the flash-decoding merge are those of the capped logits).

Layout. Grouped-query attention is folded: the G query heads that share a key/value head and the T
query tokens form R = T * G rows, ordered (t, g), so one program computes a ``[block_r, H]`` tile against
``[block_k, H]`` key blocks of one (row, kv head) and every K/V block is read once per query block, not
once per query head (the trick of JAX's GPU decode attention and TPU ragged paged attention). The grid
is ``(B, K, R / block_r, num_splits)``; ``num_splits > 1`` partitions the cache (flash decoding) and the
wrapper merges the partial results exactly from their softmax statistics, which :func:`ragged_attention`
can also return (``return_residuals``) for merges done by a caller.

Backend. The kernel uses the Triton-lowered Pallas GPU backend (``jax.experimental.pallas.triton``:
``load``/``store`` with masks, ``dot``): the same source runs compiled on NVIDIA GPUs and, with
``interpret=True``, on a CPU, which is how the tests check it. Its API is unchanged from JAX 0.10 to
0.11 (0.11 deprecates the backend, and exporting for CUDA on a host without a GPU then needs an
abstract GPU device: docs/kernels.md). JAX's newer GPU backend, Mosaic GPU
(``jax.experimental.pallas.mosaic_gpu``), targets Hopper and later with warpgroup matmuls and TMA
copies and is where JAX's own GPU attention kernels are moving; the Triton backend is deprecated
there in its favour. Migrating means re-expressing this kernel's loop over K/V blocks as an
``emit_pipeline`` of TMA copies into shared memory and its two products as ``wgmma`` calls, keeping
the fold, the masks and the merge as they are (`docs/kernels.md`).

Axes: B batch, T new tokens per row, S cache slots, N query heads, K key/value heads, G = N / K,
R = T * G folded query rows, H head dim.
"""

from __future__ import annotations

import functools
import math

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp
import numpy as np

from pallas_kernels.tiling import MIN_BLOCK, BlockSizes, block_k_for, head_chunks

VARIANTS = ("pad", "split")
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: no inf - inf in the online softmax


# The custom call a Pallas Triton kernel lowers to in StableHLO (JAX 0.10), e.g. in ``jax.export``.
TRITON_CUSTOM_CALL = "__gpu$xla.gpu.triton"


def _ragged_attention_kernel(
    lengths_ref,  # i32[]: end position of this row's queries (query t sits at lengths - T + t)
    kv_lengths_ref,  # i32[]: valid key slots of this row (slots at or past it are never read)
    max_length_ref,  # i32[]: the largest kv length of the batch (the PAD loop bound)
    q_ref,  # [block_r, H] folded queries of one (row, kv head, query block)
    k_ref,  # [split_len, H] this split's keys of one (row, kv head)
    v_ref,  # [split_len, H]
    o_ref,  # [block_r, H] output (normalized within this split)
    m_ref,  # f32[block_r] running max of the logits (natural-log domain)
    l_ref,  # f32[block_r] softmax denominator relative to m
    *,
    sm_scale: float,
    num_q: int,
    group: int,
    block_r: int,
    block_k: int,
    split_len: int,
    variant: str,
    sliding_window: int | None,
    logit_soft_cap: float | None,
    allow_tf32: bool | None,
):
  split = pl.program_id(3)
  length = lengths_ref[()]
  kv_length = kv_lengths_ref[()]
  rows = pl.program_id(2) * block_r + jnp.arange(block_r)
  q_pos = length - num_q + rows // group  # padded rows (t >= T) see the whole row: harmless
  start = split * split_len  # first cache slot of this split

  first_block = 0
  if variant == "pad":
    end = max_length_ref[()]
  else:  # own row only, and no further than the last query of this block can see
    last_t = jnp.minimum((pl.program_id(2) * block_r + block_r - 1) // group, num_q - 1)
    end = jnp.minimum(kv_length, length - num_q + last_t + 1)
    if sliding_window is not None:  # nor earlier than the first query's window reaches
      first_t = jnp.minimum(pl.program_id(2) * block_r // group, num_q - 1)
      oldest = length - num_q + first_t - sliding_window + 1
      first_block = jnp.clip(oldest - start, 0, split_len) // block_k
  num_blocks = pl.cdiv(jnp.clip(end - start, 0, split_len), block_k)

  chunks = head_chunks(q_ref.shape[-1])  # static (offset, size) column tiles, powers of two
  qs = [q_ref[:, pl.ds(off, size)] for off, size in chunks]

  def body(i, carry):
    accs, m_prev, l_prev = carry
    slots = start + i * block_k + jnp.arange(block_k)
    valid = slots < kv_length
    block = pl.ds(i * block_k, block_k)
    # Masked loads: slots past the row's length are never read (they may hold NaN or stale drafts).
    # A head that is not a power of two is taken in column tiles that are: q . k sums their
    # products, and p . v fills each tile of the output.
    logits = None
    for q, (off, size) in zip(qs, chunks):
      k = plgpu.load(k_ref.at[block, pl.ds(off, size)], mask=valid[:, None], other=0.0)
      part = plgpu.dot(q, k, trans_b=True, allow_tf32=allow_tf32)  # f32[block_r, block_k]
      logits = part if logits is None else logits + part
    logits = logits * sm_scale
    if logit_soft_cap is not None:  # Gemma 2: cap the scaled scores before the mask
      logits = logit_soft_cap * jnp.tanh(logits / logit_soft_cap)
    visible = valid[None, :] & (slots[None, :] <= q_pos[:, None])
    if sliding_window is not None:
      visible &= slots[None, :] > q_pos[:, None] - sliding_window
    logits = jnp.where(visible, logits, _MASK_VALUE)
    m_next = jnp.maximum(m_prev, jnp.max(logits, axis=1))
    correction = jnp.exp(m_prev - m_next)
    p = jnp.where(visible, jnp.exp(logits - m_next[:, None]), 0.0)
    new_accs = []
    for acc, (off, size) in zip(accs, chunks):
      v = plgpu.load(v_ref.at[block, pl.ds(off, size)], mask=valid[:, None], other=0.0)
      new_accs.append(correction[:, None] * acc
                      + plgpu.dot(p.astype(v.dtype), v, allow_tf32=allow_tf32))
    return tuple(new_accs), m_next, correction * l_prev + jnp.sum(p, axis=1)

  init = (tuple(jnp.zeros((block_r, size), jnp.float32) for _, size in chunks),
          jnp.full((block_r,), _MASK_VALUE, jnp.float32), jnp.zeros((block_r,), jnp.float32))
  accs, m, l = lax.fori_loop(first_block, num_blocks, body, init)
  # A split that holds none of a row's visible slots has l == 0: it outputs 0 with weight 0.
  scale = 1.0 / jnp.where(l > 0, l, 1.0)[:, None]
  for acc, (off, size) in zip(accs, chunks):
    o_ref[:, pl.ds(off, size)] = (acc * scale).astype(o_ref.dtype)
  m_ref[...] = m
  l_ref[...] = l


def _fold(q: jax.Array, num_kv_heads: int, rows_padded: int) -> jax.Array:
  """``[B, T, N, H] -> [B, K, R_pad, H]`` with rows ordered (t, g), zero-padded to ``rows_padded``."""
  batch, num_q, num_heads, head_dim = q.shape
  group = num_heads // num_kv_heads
  folded = q.reshape(batch, num_q, num_kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
  folded = folded.reshape(batch, num_kv_heads, num_q * group, head_dim)
  return jnp.pad(folded, ((0, 0), (0, 0), (0, rows_padded - num_q * group), (0, 0)))


def _unfold(o: jax.Array, num_q: int, group: int) -> jax.Array:
  """``[B, K, R_pad, H] -> [B, T, N, H]``, the inverse of :func:`_fold`."""
  batch, num_kv_heads, _, head_dim = o.shape
  o = o[:, :, :num_q * group].reshape(batch, num_kv_heads, num_q, group, head_dim)
  return o.transpose(0, 2, 1, 3, 4).reshape(batch, num_q, num_kv_heads * group, head_dim)


def _pallas_ragged_attention(q, k_cache, v_cache, lengths, kv_lengths, *, variant, sm_scale,
                             sliding_window, logit_soft_cap, block_sizes, interpret, poison_output):
  """Builds the grid and BlockSpecs and runs the kernel; returns ``(out [B, T, N, H], m, l)``."""
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
  group = num_heads // num_kv_heads
  rows = num_q * group
  block_r = min(block_sizes.block_r, max(MIN_BLOCK, pl.next_power_of_2(rows)))
  rows_padded = pl.cdiv(rows, block_r) * block_r
  splits = block_sizes.num_splits
  split_len = max_len // splits
  block_k = block_k_for(split_len, block_sizes.block_k)
  q_folded = _fold(q, num_kv_heads, rows_padded)

  kernel = functools.partial(
      _ragged_attention_kernel, sm_scale=sm_scale, num_q=num_q, group=group, block_r=block_r,
      block_k=block_k, split_len=split_len, variant=variant, sliding_window=sliding_window,
      logit_soft_cap=logit_soft_cap, allow_tf32=False if q.dtype == jnp.float32 else None)
  grid = (batch, num_kv_heads, rows_padded // block_r, splits)
  # With one split the output is final and takes q's dtype; partial results stay in f32 for the merge.
  out_dtype = q.dtype if splits == 1 else jnp.float32
  out_shape = [
      jax.ShapeDtypeStruct((splits, batch, num_kv_heads, rows_padded, head_dim), out_dtype),
      jax.ShapeDtypeStruct((splits, batch, num_kv_heads, rows_padded), jnp.float32),
      jax.ShapeDtypeStruct((splits, batch, num_kv_heads, rows_padded), jnp.float32),
  ]
  in_specs = [
      pl.BlockSpec((None,), lambda b, h, r, s: (b,)),  # lengths
      pl.BlockSpec((None,), lambda b, h, r, s: (b,)),  # kv lengths
      pl.BlockSpec((), lambda b, h, r, s: ()),  # max kv length
      pl.BlockSpec((None, None, block_r, head_dim), lambda b, h, r, s: (b, h, r, 0)),  # q
      pl.BlockSpec((None, None, split_len, head_dim), lambda b, h, r, s: (b, h, s, 0)),  # k
      pl.BlockSpec((None, None, split_len, head_dim), lambda b, h, r, s: (b, h, s, 0)),  # v
  ]
  out_specs = [
      pl.BlockSpec((None, None, None, block_r, head_dim), lambda b, h, r, s: (s, b, h, r, 0)),
      pl.BlockSpec((None, None, None, block_r), lambda b, h, r, s: (s, b, h, r)),
      pl.BlockSpec((None, None, None, block_r), lambda b, h, r, s: (s, b, h, r)),
  ]
  operands = [lengths, kv_lengths, jnp.max(kv_lengths), q_folded, k_cache, v_cache]
  aliases = {}
  if poison_output:
    # The outputs start as NaN (aliased inputs the kernel never reads), so a tile it fails to write
    # shows up instead of reading as zeros.
    kernel = _ignore_aliased_inputs(kernel, len(operands), len(out_shape))
    aliases = {len(operands) + i: i for i in range(len(out_shape))}
    operands += [jnp.full(o.shape, jnp.nan, o.dtype) for o in out_shape]
    in_specs += out_specs
  if block_sizes.num_warps is None:
    num_warps = 4 if head_dim <= 64 else 8
  else:
    num_warps = block_sizes.num_warps
  o, m, l = pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      input_output_aliases=aliases,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=block_sizes.num_stages),
      interpret=interpret,
      name=f"bass_ragged_attention_{variant}",
  )(*operands)

  if splits > 1:  # exact merge of the partial softmaxes (flash decoding)
    m_all = jnp.max(m, axis=0)
    weight = l * jnp.exp(m - m_all[None])
    l_all = jnp.sum(weight, axis=0)
    o = jnp.sum(weight[..., None] * o, axis=0) / jnp.where(l_all > 0, l_all, 1.0)[..., None]
    m, l = m_all, l_all
  else:
    o, m, l = o[0], m[0], l[0]
  return _unfold(o.astype(q.dtype), num_q, group), m, l


def _ignore_aliased_inputs(kernel, num_inputs, num_aliased):
  """Adapts the kernel to extra (aliased, unused) input refs placed after the real inputs."""

  def wrapped(*refs):
    return kernel(*refs[:num_inputs], *refs[num_inputs + num_aliased:])

  return wrapped


def _validate(q, k_cache, v_cache, lengths, kv_lengths, variant, block_sizes):
  if variant not in VARIANTS:
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
  if q.ndim != 4 or k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
    raise ValueError(f"need q [B, T, N, H] and k_cache = v_cache [B, K, S, H]; got q {q.shape}, "
                     f"k_cache {k_cache.shape}, v_cache {v_cache.shape}")
  batch, num_q, num_heads, head_dim = q.shape
  if k_cache.shape[0] != batch or k_cache.shape[3] != head_dim:
    raise ValueError(f"q {q.shape} and k_cache {k_cache.shape} disagree on batch or head dim")
  if num_heads % k_cache.shape[1]:
    raise ValueError(f"query heads ({num_heads}) must be a multiple of key/value heads "
                     f"({k_cache.shape[1]})")
  head_chunks(head_dim)  # raises for a head dim the kernel cannot tile
  if q.dtype not in (jnp.float32, jnp.bfloat16) or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
    raise ValueError(f"q, k_cache and v_cache must share one dtype, float32 or bfloat16; got "
                     f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
  if lengths.shape != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f"lengths must be an integer array of shape ({batch},), got {lengths.dtype}"
                     f"{lengths.shape}")
  max_len = k_cache.shape[2]
  split_len, rem = divmod(max_len, block_sizes.num_splits)
  if rem or block_k_for(split_len, block_sizes.block_k) is None:
    raise ValueError(
        f"cache length S={max_len} must split into {block_sizes.num_splits} equal parts that are "
        f"multiples of {MIN_BLOCK}; size the cache to a multiple of block_k={block_sizes.block_k}")
  if kv_lengths.shape != (batch,) or not jnp.issubdtype(kv_lengths.dtype, jnp.integer):
    raise ValueError(f"kv_lengths must be an integer array of shape ({batch},), got "
                     f"{kv_lengths.dtype}{kv_lengths.shape}")
  if not isinstance(lengths, jax.core.Tracer) and not isinstance(kv_lengths, jax.core.Tracer):
    lengths_np, kv_np = np.asarray(lengths), np.asarray(kv_lengths)
    if (lengths_np < num_q).any():
      raise ValueError(f"every length must satisfy lengths[b] >= T={num_q} (it is the end position "
                       f"of the T queries); got {lengths_np.tolist()}")
    if (kv_np < 0).any() or (kv_np > max_len).any() or (kv_np > lengths_np).any():
      raise ValueError(f"kv_lengths must satisfy 0 <= kv_lengths[b] <= min(lengths[b], S={max_len}); "
                       f"got kv_lengths {kv_np.tolist()} and lengths {lengths_np.tolist()}")


def ragged_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    *,
    kv_lengths: jax.Array | None = None,
    variant: str = "pad",
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    block_sizes: BlockSizes = BlockSizes(),
    interpret: bool = False,
    return_residuals: bool = False,
    debug_poison_output: bool = False,
):
  """End-aligned causal grouped-query attention over a ragged KV cache (BASS §3.1).

  Args:
    q: ``[B, T, N, H]`` float32 or bfloat16: the T newest tokens of each row, already written into the
      cache at slots ``lengths[b] - T … lengths[b] - 1``. H is any multiple of 16 (64, 80, 96, 128,
      256, ...): a head that is not a power of two runs in power-of-two column tiles
      (``tiling.head_chunks``).
    k_cache, v_cache: ``[B, K, S, H]`` in q's dtype, ``N % K == 0``; slots at and past ``lengths[b]`` are
      never read.
    lengths: ``i32[B]``, the end position of each row's queries: query t sits at ``lengths[b] - T + t``.
      With ``kv_lengths`` None it also counts the valid slots, the T new ones included
      (``T <= lengths[b] <= S``).
    kv_lengths: ``i32[B]`` valid slots per row, if they end before ``lengths``: for a caller that
      attends the new tokens apart (two segments) and merges with ``return_residuals``;
      ``0 <= kv_lengths[b] <= min(lengths[b], S)``, and a row with none outputs 0 with ``l = 0``.
      bass_jax's token-tree attention uses it (``bass_jax.models.attention.merged_tree_attention``);
      its chain steps write the new K/V into the cache first and do not.
    variant: ``"pad"`` (walk to the batch's longest row) or ``"split"`` (walk only the own row).
    sm_scale: softmax scale, default ``1 / sqrt(H)``.
    sliding_window: if set (Mistral), a query at position p also ignores slots ``<= p - sliding_window``;
      SPLIT then starts its loop at the first block the window reaches.
    logit_soft_cap: if set (Gemma 2 report; transformers ``modeling_gemma2.py``), the scaled scores
      ``s = q . k * sm_scale`` become ``cap * tanh(s / cap)`` before the mask and the softmax; a
      positive float, static (each value compiles its own kernel). None caps nothing.
    block_sizes: ``tiling.BlockSizes``; S must split into ``num_splits`` multiples of 16.
    interpret: run the kernel in the Pallas interpreter (any backend, e.g. a CPU).
    return_residuals: also return the softmax statistics ``(m, l)`` per query row and head, each
      ``f32[B, T, N]``: ``m`` the max logit (natural log, scaled, and capped with
      ``logit_soft_cap``), ``l = sum(exp(logit - m))``, so that results over disjoint key sets merge
      exactly.
    debug_poison_output: start the kernel's output buffers as NaN (a check that every tile is
      written; tests use it).

  Returns:
    ``[B, T, N, H]`` in q's dtype (softmax computed in f32 with an online, flash-style update), or
    ``(out, (m, l))`` with ``return_residuals``.

  Raises:
    ValueError: mismatched shapes or dtypes, a head dim that is not a multiple of 16, a cache
      length that does not split into ``num_splits`` multiples of 16, an unknown variant, a
      ``sliding_window < 1`` or ``logit_soft_cap <= 0``, or (when lengths are concrete) a length
      outside ``[T, S]``.
  """
  lengths = jnp.asarray(lengths) if not isinstance(lengths, jax.core.Tracer) else lengths
  kv_lengths = lengths if kv_lengths is None else kv_lengths
  kv_lengths = jnp.asarray(kv_lengths) if not isinstance(kv_lengths, jax.core.Tracer) else kv_lengths
  _validate(q, k_cache, v_cache, lengths, kv_lengths, variant, block_sizes)
  if sliding_window is not None and sliding_window < 1:
    raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
  if logit_soft_cap is not None:
    if not logit_soft_cap > 0:
      raise ValueError(f"logit_soft_cap must be > 0 or None, got {logit_soft_cap}")
    logit_soft_cap = float(logit_soft_cap)  # static: one hashable value per cap
  return _ragged_attention_jit(q, k_cache, v_cache, lengths.astype(jnp.int32),
                               kv_lengths.astype(jnp.int32), variant=variant,
                               sm_scale=sm_scale, sliding_window=sliding_window,
                               logit_soft_cap=logit_soft_cap, block_sizes=block_sizes,
                               interpret=interpret, return_residuals=return_residuals,
                               poison_output=debug_poison_output)


@functools.partial(jax.jit, static_argnames=("variant", "sm_scale", "sliding_window", "logit_soft_cap",
                                             "block_sizes", "interpret", "return_residuals",
                                             "poison_output"))
def _ragged_attention_jit(q, k_cache, v_cache, lengths, kv_lengths, *, variant, sm_scale,
                          sliding_window, logit_soft_cap, block_sizes, interpret, return_residuals,
                          poison_output):
  num_q, num_heads, head_dim = q.shape[1:]
  if sm_scale is None:
    sm_scale = 1.0 / math.sqrt(head_dim)
  out, m, l = _pallas_ragged_attention(q, k_cache, v_cache, lengths, kv_lengths, variant=variant,
                                       sm_scale=sm_scale, sliding_window=sliding_window,
                                       logit_soft_cap=logit_soft_cap, block_sizes=block_sizes,
                                       interpret=interpret, poison_output=poison_output)
  if not return_residuals:
    return out
  group = num_heads // k_cache.shape[1]
  m = _unfold(m[..., None], num_q, group)[..., 0]
  l = _unfold(l[..., None], num_q, group)[..., 0]
  return out, (m, l)


def ragged_attention_reference(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    *,
    kv_lengths: jax.Array | None = None,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
    return_residuals: bool = False,
):
  """Plain-jnp reference of :func:`ragged_attention`, computed in f32 (same arguments and results;
  ``logit_soft_cap`` caps the scaled scores, ``cap * tanh(s / cap)``, before the mask).

  Slots at and past ``kv_lengths[b]`` are masked in both products, so NaN there does not propagate.
  """
  kv_lengths = lengths if kv_lengths is None else kv_lengths
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
  group = num_heads // num_kv_heads
  if sm_scale is None:
    sm_scale = 1.0 / math.sqrt(head_dim)
  slots = jnp.arange(max_len)
  valid = slots[None, :] < kv_lengths[:, None]  # [B, S]
  k = jnp.where(valid[:, None, :, None], k_cache.astype(jnp.float32), 0.0)
  v = jnp.where(valid[:, None, :, None], v_cache.astype(jnp.float32), 0.0)
  k = jnp.repeat(k, group, axis=1)  # [B, N, S, H]
  v = jnp.repeat(v, group, axis=1)
  logits = jnp.einsum("btnh,bnsh->bnts", q.astype(jnp.float32), k) * sm_scale
  if logit_soft_cap is not None:
    logits = logit_soft_cap * jnp.tanh(logits / logit_soft_cap)
  q_pos = lengths[:, None] - num_q + jnp.arange(num_q)  # [B, T]
  visible = valid[:, None, :] & (slots[None, None, :] <= q_pos[:, :, None])  # [B, T, S]
  if sliding_window is not None:
    visible &= slots[None, None, :] > q_pos[:, :, None] - sliding_window
  logits = jnp.where(visible[:, None], logits, _MASK_VALUE)
  m = jnp.max(logits, axis=-1)  # [B, N, T]
  p = jnp.where(visible[:, None], jnp.exp(logits - m[..., None]), 0.0)
  l = jnp.sum(p, axis=-1)
  out = jnp.einsum("bnts,bnsh->btnh", p / jnp.where(l > 0, l, 1.0)[..., None], v).astype(q.dtype)
  if return_residuals:
    return out, (m.transpose(0, 2, 1), l.transpose(0, 2, 1))
  return out
