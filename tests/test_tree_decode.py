"""Tree steps in the decode loop (``generate(draft_tree=...)``): greedy tree BASS equals greedy regular
decoding token for token, for every proposer, static and continuous batches; the accepted paths run
through other children than the first; and bad shapes are errors that name the argument.

A tree's accepted path lies at scattered node slots; its K/V and features must be moved into
consecutive slots (``cache.keep_path``) or the next step reads the wrong context and the tokens
differ. The noisy draft agrees with the target often but not always, so paths of every depth and
through second children occur. The exact law of sampled tree steps is tested in
``tests/test_sampling_exact.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import bass_jax as bj
from bass_jax.evaluation import metrics
from conftest import assert_decode_copies_no_cache, noisy_copy, random_eagle_draft, tiny_model

SHAPE = "top_k=3,depth=3,nodes=8"
MAX_NEW = 20


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0, scale=2.5)


@pytest.fixture(scope="module")
def prompts(target):
  rng = np.random.default_rng(0)
  return [list(rng.integers(0, target.config.vocab_size, size=n)) for n in (3, 9, 1, 6, 12)]


@pytest.fixture(scope="module")
def regular(target, prompts):
  return bj.generate(target, None, prompts, method="regular", max_new_tokens=MAX_NEW,
                     eos_token_id=())


def _draft(kind, target):
  noisy = noisy_copy(target, 0.1, seed=3)
  ngram = bj.NGramProposer(max_n=2, min_n=1)
  return {"model": noisy, "eagle": random_eagle_draft(target), "ngram": ngram,
          "hybrid": bj.Hybrid(noisy, ngram)}[kind]


@pytest.mark.parametrize("kind", ["model", "eagle", "ngram", "hybrid"])
def test_greedy_tree_bass_is_regular_decoding(kind, target, prompts, regular):
  out = bj.generate(target, _draft(kind, target), prompts, max_new_tokens=MAX_NEW, eos_token_id=(),
                    draft_tree=SHAPE)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  accepted = out.stats.accepted[out.stats.accepted >= 0]
  # The random EAGLE draft is rarely right and n-gram lookup in random text matches little: they only
  # have to stay exact. The noisy copy's trees accept paths of every length.
  assert accepted.max() >= {"model": 2, "eagle": 0, "ngram": 1, "hybrid": 2}[kind], np.bincount(accepted)
  assert (accepted == 0).any()


def test_a_continuous_batch_of_trees_is_regular_decoding(target, prompts, regular):
  # The hybrid with the noisy copy's first layer only (cheaper to compile): it still accepts paths
  # of several tokens, which keep_path moves, in rows that are refilled.
  draft = bj.Hybrid(noisy_copy(target, 0.1, seed=3).with_first_layers(1),
                    bj.NGramProposer(max_n=2, min_n=1))
  out = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW, eos_token_id=(),
                    draft_tree=SHAPE, batch_size=2)
  assert out.stats.continuous
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  accepted = out.stats.accepted[out.stats.accepted >= 0]
  assert accepted.max() >= 2, np.bincount(accepted)


def test_trees_accept_more_than_their_first_children(target, prompts):
  """The tree pays: with the same draft and depth, it accepts more per step than the chain of its
  first children (the draft's greedy chain), since the target's token is often a second guess."""
  draft = noisy_copy(target, 0.1, seed=3)
  tree = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW, eos_token_id=(),
                     draft_tree=SHAPE)  # the program of test_greedy_tree_bass_is_regular_decoding
  chain = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW, eos_token_id=(), draft_len=3)
  mean = lambda out: out.stats.accepted[out.stats.accepted >= 0].mean()
  assert mean(tree) > mean(chain) + 0.1, (mean(tree), mean(chain))


def test_goodput_chooses_among_plain_chains_and_trees_and_stays_exact(target, prompts, regular):
  """Two compiled tree shapes, chains and plain steps in one decode, chosen per step by goodput (fixed
  costs under which the trees pay at first; exploration every 2 steps brings chains back): the tokens
  are regular decoding's, each step's history says which kind it was, the summary's acceptance per
  depth counts a tree step's levels, not its nodes, and the compiled decode copies no cache."""
  shapes = ("top_k=3,depth=3,nodes=8", "top_k=2,depth=4,nodes=6")
  costs = bj.StepCosts(plain=1.0, verify_pass=1.2, propose_first=0.05, propose_next=0.05, chunk=4,
                       tree_steps=(1.3, 1.35))
  policy = bj.GoodputDraftLen(max_len=4, explore_every=2, costs=costs)
  out = bj.generate(target, _draft("hybrid", target), prompts, max_new_tokens=MAX_NEW,
                    eos_token_id=(), draft_len=policy, draft_tree=shapes)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  assert_decode_copies_no_cache(target, out)  # each kind of step's loop updates the caches in place
  stats = out.stats
  assert stats.draft_trees == shapes
  assert {-1, 0, 1} <= set(stats.trees.tolist()), stats.trees
  for j, shape in enumerate(map(bj.TreeShape.parse, shapes)):
    np.testing.assert_array_equal(stats.verified[stats.trees == j], shape.nodes)
    np.testing.assert_array_equal(stats.draft_lens[stats.trees == j], shape.depth)
    assert stats.accepted[stats.trees == j].max() <= shape.depth
  chains = (stats.trees == -1) & (stats.draft_lens > 0)
  assert chains.any() and (stats.verified[chains] % 4 == 0).all()
  acceptance = metrics.acceptance(stats.draft_lens, stats.accepted, stats.drafted)
  assert len(acceptance.position_offered) == 4  # depth 4 or l = 4 at most, though trees drafted 7
  assert stats.drafted.max() == 7


def test_bad_trees_are_errors_that_name_the_argument(target, prompts):
  draft = _draft("model", target)
  with pytest.raises(ValueError, match="nodes=3 must be at least depth"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree="top_k=2,depth=5,nodes=3")
  with pytest.raises(ValueError, match="draft_tree top_k"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree="top_k=0,depth=2,nodes=3")
  with pytest.raises(ValueError, match="leave it at its default"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree=SHAPE, draft_len=4)
  with pytest.raises(ValueError, match="choosing among them per step needs draft_len='goodput'"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree=[SHAPE, "top_k=2,depth=2,nodes=4"])
  with pytest.raises(ValueError, match="repeats a shape"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree=[SHAPE, SHAPE], draft_len="goodput")
  with pytest.raises(ValueError, match="empty sequence"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree=[])
  with pytest.raises(ValueError, match="needs method='bass'"):
    bj.generate(target, None, prompts, method="regular", max_new_tokens=4, draft_tree=SHAPE)
  with pytest.raises(ValueError, match="draft_tree must be None, a TreeShape"):
    bj.generate(target, draft, prompts, max_new_tokens=4, draft_tree=16)
  with pytest.raises(ValueError, match="more than max_cache_len"):
    bj.generate(target, draft, [[1, 2]], max_new_tokens=60, max_cache_len=64,
                draft_tree="top_k=4,depth=4,nodes=17")


def test_ngram_lookup_drafts_several_matches_as_branches():
  """Row 0: the suffix (5, 6) occurs four times before the end with continuations starting 1, 3, 2
  and 1 (most recent first); the tree holds the three distinct ones, most recent first, each a chain
  of at most depth tokens, until the nodes run out. Row 1: the second most recent continuation starts
  like the most recent one and is left out. Row 2 has no match and drafts nothing."""
  from bass_jax.sampling.proposers import StepContext  # pylint: disable=g-import-not-at-top

  rows = [[5, 6, 1, 5, 6, 2, 5, 6, 3, 9, 5, 6, 1, 7, 5, 6],
          [5, 6, 1, 5, 6, 2, 5, 6, 1, 9, 5, 6, 1, 7, 5, 6], list(range(20, 36))]
  tokens = np.array([r + [0] * 4 for r in rows], np.int32)
  ctx = StepContext(tokens=tokens, seq_len=np.array([16] * 3), live=np.array([True] * 3),
                    draft_len=np.int32(3), key=None, temperature=np.float32(1), top_p=np.float32(1))
  shape = bj.TreeShape(top_k=3, depth=3, nodes=8)
  _, tree = bj.NGramProposer(max_n=3, min_n=2).propose_tree(None, None, ctx, shape=shape)
  np.testing.assert_array_equal(tree.num_nodes, [8, 7, 1])
  np.testing.assert_array_equal(tree.tokens[0], [6, 1, 7, 5, 3, 9, 5, 2])
  np.testing.assert_array_equal(tree.parents[0], [-1, 0, 1, 2, 0, 4, 5, 0])
  np.testing.assert_array_equal(tree.tokens[1, :7], [6, 1, 7, 5, 2, 5, 6])
  np.testing.assert_array_equal(tree.parents[1, :7], [-1, 0, 1, 2, 0, 4, 5])
  assert tree.tokens[2, 0] == 35
