"""Draft length per step: fixed, the BASS heuristic (paper §3.2, Algorithm 1), or cost-aware (goodput).

Every policy offers the decode loop the same three calls, all traceable (no host sync):
``start(costs) -> (l, state)`` before the first step, ``after_step(state, l, num_drafts, accepted, live)
-> (l, state)`` after a speculative step and ``after_plain_step(state, l) -> (l, state)`` after a plain
decoding step (no row had a proposal, or the policy chose ``l = 0``). Only :class:`GoodputDraftLen`
chooses ``l = 0``.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bass_jax import _checks


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Seconds per piece of a decode step at one batch size (measured by ``bass_jax.sampling.costs``).

  Attributes:
    plain: a plain decoding step (the target scores one position per row).
    verify_pass: one verification pass (the target scores C positions per row).
    propose_first: the proposer's catch-up and first draft (0 for a model-free proposer).
    propose_next: each further draft (0 for a model-free proposer).
    chunk: C, positions per verification pass.
  """

  plain: float
  verify_pass: float
  propose_first: float
  propose_next: float
  chunk: int

  def as_array(self) -> jax.Array:
    """``f32[5]``: plain, verify_pass, propose_first, propose_next (seconds), chunk; the traced form
    the decode program takes, so new measurements never recompile it."""
    return jnp.asarray([self.plain, self.verify_pass, self.propose_first, self.propose_next,
                        self.chunk], jnp.float32)


class _MaxAcceptedPolicy:
  """``start/after_step/after_plain_step`` for policies that adapt from the largest number of drafts a
  live row accepted (their state is Algorithm 1's ``s``)."""

  may_choose_zero = False  # never picks l = 0 (plain steps come only from a proposer without drafts)

  def start(self, costs: jax.Array):
    del costs
    l0, s0 = self.initial()
    return jnp.asarray(l0, jnp.int32), jnp.asarray(s0, jnp.int32)

  def after_step(self, state, draft_len, num_drafts, accepted, live):
    del num_drafts
    max_accepted = jnp.max(jnp.where(live, accepted, 0))
    next_len, next_s = self.update(draft_len, state, max_accepted)
    return jnp.asarray(next_len, jnp.int32), jnp.asarray(next_s, jnp.int32)

  def after_plain_step(self, state, draft_len):
    return draft_len, state


@dataclasses.dataclass(frozen=True)
class DynamicDraftLen(_MaxAcceptedPolicy):
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
class FixedDraftLen(_MaxAcceptedPolicy):
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


@flax.struct.dataclass
class GoodputState:
  """Running acceptance statistics of :class:`GoodputDraftLen`.

  Attributes:
    tried: ``f32[L]`` decayed count of steps in which draft position i + 1 was checked.
    accepted: ``f32[L]`` decayed count of those in which it was accepted.
    costs: ``f32[5]`` :meth:`StepCosts.as_array`.
    plain_run: ``i32[]`` plain steps since the last speculative step (the exploration clock).
  """

  tried: jax.Array
  accepted: jax.Array
  costs: jax.Array
  plain_run: jax.Array = 0


@dataclasses.dataclass(frozen=True)
class GoodputDraftLen:
  """Cost-aware draft length: each step, the ``l`` in ``0 … max_len`` that maximizes expected emitted
  tokens per second (the goodput of SmartSpec, Liu et al. 2024, and TurboSpec).

  With ``a_i`` the running rate at which draft position i is accepted given that positions ``1 … i-1``
  were, a row emits ``E(l) = 1 + sum_{i<=l} prod_{j<=i} a_j`` tokens per step, and the step costs
  ``cost(0) = plain`` or ``cost(l) = propose_first + (l - 1) propose_next + ceil((l + 1) / C)
  verify_pass`` seconds (every pass counted, early exits not: a slight overestimate for long drafts).
  All rows share the step, so the policy picks ``argmax_l E(l) / cost(l)``; ``l = 0`` is a plain
  decoding step, which emits exactly what regular decoding emits. The rates are counts of tried and
  accepted positions over live rows, decayed by ``decay`` every step (plain steps too) and smoothed
  towards ``prior`` with weight ``prior_weight``: after a stretch of plain steps the estimate drifts back
  to the prior, and speculation is tried again if the prior says it would pay.

  **Exploration.** The rates learn only from speculative steps, and the costs are measured once, before
  the decode (no clock runs inside the jitted loop, and the host regains control only when a row
  finishes, so costs cannot be re-measured as the decode goes). If the measurement was unlucky (a busy
  machine inflating the verification pass) or the prior is pessimistic, the argmax can be 0 at the prior
  itself, and then nothing the decode sees can ever change it: a whole run of plain steps, whatever the
  draft would have achieved. So after ``explore_every`` plain steps in a row the policy takes the best
  ``l >= 1`` (the argmax of ``E(l) / cost(l)`` over ``1 … L``) for one step, and the rates then say
  whether to go on. It does so only if speculation *could* pay under the measured costs, i.e. a draft
  accepted in full beats a plain step (``max_l (l + 1) / cost(l) > 1 / plain``); where even that loses,
  no evidence could change the choice and every step stays plain. The price is bounded: at most one step
  in ``explore_every + 1`` is an exploration, which costs ``cost(l) - plain`` more than a plain step and
  still emits at least the token a plain step would: with ``explore_every = 16``, a one-pass draft whose
  verification costs 2x a plain step and a negligible proposer, 1/17 (6 %) more time if not a single
  draft were accepted.

  Sampling stays exact: like the rest of the policy, exploration chooses a step's length from earlier
  steps only (the count of plain steps, the rates), never from the step's own draws, and every length
  is verified by the same lossless acceptance.

  Attributes:
    max_len: the longest draft (L). decay: per-step decay of the counts, in (0, 1].
    prior: the acceptance rate assumed before any evidence, in (0, 1).
    prior_weight: pseudo-count of the prior, > 0.
    explore_every: after this many plain steps in a row, one speculative step (above); 0 never explores.
    costs: :class:`StepCosts`; None measures them for the call's setting (``bass_jax.sampling.costs``).

  Raises:
    ValueError: from the constructor, for a parameter out of range (named).
  """

  may_choose_zero = True  # class attribute, not a field
  max_len: int = 8
  decay: float = 0.9
  prior: float = 0.5
  prior_weight: float = 1.0
  explore_every: int = 16
  costs: StepCosts | None = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    object.__setattr__(self, "max_len", _checks.as_int("GoodputDraftLen.max_len", self.max_len,
                                                       min_value=1))
    decay = _checks.as_float("GoodputDraftLen.decay", self.decay, min_value=0.0, min_exclusive=True,
                             max_value=1.0)
    prior = _checks.as_float("GoodputDraftLen.prior", self.prior, min_value=0.0, min_exclusive=True)
    if prior >= 1.0:
      raise ValueError(f"GoodputDraftLen.prior must be in (0, 1), got {prior}")
    weight = _checks.as_float("GoodputDraftLen.prior_weight", self.prior_weight, min_value=0.0,
                              min_exclusive=True)
    object.__setattr__(self, "decay", decay)
    object.__setattr__(self, "prior", prior)
    object.__setattr__(self, "prior_weight", weight)
    object.__setattr__(self, "explore_every", _checks.as_int("GoodputDraftLen.explore_every",
                                                             self.explore_every, min_value=0))

  def rates(self, state: GoodputState) -> jax.Array:
    """``f32[L]`` smoothed conditional acceptance rate of each draft position."""
    return ((state.accepted + self.prior * self.prior_weight)
            / (state.tried + self.prior_weight))

  def _step_cost(self, costs: jax.Array) -> jax.Array:
    """``f32[L + 1]`` seconds of a step of length ``l = 0 … L``; ``costs`` is
    :meth:`StepCosts.as_array`."""
    plain, verify_pass, first, nxt, chunk = (costs[i] for i in range(5))
    lengths = jnp.arange(self.max_len + 1, dtype=jnp.float32)
    passes = jnp.ceil((lengths + 1) / chunk)
    return jnp.where(lengths == 0, plain, first + (lengths - 1) * nxt + passes * verify_pass)

  def goodput(self, state: GoodputState) -> jax.Array:
    """``f32[L + 1]`` expected emitted tokens per second per row for ``l = 0 … L``."""
    expected = 1.0 + jnp.concatenate([jnp.zeros(1), jnp.cumsum(jnp.cumprod(self.rates(state)))])
    return expected / self._step_cost(state.costs)

  def could_pay(self, costs: jax.Array) -> jax.Array:
    """``bool[]``: whether some ``l >= 1`` beats a plain step when every draft is accepted, i.e.
    ``max_l (l + 1) / cost(l) > 1 / plain``; if not, no acceptance can make speculation pay."""
    cost = self._step_cost(costs)
    best_case = jnp.arange(1, self.max_len + 1, dtype=jnp.float32) + 1.0
    return jnp.max(best_case / cost[1:]) > 1.0 / cost[0]

  def choose(self, state: GoodputState) -> jax.Array:
    """The step's length: the argmax of :meth:`goodput`, or the best ``l >= 1`` when it is 0 and the
    policy is due to explore (``plain_run >= explore_every > 0`` and :meth:`could_pay`)."""
    goodput = self.goodput(state)
    best = jnp.argmax(goodput).astype(jnp.int32)
    if self.explore_every == 0:
      return best
    best_draft = (1 + jnp.argmax(goodput[1:])).astype(jnp.int32)
    explore = (state.plain_run >= self.explore_every) & self.could_pay(state.costs)
    return jnp.where(explore & (best == 0), best_draft, best)

  def start(self, costs: jax.Array):
    state = GoodputState(tried=jnp.zeros(self.max_len, jnp.float32),
                         accepted=jnp.zeros(self.max_len, jnp.float32), costs=costs,
                         plain_run=jnp.zeros((), jnp.int32))
    return self.choose(state), state

  def after_step(self, state, draft_len, num_drafts, accepted, live):
    del draft_len
    positions = jnp.arange(1, self.max_len + 1)[None, :]
    checked = live[:, None] & (positions <= jnp.minimum(accepted + 1, num_drafts)[:, None])
    passed = live[:, None] & (positions <= accepted[:, None])
    state = state.replace(tried=self.decay * state.tried + jnp.sum(checked, axis=0),
                          accepted=self.decay * state.accepted + jnp.sum(passed, axis=0),
                          plain_run=jnp.zeros((), jnp.int32))
    return self.choose(state), state

  def after_plain_step(self, state, draft_len):
    del draft_len
    state = state.replace(tried=self.decay * state.tried, accepted=self.decay * state.accepted,
                          plain_run=jnp.asarray(state.plain_run, jnp.int32) + 1)
    return self.choose(state), state


def break_even_acceptance(costs: StepCosts, max_len: int) -> tuple[float, int]:
  """The smallest per-position acceptance rate at which speculating beats a plain step, and the
  draft length that does it, under :class:`GoodputDraftLen`'s model: with ``alpha`` at every
  position, some ``l`` in ``1 … max_len`` has ``(1 + alpha + … + alpha^l) / cost(l) > 1 / plain``.

  Args:
    costs: measured :class:`StepCosts` (seconds). max_len: L, the longest draft.

  Returns:
    ``(alpha, l)``, alpha on a 0.001 grid; ``(1.0, 0)`` when no acceptance below 1 pays.
  """
  lengths = np.arange(1, max_len + 1)
  cost = (costs.propose_first + (lengths - 1) * costs.propose_next
          + np.ceil((lengths + 1) / costs.chunk) * costs.verify_pass)
  for alpha in np.arange(0.0, 1.0, 0.001):
    expected = 1 + np.cumsum(alpha ** lengths)  # E(l) with alpha at every position
    best = int(np.argmax(expected / cost))
    if expected[best] / cost[best] > 1 / costs.plain:
      return float(alpha), int(lengths[best])
  return 1.0, 0


DraftLenPolicy = DynamicDraftLen | FixedDraftLen | GoodputDraftLen


def as_policy(draft_len: int | str | DraftLenPolicy) -> DraftLenPolicy:
  """``"dynamic"`` -> the paper's Algorithm 1, ``"goodput"`` -> :class:`GoodputDraftLen` (costs measured),
  an int (or NumPy integer) -> that fixed length; policies pass through.

  Raises:
    ValueError: anything else (a digit string too: convert it where it is parsed), naming draft_len.
  """
  if isinstance(draft_len, (DynamicDraftLen, FixedDraftLen, GoodputDraftLen)):
    return draft_len
  if isinstance(draft_len, str) and draft_len == "dynamic":
    return DynamicDraftLen()
  if isinstance(draft_len, str) and draft_len == "goodput":
    return GoodputDraftLen()
  if _checks.is_int(draft_len):
    return FixedDraftLen(int(draft_len))
  raise ValueError(f"draft_len must be 'dynamic', 'goodput', an int >= 1 or a policy object "
                   f"(DynamicDraftLen, FixedDraftLen, GoodputDraftLen), got {draft_len!r}")
