"""Ragged KV cache: prefill then chunks of 1, 2, 3 and 8 tokens into rows of different lengths equals one
full causal forward. Unwritten cache slots hold NaN, so any read past a row's length would show."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import chunked_logits, tiny_model


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_chunked_decoding_equals_full_forward(num_kv_heads):
  model = tiny_model(seed=3, scale=2.0, num_key_value_heads=num_kv_heads)
  rng = np.random.default_rng(num_kv_heads)
  seqs = [rng.integers(0, model.config.vocab_size, n) for n in (23, 14, 31)]
  got = chunked_logits(model, seqs, prefill=[5, 1, 9])
  for seq, row in zip(seqs, got):
    want = np.asarray(model.logits(seq[None]))[0]  # one full causal forward per row
    assert np.isfinite(row).all()
    np.testing.assert_allclose(row, want, atol=1e-4, rtol=0)


def _forward(model, tokens, cache):
  module = model.config.make_module()

  return jax.jit(lambda p, t, c: module.apply({"params": p}, t, c))(model.params, tokens, cache)


def test_unwritten_slots_stay_nan_and_rejected_slots_are_overwritten():
  model = tiny_model(seed=1)
  cache = model.config.init_cache(2, 16, fill_value=np.nan)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 4)), jnp.int32)
  _, cache = _forward(model, tokens, cache)
  k = np.asarray(cache.stacked()[0])  # [L, B, K, S, H]
  assert np.isfinite(k[:, :, :, :4]).all() and np.isnan(k[:, :, :, 4:]).all()
  # Keep 1 of the 4 new tokens in row 0 and 3 in row 1; the next write lands right after them.
  cache = cache.with_lengths(jnp.array([1, 3]))
  _, cache = _forward(model, tokens[:, :2], cache)
  k2 = np.asarray(cache.stacked()[0])
  assert not np.array_equal(k2[:, 0, :, 1:3], k[:, 0, :, 1:3])  # row 0's rejected slots rewritten
  assert np.array_equal(k2[:, 1, :, :3], k[:, 1, :, :3])  # row 1's kept slots untouched
  assert np.isnan(k2[:, 0, :, 4:]).all() and np.isfinite(k2[:, 1, :, :5]).all()
