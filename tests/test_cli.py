"""The main job's command line fails fast on bad input and loses nothing when interrupted.

`experiments.generate` runs in a subprocess, as a user runs it: flag and output-path errors must come
back in seconds, before any model is loaded; a run killed mid-way (Ctrl-C or SIGKILL) must keep every
batch it finished, as complete JSON lines. The model is a tiny random Llama carrying SmolLM2's tokenizer
(from the shipped draft's directory), saved once per module.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import pytest

import bass_jax as bj
from conftest import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "bass_jax" / "drafts" / "smollm2-135m-draft"
NUM_PROMPTS = 40
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  import transformers

  root = tmp_path_factory.mktemp("cli")
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(SHIPPED_DRAFT))
  config = tiny_config(vocab_size=tokenizer.vocab_size, eos_token_id=None)
  bj.save_model(bj.Model(config, bj.init_params(config, jax.random.key(0)), tokenizer),
                root / "tiny")
  prompts = root / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"def f{i}(x):\n    return"})
                             + "\n" for i in range(NUM_PROMPTS)))
  return root


def _args(setup, *extra):
  return [sys.executable, "-m", "experiments.generate", f"--target={setup / 'tiny'}",
          f"--draft={setup / 'tiny'}", f"--prompts={setup / 'prompts.jsonl'}", *extra]


@pytest.mark.parametrize("flag,message", [
    ("--output={file}/out.jsonl", "is a file, not a directory"),
    ("--output={dir}", "is a directory"),
    ("--summary_json={dir}/", "is a directory"),
    ("--batch_size=0", "batch_size"),
    ("--top_p=0", "top_p"),
    ("--temperature=-1", "temperature"),
    ("--draft_len=often", "draft_len"),
    ("--num_prompts=40 --batch_size=50", "distinct_prompts needs at least batch_size=50"),
])
def test_bad_flags_fail_in_seconds_before_loading_a_model(setup, tmp_path, flag, message):
  (tmp_path / "a_file").write_text("")
  flag = flag.format(file=tmp_path / "a_file", dir=tmp_path)
  start = time.perf_counter()
  result = subprocess.run(_args(setup, *flag.split()), cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=ENV)
  elapsed = time.perf_counter() - start
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert "loading target" not in result.stderr and "Traceback" not in result.stderr
  assert elapsed < 5.0, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_run_keeps_every_finished_batch(setup, tmp_path, sig):
  out, summary = tmp_path / "records.jsonl", tmp_path / "summary.json"
  proc = subprocess.Popen(
      _args(setup, "--method=regular", f"--num_prompts={NUM_PROMPTS}", "--batch_size=1",
            "--max_new_tokens=256", f"--output={out}", f"--summary_json={summary}"),
      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
  try:
    deadline = time.time() + 240
    while not (out.exists() and out.read_text().count("\n") >= 2):
      assert proc.poll() is None, proc.stderr.read()[-2000:]
      assert time.time() < deadline, "no batch finished in time"
      time.sleep(0.02)
    proc.send_signal(sig)
    proc.wait(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode != 0
  lines = out.read_text().splitlines()
  records = [json.loads(line) for line in lines]  # every line is a complete record
  assert 2 <= len(records) < NUM_PROMPTS
  assert [r["task_id"] for r in records] == [f"t{i}" for i in range(len(records))]
  assert all(r["num_tokens"] == 256 for r in records)
  assert not summary.exists()  # the summary is written whole at the end, or not at all


def test_a_greedy_experiment_with_too_few_prompts_fails_before_loading(tmp_path):
  """Greedy batches hold distinct prompts: the paper's experiments check --num_prompts up front."""
  start = time.perf_counter()
  result = subprocess.run(
      [sys.executable, "-m", "experiments.latency", "--num_prompts=2", "--batch_sizes=1,4",
       "--sampling=greedy", f"--results_dir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)
  assert result.returncode != 0
  assert "--num_prompts=2 is fewer than the largest of --batch_sizes=1,4" in result.stderr, \
      result.stderr[-2000:]
  assert "Traceback" not in result.stderr and time.perf_counter() - start < 5.0
