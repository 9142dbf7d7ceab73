"""Total, checked mapping between a checkpoint's named tensors and a Flax parameter tree.

A conversion is a table of :class:`Rule` s, one per Flax parameter: the source tensor's name (with
``{layer}`` for per-layer tensors, stacked along the scanned layer axis) and the ordered transforms that
turn the source layout into the Flax layout and back. :func:`to_flax` fills every parameter, checks every
shape against the model's abstract parameters, and fails if a source tensor is left over; nothing is
converted silently or partially.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import flax.traverse_util
import jax
import numpy as np

Transform = Callable[[np.ndarray], np.ndarray]


def identity(x: np.ndarray) -> np.ndarray:
  return x


def transpose(x: np.ndarray) -> np.ndarray:
  """``[out, in]`` (PyTorch ``nn.Linear.weight``) <-> ``[in, out]`` (Flax ``Dense.kernel``)."""
  return np.ascontiguousarray(x.T)


class CheckpointError(ValueError):
  """A checkpoint does not match the model: a tensor is missing, extra or mis-shaped."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """One Flax parameter and where it comes from.

  Attributes:
    flax_path: path in the parameter tree, e.g. ``("layers", "self_attn", "q_proj", "kernel")``.
    source: the source tensor's name; per-layer rules contain ``{layer}``.
    to_flax: transforms applied in order to the source tensor (per layer).
    from_flax: transforms applied in order to go back (per layer); the inverse of ``to_flax``.
  """

  flax_path: tuple[str, ...]
  source: str
  to_flax: tuple[Transform, ...] = ()
  from_flax: tuple[Transform, ...] = ()

  @property
  def per_layer(self) -> bool:
    return "{layer}" in self.source

  def source_names(self, num_layers: int) -> list[str]:
    if self.per_layer:
      return [self.source.format(layer=i) for i in range(num_layers)]
    return [self.source]


def _apply(transforms: Iterable[Transform], x: np.ndarray) -> np.ndarray:
  for fn in transforms:
    x = fn(x)
  return x


def to_flax(
    rules: Iterable[Rule],
    *,
    source_names: Iterable[str],
    read: Callable[[str], np.ndarray],
    expected: Mapping[str, Any],
    num_layers: int,
    dtype: Any,
    ignore: Callable[[str], bool] = lambda name: False,
    where: str = "checkpoint",
) -> dict[str, Any]:
  """Builds the Flax parameter tree from source tensors.

  Args:
    rules: one rule per Flax parameter.
    source_names: every tensor name in the source.
    read: returns one source tensor as a numpy array (dequantized), by name.
    expected: the model's abstract parameters (``jax.eval_shape`` of ``init``), a nested dict of
      ``ShapeDtypeStruct``.
    num_layers: L, the length of the stacked layer axis.
    dtype: dtype of the returned arrays.
    ignore: names of source tensors that carry no parameter (e.g. precomputed rotary tables).
    where: the source's name, for error messages.

  Returns:
    Nested dict of ``jax.Array`` with exactly the structure and shapes of ``expected``.

  Raises:
    CheckpointError: a tensor is missing, left over, or has the wrong shape; a parameter has no rule.
  """
  remaining = set(source_names)
  expected_flat = flax.traverse_util.flatten_dict(dict(expected))
  out = {}
  for rule in rules:
    if rule.flax_path not in expected_flat:
      raise CheckpointError(f"{where}: rule for unknown parameter {'/'.join(rule.flax_path)}")
    names = rule.source_names(num_layers)
    missing = [n for n in names if n not in remaining]
    if missing:
      raise CheckpointError(f"{where}: missing tensor(s) {missing[:4]} (needed for "
                            f"{'/'.join(rule.flax_path)})")
    want = tuple(expected_flat[rule.flax_path].shape)
    per_tensor = want[1:] if rule.per_layer else want
    arrays = []
    for name in names:
      array = _apply(rule.to_flax, np.asarray(read(name)))
      if array.shape != per_tensor:
        raise CheckpointError(
            f"{where}: tensor {name} converts to shape {array.shape}, but the model's "
            f"{'/'.join(rule.flax_path)} needs {per_tensor}")
      arrays.append(array)
    remaining.difference_update(names)
    value = np.stack(arrays) if rule.per_layer else arrays[0]
    out[rule.flax_path] = jax.numpy.asarray(value, dtype=dtype)
  unfilled = sorted("/".join(p) for p in expected_flat if p not in out)
  if unfilled:
    raise CheckpointError(f"{where}: no rule fills parameter(s) {unfilled}")
  leftover = sorted(n for n in remaining if not ignore(n))
  if leftover:
    raise CheckpointError(
        f"{where}: {len(leftover)} tensor(s) the model has no place for, e.g. {leftover[:6]}; "
        "the checkpoint is not of this architecture or config")
  return flax.traverse_util.unflatten_dict(out)


def from_flax(rules: Iterable[Rule], params: Mapping[str, Any], *,
              num_layers: int) -> dict[str, np.ndarray]:
  """The inverse of :func:`to_flax`: named source-layout tensors (numpy, params' dtype)."""
  flat = flax.traverse_util.flatten_dict(dict(params))
  out = {}
  for rule in rules:
    value = np.asarray(jax.device_get(flat[rule.flax_path]))
    if rule.per_layer:
      for i, name in enumerate(rule.source_names(num_layers)):
        out[name] = np.ascontiguousarray(_apply(rule.from_flax, value[i]))
    else:
      out[rule.source] = np.ascontiguousarray(_apply(rule.from_flax, value))
  return out
