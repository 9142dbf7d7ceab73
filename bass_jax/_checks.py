"""Argument checks shared by the public entry points: every error names the parameter and the fix.

Python's and NumPy's scalar types are accepted wherever the value is unambiguous (``np.int64(4)`` is an
int, ``np.float32(0.5)`` a float); strings, ``None``, booleans where a number is meant, and floats where
an int is meant are refused instead of being coerced, so that ``"70"`` can never become the ids
``(7, 0)`` and ``seed=1.5`` can never become seed 1.
"""

from __future__ import annotations

import importlib
import math
import numbers
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
  """A Python or NumPy integer, not a bool."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def short(value: Any) -> str:
  """``repr(value)``, cut to 60 characters for a one-line message."""
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _describe(value: Any) -> str:
  return f"{value!r} ({type(value).__name__})"


def as_int(name: str, value: Any, *, min_value: int | None = None,
           max_value: int | None = None) -> int:
  """``value`` as a Python int, checked against ``[min_value, max_value]`` (inclusive).

  Raises:
    ValueError: not an int or NumPy integer (a bool, float or string is not), or out of range; the
      message names ``name``.
  """
  if not is_int(value):
    raise ValueError(f"{name} must be an int, got {_describe(value)}")
  value = int(value)
  if min_value is not None and value < min_value:
    raise ValueError(f"{name} must be >= {min_value}, got {value}")
  if max_value is not None and value > max_value:
    raise ValueError(f"{name} must be <= {max_value}, got {value}")
  return value


def as_float(name: str, value: Any, *, min_value: float | None = None,
             max_value: float | None = None, min_exclusive: bool = False) -> float:
  """``value`` as a finite Python float, checked against its bounds.

  Ints are accepted (``temperature=1``); booleans, strings and ``None`` are not.

  Raises:
    ValueError: not a real number, not finite, or out of range; the message names ``name``.
  """
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating,
                                                                   np.integer)):
    raise ValueError(f"{name} must be a number, got {_describe(value)}")
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f"{name} must be finite, got {value}")
  if min_value is not None and (value <= min_value if min_exclusive else value < min_value):
    raise ValueError(f"{name} must be {'>' if min_exclusive else '>='} {min_value}, got {value}")
  if max_value is not None and value > max_value:
    raise ValueError(f"{name} must be <= {max_value}, got {value}")
  return value


def as_bool(name: str, value: Any) -> bool:
  """``value`` as a bool (Python or NumPy bool only).

  Raises:
    ValueError: any other type; the message names ``name``.
  """
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be True or False, got {_describe(value)}")
  return bool(value)


def as_int_tuple(name: str, value: Any, *, min_value: int | None = None,
                 max_value: int | None = None) -> tuple[int, ...]:
  """An int or a sequence of ints (list, tuple, 1-D integer array) as a tuple of Python ints.

  Raises:
    ValueError: a string, a float, a nested or non-integer sequence, or an element out of range;
      the message names ``name``.
  """
  if is_int(value):
    return (as_int(name, value, min_value=min_value, max_value=max_value),)
  if isinstance(value, (str, bytes)):
    raise ValueError(f"{name} must be an int or a sequence of ints, got the string {value!r}")
  if isinstance(value, np.ndarray):
    if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
      raise ValueError(f"{name} must be an int or a 1-D integer array, got {value.dtype}{value.shape}")
    value = value.tolist()
  if not isinstance(value, (list, tuple)):
    raise ValueError(f"{name} must be an int or a sequence of ints, got {_describe(value)}")
  return tuple(as_int(f"{name}[{i}]", v, min_value=min_value, max_value=max_value)
               for i, v in enumerate(value))


def import_object(path: str, what: str) -> Any:
  """The object at ``path``, ``<module>.<name>`` (the ``py:`` paths of draft specs and acceptance
  rules), imported.

  Args:
    path: a dotted path whose last part names an attribute of the importable module before it.
    what: who asks, for the error message (``"draft spec 'py:x.Y'"``).

  Raises:
    ValueError: the module does not import (whatever it raised) or lacks the name.
  """
  module, _, attr = path.rpartition(".")
  try:
    return getattr(importlib.import_module(module), attr)
  except Exception as e:  # pylint: disable=broad-except  # whatever the user's module raises
    raise ValueError(f"{what}: cannot import {path!r} ({type(e).__name__}: {e}); write "
                     "py:<module>.<Name> for an importable module") from None


def registry_name(name: Any, what: str) -> str:
  """``name`` checked as a registry's name (a proposer kind, an acceptance rule): ASCII letters,
  digits and ``_``, starting with a letter.

  Raises:
    ValueError: anything else, naming ``what`` (``"a proposer's name"``).
  """
  if not (isinstance(name, str) and name.isascii() and name.replace("_", "a").isalnum()
          and name[:1].isalpha()):
    raise ValueError(f"{what} is letters, digits and '_', starting with a letter; got {name!r}")
  return name


def same_definition(a: type, b: type) -> bool:
  """Whether two classes are one definition (same module and qualified name): a module reloaded in a
  notebook makes new class objects, which a registry takes as the same entry."""
  return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)
