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
  args = _args(setup, "--method=regular", f"--num_prompts={NUM_PROMPTS}", "--batch_size=1",
               "--nocontinuous", "--max_new_tokens=256", f"--output={out}",
               f"--summary_json={summary}")
  # A suite launched in the background inherits SIGINT ignored, and so would the script: run it with
  # Python's own Ctrl-C handler installed, as in a terminal.
  assert args[1:3] == ["-m", "experiments.generate"]
  restore_ctrl_c = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "runpy.run_module('experiments.generate', run_name='__main__', alter_sys=True)")
  proc = subprocess.Popen(
      [args[0], "-c", restore_ctrl_c, *args[3:]],
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


@pytest.mark.slow
def test_the_draft_study_writes_every_cell_and_resumes(setup, tmp_path):
  """experiments.draft_study on the tiny model: every (temperature, batch) cell and proposer in the
  table, each cell from its own child process; --resume reruns nothing and keeps the reading. (One
  policy: the study loops over policies as over proposers, and each costs a compile.)"""
  args = [sys.executable, "-m", "experiments.draft_study", f"--target={setup / 'tiny'}",
          f"--proposers={setup / 'tiny'},ngram", "--names=tiny,ngram",
          f"--prompts={setup / 'prompts.jsonl'}", "--num_prompts=2", "--batch_sizes=2",
          "--temperatures=0,0.5", "--draft_lens=goodput", "--max_new_tokens=4",
          f"--results_dir={tmp_path}", f"--output={tmp_path / 'study.md'}"]
  bad = subprocess.run(args + ["--draft_lens=often"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=ENV)
  assert bad.returncode != 0 and "--draft_lens" in bad.stderr
  result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900, env=ENV)
  assert result.returncode == 0, result.stderr[-3000:]
  raw = json.loads((tmp_path / "draft_study.json").read_text())
  assert raw["complete"] and sorted(raw["runs"]) == ["0", "0.5"]
  for cells in raw["runs"].values():
    assert sorted(cells) == ["2"]
    for cell in cells.values():
      assert len(cell["regular"]) == 2 and min(cell["regular"]) > 0
      assert sorted(cell["bass"]) == ["ngram|goodput", "tiny|goodput"]
      assert cell["bass"]["tiny|goodput"]["step_costs"]["plain"] > 0
  text = (tmp_path / "study.md").read_text()
  assert text.count("| tiny | goodput |") == 4 and text.count("| ngram | goodput |") == 4  # 2 x 2 tables
  assert not list(tmp_path.glob("draft_study_cell_*"))  # the children's files are merged and removed
  (tmp_path / "study.md").write_text(text + "\n## Reading\n\nHand-written.\n")
  again = subprocess.run(args + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=ENV)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("already in") == 2 and "Hand-written." in (tmp_path / "study.md").read_text()
