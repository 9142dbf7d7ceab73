"""Drafting from the other samples of a prompt (``SiblingProposer``, batch-shared suffix lookup).

The lookup is checked against a brute force written here from its docstring (occurrences of each
row's longest suffix in its siblings' texts and finished pool, the vote and its confidence, tree
branches), on random texts over a small vocabulary so that occurrences abound; the decode with it
equals regular decoding token for token (static and continuous batches, alone, in the hybrid, with
trees). The exact law of sampled steps is tested in ``tests/test_sampling_exact.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.sampling.drafts import parse_draft_spec
from bass_jax.sampling.proposers import FinishedSamples, StepContext
from conftest import noisy_copy, tiny_model

MAX_NEW = 24


def _brute_occurrences(p: bj.SiblingProposer, tokens, seq_len, group, live, finished, depth):
  """Per row, the kept occurrences in vote order: [(run, continuation with None where unknown)].

  Ranked by source (the pool's most recently admitted sample first, then the batch's rows, nearest
  first), then by position (latest first); a pool sample's text is its prompt's last max_n tokens
  (-2 where the prompt is shorter) and its output."""
  batch, width = tokens.shape
  count = min(p.max_siblings, batch - 1)
  pool_texts = []
  if finished is not None and p.pool:
    prompts, prompt_len, outputs, lengths, groups = finished
    for q in range(len(lengths)):
      tail = [int(prompts[q, prompt_len[q] - p.max_n + i]) if prompt_len[q] - p.max_n + i >= 0 else -2
              for i in range(p.max_n)]
      pool_texts.append((np.array(tail + list(outputs[q])), p.max_n + lengths[q]))
  span = max([width] + [len(t) for t, _ in pool_texts]) + 1
  out = []
  for b in range(batch):
    suffix = [tokens[b, seq_len[b] - 1 - i] for i in range(p.max_n) if seq_len[b] - 1 - i >= 0]
    found = []  # (rank key, run, continuation)

    def scan(text, length, rank):
      for j in range(len(text)):
        if j + 1 >= length:
          continue
        run = 0
        while run < len(suffix) and j - run >= 0 and text[j - run] == suffix[run]:
          run += 1
        if run >= p.min_n:
          found.append((rank * span + j, run, [int(text[j + 1 + d]) if j + 1 + d < length else None
                                               for d in range(depth)]))

    for s in range(count):
      c = (b + 1 + s) % batch
      if group[c] == group[b]:
        scan(tokens[c], seq_len[c], count - s)
    if pool_texts:
      mine = [q for q in range(len(pool_texts)) if lengths[q] > 0 and groups[q] == group[b]]
      k = min(p.pool, len(pool_texts))
      for e, q in enumerate(sorted(mine, reverse=True)[:k]):
        scan(*pool_texts[q], count + k - e)
    if not live[b] or not found:
      out.append([])
      continue
    longest = max(run for _, run, _ in found)
    kept = sorted((f for f in found if f[1] == longest), key=lambda f: -f[0])[:p.max_matches]
    out.append([(run, cont) for _, run, cont in kept])
  return out


def _brute_follow(p, occurrences, confidence):
  """The agreed continuation of ``occurrences`` (lists of tokens), and its length."""
  alive = list(range(len(occurrences)))
  tokens, length, taking = [], 0, True
  confidence = np.float32(confidence)
  for d in range(len(occurrences[0]) if occurrences else 0):
    voting = [r for r in alive if occurrences[r][d] is not None]
    counts = {}
    for r in voting:
      counts[occurrences[r][d]] = counts.get(occurrences[r][d], 0) + 1
    best = max(counts, key=lambda t: (counts[t], -min(voting.index(r) for r in voting
                                                       if occurrences[r][d] == t))) if counts else None
    votes = counts.get(best, 0)
    confidence = np.float32(confidence * np.float32(votes)) / np.float32(max(len(voting), 1))
    taking = taking and votes > 0 and confidence >= np.float32(p.min_agreement)
    length += taking
    tokens.append(best)
    alive = [r for r in voting if occurrences[r][d] == best]
  return tokens, length


def _random_context(seed, *, batch=6, width=30, vocab=3, pool=None):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (batch, width)).astype(np.int32)
  seq_len = rng.integers(2, width + 1, batch).astype(np.int32)
  group = np.array([0, 1, 0, 0, 1, 2][:batch], np.int32)
  live = np.array([True, True, True, False, True, True][:batch])
  finished = None
  if pool:
    finished = (rng.integers(0, vocab, (pool, 5)).astype(np.int32),  # prompts
                rng.integers(1, 6, pool).astype(np.int32),  # prompt_len
                rng.integers(0, vocab, (pool, 12)).astype(np.int32),  # outputs
                rng.integers(0, 13, pool).astype(np.int32),  # lengths
                rng.integers(0, 3, pool).astype(np.int32))  # group
  ctx = StepContext(tokens=jnp.asarray(tokens), seq_len=jnp.asarray(seq_len), live=jnp.asarray(live),
                    draft_len=jnp.int32(6), key=None, temperature=jnp.float32(1),
                    top_p=jnp.float32(1), group=jnp.asarray(group),
                    finished=None if finished is None else FinishedSamples(*map(jnp.asarray,
                                                                                finished)))
  return ctx, (tokens, seq_len, group, live, finished)


@pytest.mark.parametrize("seed,pool,settings", [
    (0, None, dict(max_n=2, min_n=2, min_agreement=0.3)),
    (1, 7, dict(max_n=3, min_n=1, min_agreement=0.2, max_matches=5, pool=3)),
    (2, 7, dict(max_n=5, min_n=2, min_agreement=0.5, max_siblings=2))])
def test_the_lookup_matches_a_brute_force(seed, pool, settings):
  proposer = bj.SiblingProposer(**settings)
  ctx, (tokens, seq_len, group, live, finished) = _random_context(seed, pool=pool)
  max_len = 6
  # Jitted, as the decode runs it: eagerly, each of the lookup's ops would compile on its own.
  propose = jax.jit(lambda c: proposer.propose(None, None, c, max_len=max_len, chunk=1,
                                               greedy=False)[1])
  proposal = propose(ctx)
  occurrences = _brute_occurrences(proposer, tokens, seq_len, group, live, finished, max_len)
  lengths = []
  for b, occ in enumerate(occurrences):
    want, length = _brute_follow(proposer, [c for _, c in occ], 1.0)
    length = min(length, 6)  # ctx.draft_len
    lengths.append(length)
    assert int(proposal.num_drafts[b]) == length, (b, occ)
    np.testing.assert_array_equal(proposal.drafts[b, :length], want[:length])
    assert (np.asarray(proposal.drafts[b, length:]) == 0).all()
  assert proposal.log_q is None
  assert 0 in lengths and any(0 < n < max_len for n in lengths), lengths  # drafting stopped early
  assert bool(jax.jit(proposer.can_propose)(ctx)) == any(lengths)
  single = jax.tree_util.tree_map(lambda a: a[:1] if getattr(a, "ndim", 0) and a.shape[0] == 6 else a,
                                  ctx)  # a lone row: no sibling in the batch
  alone = propose(single.replace(finished=None))
  assert int(alone.num_drafts[0]) == 0

  shape = bj.TreeShape(top_k=2, depth=3, nodes=7)
  tree = jax.jit(lambda c: proposer.propose_tree(None, None, c, shape=shape)[1])(ctx)
  for b, occ in enumerate(occurrences):
    conts = [c for _, c in occ if c[0] is not None]
    want, left = set(), list(range(len(conts)))
    for _ in range(shape.top_k):
      if not left:
        break
      counts = {}
      for r in left:
        counts[conts[r][0]] = counts.get(conts[r][0], 0) + 1
      best = max(counts, key=lambda t: (counts[t], -min(left.index(r) for r in left
                                                        if conts[r][0] == t)))
      mine = [r for r in left if conts[r][0] == best]
      tokens_b, length = _brute_follow(proposer, [conts[r][:shape.depth] for r in mine],
                                       np.float32(len(mine)) / np.float32(len(conts)))
      want |= {tuple(tokens_b[:i]) for i in range(1, length + 1)}
      left = [r for r in left if r not in mine]
    got = set()
    parents, nodes = np.asarray(tree.parents[b]), np.asarray(tree.tokens[b])
    for i in range(1, int(tree.num_nodes[b])):
      path, node = [], i
      while node > 0:
        path.append(int(nodes[node]))
        node = parents[node]
      got.add(tuple(path[::-1]))
    assert got == want, (b, got, want)


def test_settings_are_checked_and_the_spec_parses(target):
  with pytest.raises(ValueError, match="min_n <= max_n"):
    bj.SiblingProposer(max_n=2, min_n=3)
  with pytest.raises(ValueError, match="min_agreement"):
    bj.SiblingProposer(min_agreement=1.5)
  with pytest.raises(ValueError, match="pool"):
    bj.SiblingProposer(pool=-1)
  assert bj.load_draft_spec("siblings:max_n=6,min_agreement=0.25", target) == bj.SiblingProposer(
      max_n=6, min_agreement=0.25)
  with pytest.raises(ValueError, match="siblings takes no setting 'depth'; its form is siblings\\[:max_n=<int>"):
    bj.load_draft_spec("siblings:depth=3", target)
  spec = parse_draft_spec("hybrid+siblings:some/model:max_n=3")
  assert spec.model == "some/model"
  assert [s for _, s in spec.proposers] == [bj.SiblingProposer(), bj.NGramProposer(max_n=3)]
  spec = parse_draft_spec("hybrid:some/model")
  assert (spec.model, [s for _, s in spec.proposers]) == ("some/model", [bj.NGramProposer()])
  with pytest.raises(ValueError, match="written before its model, hybrid\\+siblings:<model spec>"):
    bj.load_draft_spec("hybrid:siblings,x", target)


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0, scale=2.5)


@pytest.fixture(scope="module")
def prompts(target):
  """Three samples of each of two prompts, interleaved, and one prompt alone."""
  rng = np.random.default_rng(1)
  a, b, c = (list(rng.integers(0, target.config.vocab_size, size=n)) for n in (5, 9, 3))
  return [a, b, a, c, b, a, b]


@pytest.fixture(scope="module")
def regular(target, prompts):
  return bj.generate(target, None, prompts, method="regular", max_new_tokens=MAX_NEW,
                     eos_token_id=())


@pytest.mark.parametrize("batch_size", [None, 2])
def test_greedy_sibling_drafting_is_regular_decoding(target, prompts, regular, batch_size):
  """The tokens are regular decoding's. Greedy samples of one prompt are identical: in a static batch
  they advance in lockstep (a sibling holds no more than the row), while in a continuous batch a
  sample that starts after another finished drafts the whole text from it."""
  out = bj.generate(target, bj.SiblingProposer(), prompts, max_new_tokens=MAX_NEW, eos_token_id=(),
                    draft_len=8, batch_size=batch_size)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  if batch_size is not None:
    accepted = out.stats.accepted[out.stats.sources == 2]
    assert accepted.max() == 8 and accepted.mean() > 6, np.bincount(accepted)


@pytest.mark.parametrize("draft_tree", [None, "top_k=2,depth=3,nodes=6"])
def test_greedy_hybrid_with_siblings_is_regular_decoding(target, prompts, regular, draft_tree):
  # A 1-layer draft (cheaper to compile): it only has to draft where the lookups find nothing.
  hybrid = bj.Hybrid(noisy_copy(target, 0.1, seed=3).with_first_layers(1),
                     (bj.SiblingProposer(), bj.NGramProposer(max_n=2, min_n=1)))
  assert hybrid.name.startswith("hybrid(siblings(8-2), ngram(2-1), ")
  out = bj.generate(target, hybrid, prompts, max_new_tokens=MAX_NEW, eos_token_id=(),
                    draft_len=3 if draft_tree is None else "dynamic", draft_tree=draft_tree,
                    batch_size=3)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  drafted = out.stats.sources[out.stats.sources >= 0]
  assert {0, 2} <= set(drafted.tolist()), np.bincount(drafted)  # the model's and siblings' drafts
