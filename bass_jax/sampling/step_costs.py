"""What a decode step costs: :class:`StepCosts` (seconds per piece of a step at one batch size, as
``bass_jax.sampling.costs`` measures them and ``draft_len.GoodputDraftLen`` weighs them), and the
acceptance rate at which speculating starts to pay under them (:func:`break_even_acceptance`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Seconds per piece of a decode step at one batch size (measured by ``bass_jax.sampling.costs``).

  Attributes:
    plain: a plain decoding step (the target scores one position per row).
    verify_pass: one verification pass (the target scores C positions per row).
    propose_first: the proposer's catch-up and first draft (0 for a model-free proposer).
    propose_next: each further draft (0 for a model-free proposer).
    chunk: C, positions per verification pass.
    tree_steps: seconds of a tree step of each shape the decode may choose (``generate``'s
      ``draft_tree``, in its order): the proposer's catch-up and growth plus the target's one forward
      over the tree's nodes under its ancestor mask. Empty without trees.
    fixed_drafts: L when every chain step drafts L tokens whatever its length l (the branch-free draft
      loop of the GPU profile, ``bass_jax.profiles``: its static ``L`` iterations run, the drafts past
      l are padding), so a chain of any length pays ``propose_first + (L - 1) propose_next``; 0 when a
      step drafts l tokens (the CPU profile's loop).
  """

  plain: float
  verify_pass: float
  propose_first: float
  propose_next: float
  chunk: int
  tree_steps: tuple[float, ...] = ()
  fixed_drafts: int = 0

  def as_array(self) -> jax.Array:
    """``f32[6 + T]``: plain, verify_pass, propose_first, propose_next (seconds), chunk,
    fixed_drafts, then each tree step's seconds; the traced form the decode program takes, so new
    measurements never recompile it."""
    return jnp.asarray([self.plain, self.verify_pass, self.propose_first, self.propose_next,
                        self.chunk, self.fixed_drafts, *self.tree_steps], jnp.float32)

  def to_json(self) -> dict[str, Any]:
    """The fields as JSON values (what ``compile_cache.store_costs`` keeps on disk)."""
    return {**dataclasses.asdict(self), "tree_steps": list(self.tree_steps)}

  @classmethod
  def stored(cls, fields: dict[str, Any] | None) -> "StepCosts | None":
    """:meth:`from_json` of what a cache holds, None for nothing or for fields that do not fit (an
    entry another version wrote: measured again)."""
    if fields is None:
      return None
    try:
      return cls.from_json(fields)
    except ValueError:
      return None

  @classmethod
  def from_json(cls, fields: dict[str, Any]) -> "StepCosts":
    """The inverse of :meth:`to_json`.

    Raises:
      ValueError: fields that are not those of a :class:`StepCosts`.
    """
    try:
      return cls(**{**fields, "tree_steps": tuple(fields.get("tree_steps", ()))})
    except TypeError as e:
      raise ValueError(f"stored step costs {fields} are not a StepCosts: {e}") from e


def break_even_acceptance(costs: StepCosts, max_len: int) -> tuple[float, int]:
  """The smallest per-position acceptance rate at which speculating beats a plain step, and the
  draft length that does it, under ``draft_len.GoodputDraftLen``'s model: with ``alpha`` at every
  position, some ``l`` in ``1 … max_len`` has ``(1 + alpha + … + alpha^l) / cost(l) > 1 / plain``.

  Args:
    costs: measured :class:`StepCosts` (seconds). max_len: L, the longest draft.

  Returns:
    ``(alpha, l)``, alpha on a 0.001 grid; ``(1.0, 0)`` when no acceptance below 1 pays.
  """
  lengths = np.arange(1, max_len + 1)
  drafted = np.full_like(lengths, costs.fixed_drafts) if costs.fixed_drafts else lengths
  cost = (costs.propose_first + (drafted - 1) * costs.propose_next
          + np.ceil((lengths + 1) / costs.chunk) * costs.verify_pass)
  for alpha in np.arange(0.0, 1.0, 0.001):
    expected = 1 + np.cumsum(alpha ** lengths)  # E(l) with alpha at every position
    best = int(np.argmax(expected / cost))
    if expected[best] / cost[best] > 1 / costs.plain:
      return float(alpha), int(lengths[best])
  return 1.0, 0
