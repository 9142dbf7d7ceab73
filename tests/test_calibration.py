"""Step costs measured in the decode's own programs (bass_jax.sampling.calibration): the forced costs
make every step one kind, the calibrated costs charge a step its whole branch-free loop, nothing
compiles for it, it runs once per setting, and it changes no output."""

import dataclasses

import numpy as np
import pytest

import bass_jax as bj
from bass_jax import profiles
from bass_jax.sampling import calibration, compile_cache, runner
from conftest import noisy_copy, tiny_model

# The GPU profile's decode (a static draft loop, one verification pass) with the jnp attention.
BRANCH_FREE = profiles.BackendProfile("branch-free", "reference", None, True)


@pytest.fixture(scope="module")
def pair():
  target = tiny_model(0, scale=2.5)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(0, 61, n).tolist() for n in (4, 9, 6)]
  return target, noisy_copy(target, 0.3, 2), prompts


def _plan(pair, **settings):
  target, draft, prompts = pair
  config = bj.DecodeConfig(max_new_tokens=24, draft_len=bj.GoodputDraftLen(max_len=4),
                           profile=BRANCH_FREE, **settings)
  return bj.prepare(target, draft, prompts, config)


def test_forced_costs_make_every_step_one_kind(pair):
  plan = _plan(pair)
  assert plan.calibrate and plan.step_costs is None
  for speculate, want in ((False, 0), (True, plan.spec.max_draft)):
    forced = calibration.with_costs(plan, calibration.forced(plan.spec, speculate=speculate))
    out = runner.run(calibration._shortened(forced, 12), time_prompts=False)  # pylint: disable=protected-access
    assert out.stats.steps > 0 and set(out.stats.draft_lens.tolist()) == {want}, out.stats.draft_lens
    assert out.lengths.tolist() == [12, 12, 12]


def test_calibrated_costs_charge_the_whole_loop_once_per_setting_with_no_compile(pair):
  """Calibration runs in the decode's own programs: the call builds no setting but its own, and that
  one only if it is not in memory (test_forced_costs_make_every_step_one_kind ran it)."""
  calibration.clear()
  target, draft, prompts = pair
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=24)
  built = compile_cache.stats().built
  out = runner.run(_plan(pair))
  assert compile_cache.stats().built - built == int(out.stats.program_source != "memory")
  costs = out.stats.step_costs
  assert costs.fixed_drafts == 4 and costs.propose_first == 0 == costs.propose_next
  assert costs.plain > 0 and costs.verify_pass > 0 and costs.chunk == 5
  assert out.stats.calibration_seconds > 0
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  again = runner.run(_plan(pair))  # remembered: no second calibration
  assert again.stats.calibration_seconds == 0 and again.stats.step_costs == costs
  # The CPU profile measures its pieces as before (a per-l loop): nothing calibrated.
  cpu = bj.generate(target, draft, prompts, max_new_tokens=8, draft_len="goodput")
  assert cpu.stats.calibration_seconds == 0 and cpu.stats.step_costs.fixed_drafts == 0


def test_a_useless_draft_decodes_plainly_after_calibration(pair):
  """A random draft (almost never right) on the branch-free profile: the calibrated policy finds a
  whole speculative step not worth its accepted tokens and decodes plainly, bar explorations.

  The draft is much wider than the target, so that a speculative step (four draft forwards and a
  verification) measures clearly slower than a plain one: with a draft as small as the tiny target,
  both steps cost the loop's overhead, their measured difference is noise, and a busy machine
  (the suite's other worker) made the policy speculate every step."""
  target, _, prompts = pair
  useless = tiny_model(7, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=64)
  out = bj.generate(target, useless, prompts, max_new_tokens=48, profile=BRANCH_FREE,
                    draft_len=bj.GoodputDraftLen(max_len=4))
  assert out.stats.step_costs.fixed_drafts == 4
  assert out.stats.step_costs.verify_pass > 3 * out.stats.step_costs.plain, out.stats.step_costs
  assert np.mean(out.stats.draft_lens == 0) >= 0.8, out.stats.draft_lens


def test_calibration_changes_no_sampled_output(pair):
  """The decode after calibration draws exactly what the same decode with those costs given does."""
  calibrated = runner.run(_plan(pair, temperature=0.8, seed=5))
  costs = calibrated.stats.step_costs
  target, draft, prompts = pair
  given = bj.generate(target, draft, prompts, max_new_tokens=24, temperature=0.8, seed=5,
                      draft_len=bj.GoodputDraftLen(max_len=4, costs=costs), profile=BRANCH_FREE)
  np.testing.assert_array_equal(calibrated.tokens, given.tokens)
  np.testing.assert_array_equal(calibrated.stats.draft_lens, given.stats.draft_lens)


def test_what_is_calibrated():
  make = dataclasses.make_dataclass("Spec", ["branch_free", "draft_trees", "verify_chunk", "max_draft"])
  spec = lambda free, trees=(), chunk=9: make(free, trees, chunk, 8)
  policy = bj.GoodputDraftLen()
  assert calibration.needs_calibration(spec(True), policy)
  assert not calibration.needs_calibration(spec(False), policy)  # the CPU's per-l loop
  assert not calibration.needs_calibration(spec(True, ("tree",)), policy)  # trees: measured pieces
  assert not calibration.needs_calibration(spec(True, chunk=4), policy)  # passes depend on l
  assert not calibration.needs_calibration(spec(True), bj.GoodputDraftLen(
      costs=bj.StepCosts(1.0, 1.0, 0.0, 0.0, 4)))  # given costs are kept
  assert not calibration.needs_calibration(spec(True), bj.FixedDraftLen(3))
