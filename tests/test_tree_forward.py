"""A token tree through every model family (``forward(..., tree_mask=...)``): each node's logits equal
those of a plain causal forward over the node's own path.

The reference is independent of the cache and of tree attention: for every (row, node), the row's
prefix followed by the tokens of the node's path, right-padded to one width, through a full causal
forward without a cache (the forward ``tests/test_families.py`` compares with transformers). The tree
forward runs over a prefilled ragged cache whose slots past each row's prefix hold NaN, with random
trees (siblings, different depths, a row with padding nodes), so a node that read a sibling, took its
slot for its position, or read past its row would differ. Covers RoPE (Llama, CodeGen), learned
positions (OPT, GPT-2), a sliding window, the EAGLE draft's forward, and the Pallas kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.models import common, eagle, eagle_init
from bass_jax.sampling import tree as tree_lib
from conftest import tiny_config

B, T, S = 3, 6, 64
PREFIX = np.array([5, 1, 9])  # tokens in each row's cache before the tree
NUM_NODES = np.array([T, T, 4])

CONFIGS = {
    "llama-gqa": lambda: tiny_config(),
    "mistral-window-3": lambda: tiny_config(sliding_window=3),
    "llama-pallas": lambda: tiny_config(head_dim=16),
    "opt": lambda: bj.OPTConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, ffn_dim=48,
                                num_attention_heads=4, max_position_embeddings=128),
    "gpt2": lambda: bj.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=128),
    "codegen": lambda: bj.CodeGenConfig(vocab_size=61, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                        n_positions=128),
}


def _random_tree(rng):
  parents = np.full((B, T), -5, np.int32)
  parents[:, 0] = -1
  for b in range(B):
    for i in range(1, NUM_NODES[b]):
      parents[b, i] = rng.integers(0, i)
  tokens = rng.integers(0, 61, size=(B, T)).astype(np.int32)
  return tree_lib.DraftTree(tokens=jnp.asarray(tokens), parents=jnp.asarray(parents),
                            num_nodes=jnp.asarray(NUM_NODES, jnp.int32))


def _paths(tree):
  """Per real (row, node): the node indices from the root to the node."""
  parents = np.asarray(tree.parents)
  out = {}
  for b in range(B):
    for t in range(NUM_NODES[b]):
      path, node = [], t
      while node >= 0:
        path.append(node)
        node = parents[b, node]
      out[b, t] = path[::-1]
  return out


def _poisoned(cache):
  """The cache with NaN in every slot at or past each row's length."""
  past = jnp.arange(cache.k[0].shape[2])[None, None, :, None] >= cache.lengths[:, None, None, None]
  poison = lambda x: jnp.where(past, jnp.nan, x)
  return cache.replace(k=tuple(map(poison, cache.k)), v=tuple(map(poison, cache.v)))


def _path_inputs(prefix_rows, tree, extra=None):
  """Reference inputs: one row per real (row, node), the prefix then the path, right-padded."""
  paths = _paths(tree)
  tokens = np.asarray(tree.tokens)
  width = max(PREFIX) + T
  rows, ends, extras = [], [], []
  for (b, t), path in paths.items():
    seq = list(prefix_rows[b][:PREFIX[b]]) + [int(tokens[b, i]) for i in path]
    ends.append(len(seq) - 1)
    rows.append(seq + [0] * (width - len(seq)))
    if extra is not None:
      e = extra[b]
      feats = np.concatenate([e["prefix"][:PREFIX[b]], e["nodes"][path]], axis=0)
      extras.append(np.pad(feats, ((0, width - len(feats)), (0, 0))))
  return list(paths), np.asarray(rows, np.int32), np.asarray(ends), (
      np.asarray(extras, np.float32) if extra is not None else None)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_each_node_sees_exactly_its_path(family):
  config = CONFIGS[family]()
  impl = "pallas_pad" if family == "llama-pallas" else "reference"
  rng = np.random.default_rng(len(family))
  params = bj.init_params(config, jax.random.key(1))
  prefix_rows = rng.integers(0, 61, size=(B, max(PREFIX))).astype(np.int32)
  cache = common.prefill_cache(config, params, jnp.asarray(prefix_rows),
                               jnp.asarray(PREFIX + 1), cache_len=S, attention_impl=impl)
  cache = _poisoned(cache)  # lengths = PREFIX: the rows' prefixes, then NaN
  tree = _random_tree(rng)
  mask = tree_lib.ancestor_mask(tree)
  got, out_cache = common.forward(config, params, tree.tokens, cache, attention_impl=impl,
                                  tree_mask=mask)
  np.testing.assert_array_equal(out_cache.lengths, PREFIX + T)

  keys, rows, ends, _ = _path_inputs(prefix_rows, tree)
  want, _ = common.forward(config, params, jnp.asarray(rows))
  want = np.asarray(want)[np.arange(len(keys)), ends]
  got = np.asarray(got)
  assert np.isfinite(got[0]).all() and np.isfinite(got[1]).all()
  for i, (b, t) in enumerate(keys):
    np.testing.assert_allclose(got[b, t], want[i], atol=1e-4, rtol=1e-4, err_msg=f"row {b} node {t}")


@pytest.mark.parametrize("family", ["llama-gqa", "llama-pallas", "gpt2"])
def test_a_tree_grown_in_two_forwards_equals_one(family):
  """A draft grows its tree level by level: the second forward's queries are the last T of the tree's
  M nodes, the first M - T already in the cache (``tree_mask: [B, T, M]``)."""
  config = CONFIGS[family]()
  impl = "pallas_split" if family == "llama-pallas" else "reference"
  rng = np.random.default_rng(11)
  params = bj.init_params(config, jax.random.key(4))
  prefix_rows = rng.integers(0, 61, size=(B, max(PREFIX))).astype(np.int32)
  cache = _poisoned(common.prefill_cache(config, params, jnp.asarray(prefix_rows),
                                         jnp.asarray(PREFIX + 1), cache_len=S, attention_impl=impl))
  tree = _random_tree(rng)
  mask = tree_lib.ancestor_mask(tree)
  first = 2
  _, cache = common.forward(config, params, tree.tokens[:, :first], cache, attention_impl=impl,
                            tree_mask=mask[:, :first, :first])
  got, _ = common.forward(config, params, tree.tokens[:, first:], cache, attention_impl=impl,
                          tree_mask=mask[:, first:])
  keys, rows, ends, _ = _path_inputs(prefix_rows, tree)
  want, _ = common.forward(config, params, jnp.asarray(rows))
  want = np.asarray(want)[np.arange(len(keys)), ends]
  for i, (b, t) in enumerate(keys):
    if t >= first:
      np.testing.assert_allclose(np.asarray(got)[b, t - first], want[i], atol=1e-4, rtol=1e-4)


def test_the_eagle_draft_grows_trees_like_chains():
  target = tiny_config()
  config = eagle.EagleConfig(layer=target.with_num_layers(1), draft_vocab_size=20)
  params = eagle.bind(eagle_init.init_draft_params(config, jax.random.key(2)), np.arange(61), target,
                      bj.init_params(target, jax.random.key(3)), 20)
  rng = np.random.default_rng(7)
  e = config.feature_size
  prefix_rows = rng.integers(0, 61, size=(B, max(PREFIX))).astype(np.int32)
  prefix_feats = rng.normal(size=(B, max(PREFIX), e)).astype(np.float32)
  node_feats = rng.normal(size=(B, T, e)).astype(np.float32)
  cache = config.init_cache(B, S)
  _, update = eagle.forward(config, params, jnp.asarray(prefix_rows), jnp.asarray(prefix_feats), None)
  cache = _poisoned(cache.append(update).with_lengths(jnp.asarray(PREFIX)))
  tree = _random_tree(rng)
  got, _ = eagle.forward(config, params, tree.tokens, jnp.asarray(node_feats), cache,
                         tree_mask=tree_lib.ancestor_mask(tree))
  extra = [{"prefix": prefix_feats[b], "nodes": node_feats[b]} for b in range(B)]
  keys, rows, ends, feats = _path_inputs(prefix_rows, tree, extra)
  want, _ = eagle.forward(config, params, jnp.asarray(rows), jnp.asarray(feats), None)
  want = np.asarray(want)[np.arange(len(keys)), ends]
  for i, (b, t) in enumerate(keys):
    np.testing.assert_allclose(np.asarray(got)[b, t], want[i], atol=1e-4, rtol=1e-4)


def test_a_tree_mask_of_the_wrong_shape_or_without_a_cache_is_an_error():
  config = tiny_config()
  params = bj.init_params(config, jax.random.key(0))
  tokens = jnp.zeros((2, 3), jnp.int32)
  cache = config.init_cache(2, 16)
  with pytest.raises(ValueError, match=r"tree_mask must be bool\[2, 3\] \+ \[M >= 3\]"):
    common.forward(config, params, tokens, cache, tree_mask=jnp.ones((2, 3, 2), bool))
  with pytest.raises(ValueError, match="tree_mask must be"):
    common.forward(config, params, tokens, None, tree_mask=jnp.ones((2, 3, 3), bool))
