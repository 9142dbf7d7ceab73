"""Llama 3's rotary scaling, read back from the ``rope_freqs`` tensor llama.cpp bakes it into.

llama.cpp's converter writes no metadata key for Llama 3's ``llama3`` rotary scaling: it stores the
per-frequency divisors as a ``rope_freqs.weight`` tensor (``LlamaModel.generate_extra_tensors`` in
``convert_hf_to_gguf.py``). :func:`llama3_parameters` recovers the ``rope_parameters`` transformers
needs from them; :func:`llama3_factors` is the forward map (transformers' ``_compute_llama3_parameters``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# llama.cpp's converter computes the rope_freqs tensor with this original context (its default).
LLAMA3_ORIGINAL_CONTEXT = 8192


def llama3_factors(theta: float, head_dim: int, factor: float, low_freq_factor: float,
                   high_freq_factor: float, original: int) -> np.ndarray:
  """The per-frequency divisors of Llama 3's rotary scaling (transformers'
  ``_compute_llama3_parameters``, llama.cpp's ``LlamaModel.generate_extra_tensors``): f64 ``[H/2]``."""
  wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  with np.errstate(divide="ignore"):
    mid = 1 / ((1 - smooth) / factor + smooth)
  return np.where(wavelen < original / high_freq_factor, 1.0,
                  np.where(wavelen > original / low_freq_factor, factor, mid))


def llama3_parameters(factors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
  """Llama 3's rotary scaling parameters that give the divisors ``factors`` (a ``rope_freqs`` tensor),
  with ``original_max_position_embeddings`` :data:`LLAMA3_ORIGINAL_CONTEXT`; None for all ones.

  The divisors are 1 at high frequencies, ``factor`` at low ones, and in between ``1 / ((1 - s) /
  factor + s)`` with ``s`` linear in the inverse wavelength, so the band's edges follow from a line
  fitted through the frequencies inside it (or from the gaps around it when fewer than two are).

  Raises:
    ValueError: divisors that no Llama 3 scaling gives.
  """
  factors = np.asarray(factors, np.float64).reshape(-1)
  if factors.shape != (head_dim // 2,):
    raise ValueError(f"rope_freqs.weight has {factors.size} values; the head size {head_dim} needs "
                     f"{head_dim // 2}")
  if np.allclose(factors, 1.0, rtol=0, atol=1e-7):
    return None
  factor = float(factors.max())
  x = 1 / (2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  high = np.abs(factors - 1) <= 1e-6
  low = np.abs(factors - factor) <= 1e-6 * factor
  mid = ~high & ~low
  s = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
  x_high = x[high].min() if high.any() else 2 * x.max()  # the band lies between these two
  x_low = x[low].max() if low.any() else x.min() / 2
  if mid.sum() >= 2:
    slope, intercept = np.polyfit(x[mid], s, 1)
    x_l, x_h = -intercept / slope, (1 - intercept) / slope
  elif mid.sum() == 1:
    (x_p,), (s_p,) = x[mid], s
    width = 0.5 * min(x_high - x_p, x_p - x_low)
    x_l, x_h = x_p - s_p * width, x_p + (1 - s_p) * width
  else:
    x_l, x_h = x_low + (x_high - x_low) / 3, x_low + 2 * (x_high - x_low) / 3
  original = LLAMA3_ORIGINAL_CONTEXT
  exact = (factor, original * x_l, original * x_h)
  for digits in (6, 7, 9, 12, 17):  # the shortest values that give the same divisors
    f, lo, hi = (float(f"{v:.{digits}g}") for v in exact)
    if lo < hi and np.allclose(llama3_factors(theta, head_dim, f, lo, hi, original), factors,
                               rtol=1e-5, atol=0):
      return {"rope_type": "llama3", "factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
              "original_max_position_embeddings": original, "rope_theta": theta}
  raise ValueError("rope_freqs.weight holds rotary divisors that no Llama 3 scaling gives")
