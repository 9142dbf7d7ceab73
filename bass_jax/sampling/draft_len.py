"""Draft length per step: fixed, the BASS heuristic (paper §3.2, Algorithm 1), or cost-aware (goodput).

Every policy offers the decode loop the same two calls, both traceable (no host sync):
``start(costs) -> (l, state)`` before the first step, and ``after_step(state, l, kind=, depth=,
accepted=, live=) -> (l, state)`` after every step, where ``kind`` (static) says what the step was:
:data:`PLAIN` (a plain decoding step: no row had a proposal, or the policy chose ``l = 0``),
:data:`CHAIN`, or the index of the tree shape it verified; ``depth: i32[B]`` the drafts each row had
checked (a chain's length, a tree's deepest node; 0 for a plain step), ``accepted: i32[B]`` the drafts
each row accepted and ``live: bool[B]`` the rows that decoded. Only :class:`GoodputDraftLen` chooses
``l = 0``, and only it chooses between chains and tree shapes (its ``tree_choice(state) -> i32[]``, the
tree shape of the next speculative step or -1 for a chain); the others verify the one tree shape given,
every step, when there is one. :class:`NoDrafts` is the policy of a decode without a proposer
(regular decoding): always ``l = 0``.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.sampling.step_costs import StepCosts
from bass_jax.sampling.tree import TreeShape

PLAIN = "plain"  # after_step's kind of a plain decoding step
CHAIN = "chain"  # ... of a chain step; a tree step's kind is its shape's index


class _MaxAcceptedPolicy:
  """``start`` and ``after_step`` for policies that adapt from the largest
  number of drafts a live row accepted (their state is Algorithm 1's ``s``)."""

  may_choose_zero = False  # never picks l = 0 (plain steps come only from a proposer without drafts)

  def start(self, costs: jax.Array):
    del costs
    l0, s0 = self.initial()
    return jnp.asarray(l0, jnp.int32), jnp.asarray(s0, jnp.int32)

  def after_step(self, state, draft_len, *, kind, depth, accepted, live):
    """After a chain step, Algorithm 1's update from the largest accepted count; a plain or tree step
    changes nothing (a tree's shape is fixed: only goodput chooses among shapes)."""
    del depth
    if kind != CHAIN:
      return draft_len, state
    max_accepted = jnp.max(jnp.where(live, accepted, 0))
    next_len, next_s = self.update(draft_len, state, max_accepted)
    return jnp.asarray(next_len, jnp.int32), jnp.asarray(next_s, jnp.int32)


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
    if self.l_limit > MAX_DRAFT_LEN:
      raise ValueError(f"DynamicDraftLen.l_limit={self.l_limit} exceeds MAX_DRAFT_LEN = {MAX_DRAFT_LEN} "
                       "(each length up to it is compiled); lower it")
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


# A fixed draft length's limit: the paper's l_limit. A step traces one draft forward per draft position
# and the verification scores l + 1 positions, so an unbounded length compiles for minutes.
MAX_DRAFT_LEN = 32


@dataclasses.dataclass(frozen=True)
class FixedDraftLen(_MaxAcceptedPolicy):
  """The same ``l_draft`` every step (the paper's fixed-length ablation, Table 5), at most
  :data:`MAX_DRAFT_LEN`."""

  length: int

  def __post_init__(self):
    object.__setattr__(self, "length", _checks.as_int("draft_len (a fixed draft length)", self.length,
                                                      min_value=1, max_value=MAX_DRAFT_LEN))

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
    tried: ``f32[L]`` decayed count of chain steps in which draft position i + 1 was checked.
    accepted: ``f32[L]`` decayed count of those in which it was accepted.
    costs: ``f32[6 + T]`` :meth:`StepCosts.as_array`.
    since: ``i32[1 + T]`` (or a scalar for all) steps since a chain (entry 0) and each tree shape
      (entry 1 + j) was last verified: the exploration clocks.
    tree_tried, tree_accepted: ``f32[T, D]`` the same counts for each tree shape's level d + 1
      (D the deepest shape's depth); None without trees.
    tree: ``i32[]`` the tree shape the next speculative step verifies, -1 for a chain.
    backoff: ``i32[1 + T]`` (or a scalar for all) explorations of each kind verified since the policy
      last chose it on its own: the next waits ``explore_every * 2**backoff`` steps (at most
      ``2**MAX_BACKOFF``).
    explored: ``i32[]`` the kind the next step explores (0 the chain, 1 + j tree j), -1 for none; its
      backoff rises only once that step is verified (a step with nothing to propose runs plainly).
  """

  tried: jax.Array
  accepted: jax.Array
  costs: jax.Array
  since: jax.Array = 0
  tree_tried: jax.Array | None = None
  tree_accepted: jax.Array | None = None
  tree: jax.Array = -1
  backoff: jax.Array = 0
  explored: jax.Array = -1


MAX_BACKOFF = 3  # an exploration that fails waits at most 2**3 = 8 times explore_every


@dataclasses.dataclass(frozen=True)
class GoodputDraftLen:
  """Cost-aware draft length: each step, the ``l`` in ``0 … max_len`` that maximizes expected emitted
  tokens per second (the goodput of SmartSpec, Liu et al. 2024, and TurboSpec), or, with token trees,
  the tree shape that does.

  With ``a_i`` the running rate at which draft position i is accepted given that positions ``1 … i-1``
  were, a row emits ``E(l) = 1 + sum_{i<=l} prod_{j<=i} a_j`` tokens per step, and the step costs
  ``cost(0) = plain`` or ``cost(l) = propose_first + (l - 1) propose_next + ceil((l + 1) / C)
  verify_pass`` seconds (every pass counted, early exits not: a slight overestimate for long drafts);
  where the draft loop runs its static ``L`` iterations whatever l (``StepCosts.fixed_drafts``, the
  GPU profile's branch-free loop), every chain pays ``propose_first + (L - 1) propose_next``, so a
  short chain is no cheaper than a long one and plain steps win wherever the whole loop does not pay.
  All rows share the step, so the policy picks ``argmax_l E(l) / cost(l)``; ``l = 0`` is a plain
  decoding step, which emits exactly what regular decoding emits. The rates are counts of tried and
  accepted positions over live rows, decayed by ``decay`` every step (plain steps too) and smoothed
  towards ``prior`` with weight ``prior_weight``: after a stretch of plain steps the estimate drifts back
  to the prior, and speculation is tried again if the prior says it would pay.

  **Token trees** (``trees``, set by ``generate`` from its ``draft_tree``; docs/design.md "Token
  trees"). Each tree shape j is one more option: it emits ``E_j = 1 + sum_{d<=depth_j} prod_{i<=d}
  t_{j,i}`` tokens per step, with ``t_{j,d}`` the running rate at which a row that accepted d - 1 levels
  of shape j's trees accepts level d (counted like the chain's, from tree steps), and costs
  ``StepCosts.tree_steps[j]``. Before any evidence a level's rate is the chain's at the same depth (a
  tree holds a chain's candidates and more), so a tree starts no better than a chain at a higher cost,
  and is first tried by exploration (below). The policy thus picks plain, a chain length or a tree,
  whichever has the most expected tokens per second: trees where their extra acceptance pays for their
  extra nodes (small batches), chains where it does not.

  **Exploration.** The rates learn only from the steps that verify them, and the costs are measured
  once, before the decode (no clock runs inside the jitted loop, and the host regains control only when
  a row finishes, so costs cannot be re-measured as the decode goes). If the measurement was unlucky (a
  busy machine inflating the verification pass) or the prior is pessimistic, the argmax can be plain at
  the prior itself, and then nothing the decode sees can ever change it. So after ``explore_every``
  steps without a chain (or without a given tree shape) the policy verifies that kind once (the chain's
  best ``l >= 1``), and the rates then say whether to go on. It does so only if that kind *could* beat
  the current choice under the measured costs, i.e. if its drafts accepted in full would (``(l + 1) /
  cost(l)``, ``(depth_j + 1) / cost_j``, against the chosen option's expected goodput; against a plain
  step, ``1 / plain``): where even that loses, no evidence could change the choice. An exploration
  after which the policy does not choose that kind on its own doubles the wait before the next one
  (exponential backoff, up to ``2**MAX_BACKOFF = 8`` times ``explore_every``; choosing the kind resets
  it), so a kind that keeps losing costs less and less: with ``explore_every = 16``, a one-pass draft
  whose verification costs 2x a plain step and a negligible proposer, the first exploration is one
  step in 17 (6 % more time if not a single draft were accepted), and in the long run one in 129
  (under 1 %). Each exploration still emits at least one token per row.

  Sampling stays exact: like the rest of the policy, exploration chooses a step's length from earlier
  steps only (the step counts, the rates), never from the step's own draws, and every length and tree
  is verified by the same lossless acceptance.

  Attributes:
    max_len: the longest draft (L). decay: per-step decay of the counts, in (0, 1].
    prior: the acceptance rate assumed before any evidence, in (0, 1).
    prior_weight: pseudo-count of the prior, > 0.
    explore_every: steps without a kind of step before it is tried once (above, with its backoff); 0
      never explores.
    costs: :class:`StepCosts`; None measures them for the call's setting (``bass_jax.sampling.costs``).
    trees: the tree shapes to choose among (``tree.TreeShape``); empty: chains and plain steps only.

  Raises:
    ValueError: from the constructor, for a parameter out of range (named), or ``costs`` whose
      ``tree_steps`` do not give one cost per tree shape.
  """

  may_choose_zero = True  # class attribute, not a field
  max_len: int = 8
  decay: float = 0.9
  prior: float = 0.5
  prior_weight: float = 1.0
  explore_every: int = 16
  costs: StepCosts | None = dataclasses.field(default=None, compare=False)
  trees: tuple[TreeShape, ...] = ()

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
    trees = tuple(self.trees)
    if not all(isinstance(t, TreeShape) for t in trees):
      raise ValueError(f"GoodputDraftLen.trees must hold TreeShape values, got {self.trees!r}")
    object.__setattr__(self, "trees", trees)
    if self.costs is not None and trees and len(self.costs.tree_steps) != len(trees):
      raise ValueError(f"GoodputDraftLen.costs has {len(self.costs.tree_steps)} tree_steps for "
                       f"{len(trees)} tree shapes: give StepCosts.tree_steps one cost (seconds) per "
                       "shape, in draft_tree's order, or costs=None to measure them")

  @property
  def max_depth(self) -> int:
    """D: the deepest tree shape's depth (0 without trees)."""
    return max((t.depth for t in self.trees), default=0)

  def _smoothed(self, accepted, tried, prior):
    """Acceptance counts smoothed towards ``prior`` with weight ``prior_weight``."""
    return (accepted + prior * self.prior_weight) / (tried + self.prior_weight)

  def rates(self, state: GoodputState) -> jax.Array:
    """``f32[L]`` smoothed conditional acceptance rate of each draft position of a chain."""
    return self._smoothed(state.accepted, state.tried, self.prior)

  def tree_rates(self, state: GoodputState) -> jax.Array:
    """``f32[T, D]`` smoothed conditional acceptance rate of each level of each tree shape, smoothed
    towards the chain's rate at the same depth (``prior`` past the chain's longest draft)."""
    chain = jnp.concatenate([self.rates(state),
                             jnp.full(max(self.max_depth - self.max_len, 0), self.prior)])
    return self._smoothed(state.tree_accepted, state.tree_tried, chain[:self.max_depth])

  def _step_cost(self, costs: jax.Array) -> jax.Array:
    """``f32[L + 1]`` seconds of a step of length ``l = 0 … L``; ``costs`` is
    :meth:`StepCosts.as_array`."""
    plain, verify_pass, first, nxt, chunk, fixed = (costs[i] for i in range(6))
    lengths = jnp.arange(self.max_len + 1, dtype=jnp.float32)
    passes = jnp.ceil((lengths + 1) / chunk)
    drafted = jnp.where(fixed > 0, fixed, lengths)  # a branch-free loop drafts L whatever l
    return jnp.where(lengths == 0, plain, first + (drafted - 1) * nxt + passes * verify_pass)

  def _option_cost(self, costs: jax.Array) -> jax.Array:
    """``f32[L + 1 + T]`` seconds of each option: plain, chains ``l = 1 … L``, each tree shape."""
    return jnp.concatenate([self._step_cost(costs), costs[6:6 + len(self.trees)]])

  def _lengths(self) -> jax.Array:
    """``i32[L + 1 + T]`` the most drafts each option can accept: 0 (plain), ``l``, or a tree's
    depth; also the draft length the decode records for it."""
    return jnp.asarray(list(range(self.max_len + 1)) + [t.depth for t in self.trees], jnp.int32)

  def goodput(self, state: GoodputState) -> jax.Array:
    """``f32[L + 1 + T]`` expected emitted tokens per second per row of each option: a plain step, a
    chain of ``l = 1 … L`` drafts, each tree shape (none without trees)."""
    expected = [jnp.ones(1), 1.0 + jnp.cumsum(jnp.cumprod(self.rates(state)))]
    if self.trees:
      levels = jnp.arange(1, self.max_depth + 1)
      depths = self._lengths()[self.max_len + 1:, None]
      reach = jnp.where(levels <= depths, jnp.cumprod(self.tree_rates(state), axis=1), 0.0)
      expected.append(1.0 + jnp.sum(reach, axis=1))
    return jnp.concatenate(expected) / self._option_cost(state.costs)

  def could_pay(self, costs: jax.Array) -> jax.Array:
    """``bool[]``: whether some speculative option beats a plain step when every draft is accepted,
    i.e. ``max (drafts + 1) / cost > 1 / plain``; if not, no acceptance can make speculation pay."""
    upper = (self._lengths() + 1.0) / self._option_cost(costs)
    return jnp.max(upper[1:]) > upper[0]

  def _option(self, state: GoodputState):
    """``(option i32[], state)``: the chosen option's index into :meth:`goodput`, an exploration's
    (class docstring) when one is due, and the state with the kind explored and the backoff of the
    kind that wins on its merits updated."""
    goodput = self.goodput(state)
    best = jnp.argmax(goodput).astype(jnp.int32)
    num_l, num_trees = self.max_len, len(self.trees)
    upper = ((self._lengths() + 1.0) / self._option_cost(state.costs))[1:]
    # Per kind of step (the chain, each tree shape): its best option, and the most it could achieve.
    kind_best = jnp.concatenate([jnp.argmax(goodput[1:num_l + 1], keepdims=True) + 1,
                                 num_l + 1 + jnp.arange(num_trees)]).astype(jnp.int32)
    kind_upper = jnp.concatenate([jnp.max(upper[:num_l], keepdims=True), upper[num_l:]])
    kind_of_best = jnp.where(best > num_l, best - num_l, jnp.where(best > 0, 0, -1))
    since = jnp.broadcast_to(jnp.asarray(state.since, jnp.int32), (1 + num_trees,))
    backoff = jnp.broadcast_to(jnp.asarray(state.backoff, jnp.int32), (1 + num_trees,))
    kinds = jnp.arange(1 + num_trees)
    stale = ((since >= self.explore_every * 2**backoff) & (kind_upper > goodput[best])
             & (kinds != kind_of_best))
    explore = jnp.argmax(jnp.where(stale, since, -1)).astype(jnp.int32)
    # The backoff resets for the kind that wins on its merits; the explored kind's rises once its
    # step is verified (_decayed).
    state = state.replace(backoff=jnp.where(kinds == kind_of_best, 0, backoff),
                          explored=jnp.where(jnp.any(stale), explore, -1))
    return jnp.where(jnp.any(stale), kind_best[explore], best), state

  def _decide(self, state: GoodputState):
    """``(l, state)``: the next step's draft length (a chosen tree's depth) with ``state.tree`` set."""
    if self.explore_every == 0:
      option = jnp.argmax(self.goodput(state)).astype(jnp.int32)
    else:
      option, state = self._option(state)
    tree = jnp.where(option > self.max_len, option - self.max_len - 1, -1)
    return self._lengths()[option], state.replace(tree=tree.astype(jnp.int32))

  def choose(self, state: GoodputState) -> jax.Array:
    """``i32[]``, the step's length: the argmax of :meth:`goodput` (a tree's depth if a tree wins; then
    :meth:`tree_choice` says which), or an exploration (class docstring)."""
    return self._decide(state)[0]

  def tree_choice(self, state: GoodputState) -> jax.Array:
    """``i32[]``: the tree shape the next speculative step verifies (index into ``trees``), -1 for a
    chain."""
    return state.tree

  def start(self, costs: jax.Array):
    num_trees, depth = len(self.trees), self.max_depth
    state = GoodputState(
        tried=jnp.zeros(self.max_len, jnp.float32), accepted=jnp.zeros(self.max_len, jnp.float32),
        costs=costs, since=jnp.zeros(1 + num_trees, jnp.int32),
        tree_tried=jnp.zeros((num_trees, depth), jnp.float32) if num_trees else None,
        tree_accepted=jnp.zeros((num_trees, depth), jnp.float32) if num_trees else None,
        tree=jnp.asarray(-1, jnp.int32), backoff=jnp.zeros(1 + num_trees, jnp.int32),
        explored=jnp.asarray(-1, jnp.int32))
    return self._decide(state)

  def _decayed(self, state: GoodputState, verified: int | None) -> GoodputState:
    """Every count decayed one step; the exploration clocks advanced, ``verified``'s (0 the chain,
    1 + j tree j, None a plain step) reset, and its backoff raised if the step explored it."""
    kinds = 1 + len(self.trees)
    since = jnp.broadcast_to(jnp.asarray(state.since, jnp.int32), (kinds,)) + 1
    backoff = jnp.broadcast_to(jnp.asarray(state.backoff, jnp.int32), (kinds,))
    if verified is not None:
      since = since.at[verified].set(0)
      raised = jnp.minimum(backoff[verified] + 1, MAX_BACKOFF)
      backoff = backoff.at[verified].set(
          jnp.where(state.explored == verified, raised, backoff[verified]))
    state = state.replace(tried=self.decay * state.tried, accepted=self.decay * state.accepted,
                          since=since, backoff=backoff)
    if self.trees:
      state = state.replace(tree_tried=self.decay * state.tree_tried,
                            tree_accepted=self.decay * state.tree_accepted)
    return state

  @staticmethod
  def _counts(width: int, num_drafts, accepted, live):
    """``(checked, passed)``: ``f32[width]`` live rows whose position i + 1 was checked (the drafts up
    to the first rejection) and passed."""
    positions = jnp.arange(1, width + 1)[None, :]
    checked = live[:, None] & (positions <= jnp.minimum(accepted + 1, num_drafts)[:, None])
    passed = live[:, None] & (positions <= accepted[:, None])
    return jnp.sum(checked, axis=0), jnp.sum(passed, axis=0)

  def after_step(self, state, draft_len, *, kind, depth, accepted, live):
    """Every count decays; a chain step (``kind == CHAIN``) teaches the chain's position counts, a
    tree step (``kind`` the shape's static index) that shape's level counts, from each live row's
    checked ``depth`` (a row whose tree is shorter than the shape, or empty, is not counted at the
    levels it lacks) and ``accepted`` drafts; a plain step teaches nothing. Then the next step is
    chosen (:meth:`choose`).

    Returns:
      ``(l i32[], state)`` for the next step.
    """
    del draft_len
    if kind == PLAIN:
      return self._decide(self._decayed(state, None))
    if kind == CHAIN:
      state = self._decayed(state, 0)
      checked, passed = self._counts(self.max_len, depth, accepted, live)
      return self._decide(state.replace(tried=state.tried + checked,
                                        accepted=state.accepted + passed))
    state = self._decayed(state, 1 + kind)
    checked, passed = self._counts(self.max_depth, depth, accepted, live)
    return self._decide(state.replace(tree_tried=state.tree_tried.at[kind].add(checked),
                                      tree_accepted=state.tree_accepted.at[kind].add(passed)))


@dataclasses.dataclass(frozen=True)
class NoDrafts:
  """The policy of a decode without a proposer (regular decoding): every step plain, ``l = 0``."""

  may_choose_zero = True
  max_len = 0

  def start(self, costs: jax.Array):
    del costs
    return jnp.zeros((), jnp.int32), None

  def after_step(self, state, draft_len, *, kind, depth, accepted, live):
    del kind, depth, accepted, live
    return draft_len, state


DraftLenPolicy = DynamicDraftLen | FixedDraftLen | GoodputDraftLen | NoDrafts


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
