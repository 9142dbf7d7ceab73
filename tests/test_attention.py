"""The models' attention against a per-row, per-head numpy loop written from the definition: over a ragged
cache (the jnp reference, BASS-PAD and BASS-SPLIT in plain JAX) and without a cache (causal), with and
without Gemma 2's logit soft cap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bass_jax import platforms
from bass_jax.models import attention_registry
from bass_jax.models.attention import (blocked_attention, causal_attention, causal_implementation,
                                       reference_attention)
from bass_jax.models.attention_registry import get_attention
from bass_jax.platforms import compiling_for


def _loop_attention(q, k, v, lengths, window=None, cap=None):
  """q [B, T, N, H]; k, v [B, K, S, H] holding the T new tokens at lengths - T … lengths - 1; ``cap``:
  the scores s become cap * tanh(s / cap) before the softmax (Gemma 2)."""
  batch, num_q, num_heads, head_dim = q.shape
  group = num_heads // k.shape[1]
  out = np.zeros(q.shape, np.float64)
  for b in range(batch):
    for t in range(num_q):
      last = lengths[b] - num_q + t  # the query's own position
      first = max(0, last - window + 1) if window else 0
      for h in range(num_heads):
        keys = k[b, h // group, first:last + 1].astype(np.float64)
        scores = keys @ q[b, t, h] / np.sqrt(head_dim)
        if cap is not None:
          scores = cap * np.tanh(scores / cap)
        w = np.exp(scores - scores.max())
        out[b, t, h] = (w / w.sum()) @ v[b, h // group, first:last + 1]
  return out


def _inputs(seed, batch, num_q, num_heads, num_kv_heads, head_dim, max_len):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(num_q, max_len + 1, batch)
  lengths[0] = num_q  # a row that holds only the new tokens
  if batch > 1:
    lengths[-1] = max_len  # a full row
  q = rng.normal(size=(batch, num_q, num_heads, head_dim)).astype(np.float32)
  k = rng.normal(size=(batch, num_kv_heads, max_len, head_dim)).astype(np.float32)
  v = rng.normal(size=(batch, num_kv_heads, max_len, head_dim)).astype(np.float32)
  for b in range(batch):  # slots past each row's length are NaN: any stray read poisons the output
    k[b, :, lengths[b]:] = np.nan
    v[b, :, lengths[b]:] = np.nan
  return q, k, v, lengths


@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,head_dim", [
    (1, 1, 4, 4, 8), (3, 2, 9, 3, 16), (4, 8, 8, 1, 8), (2, 33, 6, 2, 32)])
def test_reference_matches_definition(batch, num_q, num_heads, num_kv_heads, head_dim):
  q, k, v, lengths = _inputs(batch * 100 + num_q, batch, num_q, num_heads, num_kv_heads, head_dim, 48)
  got = np.asarray(reference_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                       jnp.asarray(lengths, jnp.int32)))
  np.testing.assert_allclose(got, _loop_attention(q, k, v, lengths), atol=2e-5, rtol=0)


@pytest.mark.parametrize("window", [None, 3])
def test_causal_attention_without_a_cache_matches_definition(window):
  rng = np.random.default_rng(5)
  q = rng.normal(size=(2, 7, 6, 8)).astype(np.float32)
  k = rng.normal(size=(2, 7, 2, 8)).astype(np.float32)
  v = rng.normal(size=(2, 7, 2, 8)).astype(np.float32)
  got = np.asarray(causal_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                    sliding_window=window))
  # The same as a cache that holds exactly the 7 tokens.
  want = _loop_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), np.array([7, 7]), window)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def _converts(fn, *args):
  """The shapes of every array the traced ``fn`` converts from bf16 to f32."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return [e.invars[0].aval.shape for e in jaxpr.eqns if e.primitive.name == "convert_element_type"
          and e.invars[0].aval.dtype == jnp.bfloat16 and e.outvars[0].aval.dtype == jnp.float32]


def test_a_bf16_cache_is_read_in_bf16_and_never_copied_to_f32():
  q, k, v, lengths = _inputs(7, 3, 2, 8, 2, 16, 48)
  q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
  lengths = jnp.asarray(lengths, jnp.int32)
  got = reference_attention(q, k, v, lengths)
  assert got.dtype == jnp.bfloat16
  assert k.shape not in _converts(reference_attention, q, k, v, lengths)  # no f32 copy of K or V
  want = _loop_attention(*(np.asarray(x, np.float32) for x in (q, k, v)), np.asarray(lengths))
  np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2, rtol=0)
  # The same holds without a cache: the new tokens' K/V stay bf16.
  k_new, v_new = k[:, :, :5].transpose(0, 2, 1, 3), v[:, :, :5].transpose(0, 2, 1, 3)
  assert k_new.shape not in _converts(causal_attention, q[:, :1].repeat(5, 1), k_new, v_new)


@pytest.mark.parametrize("window", [None, 3])
def test_causal_attention_through_jax_nn_matches_the_jnp_path(window):
  """``implementation="xla"`` runs ``jax.nn.dot_product_attention``, the call that is cuDNN's flash
  attention on a GPU (not runnable here): same mask, window and GQA grouping as the jnp path."""
  rng = np.random.default_rng(6)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 9, 6, 8)), jnp.float32) if n == 6 else
             jnp.asarray(rng.normal(size=(2, 9, 2, 8)), jnp.float32) for n in (6, 2, 2))
  got = causal_attention(q, k, v, sliding_window=window, implementation="xla")
  want = causal_attention(q, k, v, sliding_window=window, implementation="reference")
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=0)
  with pytest.raises(ValueError, match="'reference', 'xla' or 'cudnn'"):
    causal_attention(q, k, v, implementation="flash")


def test_prefill_attention_is_cudnn_flash_for_bf16_on_a_gpu_and_the_jnp_path_elsewhere():
  """cuDNN's flash attention for bf16 and f16 traced for a GPU, where one is present; traced for a GPU
  on a machine without one (the deviceless census), XLA's own (cuDNN's version is checked while
  tracing, and cuDNN is not installed here)."""
  on_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
  assert on_gpu or causal_implementation(jnp.bfloat16) == causal_implementation(jnp.float32) == (
      "reference")
  with compiling_for("cuda"):
    flash = "cudnn" if on_gpu else "xla"
    assert causal_implementation(jnp.bfloat16) == causal_implementation(jnp.float16) == flash
    assert causal_implementation(jnp.float32) == "reference"  # cuDNN's kernel takes no f32


def test_unknown_implementation_is_named():
  with pytest.raises(ValueError, match="no_such_kernel"):
    get_attention("no_such_kernel")


def test_the_registry_finds_each_strategy_on_each_backend_and_refuses_clashes():
  """Every built-in name is found again by its (strategy, backend) pair; a second name for a pair, a
  taken name, a fallback not registered and a pair with no implementation are each refused."""
  for name in attention_registry.attention_implementations():
    impl = attention_registry.lookup(name)
    assert attention_registry.find(impl.strategy, impl.backend).name == name
  assert attention_registry.find("split", "pallas").fallback == "blocked_split"
  build = lambda: reference_attention
  with pytest.raises(ValueError, match="'pad' on backend 'pallas' is 'pallas_pad'"):
    attention_registry.register_attention(attention_registry.AttentionImpl("mine", "pad", "pallas",
                                                                           build))
  with pytest.raises(ValueError, match="registered already"):
    attention_registry.register_attention(attention_registry.AttentionImpl("reference", "x", "y",
                                                                           build))
  with pytest.raises(ValueError, match="fallback 'nope' is not registered"):
    attention_registry.register_attention(attention_registry.AttentionImpl("mine", "x", "y", build,
                                                                           fallback="nope"))
  with pytest.raises(ValueError, match="no attention implementation of strategy 'pad' on backend "
                     "'triton'.*'pallas'"):
    attention_registry.find("pad", "triton")
  assert "mine" not in attention_registry.attention_implementations()


def test_platform_kinds():
  """JAX's platform names map to their kinds; an unregistered one is treated as a CPU; a kind
  outside KINDS and a second kind for a name are refused."""
  assert [platforms.is_gpu(p) for p in ("gpu", "cuda", "rocm", "cpu", "tpu", "metal")] == [
      True, True, True, False, False, False]
  assert platforms.kind("tpu") == "tpu" and platforms.kind("metal") == "cpu"
  with pytest.raises(ValueError, match="kind must be one of"):
    platforms.register_platform("npu", "accelerator")
  with pytest.raises(ValueError, match="'cuda' is registered already as a 'gpu'"):
    platforms.register_platform("cuda", "cpu")


@pytest.mark.parametrize("variant", ["pad", "split"])
@pytest.mark.parametrize("batch,num_q,num_heads,num_kv_heads,window", [
    (1, 1, 4, 4, None), (3, 2, 9, 3, None), (4, 8, 8, 1, 5), (2, 33, 6, 2, None)])
def test_blocked_pad_and_split_match_the_definition(batch, num_q, num_heads, num_kv_heads, window,
                                                    variant):
  q, k, v, lengths = _inputs(batch * 10 + num_q, batch, num_q, num_heads, num_kv_heads, 16, 128)
  args = [jnp.asarray(x) for x in (q, k, v)] + [jnp.asarray(lengths, jnp.int32)]
  got = blocked_attention(*args, variant=variant, block_k=32, sliding_window=window)
  want = reference_attention(*args, sliding_window=window)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(got), _loop_attention(q, k, v, lengths, window), atol=2e-5)


CAP = 5.0  # Gemma 2 caps attention logits at 50; inputs below make |scores| >> 5, so the cap matters


@pytest.mark.parametrize("impl", ["reference", "blocked_pad", "blocked_split"])
@pytest.mark.parametrize("window", [None, 5])
def test_logit_soft_cap_matches_definition(impl, window):
  """Gemma 2's soft cap: scores s = q.k / sqrt(H) become cap * tanh(s / cap) before the mask. GQA
  (4 query heads over 2 KV heads), ragged rows, NaN past each row's length, two blocks of 64 slots."""
  q, k, v, lengths = _inputs(11 if window is None else 12, 3, 3, 4, 2, 16, 128)
  q *= 10.0  # scores of std ~10: tanh saturates, the capped softmax differs from the plain one
  args = [jnp.asarray(x) for x in (q, k, v)] + [jnp.asarray(lengths, jnp.int32)]
  attend = get_attention(impl)
  got = np.asarray(attend(*args, sliding_window=window, logit_soft_cap=CAP))
  want = _loop_attention(q, k, v, lengths, window, cap=CAP)
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
  uncapped = _loop_attention(q, k, v, lengths, window)
  assert np.abs(want - uncapped).max() > 0.1  # the cap changed the result: the comparison can fail


@pytest.mark.parametrize("implementation", ["reference", "xla", "cudnn"])
@pytest.mark.parametrize("window", [None, 3])
def test_causal_attention_with_a_soft_cap_runs_the_jnp_path(implementation, window):
  """``jax.nn.dot_product_attention`` has no soft cap: with one, every implementation (cuDNN too, which
  would not run on a CPU) runs the jnp path, and matches the definition."""
  rng = np.random.default_rng(15)
  q = 10.0 * rng.normal(size=(2, 7, 4, 16)).astype(np.float32)
  k = rng.normal(size=(2, 7, 2, 16)).astype(np.float32)
  v = rng.normal(size=(2, 7, 2, 16)).astype(np.float32)
  got = np.asarray(causal_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), sliding_window=window,
                                    logit_soft_cap=CAP, implementation=implementation))
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  want = _loop_attention(q, kt, vt, np.array([7, 7]), window, cap=CAP)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
  assert np.abs(want - _loop_attention(q, kt, vt, np.array([7, 7]), window)).max() > 0.1


def test_no_soft_cap_traces_the_uncapped_program():
  """``logit_soft_cap=None`` is the uncapped computation itself (no tanh anywhere), a cap adds one."""
  q, k, v, lengths = _inputs(13, 2, 2, 4, 2, 16, 64)
  args = [jnp.asarray(x) for x in (q, k, v)] + [jnp.asarray(lengths, jnp.int32)]
  for impl in ("reference", "blocked_pad", "blocked_split"):
    attend = get_attention(impl)
    plain = str(jax.make_jaxpr(lambda *a: attend(*a))(*args))
    assert str(jax.make_jaxpr(lambda *a: attend(*a, logit_soft_cap=None))(*args)) == plain
    assert "tanh" not in plain
    assert "tanh" in str(jax.make_jaxpr(lambda *a: attend(*a, logit_soft_cap=CAP))(*args))
  with pytest.raises(ValueError, match="logit_soft_cap must be > 0"):
    reference_attention(*args, logit_soft_cap=0.0)
