"""The models' attention over (cache, new tokens) against a per-row, per-head numpy loop written from the
definition; BASS-PAD and BASS-SPLIT in plain JAX against it; the exact merge of partial softmaxes."""

import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.models.attention import (get_attention, merge_attention, new_token_attention,
                                       reference_attention)


def _loop_attention(q, k_new, v_new, k_cache, v_cache, cache_lengths, window=None):
  """q [B, T, N, H]; new k/v [B, T, K, H]; cache k/v [B, K, S, H] (or None); from the definition."""
  batch, num_q, num_heads, head_dim = q.shape
  group = num_heads // k_new.shape[2]
  out = np.zeros(q.shape, np.float64)
  for b in range(batch):
    n_cache = 0 if k_cache is None else cache_lengths[b]
    for t in range(num_q):
      pos = n_cache + t  # the query's own position
      for h in range(num_heads):
        kv = h // group
        keys = [k_cache[b, kv, s] for s in range(n_cache)] + [k_new[b, u, kv] for u in range(t + 1)]
        values = [v_cache[b, kv, s] for s in range(n_cache)] + [v_new[b, u, kv] for u in range(t + 1)]
        positions = np.arange(pos + 1)
        keep = positions > pos - window if window else np.ones(pos + 1, bool)
        keys, values = np.asarray(keys, np.float64)[keep], np.asarray(values, np.float64)[keep]
        scores = keys @ q[b, t, h] / np.sqrt(head_dim)
        w = np.exp(scores - scores.max())
        out[b, t, h] = (w / w.sum()) @ values
  return out


def _inputs(seed, batch, num_q, num_heads, num_kv_heads, head_dim, max_len, empty_row=True):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, max_len - num_q + 1, batch)
  if empty_row:
    lengths[0] = 0  # a row whose cache is still empty (prefill)
  if batch > 1:
    lengths[-1] = max_len - num_q  # a full row
  q = rng.normal(size=(batch, num_q, num_heads, head_dim)).astype(np.float32)
  k_new = rng.normal(size=(batch, num_q, num_kv_heads, head_dim)).astype(np.float32)
  v_new = rng.normal(size=(batch, num_q, num_kv_heads, head_dim)).astype(np.float32)
  k = rng.normal(size=(batch, num_kv_heads, max_len, head_dim)).astype(np.float32)
  v = rng.normal(size=(batch, num_kv_heads, max_len, head_dim)).astype(np.float32)
  for b in range(batch):  # slots past each row's length are NaN: any stray read poisons the output
    k[b, :, lengths[b]:] = np.nan
    v[b, :, lengths[b]:] = np.nan
  return q, k_new, v_new, k, v, lengths


@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,head_dim", [
    (1, 1, 4, 4, 8), (3, 2, 9, 3, 16), (4, 8, 8, 1, 8), (2, 33, 6, 2, 32)])
def test_reference_matches_definition(batch, num_q, num_heads, num_kv_heads, head_dim):
  q, k_new, v_new, k, v, lengths = _inputs(batch * 100 + num_q, batch, num_q, num_heads,
                                           num_kv_heads, head_dim, max_len=48)
  args = [jnp.asarray(x) for x in (q, k_new, v_new, k, v)] + [jnp.asarray(lengths, jnp.int32)]
  got = np.asarray(reference_attention(*args))
  np.testing.assert_allclose(got, _loop_attention(q, k_new, v_new, k, v, lengths), atol=2e-5, rtol=0)
  # Without a cache only the new tokens are attended (a full causal forward).
  got = np.asarray(reference_attention(*args[:3]))
  np.testing.assert_allclose(got, _loop_attention(q, k_new, v_new, None, None, None), atol=2e-5)


def test_unknown_implementation_is_named():
  with pytest.raises(ValueError, match="no_such_kernel"):
    get_attention("no_such_kernel")


@pytest.mark.parametrize("impl", ["blocked_pad", "blocked_split"])
@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,window", [
    (1, 1, 4, 4, None), (3, 2, 9, 3, None), (4, 8, 8, 1, 5), (2, 33, 6, 2, None), (3, 9, 6, 2, 17)])
def test_blocked_pad_and_split_match_the_definition(batch, num_q, num_heads, num_kv_heads, window,
                                                    impl):
  q, k_new, v_new, k, v, lengths = _inputs(batch * 10 + num_q, batch, num_q, num_heads,
                                           num_kv_heads, 16, max_len=128)
  args = [jnp.asarray(x) for x in (q, k_new, v_new, k, v)] + [jnp.asarray(lengths, jnp.int32)]
  attend = get_attention(impl)
  got = np.asarray(attend(*args, sliding_window=window))
  want = np.asarray(reference_attention(*args, sliding_window=window))
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
  np.testing.assert_allclose(got, _loop_attention(q, k_new, v_new, k, v, lengths, window), atol=2e-5)
  np.testing.assert_allclose(np.asarray(attend(*args[:3], sliding_window=window)),
                             np.asarray(reference_attention(*args[:3], sliding_window=window)),
                             atol=2e-5)


def test_merging_partial_softmaxes_is_exact():
  """Attention over [new tokens] merged with attention over disjoint halves equals the whole."""
  rng = np.random.default_rng(7)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 4, 8)).astype(np.float32)) for _ in range(3))
  whole, m, l = new_token_attention(q, k, v, sm_scale=0.35)
  want = np.asarray(reference_attention(q, k, v, sm_scale=0.35))
  np.testing.assert_allclose(np.asarray(whole), want, atol=1e-5)
  # A part with no visible key (l = 0) weighs nothing.
  empty = (jnp.full_like(whole, 123.0), jnp.full_like(m, -1e30), jnp.zeros_like(l))
  np.testing.assert_allclose(np.asarray(merge_attention([empty, (whole, m, l)])), want, atol=1e-5)
