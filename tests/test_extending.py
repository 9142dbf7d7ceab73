"""docs/extending.md, run: a user's own proposer reaches ``generate`` without editing the library, and
the decode stays exact with it (greedy equality with regular decoding, and the chi-square test of
tests/test_sampling_exact.py, whose power against a broken correction step is shown with it too); a
proposer with weights passed as ``(proposer, params)`` reuses its program for new weights."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax import sharding
from bass_jax.sampling import acceptance, compile_cache
from bass_jax.sampling.proposers import ModelProposer
from conftest import tiny_model
import test_sampling_exact as exact
from test_sampling_exact import fresh_programs  # pylint: disable=unused-import  # a fixture

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _examples(heading: str) -> list[str]:
  """The ``python`` code blocks of the section of docs/extending.md under ``## heading``."""
  section = DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def repeat_last():
  """The page's proposer class, defined by running the page's first example."""
  namespace = {}
  exec(compile(_examples("Your own proposer")[0], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  return namespace["RepeatLast"]


def _prompts():
  rng = np.random.default_rng(4)
  return [rng.integers(0, 61, n).tolist() for n in (5, 11, 3)]


def test_the_pages_call_runs_and_greedy_decoding_emits_regular_decodings_tokens(repeat_last):
  target = tiny_model(0, scale=2.5)
  namespace = {"bj": bj, "RepeatLast": repeat_last, "target": target, "prompts": _prompts()}
  exec(compile(_examples("Your own proposer")[1], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["out"].tokens.shape == (3, 64)
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=48)
  own = bj.generate(target, repeat_last(times=3), _prompts(), max_new_tokens=48)
  np.testing.assert_array_equal(own.tokens, regular.tokens)
  live = own.stats.accepted >= 0
  assert (live & (own.stats.accepted > 0)).sum() > 0  # some drafts accepted ...
  assert (live & (own.stats.accepted < own.stats.drafted)).sum() > 0  # ... and some rejected
  assert set(np.unique(own.stats.sources[live & (own.stats.drafted > 0)]).tolist()) == {1}  # "ngram"


def test_a_class_without_a_source_file_keeps_its_programs_in_memory_only(repeat_last):
  """The page's claim: a proposer defined where no source file holds it (here exec'd, as a notebook
  cell is) has no key in the persistent cache; one from a file does."""
  assert compile_cache.setting_key(("spec", repeat_last())) is None
  assert compile_cache.setting_key(("spec", NextTable())) is not None


def test_the_proposer_keeps_the_targets_law(repeat_last):
  target, _ = exact._models()  # pylint: disable=protected-access
  out = exact._generate(target, repeat_last(times=2), "bass", 0.8, 0.9, seed=61, draft_len=3)  # pylint: disable=protected-access
  live = out.stats.accepted >= 0
  assert (live & (out.stats.accepted > 0)).sum() > 100
  assert (live & (out.stats.accepted < out.stats.drafted)).sum() > 100
  exact.assert_fits_target(out, 0.8, 0.9)


def test_a_broken_correction_step_is_detected_with_the_proposer(monkeypatch, fresh_programs,  # pylint: disable=redefined-outer-name
                                                                 repeat_last):
  del fresh_programs
  monkeypatch.setattr(acceptance, "correction_distribution", lambda p, q: p)
  target, _ = exact._models()  # pylint: disable=protected-access
  out = exact._generate(target, repeat_last(times=2), "bass", 1.0, 1.0, seed=62, draft_len=3)  # pylint: disable=protected-access
  p_value = exact.chisquare_p_value(out.tokens[:, :exact.NUM_TOKENS], exact._target_joint(1.0, 1.0))  # pylint: disable=protected-access
  assert p_value < exact.REJECT_P_VALUE, p_value


@dataclasses.dataclass(frozen=True)
class NextTable(bj.Proposer):
  """Drafts by a table of weights: each draft is ``params["next"][previous token]``."""

  source = "model"

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    token = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    drafts = []
    for _ in range(max_len):
      token = params["next"][token]
      drafts.append(token)
    count = jnp.where(ctx.live, ctx.draft_len, 0)
    return state, bj.Proposal(drafts=jnp.stack(drafts, axis=1), num_drafts=count, log_q=None)


def test_a_proposer_with_weights_decodes_exactly_and_new_weights_compile_nothing():
  target = tiny_model(0, scale=2.5)
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=24)
  # The table of the target's own greedy successors: drafts that are often right.
  greedy_next = np.asarray(jnp.argmax(target.logits(jnp.arange(61)[:, None])[:, -1], -1), np.int32)
  params = {"next": jnp.asarray(greedy_next)}
  good = bj.generate(target, (NextTable(), params), _prompts(), max_new_tokens=24, draft_len=3)
  np.testing.assert_array_equal(good.tokens, regular.tokens)
  built = compile_cache.stats().built
  shuffled = {"next": jnp.asarray(np.random.default_rng(0).permutation(61).astype(np.int32))}
  bad = bj.generate(target, (NextTable(), shuffled), _prompts(), max_new_tokens=24, draft_len=3)
  np.testing.assert_array_equal(bad.tokens, regular.tokens)
  assert compile_cache.stats().built == built  # weights are traced: the same program
  assert good.stats.accepted.clip(0).sum() > bad.stats.accepted.clip(0).sum()


def test_what_a_proposer_cannot_be_passed_as():
  target = tiny_model(0)
  model_proposer = ModelProposer(target.config, "float32", "reference")
  with pytest.raises(ValueError, match="pass the draft bass_jax.Model itself"):
    bj.generate(target, model_proposer, _prompts(), max_new_tokens=4)
  with pytest.raises(ValueError, match="or your own bass_jax.Proposer"):
    bj.generate(target, object(), _prompts(), max_new_tokens=4)
  with pytest.raises(ValueError, match="carries its draft model: pass it alone"):
    bj.generate(target, (bj.Hybrid(tiny_model(1), bj.NGramProposer()), None), _prompts(),
                max_new_tokens=4)
  mesh = sharding.make_mesh(1, 1)
  with pytest.raises(ValueError, match="no sharding plan"):
    bj.generate(target, (NextTable(), {"next": jnp.zeros(61, jnp.int32)}), _prompts(),
                max_new_tokens=4, mesh=mesh)
