"""Draft length per step: fixed, or the BASS heuristic (paper §3.2, Algorithm 1; docs/bass.md)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from bass_jax import _checks


@dataclasses.dataclass(frozen=True)
class DynamicDraftLen:
  """Algorithm 1 of BASS: one draft length for the whole batch, adapted after every step.

  After a step in which the rows accepted ``x_1 … x_B`` drafts (bonus/correction not counted)::

      if max(x) == l_draft:  l_draft = min(l_draft + l_incre, l_limit); s = 0
      else:                  l_draft = max(1, max(x), l_draft - ceil(l_draft / l_mod) - s); s = 1

  Defaults are the paper's (chosen empirically by its authors): ``l0=7, l_incre=2, l_mod=10,
  l_limit=32``.

  Raises:
    ValueError: from ``__post_init__`` unless ``1 <= l0 <= l_limit``, ``l_incre >= 1``, ``l_mod >= 1``.
  """

  l0: int = 7
  l_incre: int = 2
  l_mod: int = 10
  l_limit: int = 32

  def __post_init__(self):
    for name in ("l0", "l_incre", "l_mod", "l_limit"):
      object.__setattr__(self, name, _checks.as_int(f"DynamicDraftLen.{name}", getattr(self, name)))
    if not 1 <= self.l0 <= self.l_limit:
      raise ValueError(f"DynamicDraftLen needs 1 <= l0 <= l_limit, got l0={self.l0}, "
                       f"l_limit={self.l_limit}")
    if self.l_incre < 1 or self.l_mod < 1:
      raise ValueError(f"DynamicDraftLen needs l_incre >= 1 and l_mod >= 1, got {self}")

  @property
  def max_len(self) -> int:
    return self.l_limit

  def initial(self) -> tuple[int, int]:
    """``(l_draft, s)`` before the first step."""
    return self.l0, 0

  def update(self, draft_len, s, max_accepted):
    """One step of Algorithm 1; works on Python ints and on traced ``i32[]`` alike.

    Args:
      draft_len: the step's ``l_draft``.
      s: the heuristic's state (0 or 1).
      max_accepted: ``max(x)`` over the rows that were live in the step.

    Returns:
      ``(next_draft_len, next_s)``.
    """
    grew = max_accepted == draft_len
    up = jnp.minimum(draft_len + self.l_incre, self.l_limit)
    down = draft_len - (draft_len + self.l_mod - 1) // self.l_mod - s
    down = jnp.maximum(jnp.maximum(1, max_accepted), down)
    return jnp.where(grew, up, down), jnp.where(grew, 0, 1)


@dataclasses.dataclass(frozen=True)
class FixedDraftLen:
  """The same ``l_draft`` every step (the paper's fixed-length ablation, Table 5)."""

  length: int

  def __post_init__(self):
    object.__setattr__(self, "length", _checks.as_int("draft_len (a fixed draft length)", self.length,
                                                      min_value=1))

  @property
  def max_len(self) -> int:
    return self.length

  def initial(self) -> tuple[int, int]:
    return self.length, 0

  def update(self, draft_len, s, max_accepted):
    del max_accepted
    return draft_len, s


DraftLenPolicy = DynamicDraftLen | FixedDraftLen


def as_policy(draft_len: int | str | DraftLenPolicy) -> DraftLenPolicy:
  """``"dynamic"`` -> the paper's Algorithm 1, an int (or NumPy integer) -> that fixed length;
  policies pass through.

  Raises:
    ValueError: anything else (a digit string too: convert it where it is parsed), naming draft_len.
  """
  if isinstance(draft_len, (DynamicDraftLen, FixedDraftLen)):
    return draft_len
  if isinstance(draft_len, str) and draft_len == "dynamic":
    return DynamicDraftLen()
  if _checks.is_int(draft_len):
    return FixedDraftLen(int(draft_len))
  raise ValueError(f"draft_len must be 'dynamic', an int >= 1 or a DynamicDraftLen, got {draft_len!r}")
