"""Algorithm 1 of the BASS paper (§3.2) against the traces worked out in docs/bass.md ("Choosing the
draft length")."""

import dataclasses

import numpy as np
import pytest

from bass_jax.sampling.draft_len import DynamicDraftLen, FixedDraftLen, as_policy


def _trace(policy, accepted_per_step, start=None):
  length, s = policy.initial()
  if start is not None:
    length = start
  lengths = [int(length)]
  for accepted in accepted_per_step:
    length, s = policy.update(length, s, max(accepted(length)))
    lengths.append(int(length))
  return lengths


def test_all_accepted_grows_to_the_limit():
  got = _trace(DynamicDraftLen(), [lambda l: (l,)] * 14)
  assert got == [7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 32, 32]


def test_nothing_accepted_shrinks_to_one():
  got = _trace(DynamicDraftLen(), [lambda l: (0,)] * 12, start=32)
  assert got == [32, 28, 24, 20, 17, 14, 11, 8, 6, 4, 2, 1, 1]


def test_batch_of_two_trace():
  xs = [(7, 3), (9, 2), (11, 11), (13, 0), (12, 1), (10, 0), (8, 0), (6, 6)]
  got = _trace(DynamicDraftLen(), [lambda l, x=x: x for x in xs])
  assert got == [7, 9, 11, 13, 15, 13, 10, 8, 6]


def test_policies_parse_and_validate():
  assert as_policy("dynamic") == DynamicDraftLen()
  assert as_policy(4) == FixedDraftLen(4) and as_policy(np.int64(5)) == FixedDraftLen(5)
  assert _trace(FixedDraftLen(3), [lambda l: (0,)] * 3) == [3, 3, 3, 3]
  for bad in (0, -2, "often", "5", 2.5, True, None):
    with pytest.raises(ValueError):
      as_policy(bad)
  with pytest.raises(ValueError, match="l0"):
    DynamicDraftLen(l0=40)


# --- The cost-aware policy's exploration, and step costs measured on a busy machine (issue 24) ---

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import bass_jax as bj  # noqa: E402
from bass_jax.sampling import costs as costs_lib  # noqa: E402
from bass_jax.sampling import step_costs  # noqa: E402
from bass_jax.sampling.draft_len import CHAIN, PLAIN, GoodputDraftLen, GoodputState, StepCosts  # noqa: E402
from bass_jax.sampling.tree import TreeShape  # noqa: E402
from conftest import tiny_model  # noqa: E402

# Speculation loses at the prior (0.5: E(3) / cost(3) = 1.875 / 2.2 < 1 / plain) but would win with
# drafts that are always accepted (4 / 2.2 > 1): the case a pessimistic or unlucky measurement creates.
NOT_AT_PRIOR = StepCosts(plain=1.0, verify_pass=2.0, propose_first=0.1, propose_next=0.05, chunk=4)
# No acceptance can pay: even a perfect draft emits 4 tokens for 50 plain steps' time.
NEVER = StepCosts(plain=1.0, verify_pass=50.0, propose_first=0.0, propose_next=0.0, chunk=4)


def _plain(policy, state, length, rows=4):
  """The policy told of a plain step of ``rows`` live rows."""
  zeros = jnp.zeros(rows, jnp.int32)
  return policy.after_step(state, length, kind=PLAIN, depth=zeros, accepted=zeros,
                           live=jnp.ones(rows, bool))


def _run_policy(policy, costs, steps, accept_all, rows=4):
  """The policy's lengths over ``steps`` steps, as the decode calls it: a plain step when it picks 0,
  else a speculative one in which every row accepts all its drafts (``accept_all``) or none."""
  after_step = jax.jit(policy.after_step, static_argnames="kind")
  length, state = policy.start(costs.as_array())
  lengths = []
  live = jnp.ones(rows, bool)
  for _ in range(steps):
    l = int(length)
    lengths.append(l)
    if l == 0:
      length, state = after_step(state, length, kind=PLAIN, depth=0 * live, accepted=0 * live,
                                 live=live)
    else:
      drafts = jnp.full(rows, l, jnp.int32)
      length, state = after_step(state, length, kind=CHAIN, depth=drafts,
                                 accepted=drafts if accept_all else 0 * drafts, live=live)
  return np.array(lengths)


def _longest_plain_run(lengths):
  run = longest = 0
  for l in lengths:
    run = run + 1 if l == 0 else 0
    longest = max(longest, run)
  return longest


@pytest.mark.parametrize("k", [4, 16])
def test_goodput_explores_after_k_plain_steps_and_backs_off_when_speculation_loses(k):
  policy = GoodputDraftLen(explore_every=k)
  lengths = _run_policy(policy, NOT_AT_PRIOR, steps=8 * k + 4 * k + 2 * k + k + 5, accept_all=False)
  assert lengths[0] == 0  # the prior says plain
  # Nothing is ever accepted, so each exploration is a single step and fails: k plain steps, then one
  # draft; then the wait doubles (2k, 4k, 8k plain steps) and stays at 8k.
  explored = np.flatnonzero(lengths > 0)
  expected, at = [], -1
  for wait in (k, 2 * k, 4 * k, 8 * k):
    at += wait + 1
    expected.append(at)
  np.testing.assert_array_equal(explored, [e for e in expected if e < len(lengths)])
  # The best positive length under the running rates: at the prior, one verification pass's worth
  # (l = 3); later within one pass still, shorter as the failed explorations lower the rates.
  assert lengths[explored[0]] == 3 and set(lengths[explored].tolist()) <= {1, 2, 3}


def test_goodput_without_exploration_stays_plain_where_the_prior_says_so():
  lengths = _run_policy(GoodputDraftLen(explore_every=0), NOT_AT_PRIOR, steps=60, accept_all=True)
  assert (lengths == 0).all()


def test_an_exploration_that_finds_good_drafts_keeps_speculating():
  """The starved policy recovers: after one exploration whose drafts were all accepted, it speculates
  on its own, where without exploration it would have decoded plainly throughout (test above)."""
  lengths = _run_policy(GoodputDraftLen(explore_every=8), NOT_AT_PRIOR, steps=30, accept_all=True)
  assert (lengths[:8] == 0).all() and (lengths[8:] > 0).all()


def test_goodput_never_explores_where_no_acceptance_could_pay():
  policy = GoodputDraftLen(explore_every=4)
  assert bool(policy.could_pay(NOT_AT_PRIOR.as_array()))
  assert not bool(policy.could_pay(NEVER.as_array()))
  assert (_run_policy(policy, NEVER, steps=30, accept_all=True) == 0).all()


def test_explore_every_is_validated_and_part_of_the_policy():
  assert bj.GoodputDraftLen().explore_every == 16 and as_policy("goodput").explore_every == 16
  assert GoodputDraftLen(explore_every=0) != GoodputDraftLen()  # a different decode program
  for bad in (-1, 2.5, None):
    with pytest.raises(ValueError, match="explore_every"):
      GoodputDraftLen(explore_every=bad)


def test_a_decode_explores_and_stays_lossless():
  """Through generate: under costs where drafting loses at the prior, exploration speculates at least
  once every k plain steps (the decode would otherwise be all plain: tests above), the perfect draft's
  tokens are accepted, and the greedy tokens are still regular decoding's."""
  target = tiny_model(0, scale=3.0)
  prompts = [[3, 9, 4, 1, 7], [5, 2, 8]]
  kw = dict(max_new_tokens=16, eos_token_id=())
  regular = bj.generate(target, None, prompts, method="regular", **kw)
  k = 3
  bass = bj.generate(target, target, prompts, **kw,  # the target drafts for itself
                     draft_len=GoodputDraftLen(explore_every=k, costs=NOT_AT_PRIOR))
  np.testing.assert_array_equal(bass.tokens, regular.tokens)
  lens = bass.stats.draft_lens
  assert (lens[:k] == 0).all() and lens[k] > 0 and _longest_plain_run(lens) <= k
  assert (bass.stats.accepted > 0).any()


class _SimulatedMachine:
  """A clock and timed calls of known cost on a simulated machine; from ``busy_from`` seconds on, a
  background job makes every call ``slowdown`` times slower (interference only adds time)."""

  def __init__(self, busy_from, slowdown=3.0):
    self.now, self.busy_from, self.slowdown = 0.0, busy_from, slowdown

  def clock(self):
    return self.now

  def call(self, seconds):
    def run():
      self.now += seconds * (self.slowdown if self.now >= self.busy_from else 1.0)
    return run


def test_a_load_that_starts_during_the_measurement_does_not_inflate_the_ratio():
  """Plain step 1 s, verification pass 2 s; a load starts after 2 rounds and lasts. Timed one piece after
  the other (as before), the pass is timed entirely under load: ratio 6. Interleaved, and the fastest of
  each, both pieces have quiet rounds: ratio 2, the machine's own."""
  # Busy from 10 s on: interleaved, after the warm-up calls (3 s) and two quiet rounds (3 s each); one
  # after the other, after the plain step's 8 calls and the pass's warm-up call.
  machine = _SimulatedMachine(busy_from=10.0)
  plain, verify = machine.call(1.0), machine.call(2.0)
  got = costs_lib.fastest_seconds([plain, verify], repeats=7, clock=machine.clock)
  assert got == [1.0, 2.0]

  machine = _SimulatedMachine(busy_from=10.0)
  plain, verify = machine.call(1.0), machine.call(2.0)
  one_after_the_other = [costs_lib.fastest_seconds([c], repeats=7, clock=machine.clock)[0]
                         for c in (plain, verify)]
  assert one_after_the_other[1] / one_after_the_other[0] == 6.0  # the failure this avoids


def test_the_fastest_call_ignores_noise_and_load_throughout_keeps_the_ratio():
  rng = np.random.default_rng(0)
  now = [0.0]

  def call(seconds, load):
    def run():  # interference only ever adds time
      now[0] += seconds * load + rng.exponential(0.5 * seconds)
    return run

  for load in (1.0, 4.0):
    got = costs_lib.fastest_seconds([call(1.0, load), call(2.0, load)], repeats=9,
                                    clock=lambda: now[0])
    assert got[1] / got[0] == pytest.approx(2.0, rel=0.25)
  with pytest.raises(ValueError, match="repeats"):
    costs_lib.fastest_seconds([call(1.0, 1.0)], repeats=0)


def test_time_forwards_threads_one_cache_through_every_forward():
  model = tiny_model(0)
  seconds = costs_lib.time_forwards(model.config, "float32", "reference", model.params, batch=2,
                                    positions=[1, 4], cache_len=32)
  assert len(seconds) == 2 and all(0 < s < 10 for s in seconds)


# --- The cost-aware policy with token trees (issue 25) --------------------------------------------------

TREES = (TreeShape(top_k=3, depth=3, nodes=8), TreeShape(top_k=2, depth=5, nodes=12))


def _run_tree_policy(policy, costs, steps, chain_accepts, tree_accepts, rows=4):
  """The kinds of step the policy picks over ``steps`` steps, as the decode calls it: "plain", "chain"
  or tree j; every row of a chain of l drafts accepts ``min(chain_accepts, l)`` of them, every row of a
  tree of shape j ``tree_accepts[j]`` levels."""
  after_step = jax.jit(policy.after_step, static_argnames="kind")
  length, state = policy.start(costs.as_array())
  kinds, live = [], jnp.ones(rows, bool)
  for _ in range(steps):
    tree = int(policy.tree_choice(state))
    if int(length) == 0:
      kinds.append("plain")
      length, state = after_step(state, length, kind=PLAIN, depth=0 * live, accepted=0 * live,
                                 live=live)
    elif tree < 0:
      kinds.append("chain")
      drafts = jnp.full(rows, int(length), jnp.int32)
      length, state = after_step(state, length, kind=CHAIN, depth=drafts,
                                 accepted=jnp.minimum(drafts, chain_accepts), live=live)
    else:
      kinds.append(tree)
      assert int(length) == policy.trees[tree].depth
      depth = jnp.full(rows, policy.trees[tree].depth)
      length, state = after_step(state, length, kind=tree, depth=depth,
                                 accepted=jnp.full(rows, tree_accepts[tree]), live=live)
  return kinds


def test_goodput_takes_the_tree_whose_acceptance_pays_for_its_nodes():
  """Chains accept one draft a step; the deep tree accepts four levels and the shallow one two. At a
  cost of 1.6 verification passes a tree step, the deep tree emits 5 tokens for 1.6 + 0.1 where the
  best chain emits 2 for 1.25: after exploring each kind, the policy settles on the deep tree, and
  goes back to each other kind only to explore it (at most once in explore_every + 1 steps)."""
  policy = GoodputDraftLen(max_len=6, explore_every=8, trees=TREES)
  costs = StepCosts(plain=1.0, verify_pass=1.2, propose_first=0.05, propose_next=0.05, chunk=4,
                    tree_steps=(1.7, 1.7))
  kinds = _run_tree_policy(policy, costs, steps=60, chain_accepts=1, tree_accepts=(2, 4))
  assert 0 in kinds and "chain" in kinds  # every kind was tried
  settled = kinds[30:]
  assert settled.count(1) >= len(settled) - 2 * (-(-len(settled) // 9)), kinds
  for kind in ("chain", 0):  # explorations only: never two in a row, never closer than 9 steps
    where = [i for i, k in enumerate(settled) if k == kind]
    assert all(b - a >= 9 for a, b in zip(where, where[1:])), (kind, kinds)


def test_goodput_keeps_chains_where_trees_cost_more_than_they_accept():
  """Trees accept no more than the chain here (two levels) and cost more: the policy keeps chains,
  verifying each tree only as an exploration (its full acceptance would beat the chain: 4 / 1.5 and
  6 / 1.8 tokens per second against 3 / 1.3)."""
  policy = GoodputDraftLen(max_len=6, explore_every=8, trees=TREES)
  costs = StepCosts(plain=1.0, verify_pass=1.2, propose_first=0.05, propose_next=0.05, chunk=4,
                    tree_steps=(1.5, 1.8))
  kinds = _run_tree_policy(policy, costs, steps=60, chain_accepts=2, tree_accepts=(2, 2))
  assert kinds.count("chain") >= 60 - 2 * 7 and 0 in kinds and 1 in kinds, kinds
  for kind in (0, 1):
    where = [i for i, k in enumerate(kinds) if k == kind]
    assert all(b - a >= 9 for a, b in zip(where, where[1:])), (kind, kinds)


def test_goodput_never_explores_a_tree_that_cannot_beat_the_choice():
  """A tree whose every level accepted would still emit fewer tokens per second than the chain is
  expected to is never verified: no evidence could make it the choice."""
  policy = GoodputDraftLen(max_len=6, explore_every=2, trees=TREES)
  costs = StepCosts(plain=1.0, verify_pass=1.2, propose_first=0.05, propose_next=0.05, chunk=4,
                    tree_steps=(40.0, 50.0))
  kinds = _run_tree_policy(policy, costs, steps=30, chain_accepts=3, tree_accepts=(3, 5))
  assert set(kinds) == {"chain"}, kinds


def test_goodput_tree_rates_start_at_the_chain_rates_and_learn_per_level():
  policy = GoodputDraftLen(max_len=4, prior=0.5, prior_weight=1.0, decay=1.0, trees=TREES)
  costs = StepCosts(1.0, 1.2, 0.05, 0.05, 4, tree_steps=(1.5, 1.5))
  _, state = policy.start(costs.as_array())
  rates = np.asarray(policy.tree_rates(state))
  assert rates.shape == (2, 5)
  np.testing.assert_allclose(rates, 0.5)
  # Two rows: one accepts two levels of shape 0 (depth 3), one none.
  _, state = policy.after_step(state, 3, kind=0, depth=jnp.asarray([3, 3]),
                               accepted=jnp.asarray([2, 0]), live=jnp.ones(2, bool))
  rates = np.asarray(policy.tree_rates(state))
  # Level 1: checked twice, passed once; level 2: checked and passed once; level 3: checked once, failed.
  np.testing.assert_allclose(rates[0, :3], [(1 + 0.5) / 3, (1 + 0.5) / 2, 0.5 / 2])
  np.testing.assert_allclose(rates[1], 0.5)  # the other shape learnt nothing
  # A row whose tree reached depth 1 only (an n-gram branch) and accepted it is not counted at level 2.
  _, state = policy.after_step(state, 3, kind=0, depth=jnp.asarray([1]), accepted=jnp.asarray([1]),
                               live=jnp.ones(1, bool))
  np.testing.assert_allclose(np.asarray(policy.tree_rates(state))[0, :2],
                             [(2 + 0.5) / 4, (1 + 0.5) / 2])
  with pytest.raises(ValueError, match="GoodputDraftLen.trees"):
    GoodputDraftLen(trees=("top_k=2,depth=2,nodes=4",))


def test_an_exploration_that_runs_plainly_does_not_back_off():
  """The backoff rises when an explored step is verified, not when it is chosen: a step the policy
  wanted to explore but that ran plainly (no row had a proposal) leaves the next exploration due."""
  policy = GoodputDraftLen(explore_every=2)
  length, state = policy.start(NOT_AT_PRIOR.as_array())
  for _ in range(2):
    length, state = _plain(policy, state, length)
  assert int(length) > 0 and int(state.explored) == 0  # due
  length, state = _plain(policy, state, length)  # ran plainly instead
  assert int(state.backoff[0]) == 0 and int(length) > 0  # still due
  length, state = policy.after_step(state, length, kind=CHAIN, depth=jnp.full(4, int(length)),
                                    accepted=jnp.zeros(4, jnp.int32), live=jnp.ones(4, bool))
  assert int(state.backoff[0]) == 1  # verified and lost: the wait doubles


def test_goodput_costs_need_one_cost_per_tree_shape():
  with pytest.raises(ValueError, match="tree_steps one cost"):
    GoodputDraftLen(trees=TREES, costs=StepCosts(1.0, 1.2, 0.0, 0.0, 4, tree_steps=(1.5,)))


def test_a_branch_free_draft_loop_charges_every_chain_its_whole_loop():
  """With the GPU profile's static draft loop (StepCosts.fixed_drafts = L) a chain of any length pays
  all L drafts: costs an H200 measured (SmolLM2, B = 16: plain 1.79 ms, a pass 2.21 ms, the EAGLE
  draft's first and further forwards 0.23 and 0.32 ms, L = 8 in one pass of 9) make the per-l model
  speculate (l = 1) at 0.5 acceptance where the whole loop does not pay, and the fixed model decode
  plainly, as regular decoding would."""
  policy = GoodputDraftLen(max_len=8)
  per_l = StepCosts(plain=1.79, verify_pass=2.21, propose_first=0.23, propose_next=0.32, chunk=9)
  fixed = dataclasses.replace(per_l, fixed_drafts=8)
  assert fixed.as_array().shape == (6,) and float(fixed.as_array()[5]) == 8

  def choice(costs, rate):
    tried = jnp.full(policy.max_len, 1e7, jnp.float32)
    return int(policy.choose(GoodputState(tried, rate * tried, costs.as_array())))

  assert choice(per_l, 0.5) >= 1 and choice(fixed, 0.5) == 0
  cost = np.asarray(policy._step_cost(fixed.as_array()))  # pylint: disable=protected-access
  np.testing.assert_allclose(cost[1:], 0.23 + 7 * 0.32 + 2.21, rtol=1e-6)  # every l pays the loop
  assert float(cost[0]) == pytest.approx(1.79)
  assert choice(fixed, 0.95) == 8  # when the loop pays, its every draft is verified
  # The break-even acceptance follows the same model.
  assert step_costs.break_even_acceptance(fixed, 8)[0] > step_costs.break_even_acceptance(
      per_l, 8)[0]
