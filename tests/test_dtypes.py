"""The dtype table (bass_jax.dtypes): names, numpy and JAX dtypes resolve to one name, anything else
is refused naming the choices, PyTorch's twin has the same name, and every script's dtype flag offers
only dtypes of the table (a training flag only those that train)."""

from __future__ import annotations

import ast
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bass_jax import dtypes

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"


@pytest.mark.parametrize("given,name", [("float32", "float32"), (jnp.bfloat16, "bfloat16"),
                                        (np.float16, "float16"), (jnp.dtype("bfloat16"), "bfloat16")])
def test_a_dtype_resolves_to_its_name_and_its_torch_twin(given, name):
  assert dtypes.dtype_name(given) == name
  assert dtypes.torch_dtype(given) == getattr(torch, name)


@pytest.mark.parametrize("bad", ["int8", "f32", None, 3, np.float64])
def test_anything_else_is_refused_naming_the_choices(bad):
  with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'bfloat16', 'float16'\)"):
    dtypes.dtype_name(bad)
  with pytest.raises(ValueError, match="compute_dtype must be one of"):
    dtypes.dtype_name("float16", dtypes.TRAINING_DTYPES, what="compute_dtype")


def _dtype_flags() -> list[tuple[str, str, list[str]]]:
  """``(file, flag, choices)`` of every ``DEFINE_enum`` of a dtype flag in experiments/."""
  found = []
  for path in sorted(EXPERIMENTS.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "DEFINE_enum"
          and isinstance(node.args[0], ast.Constant) and "dtype" in node.args[0].value):
        found.append((path.name, node.args[0].value, ast.literal_eval(node.args[2])))
  return found


def test_every_scripts_dtype_flag_offers_dtypes_of_the_table():
  flags = _dtype_flags()
  assert len(flags) >= 7, flags  # generate, convert, training and the benchmarks
  for file, flag, choices in flags:
    allowed = dtypes.TRAINING_DTYPES if flag == "compute_dtype" else dtypes.PARAMETER_DTYPES
    assert set(choices) - {"auto"} <= set(allowed), (file, flag, choices)
