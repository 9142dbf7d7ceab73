"""Temperature and nucleus (top-p) warping of logits into the distribution that is actually sampled.

Speculative sampling is exact for whatever distribution both models are warped to (../shared/BASS.md
§2.3): the same :func:`warped_log_probs` is applied to the draft's ``q`` and to the target's ``p``, so the
emitted tokens follow the target's tempered, truncated distribution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_p_filter(log_probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """Restricts a distribution to its nucleus and renormalizes.

  The nucleus is every token whose probability is at least that of the last token needed to reach
  ``top_p``: sorting by probability, a token is kept if the mass strictly before it is below ``top_p``
  (transformers' ``TopPLogitsWarper`` rule; the most probable token is always kept), and tokens tied with
  the last kept one are kept too, so the result does not depend on sort order.

  Args:
    log_probs: ``f32[..., V]`` normalized log-probabilities.
    top_p: scalar in ``(0, 1]``.

  Returns:
    ``f32[..., V]`` log-probabilities, ``-inf`` outside the nucleus.
  """
  sorted_lp = -jnp.sort(-log_probs, axis=-1)  # descending
  probs = jnp.exp(sorted_lp)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  kept = mass_before < top_p
  threshold = jnp.min(jnp.where(kept, sorted_lp, jnp.inf), axis=-1, keepdims=True)
  filtered = jnp.where(log_probs >= threshold, log_probs, -jnp.inf)
  return jax.nn.log_softmax(filtered, axis=-1)


def warped_log_probs(logits: jax.Array, temperature: jax.Array, top_p: jax.Array, *,
                     use_top_p: bool) -> jax.Array:
  """``log softmax(logits / temperature)``, then the top-p nucleus when ``use_top_p``.

  Args:
    logits: ``f32[..., V]``.
    temperature: scalar > 0 (temperature 0 is greedy decoding and never reaches this function).
    top_p: scalar in ``(0, 1]``; read only when ``use_top_p`` (static, so ``top_p == 1`` skips the sort).

  Returns:
    ``f32[..., V]`` normalized log-probabilities (``-inf`` for excluded tokens).
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  if use_top_p:
    log_probs = top_p_filter(log_probs, top_p)
  return log_probs
