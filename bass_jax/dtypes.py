"""The dtypes a model's weights and its training may take: one table, by name.

:data:`DTYPES` lists every dtype of the library by its numpy/JAX name with what it may be used for:
a model's parameters and computation (``load_model(dtype=...)``, ``save_model(dtype=...)``,
``experiments.convert --dtype``), and a draft's training forward and backward
(``TrainConfig.compute_dtype``: the optimizer state stays f32). The scripts' ``--dtype`` choices are
held to it by ``tests/cli_flags``. A dtype's PyTorch twin (for files written for PyTorch runtimes, and
the transformers baselines) is :func:`torch_dtype`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Dtype:
  """One dtype.

  Attributes:
    name: numpy/JAX's name (``"bfloat16"``), also PyTorch's (``torch.bfloat16``).
    trains: a draft's training may compute in it (f16 lacks bf16's range for the gradients).
  """

  name: str
  trains: bool


DTYPES: dict[str, Dtype] = {d.name: d for d in (
    Dtype("float32", trains=True),
    Dtype("bfloat16", trains=True),
    Dtype("float16", trains=False),
)}
# A model's parameters and computation.
PARAMETER_DTYPES = tuple(DTYPES)
# A draft's training forward and backward.
TRAINING_DTYPES = tuple(name for name, d in DTYPES.items() if d.trains)


def dtype_name(dtype: Any, allowed: tuple[str, ...] = PARAMETER_DTYPES, *, what: str = "dtype"
               ) -> str:
  """The name of ``dtype`` (a name, a numpy or JAX dtype) when it is one of ``allowed``.

  Raises:
    ValueError: anything else, naming ``what`` and the choices.
  """
  try:
    name = jnp.dtype(dtype).name  # JAX's dtype knows bfloat16 by name (ml_dtypes), as numpy alone does not
  except TypeError:
    name = None
  if name not in allowed:
    raise ValueError(f"{what} must be one of {allowed}, got {dtype!r}")
  return name


def torch_dtype(dtype: Any) -> Any:
  """PyTorch's dtype of the same name (``torch.bfloat16`` for ``"bfloat16"`` or ``jnp.bfloat16``).

  Raises:
    ValueError: a dtype outside :data:`DTYPES`.
  """
  import torch  # pylint: disable=g-import-not-at-top

  return getattr(torch, dtype_name(dtype))
