"""Compile once, start at once (issue 52): programs that do not depend on the prompts' lengths, the
persistent cache of programs and step costs, its configuration and its statistics.

Compiles are counted through ``compile_cache.stats()``, never timed.
"""

import contextlib
import dataclasses
import io
import warnings

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.sampling import compile_cache, costs, programs
from bass_jax.sampling.draft_len import StepCosts

from conftest import tiny_model


@pytest.fixture(scope="module")
def pair():
  return tiny_model(0), tiny_model(1)


@contextlib.contextmanager
def _suite_cache_restored():
  """Puts back, on leaving, the process's cache as the suite set it (tests/conftest.py: JAX's own cache
  shared by the run, bass_jax storing nothing), which :func:`compile_cache.configure` replaces."""
  jax_dir = jax.config.jax_compilation_cache_dir
  min_seconds = jax.config.jax_persistent_cache_min_compile_time_secs
  max_size = jax.config.jax_compilation_cache_max_size
  state = dict(compile_cache._STATE)  # pylint: disable=protected-access
  try:
    yield
  finally:
    compile_cache.wait_for_writes()
    jax.config.update("jax_compilation_cache_dir", jax_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    jax.config.update("jax_compilation_cache_max_size", max_size)
    jax_cache.reset_cache()
    compile_cache._STATE.clear()  # pylint: disable=protected-access
    compile_cache._STATE.update(state)  # pylint: disable=protected-access


@pytest.fixture
def cache_dir(tmp_path):
  """A fresh persistent cache for one test; the suite's own is restored after it."""
  with _suite_cache_restored():
    path = compile_cache.configure(tmp_path / "xla")
    assert path == tmp_path / "xla"
    yield path


def _prompts(rng, *lengths):
  return [rng.integers(0, 61, n).tolist() for n in lengths]


def _built(before):
  now = compile_cache.stats()
  return now.built - before.built, now.memory_hits - before.memory_hits


def test_one_program_for_every_prompt_length_up_to_the_capacity(pair):
  """max_prompt_len: prompts of 3 to 64 tokens and another max_new_tokens in its bucket run one
  program, and each row's tokens equal its own decode at its own bucket (the capacity changes no
  token)."""
  target, draft = pair
  rng = np.random.default_rng(11)
  calls = [(_prompts(rng, 40, 7), 16), (_prompts(rng, 3, 64), 16), (_prompts(rng, 12, 30), 20)]
  programs.clear_compile_cache()
  before = compile_cache.stats()
  outs = [bj.generate(target, draft, p, max_new_tokens=n, draft_len=2, max_prompt_len=64)
          for p, n in calls]
  assert _built(before) == (1, 2)
  assert {o.stats.prompt_bucket for o in outs} == {64}
  for (prompts, n), out in zip(calls, outs):
    for i, prompt in enumerate(prompts):  # alone, at its own (smaller) bucket
      alone = bj.generate(target, None, [prompt], method="regular", max_new_tokens=n)
      np.testing.assert_array_equal(out.tokens[i], alone.tokens[0])


def test_a_shorter_call_reuses_the_larger_programs(pair):
  """Without max_prompt_len a call runs the programs already built for its setting at a larger
  capacity instead of compiling its own bucket's; a longer one builds a larger capacity."""
  target, draft = pair
  rng = np.random.default_rng(12)
  programs.clear_compile_cache()
  long, short, longer = _prompts(rng, 100, 9), _prompts(rng, 5, 20), _prompts(rng, 200, 3)
  before = compile_cache.stats()
  first = bj.generate(target, draft, long, max_new_tokens=8, draft_len=2)
  second = bj.generate(target, draft, short, max_new_tokens=8, draft_len=2)
  assert _built(before) == (1, 1)
  assert first.stats.prompt_bucket == second.stats.prompt_bucket == 128
  third = bj.generate(target, draft, longer, max_new_tokens=8, draft_len=2)
  assert third.stats.prompt_bucket == 256 and _built(before) == (2, 1)
  programs.clear_compile_cache()
  fresh = bj.generate(target, draft, short, max_new_tokens=8, draft_len=2)
  assert fresh.stats.prompt_bucket == 32
  np.testing.assert_array_equal(second.tokens, fresh.tokens)


def test_max_prompt_len_refuses_a_longer_prompt(pair):
  target, draft = pair
  with pytest.raises(ValueError, match=r"^a prompt has 20 tokens, more than max_prompt_len=16; "):
    bj.generate(target, draft, [[1] * 20], max_new_tokens=4, max_prompt_len=16)
  with pytest.raises(ValueError, match="max_prompt_len"):
    bj.generate(target, draft, [[1] * 4], max_new_tokens=4, max_prompt_len=0)


def test_programs_load_from_disk_in_a_new_process_as_they_ran(pair, cache_dir):
  """Built programs are stored; once memory forgets them (a new process) they load from disk, run
  the same tokens, and a change of the code's version is a miss."""
  target, draft = pair
  rng = np.random.default_rng(13)
  prompts = _prompts(rng, 6, 11, 2)
  programs.clear_compile_cache()
  built = bj.generate(target, draft, prompts, max_new_tokens=12, draft_len=3, temperature=0.7,
                      seed=5)
  assert built.stats.program_source == "compiled"
  compile_cache.wait_for_writes()
  assert list((cache_dir / compile_cache.PROGRAMS_DIR).glob("*.pkl"))
  programs.clear_compile_cache()
  before = compile_cache.stats()
  loaded = bj.generate(target, draft, prompts, max_new_tokens=12, draft_len=3, temperature=0.7,
                       seed=5)
  assert loaded.stats.program_source == "disk"
  now = compile_cache.stats()
  assert (now.programs_loaded - before.programs_loaded, now.programs_compiled
          - before.programs_compiled) == (2, 0)
  np.testing.assert_array_equal(loaded.tokens, built.tokens)
  np.testing.assert_allclose(loaded.logprobs, built.logprobs, rtol=1e-6)

  # Another version of the code is another key: its programs are never those stored.
  setting = ("a setting", 1)
  version = compile_cache.code_version
  key = compile_cache.setting_key(setting)
  try:
    compile_cache.code_version = lambda: "another version"
    assert compile_cache.setting_key(setting) != key
  finally:
    compile_cache.code_version = version
  assert compile_cache.setting_key(setting) == key
  assert compile_cache.setting_key(object()) is None  # no stable text: memory only


def test_a_corrupt_stored_program_is_deleted_and_built_again(pair, cache_dir):
  target, draft = pair
  prompts = [[3, 4, 5]]
  programs.clear_compile_cache()
  first = bj.generate(target, draft, prompts, max_new_tokens=4, draft_len=2)
  compile_cache.wait_for_writes()
  (stored,) = (cache_dir / compile_cache.PROGRAMS_DIR).glob("*.pkl")
  stored.write_bytes(b"not a program")
  programs.clear_compile_cache()
  out = bj.generate(target, draft, prompts, max_new_tokens=4, draft_len=2)
  assert out.stats.program_source == "compiled"
  compile_cache.wait_for_writes()
  assert stored.read_bytes() != b"not a program"  # deleted, compiled and stored afresh
  np.testing.assert_array_equal(out.tokens, first.tokens)


def test_step_costs_are_kept_beside_the_cache(pair, cache_dir, monkeypatch):
  """The cost-aware policy's measured step costs are stored once per setting and device; a new
  process (memory cleared) reads them instead of timing the forwards again."""
  target, draft = pair
  prompts = [[1, 2, 3, 4], [5, 6]]
  costs.clear()
  first = bj.generate(target, draft, prompts, max_new_tokens=6, draft_len="goodput",
                      profile="cpu").stats.step_costs
  assert isinstance(first, StepCosts)
  costs.clear()

  def never(*args, **kwargs):
    raise AssertionError("measured again")

  monkeypatch.setattr(costs, "_measure", never)
  again = bj.generate(target, draft, prompts, max_new_tokens=6, draft_len="goodput",
                      profile="cpu").stats.step_costs
  assert again == first
  assert StepCosts.from_json(first.to_json()) == first
  assert StepCosts.stored({"plain": 1.0}) is None  # an entry that does not fit: measured again


def test_configuration(tmp_path, monkeypatch):
  """The environment variable moves or turns off the cache; an unwritable directory is one warning
  and no cache; a bad setting is a one-line error."""
  with _suite_cache_restored():
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "moved"))
    assert compile_cache.configure(None) == tmp_path / "moved"
    for off in ("off", "0", "false", "None"):
      monkeypatch.setenv(compile_cache.ENV_VAR, off)
      assert compile_cache.configure(None) is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      assert compile_cache.configure(blocked / "xla") is None
    (warning,) = caught
    assert "is not writable" in str(warning.message) and "\n" not in str(warning.message)
    with pytest.raises(ValueError, match="^compilation_cache must be a directory"):
      compile_cache.configure(3)
    monkeypatch.delenv(compile_cache.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_dir() == tmp_path / "xdg" / "bass_jax" / "xla"


def test_a_cache_set_through_jax_is_kept_and_off_stores_nothing_of_bass_jaxs_there(tmp_path,
                                                                                 monkeypatch):
  """A directory the user gave JAX itself is kept, and bass_jax stores there too; with bass_jax's
  variable off, JAX's cache stays on for JAX's compiles but bass_jax stores no programs or costs (the
  suite's setting, tests/conftest.py); a directory that variable names replaces JAX's."""
  with _suite_cache_restored():
    own = tmp_path / "jax_own"
    jax.config.update("jax_compilation_cache_dir", str(own))
    compile_cache._STATE.update(configured=False, dir=None, ours=False)  # pylint: disable=protected-access
    monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
    assert compile_cache.configure(None) == own
    assert compile_cache.stored_key(("a setting", 1)) is not None
    monkeypatch.setenv(compile_cache.ENV_VAR, "off")
    assert compile_cache.configure(None) is None
    assert jax.config.jax_compilation_cache_dir == str(own)
    assert compile_cache.stored_key(("a setting", 1)) is None
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "mine"))
    assert compile_cache.configure(None) == tmp_path / "mine"
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")


def test_printing_says_when_a_program_compiles_and_how_long(pair):
  target, draft = pair
  programs.clear_compile_cache()
  stream = io.StringIO()
  with programs.printing(stream):
    bj.generate(target, draft, [[1, 2, 3]], max_new_tokens=4, draft_len=1)
    bj.generate(target, draft, [[4, 5]], max_new_tokens=4, draft_len=1)  # from memory: silent
  (line,) = stream.getvalue().splitlines()
  assert line.startswith("bass_jax: compiling the BASS decode, 1 rows, prompts <= 16 tokens ...")
  assert line.endswith(" s") and (" compiled in " in line or " loaded from the compilation cache in "
                                   in line)


def test_programs_jax_loaded_from_its_own_cache_are_not_stored_again(pair, cache_dir, monkeypatch):
  """An executable JAX loaded from its persistent cache serializes without all of its code on
  XLA:CPU: storing it made the next process fail ("Function ... not found"). Only freshly compiled
  programs are stored (and those stay out of JAX's cache); programs JAX's cache serves (here written
  by a build that did not keep them out) run, and so does the next build."""
  import shutil

  target, draft = pair
  prompts = [[1, 2, 3, 4, 5], [6, 7]]
  settings = dict(max_new_tokens=12, draft_len="goodput", profile="cpu")
  programs.clear_compile_cache()
  with monkeypatch.context() as m:  # a build that lets JAX write its own entries
    m.setattr(compile_cache, "directory", lambda: None)
    first = bj.generate(target, draft, prompts, **settings)
  compile_cache.wait_for_writes()
  shutil.rmtree(cache_dir / compile_cache.PROGRAMS_DIR, ignore_errors=True)  # JAX's own entries stay
  programs.clear_compile_cache()
  from_jax = bj.generate(target, draft, prompts, **settings)
  assert from_jax.stats.program_source == "disk"
  compile_cache.wait_for_writes()
  assert not list((cache_dir / compile_cache.PROGRAMS_DIR).glob("*.pkl"))
  programs.clear_compile_cache()
  again = bj.generate(target, draft, prompts, **settings)
  np.testing.assert_array_equal(again.tokens, first.tokens)


def test_stored_programs_stay_out_of_jax_cache(pair, cache_dir):
  """A build whose programs are stored whole leaves JAX's own cache without them: a later build
  (its stored programs gone) compiles afresh and stores again, instead of loading from JAX's cache
  what cannot be stored."""
  import shutil

  target, draft = pair
  prompts = [[9, 8, 7]]
  programs.clear_compile_cache()
  bj.generate(target, draft, prompts, max_new_tokens=6, draft_len=3)
  compile_cache.wait_for_writes()
  shutil.rmtree(cache_dir / compile_cache.PROGRAMS_DIR)
  programs.clear_compile_cache()
  again = bj.generate(target, draft, prompts, max_new_tokens=6, draft_len=3)
  assert again.stats.program_source == "compiled"
  compile_cache.wait_for_writes()
  assert len(list((cache_dir / compile_cache.PROGRAMS_DIR).glob("*.pkl"))) == 1


@dataclasses.dataclass(frozen=True)
class _UsersOwnPolicy:
  """Stands for a user's own class in a decode's setting (a proposer, a draft-length policy)."""

  depth: int = 2


def test_a_users_own_code_is_part_of_the_key():
  """Programs depend on a user's own classes as much as on bass_jax's: their source files are in the
  key, and a class without one (a notebook's, ``__main__``'s) keeps its programs in memory only."""
  key = compile_cache.setting_key(("spec", _UsersOwnPolicy()))
  assert key is not None and key != compile_cache.setting_key(("spec", "no class of the user's"))
  assert len(compile_cache._user_code((_UsersOwnPolicy(),))) == 1  # pylint: disable=protected-access
  notebook_class = type("InANotebook", (), {"__module__": "__main__"})
  assert compile_cache.setting_key(("spec", notebook_class())) is None
