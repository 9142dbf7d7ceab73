"""The draft side as proposers (bass_jax.sampling.proposers) and the cost-aware draft length.

The n-gram lookup is checked against a brute-force Python search on fresh random texts; the draft model's
catch-up and rollback against a fresh prefill of the same text; every proposer and policy against
regular greedy decoding (tiny models and the real SmolLM2 target), and a policy that never speculates
against regular *sampled* decoding with the same seed. Sampling exactness of the n-gram and hybrid
proposers is in test_sampling_exact.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.sampling import draft_len as draft_len_lib
from bass_jax.sampling import step_costs
from bass_jax.sampling import proposers
from conftest import assert_lossless, tiny_model


def _lookup_reference(text, max_n, min_n):
  """Longest n first; the most recent earlier occurrence followed by at least one token."""
  for n in range(max_n, min_n - 1, -1):
    if len(text) < n + 1:
      continue
    suffix = text[-n:]
    for j in range(len(text) - n - 1, -1, -1):
      if text[j:j + n] == suffix:
        return j + n, len(text) - (j + n)
  return 0, 0


@pytest.mark.parametrize("max_n,min_n", [(4, 2), (3, 1), (1, 1)])
def test_ngram_lookup_matches_a_brute_force_search(max_n, min_n):
  rng = np.random.default_rng(max_n * 10 + min_n)
  batch, width = 16, 40
  tokens = rng.integers(0, 5, (batch, width)).astype(np.int32)  # small vocabulary: many repeats
  seq_len = rng.integers(1, width + 1, batch).astype(np.int32)
  seq_len[:2] = [1, width]
  tokens[np.arange(width)[None, :] >= seq_len[:, None]] = 3  # stale buffer content past the text
  ngram = bj.NGramProposer(max_n=max_n, min_n=min_n)
  start, available = jax.jit(ngram.lookup)(jnp.asarray(tokens), jnp.asarray(seq_len))
  want = [_lookup_reference(tokens[b, :seq_len[b]].tolist(), max_n, min_n) for b in range(batch)]
  got = list(zip(np.asarray(start).tolist(), np.asarray(available).tolist()))
  for b in range(batch):
    if want[b][1] == 0:
      assert got[b][1] == 0, (b, got[b])
    else:
      assert got[b] == want[b], (b, got[b], want[b])
  assert any(w[1] > 0 for w in want) and any(w[1] == 0 for w in want)


def test_ngram_proposes_the_continuation_capped_at_l():
  ngram = bj.NGramProposer(max_n=2, min_n=1)
  tokens = jnp.asarray([[7, 8, 9, 4, 7, 8, 0, 0], [1, 2, 3, 4, 5, 6, 0, 0]], jnp.int32)
  ctx = proposers.StepContext(tokens=tokens, seq_len=jnp.asarray([6, 6]), live=jnp.asarray([True, True]),
                              draft_len=jnp.int32(3), key=jax.random.key(0),
                              temperature=jnp.float32(1), top_p=jnp.float32(1))
  _, proposal = ngram.propose(None, None, ctx, max_len=5, chunk=4, greedy=True)
  # Row 0 ends with "7 8", seen at 0: propose what followed (9 4 7), l = 3 of the 4 available.
  np.testing.assert_array_equal(proposal.drafts[0, :3], [9, 4, 7])
  assert proposal.num_drafts.tolist() == [3, 0] and proposal.log_q is None
  assert bool(ngram.can_propose(ctx)) and not bool(ngram.can_propose(ctx.replace(
      live=jnp.asarray([False, True]))))


def test_a_context_built_by_hand_draws_as_its_keys_say():
  """Without the decode's rule, a StepContext with row keys draws drafts as Gumbel acceptance does
  (the target's noise at the draft's text position), and without them independently."""
  from bass_jax.sampling import warp  # pylint: disable=import-outside-toplevel

  log_q = jax.nn.log_softmax(jax.random.normal(jax.random.key(1), (2, 11)))
  keys = warp.sequence_keys(jax.random.key(2), [0, 1])
  ctx = proposers.StepContext(tokens=jnp.zeros((2, 8), jnp.int32), seq_len=jnp.asarray([3, 5]),
                              live=jnp.asarray([True, True]), draft_len=jnp.int32(2),
                              key=jax.random.key(3), temperature=jnp.float32(1),
                              top_p=jnp.float32(1), row_keys=jnp.asarray(keys))
  np.testing.assert_array_equal(ctx.draw(log_q, 1),
                                warp.gumbel_choice(log_q, jnp.asarray(keys), jnp.asarray([4, 6])))
  np.testing.assert_array_equal(ctx.replace(row_keys=None).draw(log_q, 1),
                                warp.categorical(jax.random.fold_in(jax.random.key(3), 1), log_q))


def test_proposer_arguments_are_checked():
  with pytest.raises(ValueError, match="min_n <= max_n"):
    bj.NGramProposer(max_n=2, min_n=3)
  with pytest.raises(ValueError, match="min_n"):
    bj.NGramProposer(min_n=0)
  with pytest.raises(ValueError, match="prior"):
    bj.GoodputDraftLen(prior=1.0)
  with pytest.raises(ValueError, match="decay"):
    bj.GoodputDraftLen(decay=0)
  target = tiny_model(0)
  for bad in ("ngram", 3, target.params):
    with pytest.raises(ValueError, match="NGramProposer"):
      bj.generate(target, bad, [[1, 2, 3]], max_new_tokens=4)
  assert draft_len_lib.as_policy("goodput") == bj.GoodputDraftLen()


def _draft_state_after(model, text, cached, max_len=4, cache_len=64):
  """A ModelProposer's state whose cache holds ``text[:cached]`` (fed through the prefill)."""
  proposer = proposers.ModelProposer(model.config, "float32")
  prompts = jnp.asarray([text + [0] * (cache_len // 2 - len(text))], jnp.int32)
  return proposer, proposer.init_state(model.params, prompts, jnp.asarray([cached + 1]),
                                       cache_len=cache_len, max_len=max_len), prompts


def test_draft_model_catches_up_on_any_lag():
  """After plain steps the draft lags by many tokens; its cache then equals a fresh prefill's."""
  model = tiny_model(3)
  text = np.random.default_rng(3).integers(0, 61, 13).tolist()
  proposer, state, tokens = _draft_state_after(model, text, cached=4)
  ctx = proposers.StepContext(tokens=tokens, seq_len=jnp.asarray([13]), live=jnp.asarray([True]),
                              draft_len=jnp.int32(1), key=jax.random.key(0),
                              temperature=jnp.float32(1), top_p=jnp.float32(1))
  state, proposal = jax.jit(lambda s: proposer.propose(model.params, s, ctx, max_len=4, chunk=4,
                                                       greedy=True))(state)
  _, fresh, _ = _draft_state_after(model, text, cached=13)
  assert int(state.cache.lengths[0]) == 13
  for got, want in zip(state.cache.k, fresh.cache.k):
    np.testing.assert_allclose(got[0, :, :13], want[0, :, :13], atol=1e-5)
  # The first draft is the model's argmax after the whole text.
  np.testing.assert_array_equal(proposal.drafts[0, 0], np.argmax(model.logits(np.array([text]))[0, -1]))


def test_draft_model_rollback_keeps_what_the_text_confirms():
  model = tiny_model(4)
  proposer = proposers.ModelProposer(model.config, "float32")
  cache = model.config.init_cache(2, 32, jnp.float32).with_lengths(jnp.asarray([13, 13]))
  fed = jnp.asarray([[5, 6, 7, 8], [5, 6, 7, 8]], jnp.int32)
  state = proposers.DraftCacheState(cache=cache, fed=fed, num_fed=jnp.int32(3))  # fed from 10 on
  tokens = np.zeros((2, 20), np.int32)
  tokens[0, 10:14] = [5, 6, 9, 1]  # confirms d_1, d_2
  tokens[1, 10:12] = [5, 6]  # the text ends at 11, with d_1 as its last token
  state = proposer.rollback(state, jnp.asarray(tokens), jnp.asarray([10, 10]), jnp.asarray([14, 11]))
  # Row 1's last token (its correction, equal to d_1: a hybrid's or a replay's other drafts were
  # verified) stays out of the cache: the next catch-up feeds it for the next draft's logits.
  assert state.cache.lengths.tolist() == [12, 10]


def _prompts(vocab, lengths, seed=0):
  rng = np.random.default_rng(seed)
  base = rng.integers(0, vocab, 5).tolist()
  return [(base * 8)[:n] if i % 2 == 0 else rng.integers(0, vocab, n).tolist()
          for i, n in enumerate(lengths)]


@pytest.mark.parametrize("draft_kind,draft_len", [
    ("ngram", "dynamic"), ("ngram", 3), ("hybrid", 4), ("hybrid", "goodput"), ("model", "goodput")])
def test_every_proposer_and_policy_is_lossless_when_greedy(draft_kind, draft_len):
  target = tiny_model(0, scale=3.0)
  # A draft close to the target (its weights with 20 % noise), so that it is accepted sometimes.
  leaves, tree = jax.tree_util.tree_flatten(target.params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  noisy = [x * (1 + 0.2 * jax.random.normal(k, x.shape)) for x, k in zip(leaves, keys)]
  draft = bj.Model(target.config, jax.tree_util.tree_unflatten(tree, noisy), name="noisy")
  ngram = bj.NGramProposer(max_n=3, min_n=1)
  side = {"ngram": ngram, "hybrid": bj.Hybrid(draft, ngram), "model": draft}[draft_kind]
  if draft_len == "goodput":  # costs under which speculation pays, so that drafts are verified
    draft_len = bj.GoodputDraftLen(max_len=4, costs=bj.StepCosts(1.0, 1.2, 0.01, 0.01, 4))
  prompts = _prompts(61, (17, 6, 11, 3, 9))
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=24, eos_token_id=())
  bass = bj.generate(target, side, prompts, max_new_tokens=24, draft_len=draft_len, eos_token_id=())
  np.testing.assert_array_equal(bass.tokens, regular.tokens)
  assert bass.stats.drafted.sum() > 0 and (bass.stats.accepted > 0).any()
  if draft_kind == "ngram":  # some rows matched nothing in some steps
    assert (bass.stats.drafted == 0).any()


def test_a_policy_that_never_speculates_is_regular_decoding():
  """Costs under which no draft pays: every step is plain, and the sampled tokens are regular
  decoding's (same seed, same key schedule). (Greedy decodes that mix plain and speculative steps
  equal regular decoding in test_continuous.)"""
  temperature = 0.8
  target, draft = tiny_model(0), tiny_model(1)
  costs = bj.StepCosts(plain=1.0, verify_pass=50.0, propose_first=50.0, propose_next=50.0, chunk=4)
  prompts = _prompts(61, (7, 12, 4), seed=5)
  kw = dict(max_new_tokens=20, eos_token_id=(), temperature=temperature, top_p=0.9, seed=9)
  regular = bj.generate(target, None, prompts, method="regular", **kw)
  for side in (draft, bj.NGramProposer(max_n=2, min_n=1)):
    bass = bj.generate(target, side, prompts, draft_len=bj.GoodputDraftLen(costs=costs), **kw)
    np.testing.assert_array_equal(bass.tokens, regular.tokens)
    assert (bass.stats.draft_lens == 0).all() and (bass.stats.verified == 1).all()


def test_goodput_chooses_the_argmax_of_expected_tokens_per_second():
  policy = bj.GoodputDraftLen(max_len=6, decay=0.5, prior=0.4, prior_weight=2.0)
  costs = bj.StepCosts(plain=0.020, verify_pass=0.030, propose_first=0.004, propose_next=0.003, chunk=4)
  _, state = policy.start(costs.as_array())
  rng = np.random.default_rng(0)
  for _ in range(5):  # random steps of 6 rows
    num_drafts = rng.integers(0, 7, 6)
    accepted = np.minimum(rng.integers(0, 7, 6), num_drafts)
    live = rng.random(6) < 0.8
    chosen, state = policy.after_step(state, jnp.int32(6), kind=draft_len_lib.CHAIN,
                                      depth=jnp.asarray(num_drafts),
                                      accepted=jnp.asarray(accepted), live=jnp.asarray(live))
  # Independently: decayed counts -> smoothed rates -> E(l) / cost(l).
  tried, passed = np.zeros(6), np.zeros(6)
  rng = np.random.default_rng(0)
  for _ in range(5):
    num_drafts = rng.integers(0, 7, 6)
    accepted = np.minimum(rng.integers(0, 7, 6), num_drafts)
    live = rng.random(6) < 0.8
    tried, passed = 0.5 * tried, 0.5 * passed
    for n, a, alive in zip(num_drafts, accepted, live):
      for i in range(1, 7):
        tried[i - 1] += alive and i <= min(a + 1, n)
        passed[i - 1] += alive and i <= a
  rates = (passed + 0.4 * 2.0) / (tried + 2.0)
  best, best_l = 1 / 0.020, 0
  for l in range(1, 7):
    expected = 1 + sum(np.prod(rates[:i]) for i in range(1, l + 1))
    cost = 0.004 + (l - 1) * 0.003 + -(-(l + 1) // 4) * 0.030
    if expected / cost > best:
      best, best_l = expected / cost, l
  np.testing.assert_allclose(state.tried, tried, rtol=1e-6)
  assert int(chosen) == best_l


def test_the_break_even_acceptance_is_where_the_policy_starts_to_speculate():
  """step_costs.break_even_acceptance agrees with GoodputDraftLen's own choice on both sides of it, for
  random measured costs."""
  rng = np.random.default_rng()
  policy = draft_len_lib.GoodputDraftLen()
  for _ in range(5):
    plain = rng.uniform(0.01, 0.1)
    # Ranges where a perfect draft pays and a useless one does not, so a break-even point exists.
    c = bj.StepCosts(plain=plain, verify_pass=plain * rng.uniform(1.0, 1.6),
                     propose_first=plain * rng.uniform(0, 0.2), propose_next=plain * rng.uniform(0, 0.1),
                     chunk=int(rng.choice([2, 4, 8])))
    alpha, length = step_costs.break_even_acceptance(c, policy.max_len)
    assert 0 < alpha < 1 and 1 <= length <= policy.max_len

    def choice(rate):  # the policy's pick once the evidence swamps its prior
      tried = jnp.full(policy.max_len, 1e7, jnp.float32)
      return int(policy.choose(draft_len_lib.GoodputState(tried, rate * tried, c.as_array())))

    assert choice(alpha + 0.003) >= 1 and choice(alpha - 0.003) == 0


# The cost-aware policy with given costs, in the CPU profile's verification chunks of 4: a chain pays at
# the prior acceptance, so the policy speculates whatever this machine would measure.
GIVEN_GOODPUT = bj.GoodputDraftLen(costs=bj.StepCosts(plain=1.0, verify_pass=1.3, propose_first=0.15,
                                                      propose_next=0.15, chunk=4))


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind,draft_len", [("ngram", "dynamic"), ("hybrid", GIVEN_GOODPUT)],
                         ids=["ngram-dynamic", "hybrid-goodput"])
def test_smollm2_greedy_bass_equals_regular_for_every_proposer(smollm2, smollm2_greedy, draft_kind,
                                                               draft_len):
  """Real target, prompts of different lengths: the n-gram lookup under Algorithm 1, and the hybrid of a
  4-layer prefix of the target (a draft model) and the lookup under the cost-aware policy with given
  costs (calibration is test_calibration's); a trained draft model at a fixed length is
  test_shipped_draft's."""
  prompts, regular = smollm2_greedy
  ngram = bj.NGramProposer()
  side = ngram if draft_kind == "ngram" else bj.Hybrid(smollm2.with_first_layers(4), ngram)
  bass = bj.generate(smollm2, side, prompts, max_new_tokens=32, draft_len=draft_len)
  rate = assert_lossless(smollm2, prompts, regular, bass)
  assert rate >= 0.9, f"exact-match rate {rate:.3f}"
  assert (bass.stats.draft_lens > 0).any()  # the draft side was verified, not only plain steps
