"""Temperature and nucleus (top-p) warping of logits into the distribution that is actually sampled.

Speculative sampling is exact for whatever distribution both models are warped to (docs/bass.md,
step 3): the same :func:`warped_log_probs` is applied to the draft's ``q`` and to the target's ``p``, so the
emitted tokens follow the target's tempered, truncated distribution.

The nucleus (Holtzman et al. 2020; transformers' ``TopPLogitsWarper``) is defined without reference to a
sort order: token i is kept iff the probability mass of the tokens *strictly more probable* than it is
below ``top_p``. The most probable token is always kept, and tokens tied with the least probable kept
one are kept too. A full sort of a 49k vocabulary costs ~10 ms per row on a CPU, so the threshold is
found from ``lax.top_k`` (the nucleus usually holds a handful of tokens) and, for rows whose nucleus is
wider than that, by bisection over the float bit patterns, which is exact on the discrete set of
probabilities. On a GPU (``branch_free``) one sort per row finds it instead: no loop, no branch. The
paths sum the same masses in different orders, so they can only disagree where a token's mass sits
within float rounding of ``top_p``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

TOP_K_FAST_PATH = 64  # nucleus sizes up to this are read off lax.top_k


def _keys(probs: jax.Array) -> jax.Array:
  """Non-negative f32 -> i32 bit patterns, which order exactly as the floats do."""
  return jax.lax.bitcast_convert_type(probs, jnp.int32)


def _bisect_threshold(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """Smallest key t with ``sum(p[key > t]) < top_p``, per row; ``[..., V] -> i32[...]``."""
  keys = _keys(probs)
  lo = jnp.full(probs.shape[:-1], -1, jnp.int32)  # mass above lo >= top_p (or lo = -1, a sentinel)
  hi = jnp.full(probs.shape[:-1], _keys(jnp.float32(1.0)) + 1, jnp.int32)  # mass above hi = 0

  def body(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    below = jnp.sum(jnp.where(keys > mid[..., None], probs, 0.0), axis=-1) < top_p
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  _, hi = jax.lax.fori_loop(0, 31, body, (lo, hi))  # 2**31 > the key range: converged
  return hi


def _sorted_threshold(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """The same threshold as :func:`_bisect_threshold` from one sort per row: the smallest key among
  the tokens whose mass before them in descending order is below ``top_p``. A token tied with
  earlier ones has their mass before it too, so the first of a tie group decides for the group, as
  the definition (mass *strictly* more probable) does. ``[..., V] -> i32[...]``."""
  descending = -jnp.sort(-probs, axis=-1)
  kept = jnp.cumsum(descending, axis=-1) - descending < top_p
  return jnp.min(jnp.where(kept, _keys(descending), jnp.iinfo(jnp.int32).max), axis=-1)


def top_p_filter(log_probs: jax.Array, top_p: jax.Array, *, branch_free: bool = False) -> jax.Array:
  """Restricts a distribution to its nucleus (module docstring) and renormalizes.

  Args:
    log_probs: ``f32[..., V]`` normalized log-probabilities.
    top_p: scalar in ``(0, 1]``.
    branch_free: find every row's threshold with one sort (:func:`_sorted_threshold`), with no
      ``lax.cond`` and no loop: the GPU profile's (``bass_jax.profiles``). On XLA:GPU a ``cond``'s
      branch index is a host round trip and each of the bisection's 31 iterations a few launches,
      where a real GPU sorts a row in one CUB kernel. Otherwise (a CPU, where a 49k sort
      costs ~10 ms a row) the top-k fast path, and the bisection under a ``lax.cond`` for rows whose
      nucleus is wider.

  Returns:
    ``f32[..., V]`` log-probabilities, ``-inf`` outside the nucleus.
  """
  probs = jnp.exp(log_probs)
  if branch_free:
    threshold = _sorted_threshold(probs, top_p)
    filtered = jnp.where(_keys(probs) >= threshold[..., None], log_probs, -jnp.inf)
    return jax.nn.log_softmax(filtered, axis=-1)
  k = min(TOP_K_FAST_PATH, log_probs.shape[-1])
  top_probs = jnp.exp(jax.lax.top_k(log_probs, k)[0])  # descending
  mass_before = jnp.cumsum(top_probs, axis=-1) - top_probs
  kept = mass_before < top_p
  fast = jnp.min(jnp.where(kept, _keys(top_probs), jnp.iinfo(jnp.int32).max), axis=-1)
  # The nucleus lies inside the top k unless all k tokens are kept (and the vocabulary is larger).
  wider = kept[..., -1] & (k < log_probs.shape[-1])
  bisected = lambda: jnp.where(wider, _bisect_threshold(probs, top_p), fast)
  threshold = jax.lax.cond(jnp.any(wider), bisected, lambda: fast)
  filtered = jnp.where(_keys(probs) >= threshold[..., None], log_probs, -jnp.inf)
  return jax.nn.log_softmax(filtered, axis=-1)


def warped_log_probs(logits: jax.Array, temperature: jax.Array, top_p: jax.Array | None, *,
                     branch_free: bool = False) -> jax.Array:
  """``log softmax(logits / temperature)``, then the top-p nucleus unless ``top_p`` is None.

  Whether there is a nucleus is a static property of the program (``bass_jax.generate`` passes None
  for ``top_p == 1``): a run-time ``lax.cond`` on ``top_p < 1`` would cost a host round trip per call
  on XLA:GPU, where a ``cond``'s branch index is read by the host (docs/design.md, "Backend
  profiles"). Calls that differ in ``top_p < 1`` compile two programs; the value of ``top_p`` itself
  stays traced.

  Args:
    logits: ``f32[..., V]``.
    temperature: scalar > 0 (temperature 0 is greedy decoding and never reaches this function).
    top_p: scalar in ``(0, 1]``, or None for no nucleus.
    branch_free: as in :func:`top_p_filter`.

  Returns:
    ``f32[..., V]`` normalized log-probabilities (``-inf`` for excluded tokens).
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  if top_p is None:
    return log_probs
  return top_p_filter(log_probs, top_p, branch_free=branch_free)


def categorical(key: jax.Array, log_probs: jax.Array) -> jax.Array:
  """One draw per row from ``softmax(log_probs)``, ``f32[..., V] -> i32[...]``: the Gumbel-max trick with
  one key for the whole array (``jax.random.categorical``'s method, with :func:`first_argmax`)."""
  return first_argmax(log_probs + jax.random.gumbel(key, log_probs.shape, jnp.float32))


def sequence_keys(seed_key: jax.Array, sequence_ids) -> np.ndarray:
  """Per-sequence key data ``u32[B, 2]``: ``fold_in(seed_key, sequence_ids[b])`` (threefry), the keys of
  :func:`gumbel_noise`.

  Args:
    seed_key: a threefry PRNG key (the decode's seed). sequence_ids: B ints in ``[0, 2**32)``.
  """
  ids = jnp.asarray(np.asarray(sequence_ids, np.uint32))
  return np.asarray(jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(seed_key, i)))(ids))


def gumbel_noise(row_keys: jax.Array, positions: jax.Array, vocab_size: int) -> jax.Array:
  """Standard Gumbel noise that depends only on a row's sequence key and a text position.

  The noise of drafter-invariant speculative decoding (Daliri, Musco and Suresh 2024, "Coupling
  without communication and drafter-invariant speculative decoding", arXiv 2408.07978): the token at
  text position ``t`` of a sequence is ``argmax(log p_t + G_t)`` for the target and
  ``argmax(log q_t + G_t)`` for a draft (:func:`gumbel_choice`), with the same ``G_t``, so whatever
  the draft, the batch or the step structure, a sequence's tokens are a function of its key and the
  target alone.

  Args:
    row_keys: ``u32[B, 2]`` threefry key data per row (:func:`sequence_keys`).
    positions: ``i32[B]`` or ``i32[B, C]`` text positions.
    vocab_size: V.

  Returns:
    ``f32[B, V]`` or ``f32[B, C, V]``: ``gumbel(fold_in(key_b, position))``.
  """
  return _per_position(row_keys, positions, lambda key: jax.random.gumbel(
      key, (vocab_size,), jnp.float32))


def position_uniforms(row_keys: jax.Array, positions: jax.Array) -> jax.Array:
  """Uniforms in ``[0, 1)`` that depend only on a row's sequence key and a text position, like
  :func:`gumbel_noise` (for a keyed acceptance rule of one's own, docs/extending.md). Both draw
  from the same key ``fold_in(key_b, position)``: a rule uses one or the other, not both.

  Args:
    row_keys: ``u32[B, 2]`` threefry key data per row (:func:`sequence_keys`).
    positions: ``i32[B]`` or ``i32[B, C]`` text positions.

  Returns:
    ``f32[B]`` or ``f32[B, C]``: ``uniform(fold_in(key_b, position))``.
  """
  return _per_position(row_keys, positions, lambda key: jax.random.uniform(key, (), jnp.float32))


def _per_position(row_keys: jax.Array, positions: jax.Array, draw) -> jax.Array:
  """``draw(fold_in(key_b, position))`` for every row b (``u32[B, 2]`` threefry key data) and each of
  its ``positions`` (``i32[B]`` or ``i32[B, C]``), stacked as ``positions.shape + draw's shape``."""
  keys = jax.random.wrap_key_data(row_keys, impl="threefry2x32")
  one = lambda key, t: draw(jax.random.fold_in(key, t))
  per_row = jax.vmap(jax.vmap(one, in_axes=(None, 0)))(keys, positions.reshape(len(keys), -1))
  return per_row.reshape(positions.shape + per_row.shape[2:])


def gumbel_choice(log_probs: jax.Array, row_keys: jax.Array, positions: jax.Array) -> jax.Array:
  """The Gumbel-max draw ``argmax(log_probs + G)`` with :func:`gumbel_noise` ``G``.

  A draw from ``softmax(log_probs)`` (the Gumbel-max trick); two distributions chosen from with the
  same row and position agree with probability at least ``(1 - TV) / (1 + TV)`` (Daliri et al. 2024:
  Gumbel sampling does at least as well as Weighted MinHash, which reaches that bound), where
  rejection sampling accepts with probability ``1 - TV``: that gap is what drafter invariance costs.

  Args:
    log_probs: ``f32[B, V]`` or ``f32[B, C, V]`` warped log-probabilities (``-inf`` is never chosen).
    row_keys: ``u32[B, 2]``. positions: ``i32[B]`` or ``i32[B, C]``, the text position of each draw.

  Returns:
    ``i32[B]`` or ``i32[B, C]`` tokens.
  """
  noise = gumbel_noise(row_keys, positions, log_probs.shape[-1])
  return first_argmax(log_probs + noise)


def first_argmax(x: jax.Array) -> jax.Array:
  """``jnp.argmax(x, axis=-1)`` (the first index of the maximum) as ``i32[...]``, computed as a max and then
  a min over the indices that reach it: two plain reductions, which XLA:CPU runs about twice as fast
  as its variadic (value, index) argmax reduction over a 49k vocabulary
  (``python -m experiments.benchmarks.bench_top_p`` times both). For finite or ``-inf`` inputs: a row holding a
  NaN gives ``V - 1`` (``jnp.argmax`` would give the NaN's index)."""
  best = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == best, index, x.shape[-1] - 1), axis=-1)
