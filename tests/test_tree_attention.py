"""Tree attention over a ragged cache (``attention.reference_tree_attention``): every node of a row's tree
sees the row's prefix and its own ancestors, at positions given by depth.

Checked against a brute force written independently in numpy: for each row, node and head, the softmax
attention over exactly the keys of the node's path (the prefix slots, then the slots of its ancestors
and itself, with a sliding window compared on depth positions). Slots past a row's length hold NaN;
the nodes' slots hold large finite values, so a read of a node off the path changes the result. A
chain (the causal mask) equals ``reference_attention``, and a mask with one extra, non-ancestor node is
caught by the same comparison. Every implementation's tree attention (the kernels' prefix merged with
the nodes, ``attention.merged_tree_attention``; the Pallas kernels interpreted) equals that reference,
also under Gemma 2's logit soft cap (both merged segments capped).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.models import attention
from bass_jax.models import attention_registry
from bass_jax.sampling import tree as tree_lib

B, T, N, K, H, S = 3, 6, 4, 2, 16, 64  # H and S as small as the Pallas kernels tile


def _random_tree_mask(rng, num_nodes):
  """``bool[B, T, T]`` ancestor masks of random trees with ``num_nodes[b]`` real nodes."""
  parents = np.full((B, T), -7, np.int32)
  parents[:, 0] = -1
  for b in range(B):
    for i in range(1, num_nodes[b]):
      parents[b, i] = rng.integers(0, i)
  tree = tree_lib.DraftTree(tokens=jnp.zeros((B, T), jnp.int32), parents=jnp.asarray(parents),
                            num_nodes=jnp.asarray(num_nodes, jnp.int32))
  return np.asarray(tree_lib.ancestor_mask(tree))


def _inputs(rng, lengths, mask):
  q = rng.normal(size=(B, T, N, H)).astype(np.float32)
  k = rng.normal(size=(B, K, S, H)).astype(np.float32)
  v = rng.normal(size=(B, K, S, H)).astype(np.float32)
  for b in range(B):
    k[b, :, lengths[b]:] = np.nan  # past the row's length: never read
    v[b, :, lengths[b]:] = np.nan
  return q, k, v


def brute_force(q, k, v, lengths, mask, window=None, cap=None):
  """Per row, node and head: softmax over the keys of the node's path, in float64; ``cap``: the
  scores s become cap * tanh(s / cap) first (Gemma 2)."""
  out = np.zeros(q.shape, np.float64)
  group = N // K
  for b in range(B):
    base = lengths[b] - T
    depth = mask[b].sum(-1) - 1
    for t in range(T):
      pos = base + depth[t]
      keys = [(s, s) for s in range(base)]  # (slot, position)
      keys += [(base + j, base + depth[j]) for j in range(T) if mask[b, t, j]]
      if window is not None:
        keys = [(s, p) for s, p in keys if p > pos - window]
      if not keys:
        continue
      slots = [s for s, _ in keys]
      for n in range(N):
        logits = k[b, n // group, slots].astype(np.float64) @ q[b, t, n] / np.sqrt(H)
        if cap is not None:
          logits = cap * np.tanh(logits / cap)
        w = np.exp(logits - logits.max())
        out[b, t, n] = (w / w.sum()) @ v[b, n // group, slots]
  return out


@pytest.mark.parametrize("window", [None, 5])
def test_tree_attention_sees_the_prefix_and_the_ancestors_only(window):
  rng = np.random.default_rng(0 if window is None else 1)
  lengths = np.array([T + 9, T + 1, T + 20])
  mask = _random_tree_mask(rng, num_nodes=[T, 4, T])
  assert (mask.sum(-1) < np.arange(1, T + 1)).any()  # some node misses an earlier node: a real tree
  q, k, v = _inputs(rng, lengths, mask)
  for b in range(B):  # the nodes' values are large: a node read off the path moves the output far
    v[b, :, lengths[b] - T:lengths[b]] *= 30.0
  got = attention.reference_tree_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                           jnp.asarray(lengths), jnp.asarray(mask),
                                           sliding_window=window)
  want = brute_force(q, k, v, lengths, mask, window)
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5)
  broken = mask.copy()
  b, t = 0, T - 1
  j = int(np.flatnonzero(~mask[b, t])[0])  # a node off t's path
  broken[b, t, j] = True
  leaked = attention.reference_tree_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                              jnp.asarray(lengths), jnp.asarray(broken),
                                              sliding_window=window)
  assert np.abs(np.asarray(leaked)[b, t] - want[b, t]).max() > 0.1


def test_a_chain_is_causal_reference_attention():
  rng = np.random.default_rng(2)
  lengths = np.array([T + 3, T, T + 17])
  causal = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T))
  q, k, v = _inputs(rng, lengths, causal)
  args = tuple(map(jnp.asarray, (q, k, v, lengths)))
  for window in (None, 4):
    np.testing.assert_allclose(
        np.asarray(attention.reference_tree_attention(*args, jnp.asarray(causal),
                                                      sliding_window=window)),
        np.asarray(attention.reference_attention(*args, sliding_window=window)), atol=2e-6)


@pytest.mark.parametrize("impl", ["pallas_pad", "pallas_split", "blocked_pad", "blocked_split"])
def test_every_implementation_attends_a_tree_like_the_reference(impl):
  rng = np.random.default_rng(3)
  lengths = np.array([T + 40, T, T + 13])  # a row with no prefix at all: only its nodes
  mask = _random_tree_mask(rng, num_nodes=[T, 3, T])
  q, k, v = _inputs(rng, lengths, mask)
  for b in range(B):
    v[b, :, lengths[b] - T:lengths[b]] *= 30.0
  args = tuple(map(jnp.asarray, (q, k, v, lengths)))
  tree_attention = attention_registry.get_tree_attention(impl)
  want = brute_force(q, k, v, lengths, mask)
  got = np.asarray(tree_attention(*args, jnp.asarray(mask)))
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)
  broken = mask.copy()
  j = int(np.flatnonzero(~mask[2, T - 1])[0])
  broken[2, T - 1, j] = True
  leaked = np.asarray(tree_attention(*args, jnp.asarray(broken)))
  assert np.abs(leaked[2, T - 1] - want[2, T - 1]).max() > 0.1
  with pytest.raises(ValueError, match="sliding window"):
    tree_attention(*args, jnp.asarray(mask), sliding_window=4)


@pytest.mark.parametrize("impl,window", [("reference", None), ("reference", 5), ("pallas_pad", None),
                                         ("pallas_split", None), ("blocked_pad", None),
                                         ("blocked_split", None)])
def test_soft_capped_tree_attention(impl, window):
  """Gemma 2's logit soft cap in every tree attention: the merged ones cap the prefix (in the ragged
  kernel) and the nodes alike, so their merged softmax is the capped one. Scores of std ~10, cap 5."""
  cap = 5.0
  rng = np.random.default_rng(4)
  lengths = np.array([T + 40, T, T + 13])  # a row with no prefix at all: only its nodes
  mask = _random_tree_mask(rng, num_nodes=[T, 3, T])
  q, k, v = _inputs(rng, lengths, mask)
  q *= 10.0
  args = tuple(map(jnp.asarray, (q, k, v, lengths, mask)))
  got = np.asarray(attention_registry.get_tree_attention(impl)(*args, sliding_window=window,
                                                      logit_soft_cap=cap))
  want = brute_force(q, k, v, lengths, mask, window, cap=cap)
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)
  assert np.abs(want - brute_force(q, k, v, lengths, mask, window)).max() > 0.1
