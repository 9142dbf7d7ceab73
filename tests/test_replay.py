"""The replay proposer (bass_jax.sampling.proposers.replay): exact like every proposer (greedy equality
with regular decoding, whatever the recording), and accepting at the rates it is given."""

import numpy as np
import pytest

import bass_jax as bj
from bass_jax.evaluation import metrics
from bass_jax.sampling.proposers import replay_text
from conftest import assert_lossless, random_eagle_draft, tiny_model

NEW = 24


@pytest.fixture(scope="module")
def recorded():
  """A tiny target, 4 distinct prompts of different lengths, and its regular greedy decode of them."""
  target = tiny_model(0, scale=3.0)  # peaky logits: no near-ties in greedy decoding
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 61, n).tolist() for n in (3, 7, 12, 5)]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=NEW)
  return target, prompts, regular


def _acceptance(out):
  return metrics.acceptance(out.stats.draft_lens, out.stats.accepted, out.stats.drafted)


@pytest.mark.parametrize("draft_kind", ["eagle", "model"])
def test_replay_at_full_acceptance_accepts_every_draft_and_stays_exact(recorded, draft_kind):
  target, prompts, regular = recorded
  draft = random_eagle_draft(target) if draft_kind == "eagle" else tiny_model(3)
  text = replay_text(prompts, regular.tokens, regular.lengths)
  out = bj.generate(target, bj.Replay(draft, text, acceptance=(1.0,)), prompts, max_new_tokens=NEW,
                    draft_len=3)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  got = _acceptance(out)
  # Every tested draft is the target's own token: all accepted (the last step of a row may be cut
  # by max_new_tokens, which still counts its drafts as accepted up to the budget).
  assert got.position_offered[0] > 0 and got.position_acceptance[:3] == (1.0, 1.0, 1.0)
  # The random draft model alone accepts almost nothing: the replay, not the model, drafted.
  alone = _acceptance(bj.generate(target, draft, prompts, max_new_tokens=NEW, draft_len=3))
  assert alone.draft_acceptance_rate < 0.5


def test_replay_accepts_at_the_given_per_position_rates(recorded):
  target, prompts, regular = recorded
  text = replay_text(prompts, regular.tokens, regular.lengths)
  rates = (0.8, 0.5, 0.25)
  counts = []
  for seed in range(6):  # pooled over seeds: the hash replaces other positions under each
    out = bj.generate(target, bj.Replay(random_eagle_draft(target), text, acceptance=rates,
                                        seed=seed), prompts, max_new_tokens=NEW, draft_len=3)
    assert_lossless(target, prompts, regular, out) == 1.0
    np.testing.assert_array_equal(out.tokens, regular.tokens)
    counts.append(_acceptance(out))
  pooled = metrics.Acceptance.pooled(counts)
  got = pooled.position_acceptance
  for k, rate in enumerate(rates):
    offered = pooled.position_offered[k]
    assert offered >= 20, pooled
    # Binomial: within 3.5 standard deviations of the rate.
    assert abs(got[k] - rate) <= 3.5 * np.sqrt(rate * (1 - rate) / offered) + 1e-9, (k, got, pooled)


def test_replay_at_zero_acceptance_and_a_wrong_recording_stay_exact(recorded):
  target, prompts, regular = recorded
  text = replay_text(prompts, regular.tokens, regular.lengths)
  none = bj.generate(target, bj.Replay(random_eagle_draft(target), text, acceptance=(0.0,)), prompts,
                     max_new_tokens=NEW, draft_len=3)
  np.testing.assert_array_equal(none.tokens, regular.tokens)
  assert _acceptance(none).accepted == 0
  # A recording of other text (shifted by one token) and fewer rows than the batch: still exact.
  wrong = np.roll(text, 1, axis=1)[:2]
  out = bj.generate(target, bj.Replay(tiny_model(3), wrong, acceptance=(1.0,)), prompts,
                    max_new_tokens=NEW, draft_len=2, temperature=0.0)
  np.testing.assert_array_equal(out.tokens, regular.tokens)


def test_replay_follows_the_recording_until_the_text_leaves_it(recorded):
  """A recording wrong from its 12th output token on: the replayed draft there is rejected, and from
  then on the row's text is not the recording's, so the row drafts with the model (here the target
  itself: always right) instead of replaying a recording it has left."""
  target, prompts, regular = recorded
  text = replay_text(prompts, regular.tokens, regular.lengths)
  wrong = text.copy()
  for b, prompt in enumerate(prompts):
    start = len(prompt) + 12
    wrong[b, start:] = np.where(wrong[b, start:] >= 0, (wrong[b, start:] + 1) % 61, -1)
  out = bj.generate(target, bj.Replay(target, wrong, acceptance=(1.0,)), prompts, max_new_tokens=NEW,
                    draft_len=3)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  # One step per row rejects its drafts, where the recording turns wrong; every other step accepts
  # all 3. (Replaying the wrong rest would reject every later step; and before the draft model's
  # rollback kept its last text token out of its cache, the step after the rejection drafted garbage
  # too: its own first draft had been the target's correction.)
  for row in out.stats.accepted.T:
    live = row[row >= 0]
    assert (live == 0).sum() == 1 and set(live[live > 0].tolist()) == {3}, out.stats.accepted.T


def test_replay_samples_exactly_with_one_hot_drafts(recorded):
  """At T > 0 the replayed drafts are deterministic (one-hot q): the same seed gives a sampled decode
  whose every token is the target's (checked by the draw being reproducible and in-vocabulary; the
  chi-square of sampled proposers is test_sampling_exact's)."""
  target, prompts, regular = recorded
  text = replay_text(prompts, regular.tokens, regular.lengths)
  replay = bj.Replay(random_eagle_draft(target), text, acceptance=(0.9,))
  a = bj.generate(target, replay, prompts, max_new_tokens=8, temperature=0.7, seed=3, draft_len=3)
  b = bj.generate(target, replay, prompts, max_new_tokens=8, temperature=0.7, seed=3, draft_len=3)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert (a.tokens[a.tokens >= 0] < target.config.vocab_size).all()


def test_replay_arguments_are_checked(recorded):
  target, prompts, regular = recorded
  text = replay_text(prompts, regular.tokens, regular.lengths)
  draft = random_eagle_draft(target)
  for bad in ((), (1.2,), (-0.1,), "0.5", (True,)):
    with pytest.raises(ValueError, match="acceptance"):
      bj.Replay(draft, text, acceptance=bad)
  for seed in (-1, 2**32, 1.5):
    with pytest.raises(ValueError, match="seed"):
      bj.Replay(draft, text, seed=seed)
  with pytest.raises(ValueError, match="vocabulary of 61"):
    bj.generate(target, bj.Replay(draft, text + 100), prompts, max_new_tokens=4)
  with pytest.raises(ValueError, match="one static batch"):  # continuous batching: rows change prompts
    bj.generate(target, bj.Replay(draft, text), prompts, max_new_tokens=4, batch_size=2)
  with pytest.raises(ValueError, match="text"):
    bj.Replay(draft, np.zeros((2, 3), np.float32))
  with pytest.raises(ValueError, match="text"):
    bj.Replay(draft, np.full((2, 3), -2))
  with pytest.raises(ValueError, match="recording"):
    bj.generate(target, bj.Replay(draft), prompts, max_new_tokens=4)
  with pytest.raises(ValueError, match="replay_text"):
    replay_text(prompts[:2], regular.tokens, regular.lengths)
  assert bj.Replay(draft, text).name.startswith("replay(eagle, acceptance=0.755/")
