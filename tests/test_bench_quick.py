"""Quick runs of the developer benchmarks that no other test runs: each exits 0 on this CPU, in the
smallest setting that still runs every part, and prints or writes what its docstring promises (the
numbers themselves are timings, which tests do not judge)."""

import json
import os
import pathlib
import subprocess

import jax
import numpy as np
import pytest

import bass_jax as bj
from conftest import PYTHON, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(*args, timeout=600, env=None):
  run = subprocess.run([PYTHON, "-m", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, env=env)
  assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
  return run.stdout


def test_bench_top_p_prints_a_row_per_method():
  out = _run("experiments.benchmarks.bench_top_p", "--rows=2", "--vocab=512", "--repeats=1")
  rows = [line for line in out.splitlines() if line.startswith("| ") and "ms per call" not in line]
  assert [r.split(" | ")[0][2:] for r in rows] == [
      "full sort (jnp.sort)", "lax.top_k(64)", "bisection over bit patterns",
      "top_p_filter (top_p=0.95)", "jnp.argmax", "warp.first_argmax"]
  assert all(float(r.split(" | ")[1].rstrip(" |")) >= 0 for r in rows)


def test_bench_compile_quick_times_each_kind(tmp_path):
  # --quick keeps --kinds where given: one kind compiles (goodput, the other quick kind, costs the most).
  _run("experiments.benchmarks.bench_compile", "--quick", "--kinds=regular",
       f"--results_dir={tmp_path}")
  result = json.loads((tmp_path / "bench_compile.json").read_text())
  assert [r["kind"] for r in result["rows"]] == ["regular"], result["rows"]
  row = result["rows"][0]
  assert row["lower_s"] > 0 and row["compile_decode_s"] > 0 and row["ms_per_step"] > 0
  assert result["jax_version"] and result["device"].startswith("cpu")


def test_bench_many_programs_reports_maps_per_setting(tmp_path):
  out = _run("experiments.benchmarks.bench_many_programs", "--configs=3", "--every=1",
             "--cache_size=2", f"--results_dir={tmp_path}")
  result = json.loads((tmp_path / "bench_many_programs.json").read_text())
  assert [r["settings"] for r in result["rows"]] == [1, 2, 3]
  assert all(r["compiled"] == r["settings"] and r["maps"] > 0 for r in result["rows"])
  assert result["verdict"] and "vm.max_map_count" in out


def test_bench_plain_steps_decodes_only_plain_steps(tmp_path):
  import transformers

  tokenizer = transformers.AutoTokenizer.from_pretrained(str(REPO / "bass_jax" / "drafts" /
                                                             "smollm2-135m-draft"))
  config = tiny_config(vocab_size=tokenizer.vocab_size)
  bj.save_model(bj.Model(config, bj.init_params(config, jax.random.key(0)), tokenizer),
                tmp_path / "tiny")
  (tmp_path / "prompts.jsonl").write_text("".join(
      json.dumps({"prompt": f"def f{i}(x):\n    return " + "x + " * i}) + "\n" for i in range(2)))
  out = _run("experiments.benchmarks.bench_plain_steps", f"--target={tmp_path / 'tiny'}",
             f"--proposers={tmp_path / 'tiny'},ngram", f"--prompts={tmp_path / 'prompts.jsonl'}",
             "--num_prompts=2", "--batch_size=2", "--max_new_tokens=6", "--rounds=1")
  rows = [line for line in out.splitlines() if line.startswith("| ") and "variant" not in line]
  assert [r.split(" | ")[0][2:] for r in rows] == [
      "regular decoding", f"BASS, {tmp_path / 'tiny'}, plain steps only", "BASS, ngram, plain steps only"]
  assert "1.00x" in rows[0] and all(" 1.00 |" in r for r in rows[1:])  # every step plain


def test_memory_builds_what_it_computes_and_splits_it_over_the_mesh(tmp_path):
  """Llama-3.2-1B's shape (its vocabulary cut to 4,096) with 2 layers on 2 host devices: the
  computed bytes per device are the shape's own count (weights whole on (2, 1), about half on
  (1, 2); the cache's rows or KV heads halved), and the layer built for real on (1, 2) holds exactly
  what was computed for it."""
  # XLA's default flags, not the suite's (conftest._SUITE_XLA_FLAGS): the built layer's random
  # initialization at the suite's optimization level 0 takes twice as long (6.3 s against 3.5).
  _run("experiments.benchmarks.memory", "--shape=llama-3.2-1b:vocab=4096", "--num_layers=2",
       "--instantiate_layers=1", "--meshes=1x2,2x1", "--host_devices=2", "--batch_size=2",
       "--cache_len=16", f"--output={tmp_path / 'memory.json'}", env=dict(os.environ, XLA_FLAGS=""))
  rows = {(r["data"], r["model"]): r
          for r in json.loads((tmp_path / "memory.json").read_text())["rows"]}
  assert sorted(rows) == [(1, 2), (2, 1)]
  # Llama-3.2-1B's config.json: D 2048, F 8192, 32 query and 8 KV heads of 64, tied head; bf16.
  d, f, q, kv, v, layers, gib = 2048, 8192, 32 * 64, 8 * 64, 4096, 2, 2**30
  weights = 2 * (v * d + layers * (2 * d * q + 2 * d * kv + 3 * d * f + 2 * d) + d)
  cache = 2 * layers * 2 * 2 * 16 * kv  # K and V, B = 2, S = 16
  assert rows[2, 1]["params_gib"] == pytest.approx(weights / gib, rel=1e-6)
  assert rows[1, 2]["params_gib"] == pytest.approx(weights / 2 / gib, rel=1e-3)
  for mesh in rows:
    assert rows[mesh]["cache_gib"] == pytest.approx(cache / 2 / gib, rel=1e-3)
  built = rows[1, 2]
  assert "built_layers" not in rows[2, 1] and built["built_layers"] == 1
  assert built["built_params_gib"] == built["computed_params_gib_at_built_layers"] > 0
  assert built["built_cache_gib"] == built["computed_cache_gib_at_built_layers"] > 0


def test_step_costs_prints_a_row_per_batch_size():
  """The shipped draft as the target and the n-gram lookup as the draft: a goodput decode per batch
  size, its measured costs and the break-even acceptance (a probability; 1 at l = 0 where no
  length pays, which timings on a busy machine may make so)."""
  out = _run("experiments.benchmarks.step_costs",
             f"--target={REPO / 'bass_jax' / 'drafts' / 'smollm2-135m-draft'}", "--draft=ngram",
             "--num_prompts=2", "--batch_sizes=1,2", "--max_new_tokens=8")
  rows = [line.strip("| ").split(" | ") for line in out.splitlines()
          if line.startswith("| ") and not line.startswith("| B ")]
  assert [r[0] for r in rows] == ["1", "2"], out
  for row in rows:
    assert float(row[1]) > 0 and float(row[2]) > 0 and int(row[3]) >= 1, row
    assert 0 <= float(row[7]) <= 1 and int(row[8]) >= 0, row


def test_every_script_starts_through_the_runner_that_refuses_stray_arguments():
  """Every script's ``__main__`` block is ``_io.run(main)``, the one place that refuses an argument
  that is not a flag (a mistyped ``-quick`` or ``--batch_size 4`` would otherwise be ignored) and
  prints its refusals in one line."""
  import ast

  scripts = {}
  for file in sorted((REPO / "experiments").rglob("*.py")):
    for node in ast.parse(file.read_text()).body:
      if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
        scripts[file.relative_to(REPO).as_posix()] = [ast.unparse(n) for n in node.body]
  assert len(scripts) >= 30, sorted(scripts)
  assert {f: body for f, body in scripts.items() if body != ["_io.run(main)"]} == {}


@pytest.mark.parametrize("script", ["benchmarks.bench_sharding", "benchmarks.eagle_vocab",
                                    "benchmarks.sweep", "paper.report"])
def test_the_scripts_refuse_a_stray_argument_in_one_line(script):
  """Through ``_io.run``: bench_sharding (the real SmolLM2 on 8 host devices) and eagle_vocab (an
  exported draft and a feature corpus) need more than a quick run affords; the sweep and the report
  ignored a stray argument before."""
  run = subprocess.run([PYTHON, "-m", f"experiments.{script}", "stray"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2 and "unexpected arguments ['stray']" in run.stderr, run.stderr[-2000:]
  assert len(run.stderr.strip().splitlines()) == 1


def test_eagle_vocab_without_a_corpus_says_how_to_build_one(tmp_path):
  run = subprocess.run([PYTHON, "-m", "experiments.benchmarks.eagle_vocab",
                        f"--corpus={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2 and "holds no gen_eval_*.npz shards" in run.stderr, run.stderr[-2000:]
  assert "build_corpus" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_bench_gguf_read_times_both_readers_of_the_same_file(tmp_path):
  """Both readers of a small GGUF (a token list, f32 and Q8_0 tensors of fresh random values) read the
  same fields and tensors, and a row each is printed; a file that is not .gguf is one line."""
  import gguf

  rng = np.random.default_rng()
  path = tmp_path / "small.gguf"
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_token_list([f"<t{i}>" for i in range(500)])
  writer.add_token_scores(rng.normal(size=500).astype(np.float32).tolist())
  writer.add_tensor("a.weight", rng.normal(size=(4, 64)).astype(np.float32))
  writer.add_tensor("b.weight", gguf.quants.quantize(rng.normal(size=(8, 64)).astype(np.float32),
                                                     gguf.GGMLQuantizationType.Q8_0),
                    raw_dtype=gguf.GGMLQuantizationType.Q8_0)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  out = _run("experiments.benchmarks.bench_gguf_read", f"--model={path}", "--repeats=2")
  rows = [line.split(" | ")[0][2:] for line in out.splitlines() if line.endswith("x |")]
  assert rows == ["gguf.GGUFReader", "over a plain view (bass_jax)"], out
  assert "2 tensors, 2 rounds" in out
  run = subprocess.run([PYTHON, "-m", "experiments.benchmarks.bench_gguf_read",
                        f"--model={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2 and "is not a .gguf file" in run.stderr, run.stderr[-2000:]
  assert len(run.stderr.strip().splitlines()) == 1


def test_random_shapes_take_a_layer_count_and_a_vocabulary_once_each():
  """``random:<shape>[:layers=N][:vocab=V]`` (experiments._shapes): the published shape with N layers
  and V tokens where given; anything else is refused naming the grammar."""
  from experiments import _shapes  # pylint: disable=g-import-not-at-top

  config = _shapes.shape_config("random:smollm2-135m:layers=2:vocab=4096")
  assert (config.num_hidden_layers, config.vocab_size, config.hidden_size) == (2, 4096, 576)
  assert _shapes.shape_config("smollm2-135m:vocab=10").num_hidden_layers == 30
  for bad in ("random:smollm2-135m:layers=2:layers=3", "random:smollm2-135m:foo=1",
              "random:smollm2-135m:vocab=0", "random:smollm2-135m:", "random:smollm2-135m:layers=x"):
    with pytest.raises(ValueError, match=r"write random:<shape>\[:layers=N\]\[:vocab=V\]"):
      _shapes.shape_config(bad)
  with pytest.raises(ValueError, match="unknown shape 'gpt-5'"):
    _shapes.shape_config("random:gpt-5")
