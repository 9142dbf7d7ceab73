"""The suite's own measuring tools: the compile census (tests/_compile_census.py) and the per-file
tables of tests/suite_times.py."""

import itertools
import json
import pathlib
import types

import jax
import jax.numpy as jnp
import pytest

import _compile_census
import bass_jax as bj
import suite_times
from conftest import tiny_config

# Array and vocabulary sizes no other test uses, so that every program here is compiled here.
_FRESH_SIZES = itertools.count(4093)


def _in_test(census, name, work):
  """Runs ``work()`` as the test file ``name`` would, through the census's pytest hook."""
  hook = census.pytest_runtest_protocol(types.SimpleNamespace(path=pathlib.Path(name)), None)
  next(hook)
  work()
  with pytest.raises(StopIteration):
    hook.send(None)


def test_the_census_counts_a_files_compiles_and_its_init_programs_apart(tmp_path, capsys):
  size = next(_FRESH_SIZES)
  key = jax.random.key(0)
  config = tiny_config(num_hidden_layers=1, vocab_size=size)
  census = _compile_census.Census(str(tmp_path))
  try:
    _in_test(census, "test_a.py", lambda: jax.jit(lambda x: jnp.sin(x) * 2)(
        jnp.ones(size)).block_until_ready())
    _in_test(census, "test_b.py", lambda: bj.init_params(config, key))  # its program alone
    jax.jit(lambda x: x + 1)(jnp.ones(size + 1)).block_until_ready()  # outside any test
    path = pathlib.Path(census.write())
  finally:
    census.close()
  census.close()  # a second close does nothing
  got = json.loads(path.read_text())
  a, b = got["test_a.py"], got["test_b.py"]
  assert a["trace"] > 0 and a["lower"] > 0 and a["compile"] > 0 and "init" not in a, a
  # init_params' program: every phase of it counted as init, tracing, lowering and XLA alike.
  assert b["trace"] > 0 and b["lower"] > 0 and b["compile"] > 0, b
  assert b["init"] == pytest.approx(b["trace"] + b["lower"] + b["compile"]), b
  assert got[_compile_census.OUTSIDE]["compile"] > 0
  # After close() nothing is counted.
  jax.jit(lambda x: x * 3)(jnp.ones(size + 2)).block_until_ready()
  assert json.loads(pathlib.Path(census.write()).read_text()) == got

  # suite_times sums the processes' files per test file.
  (tmp_path / "2.json").write_text(json.dumps({"test_a.py": {"trace": 1.0, "compile": 2.0}}))
  sums = suite_times.census(str(tmp_path))
  assert sums["test_a.py"]["compile"] == a["compile"] + 2.0
  suite_times.print_census(sums)
  rows = capsys.readouterr().out.splitlines()
  assert rows[0].startswith("| file | tracing | lowering | XLA compile") and rows[-1].startswith(
      "| **total** |")


def test_suite_times_sums_junit_xml_per_file(tmp_path, capsys):
  xml = tmp_path / "run.xml"
  xml.write_text('<testsuites><testsuite>'
                 '<testcase classname="tests.test_a" name="t1" time="7.5"/>'
                 '<testcase classname="tests.test_a" name="t2" time="4.0"/>'
                 '<testcase classname="tests.test_b" name="t1" time="2.25"/>'
                 '</testsuite></testsuites>')
  assert suite_times.per_file(str(xml)) == {"test_a": 11.5, "test_b": 2.25}
  suite_times.main([f"one={xml}", "--alone=test_b"])
  out = capsys.readouterr().out
  assert "| test_a | 12 |" in out and "| files under 10 s in every run | 2 |" in out
  assert "files left alone: 2" in out and "the others over them: 5.11" in out
  with pytest.raises(SystemExit, match="no census files"):
    suite_times.census(str(tmp_path / "empty"))
