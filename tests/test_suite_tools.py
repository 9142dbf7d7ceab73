"""The suite's own measuring tools: the compile census (tests/_compile_census.py) and the per-file
tables of tests/suite_times.py."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np

import _compile_census
import bass_jax as bj
import suite_times
from conftest import tiny_config


def test_the_census_counts_a_files_compiles_and_its_init_programs_apart(tmp_path, capsys):
  census = _compile_census.Census(str(tmp_path))
  try:
    item = types.SimpleNamespace(path=types.SimpleNamespace(name="test_a.py"))
    hook = census.pytest_runtest_protocol(item, None)
    next(hook)  # the test starts
    # A size no other test uses: programs, and a tiny config, no test compiled before in this process.
    shape = int(np.random.default_rng().integers(1000, 5000))
    jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(shape)).block_until_ready()
    # A config of its own, so that init_params compiles its program here.
    bj.init_params(tiny_config(num_hidden_layers=1, vocab_size=shape), jax.random.key(0))
    next(hook, None)  # the test ends
    jax.jit(lambda x: x + 1)(jnp.ones(shape + 1)).block_until_ready()  # outside any test
    path = census.write()
  finally:
    census.close()
  got = json.loads(open(path).read())
  a = got["test_a.py"]
  assert a["trace"] > 0 and a["lower"] > 0 and a["compile"] > 0, a
  assert 0 < a["init"] < a["trace"] + a["lower"] + a["compile"], a
  assert got[_compile_census.OUTSIDE]["compile"] > 0 and "init" not in got[_compile_census.OUTSIDE]
  # After close() nothing is counted.
  jax.jit(lambda x: x * 3)(jnp.ones(shape + 2)).block_until_ready()
  assert json.loads(open(census.write()).read()) == got

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
