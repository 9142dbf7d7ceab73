"""Continuous batching (``generate(..., batch_size=)``): finished rows take waiting prompts inside the
jitted loop, and every prompt's output is what decoding it alone gives.

Greedy: every prompt's tokens equal the target's batch-1 greedy decode of that prompt (which BASS at
batch 1 equals: ``test_generate``), for both methods and every proposer,
with prompts of very different lengths and an EOS id that rows reach at different steps (or never), so
that rows are refilled at many different steps and over stale cache slots of longer earlier prompts.
The batch-1 decode runs other shapes, so a divergence is accepted only at a float near-tie
(``conftest.assert_lossless``). Sampled: a chi-square test of the first tokens of prompts that were
admitted into refilled rows, against the target's exact law (``test_sampling_exact``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.sampling import runner
from bass_jax import profiles
from conftest import PYTHON, assert_lossless, assert_reported, noisy_copy, random_eagle_draft, tiny_model
import test_sampling_exact as exact

# Prompt lengths, one per prompt (all padded to one bucket, 128, in a continuous call): the last, admitted
# into a refilled row, takes more than one chunk of the admission's prefill (the CPU profile's admit_chunk).
LENGTHS = (1, 37, 4, 19, 2, 28, 9, 13, 6, 90)
ADMIT_CHUNK = profiles.PROFILES["cpu"].admit_chunk
MAX_NEW = 24


def _prompts(vocab, lengths=LENGTHS, seed=3):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0, scale=2.5)


@pytest.fixture(scope="module")
def eos(target):
  """An EOS id that the prompts reach at different steps, and some never within MAX_NEW tokens."""
  free = bj.generate(target, None, _prompts(target.config.vocab_size), method="regular",
                     max_new_tokens=MAX_NEW, eos_token_id=())
  counts = {}
  for seq in free.sequences():
    for token in set(seq):
      counts[token] = counts.get(token, 0) + 1
  # The token reached by the most prompts without being reached by all of them.
  token = max((t for t, c in counts.items() if c < len(LENGTHS)), key=lambda t: counts[t])
  firsts = [seq.index(token) if token in seq else None for seq in free.sequences()]
  assert None in firsts and len({f for f in firsts if f is not None}) >= 3, firsts
  return int(token)


@pytest.fixture(scope="module")
def alone(target, eos):
  """The target's greedy decoding of each prompt alone (what every method and proposer must emit)."""
  return _solo(target, None, _prompts(target.config.vocab_size), method="regular",
               max_new_tokens=MAX_NEW, eos_token_id=eos)


def _draft(kind, target):
  noisy = noisy_copy(target, 0.4, 1)
  return {"regular": None, "model": noisy, "ngram": bj.NGramProposer(max_n=3, min_n=1),
          "hybrid": bj.Hybrid(noisy, bj.NGramProposer(max_n=3, min_n=1)),
          "eagle": random_eagle_draft(target)}[kind]


def _solo(target, draft, prompts, **kwargs):
  """Each prompt decoded alone (a static batch of one), as ``GenerateOutput.sequences()`` would
  list, all at the longest prompt's capacity: one program (the capacity changes no token)."""
  kwargs.setdefault("max_prompt_len", max(map(len, prompts)))
  outs = [bj.generate(target, draft, [p], **kwargs) for p in prompts]
  return types.SimpleNamespace(sequences=lambda: [o.sequences()[0] for o in outs],
                               finished=np.array([o.finished[0] for o in outs]))


# Goodput with fixed costs under which speculation pays at the prior (acceptance 0.5) and stops paying
# below about 0.25: with the noisy draft the decode mixes plain and speculative steps.
GOODPUT = bj.GoodputDraftLen(max_len=4, costs=bj.StepCosts(plain=1.0, verify_pass=1.15, propose_first=0.1,
                                                            propose_next=0.1, chunk=4))


@pytest.mark.parametrize("kind,draft_len,batch_size", [
    ("regular", None, 3), ("model", "dynamic", 3), ("model", GOODPUT, 2), ("ngram", 3, 4),
    ("hybrid", "dynamic", 3), ("eagle", 3, 2)])
def test_greedy_continuous_equals_each_prompt_alone(target, eos, alone, kind, draft_len, batch_size):
  prompts = _prompts(target.config.vocab_size)
  method = "regular" if kind == "regular" else "bass"
  kwargs = dict(method=method, max_new_tokens=MAX_NEW, eos_token_id=eos)
  if draft_len is not None:
    kwargs["draft_len"] = draft_len
  draft = _draft(kind, target)
  reported = []
  out = bj.generate(target, draft, prompts, batch_size=batch_size, on_finish=reported.append,
                    **kwargs)
  assert_reported(reported, out)  # streamed as each prompt finished, equal to the output
  assert assert_lossless(target, prompts, alone, out) == 1.0
  np.testing.assert_array_equal(out.finished, alone.finished)
  assert out.finished.any() and not out.finished.all()  # EOS at different times, and not for all

  stats = out.stats
  assert stats.continuous and stats.batch_size == batch_size
  # Every row served several prompts, one after the other, in input order of admission.
  assert (np.bincount(stats.prompt_rows) >= 2).all() and len(set(stats.prompt_rows)) == batch_size
  assert (np.diff(stats.prompt_start_steps) >= 0).all() and (stats.prompt_start_steps[batch_size:] > 0).all()
  assert max(LENGTHS[batch_size:]) - 1 > ADMIT_CHUNK  # a multi-chunk admission happened
  assert (stats.admit_seconds <= stats.first_token_seconds).all()
  assert (stats.first_token_seconds <= stats.finish_seconds).all()
  # A prompt was admitted when an earlier one finished: its wait is one of the earlier finish times
  # (the host's clock at the return after that finish).
  for i in range(batch_size, len(prompts)):
    assert stats.admit_seconds[i] >= np.sort(stats.finish_seconds[:i])[i - batch_size]
  if method == "bass":  # per-row histories; per-prompt counts partition them
    assert stats.accepted.shape == (stats.steps, batch_size)
    live = stats.accepted >= 0
    assert stats.prompt_accepted.sum() == stats.accepted[live].sum()
    assert stats.prompt_drafted.sum() == stats.drafted[live].sum()
    assert stats.prompt_steps.sum() == live.sum()
    assert (stats.prompt_steps >= -(-out.lengths // (stats.draft_lens.max() + 1))).all()
    if draft_len is GOODPUT:  # plain and speculative steps both ran, across refills
      assert (stats.draft_lens == 0).any() and (stats.draft_lens > 0).any()
  else:
    np.testing.assert_array_equal(stats.prompt_steps, out.lengths)


def test_one_program_call_without_prompt_timing(target, monkeypatch):
  """``time_prompts=False``: every refill happens inside one call of the decode program (the program
  of test_greedy_continuous_equals_each_prompt_alone[model-dynamic-3]: the EOS ids are traced)."""
  calls = []
  compiled = runner.compiled

  def counting(*args):
    (prefill, decode), seconds, source = compiled(*args)

    def counted(*a):
      calls.append(1)
      return decode(*a)

    return (prefill, counted), seconds, source

  monkeypatch.setattr(runner, "compiled", counting)
  prompts = _prompts(target.config.vocab_size)
  draft = noisy_copy(target, 0.4, 1)
  timed = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW, batch_size=3)
  timed_calls, calls[:] = len(calls), []
  reported = []
  untimed = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW, batch_size=3,
                        time_prompts=False, on_finish=reported.append)
  assert_reported(reported, untimed)  # all handed over after the one call
  assert len(calls) == 1 and timed_calls > len(prompts)
  np.testing.assert_array_equal(untimed.tokens, timed.tokens)
  assert np.isnan(untimed.stats.finish_seconds).all() and untimed.stats.wall_seconds > 0
  assert np.isnan(untimed.stats.admit_seconds[3:]).all()


@pytest.mark.parametrize("kind,draft_len", [("hybrid", "dynamic"), ("eagle", 3)])
def test_rows_that_free_up_together_are_admitted_in_one_prefill(target, eos, alone, kind, draft_len):
  """A profile admitting up to 3 rows per prefill in chunks of 16: each prompt still decodes as it
  would alone (a model draft's cache and an EAGLE feature buffer restarted for several rows at once,
  over stale slots of longer earlier prompts), and the prefills computed what the grouping implies."""
  admit_rows, chunk, batch_size = 3, 16, 3
  profile = dataclasses.replace(profiles.PROFILES["cpu"], admit_rows=admit_rows, admit_chunk=chunk)
  prompts = _prompts(target.config.vocab_size)
  out = bj.generate(target, _draft(kind, target), prompts, draft_len=draft_len, max_new_tokens=MAX_NEW,
                    eos_token_id=eos, batch_size=batch_size, profile=profile)
  assert assert_lossless(target, prompts, alone, out) == 1.0
  np.testing.assert_array_equal(out.finished, alone.finished)
  stats = out.stats
  assert (stats.admit_rows, stats.admit_chunk) == (admit_rows, chunk)
  # The later prompts, in admission order, grouped by the step that admitted them: a refill admits
  # its k prompts in ceil(k / 3) prefills of 3 rows (spare rows included, cut to one token), each as
  # many chunks as its longest admitted prompt needs.
  starts = stats.prompt_start_steps
  if kind == "hybrid":  # here (greedy, so always) rows free up in one step: a prefill of 2 or 3 rows
    assert any(np.sum(starts[batch_size:] == step) >= 2 for step in set(starts[batch_size:])), starts
  expected, i = 0, batch_size
  while i < len(prompts):
    n = min(admit_rows, int(np.sum(starts[i:] == starts[i])))
    longest = max(LENGTHS[i:i + n])
    expected += admit_rows * -(-(longest - 1) // chunk) * chunk
    i += n
  assert stats.admitted_positions == expected


def test_the_admission_benchmark_prints_a_row_per_setting():
  repo = pathlib.Path(__file__).resolve().parents[1]
  run = subprocess.run([PYTHON, "-m", "experiments.benchmarks.bench_admission",
                        "--target=smollm2-135m-draft", "--draft=ngram", "--num_prompts=4",
                        "--batch_size=2", "--admit_rows=1,2", "--admit_chunks=8", "--max_new_tokens=4",
                        "--repeats=1"], cwd=repo, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| 1 |")
          or line.startswith("| 2 |")]
  assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 8), (2, 8)], run.stdout
  positions = [int(r[4]) for r in rows]
  # Two prompts wait for two rows: a prefill of 2 computes at least what one-row prefills do (the
  # exact count is checked in test_rows_that_free_up_together_are_admitted_in_one_prefill).
  assert 0 < positions[0] <= positions[1], run.stdout


def test_batch_size_at_least_the_prompts_is_a_static_batch(target):
  prompts = _prompts(target.config.vocab_size, (5, 11, 2))
  draft = noisy_copy(target, 0.4, 1)
  static = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW)
  for batch_size in (3, 8):
    out = bj.generate(target, draft, prompts, max_new_tokens=MAX_NEW, batch_size=batch_size)
    assert not out.stats.continuous and out.stats.batch_size == 3
    np.testing.assert_array_equal(out.tokens, static.tokens)
    np.testing.assert_array_equal(out.stats.accepted, static.stats.accepted)


@pytest.mark.parametrize("chunk", [3, 8, 64])
def test_chunked_prefill_equals_one_pass(target, chunk):
  """An admitted row's prefill runs in chunks up to its true length; the valid cache slots and features
  equal those of one pass over the padded prompts."""
  from bass_jax.models.common import prefill_cache  # pylint: disable=g-import-not-at-top

  lengths = np.array([1, 6, 17, 9], np.int32)
  prompts = np.zeros((4, 32), np.int32)
  for b, row in enumerate(_prompts(target.config.vocab_size, lengths)):
    prompts[b, :len(row)] = row
  run = lambda c: prefill_cache(target.config, target.params, jnp.asarray(prompts), jnp.asarray(lengths),
                                cache_len=48, return_features=True, chunk=c)
  (whole, whole_features), (chunked, chunked_features) = run(None), jax.jit(run, static_argnums=0)(chunk)
  np.testing.assert_array_equal(chunked.lengths, lengths - 1)
  for b, n in enumerate(lengths - 1):
    for got, want in zip(chunked.k + chunked.v, whole.k + whole.v):
      np.testing.assert_allclose(got[b, :, :n], want[b, :, :n], rtol=1e-4, atol=2e-4)
    np.testing.assert_allclose(chunked_features[b, :n], whole_features[b, :n], rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, "2", True])
def test_bad_batch_size_is_named(target, batch_size):
  with pytest.raises(ValueError, match="batch_size"):
    bj.generate(target, None, [[1, 2], [3]], method="regular", max_new_tokens=4, batch_size=batch_size)


def test_a_real_model_continuous_equals_each_prompt_alone():
  """A trained model with its real tokenizer (the shipped 2-layer SmolLM2 draft as the target, its
  first layer as the draft: the mechanics need real text, not SmolLM2's size), both methods: prompts
  of 8 to about 90 tokens (the longest admitted last, into a refilled row, in more than one prefill
  chunk), and a newline-and-indent token as EOS, which rows reach at different steps (or not within
  the limit). The reference is the target's own greedy decoding of each prompt alone."""
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  target = bj.load_model("smollm2-135m-draft")
  texts = [p.prompt for p in load_problems("stdlib-heldout", 4)]
  texts = ["def add(a, b):", texts[0][:40], texts[3][:30], "\n".join(texts)]
  prompts = [target.tokenizer(t).input_ids for t in texts]
  assert len(prompts[-1]) - 1 > ADMIT_CHUNK and len(prompts[-1]) > 6 * min(map(len, prompts))
  indent, = target.tokenizer("\n   ").input_ids  # a newline and an indent: one token
  kwargs = dict(max_new_tokens=16, eos_token_id=indent)
  solo = _solo(target, None, prompts, method="regular", **kwargs)
  assert solo.finished.any() and not solo.finished.all()
  assert len({len(s) for s in solo.sequences()}) >= 3
  draft = bj.load_draft("smollm2-135m-draft", target, num_layers=1)
  for method, batch_size in (("regular", 2), ("bass", 1)):
    out = bj.generate(target, draft, prompts, method=method, batch_size=batch_size, **kwargs)
    assert assert_lossless(target, prompts, solo, out) == 1.0
    np.testing.assert_array_equal(out.finished, solo.finished)
    assert out.stats.continuous and (out.stats.prompt_start_steps[batch_size:] > 0).all()


# -- sampled: a refilled row draws from the target's exact law -------------------------------------------


OTHER = (6, 0, 4, 4, 2, 7, 1)  # a longer prompt that leaves stale cache slots behind in its row


def test_sampled_refilled_rows_match_exact_target_distribution():
  target, draft = exact._models()
  prompts = [list(exact.PROMPT), list(OTHER)] * 3000
  out = bj.generate(target, draft, prompts, method="bass", max_new_tokens=exact.NUM_TOKENS,
                    temperature=1.0, top_p=0.8, draft_len=3, seed=41, eos_token_id=(),
                    batch_size=16, time_prompts=False)
  assert (out.lengths == exact.NUM_TOKENS).all()
  refilled = (out.stats.prompt_start_steps > 0) & (np.arange(len(prompts)) % 2 == 0)
  assert refilled.sum() > 2900
  samples = out.tokens[refilled, :exact.NUM_TOKENS]
  joint = exact._target_joint(1.0, 0.8)
  assert not np.any(joint[tuple(samples.T)] == 0), "a draw outside the target's nucleus"
  assert exact.chisquare_p_value(samples, joint) > exact.PASS_P_VALUE
  # Power: the same draws are far from the draft's own law.
  assert exact.chisquare_p_value(samples, exact._draft_joint(1.0, 0.8)) < exact.REJECT_P_VALUE


def test_gumbel_sequences_do_not_depend_on_draft_batch_or_queue(target, eos):
  """acceptance="gumbel": a sequence's sampled tokens are a function of the seed, its sequence id and the
  target. A continuous batch of 3 rows, and one whose queue holds only some of the prompts, in
  another order (with their own ids, as a resumed run decodes them; the same program), emit what
  regular decoding draws; rejection sampling, whose draws are keyed by step, does not (the property
  is not trivial)."""
  prompts = _prompts(target.config.vocab_size)
  kwargs = dict(max_new_tokens=MAX_NEW, temperature=0.8, top_p=0.95, seed=9, eos_token_id=eos,
                acceptance="gumbel")
  reference = bj.generate(target, None, prompts, method="regular", **kwargs).sequences()
  assert len({len(s) for s in reference}) >= 3  # rows end at different steps
  # (Static batches of the model, EAGLE and n-gram drafts: test_sampling_exact.)
  out = bj.generate(target, _draft("model", target), prompts, batch_size=3, **kwargs)
  assert out.sequences() == reference
  some = [7, 2, 9, 4, 0, 8, 1, 6, 3]  # the longest prompt (9) now in a first row, not admitted last
  part = bj.generate(target, _draft("model", target), [prompts[i] for i in some], batch_size=3,
                     sequence_ids=some, **kwargs)
  assert part.sequences() == [reference[i] for i in some]
  rejection = bj.generate(target, _draft("model", target), prompts, **{**kwargs,
                                                                       "acceptance": "rejection"})
  assert rejection.sequences() != reference


@pytest.mark.parametrize("bad,message", [
    (dict(acceptance="coupled"), "acceptance must be one of"),
    (dict(sequence_ids=[0, 1]), "sequence_ids has 2 ids for 3 prompts"),
    (dict(sequence_ids=[0, 1, 1]), "sequence_ids repeats [1]"),
    (dict(sequence_ids=[0, 1, 2**32]), "sequence_ids[2]"),
])
def test_bad_acceptance_arguments_are_named(target, bad, message):
  with pytest.raises(ValueError) as error:
    bj.generate(target, None, [[1], [2], [3]], method="regular", max_new_tokens=2, temperature=1.0,
                **bad)
  assert message in str(error.value)
