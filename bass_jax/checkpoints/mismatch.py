"""Naming the config field behind stored parameters that do not fit a config.

A checkpoint whose tensors disagree with its config (``config.json``, a GGUF file's metadata) is one
line: the first differing parameter with both shapes and, where changing one config field makes the
config's whole parameter tree equal the stored one, that field with both values. The orbax and EAGLE
loaders compare whole trees (:func:`mismatch_message`); the Hugging Face path (``checkpoints.hf``,
``checkpoints.gguf``) gives the shapes its tensors convert to (:func:`explain`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterator, Mapping

import jax

# The most configs :func:`explain` builds (each one ``jax.eval_shape``) to explain a mismatch.
_MAX_CANDIDATES = 24
FIX = "fix config.json or re-save the model"


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """``{"a/b/c": shape}`` for every leaf (anything with a ``.shape``: arrays, ``ShapeDtypeStruct``,
  orbax's array metadata) of a nested parameter tree. Never raises for a tree of such leaves."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): tuple(leaf.shape)
          for path, leaf in leaves}


_LAYER = re.compile(r"(?:layers|h)_(\d+)/")


def _layer_counts(have: Mapping[str, tuple], want: Mapping[str, tuple]) -> tuple[int, int] | None:
  """(config's, stored) numbers of unrolled layers (``layers_i/…``, ``h_i/…``) when they differ."""
  count = lambda shapes: len({m[1] for k in shapes if (m := _LAYER.match(k))})
  needed, stored = count(want), count(have)
  return (needed, stored) if stored and needed and stored != needed else None


def first_difference(have: Mapping[str, tuple], want: Mapping[str, tuple]) -> str | None:
  """The first parameter path (sorted) whose shape differs, or that only one side has; None where
  the two are equal."""
  return next((k for k in sorted(set(have) | set(want)) if have.get(k) != want.get(k)), None)


def _fields(config: Any, prefix: str = "") -> Iterator[tuple[str, Any, Callable[[Any], Any]]]:
  """``(dotted name, value, replace(value) -> config)`` for every int and bool field of a dataclass
  config, nested dataclass fields (an EAGLE draft's ``layer``) included."""
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    name = prefix + field.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      for inner, inner_value, inner_replace in _fields(value, name + "."):
        yield inner, inner_value, (lambda v, f=field.name, r=inner_replace:
                                   dataclasses.replace(config, **{f: r(v)}))
    elif isinstance(value, (bool, int)):
      yield name, value, lambda v, f=field.name: dataclasses.replace(config, **{f: v})


def _candidate_values(value: Any, pairs: list[tuple[int, int]],
                      layers: tuple[int, int] | None) -> list[Any]:
  """Values of a config field that could explain the differing dims ``pairs`` (config's, stored):
  dims that scale with the field (``heads * head_dim``: stored = config * v / value) or are offset from
  it (stored = config + v - value); the stored layer
  count, for a field equal to the config's (``layers``: (config's, stored)); the other boolean."""
  if isinstance(value, bool):
    return [not value]
  found = []
  if value >= 1:
    for w, h in pairs:
      if w % value == 0 and (h * value) % w == 0 and h * value // w not in (value, 0):
        found.append(h * value // w)
      if value + h - w >= 1:  # dims offset from the field (OPT's positions: the field + 2)
        found.append(value + h - w)
  if layers is not None and layers[0] == value:
    found.append(layers[1])
  return list(dict.fromkeys(found))


def explain(have: Mapping[str, tuple], want: Mapping[str, tuple], config: Any,
            shapes_for: Callable[[Any], Any], *, source: str = "config.json",
            given: Mapping[str, Any] | None = None,
            rebuild: Callable[[str, Any], Any] | None = None,
            fits: Callable[[Any], bool] | None = None) -> str | None:
  """The config field(s) whose one changed value makes ``config``'s parameter shapes equal ``have``.

  Each int or bool field of ``config`` (nested ones too, as ``layer.hidden_size``) that could explain the
  first difference is tried (at most 24 configs built): the config with that field changed is built
  and, when its whole parameter tree has exactly the stored shapes, the field is named with both
  values.

  Args:
    have: the stored shapes, ``{"a/b": shape}`` (:func:`flat_shapes`).
    want: the config's shapes, the same form.
    config: a dataclass config.
    shapes_for: ``config -> abstract parameter tree``.
    source: where the config was read, for the words (``"config.json"``, ``"the GGUF metadata"``).
    given: the fields ``source`` holds, where known: a field it lacks or holds as null is named so (its
      value the default the family filled in), not as holding that value.
    rebuild: ``(field, value) -> config`` read again from the source with that one field changed, so
      that what derives from the field changes with it (a head size and its rotary tables); default
      ``dataclasses.replace``.
    fits: ``config -> bool``, whether the stored parameters fit a candidate config; default: its whole
      parameter tree has exactly the shapes ``have``.

  Returns:
    A phrase (``"num_attention_heads is 32 in config.json, the stored parameters fit 4"``), or None
    where no single field explains it. Never raises for a variant that cannot be built.
  """
  if not dataclasses.is_dataclass(config) or (have == want and fits is None):
    return None
  first = first_difference(have, want)  # None where equal: tensors left over
  pairs = [(w, h) for w, h in zip(want.get(first) or (), have.get(first) or ()) if w != h]
  layers = _layer_counts(have, want)
  stated = lambda name, value: (
      f"{source} gives no {name} (so it is {value})" if given is not None and given.get(name) is None
      else f"{name} is {value} in {source}")
  explained, tried = [], 0
  for name, value, replace in _fields(config):
    if name.endswith("token_id"):  # ids, not sizes: no shape follows them
      continue
    for candidate in _candidate_values(value, pairs, layers):
      if tried >= _MAX_CANDIDATES:
        break
      tried += 1
      try:
        variant = replace(candidate) if rebuild is None else rebuild(name, candidate)
        fit = (fits(variant) if fits is not None
               else flat_shapes(shapes_for(variant)) == dict(have))
      except Exception:  # pylint: disable=broad-except  # a variant its own checks reject
        fit = False
      if fit:
        explained.append(f"{stated(name, value)}, the stored parameters fit {candidate}")
  return " or ".join(explained) if explained else None


def near_fields(have: Mapping[str, tuple], want: Mapping[str, tuple], config: Any) -> list[str]:
  """The int fields of ``config`` whose value equals one of the config's dims at the first difference:
  the candidates to look at where :func:`explain` finds no single field. Never raises; empty for a
  config that is no dataclass, or equal shapes."""
  if not dataclasses.is_dataclass(config) or have == want:
    return []
  first = first_difference(have, want)
  dims = {w for w, h in zip(want.get(first) or (), have.get(first) or ()) if w != h}
  return [name for name, value, _ in _fields(config) if not isinstance(value, bool) and value in dims]


def mismatch_message(where: Any, have: dict[str, tuple], want: dict[str, tuple], *, config: Any = None,
                     shapes_for: Callable[[Any], Any] | None = None) -> str:
  """One line saying how stored parameters disagree with a config's (the orbax and EAGLE loaders).

  Names the first differing parameter path (sorted) with both shapes and, with ``config`` and
  ``shapes_for``, the config field that explains it (:func:`explain`), else the candidates
  (:func:`near_fields`).

  Args:
    where: the checkpoint (a path), named first.
    have: the stored shapes, ``{"a/b": shape}`` (:func:`flat_shapes`).
    want: the config's shapes, the same form.
    config: a dataclass config, or None.
    shapes_for: ``config -> abstract parameter tree``.

  Returns:
    The message (no newline). Never raises for a config variant that cannot be built.
  """
  first = first_difference(have, want)
  show = lambda shape: "absent" if shape is None else str(shape)
  detail = f"{first}: stored {show(have.get(first))}, config {show(want.get(first))}"
  if config is None or not dataclasses.is_dataclass(config):
    return f"{where}: the stored parameters do not match the config at {detail}; {FIX}"
  why = explain(have, want, config, shapes_for) if shapes_for is not None else None
  if why is not None:
    return f"{where}: config.json does not match the stored parameters: {why} ({detail}); {FIX}"
  near = near_fields(have, want, config)
  hint = f" (config fields equal to a differing dim: {', '.join(near[:4])})" if near else ""
  return f"{where}: config.json does not match the stored parameters at {detail}{hint}; {FIX}"
