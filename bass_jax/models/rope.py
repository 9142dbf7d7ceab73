"""Rotary position embeddings with every scaling type of transformers: one place, one function per type.

Reference: transformers' ``modeling_rope_utils.py`` (``ROPE_INIT_FUNCTIONS``: ``default``, ``linear``,
``dynamic``, ``yarn``, ``longrope``, ``llama3``) and the families' ``apply_rotary_pos_emb`` (rotate-half
layout over the first ``dim`` channels of each head, the rest passed through: ``partial_rotary_factor``).
``tests/test_rope.py`` checks every type's frequencies and attention factor against transformers.

A :class:`Rotary` is one layer type's rotary embedding, parsed from transformers' ``rope_parameters``
(transformers 5) after its config class has standardized them: ``rope_scaling`` + ``rope_theta`` of
transformers 4 configs and ``rope_local_base_freq`` of Gemma 3 arrive in the same form
(:func:`from_parameters`). It is a frozen, hashable dataclass, so a model config holding it stays a
static ``jit`` argument.

Two types depend on the running sequence length in transformers: ``dynamic`` (NTK: the base grows once
the sequence passes ``max_position_embeddings``) and ``longrope`` (the long factors replace the short
ones once it passes ``original_max_position_embeddings``). transformers re-derives the frequencies
from the longest position of each forward and keeps the keys it cached before, so a cache's keys
depend on how the text was chunked into forwards (and a padded prompt's bucket would move the
switch); speculative and regular decoding would then differ. bass-jax always uses the frequencies of
a sequence inside the original length, and no forward goes past it: for ``dynamic`` that is the
model's context, so nothing changes; for ``longrope`` the family config reports
:attr:`Rotary.exact_context` (``original_max_position_embeddings``) as its context, and ``generate``
and ``Model.logits`` refuse a longer sequence, saying why. Inside it the frequencies are exactly
transformers'.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

# The keys each type reads from its rope_parameters (besides rope_type, rope_theta and
# partial_rotary_factor); any other key is an error rather than silently ignored.
_KEYS = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                       "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    "longrope": frozenset({"factor", "original_max_position_embeddings", "attention_factor",
                           "short_factor", "long_factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}),
}
# Keys transformers' standardization adds to every type whether it reads them or not.
_ALWAYS_ALLOWED = frozenset({"original_max_position_embeddings"})


@dataclasses.dataclass(frozen=True)
class Rotary:
  """One layer type's rotary embedding.

  Attributes:
    rope_type: one of :data:`ROPE_TYPES`.
    theta: the base (``rope_theta``).
    dim: rotated channels per head (``int(head_dim * partial_rotary_factor)``, even); the head's other
      channels pass through unrotated.
    max_position_embeddings: the model's context (``dynamic``'s threshold, the default ``factor`` of
      ``yarn`` and ``longrope``).
    factor, original_max_position_embeddings, attention_factor, beta_fast, beta_slow, mscale,
      mscale_all_dim, truncate, low_freq_factor, high_freq_factor, short_factor, long_factor: the type's
      parameters, named as in transformers' ``rope_parameters`` (None where the type has none).

  Raises:
    ValueError: from ``__post_init__``: an unknown type, an odd or non-positive ``dim``, a missing
      parameter of the type, or factor lists of the wrong length.
  """

  rope_type: str = "default"
  theta: float = 10000.0
  dim: int = 64
  max_position_embeddings: int = 2048
  factor: float | None = None
  original_max_position_embeddings: int | None = None
  attention_factor: float | None = None
  beta_fast: float | None = None
  beta_slow: float | None = None
  mscale: float | None = None
  mscale_all_dim: float | None = None
  truncate: bool = True
  low_freq_factor: float | None = None
  high_freq_factor: float | None = None
  short_factor: tuple[float, ...] | None = None
  long_factor: tuple[float, ...] | None = None

  def __post_init__(self):
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"rope_type {self.rope_type!r} is not supported; one of {ROPE_TYPES}")
    if not isinstance(self.dim, int) or self.dim < 2 or self.dim % 2:
      raise ValueError(f"rotary dim must be a positive even int (head_dim * partial_rotary_factor), "
                       f"got {self.dim!r}")
    needs = {"linear": ("factor",), "dynamic": ("factor",),
             "yarn": ("original_max_position_embeddings",),
             "longrope": ("original_max_position_embeddings", "short_factor", "long_factor"),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings")}.get(self.rope_type, ())
    missing = [n for n in needs if getattr(self, n) is None]
    if missing:
      raise ValueError(f"rope_type {self.rope_type!r} needs rope parameter(s) {missing}")
    for name in ("short_factor", "long_factor"):
      value = getattr(self, name)
      if value is not None and len(value) != self.dim // 2:
        raise ValueError(f"rope {name} has {len(value)} entries; it needs dim / 2 = {self.dim // 2}")

  # -- transformers' rules ---------------------------------------------------------------------------

  def _scaling_factor(self) -> float:
    """yarn's and longrope's factor: the config's, else the context's growth over the original."""
    return (self.factor if self.factor is not None
            else self.max_position_embeddings / self.original_max_position_embeddings)

  @property
  def attention_scaling(self) -> float:
    """The factor on ``cos`` and ``sin`` (``yarn`` and ``longrope``'s attention factor; 1 otherwise)."""
    if self.rope_type == "yarn":
      if self.attention_factor is not None:
        return float(self.attention_factor)
      factor = self._scaling_factor()
      mscale = lambda scale, m=1.0: 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
      if self.mscale and self.mscale_all_dim:
        return float(mscale(factor, self.mscale) / mscale(factor, self.mscale_all_dim))
      return float(mscale(factor))
    if self.rope_type == "longrope":
      if self.attention_factor is not None:
        return float(self.attention_factor)
      factor = self._scaling_factor()
      if factor <= 1.0:
        return 1.0
      return math.sqrt(1 + math.log(factor) / math.log(self.original_max_position_embeddings))
    return 1.0

  def _exponents(self) -> np.ndarray:
    return np.arange(0, self.dim, 2, dtype=np.int64).astype(np.float32) / np.float32(self.dim)

  def inv_freq(self) -> np.ndarray:
    """``f32[dim / 2]``: the inverse frequencies of a sequence inside the original length
    (``longrope``'s short factors; ``dynamic``'s unscaled base)."""
    base = np.float32(self.theta) ** self._exponents()
    inv = (np.float32(1.0) / base).astype(np.float32)
    if self.rope_type == "linear":
      return (inv / np.float32(self.factor)).astype(np.float32)
    if self.rope_type == "longrope":
      ext = np.asarray(self.short_factor, np.float32)
      return (np.float32(1.0) / (ext * base)).astype(np.float32)
    if self.rope_type == "llama3":
      return self._llama3(inv)
    if self.rope_type == "yarn":
      return self._yarn(base)
    return inv  # default, and dynamic inside max_position_embeddings

  def _llama3(self, inv: np.ndarray) -> np.ndarray:
    factor, low, high = self.factor, self.low_freq_factor, self.high_freq_factor
    old = self.original_max_position_embeddings
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = (2 * math.pi / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)

  def _yarn(self, pos_freqs: np.ndarray) -> np.ndarray:
    factor = self._scaling_factor()
    beta_fast, beta_slow = self.beta_fast or 32, self.beta_slow or 1
    dim, base, original = self.dim, self.theta, self.original_max_position_embeddings

    def correction_dim(rotations):
      return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if self.truncate:
      low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
      high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float32)
    inv_extrapolation = (np.float32(1.0) / pos_freqs).astype(np.float32)
    inv_interpolation = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
    return (inv_interpolation * (1 - extrapolation)
            + inv_extrapolation * extrapolation).astype(np.float32)

  @property
  def exact_context(self) -> int:
    """The longest context a cached decode reproduces exactly: ``original_max_position_embeddings``
    for ``longrope`` (see the module docstring), else ``max_position_embeddings``."""
    if self.rope_type == "longrope":
      return min(self.original_max_position_embeddings, self.max_position_embeddings)
    return self.max_position_embeddings

  # -- tables ----------------------------------------------------------------------------------------

  def sin_cos(self, positions: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """Rotary tables for ``positions: i32[B, T]`` (or ``[1, T]``), positions inside
    :attr:`exact_context` (the module docstring).

    Args:
      positions: each token's position.
      dtype: the tables' dtype (the activations').

    Returns:
      ``sin, cos: dtype[B, T, 1, dim]``, HF's rotate-half layout (the frequencies twice), scaled by
      :attr:`attention_scaling`.
    """
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(self.inv_freq())  # [B, T, R/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    scale = self.attention_scaling
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    if scale != 1.0:
      sin, cos = sin * scale, cos * scale
    return sin.astype(dtype), cos.astype(dtype)


def apply_rotary(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
  """Rotates the first ``dim`` channels of ``x: [B, T, heads, H]`` (``sin, cos: [B, T, 1, dim]``,
  ``dim <= H``): ``x * cos + rotate_half(x) * sin``; channels ``dim …`` pass through (partial
  rotary, Phi-3 and CodeGen-style models with ``partial_rotary_factor < 1``)."""
  dim = sin.shape[-1]
  rot, rest = (x, None) if dim == x.shape[-1] else (x[..., :dim], x[..., dim:])
  half = dim // 2
  rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
  out = rot * cos + rotated * sin
  return out if rest is None else jnp.concatenate([out, rest], axis=-1)


def from_parameters(params: Mapping[str, Any], *, head_dim: int, max_position_embeddings: int,
                    where: str = "rope_parameters") -> Rotary:
  """A :class:`Rotary` from one layer type's standardized ``rope_parameters`` dict (transformers 5;
  transformers' config classes bring 4.x's ``rope_scaling`` + ``rope_theta`` into this form).

  Args:
    params: ``{"rope_type": ..., "rope_theta": ..., "partial_rotary_factor"?: ..., <type's keys>}``
      (``"type"`` is read as ``"rope_type"``; transformers 4's ``"su"`` as ``"longrope"``).
    head_dim: channels per head. max_position_embeddings: the model's context.
    where: the config field, for error messages.

  Raises:
    ValueError: an unsupported type, a key the type does not read (it would be silently ignored), a
      missing key, or a partial rotary dim that is not even.
  """
  params = dict(params)
  rope_type = params.pop("rope_type", params.pop("type", "default"))
  params.pop("type", None)
  rope_type = {"su": "longrope"}.get(rope_type, rope_type)
  if rope_type not in ROPE_TYPES:
    raise ValueError(f"{where}: rope_type {rope_type!r} is not supported; one of {ROPE_TYPES}")
  theta = params.pop("rope_theta", None)
  if theta is None:
    raise ValueError(f"{where}: no rope_theta")
  partial = float(params.pop("partial_rotary_factor", None) or 1.0)
  dim = int(head_dim * partial)
  if dim % 2 or dim < 2:
    raise ValueError(f"{where}: partial_rotary_factor={partial} gives {dim} rotary channels of "
                     f"head_dim {head_dim}; it must be a positive even number")
  unknown = set(params) - _KEYS[rope_type] - _ALWAYS_ALLOWED
  if rope_type == "default":
    unknown |= {k for k in ("factor",) if params.get(k) not in (None, 1.0, 1)}
    params.pop("factor", None)
  if unknown:
    raise ValueError(f"{where}: rope parameter(s) {sorted(unknown)} are not read by rope_type "
                     f"{rope_type!r}; the port would silently ignore them")
  kwargs: dict[str, Any] = {}
  for key, value in params.items():
    if key not in _KEYS[rope_type] or value is None:
      continue
    if key in ("short_factor", "long_factor"):
      value = tuple(float(v) for v in value)
    elif key == "original_max_position_embeddings":
      value = int(value)
    elif key == "truncate":
      value = bool(value)
    else:
      value = float(value)
    kwargs[key] = value
  return Rotary(rope_type=rope_type, theta=float(theta), dim=dim,
                max_position_embeddings=int(max_position_embeddings), **kwargs)


def to_parameters(rotary: Rotary, head_dim: int) -> dict[str, Any]:
  """The inverse of :func:`from_parameters`: transformers 5's ``rope_parameters`` dict of ``rotary``."""
  out: dict[str, Any] = {"rope_type": rotary.rope_type, "rope_theta": rotary.theta}
  if rotary.dim != head_dim:
    out["partial_rotary_factor"] = rotary.dim / head_dim
  for key in sorted(_KEYS[rotary.rope_type]):
    value = getattr(rotary, key)
    if key == "truncate":
      if not value:
        out[key] = False
    elif value is not None:
      out[key] = list(value) if isinstance(value, tuple) else value
  return out


def check_no_per_type_truncate(fields: dict[str, Any]) -> None:
  """transformers' yarn reads ``truncate`` from the top level of ``rope_parameters`` only, so a
  per-layer-type ``truncate`` (Gemma 3) is inert there; refuse it rather than honour it differently.

  Raises:
    ValueError: a ``truncate`` inside a layer type's rotary parameters.
  """
  params = fields.get("rope_parameters")
  if isinstance(params, dict):
    for kind, value in params.items():
      if isinstance(value, dict) and "truncate" in value:
        raise ValueError(f"rope_parameters[{kind!r}]: truncate is not read per layer type by "
                         "transformers (yarn takes it from the top level); remove it")


def check_spellings(fields: dict[str, Any]) -> None:
  """A config that gives its rotary settings twice (``rope_theta`` beside ``rope_parameters`` or
  ``rope_scaling``; both spellings of the scaling) must give one value; transformers would keep one
  silently.

  Raises:
    ValueError: conflicting thetas, or ``rope_scaling`` and ``rope_parameters`` that disagree.
  """
  thetas = []
  if fields.get("rope_theta") is not None:
    thetas.append(float(fields["rope_theta"]))
  for key in ("rope_parameters", "rope_scaling"):
    rope = fields.get(key) or {}
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
      thetas.append(float(rope["rope_theta"]))
  if len(set(thetas)) > 1:
    raise ValueError(f"conflicting rope_theta values {thetas} in the config")
  scaling, parameters = fields.get("rope_scaling"), fields.get("rope_parameters")
  if isinstance(scaling, dict) and isinstance(parameters, dict):
    plain = lambda rope: {("rope_type" if k == "type" else k): v for k, v in rope.items()
                          if k != "rope_theta"}
    if plain(scaling) != plain(parameters):
      raise ValueError(f"conflicting rotary settings: rope_scaling {scaling} and rope_parameters "
                       f"{parameters} (transformers 4 and 5 spellings) disagree; keep one")
