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
  got = chunked_logits(model, seqs, prefill=[5, 1, 8])
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


# -- the stacked layout of scanned layers ---------------------------------------------------------


def _random_cache(rng, num_layers, batch, slots, lengths, scanned):
  """A per-layer or stacked cache with random valid slots and NaN past each row's length."""
  from bass_jax.cache import KVCache  # pylint: disable=g-import-not-at-top

  shape = (num_layers, batch, 2, slots, 4)
  valid = np.arange(slots)[None, None, None, :, None] < np.asarray(lengths)[None, :, None, None, None]
  k, v = (np.where(valid, rng.normal(size=shape), np.nan).astype(np.float32) for _ in range(2))
  if not scanned:
    k, v = tuple(map(jnp.asarray, k)), tuple(map(jnp.asarray, v))
  return KVCache(k=jnp.asarray(k) if scanned else k, v=jnp.asarray(v) if scanned else v,
                 lengths=jnp.asarray(lengths, jnp.int32))


def test_a_stacked_cache_appends_compacts_and_restarts_rows_as_per_layer_arrays_do():
  """append, keep_path (a tree's path) and write_rows (continuous batching's admission) give the same
  [L, B, K, S, H] values whether each layer has its own array or the layers are stacked."""
  from bass_jax.cache import KVUpdate, write_rows  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng()
  lengths = [3, 0, 7]
  per_layer, stacked = (_random_cache(np.random.default_rng(5), 3, 3, 12, lengths, scanned)
                        for scanned in (False, True))
  assert stacked.scanned and not per_layer.scanned
  assert (stacked.num_layers, stacked.batch_size, stacked.max_len) == (3, 3, 12)
  new_k, new_v = rng.normal(size=(2, 3, 3, 4, 2, 4)).astype(np.float32)  # [L, B, T, K, H]
  per_layer = per_layer.append(KVUpdate(k=tuple(map(jnp.asarray, new_k)),
                                        v=tuple(map(jnp.asarray, new_v))))
  stacked = stacked.append(KVUpdate(k=jnp.asarray(new_k), v=jnp.asarray(new_v)))
  np.testing.assert_array_equal(stacked.lengths, [7, 4, 11])
  for a, b in zip(per_layer.stacked(), stacked.stacked()):
    np.testing.assert_array_equal(a, b)
    assert np.isfinite(np.asarray(b)[:, 0, :, :7]).all() and np.isnan(np.asarray(b)[:, 0, :, 7:]).all()

  base, path = jnp.array([2, 0, 5]), jnp.array([[0, 2, 3, -1], [0, 1, -1, -1], [0, 3, -1, -1]])
  before = np.asarray(stacked.k)
  per_layer, stacked = per_layer.keep_path(base, path), stacked.keep_path(base, path)
  for a, b in zip(per_layer.stacked(), stacked.stacked()):
    np.testing.assert_array_equal(a, b)
  moved = np.asarray(stacked.k)  # node path[i] (slot base + path[i]) moved to slot base + i
  np.testing.assert_array_equal(moved[:, 0, :, 3:5], before[:, 0, :, 4:6])
  np.testing.assert_array_equal(moved[:, 2, :, 6], before[:, 2, :, 8])
  np.testing.assert_array_equal(moved[:, 1], before[:, 1])

  fresh_lengths = [4, 2]
  rows = jnp.array([2, 0])
  fresh_per_layer, fresh_stacked = (_random_cache(np.random.default_rng(6), 3, 2, 8, fresh_lengths,
                                                  scanned) for scanned in (False, True))
  state = {"cache": per_layer, "tokens": jnp.zeros((3, 5), jnp.int32)}
  fresh = {"cache": fresh_per_layer, "tokens": jnp.ones((2, 5), jnp.int32)}
  per_layer = write_rows(state, fresh, rows)["cache"]
  stacked = write_rows({**state, "cache": stacked}, {**fresh, "cache": fresh_stacked}, rows)["cache"]
  np.testing.assert_array_equal(stacked.lengths, [2, 4, 4])
  for a, b in zip(per_layer.stacked(), stacked.stacked()):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(np.asarray(stacked.k)[:, 2, :, :8], np.asarray(fresh_stacked.k)[:, 0])
  with pytest.raises(ValueError, match="same layout"):
    write_rows(state, {**fresh, "cache": fresh_stacked}, rows)
  with pytest.raises(ValueError, match="both be scanned"):
    stacked.append(KVUpdate(k=tuple(map(jnp.asarray, new_k)), v=tuple(map(jnp.asarray, new_v))))


def test_a_cache_of_the_other_layout_is_refused_by_name():
  model = tiny_model(seed=1)
  cache = model.config.init_cache(2, 16, scanned=True)
  tokens = jnp.zeros((2, 1), jnp.int32) + 3
  with pytest.raises(ValueError, match="scanned cache for unrolled layers"):
    _forward(model, tokens, cache)
