"""Tree acceptance (bass_jax.sampling.tree): structure, greedy walks, exactness of sampling.

Exactness is tested as in ``test_sampling_exact``, without a model: the "target" is a random table
of next-token laws over a tiny vocabulary (V = 6) for every prefix, some entries zero (like a top-p
nucleus). Every row gets its own random tree of depth up to 3 whose node distributions are read from
the table along the node's path; one batched call of the acceptance rule per test gives each row's
emitted tokens, which are completed to K = 3 tokens with plain draws from the table. The K tokens
must fit the table's product law by chi-square (p > 1e-3), never land in a zero cell, and the test
must reach both deep acceptances and rejections at the root. Mutant rules (a test-local walker with
one bug each) must be rejected by the same harness at p < 1e-6, and the correct test-local walker
must pass it (a check of the harness itself). Everything uses fixed seeds: the outcome is
deterministic.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.acceptance import Greedy, Gumbel, Rejection
from bass_jax.sampling import warp
import test_sampling_exact as exact

VOCAB = 6
NUM_TOKENS = 3  # K: the joint law of the first K emitted tokens is tested (216 cells)
MAX_DEPTH = 3
NUM_NODES = 8  # N
NUM_ROWS = 20_000
BLANK = VOCAB  # the table's index for "no token" in a prefix shorter than MAX_DEPTH
PAD_TOKEN = 1_000_003  # padding tokens and log-probs are garbage the rules must never read
GARBAGE_PARENT = -7

# The rules, through their one entry point. The tables below are already log-probabilities, which the
# warp at temperature 1 (a log-softmax) leaves as they are; a tree is walked (``chain=False``) even when
# it is a chain, so that the chain path can be checked against the walk.
GREEDY = Greedy()
REJECTION = Rejection()
GUMBEL = Gumbel()
T1 = jnp.float32(1.0)
walked = lambda tree: tree.replace(chain=False)
greedy_tree = jax.jit(lambda tree, logits: GREEDY.accept(walked(tree), logits))
speculative_tree = jax.jit(lambda key, tree, log_p, log_q=None: REJECTION.accept(
    walked(tree), log_p, temperature=T1, key=key, draft_log_probs=log_q))
gumbel_tree = jax.jit(lambda tree, log_p, row_keys, seq_len: GUMBEL.accept(
    walked(tree), log_p, temperature=T1, row_keys=row_keys, seq_len=seq_len))


def chain_chunk(rule, logits, drafts, num_drafts, lo, hi, **kwargs):
  """The rule on positions ``lo … hi - 1`` of the chain ``0 -> drafts``, as the decode's chunked
  verification calls it: ``(matched, next_token)``."""
  inputs = jnp.concatenate([jnp.zeros((drafts.shape[0], 1), jnp.int32), drafts,
                            jnp.zeros((drafts.shape[0], hi - lo), jnp.int32)], 1)
  nodes = inputs[:, lo:hi + 1]
  chunk = tree_lib.chain_tree(nodes[:, 0], nodes[:, 1:], jnp.clip(num_drafts - lo, 0, hi - lo), first=lo)
  result = rule.accept(chunk, logits[:, lo:hi], **kwargs)
  return result.num_accepted, result.next_token


# -- plain-Python references -------------------------------------------------------------------


def children_of(parents, num_nodes, u):
  return [c for c in range(1, num_nodes) if parents[c] == u]


def reference_depths_and_mask(parents, num_nodes, num):
  depths, mask = np.zeros(num, int), np.zeros((num, num), bool)
  for i in range(num_nodes):
    j = i
    while j >= 0:
      mask[i, j] = True
      j = parents[j] if j > 0 else -1
    depths[i] = mask[i].sum() - 1
  return depths, mask


def reference_greedy(tokens, parents, num_nodes, logits):
  """Level by level: the first child (index order) whose token is the argmax at its parent."""
  path = [0]
  while True:
    best = int(np.argmax(logits[path[-1]]))
    match = [c for c in children_of(parents, num_nodes, path[-1]) if tokens[c] == best]
    if not match:
      return path, best
    path.append(match[0])


def reference_speculative(rng, tokens, parents, num_nodes, p, q=None, bug=None):
  """One row's walk, level by level, with numpy draws (``q=None``: deterministic children, one-hot
  ``q``). ``bug`` makes a mutant: ``"keep_p"`` never updates ``p'`` after a rejection (every child
  is tried against ``p_u`` and the correction drawn from it); ``"unnormalized"`` updates ``p'``
  without renormalizing it; ``"correction_from_p"`` updates ``p'`` but draws the correction from
  ``p_u``."""
  path = [0]
  while True:
    u = path[-1]
    residual = p[u]
    for c in children_of(parents, num_nodes, u):
      t = tokens[c]
      q_u = np.eye(VOCAB)[t] if q is None else q[u]
      if rng.random() * q_u[t] < residual[t]:  # u < min(1, p'(t) / q(t))
        path.append(c)
        break
      rest = np.maximum(residual - q_u, 0.0)
      if bug != "keep_p" and rest.sum() > 0:
        residual = rest if bug == "unnormalized" else rest / rest.sum()
    else:
      law = p[u] if bug == "correction_from_p" else residual
      return path, int(rng.choice(VOCAB, p=law / law.sum()))


# -- random trees and the table target -------------------------------------------------------


def random_laws(rng, shape, zero_prob):
  """Random laws ``f64[*shape, V]``, each entry zero with probability ``zero_prob`` (never all)."""
  weights = rng.gamma(0.6, size=shape + (VOCAB,))
  zero = rng.random(weights.shape) < zero_prob
  zero &= np.arange(VOCAB) != np.argmax(weights, -1)[..., None]
  weights = np.where(zero, 0.0, weights)
  return weights / weights.sum(-1, keepdims=True)


@functools.lru_cache(maxsize=None)
def tables():
  """``(target, draft)``: laws ``f64[V + 1, V + 1, V + 1, V]`` per prefix (BLANK-padded); the draft
  is 0.7 target + 0.3 noise, so its top tokens are often, not always, the target's."""
  rng = np.random.default_rng(0)
  shape = (VOCAB + 1,) * MAX_DEPTH
  target = random_laws(rng, shape, 0.3)
  return target, 0.7 * target + 0.3 * random_laws(rng, shape, 0.3)


@functools.lru_cache(maxsize=None)
def target_joint() -> np.ndarray:
  """The table's law of the first K tokens, ``f64[V, V, V]``."""
  target, _ = tables()
  joint = np.empty((VOCAB,) * NUM_TOKENS)
  for x in itertools.product(range(VOCAB), repeat=NUM_TOKENS):
    prefixes = [x[:j] + (BLANK,) * (MAX_DEPTH - j) for j in range(NUM_TOKENS)]
    joint[x] = np.prod([target[prefixes[j]][x[j]] for j in range(NUM_TOKENS)])
  return joint


def law_after(prefix_tokens):
  """The target's next-token laws ``f64[R, V]`` after each row's ``prefix_tokens: int[R, j]``."""
  target, _ = tables()
  rows, length = prefix_tokens.shape
  padded = np.concatenate([prefix_tokens, np.full((rows, MAX_DEPTH - length), BLANK)], 1)
  return target[tuple(padded.T)]


def draw(rng, laws):
  """One inverse-CDF draw per row of ``laws: f64[R, V]``."""
  cdf = np.cumsum(laws, -1)
  return np.minimum((rng.random(len(laws))[:, None] * cdf[:, -1:] >= cdf).sum(-1), VOCAB - 1)


@functools.lru_cache(maxsize=None)
def random_trees(mode: str, seed: int, rows: int = NUM_ROWS, num: int = NUM_NODES) -> dict:
  """Random trees of depth <= MAX_DEPTH whose node laws come from the target table.

  Nodes are added in index order, each under the previous node (probability 1/2, if that is not
  at MAX_DEPTH) or a random earlier node of depth < MAX_DEPTH, so siblings interleave with other
  nodes. ``mode="topk"``: the k-th child of a node is the k-th most probable token of the draft
  table at its prefix, or (probability 0.3) a duplicate of an earlier sibling. ``mode="sampled"``:
  every node u has its own random law ``q_u``, an overconfident copy of its target law (``p_u ** 3``
  renormalized) alone or mixed half and half with noise (zeros included), and its children are
  i.i.d. draws from it (duplicates happen). Padding: garbage parents and tokens, NaN log-probs (and
  NaN draft log-probs at childless nodes).

  Returns a dict of numpy arrays: tokens, parents, num_nodes, p (``f64[R, N, V]`` node laws), q
  (the laws the children were drawn from, sampled mode), has_children (``bool[R, N]``), and the
  library's inputs tree, target_log_probs, draft_log_probs (None in topk mode).
  """
  rng = np.random.default_rng(seed)
  target, draft = tables()
  index = np.arange(rows)
  num_nodes = rng.integers(1, num + 1, rows)
  parents = np.full((rows, num), -1)
  tokens = np.zeros((rows, num), int)
  depths = np.zeros((rows, num), int)
  prefixes = np.full((rows, num, MAX_DEPTH), BLANK)
  noise = random_laws(rng, (rows, num), 0.3)
  weight = rng.choice([0.5, 1.0], (rows, num, 1))
  overconfident = lambda p: p ** 3 / np.sum(p ** 3, -1, keepdims=True)
  for i in range(1, num):
    open_ = depths[:, :i] < MAX_DEPTH
    follow = open_[:, i - 1] & (rng.random(rows) < 0.5)
    parent = np.where(follow, i - 1, np.argmax(np.where(open_, rng.random((rows, i)), -1.0), 1))
    siblings = parents[:, :i] == parent[:, None]
    if mode == "topk":
      order = np.argsort(-draft[tuple(prefixes[index, parent].T)], -1, kind="stable")
      token = order[index, siblings.sum(1) % VOCAB]
      duplicate_of = np.argmax(np.where(siblings, rng.random((rows, i)), -1.0), 1)
      duplicate = siblings.any(1) & (rng.random(rows) < 0.3)
      token = np.where(duplicate, tokens[index, duplicate_of], token)
    else:
      w, p_parent = weight[index, parent], target[tuple(prefixes[index, parent].T)]
      token = draw(rng, w * overconfident(p_parent) + (1 - w) * noise[index, parent])
    parents[:, i], tokens[:, i] = parent, token
    depths[:, i] = depths[index, parent] + 1
    prefixes[:, i] = prefixes[index, parent]
    prefixes[index, i, depths[:, i] - 1] = token
  p = target[tuple(np.moveaxis(prefixes, -1, 0))]  # [R, N, V]
  q = weight * overconfident(p) + (1 - weight) * noise

  real = np.arange(num) < num_nodes[:, None]
  has_children = np.zeros((rows, num), bool)
  for i in range(1, num):
    has_children[index, parents[:, i]] |= real[:, i]
  parents = np.where(real, parents, rng.integers(GARBAGE_PARENT, num, (rows, num)))
  tokens = np.where(real, tokens, PAD_TOKEN)
  with np.errstate(divide="ignore"):
    target_log_probs = np.where(real[..., None], np.log(p), np.nan).astype(np.float32)
    draft_log_probs = np.where(has_children[..., None], np.log(q), np.nan).astype(np.float32)
  tree = tree_lib.DraftTree(tokens=jnp.asarray(tokens, jnp.int32),
                            parents=jnp.asarray(parents, jnp.int32),
                            num_nodes=jnp.asarray(num_nodes, jnp.int32))
  return dict(tokens=tokens, parents=parents, num_nodes=num_nodes, p=p, q=q,
              has_children=has_children, tree=tree, target_log_probs=jnp.asarray(target_log_probs),
              draft_log_probs=jnp.asarray(draft_log_probs) if mode == "sampled" else None)


def check_paths(trees, result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Asserts a TreeAcceptance is well formed; returns numpy ``(path, num_accepted, next_token)``."""
  path, accepted, next_token = (np.asarray(x) for x in (result.path, result.num_accepted,
                                                      result.next_token))
  rows, num = path.shape
  assert (path[:, 0] == 0).all()
  slots = np.arange(num)
  assert (path[slots > accepted[:, None]] == -1).all()
  index = np.arange(rows)
  for k in range(1, num):
    on = k <= accepted
    assert (path[on, k] < trees["num_nodes"][on]).all()
    assert (trees["parents"][index[on], path[on, k]] == path[on, k - 1]).all()
  assert ((0 <= next_token) & (next_token < VOCAB)).all()
  return path, accepted, next_token


def emitted(trees, path, accepted, next_token) -> np.ndarray:
  """Each row's emitted tokens ``tokens[path[1:num_accepted + 1]], next_token``, then -1:
  ``int[R, MAX_DEPTH + 1]``."""
  index = np.arange(len(accepted))
  seq = np.full((len(accepted), MAX_DEPTH + 1), -1)
  for k in range(1, MAX_DEPTH + 1):
    on_path = trees["tokens"][index, np.maximum(path[:, k], 0)]
    seq[:, k - 1] = np.where(k <= accepted, on_path, -1)
  seq[index, accepted] = next_token
  return seq


def completed(trees, path, accepted, next_token, rng) -> np.ndarray:
  """Each row's emitted tokens, completed to K with plain draws from the table: ``int[R, K]``."""
  seq = emitted(trees, path, accepted, next_token)
  for j in range(1, NUM_TOKENS):
    seq[:, j] = np.where(j > accepted, draw(rng, law_after(seq[:, :j])), seq[:, j])
  return seq[:, :NUM_TOKENS]


def assert_fits(samples):
  joint = target_joint()
  assert not (joint[tuple(samples.T)] == 0).any(), "a draw in a zero-probability cell"
  p_value = exact.chisquare_p_value(samples, joint)
  assert p_value > exact.PASS_P_VALUE, p_value


def rows_with_duplicate_siblings(trees) -> int:
  real = np.arange(trees["tokens"].shape[1]) < trees["num_nodes"][:, None]
  real[:, 0] = False
  pairs = np.where(real, trees["parents"] * VOCAB + trees["tokens"], -1 - np.arange(real.shape[1]))
  return int(sum(len(set(row)) < len(row) for row in pairs.tolist()))


def run_reference(trees, sampled, bug, seed):
  """The test-local walker on every row: ``(path lists, next tokens)``."""
  rng = np.random.default_rng(seed)
  q = trees["q"] if sampled else None
  paths, next_tokens = [], []
  for b in range(len(trees["num_nodes"])):
    path, token = reference_speculative(rng, trees["tokens"][b], trees["parents"][b],
                                        trees["num_nodes"][b], trees["p"][b],
                                        None if q is None else q[b], bug)
    paths.append(path)
    next_tokens.append(token)
  num = trees["tokens"].shape[1]
  path = np.array([p + [-1] * (num - len(p)) for p in paths])
  return path, np.array([len(p) - 1 for p in paths]), np.array(next_tokens)


# -- structure ---------------------------------------------------------------------------------


def test_chain_tree_structure():
  last = jnp.array([7, 8, 9], jnp.int32)
  drafts = jnp.array([[1, 2, 3], [4, 5, 6], [0, 0, 0]], jnp.int32)
  tree = tree_lib.chain_tree(last, drafts, jnp.array([3, 1, 0], jnp.int32))
  np.testing.assert_array_equal(tree.tokens, [[7, 1, 2, 3], [8, 4, 5, 6], [9, 0, 0, 0]])
  np.testing.assert_array_equal(tree.parents, [[-1, 0, 1, 2]] * 3)
  np.testing.assert_array_equal(tree.num_nodes, [4, 2, 1])
  np.testing.assert_array_equal(tree_lib.node_depths(tree), [[0, 1, 2, 3], [0, 1, 0, 0], [0] * 4])


def test_depths_and_ancestor_mask_match_reference():
  """Random trees (random parents and sizes, garbage padding) against a plain-Python walk up."""
  trees = random_trees("topk", seed=1, rows=300, num=9)
  depths = np.asarray(tree_lib.node_depths(trees["tree"]))
  mask = np.asarray(tree_lib.ancestor_mask(trees["tree"]))
  assert mask.dtype == bool and depths.dtype == np.int32
  for b in range(300):
    want_depths, want_mask = reference_depths_and_mask(trees["parents"][b],
                                                       trees["num_nodes"][b], 9)
    np.testing.assert_array_equal(depths[b], want_depths)
    np.testing.assert_array_equal(mask[b], want_mask)
  assert depths.max() == MAX_DEPTH and (trees["num_nodes"] == 1).any()


# -- greedy ------------------------------------------------------------------------------------


def test_greedy_matches_reference_walker():
  """Random trees over V = 4 (duplicate siblings), integer logits (ties: the first index wins)."""
  rng = np.random.default_rng(2)
  rows, num, vocab = 600, 9, 4
  num_nodes = rng.integers(1, num + 1, rows)
  num_nodes[:50] = 1  # only the root
  parents = np.array([[-1] + [i - 1 if rng.random() < 0.4 else rng.integers(0, i)
                              for i in range(1, num)] for _ in range(rows)])
  logits = rng.integers(0, 3, (rows, num, vocab)).astype(np.float32)
  best_at_parent = np.argmax(np.take_along_axis(logits, parents[..., None], 1), -1)
  tokens = np.where(rng.random((rows, num)) < 0.4, best_at_parent,
                    rng.integers(0, vocab, (rows, num)))
  real = np.arange(num) < num_nodes[:, None]
  parents = np.where(real, parents, rng.integers(GARBAGE_PARENT, num, (rows, num)))
  tokens = np.where(real, tokens, PAD_TOKEN)
  tree = tree_lib.DraftTree(tokens=jnp.asarray(tokens, jnp.int32),
                            parents=jnp.asarray(parents, jnp.int32),
                            num_nodes=jnp.asarray(num_nodes, jnp.int32))
  result = jax.tree.map(np.asarray, greedy_tree(tree, jnp.asarray(logits)))
  depth_counts = np.zeros(num, int)
  duplicate_matches = 0
  for b in range(rows):
    path, best = reference_greedy(tokens[b], parents[b], num_nodes[b], logits[b])
    np.testing.assert_array_equal(result.path[b], path + [-1] * (num - len(path)), err_msg=b)
    assert result.num_accepted[b] == len(path) - 1 and result.next_token[b] == best
    depth_counts[len(path) - 1] += 1
    for u in path[:-1]:
      sibling_tokens = [tokens[b, c] for c in children_of(parents[b], num_nodes[b], u)]
      duplicate_matches += sibling_tokens.count(np.argmax(logits[b, u])) > 1
  assert depth_counts[0] > 50 and depth_counts[2:].sum() > 50, depth_counts
  assert duplicate_matches > 10


def test_greedy_on_chains_checked_at_once_equals_the_walk():
  rng = np.random.default_rng(3)
  rows, length, vocab = 400, 5, 3
  drafts = jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32)
  num_drafts = jnp.asarray(rng.integers(0, length + 1, rows), jnp.int32)
  logits = rng.integers(0, 3, (rows, length + 1, vocab)).astype(np.float32)
  agree = rng.random((rows, length)) < 0.7  # the target's argmax is the draft
  logits[:, :-1] += 3 * agree[..., None] * np.eye(vocab)[np.asarray(drafts)]
  logits = jnp.asarray(logits)
  tree = tree_lib.chain_tree(jnp.zeros(rows, jnp.int32), drafts, num_drafts)
  result = greedy_tree(tree, logits)
  matched, next_token = chain_chunk(GREEDY, logits, drafts, num_drafts, 0, length + 1)
  np.testing.assert_array_equal(result.num_accepted, matched)
  np.testing.assert_array_equal(result.next_token, next_token)
  slots = np.arange(length + 1)
  want_path = np.where(slots <= np.asarray(matched)[:, None], slots, -1)
  np.testing.assert_array_equal(result.path, want_path)
  assert len(set(np.asarray(matched).tolist())) == length + 1  # every acceptance length occurred


@pytest.mark.parametrize("one_hot_q", [True, False])
def test_a_chain_is_the_parents_i_minus_1_tree_draw_for_draw(one_hot_q):
  """Chains and trees are one acceptance rule: speculative (deterministic drafts or drafts sampled
  from q) and drafter-invariant acceptance of a chain, in one chunk or in two, make the very draws
  that tree acceptance makes on the same chain as a tree (``parents[i] = i - 1``)."""
  rng = np.random.default_rng(11)
  rows, length, vocab = 600, 5, 4
  key = jax.random.PRNGKey(5)
  log_p = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(rows, length + 1, vocab)) * 3.0), -1)
  log_q = None if one_hot_q else jax.nn.log_softmax(
      jnp.asarray(rng.normal(size=(rows, length + 1, vocab)) * 1.5), -1)
  # Drafts that the target often takes: its own likeliest token three times in four.
  likely = np.asarray(jnp.argmax(log_p[:, :-1], -1))
  drafts = jnp.asarray(np.where(rng.random((rows, length)) < 0.75, likely,
                                rng.integers(0, vocab, (rows, length))), jnp.int32)
  num_drafts = jnp.asarray(rng.integers(0, length + 1, rows), jnp.int32)
  tree = tree_lib.chain_tree(jnp.zeros(rows, jnp.int32), drafts, num_drafts)
  as_tree = speculative_tree(key, tree, log_p, log_q)

  def chunk(lo, hi):
    return chain_chunk(REJECTION, log_p, drafts, num_drafts, lo, hi, temperature=T1, key=key,
                       draft_log_probs=None if log_q is None else log_q[:, lo:hi])

  matched, next_token = chunk(0, length + 1)
  np.testing.assert_array_equal(as_tree.num_accepted, matched)
  np.testing.assert_array_equal(as_tree.next_token, next_token)
  first, first_next = chunk(0, 3)  # as the loop verifies with C = 3: rows that matched all go on
  second, second_next = chunk(3, length + 1)
  np.testing.assert_array_equal(np.where(first == 3, 3 + second, first), matched)
  np.testing.assert_array_equal(np.where(first == 3, second_next, first_next), next_token)
  counts = np.bincount(np.asarray(matched), minlength=length + 1)
  assert (counts >= 10).all(), counts  # every acceptance length occurred

  row_keys = jnp.asarray(rng.integers(0, 2**32, (rows, 2), dtype=np.uint64).astype(np.uint32))
  seq_len = jnp.asarray(rng.integers(3, 40, rows), jnp.int32)
  gumbel = gumbel_tree(tree, log_p, row_keys, seq_len)
  c_matched, c_next = chain_chunk(GUMBEL, log_p, drafts, num_drafts, 0, length + 1, temperature=T1,
                                  row_keys=row_keys, seq_len=seq_len)
  np.testing.assert_array_equal(gumbel.num_accepted, c_matched)
  np.testing.assert_array_equal(gumbel.next_token, c_next)


# -- exactness of rejection sampling on trees ---------------------------------------------------


@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_speculative_tree_matches_the_target_law(mode):
  """20,000 rows, one batched call: the first K emitted tokens fit the table's law, through deep
  acceptances, rejections at the root, accepted leaves (bonus) and duplicate siblings."""
  trees = random_trees(mode, seed=10)
  result = speculative_tree(jax.random.key(4), trees["tree"], trees["target_log_probs"],
                            trees["draft_log_probs"])
  path, accepted, next_token = check_paths(trees, result)
  rejected_all = trees["has_children"][np.arange(NUM_ROWS), path[np.arange(NUM_ROWS), accepted]]
  assert (accepted >= 2).sum() > 500 and ((accepted == 0) & rejected_all).sum() > 500
  assert (~rejected_all & (accepted > 0)).sum() > 500  # bonus tokens at accepted leaves
  assert rows_with_duplicate_siblings(trees) > 2000
  assert_fits(completed(trees, path, accepted, next_token, np.random.default_rng(5)))


def test_duplicate_of_a_rejected_topk_sibling_is_never_accepted():
  """Deterministic children: once token t is rejected at a node, a later sibling with t is rejected,
  and t is not the correction there."""
  trees = random_trees("topk", seed=10)
  result = speculative_tree(jax.random.key(4), trees["tree"], trees["target_log_probs"])
  path, accepted, next_token = check_paths(trees, result)
  checked = 0
  for b in range(2000):
    parents, tokens, n = trees["parents"][b], trees["tokens"][b], trees["num_nodes"][b]
    for k in range(accepted[b] + 1):
      u = path[b, k]
      chosen = path[b, k + 1] if k < accepted[b] else None
      children = children_of(parents, n, u)
      tried = [c for c in children if chosen is None or c < chosen]
      rejected = {tokens[c] for c in tried}
      if chosen is not None:
        assert tokens[chosen] not in rejected
        checked += [tokens[c] for c in children].count(tokens[chosen]) > 1
      else:
        assert next_token[b] not in rejected
        checked += len(rejected) < len(tried)
  assert checked > 50


def test_speculative_decisions_do_not_depend_on_padding():
  """Each uniform is keyed by its node and the correction by its node (and row): the same trees
  with more padding nodes give the same acceptance."""
  trees = random_trees("sampled", seed=11, rows=500)
  result = speculative_tree(jax.random.key(6), trees["tree"], trees["target_log_probs"],
                            trees["draft_log_probs"])
  def pad(x, value):
    return jnp.concatenate([x, jnp.full(x.shape[:1] + (3,) + x.shape[2:], value, x.dtype)], 1)

  tree = trees["tree"]
  wider = tree_lib.DraftTree(tokens=pad(tree.tokens, 5), parents=pad(tree.parents, 0),
                             num_nodes=tree.num_nodes)
  wide = speculative_tree(jax.random.key(6), wider, pad(trees["target_log_probs"], jnp.nan),
                          pad(trees["draft_log_probs"], jnp.nan))
  np.testing.assert_array_equal(wide.path[:, :NUM_NODES], result.path)
  assert (np.asarray(wide.path[:, NUM_NODES:]) == -1).all()
  np.testing.assert_array_equal(wide.num_accepted, result.num_accepted)
  np.testing.assert_array_equal(wide.next_token, result.next_token)


@pytest.mark.parametrize("bug", [None, "keep_p", "unnormalized", "correction_from_p"])
@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_reference_walker_and_its_mutants(mode, bug):
  """The harness: the correct test-local walker passes; each one-bug mutant is rejected."""
  trees = random_trees(mode, seed=10)
  path, accepted, next_token = run_reference(trees, mode == "sampled", bug, seed=12)
  samples = completed(trees, path, accepted, next_token, np.random.default_rng(5))
  if bug is None:
    assert_fits(samples)
  else:
    p_value = exact.chisquare_p_value(samples, target_joint())
    assert p_value < exact.REJECT_P_VALUE, p_value


# -- Gumbel acceptance ------------------------------------------------


def test_gumbel_tree_emits_the_gumbel_walk():
  """Token for token, whatever the tree, the rule emits ``gumbel_choice`` along the table at text
  positions seq_len, seq_len + 1, ...; those tokens fit the table's law."""
  trees = random_trees("topk", seed=13)
  row_keys = jnp.asarray(warp.sequence_keys(jax.random.key(0), range(NUM_ROWS)))
  seq_len = jnp.asarray(np.random.default_rng(14).integers(0, 1000, NUM_ROWS), jnp.int32)
  result = gumbel_tree(trees["tree"], trees["target_log_probs"], row_keys, seq_len)
  path, accepted, next_token = check_paths(trees, result)

  walk = np.zeros((NUM_ROWS, 0), int)
  for j in range(MAX_DEPTH + 1):
    with np.errstate(divide="ignore"):
      log_probs = jnp.asarray(np.log(law_after(walk)), jnp.float32)
    chosen = warp.gumbel_choice(log_probs, row_keys, seq_len + j)
    walk = np.concatenate([walk, np.asarray(chosen)[:, None]], 1)
  tokens = emitted(trees, path, accepted, next_token)
  slots = np.arange(MAX_DEPTH + 1)
  np.testing.assert_array_equal(tokens, np.where(slots <= accepted[:, None], walk, -1))
  assert (accepted >= 2).sum() > 500 and (accepted == 0).sum() > 500
  assert rows_with_duplicate_siblings(trees) > 2000

  p_value = exact.chisquare_p_value(tokens[:, :1], target_joint().sum((1, 2)))
  assert p_value > exact.PASS_P_VALUE, p_value
  assert_fits(walk[:, :NUM_TOKENS])
