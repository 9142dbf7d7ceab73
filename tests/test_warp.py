"""Temperature and top-p warping against transformers' own logits processors (independent reference),
on both nucleus paths: the CPU's top-k and bisection, and the GPU profile's one sort per row
(``branch_free``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bass_jax.sampling.warp import position_uniforms, sequence_keys, warped_log_probs


BOTH_PATHS = pytest.mark.parametrize("branch_free", [False, True], ids=["top_k+bisect", "sort"])


@BOTH_PATHS
@pytest.mark.parametrize("temperature,top_p", [(1.0, 0.9), (0.7, 0.5), (1.3, 0.99), (0.2, 0.95)])
def test_matches_transformers_warpers(temperature, top_p, branch_free):
  rng = np.random.default_rng(int(100 * top_p))
  logits = (rng.normal(size=(6, 50)) * 3).astype(np.float32)
  processors = transformers.LogitsProcessorList([
      transformers.TemperatureLogitsWarper(temperature), transformers.TopPLogitsWarper(top_p)])
  want = torch.log_softmax(processors(None, torch.tensor(logits)), dim=-1).numpy()
  got = np.asarray(warped_log_probs(jnp.asarray(logits), temperature, top_p, branch_free=branch_free))
  assert ((got == -np.inf) == (want == -np.inf)).all()  # the same nucleus
  assert (got == -np.inf).any()  # and it truncates something
  kept = want > -np.inf
  np.testing.assert_allclose(got[kept], want[kept], atol=1e-5)


@BOTH_PATHS
def test_ties_at_the_threshold_are_all_kept(branch_free):
  logits = jnp.log(jnp.array([[0.4, 0.2, 0.2, 0.2]]))
  probs = np.exp(np.asarray(warped_log_probs(logits, 1.0, 0.5, branch_free=branch_free)))[0]
  np.testing.assert_allclose(probs, [0.4, 0.2, 0.2, 0.2], atol=1e-6)  # order-independent
  probs = np.exp(np.asarray(warped_log_probs(logits, 1.0, 0.35, branch_free=branch_free)))[0]
  np.testing.assert_allclose(probs, [1.0, 0, 0, 0], atol=1e-6)


@BOTH_PATHS
@pytest.mark.parametrize("spread", [0.3, 1.0, 8.0])
def test_wide_and_narrow_nuclei_match_transformers(spread, branch_free):
  """V = 3000: flat rows have nuclei of hundreds of tokens (the bisection path), peaked rows a few
  (the top-k path); rows of both kinds share a batch."""
  rng = np.random.default_rng(int(spread * 10))
  logits = rng.normal(size=(8, 3000)).astype(np.float32)
  logits[::2] *= spread
  logits[1::2] *= 10.0
  want = torch.log_softmax(
      transformers.TopPLogitsWarper(0.9)(None, torch.tensor(logits)), dim=-1).numpy()
  got = np.asarray(warped_log_probs(jnp.asarray(logits), 1.0, 0.9, branch_free=branch_free))
  sizes = (want > -np.inf).sum(-1)
  assert ((got > -np.inf).sum(-1) == sizes).all()
  assert ((got == -np.inf) == (want == -np.inf)).all()
  if spread < 8:
    assert sizes.max() > 64 and sizes.min() < 64  # both paths ran
  kept = want > -np.inf
  np.testing.assert_allclose(got[kept], want[kept], atol=1e-5)


def test_the_sort_finds_the_bisections_threshold_on_ties_and_random_rows():
  """The two thresholds agree exactly where no mass sits within rounding of top_p: rows with many
  tied probabilities (quantized logits) and continuous ones, at several top_p."""
  from bass_jax.sampling import warp

  rng = np.random.default_rng(11)
  logits = rng.normal(size=(16, 500)).astype(np.float32) * rng.uniform(0.5, 4, size=(16, 1))
  logits[::2] = np.round(logits[::2])  # ties
  probs = jnp.exp(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
  for top_p in (0.3, 0.8, 0.95):
    np.testing.assert_array_equal(np.asarray(warp._sorted_threshold(probs, top_p)),  # pylint: disable=protected-access
                                  np.asarray(warp._bisect_threshold(probs, top_p)))  # pylint: disable=protected-access


def test_position_uniforms_are_keyed_by_sequence_and_position_only():
  """``position_uniforms`` at (row, position) is ``uniform(fold_in(key_b, t))`` whatever the array it
  sits in: the same for a row at the same position in [B] and [B, C] calls, different between rows
  and positions."""
  keys = sequence_keys(jax.random.key(7), [3, 9])
  positions = np.array([[5, 6, 7], [5, 6, 7]], np.int32)
  grid = np.asarray(position_uniforms(keys, jnp.asarray(positions)))
  column = np.asarray(position_uniforms(keys, jnp.asarray(positions[:, 1])))
  np.testing.assert_array_equal(grid[:, 1], column)
  by_hand = jax.random.uniform(jax.random.fold_in(jax.random.wrap_key_data(keys[1]), 7), ())
  assert grid[1, 2] == np.float32(by_hand)
  assert len(np.unique(grid)) == grid.size and ((grid >= 0) & (grid < 1)).all()
