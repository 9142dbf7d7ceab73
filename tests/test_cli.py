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
import time

import jax
import pytest

import bass_jax as bj
from conftest import PYTHON, send_signal, shared_jax_cache, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "bass_jax" / "drafts" / "smollm2-135m-draft"
NUM_PROMPTS = 40
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  import transformers

  root = tmp_path_factory.mktemp("cli")
  # The scripts run here compile the same few programs again and again (a run, its killed twin, the
  # resumed run): one persistent compilation cache for the module's processes saves those compiles.
  ENV.update(shared_jax_cache(root / "xla"))
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(SHIPPED_DRAFT))
  config = tiny_config(vocab_size=tokenizer.vocab_size, eos_token_id=None)
  bj.save_model(bj.Model(config, bj.init_params(config, jax.random.key(0)), tokenizer),
                root / "tiny")
  prompts = root / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"def f{i}(x):\n    return"})
                             + "\n" for i in range(NUM_PROMPTS)))
  return root


def _args(setup, *extra):
  return [PYTHON, "-m", "experiments.generate", f"--target={setup / 'tiny'}",
          f"--draft={setup / 'tiny'}", f"--prompts={setup / 'prompts.jsonl'}", *extra]


def _signal_after(command, out: pathlib.Path, *, lines: int, sig) -> subprocess.Popen:
  """Runs ``command``, sends it ``sig`` as soon as ``out`` holds ``lines`` complete lines (records on
  disk), and returns the ended process. Fails if it ends, or writes nothing, first."""
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env=ENV)
  try:
    deadline = time.time() + 300
    while not (out.exists() and out.read_text().count("\n") >= lines):
      assert proc.poll() is None, proc.stderr.read()[-2000:]
      assert time.time() < deadline, f"{lines} records were not written in time"
      time.sleep(0.01)
    send_signal(proc, sig)
    proc.wait(timeout=60)
  finally:
    proc.kill()  # a zygote's worker ends with its launcher
  return proc


@pytest.mark.parametrize("flag,message", [
    ("--top_p=nan", "top_p"),  # absl's flag validation
    ("--output={file}/out.jsonl", "is a file, not a directory"),  # the output paths
    ("--prompts={dir}/broken.jsonl", "broken.jsonl:1: not valid JSON"),  # the prompts file
    ("--target={dir}/no_tokenizer", "ships no tokenizer"),  # the models' configs, read
    ("--max_new_tokens=100000", "--max_new_tokens=100000 does not fit the models' context of 2048"),
    ("--draft=py:no_such_module.Lookup", "cannot import 'no_such_module.Lookup'"),  # an import
    ("--mesh=3,3", "--mesh=3,3 needs 9 devices"),  # init_script's, which generate.check skips
])
def test_bad_flags_fail_in_seconds_before_loading_a_model(setup, tmp_path, flag, message):
  """Each bad input: one line on stderr naming it, exit status 2, before any model loads. One real
  process per stage of the checks; the rest of this list (and generated bad values for every flag)
  are checked in-process by tests/cli_flags/test_generate_refusals.py, on this module's setting."""
  (tmp_path / "a_file").write_text("")
  (tmp_path / "broken.jsonl").write_text('{"prompt": "def f():"\n')
  no_tokenizer = tmp_path / "no_tokenizer"
  no_tokenizer.mkdir()
  (no_tokenizer / "config.json").write_text((setup / "tiny" / "config.json").read_text())
  flag = flag.format(file=tmp_path / "a_file", dir=tmp_path)
  start = time.perf_counter()
  result = subprocess.run(_args(setup, "--num_prompts=4", "--batch_size=2", *flag.split()),
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)
  elapsed = time.perf_counter() - start
  assert result.returncode == 2, result.stderr[-2000:]
  assert message in result.stderr, result.stderr[-2000:]
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
  assert "loading target" not in result.stderr and "Traceback" not in result.stderr
  # A ceiling that only a model load (or a hung check) reaches on a loaded 2-core CI; about 3 s quiet.
  assert elapsed < 30.0, f"took {elapsed:.1f} s"


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
  proc = _signal_after([args[0], "-c", restore_ctrl_c, *args[3:]], out, lines=2, sig=sig)
  assert proc.returncode != 0
  lines = out.read_text().splitlines()
  records = [json.loads(line) for line in lines]  # every line is a complete record
  assert 2 <= len(records) < NUM_PROMPTS
  assert [r["task_id"] for r in records] == [f"t{i}" for i in range(len(records))]
  assert all(r["num_tokens"] == 256 for r in records)
  assert json.loads(summary.read_text())["complete"] is False  # progress, never a finished summary


def test_every_flag_refuses_generated_bad_values_in_one_line():
  """tests/cli_flags (hypothesis: 220 generated bad values over every flag, 40 valid runs, each
  refusal that came late, and the bad flags of this module's list that it runs as no process) in a
  child process, where experiments.generate's flags are the only ones."""
  from conftest import CLI_FLAGS_ENV  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()
  result = subprocess.run(
      [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cli_flags"],
      cwd=REPO, env={**ENV, CLI_FLAGS_ENV: "1"}, capture_output=True, text=True, timeout=600)
  report = result.stdout[-10000:] + result.stderr[-3000:]
  assert result.returncode == 0, report
  assert " passed" in result.stdout and "skipped" not in result.stdout, report
  # About 10 s quiet (the hypothesis cases take about 6 s of it); a loose ceiling for a loaded machine.
  assert time.perf_counter() - start < 180, report


@pytest.mark.parametrize("args,message", [
    # Greedy batches hold distinct prompts: --num_prompts is checked up front.
    (["latency", "--num_prompts=2", "--batch_sizes=1,4", "--sampling=greedy"],
     "--num_prompts=2 is fewer than the largest of --batch_sizes=1,4"),
    (["throughput", "--draft_tree=top_k=2,depth=2,nodes=4", "--draft_tree=top_k=2,depth=3,nodes=6"],
     "needs draft_len='goodput'"),
    (["budget", "--draft_tree=depth=3,nodes=3"], "draft_tree nodes=3 must be at least depth + 1"),
    (["latency", "--draft_len=4"], "latency's --configs name their draft lengths")])
def test_the_paper_experiments_check_their_flags_before_loading(tmp_path, args, message):
  start = time.perf_counter()
  result = subprocess.run([PYTHON, "-m", f"experiments.paper.{args[0]}", *args[1:],
                           f"--results_dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr and time.perf_counter() - start < 5.0


@pytest.mark.slow
def test_the_draft_study_writes_every_cell_and_resumes(setup, tmp_path):
  """experiments.paper.draft_study on the tiny model: every proposer in the table, the cell from its own
  child process; --resume reruns nothing and keeps the reading. (One policy and one cell: the study
  loops over policies as over proposers and over cells by (temperature, batch size) alike, and each
  costs a compile or a process.)"""
  args = [PYTHON, "-m", "experiments.paper.draft_study", f"--target={setup / 'tiny'}",
          f"--proposers={setup / 'tiny'},ngram", "--names=tiny,ngram",
          f"--prompts={setup / 'prompts.jsonl'}", "--num_prompts=2", "--batch_sizes=2",
          "--temperatures=0.5", "--draft_lens=goodput", "--max_new_tokens=4",
          f"--results_dir={tmp_path}", f"--output={tmp_path / 'study.md'}"]
  bad = subprocess.run(args + ["--draft_lens=often"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=ENV)
  assert bad.returncode != 0 and "--draft_lens" in bad.stderr
  result = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900, env=ENV)
  assert result.returncode == 0, result.stderr[-3000:]
  raw = json.loads((tmp_path / "draft_study.json").read_text())
  assert raw["complete"] and sorted(raw["runs"]) == ["0.5"]
  for cells in raw["runs"].values():
    assert sorted(cells) == ["2"]
    for cell in cells.values():
      assert len(cell["regular"]) == 2 and min(cell["regular"]) > 0
      assert sorted(cell["bass"]) == ["ngram|goodput", "tiny|goodput"]
      assert cell["bass"]["tiny|goodput"]["step_costs"]["plain"] > 0
  text = (tmp_path / "study.md").read_text()
  assert text.count("| tiny | goodput |") == 2 and text.count("| ngram | goodput |") == 2  # 2 tables
  assert "| 0.5 | tiny | " in text.split("## What the cost-aware policy measured")[1]  # goodput's costs
  assert not list(tmp_path.glob("draft_study_cell_*"))  # the children's files are merged and removed
  (tmp_path / "study.md").write_text(text + "\n## Reading\n\nHand-written.\n")
  again = subprocess.run(args + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=ENV)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("already in") == 1 and "Hand-written." in (tmp_path / "study.md").read_text()


# Fields that depend on the clock or on the rows a sequence shared a step with, not on its text.
TIMING = ("finish_seconds", "wait_seconds", "ttft_seconds", "row", "accepted_drafts", "drafted",
          "steps")


def _content(path):
  records = [json.loads(line) for line in path.read_text().splitlines()]
  return [{k: round(v, 4) if k == "mean_logprob" else v for k, v in r.items() if k not in TIMING}
          for r in records]


@pytest.mark.parametrize("mode", ["--nocontinuous --temperature=1.0",
                                  "--continuous --temperature=1.0 --acceptance=gumbel"])
def test_kill_9_then_resume_gives_the_records_of_an_uninterrupted_run(setup, tmp_path, mode):
  """kill -9 once some sequences are on disk; a rerun without --resume is refused and changes
  nothing; --resume decodes the rest, and the files equal an uninterrupted run's (static sampled
  batches are decoded again whole with their own seeds, and a continuous run's sequences with
  drafter-invariant acceptance draw by their own keys, so even the draws are the same)."""
  # 16 tokens: each batch is then a fraction of a second, against a process's ~10 s to its first
  # record, and the 16 records (8 prompts, 2 samples each) still take seconds after the third.
  common = ["--method=bass", "--num_prompts=8", "--batch_size=2", "--max_new_tokens=16",
            "--draft_len=3", *mode.split()]
  full = tmp_path / "full"
  done = subprocess.run(_args(setup, *common, f"--output={full}/r.jsonl",
                              f"--summary_json={full}/s.json"),
                        cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV)
  assert done.returncode == 0, done.stderr[-3000:]
  total = len(_content(full / "r.jsonl"))
  out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
  args = _args(setup, *common, f"--output={out}", f"--summary_json={summary}")
  _signal_after(args, out, lines=3, sig=signal.SIGKILL)
  kept = out.read_bytes()
  assert 3 <= kept.count(b"\n") < total  # killed mid-run
  if mode.startswith("--continuous"):  # the refusals are the same in both modes: checked once
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, env=ENV)
    assert again.returncode == 2 and "pass --resume" in again.stderr, again.stderr[-2000:]
    assert out.read_bytes() == kept
    other = subprocess.run(args + ["--resume", "--seed=7"], cwd=REPO, capture_output=True,
                           text=True, timeout=120, env=ENV)
    assert other.returncode == 2 and "--seed: 0 on disk, 7 now" in other.stderr, other.stderr[-2000:]
  resumed = subprocess.run(args + ["--resume"], cwd=REPO, capture_output=True, text=True,
                           timeout=600, env=ENV)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _content(out) == _content(full / "r.jsonl")
  final = json.loads(summary.read_text())
  assert final["complete"] and final["resumed_records"] >= 3 and final["decoded_records"] > 0
  assert final["resumed_records"] + final["decoded_records"] == final["records"] == len(
      _content(out))
