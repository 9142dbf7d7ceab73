"""`generate`: greedy BASS is lossless against regular decoding, rows stop independently, bad input fails.

Greedy speculative decoding must emit exactly the target's greedy tokens. The two methods run the
target at different shapes (one token vs ``l_draft + 1`` tokens per forward), so float rounding can
differ in the last bits; a divergence is only legitimate where the target's two best logits are that
close. `assert_lossless` (conftest) therefore requires identical tokens, or a first divergence at a
near-tie, and reports the exact-match rate.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.evaluation import experiment
from bass_jax.evaluation.data import Problem
from conftest import (PYTHON, assert_decode_copies_no_cache, assert_lossless, assert_reported,
                      last_decode_program, noisy_copy, tiny_model)



def _prompts(vocab, lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0, scale=2.5)


@pytest.mark.parametrize("draft_kind", ["noisy", "self", "unrelated"])
@pytest.mark.parametrize("draft_len", [1, 3, "dynamic"])
def test_greedy_bass_equals_regular(target, draft_kind, draft_len):
  draft = {"noisy": noisy_copy(target, 0.4, 1), "self": target,
           "unrelated": tiny_model(seed=9, scale=2.5, num_hidden_layers=1)}[draft_kind]
  prompts = _prompts(target.config.vocab_size, (1, 5, 12, 30, 7))
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=40)
  if draft_kind == "noisy" and draft_len == 1:  # regular decoding's caches are updated in place
    assert_decode_copies_no_cache(target, regular)
  bass = bj.generate(target, draft, prompts, method="bass", max_new_tokens=40, draft_len=draft_len)
  assert assert_lossless(target, prompts, regular, bass) == 1.0
  np.testing.assert_allclose(bass.logprobs, regular.logprobs, atol=1e-4)
  assert (bass.lengths == 40).all() and not bass.finished.any()
  accepted = bass.stats.accepted
  assert accepted.shape == (bass.stats.steps, len(prompts)) and accepted.max() <= 32
  if draft_kind == "self":  # the target as its own draft accepts everything
    live = accepted >= 0
    assert (accepted[live] == np.broadcast_to(bass.stats.draft_lens[:, None], accepted.shape)[live]).all()
  if draft_kind == "noisy":  # both paths exercised: some rejections and some full acceptances
    assert (accepted == 0).any() and (accepted > 0).any()


def test_dynamic_draft_len_follows_algorithm_1(target):
  """The default draft length is Algorithm 1: its lengths replay step by step on the recorded
  acceptances. The prompts, the draft configs and the output buckets are those of
  test_greedy_bass_equals_regular[dynamic-*], so both calls run its programs."""
  prompts = _prompts(target.config.vocab_size, (1, 5, 12, 30, 7))
  # 64 tokens, the output bucket of the greedy test's 40: steps 1-3 emit 8 + 10 + 12 tokens, step 4
  # needs room for 13 + 1.
  out = bj.generate(target, target, prompts, max_new_tokens=64)
  assert out.stats.draft_lens[:4].tolist() == [7, 9, 11, 13]  # all accepted: +2 per step
  out = bj.generate(target, tiny_model(seed=5, num_hidden_layers=1), prompts, max_new_tokens=40)
  policy = bj.DynamicDraftLen()
  length, s = policy.initial()
  grew = set()
  for step, l in enumerate(out.stats.draft_lens):  # replay the heuristic on the recorded acceptances
    assert l == length
    live = out.stats.accepted[step] >= 0
    most = int(out.stats.accepted[step][live].max())
    grew.add(most == int(length))
    length, s = policy.update(length, s, most)
  assert grew == {True, False}  # the replay took both of the heuristic's branches


def test_rows_stop_at_eos_independently(target):
  prompts = _prompts(target.config.vocab_size, (3, 8, 15), seed=4)
  free = bj.generate(target, None, prompts, method="regular", max_new_tokens=30, eos_token_id=())
  eos = free.tokens[0, 6]  # a token row 0 emits at step 7
  first = [list(row).index(eos) if eos in row else None for row in free.sequences()]
  for method, draft in (("regular", None), ("bass", noisy_copy(target, 0.4, 2))):
    reported = []
    out = bj.generate(target, draft, prompts, method=method, max_new_tokens=30, eos_token_id=int(eos),
                      draft_len=4, on_finish=reported.append)
    assert_reported(reported, out)  # each row handed over as it stopped, equal to the output
    for b in range(len(prompts)):
      if first[b] is None:
        assert out.lengths[b] == 30 and not out.finished[b]
      else:
        assert out.lengths[b] == first[b] + 1 and out.finished[b]
      n = out.lengths[b]
      assert out.tokens[b, :n].tolist() == free.tokens[b, :n].tolist()
      assert (out.tokens[b, n:] == bj.PAD_TOKEN).all() and (out.logprobs[b, n:] == 0).all()


def test_inert_padding_rows_change_nothing(target):
  """A batch of 3 runs as 4 rows; the padding row emits nothing and the real rows equal decoding
  each prompt alone. The BASS call's setting (4 rows, prompt bucket 16, output bucket 32, a draft of
  the target's config, draft_len=4) is test_rows_stop_at_eos_independently's: it runs that
  program."""
  prompts = _prompts(target.config.vocab_size, (4, 11, 6), seed=8)
  draft = noisy_copy(target, 0.4, 6)
  together = bj.generate(target, draft, prompts, max_new_tokens=16, draft_len=4)
  assert together.tokens.shape == (3, 16) and together.stats.accepted.shape[1] == 3
  for i, prompt in enumerate(prompts):
    alone = bj.generate(target, None, [prompt], method="regular", max_new_tokens=16)
    assert together.sequences()[i] == alone.sequences()[0]


@pytest.mark.parametrize("tree", [None, "top_k=2,depth=3,nodes=6"])
def test_the_compiled_decode_keeps_eagle3_taps_in_place(target, tree):
  """An EAGLE-3 draft reads the hidden states of tapped target layers: the decode keeps them for every
  position in a feature buffer ``[B, P + N, taps x E]`` that each target forward writes, in place like
  the caches: the compiled program holds no copy of it (chains and trees), and BASS emits regular
  decoding's tokens."""
  import re

  from bass_jax.models import eagle
  from bass_jax.sampling import plan
  from bass_jax.training import feature_draft

  layer = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40).layer
  config = eagle.EagleConfig(layer, 40, kind="eagle3", fc_bias=False, taps=(0, 1))
  vocab = np.random.default_rng(2).permutation(target.config.vocab_size).astype(np.int32)
  params = feature_draft.initial_params(config, jax.random.key(7), target.config, target.params, vocab)
  draft = bj.Model(config, {"draft": params, "vocab_ids": jnp.asarray(vocab[:40])}, name="eagle3")
  prompts = _prompts(target.config.vocab_size, (3, 9, 6), seed=3)
  kwargs = {"draft_tree": tree} if tree else {"draft_len": 3}
  out = bj.generate(target, draft, prompts, max_new_tokens=10, **kwargs)
  # The call's programs are the LRU's most recently used entry (the cache is not cleared: the
  # regular call below runs test_rows_stop_at_eos_independently's regular program, 4 rows, output
  # bucket 32).
  decode = last_decode_program()
  hlo = decode.as_text()
  assert out.stats.compiled
  width, rows = 2 * target.config.hidden_size, out.stats.batch_bucket
  length = plan.prompt_bucket(9) + plan.output_bucket(10)  # the buffer holds prompt and output, P + N
  buffer = rf"f32\[{rows},{length},{width}\]"
  assert re.search(buffer, hlo), "no [B, P + N, taps x E] buffer in the program: fix the test"
  copies = [line.strip() for line in hlo.splitlines() if re.search(rf"= {buffer}\S* copy(-start)?\(", line)]
  assert not copies, copies[:3]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=10)
  assert out.sequences() == regular.sequences()


def test_bad_input_is_rejected_with_a_clear_error(target):
  draft = tiny_model(seed=4)
  ok = _prompts(target.config.vocab_size, (3,))
  cases = [
      (dict(prompts=[]), "at least one prompt"),
      (dict(prompts=[[1, 2], []]), "prompt 1 is empty"),
      (dict(prompts=[[1, 61]]), "outside"),
      (dict(prompts="hello"), "token-id lists"),
      (dict(max_new_tokens=0), "max_new_tokens"),
      (dict(temperature=-0.1), "temperature"),
      (dict(temperature=float("nan")), "temperature"),
      (dict(top_p=0.0), "top_p"),
      (dict(top_p=1.5), "top_p"),
      (dict(method="beam"), "method"),
      (dict(draft=None), "needs a draft"),
      (dict(draft=tiny_model(seed=4, vocab_size=60)), "vocabulary"),
      (dict(draft_len=0), "draft length"),
      (dict(draft_len="sometimes"), "draft_len"),
      (dict(verify_chunk=2.0), "verify_chunk"),
      (dict(attention_impl="flash"), "attention_impl"),
      (dict(max_new_tokens=2046), "context"),
      (dict(max_cache_len=20), "max_cache_len"),
      (dict(eos_token_id=99), "eos_token_id"),
  ]
  for override, match in cases:
    kw = dict(prompts=ok, draft=draft, method="bass", max_new_tokens=8)
    kw.update(override)
    with pytest.raises(ValueError, match=match):
      bj.generate(target, kw.pop("draft"), kw.pop("prompts"), **kw)


def test_run_problems_rejects_an_empty_batch(target):
  with pytest.raises(ValueError, match="batch_size"):
    experiment.run_problems(target, None, [Problem("t", "x")], batch_size=0, method="regular")


def test_calls_within_the_same_buckets_share_programs(target):
  """Batch, prompt length and max_new_tokens inside their buckets, EOS ids, temperature, top_p below 1
  and seed are traced or padded: a later call reuses the first one's programs; whether there is a
  nucleus at all (top_p < 1) is compiled in; clearing empties the cache; the LRU is bounded and
  keeps the most recently used setting. That setting (the first call's) stays in memory for
  test_sampling_is_reproducible_and_seeded, next, and for
  test_the_step_phases_name_the_compiled_decodes_ops; its decode copies no cache."""
  from bass_jax.sampling import programs

  bj.clear_compile_cache()
  assert len(programs._PROGRAMS) == 0  # pylint: disable=protected-access
  draft = noisy_copy(target, 0.4, 5)
  prompts = _prompts(target.config.vocab_size, (3, 9, 5))
  first = bj.generate(target, draft, prompts, max_new_tokens=20, temperature=0.7, top_p=0.9, seed=1)
  assert first.stats.compiled and first.stats.batch_bucket == 4
  assert_decode_copies_no_cache(target, first)  # a sampled chain's caches are updated in place
  assert bj.generate(target, draft, prompts, max_new_tokens=20, temperature=0.7,
                     top_p=1.0).stats.compiled  # no nucleus: a program without one
  assert bj.generate(target, draft, prompts[:1], max_new_tokens=20,
                     temperature=0.7).stats.compiled  # batch bucket 1: a new program
  again = bj.generate(target, draft, _prompts(target.config.vocab_size, (14, 2, 7, 11), seed=3),
                      max_new_tokens=29, temperature=1.3, top_p=0.6, seed=2, eos_token_id=[5, 6])
  assert not again.stats.compiled and again.stats.compile_seconds == 0
  assert again.tokens.shape == (4, 29) and (again.lengths <= 29).all()
  size = programs._PROGRAMS.max_size  # pylint: disable=protected-access
  bj.set_compile_cache_size(1)
  try:
    assert len(programs._PROGRAMS) == 1  # pylint: disable=protected-access
    assert not bj.generate(target, draft, prompts, max_new_tokens=20, temperature=0.7, top_p=0.9,
                           seed=1).stats.compiled  # the most recently used setting stayed
  finally:
    bj.set_compile_cache_size(size)


def test_sampling_is_reproducible_and_seeded(target):
  """The same seed draws the same tokens, another seed others. The setting (3 prompts in 4 rows,
  output bucket 32, temperature > 0, top_p < 1, the default draft length) is the one
  test_calls_within_the_same_buckets_share_programs leaves in memory: it runs that program."""
  prompts = _prompts(target.config.vocab_size, (3, 6, 5))
  draft = noisy_copy(target, 0.4, 3)
  kw = dict(method="bass", max_new_tokens=20, temperature=0.8, top_p=0.9)
  a = bj.generate(target, draft, prompts, seed=1, **kw)
  b = bj.generate(target, draft, prompts, seed=1, **kw)
  c = bj.generate(target, draft, prompts, seed=2, **kw)
  assert np.array_equal(a.tokens, b.tokens) and not np.array_equal(a.tokens, c.tokens)


def test_verification_in_chunks_equals_one_pass(target):
  """Scoring l + 1 positions in several chunk passes accepts exactly what one pass accepts."""
  prompts = _prompts(target.config.vocab_size, (2, 9, 17, 5))
  draft = noisy_copy(target, 0.05, 7)  # accepts often, so long drafts need several passes
  one = bj.generate(target, draft, prompts, max_new_tokens=40, draft_len=12, verify_chunk=13)
  assert_decode_copies_no_cache(target, one)  # a greedy chain's caches are updated in place
  many = bj.generate(target, draft, prompts, max_new_tokens=40, draft_len=12, verify_chunk=3)
  assert assert_lossless(target, prompts, one, many) == 1.0
  assert (one.stats.verified == 13).all()
  assert set(many.stats.verified) <= {3, 6, 9, 12, 15} and many.stats.verified.max() >= 6
  assert (one.stats.accepted.max() >= 4)  # several chunks were needed for some rows


def test_the_persistent_compilation_cache_serves_a_new_process(tmp_path):
  """Two processes decode the same setting with the cache on: the first writes programs, the second
  finds them (it writes nothing new)."""
  import os
  import subprocess

  script = (
      "import sys, numpy as np, bass_jax as bj; sys.path.insert(0, 'tests')\n"
      "from conftest import tiny_model\n"
      f"bj.enable_persistent_compilation_cache({str(tmp_path / 'xla')!r}, min_compile_seconds=0)\n"
      "t = tiny_model(seed=0)\n"
      "out = bj.generate(t, t, [[1, 2, 3]], max_new_tokens=8, draft_len=2)\n"
      "print(out.sequences())\n")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = lambda: subprocess.run([PYTHON, "-c", script], cwd=repo, capture_output=True,
                               text=True, timeout=300)
  first = run()
  assert first.returncode == 0, first.stderr[-2000:]
  entries = sorted(p.name for p in (tmp_path / "xla").iterdir())
  assert len(entries) >= 2  # the prefill and the decode program
  second = run()
  assert second.returncode == 0 and second.stdout == first.stdout
  assert sorted(p.name for p in (tmp_path / "xla").iterdir()) == entries


def test_the_step_phases_name_the_compiled_decodes_ops(target):
  """Each of step.STEP_SCOPES leads the op names of the work it traced, so a profiler's trace groups
  a step's kernels by phase: the target's matmuls under target_forward, the draft's under propose.

  The setting is the first of test_calls_within_the_same_buckets_share_programs: the call finds
  its programs in memory (or compiles them, run alone), and they are then the most recently used
  entry of the LRU."""
  import re

  from bass_jax.sampling.step import STEP_SCOPES

  bj.generate(target, noisy_copy(target, 0.4, 5), _prompts(target.config.vocab_size, (3, 9, 5)),
              max_new_tokens=20, temperature=0.7, top_p=0.9, seed=1)
  decode = last_decode_program()
  names = re.findall(r'op_name="([^"]*)"', decode.as_text())
  for scope in STEP_SCOPES:
    assert any(f"/{scope}/" in name for name in names), scope
  dots = [name for name in names if name.endswith("dot_general")]
  assert dots and all(re.search(r"/(target_forward|propose)/", name) for name in dots
                      if "/self_attn/" in name or "/mlp/" in name), dots[:5]


def test_scanned_layers_decode_what_unrolled_layers_decode(target):
  """A target and a draft with scanned layers (weights stacked [L, ...], one stacked cache each, a
  lax.scan over layers) emit the unrolled models' tokens: a chain with a model draft, a continuous
  batch and a token tree with an EAGLE draft (whose own layers stay unrolled). The compiled chain
  decode holds no copy of a stacked cache; a mesh is refused."""
  from conftest import random_eagle_draft

  draft, eagle = noisy_copy(target, 0.4, 5), random_eagle_draft(target)
  scanned, scanned_draft = target.with_scanned_layers(), draft.with_scanned_layers()
  assert scanned.scanned_layers and scanned.with_scanned_layers(False).scanned_layers is False
  prompts = _prompts(target.config.vocab_size, (3, 9, 5, 12, 7), seed=4)
  cases = [((draft, scanned_draft), dict(draft_len=3)),
           ((eagle, eagle), dict(draft_len=2, batch_size=2)),
           ((eagle, eagle), dict(draft_tree="top_k=2,depth=3,nodes=6"))]
  for i, ((unrolled_draft, scanned_side), kwargs) in enumerate(cases):
    bj.clear_compile_cache()
    want = bj.generate(target, unrolled_draft, prompts, max_new_tokens=12, **kwargs)
    got = bj.generate(scanned, scanned_side, prompts, max_new_tokens=12, **kwargs)
    assert got.sequences() == want.sequences(), kwargs
    np.testing.assert_array_equal(got.stats.accepted, want.stats.accepted)
    if i == 0:
      assert_decode_copies_no_cache(scanned, got)
  mesh = jax.make_mesh((1, 1), ("data", "model"))
  with pytest.raises(ValueError, match="scanned layers do not run sharded"):
    bj.generate(scanned, scanned_draft, prompts, mesh=mesh, max_new_tokens=4)
