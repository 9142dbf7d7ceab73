"""The jnp reference attention against a per-row, per-head numpy loop written from the definition."""

import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.models.attention import blocked_attention, get_attention, reference_attention


def _loop_attention(q, k, v, lengths):
  batch, num_q, num_heads, head_dim = q.shape
  group = num_heads // k.shape[2]
  out = np.zeros(q.shape, np.float64)
  for b in range(batch):
    for t in range(num_q):
      last = lengths[b] - num_q + t  # the query's own position
      for h in range(num_heads):
        keys = k[b, :last + 1, h // group].astype(np.float64)
        scores = keys @ q[b, t, h] / np.sqrt(head_dim)
        w = np.exp(scores - scores.max())
        out[b, t, h] = (w / w.sum()) @ v[b, :last + 1, h // group]
  return out


@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,head_dim", [
    (1, 1, 4, 4, 8), (3, 2, 9, 3, 16), (4, 8, 8, 1, 8), (2, 33, 6, 2, 32)])
def test_reference_matches_definition(batch, num_q, num_heads, num_kv_heads, head_dim):
  rng = np.random.default_rng(batch * 100 + num_q)
  max_len = 48
  lengths = rng.integers(num_q, max_len + 1, batch)
  lengths[0] = num_q  # a row that holds only the new tokens
  if batch > 1:
    lengths[-1] = max_len  # a full row
  q = rng.normal(size=(batch, num_q, num_heads, head_dim)).astype(np.float32)
  k = rng.normal(size=(batch, max_len, num_kv_heads, head_dim)).astype(np.float32)
  v = rng.normal(size=(batch, max_len, num_kv_heads, head_dim)).astype(np.float32)
  for b in range(batch):  # padding past each row's length is NaN: any stray read poisons the output
    k[b, lengths[b]:] = np.nan
    v[b, lengths[b]:] = np.nan
  got = np.asarray(reference_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                       jnp.asarray(lengths, jnp.int32)))
  np.testing.assert_allclose(got, _loop_attention(q, k, v, lengths), atol=2e-5, rtol=0)


def test_unknown_implementation_is_named():
  with pytest.raises(ValueError, match="no_such_kernel"):
    get_attention("no_such_kernel")


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,window", [
    (1, 1, 4, 4, None), (3, 2, 9, 3, None), (4, 8, 8, 1, 5), (2, 33, 6, 2, None)])
def test_blocked_pad_and_split_match_the_definition(batch, num_q, num_heads, num_kv_heads, window,
                                                    variant):
  rng = np.random.default_rng(batch * 10 + num_q)
  max_len, head_dim = 128, 16
  lengths = rng.integers(num_q, max_len + 1, batch)
  lengths[0] = num_q
  q = rng.normal(size=(batch, num_q, num_heads, head_dim)).astype(np.float32)
  k = rng.normal(size=(batch, max_len, num_kv_heads, head_dim)).astype(np.float32)
  v = rng.normal(size=(batch, max_len, num_kv_heads, head_dim)).astype(np.float32)
  for b in range(batch):
    k[b, lengths[b]:] = np.nan
    v[b, lengths[b]:] = np.nan
  got = blocked_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(lengths),
                          variant=variant, block_k=32, sliding_window=window)
  want = reference_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(lengths),
                             sliding_window=window)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=0)
  if window is None:
    np.testing.assert_allclose(np.asarray(got), _loop_attention(q, k, v, lengths), atol=2e-5)
