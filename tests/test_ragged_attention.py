"""The Pallas ragged-attention kernels (BASS-PAD and BASS-SPLIT) against their jnp reference.

On a CPU the kernels run in Pallas interpret mode; on a GPU (``pytest -m gpu``) compiled. Inputs are fresh
random draws; cache slots past each row's length are NaN and the kernel's output buffers start as NaN,
so a stray read or an unwritten tile fails the comparison.

Every head size users bring (64, 80, 96, 128, 256) is checked too, the ones that are not powers of two
as the kernel's column tiles. The grid: every (batch, T) pair of B in {1, 3, 8} and T in {1, 2, 8, 33} is paired with one of the 12
combinations of GQA ratio {1, 3, 8} x head dim {64, 128} x dtype {f32, bf16}, so every value of every
factor, and every combination of the last three, is covered; each case runs both variants. Gemma 2's
logit soft cap (with and without a sliding window, split-K, and per-layer windows through the models'
registry) is checked against a softmax written out in this file.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax.models.attention import reference_attention
from pallas_kernels.ragged_attention import (TRITON_CUSTOM_CALL, ragged_attention,
                                             ragged_attention_reference)
from pallas_kernels.tiling import BlockSizes

ON_GPU = jax.default_backend() in ("gpu", "cuda", "rocm")
TOLERANCE = {jnp.float32: dict(atol=2e-5, rtol=1e-5), jnp.bfloat16: dict(atol=3e-2, rtol=2e-2)}

_SHAPES = list(itertools.product([1, 3, 8], [1, 2, 8, 33]))
_KINDS = list(itertools.product([1, 3, 8], [64, 128], [jnp.float32, jnp.bfloat16]))
GRID = [(b, t, ratio, head_dim, dtype) for (b, t), (ratio, head_dim, dtype) in zip(_SHAPES, _KINDS)]


@pytest.fixture(autouse=True)
def _exact_f32_matmuls():
  """Every XLA dot in these tests at full f32 precision. XLA:GPU runs an f32 dot at its default
  precision as TF32 (a 10-bit mantissa): on an H200 (JAX 0.11.2, 2026-11-26) the jnp references came
  out rounded that way, 1e-3 from the compiled kernels, whose own dots were exact f32
  (results/gpu_h200/kernel_tests.log), and every f32 case with T > 1 failed on the reference's side.
  On a CPU this changes nothing (f32 there is f32)."""
  with jax.default_matmul_precision("highest"):
    yield


def _inputs(seed, batch, num_q, num_kv_heads, ratio, head_dim, dtype, max_len, block=64):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(num_q, max_len + 1, batch)
  # The edges: a row holding only its T new tokens, a full row, and a length off the block grid.
  lengths[0] = num_q
  if batch > 1:
    lengths[1] = max_len
  if batch > 2:
    lengths[2] = max(num_q, block + block // 2 + 3) if max_len > 2 * block else lengths[2]
  q = rng.normal(size=(batch, num_q, num_kv_heads * ratio, head_dim))
  k = rng.normal(size=(batch, num_kv_heads, max_len, head_dim))
  v = rng.normal(size=(batch, num_kv_heads, max_len, head_dim))
  for b in range(batch):
    k[b, :, lengths[b]:] = np.nan
    v[b, :, lengths[b]:] = np.nan
  cast = lambda x: jnp.asarray(x, dtype)
  return cast(q), cast(k), cast(v), jnp.asarray(lengths, jnp.int32)


def _check(out, want, dtype):
  out, want = np.asarray(out, np.float32), np.asarray(want, np.float32)
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, want, **TOLERANCE[dtype])


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("batch,num_q,ratio,head_dim,dtype", GRID)
def test_kernel_matches_reference(batch, num_q, ratio, head_dim, dtype, variant):
  num_kv_heads = 3 if ratio == 3 else 2  # ratio 3 with 3 kv heads is SmolLM2's 9 / 3
  q, k, v, lengths = _inputs(batch * 100 + num_q, batch, num_q, num_kv_heads, ratio, head_dim, dtype,
                             max_len=192)
  out = ragged_attention(q, k, v, lengths, variant=variant, interpret=not ON_GPU,
                         debug_poison_output=True)
  assert out.shape == q.shape and out.dtype == q.dtype
  _check(out, ragged_attention_reference(q, k, v, lengths), dtype)


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("batch,num_q,ratio,head_dim,dtype", GRID + [(2, 96, 3, 64, jnp.bfloat16)])
def test_kernel_lowers_through_triton_for_cuda(batch, num_q, ratio, head_dim, dtype, variant):
  """Without a GPU: export for CUDA runs the Pallas -> Triton lowering (block shapes, masked loads,
  dots), which is what a GPU compile starts from; the Triton custom call is the kernel."""
  from jax import export

  num_kv_heads = 3 if ratio == 3 else 2
  q = jax.ShapeDtypeStruct((batch, num_q, num_kv_heads * ratio, head_dim), dtype)
  kv = jax.ShapeDtypeStruct((batch, num_kv_heads, 192, head_dim), dtype)
  lengths = jax.ShapeDtypeStruct((batch,), jnp.int32)
  fn = jax.jit(lambda q, k, v, l: ragged_attention(q, k, v, l, variant=variant,
                                                   block_sizes=BlockSizes(num_splits=2)))
  triton = TRITON_CUSTOM_CALL
  exported = export.export(fn, platforms=["cuda"],
                           disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)])(
                               q, kv, kv, lengths)
  assert exported.mlir_module().count(f"@{triton}") == 1


# The head sizes of the families users bring: 64 (Llama 3.2 1B, SmolLM2), 80 (Phi-2, StableLM), 96
# (Phi-3-mini, Phi-3.5-mini), 128 (Llama 3.1 8B, Qwen3), 256 (Gemma 2 and 3). 80 and 96 run in
# power-of-two column tiles (head_chunks).
HEAD_DIMS = [64, 80, 96, 128, 256]


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_head_size_matches_the_reference(head_dim, variant):
  num_q, ratio = (3, 3) if head_dim % 32 else (5, 4)  # T * G of 9 and 20: one 16-row block and two
  dtype = jnp.bfloat16 if head_dim in (96, 256) else jnp.float32
  q, k, v, lengths = _inputs(head_dim + (variant == "split"), 3, num_q, 2, ratio, head_dim, dtype,
                             max_len=192)
  out = ragged_attention(q, k, v, lengths, variant=variant, interpret=not ON_GPU,
                         block_sizes=BlockSizes(block_r=16, block_k=32, num_splits=2),
                         debug_poison_output=True)
  assert out.shape == q.shape and out.dtype == q.dtype
  _check(out, ragged_attention_reference(q, k, v, lengths), dtype)


@pytest.mark.parametrize("head_dim", [80, 96, 256])
def test_every_head_size_lowers_through_triton_for_cuda(head_dim):
  """Triton takes only power-of-two tensors: an 80- or 96-channel head lowers as column tiles."""
  from jax import export

  q = jax.ShapeDtypeStruct((2, 5, 8, head_dim), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, 2, 192, head_dim), jnp.bfloat16)
  lengths = jax.ShapeDtypeStruct((2,), jnp.int32)
  fn = jax.jit(lambda q, k, v, l: ragged_attention(q, k, v, l, variant="split"))
  exported = export.export(fn, platforms=["cuda"], disabled_checks=[
      export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)])(q, kv, kv, lengths)
  assert exported.mlir_module().count(f"@{TRITON_CUSTOM_CALL}") == 1


def test_head_chunks_tile_the_head_in_powers_of_two():
  from pallas_kernels.tiling import head_chunks, supports_head_dim

  for head_dim in range(16, 513, 16):
    chunks = head_chunks(head_dim)
    assert sum(size for _, size in chunks) == head_dim and supports_head_dim(head_dim)
    assert [off for off, _ in chunks] == list(np.cumsum([0] + [s for _, s in chunks])[:-1])
    assert all(s >= 16 and s & (s - 1) == 0 for _, s in chunks)
    assert [s for _, s in chunks] == sorted((s for _, s in chunks), reverse=True)
  for bad in (8, 40, 72, 100):
    assert not supports_head_dim(bad)
    with pytest.raises(ValueError, match="multiple of 16"):
      head_chunks(bad)


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("num_q,block_sizes", [
    (96, BlockSizes(block_r=64, block_k=32)),  # prefill: 288 folded rows in 5 query blocks
    (1, BlockSizes(block_k=32, num_splits=4)),  # split-K decode: partial softmaxes merged
    (9, BlockSizes(block_r=16, block_k=16, num_splits=2)),  # verification, small tiles, split-K
])
def test_prefill_split_k_and_residuals(num_q, block_sizes, variant):
  """Large T (several query blocks), and split-K, whose exact merge uses the softmax statistics that
  ``return_residuals`` exposes; those statistics match the reference too."""
  q, k, v, lengths = _inputs(num_q, 3, num_q, 3, 3, 64, jnp.float32, max_len=256, block=32)
  out, (m, l) = ragged_attention(q, k, v, lengths, variant=variant, block_sizes=block_sizes,
                                 interpret=not ON_GPU, return_residuals=True,
                                 debug_poison_output=True)
  want, (m_want, l_want) = ragged_attention_reference(q, k, v, lengths, return_residuals=True)
  _check(out, want, jnp.float32)
  np.testing.assert_allclose(m, m_want, atol=1e-5)
  np.testing.assert_allclose(l, l_want, rtol=1e-5)


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("num_q,window", [(1, None), (9, None), (5, 20)])
def test_keys_may_end_before_the_queries(num_q, window, variant):
  """``kv_lengths < lengths``: the cache before a forward whose new tokens are attended apart. Queries sit
  at ``lengths - T + t``; only slots below ``kv_lengths`` are keys; a row with none has l = 0."""
  q, k, v, lengths = _inputs(num_q + 50, 4, num_q, 3, 3, 64, jnp.float32, max_len=192)
  rng = np.random.default_rng(num_q)
  kv_lengths = np.asarray(lengths) - num_q - rng.integers(0, 4, 4)
  kv_lengths = np.clip(kv_lengths, 0, None)
  kv_lengths[0] = 0  # an empty cache (the queries' row holds only new tokens)
  kv_lengths = jnp.asarray(kv_lengths, jnp.int32)
  k = jnp.where(jnp.arange(192)[None, None, :, None] < kv_lengths[:, None, None, None], k, jnp.nan)
  v = jnp.where(jnp.arange(192)[None, None, :, None] < kv_lengths[:, None, None, None], v, jnp.nan)
  out, (m, l) = ragged_attention(q, k, v, lengths, kv_lengths=kv_lengths, variant=variant,
                                 sliding_window=window, block_sizes=BlockSizes(block_k=32),
                                 interpret=not ON_GPU, return_residuals=True,
                                 debug_poison_output=True)
  want, (m_want, l_want) = ragged_attention_reference(q, k, v, lengths, kv_lengths=kv_lengths,
                                                      sliding_window=window, return_residuals=True)
  _check(out, want, jnp.float32)
  np.testing.assert_allclose(l, l_want, rtol=1e-5, atol=1e-6)
  assert (np.asarray(l)[0] == 0).all() and (np.asarray(out)[0] == 0).all()
  with pytest.raises(ValueError, match="kv_lengths must satisfy"):
    ragged_attention(q, k, v, lengths, kv_lengths=lengths + 1, interpret=True)


@pytest.mark.parametrize("impl", ["pallas_pad", "pallas_split"])
def test_model_attention_with_the_kernels_matches_the_models_reference(impl):
  """The models' attention through the kernels equals the models' own jnp reference."""
  from bass_jax.models.attention_registry import get_attention

  q, k, v, lengths = _inputs(3, 3, 8, 3, 3, 64, jnp.float32, max_len=128)
  _check(get_attention(impl)(q, k, v, lengths), reference_attention(q, k, v, lengths), jnp.float32)


@pytest.mark.parametrize("change,match", [
    (dict(variant="ragged"), "variant"),
    (dict(q=jnp.zeros((2, 3, 6, 64))), "batch"),
    (dict(q=jnp.zeros((1, 3, 5, 64))), "multiple"),
    (dict(q=jnp.zeros((1, 3, 6, 40)), k_cache=jnp.zeros((1, 3, 128, 40)),
          v_cache=jnp.zeros((1, 3, 128, 40))), "multiple of 16.*blocked_split"),
    (dict(k_cache=jnp.zeros((1, 3, 100, 64)), v_cache=jnp.zeros((1, 3, 100, 64))), "multiples of 16"),
    (dict(v_cache=jnp.zeros((1, 3, 128, 64), jnp.bfloat16)), "v_cache"),
    (dict(lengths=jnp.array([2])), r"lengths\[b\] >= T=3"),
    (dict(lengths=jnp.array([129])), "kv_lengths must satisfy"),
    (dict(lengths=jnp.array([5, 6])), "shape"),
    (dict(block_sizes=BlockSizes(num_splits=3)), "equal parts"),
])
def test_bad_input_is_rejected(change, match):
  args = dict(q=jnp.ones((1, 3, 6, 64)), k_cache=jnp.ones((1, 3, 128, 64)),
              v_cache=jnp.ones((1, 3, 128, 64)), lengths=jnp.array([40]), variant="pad",
              block_sizes=BlockSizes())
  args.update(change)
  with pytest.raises(ValueError, match=match):
    ragged_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("lengths"),
                     interpret=True, **args)


def test_block_sizes_validate():
  for bad in (dict(block_r=48), dict(block_k=8), dict(num_splits=0)):
    with pytest.raises(ValueError):
      BlockSizes(**bad)


def test_greedy_bass_is_unchanged_by_the_kernels():
  """The whole decode (prefill, draft steps, verification) with each kernel, and with their plain-JAX
  counterparts, emits the reference's tokens; on a CPU the kernels are interpreted."""
  import bass_jax as bj
  from conftest import tiny_model

  target = tiny_model(seed=0, scale=2.5, head_dim=16)
  draft = tiny_model(seed=3, scale=2.5, head_dim=16, num_hidden_layers=1)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, target.config.vocab_size, n).tolist() for n in (1, 5, 12, 30)]
  ref = bj.generate(target, draft, prompts, max_new_tokens=24, attention_impl="reference")
  for impl in ("pallas_pad", "pallas_split", "blocked_pad", "blocked_split"):
    out = bj.generate(target, draft, prompts, max_new_tokens=24, attention_impl=impl)
    assert np.array_equal(out.tokens, ref.tokens), impl
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-4)


def test_a_phi3_sized_head_decodes_with_the_kernel_and_other_sizes_fall_back_before_tracing():
  """A 96-channel head (Phi-3-mini's) decodes through the split kernel as the reference does; a head
  the kernel cannot tile takes the plain-JAX strategy under the GPU profile's default, with one
  warning line, and is refused when the kernel is asked for by name."""
  import warnings

  import bass_jax as bj
  from conftest import tiny_model

  target = tiny_model(seed=0, scale=2.5, head_dim=96, num_hidden_layers=1)
  prompts = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 2]]
  ref = bj.generate(target, None, prompts, method="regular", max_new_tokens=8,
                    attention_impl="reference")
  out = bj.generate(target, None, prompts, method="regular", max_new_tokens=8,
                    attention_impl="pallas_split")
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  odd = tiny_model(seed=0, head_dim=8, num_hidden_layers=1)  # 8 channels: no 16-wide tile
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = bj.generate(odd, None, prompts, method="regular", max_new_tokens=4, profile="gpu")
  lines = [str(w.message) for w in caught if "multiples of 16" in str(w.message)]
  assert len(lines) == 1 and "'blocked_split'" in lines[0] and "\n" not in lines[0], lines
  assert out.stats.attention_impl == "blocked_split"
  with pytest.raises(ValueError, match="head_dim 8.*blocked_split"):
    bj.generate(odd, None, prompts, method="regular", max_new_tokens=4,
                attention_impl="pallas_split")


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("num_q,window", [(1, 40), (9, 17), (33, 64)])
def test_sliding_window(num_q, window, variant):
  """Mistral's sliding window: a query at position p ignores slots <= p - window (also in SPLIT's
  shortened loop, with small key blocks so that whole blocks are skipped)."""
  q, k, v, lengths = _inputs(window, 3, num_q, 2, 3, 64, jnp.float32, max_len=192)
  out = ragged_attention(q, k, v, lengths, variant=variant, sliding_window=window,
                         block_sizes=BlockSizes(block_k=16), interpret=not ON_GPU,
                         debug_poison_output=True)
  want = ragged_attention_reference(q, k, v, lengths, sliding_window=window)
  _check(out, want, jnp.float32)
  assert not np.allclose(np.asarray(want), np.asarray(ragged_attention_reference(q, k, v, lengths)))


def _capped_softmax_attention(q, k, v, lengths, cap, window=None):
  """Written from the definition, apart from the kernel's reference: per row, the visible slots
  (``<= p``, ``> p - window``) of each query p, softmax of ``cap * tanh(q.k / sqrt(H) / cap)``, f64."""
  q, k, v, lengths = (np.asarray(x, np.float64) if i < 3 else np.asarray(x)
                      for i, x in enumerate((q, k, v, lengths)))
  batch, num_q, num_heads, head_dim = q.shape
  group = num_heads // k.shape[1]
  out = np.zeros(q.shape)
  for b in range(batch):
    for t in range(num_q):
      pos = lengths[b] - num_q + t
      first = 0 if window is None else max(0, pos - window + 1)
      keys = np.repeat(k[b, :, first:pos + 1], group, axis=0)  # [N, visible, H]
      scores = np.einsum("nh,nsh->ns", q[b, t], keys) / np.sqrt(head_dim)
      if cap is not None:
        scores = cap * np.tanh(scores / cap)
      w = np.exp(scores - scores.max(-1, keepdims=True))
      out[b, t] = np.einsum("ns,nsh->nh", w / w.sum(-1, keepdims=True),
                            np.repeat(v[b, :, first:pos + 1], group, axis=0))
  return out


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("num_q,window,block_sizes", [
    (1, None, BlockSizes(block_k=16, num_splits=2)),  # decode, split-K: partial capped softmaxes merged
    (5, 20, BlockSizes(block_k=16)),  # verification under a window that skips whole blocks
])
def test_logit_soft_cap(num_q, window, block_sizes, variant):
  """Gemma 2's soft cap inside the kernel: scores of std ~10 against a cap of 5, GQA 4 / 2, NaN past
  each ragged row's length; the residuals are the capped softmax's (``m < cap``)."""
  cap = 5.0
  q, k, v, lengths = _inputs(num_q + 70, 3, num_q, 2, 2, 16, jnp.float32, max_len=128, block=16)
  q = 10.0 * q
  out, (m, l) = ragged_attention(q, k, v, lengths, variant=variant, sliding_window=window,
                                 logit_soft_cap=cap, block_sizes=block_sizes, interpret=not ON_GPU,
                                 return_residuals=True, debug_poison_output=True)
  want = _capped_softmax_attention(q, k, v, lengths, cap, window)
  _check(out, want, jnp.float32)
  assert np.abs(want - _capped_softmax_attention(q, k, v, lengths, None, window)).max() > 0.1
  _, (m_want, l_want) = ragged_attention_reference(q, k, v, lengths, sliding_window=window,
                                                   logit_soft_cap=cap, return_residuals=True)
  np.testing.assert_allclose(m, m_want, atol=1e-5)
  np.testing.assert_allclose(l, l_want, rtol=1e-5)
  assert (np.asarray(m) < cap).all()
  with pytest.raises(ValueError, match="logit_soft_cap must be > 0"):
    ragged_attention(q, k, v, lengths, logit_soft_cap=-1.0, interpret=True)


def test_soft_capped_kernel_lowers_through_triton_for_cuda():
  """The cap's tanh lowers through Triton (libdevice) in both variants, with a window and split-K."""
  from jax import export

  q = jax.ShapeDtypeStruct((2, 3, 4, 64), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, 2, 128, 64), jnp.bfloat16)
  lengths = jax.ShapeDtypeStruct((2,), jnp.int32)
  for variant in ("pad", "split"):
    fn = jax.jit(lambda q, k, v, l: ragged_attention(q, k, v, l, variant=variant, sliding_window=32,
                                                     logit_soft_cap=50.0,
                                                     block_sizes=BlockSizes(num_splits=2)))
    exported = export.export(fn, platforms=["cuda"],
                             disabled_checks=[export.DisabledSafetyCheck.custom_call(
                                 TRITON_CUSTOM_CALL)])(q, kv, kv, lengths)
    assert exported.mlir_module().count(f"@{TRITON_CUSTOM_CALL}") == 1


@pytest.mark.parametrize("impl", ["reference", "blocked_pad", "blocked_split", "pallas_pad",
                                  "pallas_split"])
def test_per_layer_windows_with_a_soft_cap(impl):
  """A Gemma 2-style model calls one implementation per layer with its own static window (windowed
  layers alternate with global ones) and one soft cap: in one program, each layer attends as its own
  window says."""
  from bass_jax.models.attention_registry import get_attention

  cap, window = 5.0, 9
  layers = [_inputs(seed, 3, 2, 2, 2, 16, jnp.float32, max_len=64, block=16) for seed in (81, 82)]
  lengths = layers[0][3]
  attend = get_attention(impl)

  @jax.jit
  def two_layers(q0, k0, v0, q1, k1, v1, lengths):
    return (attend(q0, k0, v0, lengths, sliding_window=window, logit_soft_cap=cap),
            attend(q1, k1, v1, lengths, logit_soft_cap=cap))

  (q0, k0, v0, _), (q1, k1, v1, _) = layers
  q0, q1 = 10.0 * q0, 10.0 * q1
  out0, out1 = two_layers(q0, k0, v0, q1, k1, v1, lengths)
  want0 = _capped_softmax_attention(q0, k0, v0, lengths, cap, window)
  _check(out0, want0, jnp.float32)
  _check(out1, _capped_softmax_attention(q1, k1, v1, lengths, cap), jnp.float32)
  assert np.abs(want0 - _capped_softmax_attention(q0, k0, v0, lengths, cap)).max() > 0.1
