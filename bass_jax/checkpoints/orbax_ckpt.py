"""orbax-checkpoint save/restore of a parameter tree, restored into abstract shapes (no random init).

A checkpoint whose stored parameters disagree with its ``config.json`` is refused in one line that names
the first differing parameter with both shapes and, where one config field explains every difference,
that field with both values (:func:`mismatch_message`); a damaged checkpoint (metadata missing, an array
file truncated) is refused naming the directory.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any, Callable

import jax

# The most configs :func:`mismatch_message` builds (each one ``jax.eval_shape``) to explain a mismatch.
_MAX_CANDIDATES = 24


def save_params(path: str | os.PathLike, params: Any) -> None:
  """Writes ``params`` (a pytree of arrays) as an orbax checkpoint directory at ``path``.

  Raises:
    FileExistsError: if ``path`` exists (orbax never overwrites; remove it first).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if path.exists():
    raise FileExistsError(f"{path} exists; orbax does not overwrite checkpoints, remove it first")
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, params)


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """``{"a/b/c": shape}`` for every leaf (anything with a ``.shape``: arrays, ``ShapeDtypeStruct``,
  orbax's array metadata) of a nested parameter tree."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): tuple(leaf.shape)
          for path, leaf in leaves}


def _damaged(path: pathlib.Path, what: str) -> ValueError:
  return ValueError(f"{path}: damaged orbax checkpoint ({what}); re-save the model, or restore "
                    f"{path.name}/ from a copy")


def _stored_tree(checkpointer: Any, path: pathlib.Path) -> Any:
  try:
    metadata = checkpointer.metadata(path)
  except Exception as e:  # pylint: disable=broad-except  # orbax raises many types for broken files
    raise _damaged(path, f"its metadata cannot be read: {type(e).__name__}") from e
  stored = getattr(metadata, "item_metadata", metadata)
  if stored is None or not hasattr(stored, "keys"):
    raise _damaged(path, "no readable parameter metadata; _METADATA or the manifest is missing")
  return stored


def stored_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
  """The shapes of the parameters stored in the orbax checkpoint at ``path``, by ``/``-joined path
  (:func:`flat_shapes`); no array is read.

  Raises:
    FileNotFoundError: no directory at ``path``. ValueError: a damaged checkpoint (no readable
      metadata; the directory named).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if not path.is_dir():
    raise FileNotFoundError(f"no orbax checkpoint directory at {path}")
  with ocp.StandardCheckpointer() as checkpointer:
    return flat_shapes(dict(_stored_tree(checkpointer, path)))


def _failing_array(error: BaseException) -> str | None:
  """The stored array a TensorStore read error names (``layers_0.mlp.up_proj.kernel``), if any."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    match = re.search(r'reading "([^"/]+)/', str(error))
    if match:
      return match[1]
    error = error.__cause__ or error.__context__
  return None


def restore_params(path: str | os.PathLike, abstract_params: Any, *, config: Any = None,
                   shapes_for: Callable[[Any], Any] | None = None) -> Any:
  """Restores an orbax parameter checkpoint into the shapes and dtypes of ``abstract_params``.

  Args:
    path: the orbax checkpoint directory (a save's ``params/``).
    abstract_params: pytree of ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the model's init, cast
      to the wanted dtype, with shardings on a mesh); the restored arrays take these dtypes.
    config: the config ``abstract_params`` was built from (``config.json``'s), or None; with
      ``shapes_for`` it lets a mismatch name the config field that explains it.
    shapes_for: ``config -> abstract parameter tree`` (``models.model.abstract_params``), called on variants
      of ``config`` only when the shapes differ (:func:`mismatch_message`).

  Returns:
    The parameters, a pytree of ``jax.Array`` with ``abstract_params``' structure, shapes and dtypes.

  Raises:
    FileNotFoundError: no checkpoint at ``path``.
    ValueError: the checkpoint's tree or shapes differ from ``abstract_params`` (one line: the first
      differing parameter, both shapes, and the config field with both values where one explains it);
      a damaged checkpoint (metadata missing or unreadable, an array file missing or truncated), the
      directory and, where orbax says, the array named.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(path).absolute()
  if not path.is_dir():
    raise FileNotFoundError(f"no orbax checkpoint directory at {path}")
  with ocp.StandardCheckpointer() as checkpointer:
    have = flat_shapes(dict(_stored_tree(checkpointer, path)))
    want = flat_shapes(abstract_params)
    if want != have:
      raise ValueError(mismatch_message(path, have, want, config=config, shapes_for=shapes_for))
    try:
      return checkpointer.restore(path, abstract_params)
    except MemoryError:
      raise
    except Exception as e:  # pylint: disable=broad-except  # TensorStore raises bare Exceptions
      array = _failing_array(e)
      raise _damaged(path, f"the stored array {array} cannot be read" if array
                     else f"a stored array cannot be read: {type(e).__name__}") from e


# -- naming a mismatch --------------------------------------------------------------------------------


def _first_difference(have: dict[str, tuple], want: dict[str, tuple]) -> str:
  return next(k for k in sorted(set(have) | set(want)) if have.get(k) != want.get(k))


def _fields(config: Any, prefix: str = ""):
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
  dims that scale with the field (``heads * head_dim``: stored = config * v / value); the stored layer
  count, for a field equal to the config's (``layers``: (config's, stored)); the other boolean."""
  if isinstance(value, bool):
    return [not value]
  found = []
  if value >= 1:
    for w, h in pairs:
      if w % value == 0 and (h * value) % w == 0 and h * value // w not in (value, 0):
        found.append(h * value // w)
  if layers is not None and layers[0] == value:
    found.append(layers[1])
  return list(dict.fromkeys(found))


_LAYER = re.compile(r"(?:layers|h)_(\d+)/")


def _layer_counts(have: dict[str, tuple], want: dict[str, tuple]) -> tuple[int, int] | None:
  """(config's, stored) numbers of unrolled layers (``layers_i/…``, ``h_i/…``) when they differ."""
  count = lambda shapes: len({m[1] for k in shapes if (m := _LAYER.match(k))})
  needed, stored = count(want), count(have)
  return (needed, stored) if stored and needed and stored != needed else None


def mismatch_message(where: Any, have: dict[str, tuple], want: dict[str, tuple], *, config: Any = None,
                     shapes_for: Callable[[Any], Any] | None = None) -> str:
  """One line saying how stored parameters disagree with a config's.

  Names the first differing parameter path (sorted) with both shapes. With ``config`` and
  ``shapes_for``, each int or bool field of the config (nested ones too, as ``layer.hidden_size``) that
  could explain the first difference is tried: the config with that field changed is built and, when
  its whole parameter tree has exactly the stored shapes, the field is named with both values (what
  config.json says, what the stored tensors were saved with). Where no single field explains it, the
  fields whose value equals one of the config's differing dims are named as candidates.

  Args:
    where: the checkpoint (a path), named first.
    have: the stored shapes, ``{"a/b": shape}`` (:func:`flat_shapes`).
    want: the config's shapes, the same form.
    config: a dataclass config, or None.
    shapes_for: ``config -> abstract parameter tree``.

  Returns:
    The message (no newline). Never raises for a config variant that cannot be built.
  """
  first = _first_difference(have, want)
  show = lambda shape: "absent" if shape is None else str(shape)
  detail = f"{first}: stored {show(have.get(first))}, config {show(want.get(first))}"
  fix = "fix config.json or re-save the model"
  pairs = [(w, h) for w, h in zip(want.get(first) or (), have.get(first) or ()) if w != h]
  if config is None or not dataclasses.is_dataclass(config):
    return f"{where}: the stored parameters do not match the config at {detail}; {fix}"
  explained = []
  if shapes_for is not None:
    layers = _layer_counts(have, want)
    tried = 0
    for name, value, replace in _fields(config):
      for candidate in _candidate_values(value, pairs, layers):
        if tried >= _MAX_CANDIDATES:
          break
        tried += 1
        try:
          fits = flat_shapes(shapes_for(replace(candidate))) == have
        except Exception:  # pylint: disable=broad-except  # a variant its own checks reject
          fits = False
        if fits:
          explained.append(f"{name} is {value} in config.json, the stored parameters have {candidate}")
  if explained:
    return (f"{where}: config.json does not match the stored parameters: {' or '.join(explained)} "
            f"({detail}); {fix}")
  near = [name for name, value, _ in _fields(config)
          if not isinstance(value, bool) and value in {w for w, _ in pairs}]
  hint = f" (config fields equal to a differing dim: {', '.join(near[:4])})" if near else ""
  return f"{where}: config.json does not match the stored parameters at {detail}{hint}; {fix}"
