"""experiments.benchmarks.bench_scale: the one-command GPU benchmark's --quick run on this CPU (every part,
three processes), its records and report, and its refusals."""

import json
import pathlib
import subprocess

import pytest

from conftest import PYTHON

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args, check=True):
  # From the repository's root, `-m experiments...` imports the working tree's scripts (and so does
  # every step bench_scale starts, in the same directory): no PYTHONPATH, which would also keep the
  # suite's zygote from forking the runs (tests/_zygote.py, IMPORT_TIME_ENV).
  return subprocess.run([PYTHON, "-m", "experiments.benchmarks.bench_scale", *args], cwd=ROOT,
                        capture_output=True, text=True, check=check, timeout=600)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench_scale")
  result = _run("--quick", f"--results_dir={out}")
  records = [json.loads(line) for line in (out / "bench_scale.jsonl").read_text().splitlines()]
  return out, records, result.stdout


def test_quick_run_measures_every_part(quick):
  out, records, stdout = quick
  kinds = {(r["variant"], r["kind"]) for r in records}
  assert {("default", "bandwidth"), ("default", "forward"), ("default", "draft_forward"),
          ("default", "e2e"), ("while", "e2e"), ("xla_defaults", "forward")} <= kinds, kinds
  assert not [r for r in records if "error" in r]
  keys = [r["key"] for r in records]
  assert len(keys) == len(set(keys)), keys  # each cell measured once: the goal cells not again later
  forward = [r for r in records if r["kind"] == "forward" and r["variant"] == "default"]
  assert {(r["batch"], r["num_new"]) for r in forward} == {(2, 1), (2, 3)}  # the goal cell, the rest
  for r in forward:
    assert r["ms"] > 0 and 0 < r["roofline_ms"] and r["hbm_fraction"] == pytest.approx(
        r["roofline_ms"] / r["ms"])
    assert r["device"].startswith("cpu") and r["jax_version"] and r["date"]
  e2e = {(r["variant"], r["batch"], r["method"]): r for r in records if r["kind"] == "e2e"}
  for (variant, batch, method), r in e2e.items():
    assert r["tokens"] == batch * 8 and r["tokens_per_s"] > 0 and r["ms_per_step"] > 0
    if method == "bass":
      # Greedy BASS with the replay emits regular decoding's tokens, and accepts drafts.
      assert r["tokens_equal_regular"] and r["mean_accepted_length"] > 1.0, r
      # One process's tokens are the other's: command buffers change no token.
    base = e2e[("default", batch, method)]
    assert base["tokens_sha1"] == r["tokens_sha1"], (variant, batch, method)
  report = (out / "bench_scale.md").read_text()
  assert "End to end" in report and "Command buffers" in report and "xla_defaults" in report
  assert json.loads((out / "bench_scale.json").read_text())["records"] == records
  assert "bench_scale: results in" in stdout


def test_a_second_run_needs_resume_and_measures_nothing_again(quick):
  out, records, _ = quick
  refused = _run("--quick", f"--results_dir={out}", check=False)
  assert refused.returncode == 2 and "--resume" in refused.stderr
  assert len(refused.stderr.strip().splitlines()) == 1
  _run("--quick", f"--results_dir={out}", "--resume", "--parts=forward")
  again = (out / "bench_scale.jsonl").read_text().splitlines()
  assert len(again) == len(records)  # every record was there: nothing measured twice


@pytest.mark.parametrize("flag,match", [("--draft_len=0", "draft_len"), ("--acceptance=1.5", "acceptance"),
                                        ("--parts=forward,nope", "parts")])
def test_bad_flags_are_refused_in_one_line(tmp_path, flag, match):
  result = _run("--quick", f"--results_dir={tmp_path}", flag, check=False)
  assert result.returncode == 2 and match in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
