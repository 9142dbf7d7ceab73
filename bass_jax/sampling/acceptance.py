"""Per-row acceptance of draft tokens: speculative rejection sampling, its greedy limit, and drafter-invariant
(Gumbel-coupled) acceptance.

Implements step 3 of BASS (docs/bass.md, "One step for the whole batch"), i.e. Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023
(Algorithm 2), independently for every row of a batch: draft token ``d_i`` is accepted with probability
``min(1, p_i(d_i) / q_i(d_i))`` in order until the first rejection; at the first rejection position ``n``
one token is drawn from ``norm(max(0, p_n - q_n))``; if all ``l`` drafts are accepted a bonus token is drawn
from ``p_l``. With ``q_l := 0`` the correction and the bonus are the same draw, which is how it is coded.

Axes: B batch, L draft slots (``num_drafts <= L`` are real; the rest are padding of a static shape), V
vocabulary, C positions of one verification chunk. Position ``i`` of ``p`` is the target's distribution
for the token after ``[.., d_1 … d_i]``, so ``p`` has L + 1 positions and ``q`` has L.

The decode loop verifies in chunks of C positions (``bass_jax.sampling.loop``) and accepts chunk by chunk
with :func:`greedy_accept_chunk` / :func:`speculative_accept_chunk`; each position's uniform draw is
keyed by the position, not the chunk, so chunking the positions differently changes no decision.
With ``acceptance="gumbel"`` it uses :func:`coupled_accept_chunk` instead: the target's token at each
position is its own Gumbel-max draw with per-sequence, per-position noise, and a draft is accepted when
it equals it (Daliri, Musco and Suresh 2024): exact too, and the tokens do not depend on the draft.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bass_jax.sampling import warp


def leading_true(mask: jax.Array) -> jax.Array:
  """Length of the all-True prefix of each row of ``bool[B, L]`` -> ``i32[B]``."""
  return jnp.sum(jnp.cumprod(mask.astype(jnp.int32), axis=-1), axis=-1)


def greedy_accept_chunk(target_logits: jax.Array, next_drafts: jax.Array, positions: jax.Array,
                        num_drafts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Greedy acceptance over one chunk of positions.

  Args:
    target_logits: ``f32[B, C, V]``, the target at positions ``positions``.
    next_drafts: ``i32[B, C]``, the draft each position is checked against (``d_{i+1}``; anything where
      ``i >= num_drafts``).
    positions: ``i32[C]`` global positions ``i`` of the chunk.
    num_drafts: ``i32[]`` or ``i32[B]`` (per row) l, the number of real drafts.

  Returns:
    ``(matched: i32[B], next_token: i32[B])``: the number of leading positions whose draft equals the
    target's argmax (``matched < C`` means the row's acceptance ends in this chunk, at position
    ``positions[matched]``), and the target's argmax there (the correction, or the bonus at ``i = l``).
  """
  return _accept_matches(warp.first_argmax(target_logits), next_drafts, positions, num_drafts)


def coupled_accept_chunk(target_log_probs: jax.Array, row_keys: jax.Array, seq_len: jax.Array,
                         next_drafts: jax.Array, positions: jax.Array,
                         num_drafts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Drafter-invariant acceptance over one chunk of positions (Daliri, Musco and Suresh 2024).

  The target's token at every position is its Gumbel-max draw with the row's noise for that text
  position (``warp.coupled_choice``); a draft is accepted exactly when it equals that token, and the
  first mismatch emits it. Every emitted token is therefore the target's own draw, a function of the
  row's sequence key and the text before it, whatever was drafted: exact (the Gumbel-max trick draws
  from ``p``) and the same tokens as regular decoding with ``acceptance="gumbel"``. A draft drawn with the
  same noise from its own ``q`` (``StepContext.draw``) matches often when ``q`` is close to ``p``.

  Args:
    target_log_probs: ``f32[B, C, V]`` warped ``log p_i`` at the chunk's positions.
    row_keys: ``u32[B, 2]`` each row's sequence key data. seq_len: ``i32[B]`` the rows' text lengths
      at the step's start (position i draws the token at text position ``seq_len + i``).
    next_drafts, positions, num_drafts: as :func:`greedy_accept_chunk`.

  Returns:
    ``(matched: i32[B], next_token: i32[B])`` as :func:`greedy_accept_chunk`.
  """
  chosen = warp.coupled_choice(target_log_probs, row_keys, seq_len[:, None] + positions[None, :])
  return _accept_matches(chosen, next_drafts, positions, num_drafts)


def _accept_matches(chosen: jax.Array, next_drafts: jax.Array, positions: jax.Array,
                    num_drafts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Accepts drafts while they equal the target's chosen token ``chosen: i32[B, C]``; returns the
  matched count and the chosen token at the first mismatch (or the bonus position)."""
  matched = leading_true((chosen == next_drafts) & _real(positions, num_drafts))
  at = jnp.minimum(matched, chosen.shape[1] - 1)
  return matched, jnp.take_along_axis(chosen, at[:, None], axis=1)[:, 0]


def _real(positions: jax.Array, num_drafts: jax.Array) -> jax.Array:
  """``bool[B or 1, C]``: position i checks a real draft (``i < num_drafts``, per row or for all)."""
  return positions[None, :] < jnp.reshape(num_drafts, (-1, 1))


def correction_distribution(p: jax.Array, q: jax.Array) -> jax.Array:
  """``norm(max(0, p - q))`` as unnormalized probabilities ``f32[B, V]``: the distribution of the token
  emitted at the first rejection (``q = 0`` at the bonus position, which makes it ``p``).

  The residual is all zero only where ``p == q`` up to rounding, and then a rejection had probability
  ~0; ``p`` is returned there, which keeps that (rounding-level) case a valid draw.
  """
  residual = jnp.maximum(p - q, 0.0)
  return jnp.where(jnp.sum(residual, axis=-1, keepdims=True) > 0, residual, p)


def speculative_accept_chunk(key: jax.Array, target_log_probs: jax.Array, draft_log_probs: jax.Array,
                             next_drafts: jax.Array, positions: jax.Array,
                             num_drafts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Speculative rejection sampling over one chunk of positions.

  Position ``i`` accepts ``d_{i+1}`` with probability ``min(1, p_i(d) / q_i(d))``. Randomness is keyed
  as :func:`tree.speculative_accept_tree` keys a chain's nodes (``d_{i+1}`` is node ``i + 1`` of
  ``tree.chain_tree``), so chunking the positions differently changes no decision, and a chain
  accepted here and as a tree makes the same draws (``tests/test_tree_acceptance.py``): with
  ``accept_key, residual_key = split(key)``, the uniform of position i is row b of
  ``uniform(fold_in(accept_key, i + 1), (B,))``, and a correction drawn at position n uses the key
  ``fold_in(fold_in(residual_key, n), b)``.

  Args:
    key: PRNG key of the whole step's acceptance.
    target_log_probs: ``f32[B, C, V]`` warped ``log p_i`` at the chunk's positions.
    draft_log_probs: ``f32[B, C, V]`` warped ``log q_i`` at the same positions (anything where
      ``i >= num_drafts``), or None for a deterministic proposer: ``q_i`` one-hot at ``d_{i+1}``, so a
      draft is accepted with probability ``p_i(d)`` and the correction is drawn from ``p_i`` without d.
    next_drafts: ``i32[B, C]`` the drafts ``d_{i+1}``.
    positions: ``i32[C]`` global positions. num_drafts: ``i32[]`` or ``i32[B]`` l.

  Returns:
    ``(matched: i32[B], next_token: i32[B])`` as :func:`greedy_accept_chunk`; ``next_token`` is drawn
    from :func:`correction_distribution` at the first rejected position.
  """
  batch, chunk = next_drafts.shape
  accept_key, residual_key = jax.random.split(key)
  u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(accept_key, i + 1), (batch,)))(
      positions).T
  log_p = jnp.take_along_axis(target_log_probs, next_drafts[..., None], axis=-1)[..., 0]
  if draft_log_probs is None:
    log_q = jnp.zeros_like(log_p)
  else:
    log_q = jnp.take_along_axis(draft_log_probs, next_drafts[..., None], axis=-1)[..., 0]
  matched = leading_true((jnp.log(u) < log_p - log_q) & _real(positions, num_drafts))

  rows = jnp.arange(batch)
  at = jnp.minimum(matched, chunk - 1)
  p_n = jnp.exp(target_log_probs[rows, at])  # [B, V]
  if draft_log_probs is None:
    q_at = jax.nn.one_hot(next_drafts[rows, at], p_n.shape[-1], dtype=p_n.dtype)
  else:
    q_at = jnp.exp(draft_log_probs[rows, at])
  real_at = jnp.broadcast_to(_real(positions, num_drafts), (batch, chunk))[rows, at]
  q_n = jnp.where(real_at[:, None], q_at, 0.0)
  residual = correction_distribution(p_n, q_n)
  fold = lambda n, b: jax.random.fold_in(jax.random.fold_in(residual_key, n), b)
  keys = jax.vmap(fold)(positions[at], rows)
  next_token = jax.vmap(warp.categorical)(keys, jnp.log(residual))
  return matched, next_token
