"""Backend profiles (``bass_jax.profiles``) and the census of a decode lowered for CUDA
(``bass_jax.tooling.hlo_census``, ``generate.lower``): the GPU profile's program decodes what the CPU's does,
and, lowered for CUDA on this CPU, a BASS step reads at most 3 device values and copies no cache."""

import numpy as np
import pytest

import bass_jax as bj
from bass_jax.tooling import hlo_census
from bass_jax import platforms
from bass_jax.sampling import generate as generate_lib
from bass_jax import profiles
from conftest import PYTHON, noisy_copy, random_eagle_draft, shared_jax_cache, tiny_model
from pallas_kernels.ragged_attention import TRITON_CUSTOM_CALL
from pallas_kernels.tiling import split_count

# The GPU profile's decode program with the jnp attention (the Pallas kernel runs interpreted on a
# CPU, slowly): static-length draft loop, one verification pass, no nucleus branch.
BRANCH_FREE = profiles.BackendProfile("branch-free", "reference", None, True)


def _prompts(vocab, lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def models():
  target = tiny_model(0, head_dim=16)  # the Pallas kernels take head dims >= 16
  return target, noisy_copy(target, 0.4, 1), random_eagle_draft(target)


def test_profiles_resolve_by_name_platform_and_value():
  assert profiles.backend_profile(None) == profiles.PROFILES["cpu"]  # this machine
  with platforms.compiling_for("cuda"):
    assert profiles.backend_profile(None) == profiles.PROFILES["gpu"]
  assert profiles.backend_profile("gpu").verify_chunk is None
  assert profiles.backend_profile(BRANCH_FREE) is BRANCH_FREE
  assert profiles.platform_profile("rocm") == "gpu" and profiles.platform_profile("tpu") == "cpu"
  with pytest.raises(ValueError, match="profile must be"):
    profiles.backend_profile("h100")
  with pytest.raises(ValueError, match="verify_chunk"):
    profiles.BackendProfile("x", "reference", 0, False)
  with pytest.raises(ValueError, match="unknown attention_impl"):
    profiles.BackendProfile("x", "flash", None, False)


# A decode whose draft length changes from step to step (for the branch-free test's static draft loop).
DYNAMIC = dict(max_new_tokens=24, draft_len=bj.DynamicDraftLen(l0=2, l_incre=1, l_mod=2, l_limit=5))


def test_a_profiles_compiler_options_reach_every_program_it_compiles(models):
  """The GPU profile compiles without XLA's dot-strength-reduction; a profile's options reach the
  decode's programs and the step-cost forwards (an option XLA does not know fails there), and a
  known one changes no token."""
  import dataclasses

  target, draft, _ = models
  assert dict(profiles.PROFILES["gpu"].compiler_options) == {
      "xla_disable_hlo_passes": "dot-strength-reduction"}
  assert profiles.PROFILES["cpu"].compiler_options == ()
  for bad in ((("xla_x",),), (("jax_x", "1"),), [("xla_a", "b")], (("xla_a", 1),)):
    with pytest.raises(ValueError, match="compiler_options"):
      profiles.BackendProfile("x", "reference", None, False, compiler_options=bad)
  # The branch-free test's setting (below): its CPU-profile decode then runs this program.
  prompts, kw = _prompts(target.config.vocab_size, (5, 12, 8), seed=3), DYNAMIC
  plain = bj.generate(target, draft, prompts, **kw)
  options = dataclasses.replace(profiles.PROFILES["cpu"], compiler_options=(
      ("xla_disable_hlo_passes", "dot-strength-reduction"),))
  same = bj.generate(target, draft, prompts, profile=options, **kw)
  np.testing.assert_array_equal(same.tokens, plain.tokens)
  unknown = dataclasses.replace(options, compiler_options=(("xla_no_such_option", "1"),))
  with pytest.raises(Exception, match="xla_no_such_option"):
    bj.generate(target, draft, prompts, profile=unknown, **kw)
  # prepare compiles no decode program, but the cost-aware policy's forwards it times.
  with pytest.raises(Exception, match="xla_no_such_option"):
    bj.prepare(target, draft, prompts, bj.DecodeConfig(max_new_tokens=6, draft_len="goodput",
                                                       profile=unknown))


def test_split_count_fills_the_sms_and_keeps_two_blocks_per_split():
  # SmolLM2 (3 KV heads, G = 3) at B = 1 verifying 5 positions: 3 programs on 132 SMs.
  assert split_count(1, 3, 5, 3, 512, sm_count=132) == 4  # 512 / 4 = 128 slots: two blocks of 64
  assert split_count(1, 3, 5, 3, 8192, sm_count=132) == 64  # 3 x 64 = 192 >= 132
  assert split_count(1, 3, 5, 3, 4096, sm_count=132) == 32  # 64 would leave one block per split
  assert split_count(64, 3, 1, 3, 4096, sm_count=132) == 1  # 192 programs already
  assert split_count(8, 3, 1, 3, 192, sm_count=132) == 1  # 192 / 2 = 96 < two blocks


@pytest.mark.parametrize("draft_kind", ["model", "eagle_hybrid"])
def test_branch_free_one_pass_decode_equals_the_cpu_profile(models, draft_kind):
  """Greedy: the GPU profile's program (one verification pass of L + 1, a draft loop of L
  iterations, drafts past l as padding) emits exactly the CPU profile's tokens, step for step."""
  target, draft, eagle = models
  draft = draft if draft_kind == "model" else bj.Hybrid(eagle, bj.NGramProposer())
  prompts, kw = _prompts(target.config.vocab_size, (5, 12, 8), seed=3), DYNAMIC
  cpu = bj.generate(target, draft, prompts, **kw)
  free = bj.generate(target, draft, prompts, profile=BRANCH_FREE, **kw)
  np.testing.assert_array_equal(free.tokens, cpu.tokens)
  np.testing.assert_array_equal(free.stats.accepted, cpu.stats.accepted)
  assert cpu.stats.profile == "cpu" and cpu.stats.verify_chunk == 4
  assert free.stats.profile == "branch-free" and free.stats.verify_chunk == 6  # L + 1
  assert (free.stats.verified == 6).all()  # one pass per step
  assert len(set(cpu.stats.draft_lens.tolist())) >= 2  # l changed under a static-length draft loop


def test_a_nucleus_is_compiled_in_only_below_one(models):
  target, draft, _ = models
  prompts = _prompts(target.config.vocab_size, (4, 9))
  with_nucleus = generate_lib.lower(target, draft, prompts, platform="cpu", temperature=0.7,
                                    top_p=0.9, max_new_tokens=8, draft_len=2)
  without = generate_lib.lower(target, draft, prompts, platform="cpu", temperature=0.7, top_p=1.0,
                               max_new_tokens=8, draft_len=2)
  count = lambda lowered: hlo_census.census(lowered.decode.mlir_module())["while_ops"]
  assert count(with_nucleus) > count(without)  # the nucleus's bisection loops exist only with one


@pytest.mark.parametrize("setting", [
    dict(temperature=0.7, top_p=0.9, draft_len=4),  # sampled, nucleus, a model draft
    dict(temperature=0.0, draft_len=3, scanned=True),  # the models scanned (load_model's option)
    dict(temperature=0.0, draft_len="goodput", eagle=True),  # plain and chain steps, features
    dict(temperature=0.7, top_p=0.9, draft_len=3, eagle=True, batch_size=2),  # continuous
])
def test_the_gpu_profile_lowered_for_cuda_meets_the_census_goals(models, setting):
  """Lowered for CUDA on this CPU (Triton kernels included): a BASS step evaluates at most 3
  data-dependent while/conditional ops (its loop's condition and the draft's catch-up loop), no host
  callback, and, compiled for this machine with the same profile, no copy of a KV cache or of the
  EAGLE feature buffer (stacked, with scanned layers); the CPU profile's step needs more."""
  target, draft, eagle = models
  setting = dict(setting)
  if setting.pop("eagle", False):
    draft = bj.Hybrid(eagle, bj.NGramProposer())
  scanned = setting.pop("scanned", False)
  if scanned:  # the GPU profile's layout: one layer compiled, a stacked cache
    target, draft = target.with_scanned_layers(), draft.with_scanned_layers()
  prompts = _prompts(target.config.vocab_size, (5, 9, 7, 3), seed=1)
  gpu = generate_lib.lower(target, draft, prompts, platform="cuda", compile_on_host=True,
                           max_new_tokens=16, **setting)
  census = hlo_census.census(gpu.decode.mlir_module())
  assert gpu.spec.branch_free and gpu.spec.attention_impl == "pallas_split"
  assert census["custom_calls"].get(TRITON_CUSTOM_CALL, 0) >= 1, census["custom_calls"]
  assert "chain_step" in census["steps"], census["steps"]
  assert census["data_dependent_control_flow_per_step"] <= 3, census["steps"]
  assert census["host_callbacks"] == 0
  kept = list(gpu.cache_arrays)
  if gpu.spec.keeps_features:
    assert any(len(a.split(",")) == 3 for a in kept), kept  # the feature buffer is counted
  assert all(len(a.split(",")) == 5 for a in kept) == scanned, kept  # stacked caches counted
  assert hlo_census.cache_copies(gpu.host_decode_hlo, kept) == []
  cpu = generate_lib.lower(target, draft, prompts, platform="cuda", profile="cpu",
                           max_new_tokens=16, **setting)
  cpu_steps = hlo_census.census(cpu.decode.mlir_module())["steps"]["chain_step"]
  assert (cpu_steps["data_dependent_control_flow"]
          > census["steps"]["chain_step"]["data_dependent_control_flow"])


def test_census_refuses_text_without_main():
  with pytest.raises(ValueError, match="main function"):
    hlo_census.census("module {}")


def test_bench_gpu_quick_mode_runs_every_step_on_this_cpu(tmp_path):
  """``make bench-gpu``'s script in its quick mode: every step (attention and forward benchmarks, the
  CUDA census, latency and utilization for regular decoding and BASS) exits 0 and leaves its results
  file; the record names device, JAX version and date, and the report section lists the files."""
  import json
  import os
  import pathlib
  import subprocess

  repo = pathlib.Path(__file__).resolve().parents[1]
  # One compilation cache for the run's processes: a program two steps compile alike compiles once.
  env = dict(os.environ, **shared_jax_cache(tmp_path / "xla"))
  run = subprocess.run([PYTHON, "-m", "experiments.benchmarks.bench_gpu", "--quick",
                        f"--results_dir={tmp_path}"], cwd=repo, capture_output=True, text=True,
                       timeout=900, env=env)
  assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
  record = json.loads((tmp_path / "bench_gpu.json").read_text())
  assert record["device"].startswith("cpu") and record["jax_version"] and record["date"]
  assert {n: s["returncode"] for n, s in record["steps"].items()} == {
      "bench_attention": 0, "bench_forward": 0, "size_sweep": 0, "lower_decode": 0, "latency": 0,
      "utilization": 0, "command_buffers_while": 0}
  for name in ("latency_gpu_quick.json", "utilization_gpu_quick.json", "lower_decode_cuda.json",
               "bench_forward_gpu_quick.json", "bench_forward_gpu_sizes_quick.json"):
    assert (tmp_path / name).exists(), name
    assert f"`{name}`" in (tmp_path / "bench_gpu.md").read_text()
  census = json.loads((tmp_path / "lower_decode_cuda.json").read_text())
  assert census["settings"]["profile"] == "gpu"
  assert census["data_dependent_control_flow_per_step"] <= 3
  latency = json.loads((tmp_path / "latency_gpu_quick.json").read_text())
  assert {r["config"] for r in latency["runs"]} >= {"regular", "bass_split_goodput"}, latency["runs"][:1]
  assert record["parts"] == [1, 2, 3, 4] and [s["part"] for s in record["steps"].values()] == [
      1, 1, 2, 2, 2, 3, 4]
  assert record["steps"]["command_buffers_while"]["xla_flags"].endswith("+WHILE,+CONDITIONAL")
  # The size sweep's break-even: (l * draft + verify) / plain, from its own rows, at every B and l.
  sweep = json.loads((tmp_path / "bench_forward_gpu_sizes_quick.json").read_text())
  ms = {(r["model"], r["batch_size"], r["num_new"]): r["project_ms"] for r in sweep["rows"]}
  target, draft = ("random:smollm2-135m:layers=2:vocab=4096",
                   "random:smollm2-135m:layers=1:vocab=4096")
  assert {(e["batch_size"], e["draft_len"]) for e in sweep["break_even"]} == {(1, 4), (4, 4)}
  for e in sweep["break_even"]:
    b = e["batch_size"]
    want = (4 * ms[(draft, b, 1)] + ms[(target, b, 5)]) / ms[(target, b, 1)]
    assert e["model"] == target and abs(e["break_even_tokens_per_step"] - want) < 1e-9
