"""Total, checked mapping between a checkpoint's named tensors and a Flax parameter tree.

A conversion is a table of rules. A :class:`Rule` maps one source tensor (with ``{layer}`` for per-layer
tensors, which fill one parameter per layer: ``("layers", "mlp", …)`` names ``layers_0/mlp/…``,
``layers_1/mlp/…`` and so on) to one Flax parameter through ordered transforms; a
:class:`Fused` rule splits one source tensor into several parameters (CodeGen's and GPT-2's fused qkv)
and merges them back. :func:`to_flax` fills every parameter, checks every shape against the model's
abstract parameters, and fails if a source tensor is left over; nothing is converted silently or
partially.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

import flax.traverse_util
import jax
import numpy as np

from bass_jax import sharding as sharding_lib

Transform = Callable[[np.ndarray], np.ndarray]


def identity(x: np.ndarray) -> np.ndarray:
  return x


def transpose(x: np.ndarray) -> np.ndarray:
  """``[out, in]`` (PyTorch ``nn.Linear.weight``) <-> ``[in, out]`` (Flax ``Dense.kernel``)."""
  return np.ascontiguousarray(x.T)


class CheckpointError(ValueError):
  """A checkpoint does not match the model: a tensor is missing, extra or mis-shaped."""


class ShapesDiffer(CheckpointError):
  """Source tensors that do not fit the model's parameters (missing, left over, mis-shaped), with what
  they do convert to, so that a caller can name the config field behind the difference
  (``checkpoints.mismatch.explain``).

  Attributes:
    stored: ``{"a/b": shape}`` of every parameter the source's tensors convert to under the rules,
      layers past the config's count included (``layers_5/…`` where the source holds a ``layers.5``).
    misshaped: the first problem is a tensor of another shape (not one missing or left over).
  """

  def __init__(self, message: str, stored: dict[str, tuple[int, ...]], misshaped: bool):
    super().__init__(message)
    self.stored = stored
    self.misshaped = misshaped


def _apply(transforms: Iterable[Transform], x: np.ndarray) -> np.ndarray:
  for fn in transforms:
    x = fn(x)
  return x


@dataclasses.dataclass(frozen=True)
class Rule:
  """One Flax parameter and the source tensor it comes from.

  Attributes:
    flax_path: path in the parameter tree, e.g. ``("layers", "self_attn", "q_proj", "kernel")``; for a
      per-layer rule the first element names the layers, and layer i's parameter is at
      ``("layers_{i}", "self_attn", "q_proj", "kernel")``.
    source: the source tensor's name; per-layer rules contain ``{layer}``.
    to_flax: transforms applied in order to the source tensor (per layer).
    from_flax: transforms applied in order to go back (per layer); the inverse of ``to_flax``.
  """

  flax_path: tuple[str, ...]
  source: str
  to_flax: tuple[Transform, ...] = ()
  from_flax: tuple[Transform, ...] = ()

  @property
  def flax_paths(self) -> tuple[tuple[str, ...], ...]:
    return (self.flax_path,)

  def split(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
    return (_apply(self.to_flax, x),)

  def merge(self, parts: Sequence[np.ndarray]) -> np.ndarray:
    return _apply(self.from_flax, parts[0])


@dataclasses.dataclass(frozen=True)
class Fused:
  """Several Flax parameters stored as one source tensor (e.g. a fused qkv projection).

  Attributes:
    flax_paths: the parameters, in the order ``split`` returns them.
    source: the source tensor's name (``{layer}`` for per-layer tensors).
    split: source tensor -> the parameters (Flax layout), per layer.
    merge: the parameters -> source tensor, per layer; the inverse of ``split``.
  """

  flax_paths: tuple[tuple[str, ...], ...]
  source: str
  split: Callable[[np.ndarray], tuple[np.ndarray, ...]]
  merge: Callable[[Sequence[np.ndarray]], np.ndarray]


def _per_layer(rule) -> bool:
  return "{layer}" in rule.source


def _names(rule, num_layers: int) -> list[str]:
  if _per_layer(rule):
    return [rule.source.format(layer=i) for i in range(num_layers)]
  return [rule.source]


def _paths(rule, path: tuple[str, ...], num_layers: int) -> list[tuple[str, ...]]:
  """The Flax paths ``path`` of ``rule`` stands for: one per layer for a per-layer rule."""
  if _per_layer(rule):
    return [(f"{path[0]}_{i}",) + tuple(path[1:]) for i in range(num_layers)]
  return [tuple(path)]


def source_names(rules: Iterable[Rule | Fused], num_layers: int) -> set[str]:
  """Every source tensor name ``rules`` read for a model of ``num_layers`` layers. Never raises."""
  return {name for rule in rules for name in _names(rule, num_layers)}


def _stored_layers(rule, available: set[str], num_layers: int) -> int:
  """How many layers of ``rule`` the source holds, counting on past ``num_layers`` (0 … while
  present): the config's count where the source holds no more."""
  if not _per_layer(rule):
    return 1
  count = num_layers
  while rule.source.format(layer=count) in available:
    count += 1
  return count


def to_flax(
    rules: Iterable[Rule | Fused],
    *,
    source_names: Iterable[str],
    read: Callable[[str], np.ndarray],
    expected: Mapping[str, Any],
    num_layers: int,
    dtype: Any,
    ignore: Callable[[str], bool] = lambda name: False,
    where: str = "checkpoint",
    shape_of: Callable[[str], tuple[int, ...]] | None = None,
) -> dict[str, Any]:
  """Builds the Flax parameter tree from source tensors.

  Args:
    rules: together they fill every Flax parameter exactly once.
    source_names: every tensor name in the source.
    read: returns one source tensor as a numpy array (dequantized), by name.
    expected: the model's abstract parameters (``jax.eval_shape`` of ``init``), a nested dict of
      ``ShapeDtypeStruct``. Where one carries a ``sharding`` (``load_model(..., mesh=...)``), its
      tensor goes straight from the host onto its shards (``bass_jax.sharding.put``): no device ever
      holds the whole model.
    num_layers: L, the number of layers (``{layer}`` takes the values 0 … L - 1).
    dtype: dtype of the returned arrays.
    ignore: names of source tensors that carry no parameter (e.g. precomputed rotary tables).
    where: the source's name, for error messages.
    shape_of: a source tensor's shape without reading it, where the source knows it: after the first
      problem the remaining tensors are then converted as zero-cost stand-ins of that shape (their
      converted shapes are all :class:`ShapesDiffer` needs), not read.

  Returns:
    Nested dict of ``jax.Array`` with exactly the structure and shapes of ``expected``.

  Raises:
    ShapesDiffer: a tensor is missing, left over, or has the wrong shape (the first one named; the
      shapes the whole source converts to attached).
    CheckpointError: a parameter has no rule.
  """
  available = set(source_names)
  used: set[str] = set()
  expected_flat = flax.traverse_util.flatten_dict(dict(expected))
  out = {}
  # After the first problem no array is placed: the rest of the source is only converted, to record
  # the shapes it holds (ShapesDiffer.stored), layers past the config's count included.
  problem: str | None = None
  misshaped = False
  stored: dict[str, tuple[int, ...]] = {}
  for rule in rules:
    describe = ", ".join("/".join(p) for p in rule.flax_paths)
    for path in rule.flax_paths:
      unknown = [p for p in _paths(rule, path, num_layers) if p not in expected_flat]
      if unknown:
        raise CheckpointError(f"{where}: rule for unknown parameter(s) "
                              f"{['/'.join(p) for p in unknown[:4]]} (the model has no such layer?)")
    names = _names(rule, num_layers)
    missing = [n for n in names if n not in available]
    if missing and problem is None:
      problem = f"{where}: missing tensor(s) {missing[:4]} (needed for {describe})"
    count = _stored_layers(rule, available, num_layers)
    for i, name in enumerate(_names(rule, count)):
      if name not in available:
        continue
      if problem is not None and shape_of is not None:  # its shape is all that is needed now
        tensor = np.broadcast_to(np.zeros((), np.int8), shape_of(name))
      else:
        tensor = np.asarray(read(name))
      try:
        parts = rule.split(tensor)
      except ValueError as e:  # a reshape or split that the tensor's shape does not allow
        if problem is None:
          problem, misshaped = (f"{where}: tensor {name} of shape {tensor.shape} does not fit "
                                f"{describe} ({e})"), True
        continue
      for path, part in zip(rule.flax_paths, parts):
        target = _paths(rule, path, count)[i]
        stored["/".join(target)] = tuple(part.shape)
        if problem is not None or i >= num_layers:
          continue
        want = tuple(expected_flat[target].shape)
        if part.shape != want:
          problem, misshaped = (f"{where}: tensor {name} converts to shape {part.shape}, but the "
                                f"model's {'/'.join(target)} needs {want}"), True
          continue
        placement = getattr(expected_flat[target], "sharding", None)
        if placement is None:
          out[target] = jax.numpy.asarray(part, dtype=dtype)
        else:
          out[target] = sharding_lib.put(part.astype(jax.numpy.dtype(dtype)), placement)
    used.update(names)
  leftover = sorted(n for n in available - used if not ignore(n))
  if leftover and problem is None:
    problem = (f"{where}: {len(leftover)} tensor(s) the model has no place for, e.g. {leftover[:6]}; "
               "the checkpoint is not of this architecture or config")
  if problem is not None:
    raise ShapesDiffer(problem, stored, misshaped)
  unfilled = sorted("/".join(p) for p in expected_flat if p not in out)
  if unfilled:
    raise CheckpointError(f"{where}: no rule fills parameter(s) {unfilled}")
  return flax.traverse_util.unflatten_dict(out)


def from_flax(rules: Iterable[Rule | Fused], params: Mapping[str, Any], *,
              num_layers: int) -> dict[str, np.ndarray]:
  """The inverse of :func:`to_flax`: named source-layout tensors (numpy, params' dtype)."""
  flat = flax.traverse_util.flatten_dict(dict(params))
  out = {}
  for rule in rules:
    for i, name in enumerate(_names(rule, num_layers)):
      parts = [np.asarray(jax.device_get(flat[_paths(rule, path, num_layers)[i]]))
               for path in rule.flax_paths]
      out[name] = np.ascontiguousarray(rule.merge(parts))
  return out
