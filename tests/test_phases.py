"""The per-phase cost breakdown of a BASS step (bass_jax.sampling.phases, experiments.benchmarks.step_phases): the
phases are measured on a real decode's state and add up as documented; bad settings are refused with
the fix named. Tiny models: the mechanics, not the figures (those come from the script on SmolLM2)."""

import math
import pathlib
import re
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.sampling.phases import (StepPhases, instruction_scopes, measure_step_phases,
                                     profile_step_scopes)
from bass_jax.sampling.step import STEP_SCOPES
from conftest import PYTHON, noisy_copy, random_eagle_draft, tiny_model


@pytest.fixture(scope="module")
def pair():
  target = tiny_model(0)
  rng = np.random.default_rng(3)
  # Repeated text, so that the n-gram lookup of a hybrid matches in some steps.
  prompts = [list(rng.integers(3, target.config.vocab_size, size=6)) * 3,
             rng.integers(3, target.config.vocab_size, size=11).tolist()]
  return target, prompts


def _check(p: StepPhases, *, draft_len: int, batch: int, chunk: int = 4):
  assert p.batch == batch and p.steps == 5 and p.chunk == chunk and p.draft_len == draft_len
  for name in ("loop", "step", "plain", "propose", "verify_pass"):
    assert 0 < getattr(p, name) < 1, (name, p)
  # Passes: at least one, at most what l + 1 positions need; the accepted drafts at most l.
  assert 1 <= p.passes <= math.ceil((draft_len + 1) / chunk) and 0 <= p.accepted <= draft_len
  assert math.isclose(p.verify, p.verify_pass * p.passes)
  assert math.isclose(p.accept_commit, p.step - p.propose - p.verify)
  assert math.isclose(p.control, p.loop - p.step)
  assert math.isclose(p.overhead, p.accept_commit + p.control)
  in_plain = p.in_plain_steps()
  assert math.isclose(in_plain["overhead"] * p.plain, p.overhead)


def test_a_model_draft_step_breaks_down_into_its_phases(pair):
  target, prompts = pair
  # A 1-layer draft (cheaper to compile): the phases' mechanics, not how often it is right.
  p = measure_step_phases(target, noisy_copy(target, 0.05, 1).with_first_layers(1), prompts,
                          draft_len=6, max_new_tokens=64, warm_steps=2, steps=5, repeats=1)
  _check(p, draft_len=6, batch=2)
  assert p.lookup == 0  # not a hybrid


def test_a_sampled_eagle_hybrid_times_its_lookups_apart(pair):
  target, prompts = pair
  hybrid = bj.Hybrid(random_eagle_draft(target), bj.NGramProposer(max_n=3, min_n=1))
  p = measure_step_phases(target, hybrid, prompts, draft_len=3, temperature=0.8, top_p=0.9,
                          max_new_tokens=32, warm_steps=2, steps=5, repeats=1, verify_chunk=2)
  _check(p, draft_len=3, batch=2, chunk=2)
  # The lookups were timed as their own program. Their share of the proposal is not asserted: on
  # a 61-token model both take a fraction of a millisecond, and which is faster is noise.
  assert 0 < p.lookup < 1, p


@pytest.mark.parametrize("kwargs,message", [
    (dict(draft_len="goodput"), "needs a fixed draft_len"),
    (dict(draft_len=2, draft_tree="top_k=2,depth=2,nodes=4"), "leave draft_tree out"),
    (dict(draft_len=2, batch_size=1), "leave batch_size out"),
    (dict(draft_len=2, method="regular"), "breaks down BASS steps"),
    (dict(draft_len=2, max_new_tokens=8, warm_steps=4, steps=5), "need max_new_tokens >= that"),
    (dict(draft_len=2, steps=0), "steps must be an int >= 1"),
])
def test_bad_settings_are_refused_with_the_fix(pair, kwargs, message):
  target, prompts = pair
  with pytest.raises(ValueError, match=message):
    measure_step_phases(target, bj.NGramProposer(), prompts, **kwargs)


def test_rows_that_finish_before_the_timed_steps_are_refused(pair):
  _, prompts = pair
  target = tiny_model(0, num_hidden_layers=1)  # its own, cheaper to compile: any target would do
  eos = int(bj.generate(target, None, prompts[:1], method="regular", max_new_tokens=1).tokens[0, 0])
  with pytest.raises(ValueError, match="raise max_new_tokens"):
    # The row ends at its first token: its own greedy choice is the EOS id.
    measure_step_phases(target, bj.NGramProposer(), [prompts[0]], draft_len=2, max_new_tokens=8,
                        warm_steps=1, steps=3, repeats=1, eos_token_id=eos)


def test_every_compiled_instruction_gets_the_scope_of_the_code_that_traced_it():
  def program(x, w):
    def body(i, x):
      with jax.named_scope("propose"):
        y = jnp.tanh(x @ w)
      with jax.named_scope("accept"):
        return y * 2.0 + i
    # Traced outside every scope, reading the scoped loop's result: "other", not its operand's scope.
    return jnp.cumsum(jax.lax.fori_loop(0, 3, body, x), axis=0)

  rng = np.random.default_rng(0)
  x, w = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((4, 8), (8, 8)))
  text = jax.jit(program).lower(x, w).compile().as_text()
  scopes = instruction_scopes(text)
  names = re.findall(r"^\s+(?:ROOT )?%?([\w.\-]+) = ", text, flags=re.M)
  assert sorted(scopes) == sorted(names)  # every instruction of every computation
  opcodes = {opcode for opcode, _ in scopes.values()}
  assert {"dot", "while"} <= opcodes, opcodes
  # The matmul is the proposal's, wherever XLA put it (and with or without its own metadata); the
  # loop itself was traced outside both scopes.
  assert all(scope == "propose" for opcode, scope in scopes.values() if opcode == "dot"), scopes
  assert all(scope == "other" for opcode, scope in scopes.values() if opcode == "while"), scopes
  assert {scope for _, scope in scopes.values()} <= set(STEP_SCOPES) | {"other"}
  cumsum = re.findall(r"^\s+(?:ROOT )?%?([\w.\-]+) = [^\n]*op_name=\"[^\"]*cumsum", text, flags=re.M)
  assert cumsum and all(scopes[name][1] == "other" for name in cumsum), (cumsum, scopes)


def test_a_traced_decode_splits_its_work_by_step_scope(pair):
  target, prompts = pair
  seconds = profile_step_scopes(target, noisy_copy(target, 0.05, 1).with_first_layers(1), prompts,
                                draft_len=3, max_new_tokens=16)
  assert set(seconds) == set(STEP_SCOPES) | {"other"}
  # Every phase's compiled ops ran and were found in the trace under its scope (how large each is
  # on a 61-token model is noise, and not asserted).
  assert all(0 < seconds[scope] < 1 for scope in STEP_SCOPES), seconds


def test_the_script_prints_a_row_per_batch_size():
  repo = pathlib.Path(__file__).resolve().parents[1]
  run = subprocess.run([PYTHON, "-m", "experiments.benchmarks.step_phases",
                        "--target=smollm2-135m-draft", "--draft=ngram", "--batch_sizes=1",
                        "--num_prompts=1", "--max_new_tokens=8", "--warm_steps=1", "--steps=2",
                        "--repeats=1", "--profile"], cwd=repo, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| 1 |")]
  assert len(rows[0]) == 10, run.stdout
  assert all(float(cell.split()[0]) >= 0 for cell in rows[0][2:5]), rows  # plain, loop, step in ms
  # --profile: a second row for B = 1, the milliseconds of every scope and "other".
  assert len(rows) == 2 and len(rows[1]) == len(STEP_SCOPES) + 2, run.stdout
  assert all(float(cell.split()[0]) >= 0 for cell in rows[1][1:]), rows
