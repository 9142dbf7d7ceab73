"""How the ragged-attention kernel tiles its work: the block sizes (:class:`BlockSizes`), the head
tiles (:func:`head_chunks`, and so which head sizes it takes: :func:`supports_head_dim`), the cache
blocks (:func:`block_k_for`) and flash decoding's split of the cache over a GPU's SMs
(:func:`split_count`). ``pallas_kernels.ragged_attention`` runs with them.
"""

from __future__ import annotations

import dataclasses

from jax.experimental import pallas as pl

MIN_BLOCK = 16  # Triton's dot needs every dimension >= 16


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tiling of the kernel; tune per device.

  Attributes:
    block_r: folded query rows (T * G) per program; a power of two >= 16.
    block_k: cache slots per inner iteration, a power of two >= 16; halved until it divides
      ``S / num_splits`` (which must be a multiple of 16).
    num_splits: partitions of the cache, each handled by its own programs and merged afterwards
      (split-K / flash decoding); more parallelism when ``B * K * R / block_r`` is small.
    num_warps: Triton warps per program (default 4, or 8 for head dim > 64).
    num_stages: Triton software-pipelining stages.
  """

  block_r: int = 64
  block_k: int = 64
  num_splits: int = 1
  num_warps: int | None = None
  num_stages: int = 2

  def __post_init__(self):
    for name in ("block_r", "block_k"):
      value = getattr(self, name)
      if value < MIN_BLOCK or value & (value - 1):
        raise ValueError(f"BlockSizes.{name} must be a power of two >= {MIN_BLOCK}, got {value}")
    if self.num_splits < 1:
      raise ValueError(f"BlockSizes.num_splits must be >= 1, got {self.num_splits}")


def split_count(batch: int, num_kv_heads: int, num_q: int, group: int, max_len: int, *,
                sm_count: int, block_sizes: BlockSizes = BlockSizes()) -> int:
  """Flash-decoding's split-K: how many partitions of the cache fill a GPU at this shape.

  The grid has ``B * K * ceil(T * G / block_r)`` programs per split. When that is fewer than the SMs
  (SmolLM2 at B = 1: 3 programs on a 132-SM H100), splitting the cache multiplies the programs; this
  returns the smallest power of two whose grid covers ``sm_count`` SMs, but no more splits than leave
  each one at least two blocks of ``block_k`` slots (``S / num_splits`` a multiple of 16 too), since
  every split adds a merge of its partial result. 1 when the grid already fills the device.

  Args:
    batch, num_kv_heads: B and K. num_q: T, query positions per row. group: G, query heads per KV
      head. max_len: S, the cache's slots. sm_count: the device's streaming multiprocessors.
    block_sizes: the tiling (``block_r``, ``block_k``) the kernel will run with.

  Returns:
    ``num_splits >= 1`` for :class:`BlockSizes`.
  """
  rows = num_q * group
  block_r = min(block_sizes.block_r, max(MIN_BLOCK, pl.next_power_of_2(rows)))
  programs = batch * num_kv_heads * pl.cdiv(rows, block_r)
  splits = 1
  while programs * splits < sm_count:
    more = 2 * splits
    if max_len % more or (max_len // more) % MIN_BLOCK or max_len // more < 2 * block_sizes.block_k:
      break
    splits = more
  return splits


def head_chunks(head_dim: int) -> tuple[tuple[int, int], ...]:
  """How the kernel tiles a head of ``head_dim`` channels: ``((offset, size), ...)``, each size a power
  of two >= 16 (Triton's tensors must be powers of two, its dot at least 16 wide), largest first:
  64 -> one tile; 80 -> 64 + 16 (Phi-2); 96 -> 64 + 32 (Phi-3-mini); 256 -> one tile (Gemma).

  Raises:
    ValueError: a head dim that is not a positive multiple of 16 (no such tiling exists).
  """
  if head_dim < MIN_BLOCK or head_dim % MIN_BLOCK:
    raise ValueError(f"head dim must be a multiple of {MIN_BLOCK} (>= {MIN_BLOCK}) for the Pallas "
                     f"kernel, got {head_dim}; use attention_impl='blocked_split' or 'reference'")
  chunks, offset = [], 0
  while offset < head_dim:
    size = 1 << ((head_dim - offset).bit_length() - 1)  # the largest power of two that fits
    chunks.append((offset, size))
    offset += size
  return tuple(chunks)


def supports_head_dim(head_dim: int) -> bool:
  """Whether the kernel takes heads of ``head_dim`` channels (:func:`head_chunks`)."""
  return head_dim >= MIN_BLOCK and head_dim % MIN_BLOCK == 0


def block_k_for(split_len: int, block_k: int) -> int | None:
  """The largest power of two <= ``block_k`` and >= 16 that divides ``split_len`` (None if none)."""
  while block_k >= MIN_BLOCK:
    if split_len % block_k == 0:
      return block_k
    block_k //= 2
  return None
