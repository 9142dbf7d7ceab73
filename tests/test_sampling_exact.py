"""BASS sampling is exact: its emitted tokens follow the target's warped distribution (docs/bass.md, step 3).

Method. Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) claims that, whatever the draft
proposes, the tokens it emits are distributed exactly as the target's tempered, top-p-truncated
distribution ``p``. With a tiny vocabulary (V = 8) that claim can be checked end to end through the
public :func:`bass_jax.generate`:

* The exact joint law of the first K emitted tokens is computed independently, by enumeration: one
  full causal forward of the target (``Model.logits``: no incremental cache, no sampler code) over
  the prompt followed by every one of the V**(K-1) prefixes gives ``p(x1)``, ``p(x2 | x1)``, ... at
  the successive positions, each warped with :func:`warped_log_probs` (the definition of the sampled
  distribution, cross-checked against an independent numpy restatement of temperature + nucleus), and
  their product is the V**K-cell joint.
* One ``generate`` call with the same prompt repeated R times gives R independent draws of
  ``(x1 .. xK)`` (rows share nothing but the batch-wide draft length, which never changes a row's law).
* A chi-square goodness-of-fit test (cells with expected count < 5 pooled) compares the two; a correct
  sampler passes (p-value > 1e-3), and no draw may land in a zero-probability cell (outside the nucleus).

The draft is a different random model whose next-token distribution is far from the target's (total
variation > 0.3), so most steps reject and emit a correction token from ``norm(max(0, p - q))``, while
some accept every draft and emit a bonus token from ``p``: both paths are checked to actually occur
within the first K tokens. Power is shown three ways: the same BASS draws are rejected as draws from
the draft's distribution, draws from the draft itself are rejected as draws from the target's, and a
mutant sampler with the classic bug (the correction drawn from ``p`` instead of the residual) is
rejected. ``method="regular"`` draws pass the same test (a sanity check of the reference), and with the
draft equal to the target every draft is accepted.

Everything runs with fixed seeds, so the outcome is deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import bass_jax as bj
from bass_jax.sampling import tree_check
from bass_jax.sampling import generate as generate_lib
from bass_jax.profiles import BackendProfile
from bass_jax.sampling.proposers import replay_text
from bass_jax.sampling.warp import warped_log_probs
from conftest import assert_decode_copies_no_cache

VOCAB = 8
PROMPT = (1, 5, 2)
NUM_TOKENS = 3  # K: the joint law of the first K emitted tokens is tested (V**K = 512 cells)
# R: independent draws per test (one batched generate call). With 12,000 the weakest mutant was
# rejected at p = 5e-36 (2026-11-29), far below REJECT_P_VALUE; 24,000 only doubled the run time.
NUM_ROWS = 12_000
PASS_P_VALUE = 1e-3  # a correct sampler must not be rejected at this level
REJECT_P_VALUE = 1e-6  # a wrong distribution must be rejected at this level
MIN_EXPECTED = 5.0  # chi-square cells with a smaller expected count are pooled


# -- models ------------------------------------------------------------------------------------------


def _tiny_model(seed: int) -> bj.Model:
  """A 1-layer random Llama over VOCAB tokens (its next-token laws are far from uniform already)."""
  config = bj.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          max_position_embeddings=64, eos_token_id=None)
  return bj.Model(config, bj.init_params(config, jax.random.key(seed)), name=f"tiny-{seed}")


@functools.lru_cache(maxsize=None)
def _models() -> tuple[bj.Model, bj.Model]:
  """(target, draft): two unrelated random models, so the draft disagrees strongly with the target
  (first-token total variation 0.58 at temperature 1, 0.81-0.86 with top-p; see the first test)."""
  return _tiny_model(seed=0), _tiny_model(seed=1)


# -- the exact distribution, by enumeration -------------------------------------------------------------


def reference_warp(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
  """An independent f64 restatement of the sampled law: ``softmax(logits / T)`` cut to its nucleus.

  Token i is kept iff the mass of the tokens strictly more probable than it is below ``top_p``
  (transformers' ``TopPLogitsWarper`` rule, ties kept), then the kept mass is renormalized.

  Raises:
    AssertionError: when some token's mass-above sits within 1e-4 of ``top_p``, where float rounding
      (f32 in the library, f64 here, cached vs uncached forwards) could flip its membership.
  """
  scaled = np.asarray(logits, np.float64) / np.float64(np.float32(temperature))
  probs = np.exp(scaled - scaled.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  if top_p >= 1:
    return probs
  mass_above = np.sum(np.where(probs[..., None, :] > probs[..., :, None], probs[..., None, :], 0), -1)
  assert np.abs(mass_above - top_p).min() > 1e-4, "a token sits on the top-p boundary"
  kept = np.where(mass_above < top_p, probs, 0.0)
  return kept / kept.sum(-1, keepdims=True)


def exact_joint(model: bj.Model, prompt, num_tokens: int, temperature: float,
                top_p: float) -> np.ndarray:
  """The exact law ``f64[V] * num_tokens`` of the first ``num_tokens`` tokens sampled after ``prompt``.

  One uncached causal forward over ``prompt + t`` for every prefix ``t`` of ``num_tokens - 1`` tokens
  gives, at position ``len(prompt) - 1 + j``, the logits of token ``j + 1`` given ``t[:j]``; each is
  warped with :func:`warped_log_probs` (checked against :func:`reference_warp`: same support, same
  probabilities to 1e-5) and the conditionals are multiplied.
  """
  vocab = model.config.vocab_size
  prefixes = np.array(list(itertools.product(range(vocab), repeat=num_tokens - 1)), np.int32)
  prefixes = prefixes.reshape(vocab ** (num_tokens - 1), num_tokens - 1)
  sequences = np.concatenate([np.tile(np.asarray(prompt, np.int32), (len(prefixes), 1)), prefixes], 1)
  logits = model.logits(sequences)[:, len(prompt) - 1:]  # [prefixes, num_tokens, V]
  log_probs = warped_log_probs(logits, jnp.float32(temperature),
                              None if top_p == 1 else jnp.float32(top_p))
  conditionals = np.exp(np.asarray(log_probs, np.float64))
  reference = reference_warp(np.asarray(logits), temperature, top_p)
  np.testing.assert_array_equal(conditionals > 0, reference > 0)
  np.testing.assert_allclose(conditionals, reference, rtol=0, atol=1e-5)
  conditionals /= conditionals.sum(-1, keepdims=True)  # f32 -> f64 renormalization

  joint = np.empty((vocab,) * num_tokens)
  for tokens in itertools.product(range(vocab), repeat=num_tokens):
    row = np.ravel_multi_index(tokens[:-1], (vocab,) * (num_tokens - 1)) if num_tokens > 1 else 0
    joint[tokens] = np.prod([conditionals[row, j, tokens[j]] for j in range(num_tokens)])
  return joint


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
  return 0.5 * float(np.abs(p - q).sum())


def first_token_law(joint: np.ndarray) -> np.ndarray:
  return joint.reshape(joint.shape[0], -1).sum(1)


# -- the goodness-of-fit test ---------------------------------------------------------------------------


def chisquare_p_value(samples: np.ndarray, joint: np.ndarray) -> float:
  """Chi-square goodness-of-fit p-value of ``samples: i32[R, K]`` against the law ``joint: [V] * K``.

  Cells with an expected count below MIN_EXPECTED are pooled into one cell (together with the next
  smallest ones if the pool itself stays below it). A draw in a zero-probability cell is an outright
  rejection: p-value 0.
  """
  assert samples.ndim == 2 and samples.shape[1] == joint.ndim
  counts = np.bincount(np.ravel_multi_index(samples.T, joint.shape), minlength=joint.size)
  expected = joint.ravel() / joint.sum() * len(samples)
  impossible = joint.ravel() == 0
  if counts[impossible].any():
    return 0.0
  counts, expected = counts[~impossible], expected[~impossible]
  order = np.argsort(expected)
  counts, expected = counts[order], expected[order]
  pooled = int(np.sum(expected < MIN_EXPECTED))
  if pooled:
    while pooled < len(expected) and expected[:pooled].sum() < MIN_EXPECTED:
      pooled += 1
    counts = np.concatenate([[counts[:pooled].sum()], counts[pooled:]])
    expected = np.concatenate([[expected[:pooled].sum()], expected[pooled:]])
  assert len(expected) >= 2, "too few cells for a chi-square test"
  return float(stats.chisquare(counts, expected).pvalue)


# -- sampling -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  temperature: float
  top_p: float
  draft_len: object  # int, "dynamic" or a DynamicDraftLen
  seed: int
  profile: object = None  # generate's profile (None: this machine's)


# A small Algorithm-1 policy: starts at 2 drafts (so the bonus token of a fully accepted first step is
# the 3rd token) and adapts per step; the paper's l_limit = 32 would compile 6 verification buckets.
SMALL_DYNAMIC = bj.DynamicDraftLen(l0=2, l_incre=1, l_mod=2, l_limit=4)

CASES = [
    Case("t1_fixed1", temperature=1.0, top_p=1.0, draft_len=1, seed=11),
    Case("t1_top_p0.8_fixed3", temperature=1.0, top_p=0.8, draft_len=3, seed=12),
    Case("t0.6_top_p0.9_dynamic", temperature=0.6, top_p=0.9, draft_len=SMALL_DYNAMIC, seed=13),
    Case("t1_fixed2", temperature=1.0, top_p=1.0, draft_len=2, seed=14),
    # The GPU profile's program (static-length draft loop, one verification pass of L + 1, no
    # nucleus branch) with the jnp attention: the same law.
    Case("t0.6_top_p0.9_dynamic_branch_free", temperature=0.6, top_p=0.9, draft_len=SMALL_DYNAMIC,
         seed=15, profile=BackendProfile("branch-free", "reference", None, True)),
]
SETTINGS = sorted({(c.temperature, c.top_p) for c in CASES})  # the distinct warped distributions


@functools.lru_cache(maxsize=None)
def _target_joint(temperature: float, top_p: float) -> np.ndarray:
  return exact_joint(_models()[0], PROMPT, NUM_TOKENS, temperature, top_p)


@functools.lru_cache(maxsize=None)
def _draft_joint(temperature: float, top_p: float) -> np.ndarray:
  return exact_joint(_models()[1], PROMPT, NUM_TOKENS, temperature, top_p)


def _generate(target, draft, method, temperature, top_p, seed, draft_len=1, rows=NUM_ROWS,
              profile=None):
  out = bj.generate(target, draft, [list(PROMPT)] * rows, method=method, max_new_tokens=NUM_TOKENS,
                    temperature=temperature, top_p=top_p, draft_len=draft_len, seed=seed,
                    eos_token_id=(), profile=profile)
  assert (out.lengths == NUM_TOKENS).all() and not out.finished.any()
  return out


@functools.lru_cache(maxsize=None)
def _bass(case: Case) -> bj.GenerateOutput:
  target, draft = _models()
  return _generate(target, draft, "bass", case.temperature, case.top_p, case.seed, case.draft_len,
                   profile=case.profile)


def assert_fits_target(out: bj.GenerateOutput, temperature: float, top_p: float) -> None:
  """The first NUM_TOKENS of every row: no draw outside the target's nucleus, and a chi-square fit to
  the enumerated target joint (p > PASS_P_VALUE)."""
  samples = out.tokens[:, :NUM_TOKENS]
  joint = _target_joint(temperature, top_p)
  assert not np.any(joint[tuple(samples.T)] == 0), "a draw outside the target's nucleus"
  p_value = chisquare_p_value(samples, joint)
  assert p_value > PASS_P_VALUE, p_value


def path_counts(out: bj.GenerateOutput, num_tokens: int) -> dict[str, int]:
  """How often each acceptance path produced one of a row's first ``num_tokens`` tokens.

  A step of a live row emits its accepted drafts and then one more token: a correction (some draft
  rejected) or a bonus (all accepted). Returns the number of (step, row) pairs whose last token is among
  the row's first ``num_tokens``, split by path, plus the raw counts of steps accepting nothing / all.
  """
  accepted = out.stats.accepted  # [steps, B], -1 once a row is done
  draft_lens = out.stats.draft_lens[:, None]
  live = accepted >= 0
  emitted = np.where(live, accepted + 1, 0)
  before = np.cumsum(emitted, axis=0) - emitted
  in_prefix = live & (before + emitted <= num_tokens)
  return {
      "correction": int(np.sum(in_prefix & (accepted < draft_lens))),
      "bonus": int(np.sum(in_prefix & (accepted == draft_lens))),
      "accepted_draft": int(np.sum(live & (accepted > 0))),
      "none_accepted": int(np.sum(live & (accepted == 0))),
      "all_accepted": int(np.sum(live & (accepted == draft_lens))),
  }


# -- the tests ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_draft_is_far_from_target(temperature, top_p):
  """The setting is hard: target and draft laws differ a lot; top-p < 1 really truncates."""
  target, draft = _target_joint(temperature, top_p), _draft_joint(temperature, top_p)
  assert np.isclose(target.sum(), 1) and np.isclose(draft.sum(), 1)
  assert total_variation(first_token_law(target), first_token_law(draft)) > 0.3
  assert total_variation(target, draft) > 0.3
  if top_p < 1:
    assert (first_token_law(target) == 0).sum() >= 2  # tokens outside the nucleus
    assert (first_token_law(draft) == 0).sum() >= 2


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bass_matches_exact_target_distribution(case):
  """BASS draws of (x1, x2, x3) fit the enumerated target joint, through both acceptance paths."""
  out = _bass(case)
  paths = path_counts(out, NUM_TOKENS)
  assert paths["correction"] > 100 and paths["accepted_draft"] > 100, paths
  assert paths["none_accepted"] > 100 and paths["all_accepted"] > 20, paths
  if np.max(out.stats.draft_lens[:1]) < NUM_TOKENS:  # a fully accepted first step ends inside the prefix
    assert paths["bonus"] > 20, paths
  if case.draft_len == SMALL_DYNAMIC:
    assert len(set(out.stats.draft_lens.tolist())) >= 2  # the length really adapted

  assert_fits_target(out, case.temperature, case.top_p)


def test_bass_covers_several_draft_lengths():
  """Across the cases the verification saw at least three different draft lengths."""
  lengths = set()
  for case in CASES:
    lengths |= set(_bass(case).stats.draft_lens.tolist())
  assert len(lengths) >= 3, lengths


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bass_draws_reject_the_draft_distribution(case):
  """Power: the same BASS draws are decisively rejected as draws from the draft's law."""
  samples = _bass(case).tokens[:, :NUM_TOKENS]
  p_value = chisquare_p_value(samples, _draft_joint(case.temperature, case.top_p))
  assert p_value < REJECT_P_VALUE, p_value


@pytest.mark.parametrize("temperature,top_p", SETTINGS)
def test_regular_matches_exact_target_distribution(temperature, top_p):
  """Sanity of the reference: plain autoregressive sampling from the target passes the same test."""
  target, _ = _models()
  out = _generate(target, None, "regular", temperature, top_p, seed=21)
  p_value = chisquare_p_value(out.tokens[:, :NUM_TOKENS], _target_joint(temperature, top_p))
  assert p_value > PASS_P_VALUE, p_value


def test_draft_samples_reject_the_target_distribution():
  """Power: draws from the draft itself (regular sampling) are rejected as draws from the target."""
  _, draft = _models()
  out = _generate(draft, None, "regular", 1.0, 1.0, seed=22)
  samples = out.tokens[:, :NUM_TOKENS]
  assert chisquare_p_value(samples, _draft_joint(1.0, 1.0)) > PASS_P_VALUE
  assert chisquare_p_value(samples, _target_joint(1.0, 1.0)) < REJECT_P_VALUE


@pytest.fixture
def fresh_programs():
  """No compiled program is shared with other tests, before or after (a mutant must not leak)."""
  generate_lib.clear_compile_cache()
  jax.clear_caches()
  yield
  generate_lib.clear_compile_cache()
  jax.clear_caches()


def test_mutant_correction_from_p_is_detected(monkeypatch, fresh_programs):
  """Power against a subtle bug: drawing the correction from ``p`` instead of ``norm(max(0, p - q))``."""
  traced = []

  def correction_from_p(p, q):
    del q
    traced.append(True)
    return p

  monkeypatch.setattr(tree_check, "correction_distribution", correction_from_p)
  target, draft = _models()
  out = _generate(target, draft, "bass", 1.0, 1.0, seed=23, draft_len=1)
  assert traced, "the mutant was not traced"
  p_value = chisquare_p_value(out.tokens[:, :NUM_TOKENS], _target_joint(1.0, 1.0))
  assert p_value < REJECT_P_VALUE, p_value


@pytest.mark.parametrize("draft_len", [4, "dynamic"])
def test_draft_equal_to_target_accepts_every_draft(draft_len):
  """With q == p every acceptance ratio is 1: each live row accepts all l_draft drafts every step."""
  target, _ = _models()
  max_new_tokens = 40
  out = bj.generate(target, target, [list(PROMPT), [3], [0, 7, 7, 1, 6]] * 8, method="bass",
                    max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, draft_len=draft_len,
                    seed=5, eos_token_id=())
  accepted, draft_lens = out.stats.accepted, out.stats.draft_lens
  live = accepted >= 0
  assert live[0].all()
  np.testing.assert_array_equal(np.where(live, accepted, -1),
                                np.where(live, draft_lens[:, None], -1))
  assert (out.lengths == max_new_tokens).all()
  if draft_len == "dynamic":  # Algorithm 1 grows by l_incre after every fully accepted step
    np.testing.assert_array_equal(draft_lens, [7, 9, 11, 13])
  else:
    assert out.stats.steps == -(-max_new_tokens // (draft_len + 1))


# -- model-free and hybrid proposers (one-hot q) ---------------------------------------------------------


# Every row serves the same prompt, so every row is every other's sibling: a few of them are looked up
# (the batch is large) with short suffixes (the texts are), and the rest of the settings at defaults.
SIBLINGS = bj.SiblingProposer(max_n=2, min_n=1, max_siblings=3, max_matches=8)


def _proposer(kind: str):
  ngram = bj.NGramProposer(max_n=2, min_n=1)  # min_n = 1: with V = 8 most rows find a match
  if kind == "replay":  # the target's greedy text at 0.9: sampled rows leave it, then the model drafts
    return bj.Replay(_models()[1], _greedy_text(), acceptance=(0.9,))
  return {"ngram": ngram, "siblings": SIBLINGS, "hybrid": bj.Hybrid(_models()[1], ngram),
          "hybrid_siblings": bj.Hybrid(_models()[1], (SIBLINGS, ngram))}[kind]


@functools.lru_cache(maxsize=None)
def _greedy_text():
  """Every row's regular greedy decode of PROMPT, as Replay's recording (half the rows: the rest
  propose the model's own drafts)."""
  target, _ = _models()
  rows = NUM_ROWS // 2
  out = bj.generate(target, None, [list(PROMPT)] * rows, method="regular", max_new_tokens=NUM_TOKENS,
                    eos_token_id=())
  return replay_text([list(PROMPT)] * rows, out.tokens, out.lengths)


@pytest.mark.parametrize("kind,temperature,top_p,seed", [("ngram", 1.0, 0.8, 31),
                                                         ("hybrid", 0.6, 0.9, 32),
                                                         ("siblings", 1.0, 0.8, 34),
                                                         ("hybrid_siblings", 0.6, 0.9, 35),
                                                         ("replay", 1.0, 0.8, 36)])
def test_lookup_and_hybrid_proposers_match_exact_target_distribution(kind, temperature, top_p, seed):
  """Deterministic drafts (one-hot q, no draft distribution at all for lookup rows: n-gram lookup in
  the row's own text, or sibling lookup in the other rows'; a replayed recording, and the model's
  drafts taken as one-hot where a row left it) keep the law exact; lookup drafts were both accepted
  and rejected, and some rows had none to propose."""
  target, _ = _models()
  out = _generate(target, _proposer(kind), "bass", temperature, top_p, seed, draft_len=3)
  drafted, accepted = out.stats.drafted, out.stats.accepted
  live = accepted >= 0
  assert (live & (drafted > 0) & (accepted > 0)).sum() > 100
  assert (live & (drafted > 0) & (accepted < drafted)).sum() > 100
  if kind in ("ngram", "siblings"):
    assert (live & (drafted == 0)).sum() > 100
  if kind == "hybrid_siblings":  # each source drafted for some rows
    assert {0, 1, 2} <= set(np.unique(out.stats.sources[live & (drafted > 0)]).tolist())
  assert_fits_target(out, temperature, top_p)


@pytest.mark.parametrize("kind", ["ngram", "siblings"])
def test_mutant_correction_with_one_hot_q_is_detected(monkeypatch, fresh_programs, kind):
  """Power of the lookup paths: a correction drawn from ``p`` (not ``p`` without the rejected draft)."""
  monkeypatch.setattr(tree_check, "correction_distribution", lambda p, q: p)
  target, _ = _models()
  out = _generate(target, _proposer(kind), "bass", 1.0, 1.0, seed=33, draft_len=3)
  p_value = chisquare_p_value(out.tokens[:, :NUM_TOKENS], _target_joint(1.0, 1.0))
  assert p_value < REJECT_P_VALUE, p_value


# -- an EAGLE feature draft (a draft vocabulary: q = 0 outside it) --------------------------------------


def _eagle_draft(draft_vocab: int) -> bj.Model:
  """A random 1-layer EAGLE draft for the tiny target, scoring ``draft_vocab`` of its VOCAB tokens."""
  from bass_jax.models import eagle, eagle_init  # pylint: disable=g-import-not-at-top

  target, _ = _models()
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=draft_vocab)
  params = eagle_init.init_draft_params(config, jax.random.key(5))
  vocab_ids = jnp.asarray([3, 0, 6, 1, 7, 2, 5, 4][:draft_vocab], jnp.int32)
  return bj.Model(config, {"draft": params, "vocab_ids": vocab_ids}, name="eagle")


@pytest.mark.parametrize("temperature,top_p,draft_len,draft_vocab,seed", [
    (1.0, 1.0, 3, 6, 41), (0.6, 0.9, SMALL_DYNAMIC, 8, 42)])
def test_eagle_draft_matches_exact_target_distribution(temperature, top_p, draft_len, draft_vocab, seed):
  """A feature draft, with a draft vocabulary smaller than the target's (FR-Spec) or the whole of it,
  keeps the law exact; its drafts were both accepted and rejected."""
  target, _ = _models()
  out = _generate(target, _eagle_draft(draft_vocab), "bass", temperature, top_p, seed,
                  draft_len=draft_len)
  paths = path_counts(out, NUM_TOKENS)
  assert paths["correction"] > 100 and paths["accepted_draft"] > 100, paths
  assert_fits_target(out, temperature, top_p)


def test_mutant_correction_with_an_eagle_draft_is_detected(monkeypatch, fresh_programs):
  """Power of the EAGLE path: a correction drawn from ``p`` instead of the residual is rejected."""
  monkeypatch.setattr(tree_check, "correction_distribution", lambda p, q: p)
  target, _ = _models()
  out = _generate(target, _eagle_draft(6), "bass", 1.0, 1.0, seed=43, draft_len=3)
  p_value = chisquare_p_value(out.tokens[:, :NUM_TOKENS], _target_joint(1.0, 1.0))
  assert p_value < REJECT_P_VALUE, p_value


# -- drafter-invariant acceptance (acceptance="gumbel") ---------------------------------------------------


@functools.lru_cache(maxsize=None)
def _regular_gumbel(temperature: float, top_p: float, seed: int) -> bj.GenerateOutput:
  target, _ = _models()
  return bj.generate(target, None, [list(PROMPT)] * NUM_ROWS, method="regular",
                     max_new_tokens=NUM_TOKENS, temperature=temperature, top_p=top_p, seed=seed,
                     eos_token_id=(), acceptance="gumbel")


@pytest.mark.parametrize("temperature,top_p,seed", [(1.0, 1.0, 51), (0.6, 0.9, 52)])
def test_gumbel_draws_match_exact_target_distribution(temperature, top_p, seed):
  """Regular decoding with Gumbel-max draws keyed by (sequence, position) samples the target's law: the
  noise differs between rows (one prompt, NUM_ROWS rows) and between a row's positions."""
  assert_fits_target(_regular_gumbel(temperature, top_p, seed), temperature, top_p)


@pytest.mark.parametrize("draft_kind,temperature,top_p,draft_len,seed", [
    ("model", 1.0, 1.0, 2, 51), ("eagle", 0.6, 0.9, SMALL_DYNAMIC, 52), ("ngram", 1.0, 1.0, 3, 51)])
def test_gumbel_bass_emits_the_regular_draws_whatever_the_draft(draft_kind, temperature, top_p,
                                                                 draft_len, seed):
  """Drafter invariance (Daliri, Musco and Suresh 2024): BASS with acceptance="gumbel" emits, row for row,
  exactly the tokens regular decoding draws with the same seed (so it is exact by the test above),
  through drafts accepted and rejected, with a far model draft, an EAGLE draft over a smaller
  vocabulary, and n-gram lookup; in a batch of NUM_ROWS / 8 rows against the first rows of one of NUM_ROWS."""
  target, far = _models()
  draft = {"model": far, "eagle": _eagle_draft(6), "ngram": _proposer("ngram")}[draft_kind]
  rows = NUM_ROWS // 8  # row i's draws are keyed by its id i: the first rows of the larger batch
  out = bj.generate(target, draft, [list(PROMPT)] * rows, method="bass",
                    max_new_tokens=NUM_TOKENS, temperature=temperature, top_p=top_p, seed=seed,
                    draft_len=draft_len, eos_token_id=(), acceptance="gumbel")
  live = out.stats.accepted >= 0
  assert (live & (out.stats.accepted > 0)).sum() > 100
  assert (live & (out.stats.accepted < out.stats.drafted)).sum() > 100
  np.testing.assert_array_equal(out.tokens, _regular_gumbel(temperature, top_p, seed).tokens[:rows])


def test_gumbel_couples_the_draft_to_the_target():
  """With the draft equal to the target, a draft drawn with the target's noise is the target's own draw:
  every draft is accepted (an uncoupled draft would match about as often as two independent draws).
  Rejection sampling accepts every draft too (``q == p``); the rule is what differs."""
  target, _ = _models()
  out = bj.generate(target, target, [list(PROMPT), [3], [0, 7, 7, 1, 6]] * 8, method="bass",
                    max_new_tokens=40, temperature=1.0, top_p=0.9, draft_len=4, seed=5,
                    eos_token_id=(), acceptance="gumbel")
  live = out.stats.accepted >= 0
  np.testing.assert_array_equal(out.stats.accepted[live], 4)


# -- token trees (generate(draft_tree=...)) ---------------------------------------------------------------


@pytest.mark.parametrize("kind,shape,temperature,top_p,seed", [
    ("model", "top_k=2,depth=2,nodes=5", 1.0, 1.0, 61),
    ("eagle", "top_k=3,depth=2,nodes=6", 0.6, 0.9, 62),
    ("hybrid", "top_k=2,depth=3,nodes=6", 1.0, 1.0, 63),
    ("ngram", "top_k=3,depth=2,nodes=6", 0.6, 0.9, 65),
    ("siblings", "top_k=2,depth=2,nodes=5", 1.0, 0.8, 66)])
def test_tree_bass_matches_exact_target_distribution(kind, shape, temperature, top_p, seed):
  """Tree steps (deterministic top-k children; a hybrid's n-gram branches beside the draft's nodes, so
  sibling tokens repeat; n-gram and sibling lookup's several continuations as branches) keep the law
  exact; paths were accepted and rejected. With the model draft the compiled decode copies no
  cache."""
  target, far = _models()
  draft = {"model": far, "eagle": _eagle_draft(6)}.get(kind) or _proposer(kind)
  out = bj.generate(target, draft, [list(PROMPT)] * NUM_ROWS, max_new_tokens=NUM_TOKENS,
                    temperature=temperature, top_p=top_p, seed=seed, eos_token_id=(),
                    draft_tree=shape)
  live = out.stats.accepted >= 0
  assert (live & (out.stats.accepted > 0)).sum() > 100
  assert (live & (out.stats.accepted == 0)).sum() > 100
  assert_fits_target(out, temperature, top_p)
  if kind == "model":  # a sampled tree step's compaction updates the caches in place
    assert_decode_copies_no_cache(target, out)


def test_mutant_tree_correction_is_detected(monkeypatch, fresh_programs):
  """Power of the tree path: a correction that keeps the rejected children's tokens is rejected."""
  monkeypatch.setattr(tree_check, "correction_distribution", lambda p, q: p)
  target, far = _models()
  out = bj.generate(target, far, [list(PROMPT)] * NUM_ROWS, max_new_tokens=NUM_TOKENS,
                    temperature=1.0, seed=64, eos_token_id=(), draft_tree="top_k=2,depth=2,nodes=5")
  p_value = chisquare_p_value(out.tokens[:, :NUM_TOKENS], _target_joint(1.0, 1.0))
  assert p_value < REJECT_P_VALUE, p_value


def test_gumbel_tree_bass_emits_the_regular_draws():
  """Drafter invariance holds for trees: the rows emit regular decoding's Gumbel-max draws."""
  target, far = _models()
  rows = NUM_ROWS // 8
  out = bj.generate(target, far, [list(PROMPT)] * rows, max_new_tokens=NUM_TOKENS, temperature=1.0,
                    seed=51, eos_token_id=(), acceptance="gumbel", draft_tree="top_k=2,depth=2,nodes=5")
  assert (out.stats.accepted > 0).sum() > 100
  np.testing.assert_array_equal(out.tokens, _regular_gumbel(1.0, 1.0, 51).tokens[:rows])


# -- a Gemma 2 pair: soft caps, alternating windows, GeGLU ---------------------------------------------


def _tiny_gemma(seed: int) -> bj.Model:
  """A 2-layer random Gemma 2 over VOCAB tokens: a sliding layer (window 2, shorter than the prompt
  plus the drafts) and a global one, both attention and final logits soft-capped."""
  config = bj.LlamaConfig(model_type="gemma2", vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=8, max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                          query_pre_attn_scalar=8, sliding_window=2,
                          layer_types=("sliding_attention", "full_attention"),
                          attn_logit_softcapping=2.0, final_logit_softcapping=4.0,
                          tie_word_embeddings=True, eos_token_id=None)
  return bj.Model(config, bj.init_params(config, jax.random.key(seed)), name=f"gemma-{seed}")


def test_a_gemma2_pair_matches_exact_target_distribution():
  """BASS with a Gemma 2 target and draft (chains of 2) fits the target's enumerated joint and is
  rejected as the draft's."""
  target, draft = _tiny_gemma(seed=2), _tiny_gemma(seed=3)
  want = exact_joint(target, PROMPT, NUM_TOKENS, 1.0, 1.0)
  law_of_draft = exact_joint(draft, PROMPT, NUM_TOKENS, 1.0, 1.0)
  assert total_variation(want, law_of_draft) > 0.3
  out = _generate(target, draft, "bass", 1.0, 1.0, seed=41, draft_len=2)
  paths = path_counts(out, NUM_TOKENS)
  assert paths["correction"] > 100 and paths["accepted_draft"] > 100, paths
  samples = out.tokens[:, :NUM_TOKENS]
  assert chisquare_p_value(samples, want) > PASS_P_VALUE
  assert chisquare_p_value(samples, law_of_draft) < REJECT_P_VALUE


# -- published draft architectures: EAGLE-3 and Medusa ---------------------------------------------------


@functools.lru_cache(maxsize=None)
def _two_layer_target() -> bj.Model:
  """A 2-layer random Llama over VOCAB tokens: an EAGLE-3 draft taps both of its layers."""
  config = bj.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          max_position_embeddings=64, eos_token_id=None)
  return bj.Model(config, bj.init_params(config, jax.random.key(8)), name="tiny-2-layers")


def _published_draft(kind: str) -> bj.Model:
  """A random EAGLE-3 draft (taps of both target layers, its own head and final norm, a draft
  vocabulary mapped to target ids out of order) or random Medusa heads (2 heads, 1 block each)."""
  from bass_jax.models import eagle, medusa  # pylint: disable=g-import-not-at-top

  target = _two_layer_target()
  rng = np.random.default_rng(9)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  if kind == "medusa":
    config = medusa.MedusaConfig(num_heads=2, num_layers=1, hidden_size=16, vocab_size=VOCAB,
                                 draft_vocab_size=VOCAB)
    params = {"blocks": {"kernel": 0.3 * normal(2, 1, 16, 16), "bias": 0.1 * normal(2, 1, 16)},
              "heads": normal(2, VOCAB, 16), "vocab_ids": jnp.arange(VOCAB, dtype=jnp.int32)}
    return bj.Model(config, params, name="medusa")
  config = eagle.EagleConfig(target.config.with_num_layers(1), VOCAB, kind="eagle3", fc_bias=False,
                             taps=(0, 1))
  draft = eagle.EagleDraft(config).init(jax.random.key(10), jnp.zeros((1, 1), jnp.int32),
                                        jnp.zeros((1, 1, 32)), jnp.zeros((VOCAB, 16)))["params"]
  draft = {**draft, "lm_head": normal(VOCAB, 16),
           "norm": {"scale": 1 + 0.2 * normal(16), "eps": jnp.float32(1e-6)}}
  vocab_ids = jnp.asarray([3, 0, 6, 1, 7, 2, 5, 4], jnp.int32)  # d2t: a permutation
  return bj.Model(config, {"draft": draft, "vocab_ids": vocab_ids}, name="eagle3")


@pytest.mark.parametrize("kind,seed", [("eagle3", 61), ("medusa", 62)])
def test_published_draft_architectures_match_exact_target_distribution(kind, seed):
  """Sampled BASS with an EAGLE-3 draft (chains of 3) or Medusa heads (chains of 2) fits the target's
  enumerated joint; both acceptance paths occur."""
  target = _two_layer_target()
  out = _generate(target, _published_draft(kind), "bass", 1.0, 1.0, seed,
                  draft_len=3 if kind == "eagle3" else 2)
  paths = path_counts(out, NUM_TOKENS)
  assert paths["correction"] > 100 and paths["accepted_draft"] > 100, paths
  samples = out.tokens[:, :NUM_TOKENS]
  joint = exact_joint(target, PROMPT, NUM_TOKENS, 1.0, 1.0)
  assert not np.any(joint[tuple(samples.T)] == 0)
  assert chisquare_p_value(samples, joint) > PASS_P_VALUE


@pytest.mark.parametrize("kind", ["eagle3", "medusa"])
def test_mutant_correction_with_a_published_draft_is_detected(kind, monkeypatch, fresh_programs):
  """Power of those paths: a correction drawn from ``p`` instead of the residual is rejected."""
  monkeypatch.setattr(tree_check, "correction_distribution", lambda p, q: p)
  target = _two_layer_target()
  out = _generate(target, _published_draft(kind), "bass", 1.0, 1.0, seed=63, draft_len=2)
  joint = exact_joint(target, PROMPT, NUM_TOKENS, 1.0, 1.0)
  assert chisquare_p_value(out.tokens[:, :NUM_TOKENS], joint) < REJECT_P_VALUE
