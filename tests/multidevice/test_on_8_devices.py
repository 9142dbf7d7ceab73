"""BASS on a jax.sharding mesh, on 8 host (CPU) devices; run by tests/test_sharding.py in a child process
with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``, so that the rest of the suite keeps one.

For a tiny random model of every family on meshes (2, 4) and (1, 8) (and (8, 1), rows only, for the
Llama family): greedy BASS emits exactly the tokens of one device's greedy decoding, and the compiled
decode lays its caches out as the rule tables say (split by KV head where the heads divide, replicated
where they do not); regular decoding on (2, 4) emits one device's tokens. Sampled BASS (Llama family)
emits the same tokens on every mesh. The
real SmolLM2 (9 query and 3 key/value heads) on a (2, 3) mesh: loaded straight onto its shards, and
greedy BASS and regular decoding emit one device's tokens. Weights lie where the tables say, read from
the arrays' own ``.sharding`` (the expected layouts are written out here by hand, not derived from
``bass_jax.sharding``); bad meshes fail with errors that name the fix. Continuous batching on a
(1, 8) mesh gives one device's tokens; on a mesh with a data axis above 1 it is refused.
"""

import functools

import flax.traverse_util
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import bass_jax as bj
from bass_jax import sharding
from bass_jax.sampling import programs
from bass_jax.sampling import state as state_lib

pytestmark = pytest.mark.skipif(jax.device_count() != 8, reason="needs 8 host devices (run through "
                                "tests/test_sharding.py)")

VOCAB = 128
MESHES = ((8, 1), (2, 4), (1, 8))


def _configs():
  """A tiny one-layer target per family; 8 query heads, 4 KV heads (Llama) and an MLP of 64, so that
  every mesh above splits something and (1, 8) replicates Llama's KV heads."""
  return {
      "llama": bj.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64,
                              num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=4,
                              head_dim=16, eos_token_id=None),
      "opt": bj.OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, ffn_dim=64,
                          num_attention_heads=8, word_embed_proj_dim=32, max_position_embeddings=256,
                          eos_token_id=None, bos_token_id=None, pad_token_id=None),
      "codegen": bj.CodeGenConfig(vocab_size=VOCAB, n_embd=64, n_layer=1, n_head=8, rotary_dim=4,
                                  n_positions=256, n_ctx=256, n_inner=64),
      "gpt2": bj.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=1, n_head=8, n_positions=256,
                            n_inner=64),
  }


KV_HEADS = {"llama": 4, "opt": 8, "codegen": 8, "gpt2": 8}


@functools.lru_cache(maxsize=None)
def _pair(family):
  """A tiny target and a draft of the same shape with other weights."""
  config = _configs()[family]
  target = bj.Model(config, bj.init_params(config, jax.random.key(0)), name=f"tiny-{family}")
  draft = bj.Model(config, bj.init_params(config, jax.random.key(1)), name=f"tiny-{family}-draft")
  return target, draft


def _prompts(n=5, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, VOCAB, size).tolist() for size in rng.integers(2, 20, n)]


def _same(spec, *want):
  """PartitionSpecs compare with trailing Nones trimmed."""
  trim = lambda s: tuple(s) + (None,) * (4 - len(tuple(s)))
  return trim(spec) == trim(P(*want))


def _decode_program(mesh):
  """The compiled decode program of the most recent generate call on ``mesh``."""
  for (spec, _), (_, decode) in reversed(list(programs._PROGRAMS._programs.items())):
    if spec.target_sharding is not None and spec.target_sharding.mesh == mesh:
      return spec, decode
  raise AssertionError(f"no program was compiled for {mesh}")


@pytest.fixture(scope="module", params=sorted(_configs()))
def family(request):
  """A family's tiny pair, prompts, and one device's regular greedy decoding of them (which greedy
  BASS reproduces: tests/test_families.py, tests/test_generate.py)."""
  target, draft = _pair(request.param)
  prompts = _prompts()
  return request.param, target, draft, prompts, bj.generate(target, None, prompts, method="regular",
                                                             max_new_tokens=12)


# (8, 1) splits rows only and (1, 8) replicates Llama's KV heads: the family-independent parts, which
# the Llama family runs; every family runs (2, 4), which splits rows and its weights.
@pytest.mark.parametrize("family,shape", [(f, m) for f in sorted(_configs()) for m in MESHES
                                          if f == "llama" or m == (2, 4)], indirect=["family"])
def test_greedy_bass_on_a_mesh_emits_the_single_device_tokens_with_caches_split_by_rule(family,
                                                                                        shape):
  name, target, draft, prompts, single = family
  mesh = sharding.make_mesh(*shape)
  out = bj.generate(target, draft, prompts, max_new_tokens=12, mesh=mesh)
  np.testing.assert_array_equal(out.tokens, single.tokens)
  assert out.stats.mesh == {"data": shape[0], "model": shape[1]}
  assert out.stats.batch_bucket % shape[0] == 0  # 5 prompts padded to rows that split over data
  # The compiled decode's own output layout: caches by row, and by KV head where the heads divide.
  spec, decode = _decode_program(mesh)
  state = decode.output_shardings
  assert isinstance(state, state_lib.DecodeState)
  kv = "model" if KV_HEADS[name] % shape[1] == 0 else None
  assert _same(state.target_cache.k[0].spec, "data", kv, None, None)
  assert _same(state.target_cache.lengths.spec, "data")
  # The draft is replicated over model (generate's default), its rows and cache split over data.
  assert _same(state.proposer_state.cache.v[0].spec, "data", None, None, None)
  assert _same(state.tokens.spec, "data") and _same(state.key.spec)
  assert spec.proposer.sharding.axes == (("batch", "data"),)


def test_regular_decoding_on_a_mesh_emits_the_single_device_tokens(family):
  _, target, _, prompts, single = family
  out = bj.generate(target, None, prompts, method="regular", max_new_tokens=12,
                    mesh=sharding.make_mesh(2, 4))
  np.testing.assert_array_equal(out.tokens, single.tokens)
  np.testing.assert_allclose(out.logprobs, single.logprobs, atol=1e-4)


def test_sampled_tokens_do_not_depend_on_the_mesh():
  target, draft = _pair("llama")
  prompts = _prompts(4, seed=1)
  kwargs = dict(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=123)
  rows_only = bj.generate(target, draft, prompts, mesh=sharding.make_mesh(8, 1), **kwargs)
  for shape in MESHES[1:]:
    out = bj.generate(target, draft, prompts, mesh=sharding.make_mesh(*shape), **kwargs)
    np.testing.assert_array_equal(out.tokens, rows_only.tokens, err_msg=f"mesh {shape}")
  other_seed = bj.generate(target, draft, prompts, mesh=sharding.make_mesh(1, 8),
                           **{**kwargs, "seed": 124})
  assert not np.array_equal(other_seed.tokens, rows_only.tokens)  # the seed matters, the mesh not


def test_drafter_invariant_tokens_on_a_mesh_are_regular_decodings_on_one_device():
  """acceptance="gumbel" with the per-row sequence keys split over data: a static batch on (4, 2) and a
  continuous one on (1, 2) emit what regular decoding draws on one device."""
  target, draft = _pair("llama")
  prompts = _prompts(4, seed=1)
  kwargs = dict(max_new_tokens=12, temperature=0.9, seed=3, acceptance="gumbel")
  single = bj.generate(target, None, prompts, method="regular", **kwargs)
  static = bj.generate(target, draft, prompts, mesh=sharding.make_mesh(4, 2), draft_len=3, **kwargs)
  np.testing.assert_array_equal(static.tokens, single.tokens)
  continuous = bj.generate(target, draft, prompts, mesh=sharding.make_mesh(1, 2), batch_size=2,
                           **kwargs)
  np.testing.assert_array_equal(continuous.tokens, single.tokens)


def test_a_context_mesh_or_the_weights_mesh_is_used_and_a_tensor_parallel_hybrid_draft_runs():
  """generate(mesh=None) takes the mesh set with jax.set_mesh (here an Explicit one, as jax.make_mesh
  makes it), else the mesh the target's weights lie on; the n-gram + draft hybrid with the draft
  tensor-parallel emits one device's tokens."""
  target, draft = _pair("llama")
  prompts = _prompts(4, seed=7)
  single = bj.generate(target, None, prompts, method="regular", max_new_tokens=10)
  with jax.set_mesh(jax.make_mesh((2, 4), ("data", "model"))):
    out = bj.generate(target, bj.Hybrid(draft), prompts, max_new_tokens=10,
                      draft_sharding="tensor_parallel")
  np.testing.assert_array_equal(out.tokens, single.tokens)
  assert out.stats.mesh == {"data": 2, "model": 4}
  mesh = sharding.make_mesh(4, 2)
  placed = bj.Model(target.config, sharding.shard_params(target.params,
                                                         sharding.plan(target.config, mesh)))
  out = bj.generate(placed, None, prompts, method="regular", max_new_tokens=10)
  np.testing.assert_array_equal(out.tokens, single.tokens)
  assert out.stats.mesh == {"data": 4, "model": 2}


def test_an_eagle_draft_on_a_mesh_emits_the_single_device_tokens():
  """The feature buffer split by row, the EAGLE draft (its layer, the target's embedding and head
  rows) replicated over model."""
  from bass_jax.models import eagle, eagle_init  # pylint: disable=g-import-not-at-top

  target, _ = _pair("llama")
  config = eagle.EagleConfig(layer=target.config, draft_vocab_size=64)
  params = {"draft": eagle_init.init_draft_params(config, jax.random.key(3)),
            "vocab_ids": np.random.default_rng(0).permutation(VOCAB).astype(np.int32)}
  draft = bj.Model(config, params, name="tiny-eagle")
  prompts = _prompts(3, seed=6)
  single = bj.generate(target, None, prompts, method="regular", max_new_tokens=10)
  out = bj.generate(target, draft, prompts, max_new_tokens=10, mesh=sharding.make_mesh(2, 4))
  np.testing.assert_array_equal(out.tokens, single.tokens)


def test_the_pallas_kernel_runs_per_shard():
  """Greedy BASS with the Pallas kernel on (2, 4) emits one device's regular greedy tokens (the
  program of the context-mesh test's reference)."""
  target, draft = _pair("llama")
  prompts = _prompts(4, seed=3)
  single = bj.generate(target, None, prompts, method="regular", max_new_tokens=6)
  out = bj.generate(target, draft, prompts, max_new_tokens=6, attention_impl="pallas_pad",
                    mesh=sharding.make_mesh(2, 4))
  np.testing.assert_array_equal(out.tokens, single.tokens)


def test_token_trees_on_a_mesh_emit_the_single_device_tokens():
  """Tree steps per shard: the Pallas kernel's prefix merged with the tree's dense attention in every
  shard, and the accepted paths' K/V compacted in caches split by row and KV head. The target drafts
  for itself, so whole paths are accepted and moved; goodput with fixed costs also runs chains."""
  target, _ = _pair("llama")
  prompts = _prompts(4, seed=5)
  single = bj.generate(target, None, prompts, method="regular", max_new_tokens=10)
  costs = bj.StepCosts(plain=1.0, verify_pass=1.2, propose_first=0.05, propose_next=0.05, chunk=4,
                       tree_steps=(1.1,))
  # Every candidate kept (1 + 2 + 4 nodes), so the target's own greedy path is in each tree; the tree
  # costs less than a chain of 2 here, so goodput starts with it.
  out = bj.generate(target, target, prompts, max_new_tokens=10, attention_impl="pallas_pad",
                    mesh=sharding.make_mesh(2, 4), draft_tree="top_k=2,depth=2,nodes=7",
                    draft_len=bj.GoodputDraftLen(max_len=2, explore_every=2, costs=costs))
  np.testing.assert_array_equal(out.tokens, single.tokens)
  assert (out.stats.trees == 0).any() and out.stats.accepted[out.stats.trees == 0].max() == 2


def _specs(tree):
  return {"/".join(k): v.sharding.spec for k, v in flax.traverse_util.flatten_dict(dict(tree)).items()}


def test_llama_weights_lie_where_the_rule_table_says():
  target, _ = _pair("llama")
  placed = sharding.shard_params(target.params, sharding.plan(target.config, sharding.make_mesh(2, 4)))
  specs = _specs(placed)
  column = ("layers_0/self_attn/q_proj/kernel", "layers_0/self_attn/k_proj/kernel",
            "layers_0/self_attn/v_proj/kernel", "layers_0/mlp/gate_proj/kernel",
            "layers_0/mlp/up_proj/kernel", "lm_head")
  for name in column:
    assert _same(specs[name], None, "model"), name
  for name in ("layers_0/self_attn/o_proj/kernel", "layers_0/mlp/down_proj/kernel",
               "embed_tokens/embedding"):
    assert _same(specs[name], "model", None), name
  for name in ("norm/scale", "layers_0/input_layernorm/scale"):
    assert _same(specs[name]), name
  q = placed["layers_0"]["self_attn"]["q_proj"]["kernel"]
  assert {s.data.shape for s in q.addressable_shards} == {(64, 8 * 16 // 4)}  # 2 of 8 heads each
  # (1, 8): 8 query heads split, 4 KV heads do not divide: replicated.
  plan = sharding.plan(target.config, sharding.make_mesh(1, 8))
  specs = _specs(sharding.shard_params(target.params, plan))
  assert _same(specs["layers_0/self_attn/q_proj/kernel"], None, "model")
  assert _same(specs["layers_0/self_attn/k_proj/kernel"], None, None)
  assert plan.replicated == ("kv_heads",)


def test_opt_codegen_gpt2_weights_lie_where_their_tables_say():
  mesh = sharding.make_mesh(2, 4)
  want = {
      "opt": {"layers_0/q_proj/kernel": (None, "model"), "layers_0/q_proj/bias": ("model",),
              "layers_0/out_proj/kernel": ("model", None), "layers_0/out_proj/bias": (),
              "layers_0/fc1/kernel": (None, "model"), "layers_0/fc2/kernel": ("model", None),
              "embed_tokens/embedding": ("model", None), "project_in/kernel": ()},
      "codegen": {"h_0/q_proj/kernel": (None, "model"), "h_0/out_proj/kernel": ("model", None),
                  "h_0/fc_in/bias": ("model",), "h_0/fc_out/kernel": ("model", None),
                  "lm_head": ("model", None), "lm_head_bias": ("model",),
                  "wte/embedding": ("model", None)},
      "gpt2": {"h_0/v_proj/kernel": (None, "model"), "h_0/attn_proj/kernel": ("model", None),
               "h_0/c_fc/kernel": (None, "model"), "h_0/mlp_proj/kernel": ("model", None),
               "wpe/embedding": (), "wte/embedding": ("model", None)},
  }
  for family_name, expected in want.items():
    target, _ = _pair(family_name)
    specs = _specs(sharding.shard_params(target.params, sharding.plan(target.config, mesh)))
    for name, axes in expected.items():
      assert _same(specs[name], *axes), (family_name, name, specs[name])


# -- the real SmolLM2: 9 query heads, 3 KV heads, a model axis of 3 ---------------------------------


@pytest.fixture(scope="module")
def smollm2_on_mesh():
  mesh = sharding.make_mesh(2, 3)
  # One layer holds every tensor kind: the GGUF's 30 layers store the same kinds (Q4_1 projections,
  # F32 norms), its embedding Q8_0.
  target = bj.load_model("smollm2-135m-instruct", mesh=mesh, num_layers=1, tokenizer=False)
  return mesh, target


def test_load_model_places_every_smollm2_tensor_on_its_shards(smollm2_on_mesh):
  mesh, target = smollm2_on_mesh
  layer = target.params["layers_0"]
  q = layer["self_attn"]["q_proj"]["kernel"]
  k = layer["self_attn"]["k_proj"]["kernel"]
  assert _same(q.sharding.spec, None, "model") and _same(k.sharding.spec, None, "model")
  assert {s.data.shape for s in q.addressable_shards} == {(576, 3 * 64)}  # 3 of 9 heads
  assert {s.data.shape for s in k.addressable_shards} == {(576, 64)}  # 1 of 3 KV heads
  down = layer["mlp"]["down_proj"]["kernel"]
  assert {s.data.shape for s in down.addressable_shards} == {(512, 576)}  # 1536 / 3 rows
  embedding = target.params["embed_tokens"]["embedding"]
  assert {s.data.shape for s in embedding.addressable_shards} == {(49152 // 3, 576)}
  assert set(q.sharding.mesh.devices.flat) == set(mesh.devices.flat)


def test_greedy_on_a_mesh_of_model_3_with_smollm2s_head_counts():
  """SmolLM2's 9 query heads and 3 KV heads on a model axis of 3 (a tiny Llama with those counts; the
  real weights' placement is the test above): greedy BASS and regular decoding on (2, 3) both emit one
  device's regular greedy tokens."""
  config = bj.LlamaConfig(vocab_size=VOCAB, hidden_size=72, intermediate_size=96, num_hidden_layers=1,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=8, eos_token_id=None)
  target = bj.Model(config, bj.init_params(config, jax.random.key(4)), name="tiny-9-heads")
  draft = bj.Model(config, bj.init_params(config, jax.random.key(5)), name="tiny-9-heads-draft")
  mesh = sharding.make_mesh(2, 3)
  prompts = _prompts(3, seed=9)
  want = bj.generate(target, None, prompts, method="regular", max_new_tokens=16).tokens
  for method in ("bass", "regular"):
    got = bj.generate(target, draft, prompts, method=method, max_new_tokens=16, mesh=mesh)
    np.testing.assert_array_equal(got.tokens, want, err_msg=method)


# -- errors ----------------------------------------------------------------------------------------------


def test_a_mesh_without_data_and_model_axes_is_refused():
  target, draft = _pair("llama")
  bad = Mesh(np.array(jax.devices()).reshape(2, 4), ("batch", "tensor"))
  with pytest.raises(ValueError, match=r"must be exactly \('data', 'model'\)"):
    bj.generate(target, draft, _prompts(2), max_new_tokens=4, mesh=bad)
  with pytest.raises(ValueError, match="jax.sharding.Mesh"):
    bj.generate(target, draft, _prompts(2), max_new_tokens=4, mesh=(2, 4))
  # Axes in the other order are accepted, the device grid transposed with them.
  swapped = Mesh(np.array(jax.devices()).reshape(4, 2), ("model", "data"))
  checked = sharding.check_mesh(swapped)
  assert checked.shape == {"data": 2, "model": 4}
  np.testing.assert_array_equal(checked.devices, swapped.devices.T)


def test_a_model_axis_that_divides_neither_heads_nor_mlp_is_refused():
  config = bj.LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=36,
                          num_hidden_layers=1, num_attention_heads=6, num_key_value_heads=2,
                          head_dim=8)
  with pytest.raises(ValueError, match="divides neither the 6 attention heads nor the MLP's 36"):
    sharding.plan(config, sharding.make_mesh(1, 8))


def test_a_batch_that_does_not_split_over_data_is_refused_below_generate():
  target, _ = _pair("llama")
  plan = sharding.plan(target.config, sharding.make_mesh(4, 2))
  tokens = np.ones((3, 5), np.int32)
  with pytest.raises(ValueError, match="3 rows, which do not split over the data axis of size 4; "
                     "pad it to 4 rows"):
    bj.models.common.forward(target.config, target.params, tokens, sharding=plan)


def test_continuous_batching_on_a_tensor_parallel_mesh_emits_the_single_device_tokens():
  """Continuous batching on (1, 8): refilled rows' admission prefills and cache writes run on a mesh with
  every weight and KV head split, and give one device's regular greedy tokens; a data axis above 1
  is refused."""
  target, draft = _pair("llama")
  prompts = _prompts(n=7, seed=3)
  # One device's regular greedy decoding: the program of the llama family fixture's reference.
  single = bj.generate(target, None, prompts, method="regular", max_new_tokens=12)
  out = bj.generate(target, draft, prompts, max_new_tokens=12, batch_size=2,
                    mesh=sharding.make_mesh(1, 8))
  assert out.stats.continuous and out.stats.mesh == {"data": 1, "model": 8}
  np.testing.assert_array_equal(out.tokens, single.tokens)
  with pytest.raises(ValueError, match="data axis has size 1"):
    bj.generate(target, draft, prompts, max_new_tokens=12, batch_size=2,
                mesh=sharding.make_mesh(2, 4))
