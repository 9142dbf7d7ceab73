"""experiments.benchmarks.bench_model_size on its tiny shape: the random checkpoints written (sharded
safetensors) and reused, both models loaded, regular decoding and BASS timed, and the table and JSON
holding every field with sane values. In a child process: the script's absl flags would collide with
other scripts' in the test process."""

import json
import pathlib
import subprocess

import bass_jax as bj
from conftest import PYTHON

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(*args):
  return subprocess.run([PYTHON, "-m", "experiments.benchmarks.bench_model_size", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)


def test_tiny_shape_end_to_end(tmp_path):
  checkpoints, results = tmp_path / "checkpoints", tmp_path / "results"
  run = _run("--shape=tiny", f"--checkpoint_dir={checkpoints}", f"--results_dir={results}",
             "--max_shard_size=100KB", "--batch_sizes=2", "--max_new_tokens=8")
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((results / "bench_model_size_tiny_float32.json").read_text())
  assert result["complete"] and result["table"] in run.stdout
  for column in ("KV cache", "compile s", "ms / step (fastest)", "ms / token (fastest)",
                 "accepted / step"):
    assert column in result["table"]
  assert "acceptance means nothing" in result["table"]
  # Written once, as a real checkpoint: sharded safetensors with an index, then reused.
  for name in ("tiny", "tiny-draft"):
    assert (checkpoints / name / "model.safetensors.index.json").is_file()
    assert len(list((checkpoints / name).glob("model-*.safetensors"))) >= 2
  assert result["checkpoints"]["target"]["written"] and result["checkpoints"]["writer"]["seconds"] > 0

  # the script's shape table, read in a child process (its absl flags would collide with others')
  fields = json.loads(subprocess.run(
      [PYTHON, "-c", "import json; from experiments.benchmarks import bench_model_size as b; "
       "print(json.dumps(b.SHAPES['tiny']))"], capture_output=True, text=True, check=True).stdout)
  for name, layers in (("target", 2), ("draft", 1)):
    config = bj.LlamaConfig.from_hf_config({**fields, "num_hidden_layers": layers})
    assert config.rotary.rope_type == "llama3" and result[name]["rope_type"] == "llama3"
    assert result[name]["layers"] == layers
    assert result[name]["num_params"] == config.num_params()
    assert result[name]["param_bytes"] == config.num_params() * 4  # float32
    assert result[name]["load_s"] > 0
  params = result["target"]["param_bytes"] + result["draft"]["param_bytes"]
  assert result["peak_rss_bytes"] >= result["peak_rss_after_load_bytes"] > params

  runs = {(r["batch_size"], r["method"]): r for r in result["runs"]}
  # One batch size of two rows: every per-row figure (the KV bytes below) is checked times B.
  assert set(runs) == {(2, "regular"), (2, "bass")}
  for (batch, method), r in runs.items():
    assert r["compile_s"] > 0 and r["first_call_s"] >= r["compile_s"]
    assert r["first_token_ms"] > 0 and r["ms_per_step"] >= r["ms_per_step_fastest"] > 0
    assert r["ms_per_token"] >= r["ms_per_token_fastest"] > 0 and len(r["ms_per_step_each"]) == 3
    assert r["batch_bucket"] == batch and r["cache_slots"] >= 32 + 8
    kv = 2 * fields["num_hidden_layers"] * batch * r["cache_slots"] * fields["num_key_value_heads"] * (
        fields["head_dim"] * 4) + batch * 4  # K and V in f32, and the i32 lengths
    assert r["target_kv_bytes"] == kv
    if method == "regular":
      assert r["accepted_per_step"] is None and r["draft_kv_bytes"] == 0
      assert r["tokens_per_step"] == 1.0 and r["target_forwards_per_step"] == 1.0
    else:
      assert 0 <= r["accepted_per_step"] <= 4 and r["drafts_per_step"] == 4
      assert r["draft_kv_bytes"] == (kv - batch * 4) // 2 + batch * 4  # one layer of the two
      assert 1.0 <= r["tokens_per_step"] <= 5 and r["target_forwards_per_step"] >= 1

  # Another seed would be other weights: the directory is refused by name, in one line, not replaced.
  refused = _run("--shape=tiny", f"--checkpoint_dir={checkpoints}", f"--results_dir={tmp_path / 'r2'}",
                 "--seed=1")
  assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
  assert f"{checkpoints / 'tiny'} exists but was not written" in refused.stderr
