"""The models' attention against a per-row, per-head numpy loop written from the definition: over a ragged
cache (the jnp reference, BASS-PAD and BASS-SPLIT in plain JAX) and without a cache (causal)."""

import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.models.attention import (blocked_attention, causal_attention, get_attention,
                                       reference_attention)


def _loop_attention(q, k, v, lengths, window=None):
  """q [B, T, N, H]; k, v [B, K, S, H] holding the T new tokens at lengths - T … lengths - 1."""
  batch, num_q, num_heads, head_dim = q.shape
  group = num_heads // k.shape[1]
  out = np.zeros(q.shape, np.float64)
  for b in range(batch):
    for t in range(num_q):
      last = lengths[b] - num_q + t  # the query's own position
      first = max(0, last - window + 1) if window else 0
      for h in range(num_heads):
        keys = k[b, h // group, first:last + 1].astype(np.float64)
        scores = keys @ q[b, t, h] / np.sqrt(head_dim)
        w = np.exp(scores - scores.max())
        out[b, t, h] = (w / w.sum()) @ v[b, h // group, first:last + 1]
  return out


def _inputs(seed, batch, num_q, num_heads, num_kv_heads, head_dim, max_len):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(num_q, max_len + 1, batch)
  lengths[0] = num_q  # a row that holds only the new tokens
  if batch > 1:
    lengths[-1] = max_len  # a full row
  q = rng.normal(size=(batch, num_q, num_heads, head_dim)).astype(np.float32)
  k = rng.normal(size=(batch, num_kv_heads, max_len, head_dim)).astype(np.float32)
  v = rng.normal(size=(batch, num_kv_heads, max_len, head_dim)).astype(np.float32)
  for b in range(batch):  # slots past each row's length are NaN: any stray read poisons the output
    k[b, :, lengths[b]:] = np.nan
    v[b, :, lengths[b]:] = np.nan
  return q, k, v, lengths


@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,head_dim", [
    (1, 1, 4, 4, 8), (3, 2, 9, 3, 16), (4, 8, 8, 1, 8), (2, 33, 6, 2, 32)])
def test_reference_matches_definition(batch, num_q, num_heads, num_kv_heads, head_dim):
  q, k, v, lengths = _inputs(batch * 100 + num_q, batch, num_q, num_heads, num_kv_heads, head_dim, 48)
  got = np.asarray(reference_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                       jnp.asarray(lengths, jnp.int32)))
  np.testing.assert_allclose(got, _loop_attention(q, k, v, lengths), atol=2e-5, rtol=0)


@pytest.mark.parametrize("window", [None, 3])
def test_causal_attention_without_a_cache_matches_definition(window):
  rng = np.random.default_rng(5)
  q = rng.normal(size=(2, 7, 6, 8)).astype(np.float32)
  k = rng.normal(size=(2, 7, 2, 8)).astype(np.float32)
  v = rng.normal(size=(2, 7, 2, 8)).astype(np.float32)
  got = np.asarray(causal_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                    sliding_window=window))
  # The same as a cache that holds exactly the 7 tokens.
  want = _loop_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), np.array([7, 7]), window)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_unknown_implementation_is_named():
  with pytest.raises(ValueError, match="no_such_kernel"):
    get_attention("no_such_kernel")


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,window", [
    (1, 1, 4, 4, None), (3, 2, 9, 3, None), (4, 8, 8, 1, 5), (2, 33, 6, 2, None)])
def test_blocked_pad_and_split_match_the_definition(batch, num_q, num_heads, num_kv_heads, window,
                                                    variant):
  q, k, v, lengths = _inputs(batch * 10 + num_q, batch, num_q, num_heads, num_kv_heads, 16, 128)
  args = [jnp.asarray(x) for x in (q, k, v)] + [jnp.asarray(lengths, jnp.int32)]
  got = blocked_attention(*args, variant=variant, block_k=32, sliding_window=window)
  want = reference_attention(*args, sliding_window=window)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(got), _loop_attention(q, k, v, lengths, window), atol=2e-5)
