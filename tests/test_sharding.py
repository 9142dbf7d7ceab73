"""BASS on a jax.sharding mesh: the 8-device suite (in a child process), two processes on 127.0.0.1
decoding as one, and what needs no second device (flag parsing, rule-table coverage, errors).

The suite itself runs on one CPU device. ``tests/multidevice`` needs 8 (XLA's
``--xla_force_host_platform_device_count``, which must be set before JAX starts), so it runs in a child
pytest; the two-process test runs ``experiments.generate`` twice, as a user launches it on two hosts,
each process with 2 CPU devices of a (2, 2) mesh and JAX's CPU collectives (gloo) between them.
"""

import json
import os
import pathlib
import re
import socket
import subprocess

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import bass_jax as bj
from bass_jax import sharding
from bass_jax.evaluation import experiment
from bass_jax.evaluation.data import load_problems
from bass_jax.models import eagle, eagle_init
from conftest import MULTIDEVICE_ENV, PYTHON, tiny_model

REPO = pathlib.Path(__file__).resolve().parents[1]


def _env(devices: int) -> dict[str, str]:
  env = dict(os.environ)
  flags = env.get("XLA_FLAGS", "")
  env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  env[MULTIDEVICE_ENV] = "1"
  return env


def test_the_multidevice_suite_passes_on_8_host_devices():
  result = subprocess.run(
      [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
       "--durations=5", "tests/multidevice"],
      cwd=REPO, env=_env(8), capture_output=True, text=True, timeout=1500)
  report = result.stdout[-10000:] + result.stderr[-3000:]
  assert result.returncode == 0, report
  assert "skipped" not in result.stdout and " passed" in result.stdout, report


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_on_localhost_decode_as_one_process(tmp_path):
  """Two processes, 2 CPU devices each, one (2, 2) mesh: the records process 0 writes equal a
  single-process, single-device decode of the same prompts; process 1 writes nothing."""
  port = _free_port()
  common = ["-m", "experiments.generate", "--target=smollm2-135m-draft", "--draft=smollm2-135m-draft",
            "--draft_num_layers=1", "--num_prompts=4", "--batch_size=4", "--max_new_tokens=16",
            "--mesh=2,2", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2"]
  procs = [subprocess.Popen(
      [PYTHON, *common, f"--process_id={i}", f"--output={tmp_path}/records{i}.jsonl",
       f"--summary_json={tmp_path}/summary{i}.json"],
      cwd=REPO, env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  try:
    logs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"process {i}:\n{log[-6000:]}"
  assert not (tmp_path / "records1.jsonl").exists() and not (tmp_path / "summary1.json").exists()
  summary = json.loads((tmp_path / "summary0.json").read_text())
  assert summary["mesh"] == {"data": 2, "model": 2} and summary["processes"] == 2
  records = [json.loads(line) for line in (tmp_path / "records0.jsonl").read_text().splitlines()]

  target = bj.load_model("smollm2-135m-draft")
  draft = bj.load_draft_spec("smollm2-135m-draft", target, num_layers=1)
  single = experiment.run_problems(target, draft, load_problems("humaneval", 4), batch_size=4,
                                   max_new_tokens=16, progress=False)
  assert [(r["task_id"], r["num_tokens"], r["completion"]) for r in records] == [
      (r["task_id"], r["num_tokens"], r["completion"]) for r in single.records]


def test_script_flags_are_checked_before_anything_loads():
  for flag, message in (("--mesh=2x4", "--mesh: mesh '2x4'"),
                        ("--process_id=1", "go together"),
                        ("--coordinator_address=127.0.0.1:1 --num_processes=2 --process_id=2",
                         "must be below --num_processes=2")):
    result = subprocess.run([PYTHON, "-m", "experiments.generate", *flag.split()], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and message in result.stderr, (flag, result.stderr[-2000:])


def test_parse_mesh():
  assert sharding.parse_mesh("2,4") == (2, 4)
  assert sharding.parse_mesh("model:4,data:2") == (2, 4)
  for bad in ("2", "2,4,1", "data:2,data:4", "0,8", "x:2,y:4", "two,four"):
    with pytest.raises(ValueError, match="write 'DATA,MODEL'"):
      sharding.parse_mesh(bad)


def test_meshes_are_checked():
  with pytest.raises(ValueError, match="needs 16 devices, there are 1"):
    sharding.make_mesh(4, 4)
  with pytest.raises(ValueError, match=r"must be exactly \('data', 'model'\)"):
    sharding.check_mesh(Mesh(np.array(jax.devices()).reshape(1, 1), ("x", "y")))
  assert sharding.resolve_mesh(None) is None
  with jax.set_mesh(sharding.make_mesh(1, 1)):
    assert sharding.resolve_mesh(None).shape == {"data": 1, "model": 1}


def test_a_config_class_without_its_rule_table_is_named():
  """A family's rules are its config class's PARAM_AXES; a class without them is refused in one line
  that names it and says where the table goes."""

  class NewConfig:  # a config of an architecture that brought no table
    model_type = "new"

  for call in (lambda: sharding.plan(NewConfig(), sharding.make_mesh(1, 1)),
               lambda: sharding.logical_sizes(NewConfig())):
    with pytest.raises(ValueError, match="no sharding rules for NewConfig .*give the config class a "
                                         "PARAM_AXES table"):
      call()

  class ListConfig:  # a table written with a list inside, which a plan could not hash
    model_type = "new"
    PARAM_AXES = (("embed/embedding", ["vocab", "embed"]),)

  with pytest.raises(ValueError, match="ListConfig.PARAM_AXES must be a non-empty tuple"):
    sharding.plan(ListConfig(), sharding.make_mesh(1, 1))


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "opt", "codegen", "gpt2", "qwen3",
                                    "gemma2", "gemma3_text", "phi3"])
def test_every_parameter_of_every_family_has_exactly_one_rule(family):
  import transformers  # the families as transformers configures them, converted

  from bass_jax.checkpoints import hf
  hf_configs = {
      "llama": transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, attention_bias=True, mlp_bias=True),
      "qwen2": transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2),
      "mistral": transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2),
      "opt": transformers.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=48, num_hidden_layers=2,
                                    num_attention_heads=4, word_embed_proj_dim=16,
                                    tie_word_embeddings=False),
      "codegen": transformers.CodeGenConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                            rotary_dim=4, tie_word_embeddings=False),
      "gpt2": transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                      tie_word_embeddings=False),
      "qwen3": transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, attention_bias=True),
      "gemma2": transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=8),
      "gemma3_text": transformers.Gemma3TextConfig(vocab_size=64, hidden_size=32,
                                                   intermediate_size=48, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2,
                                                   head_dim=8, tie_word_embeddings=False),
      "phi3": transformers.Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, pad_token_id=0),
  }
  config = hf.config_from_hf(hf_configs[family].to_dict())
  abstract = bj.abstract_params(config)
  plan = sharding.plan(config, sharding.make_mesh(1, 1))
  axes = plan.param_axes(abstract)
  assert len(axes) == len(jax.tree_util.tree_leaves(abstract))
  for path, logical in axes.items():  # no rule claims a dimension that is not of its kind
    matching = [a for pattern, a in sharding.param_axes_table(config)
                if re.fullmatch(pattern, "/".join(path))]
    assert len(matching) == 1, (path, matching)
  with pytest.raises(ValueError, match="no sharding rule for parameter 'extra/kernel'"):
    plan.param_axes({**abstract, "extra": {"kernel": jax.ShapeDtypeStruct((2, 2), np.float32)}})


def test_an_eagle_draft_as_it_runs_has_rules():
  target = tiny_model(0)
  config = eagle.EagleConfig(layer=target.config.with_num_layers(1), draft_vocab_size=20)
  draft_params = eagle_init.init_draft_params(config, jax.random.key(1))
  bound = eagle.bind(draft_params, np.arange(61), target.config, target.params, 20)
  plan = sharding.plan(config, sharding.make_mesh(1, 1), "tensor_parallel")
  assert len(plan.param_axes(bound)) == len(jax.tree_util.tree_leaves(bound))


def test_a_one_device_mesh_decodes_as_no_mesh():
  target, draft = tiny_model(0), tiny_model(1, num_hidden_layers=1)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
  want = bj.generate(target, draft, prompts, max_new_tokens=8)
  got = bj.generate(target, draft, prompts, max_new_tokens=8, mesh=sharding.make_mesh(1, 1))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert got.stats.mesh == {"data": 1, "model": 1} and want.stats.mesh == {}
  with pytest.raises(ValueError, match="draft_sharding must be one of"):
    bj.generate(target, draft, prompts, max_new_tokens=8, mesh=sharding.make_mesh(1, 1),
                draft_sharding="sharded")
