"""docs/extending.md, run: a user's own proposer reaches ``generate`` without editing the library, and
the decode stays exact with it (greedy equality with regular decoding, and the chi-square test of
tests/test_sampling_exact.py, whose power against a broken correction step is shown with it too); a
proposer with weights passed as ``(proposer, params)`` reuses its program for new weights; a registered
proposer is named by draft specs, an unregistered one by its import path, and either stands in a
``Hybrid`` in front of a draft model, exactly. A user's own acceptance rule reaches ``generate`` by
instance, registered name and import path, and keeps the target's law under the same chi-square test,
which rejects a mutant of it. A Llama-like family registered with one Traits row (Ministral) loads with
transformers' logits, decodes greedy BASS as regular decoding, and saves as transformers reads it. A
user's attention implementation, registered by strategy and backend, equals the reference attention
without reading a padded slot, decodes the reference's tokens, and is found by its strategy."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import re
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax import preflight, sharding
from bass_jax.evaluation import reproduce
from bass_jax.models import attention_registry, family, llama
from bass_jax.models.attention import reference_attention
from bass_jax.sampling import acceptance, compile_cache, drafts, tree_check
from bass_jax.sampling.proposers import ModelProposer
from conftest import PYTHON, noisy_copy, tiny_model
import test_sampling_exact as exact
from test_sampling_exact import fresh_programs  # pylint: disable=unused-import  # a fixture

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "extending.md"
# A prompt ending in a run: RepeatLast drafts on every row's first step, so a broken correction step
# shows in most rows (after exact.PROMPT, ending in one 2, it drafts only where the first token is 2).
RUN_PROMPT = (1, 5, 5)


def _examples(heading: str) -> list[str]:
  """The ``python`` code blocks of the section of docs/extending.md under ``## heading``."""
  section = DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.S)


def _page_module(tmp_path: pathlib.Path, monkeypatch, name: str, *blocks: str) -> None:
  """The page's code ``blocks`` saved as module ``name`` on ``sys.path``, as a user's module that a
  script imports by its path (``py:<name>.<Class>``)."""
  (tmp_path / f"{name}.py").write_text("\n\n".join(blocks))
  monkeypatch.syspath_prepend(str(tmp_path))


def _kind(name: str):
  """The registered proposer kind ``name`` (``bj.proposer_kinds()``)."""
  return {k.name: k for k in bj.proposer_kinds()}[name]


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
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=24)
  own = bj.generate(target, repeat_last(times=3), _prompts(), max_new_tokens=24)
  np.testing.assert_array_equal(own.tokens, regular.tokens)
  live = own.stats.accepted >= 0
  assert (live & (own.stats.accepted > 0)).sum() > 0  # some drafts accepted ...
  assert (live & (own.stats.accepted < own.stats.drafted)).sum() > 0  # ... and some rejected
  assert set(np.unique(own.stats.sources[live & (own.stats.drafted > 0)]).tolist()) == {1}  # "ngram"


def test_a_class_without_a_source_file_keeps_its_programs_in_memory_only(repeat_last, tmp_path,
                                                                          monkeypatch):
  """The page's claim: a proposer defined where no source file holds it (here exec'd, as a notebook
  cell is) has no key in the persistent cache; the same class from a file has one."""
  assert compile_cache.setting_key(("spec", repeat_last())) is None
  _page_module(tmp_path, monkeypatch, "my_filed_proposers", _examples("Your own proposer")[0])
  filed = importlib.import_module("my_filed_proposers").RepeatLast
  assert compile_cache.setting_key(("spec", filed())) is not None


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
  monkeypatch.setattr(tree_check, "correction_distribution", lambda p, q: p)
  target, _ = exact._models()  # pylint: disable=protected-access
  # After exact.PROMPT the mutant's p-value was 2e-6, 8e-4 and 1e-11 for seeds 62-64 (12,000 rows);
  # after RUN_PROMPT 5e-192 to 5e-227, and the correct step's 0.12-0.93 (2026-11-29).
  out = bj.generate(target, repeat_last(times=2), [list(RUN_PROMPT)] * exact.NUM_ROWS,
                    max_new_tokens=exact.NUM_TOKENS, temperature=1.0, seed=62, draft_len=3,
                    eos_token_id=())
  live = out.stats.accepted >= 0
  assert (live & (out.stats.accepted < out.stats.drafted)).sum() > exact.NUM_ROWS // 2  # corrections
  joint = exact.exact_joint(target, RUN_PROMPT, exact.NUM_TOKENS, 1.0, 1.0)
  p_value = exact.chisquare_p_value(out.tokens[:, :exact.NUM_TOKENS], joint)
  assert p_value < exact.REJECT_P_VALUE, p_value


# The page's proposer with weights ("A proposer with weights"), defined by its first example.
_WEIGHTS_PAGE = {}
exec(compile(_examples("A proposer with weights")[0], str(DOC), "exec"), _WEIGHTS_PAGE)  # pylint: disable=exec-used
NextTable = _WEIGHTS_PAGE["NextTable"]


def test_a_proposer_with_weights_decodes_exactly_and_new_weights_compile_nothing():
  target = tiny_model(0, scale=2.5)
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=64)
  # The table of the target's own greedy successors: drafts that are often right.
  greedy_next = np.asarray(jnp.argmax(target.logits(jnp.arange(61)[:, None])[:, -1], -1), np.int32)
  namespace = {"bj": bj, "NextTable": NextTable, "target": target, "prompts": _prompts(),
               "successors": jnp.asarray(greedy_next)}
  exec(compile(_examples("A proposer with weights")[1], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  good = namespace["out"]
  np.testing.assert_array_equal(good.tokens, regular.tokens)
  built = compile_cache.stats().built
  shuffled = {"next": jnp.asarray(np.random.default_rng().permutation(61).astype(np.int32))}
  bad = bj.generate(target, (NextTable(), shuffled), _prompts(), max_new_tokens=64)
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


def test_a_registered_proposer_is_named_by_specs_and_listed_in_the_help(repeat_last):
  target = tiny_model(0)
  namespace = {"bj": bj, "RepeatLast": repeat_last, "target": target}
  exec(compile(_examples("Your proposer by name, and in a hybrid")[0], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["draft"] == repeat_last(times=3)
  assert "repeat_last" in [kind.name for kind in bj.proposer_kinds()]
  assert "  repeat_last[:times=<int>]\n      Where a row's text ends in a run" in drafts.draft_spec_help()
  with pytest.raises(ValueError, match=r"repeat_last takes no setting 'n'; its form is "
                     r"repeat_last\[:times=<int>\]"):
    bj.load_draft_spec("repeat_last:n=3", target)
  with pytest.raises(ValueError, match="repeat_last's times is <int>, got '2.5'"):
    bj.load_draft_spec("repeat_last:times=2.5", target)
  for bad, message in [("hybrid+ngram+ngram:m", "a lookup is named twice"),
                       ("hybrid+py:mod.C:m", "without 'py:' (hybrid+my_module.MyLookup"),
                       ("hybrid+siblings:m:pool=4", "write siblings.pool=4 for siblings"),
                       ("hybrid:m:siblings.pool=4", "which is not among the hybrid's lookups")]:
    with pytest.raises(ValueError, match=re.escape(message)):
      drafts.parse_draft_spec(bad)
  spec = drafts.parse_draft_spec("hybrid+repeat_last+siblings:some/model:repeat_last.times=4,max_n=3")
  assert spec.model == "some/model"
  assert [s for _, s in spec.proposers] == [repeat_last(times=4), bj.SiblingProposer(),
                                            bj.NGramProposer(max_n=3)]


def test_a_proposer_in_a_module_is_named_by_its_import_path(tmp_path, monkeypatch):
  """What a script does with --draft=py:<module>.<Class>: the page's class, saved as a module."""
  _page_module(tmp_path, monkeypatch, "my_proposers", _examples("Your own proposer")[0])
  target = tiny_model(0)
  draft = bj.load_draft_spec("py:my_proposers.RepeatLast:times=3", target)
  assert type(draft).__name__ == "RepeatLast" and draft.times == 3
  spec = drafts.parse_draft_spec("hybrid+my_proposers.RepeatLast:some/model:"
                                 "my_proposers.RepeatLast.times=1")
  assert [s for _, s in spec.proposers] == [draft.__class__(times=1), bj.NGramProposer()]
  with pytest.raises(ValueError, match="cannot import 'my_proposers.Missing'"):
    bj.load_draft_spec("py:my_proposers.Missing", target)
  with pytest.raises(ValueError, match="is not a Proposer dataclass"):
    bj.load_draft_spec("py:my_proposers.dataclasses", target)


def test_a_hybrid_with_the_users_lookup_is_regular_decoding_when_greedy(repeat_last):
  target = tiny_model(0, scale=2.5)
  namespace = {"bj": bj, "RepeatLast": repeat_last, "draft_model": noisy_copy(target, 0.3, seed=5),
               "target": target, "prompts": _prompts()}
  exec(compile(_examples("Your proposer by name, and in a hybrid")[1], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["out"].tokens.shape == (3, 64)
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=32)
  out = bj.generate(target, namespace["hybrid"], _prompts(), max_new_tokens=32, draft_len=3)
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  used = out.stats.sources[(out.stats.accepted >= 0) & (out.stats.drafted > 0)]
  assert {0, 1} <= set(np.unique(used).tolist())  # the model's drafts and the lookup's


def test_a_hybrid_keeps_the_targets_law_with_a_lookup_that_calls_itself_model(repeat_last):
  """A lookup whose drafts are counted as the model's (``source = "model"``) still has its own
  one-hot q: a hybrid that told its rows apart by source used the model's q for them."""

  @dataclasses.dataclass(frozen=True)
  class Mislabeled(repeat_last):
    source = "model"

  target, draft = exact._models()  # pylint: disable=protected-access
  out = exact._generate(target, bj.Hybrid(draft, Mislabeled(times=2)), "bass", 0.8, 0.9, seed=63,  # pylint: disable=protected-access
                        draft_len=3)
  live = out.stats.accepted >= 0
  assert (live & (out.stats.accepted > 0)).sum() > 100
  exact.assert_fits_target(out, 0.8, 0.9)


@dataclasses.dataclass(frozen=True)
class _Stateful(bj.Proposer):
  def init_state(self, params, prompts, prompt_len, **kwargs):
    return prompt_len

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _Unknown(NextTable):
  source = "oracle"


@dataclasses.dataclass(frozen=True)
class _ReadsFeatures(NextTable):
  needs_features = True


@pytest.mark.parametrize("lookup, message", [
    (_Stateful(), "keep no state and read no features; _Stateful keeps a state"),
    (_ReadsFeatures(), "keep no state and read no features; _ReadsFeatures reads the target features"),
    (_Unknown(), "_Unknown.source is 'oracle'; it must be one of"),
    ("ngram", "Hybrid.lookups holds proposers, got str"),
    ((), "Hybrid.lookups is empty"),
])
def test_what_a_hybrid_refuses_as_a_lookup(lookup, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    bj.Hybrid(tiny_model(1), lookup)  # refused when built


def test_a_hybrid_refuses_a_model_proposer_as_a_lookup():
  target = tiny_model(0)
  with pytest.raises(ValueError, match="drafts with a model"):
    bj.generate(target, bj.Hybrid(tiny_model(1), ModelProposer(target.config, "float32",
                                                               "reference")),
                _prompts(), max_new_tokens=4)


@dataclasses.dataclass(frozen=True)
class _TableSettings:
  """Settings of a proposer with weights: the seed of its random table."""

  seed: int = 0


@dataclasses.dataclass(frozen=True)
class _TwoSettings:
  """A setting a spec must give and one with a default."""

  table: str
  times: int = 1


def test_the_grammar_writes_settings_without_a_default_outside_the_brackets():
  bj.register_proposer("two_settings", _TwoSettings, build=lambda settings, target: None)
  kind = _kind("two_settings")
  assert kind.required == ("table",)
  assert kind.grammar() == "two_settings:table=<text>[,times=<int>]"
  assert kind.parse("times=3,table=t.npy", "spec") == _TwoSettings("t.npy", 3)
  refusal = ("'two_settings:times=3': two_settings needs table; its form is "
             "two_settings:table=<text>[,times=<int>]")
  with pytest.raises(ValueError, match=re.escape(refusal)):
    kind.parse("times=3", "two_settings:times=3")


@pytest.mark.parametrize("name, settings, kwargs, message", [
    ("1bad", NextTable, {}, "letters, digits and '_', starting with a letter"),
    ("hybrid", NextTable, {}, "'hybrid' is reserved in draft specs"),
    ("ngram", NextTable, {}, "proposer 'ngram' is already registered to NGramProposer"),
    ("table", object, {}, "settings must be a dataclass"),
    ("table", _TableSettings, {}, "_TableSettings is not a Proposer; give a build(settings, target)"),
])
def test_what_register_proposer_refuses(name, settings, kwargs, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    bj.register_proposer(name, settings, **kwargs)
  kinds = {k.name: k for k in bj.proposer_kinds()}
  assert kinds["ngram"].settings is bj.NGramProposer  # a refused registration replaced nothing
  assert name == "ngram" or name not in kinds


def test_a_proposer_with_weights_is_named_by_a_spec_through_its_builder(tmp_path, monkeypatch):
  """The page's settings and builder, saved as a module a script imports by the settings' path: the
  spec's table reaches the builder, a table of the wrong shape is refused, and greedy decoding with
  the built draft is regular decoding."""
  examples = _examples("A proposer with weights")
  _page_module(tmp_path, monkeypatch, "my_tables", examples[0], examples[2])
  monkeypatch.chdir(tmp_path)
  target = tiny_model(0, scale=2.5)
  table = np.random.default_rng().integers(0, target.config.vocab_size, 61).astype(np.int32)
  np.save(tmp_path / "successors.npy", table)
  proposer, params = bj.load_draft_spec("py:my_tables.NextTableSettings:table=successors.npy",
                                        target)
  assert type(proposer).__module__ == "my_tables" and type(proposer).__name__ == "NextTable"
  np.testing.assert_array_equal(params["next"], table)
  kind = _kind("next_table")
  assert not kind.model_free and kind.grammar() == "next_table:table=<text>", kind.grammar()
  with pytest.raises(ValueError, match=re.escape("next_table needs table; its form is "
                                                 "next_table:table=<text>")):
    bj.load_draft_spec("next_table", target)
  np.save(tmp_path / "short.npy", table[:-1])
  with pytest.raises(ValueError, match=re.escape("short.npy holds a table of shape (60,); the "
                                                 "target's vocabulary needs (61,)")):
    bj.load_draft_spec("next_table:table=short.npy", target)
  with pytest.raises(ValueError, match="'next_table' is not a model-free proposer"):
    drafts.parse_draft_spec("hybrid+next_table:some/model")
  namespace = {"bj": bj, "target": target, "prompts": _prompts()}
  exec(compile(examples[3], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  np.testing.assert_array_equal(namespace["draft"][1]["next"], table)
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=64)
  np.testing.assert_array_equal(namespace["out"].tokens, regular.tokens)


def test_a_scripts_draft_help_lists_the_registry():
  """--draft=help prints the grammar generated from the registry, and exits before any model."""
  done = subprocess.run([PYTHON, "-m", "experiments.benchmarks.step_costs", "--draft=help"],
                        capture_output=True, text=True, cwd=DOC.parents[1], timeout=120, check=False)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("Draft specs (bass_jax.load_draft_spec):\n")
  for kind in bj.proposer_kinds():
    if kind.settings.__module__.startswith("bass_jax."):  # the tests register theirs in-process
      assert f"  {kind.grammar()}\n      {kind.summary}\n" in done.stdout


# -- an acceptance rule of one's own (docs/extending.md, "Your own acceptance rule") -------------------


@pytest.fixture(scope="module")
def inverse_cdf():
  """The page's acceptance rule class, defined by running the section's first example."""
  namespace = {}
  exec(compile(_examples("Your own acceptance rule")[0], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  return namespace["InverseCDF"]


def _decode_with(rule, draft, seed: int, rows: int = exact.NUM_ROWS) -> bj.GenerateOutput:
  """``rows`` copies of the exactness tests' prompt, sampled at T = 0.8, top-p 0.9 under ``rule``
  (regular decoding when ``draft`` is None)."""
  target, _ = exact._models()  # pylint: disable=protected-access
  return bj.generate(target, draft, [list(exact.PROMPT)] * rows,
                     method="regular" if draft is None else "bass", max_new_tokens=exact.NUM_TOKENS,
                     temperature=0.8, top_p=0.9, seed=seed, eos_token_id=(), draft_len=3,
                     acceptance=rule)


def test_the_users_rule_keeps_the_targets_law_whatever_the_draft(inverse_cdf):  # pylint: disable=redefined-outer-name
  """Regular decoding under the page's rule fits the target's law (chi-square), and BASS with a far
  draft emits its tokens row for row, through drafts accepted and rejected."""
  regular = _decode_with(inverse_cdf(), None, seed=71)
  exact.assert_fits_target(regular, 0.8, 0.9)
  _, far = exact._models()  # pylint: disable=protected-access
  rows = exact.NUM_ROWS // 8  # row i's draws are keyed by its id i: the first rows of the larger batch
  out = _decode_with(inverse_cdf(), far, seed=71, rows=rows)
  live = out.stats.accepted >= 0
  assert (live & (out.stats.accepted > 0)).sum() > 100
  assert (live & (out.stats.accepted < out.stats.drafted)).sum() > 100
  np.testing.assert_array_equal(out.tokens, regular.tokens[:rows])


def test_a_rule_that_forgets_the_position_is_detected(inverse_cdf):  # pylint: disable=redefined-outer-name
  """Power: the same rule drawing all of a row's tokens with one uniform (each token alone still has
  the right law) is rejected by the chi-square test of the joint law."""

  @dataclasses.dataclass(frozen=True)
  class OneUniform(inverse_cdf):
    def choose(self, log_probs, row_keys, positions):
      return super().choose(log_probs, row_keys, positions * 0)

  out = _decode_with(OneUniform(), None, seed=72)
  p_value = exact.chisquare_p_value(out.tokens[:, :exact.NUM_TOKENS], exact._target_joint(0.8, 0.9))  # pylint: disable=protected-access
  assert p_value < exact.REJECT_P_VALUE, p_value


def test_the_rule_by_instance_by_name_and_by_import_path(inverse_cdf, tmp_path, monkeypatch):  # pylint: disable=redefined-outer-name
  target = tiny_model(0, scale=2.5)
  namespace = {"bj": bj, "InverseCDF": inverse_cdf, "target": target,
               "draft": noisy_copy(target, 0.3, seed=5), "prompts": _prompts()}
  exec(compile(_examples("Your own acceptance rule")[1], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  np.testing.assert_array_equal(namespace["again"].tokens, namespace["out"].tokens)
  assert "inverse_cdf" in bj.acceptance_rules()
  assert inverse_cdf().name == "inverse_cdf"
  _page_module(tmp_path, monkeypatch, "my_rules", _examples("Your own acceptance rule")[0])
  by_path = bj.generate(target, namespace["draft"], _prompts(), max_new_tokens=64, temperature=0.8,
                        acceptance="py:my_rules.InverseCDF")
  np.testing.assert_array_equal(by_path.tokens, namespace["out"].tokens)
  with pytest.raises(ValueError, match="cannot import 'my_rules.Missing'"):
    bj.generate(target, None, _prompts(), method="regular", max_new_tokens=4,
                acceptance="py:my_rules.Missing")
  with pytest.raises(ValueError, match="acceptance must be one of .*'inverse_cdf'"):
    bj.generate(target, None, _prompts(), method="regular", max_new_tokens=4, acceptance="inverse")


def test_the_users_rule_on_token_trees_emits_regular_decodings_tokens(inverse_cdf):  # pylint: disable=redefined-outer-name
  """The shared tree walk of matching rules, with the page's rule: drafter-invariant on trees too."""
  _, far = exact._models()  # pylint: disable=protected-access
  rows = exact.NUM_ROWS // 8
  regular = _decode_with(inverse_cdf(), None, seed=73, rows=rows)
  target, _ = exact._models()  # pylint: disable=protected-access
  tree = bj.generate(target, far, [list(exact.PROMPT)] * rows, max_new_tokens=exact.NUM_TOKENS,
                     temperature=0.8, top_p=0.9, seed=73, eos_token_id=(), acceptance=inverse_cdf(),
                     draft_tree="top_k=2,depth=2,nodes=5")
  assert (tree.stats.accepted > 0).sum() > 100
  np.testing.assert_array_equal(tree.tokens, regular.tokens)


@dataclasses.dataclass(frozen=True)
class _Unkeyed(bj.MatchingRule):
  def choose(self, log_probs, row_keys, positions):
    raise NotImplementedError


class _Undecorated(acceptance.Gumbel):
  def __init__(self, scale=1.0, branch_free=False):
    super().__init__(branch_free=branch_free)
    object.__setattr__(self, "scale", scale)


@pytest.mark.parametrize("rule, message", [
    ("py:bass_jax.MatchingRule", "MatchingRule is abstract (it lacks choose)"),
    ("py:bass_jax.AcceptanceRule", "AcceptanceRule is abstract (it lacks accept)"),
    (_Unkeyed(), "_Unkeyed is a MatchingRule without keyed = True"),
    (_Undecorated(scale=2.0), "decorate _Undecorated with @dataclasses.dataclass(frozen=True)"),
])
def test_what_a_decode_refuses_as_an_acceptance_rule(rule, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    bj.generate(tiny_model(0), None, _prompts(), method="regular", max_new_tokens=4,
                temperature=0.8, acceptance=rule)


def test_register_acceptance_decorates_a_class():
  @bj.register_acceptance("gumbel_again")
  @dataclasses.dataclass(frozen=True)
  class GumbelAgain(acceptance.Gumbel):
    """Gumbel acceptance under another name."""

  assert "gumbel_again" in bj.acceptance_rules() and GumbelAgain().name == "gumbel_again"
  out = bj.generate(tiny_model(0), None, _prompts(), method="regular", max_new_tokens=8,
                    temperature=0.8, acceptance="gumbel_again")
  gumbel = bj.generate(tiny_model(0), None, _prompts(), method="regular", max_new_tokens=8,
                       temperature=0.8, acceptance="gumbel")
  np.testing.assert_array_equal(out.tokens, gumbel.tokens)


@pytest.mark.parametrize("name, rule, message", [
    ("2x", acceptance.Rejection, "letters, digits and '_', starting with a letter"),
    ("gumbel", acceptance.Rejection, "'gumbel' is already registered to Gumbel"),
    ("argmax", acceptance.Greedy, "is not a sampled AcceptanceRule dataclass"),
    ("plain", object, "is not a sampled AcceptanceRule dataclass"),
])
def test_what_register_acceptance_refuses(name, rule, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    bj.register_acceptance(name, rule)
  assert bj.acceptance_rules()[:2] == ("rejection", "gumbel") and name not in bj.acceptance_rules()[2:]


# -- a model family of one's own (docs/extending.md, "Your own model family") ---------------------------


@pytest.fixture(scope="module")
def ministral_dir(tmp_path_factory):
  """The page's family registered (its example, run up to the load), and a tiny random transformers
  MinistralForCausalLM saved: three layers, a window of 4 positions on the first and the last."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  example = _examples("Your own model family")[0]
  exec(compile(example.split("\nmodel = ")[0], str(DOC), "exec"), {})  # pylint: disable=exec-used
  config = transformers.MinistralConfig(
      vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
      sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
      tie_word_embeddings=False)
  torch.manual_seed(0)
  path = tmp_path_factory.mktemp("ministral")
  model = transformers.MinistralForCausalLM(config).eval()
  for param in model.parameters():  # larger weights: a sharper law, so greedy drafts get accepted
    param.data.mul_(3.0)
  model.save_pretrained(path)
  return path, model


def _torch_logits(model, tokens: np.ndarray) -> np.ndarray:
  import torch  # pylint: disable=import-outside-toplevel

  with torch.no_grad():
    return model(torch.tensor(tokens)).logits.numpy()


def test_a_registered_family_loads_decodes_and_saves_as_transformers_reads_it(ministral_dir,  # pylint: disable=redefined-outer-name
                                                                             tmp_path):
  import transformers  # pylint: disable=import-outside-toplevel

  path, reference = ministral_dir
  target = bj.load_model(path, dtype="float32")
  assert target.config.model_type == "ministral" and target.config.sliding_window == 4
  tokens = np.random.default_rng(3).integers(0, 61, (2, 14))  # longer than the window
  want = _torch_logits(reference, tokens)
  np.testing.assert_allclose(np.asarray(target.logits(jnp.asarray(tokens))), want, atol=1e-5, rtol=0)

  source = preflight.inspect_model(path)
  assert (source.kind, source.model_type, source.sliding_window) == ("hf", "ministral", 4)
  regular = bj.generate(target, None, _prompts(), method="regular", max_new_tokens=24)
  bass = bj.generate(target, noisy_copy(target, 0.05, seed=2), _prompts(), max_new_tokens=24,
                     draft_len=3)
  np.testing.assert_array_equal(bass.tokens, regular.tokens)
  assert bass.stats.accepted.clip(0).sum() > 0

  bj.save_model(target, tmp_path / "saved")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
  assert type(reloaded).__name__ == "MinistralForCausalLM"
  np.testing.assert_allclose(_torch_logits(reloaded, tokens), want, atol=1e-5, rtol=0)


def test_what_register_llama_family_refuses():
  with pytest.raises(ValueError, match="already has a Traits row"):
    bj.register_llama_family("llama", bj.LlamaTraits("MyLlamaForCausalLM"))
  with pytest.raises(ValueError, match=r"the port reads no field \['num_experts'\]"):
    bj.register_llama_family("mine", bj.LlamaTraits("MineForCausalLM",
                                                    fields=frozenset({"num_experts"})))
  with pytest.raises(ValueError, match="traits must be a llama.Traits, got dict"):
    bj.register_llama_family("mine", {"architecture": "MineForCausalLM"})
  with pytest.raises(ValueError, match=re.escape("['qwen2'] already belong to the family 'qwen2'")):
    bj.register_llama_family("mine", bj.LlamaTraits("MineForCausalLM", gguf_architectures=("qwen2",)))
  with pytest.raises(ValueError, match="attention_softcap is one of Gemma's traits; set gemma=True"):
    bj.register_llama_family("mine", bj.LlamaTraits("MineForCausalLM", attention_softcap=True))
  assert "mine" not in family.model_types()


def test_a_registered_family_with_gemmas_traits_is_not_saved_in_transformers_format(monkeypatch):
  """docs/extending.md: such a family saves in orbax format only (its config names differ); the
  row is set for this test alone, without registering a family."""
  monkeypatch.setitem(llama.TRAITS, "gemma", bj.LlamaTraits("GemmaForCausalLM", gemma=True))
  config = dataclasses.replace(tiny_model(0).config, model_type="gemma",
                               hidden_act="gelu_pytorch_tanh")
  with pytest.raises(ValueError, match="saving a registered family with Gemma's traits"):
    config.to_hf_config()


@pytest.fixture(scope="module")
def sdpa_attention():
  """The page's attention implementation, registered by running its example once."""
  if "sdpa_pad" not in attention_registry.attention_implementations():
    namespace = {}
    exec(compile(_examples("Your own attention implementation")[0], str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  return attention_registry.get_attention("sdpa_pad")


@pytest.mark.parametrize("window", [None, 3])
def test_the_users_attention_equals_the_reference_and_reads_no_padding(sdpa_attention, window):  # pylint: disable=redefined-outer-name
  rng = np.random.default_rng(7)
  batch, num_new, heads, kv_heads, slots, dim = 3, 2, 4, 2, 16, 8
  q = jnp.asarray(rng.standard_normal((batch, num_new, heads, dim)), jnp.float32)
  lengths = jnp.asarray([2, 9, 16], jnp.int32)
  valid = np.arange(slots)[None, None, :, None] < np.asarray(lengths)[:, None, None, None]
  k, v = (jnp.asarray(np.where(valid, rng.standard_normal((batch, kv_heads, slots, dim)), np.nan),
                      jnp.float32) for _ in range(2))
  got = sdpa_attention(q, k, v, lengths, sliding_window=window)
  want = reference_attention(q, k, v, lengths, sliding_window=window)
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


def test_the_users_attention_decodes_as_the_reference_and_is_found_by_strategy(sdpa_attention):  # pylint: disable=redefined-outer-name
  del sdpa_attention  # registered
  assert reproduce.attention_impl("pad", "sdpa") == "sdpa_pad"
  target, draft = tiny_model(0, scale=2.5), tiny_model(1, scale=2.5)
  ref = bj.generate(target, draft, _prompts(), max_new_tokens=24, attention_impl="reference")
  own = bj.generate(target, draft, _prompts(), max_new_tokens=24, attention_impl="sdpa_pad")
  np.testing.assert_array_equal(own.tokens, ref.tokens)
  assert own.stats.attention_impl == "sdpa_pad"
