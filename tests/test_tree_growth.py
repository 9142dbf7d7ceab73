"""EAGLE-2 tree growth (``tree.grow_tree``) against a brute force, and the tree shape's checks.

The fake draft's distribution after a node depends on the node's whole path, which it reads through
the ancestor mask that growth passes it; the brute force expands the same rule over explicit paths
in Python. So a wrong mask, a wrong parent, a wrong expansion order or reranking gives another tree.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.sampling import tree as tree_lib

V = 11
B = 3


def _log_q(path_tokens: tuple[int, ...], row: int) -> np.ndarray:
  """The fake draft's log-probs after a path (root excluded), a hash of the path and the row."""
  seed = (hash((row,) + tuple(path_tokens)) % (2**31))
  logits = np.random.default_rng(seed).normal(size=V) * 2.0
  return logits - np.log(np.exp(logits).sum())


def _fake_expand():
  """``expand`` over the fake draft: the carry is every expanded node's path so far, read by mask."""

  def expand(carry, tokens, parent, mask):
    del parent
    expanded = jnp.concatenate([carry, tokens], axis=1)  # [B, M] tokens of the expanded nodes
    out = []
    for b in range(B):
      row = []
      for t in range(tokens.shape[1]):
        path = tuple(int(x) for x, m in zip(np.asarray(expanded[b]), np.asarray(mask[b, t])) if m)
        row.append(_log_q(path, b))
      out.append(row)
    return expanded, jnp.asarray(np.asarray(out, np.float32))

  return expand


def _brute_force(shape: tree_lib.TreeShape, row: int, keep: int | None = None):
  """EAGLE-2 growth over explicit paths: the set of the ``keep`` (default ``nodes - 1``) kept paths."""
  k = shape.top_k
  def children(path, score):
    lq = _log_q(path, row)
    top = np.argsort(-lq, kind="stable")[:k]
    return [(path + (int(c),), score + float(lq[c])) for c in top]
  level = children((), 0.0)
  candidates = list(level)
  for _ in range(1, shape.depth):
    kids = list(itertools.chain.from_iterable(children(p, s) for p, s in level))
    candidates += kids
    level = sorted(kids, key=lambda ps: -ps[1])[:k]
  kept = sorted(candidates, key=lambda ps: -ps[1])[:shape.nodes - 1 if keep is None else keep]
  return {p for p, _ in kept}


def _paths_of(tree, b):
  tokens, parents = np.asarray(tree.tokens[b]), np.asarray(tree.parents[b])
  out = set()
  for i in range(1, len(tokens)):
    path, node = [], i
    while node > 0:
      path.append(int(tokens[node]))
      node = parents[node]
    out.add(tuple(path[::-1]))
  return out


@pytest.mark.parametrize("shape", [tree_lib.TreeShape(top_k=2, depth=3, nodes=6),
                                   tree_lib.TreeShape(top_k=3, depth=4, nodes=12)])
def test_growth_keeps_the_best_paths_of_eagle2(shape):
  root = jnp.arange(B, dtype=jnp.int32)
  first = jnp.asarray(np.stack([_log_q((), b) for b in range(B)]).astype(np.float32))
  carry = jnp.zeros((B, 0), jnp.int32)
  carry, tree = tree_lib.grow_tree(root, first, _fake_expand(), carry, shape)
  assert carry.shape == (B, shape.draft_slots)
  parents = np.asarray(tree.parents)
  assert (parents[:, 0] == -1).all() and (parents[:, 1:] < np.arange(1, shape.nodes)).all()
  assert (parents[:, 1:] >= 0).all()
  np.testing.assert_array_equal(tree.tokens[:, 0], root)
  for b in range(B):
    assert _paths_of(tree, b) == _brute_force(shape, b)


def test_a_prior_tree_is_kept_whole_and_the_draft_fills_the_rest():
  """A hybrid's prior (n-gram branches): every real prior node is kept, in its own tree shape, and the
  draft's best paths fill the remaining slots."""
  shape = tree_lib.TreeShape(top_k=2, depth=3, nodes=7)
  root = jnp.arange(B, dtype=jnp.int32)
  first = jnp.asarray(np.stack([_log_q((), b) for b in range(B)]).astype(np.float32))
  # Tokens the fake draft never drafts (>= V), so that every path is either the prior's or the draft's.
  # Row 0: two branches (27 28 29 | 40); row 1: nothing; row 2: a chain of 4 and a branch at depth 2.
  prior = tree_lib.DraftTree(
      tokens=jnp.asarray([[0, 27, 28, 29, 40, 99, 99], [1, 99, 99, 99, 99, 99, 99],
                          [2, 21, 22, 23, 24, 33, 99]], jnp.int32),
      parents=jnp.asarray([[-1, 0, 1, 2, 0, 0, 0], [-1, 0, 0, 0, 0, 0, 0],
                           [-1, 0, 1, 2, 3, 1, 0]], jnp.int32),
      num_nodes=jnp.asarray([5, 1, 6], jnp.int32))
  expected = [{(27,), (27, 28), (27, 28, 29), (40,)}, set(),
              {(21,), (21, 22), (21, 22, 23), (21, 22, 23, 24), (21, 33)}]
  _, tree = tree_lib.grow_tree(root, first, _fake_expand(), jnp.zeros((B, 0), jnp.int32), shape,
                               prior=prior)
  for b in range(B):
    kept = expected[b]
    assert _paths_of(tree, b) == kept | _brute_force(shape, b, keep=shape.nodes - 1 - len(kept))


def test_tree_shapes_are_checked_and_parsed():
  assert tree_lib.TreeShape.parse("top_k=4,depth=5,nodes=16") == tree_lib.TreeShape(4, 5, 16)
  assert tree_lib.TreeShape.parse("depth=2, nodes=3") == tree_lib.TreeShape(4, 2, 3)
  assert str(tree_lib.TreeShape(2, 3, 6)) == "top_k=2,depth=3,nodes=6"
  with pytest.raises(ValueError, match="nodes=3 must be at least depth \\+ 1 = 6"):
    tree_lib.TreeShape(top_k=4, depth=5, nodes=3)
  with pytest.raises(ValueError, match="top_k"):
    tree_lib.TreeShape(top_k=0, depth=5, nodes=16)
  with pytest.raises(ValueError, match="only 5 candidates"):
    tree_lib.TreeShape(top_k=1, depth=5, nodes=7)
  with pytest.raises(ValueError, match="expected the fields"):
    tree_lib.TreeShape.parse("width=3")
  with pytest.raises(ValueError, match="must be a positive integer"):
    tree_lib.TreeShape.parse("top_k=x")


@pytest.mark.parametrize("text,match", [
    ("", "is empty"), ("  ", "is empty"), ("top_k=4,,depth=5", "an empty part"),
    ("top_k=4,top_k=3", "top_k is given twice"), ("depth=-1", "positive integer"),
    ("top_k=+3", "positive integer"), ("top_k=3.0", "positive integer"),
    ("top_k=1000,depth=1000,nodes=100000", "top_k must be <= 16"),
    ("top_k=2,depth=33,nodes=40", "depth must be <= 32"), ("nodes=257", "nodes must be <= 256"),
])
def test_tree_shape_text_is_parsed_strictly_and_bounded(text, match):
  """No empty value (it meant the default shape), no repeated or unknown field, decimal digits only, and
  shapes within the documented limits (an unbounded one compiled for minutes)."""
  with pytest.raises(ValueError, match=match):
    tree_lib.tree_shapes(text)


def test_tree_shapes_compare_in_canonical_form_and_fit_their_models():
  a, b = tree_lib.tree_shapes(["nodes=16, top_k=4,depth=5", "depth=2,nodes=3"])
  assert a == tree_lib.TreeShape(4, 5, 16) and str(a) == "top_k=4,depth=5,nodes=16"
  with pytest.raises(ValueError, match="repeats a shape"):
    tree_lib.tree_shapes(["top_k=4,depth=5,nodes=16", "depth=5,nodes=16,top_k=4"])
  a.check_fits(vocab_size=5, context=6)
  with pytest.raises(ValueError, match="top_k=4 must be below the vocabulary of 4 tokens"):
    a.check_fits(vocab_size=4, context=64)
  with pytest.raises(ValueError, match="depth=5 must be below the models' context of 5"):
    a.check_fits(vocab_size=64, context=5)
