"""Training an EAGLE feature draft (``bass_jax.models.eagle``) on the target's features.

The corpus is :mod:`bass_jax.training.corpus`'s, labelled with features (``build_corpus
--labels=features``): windows of tokens ``x_0 … x_{T-1}`` and the target's features ``f_0 … f_{T-1}``.
The draft reads the pairs ``(f_i, x_{i+1})`` teacher-forced, in one causal forward, and is scored on
its prediction ``f̂_{i+1}`` (EAGLE, Li et al. 2024, §3.3):

* **feature regression**: Smooth L1 between ``f̂_{i+1}`` and ``f_{i+1}``, averaged over the features;
* **token distribution**: the cross-entropy from the target's distribution over ``x_{i+2}``,
  ``softmax(head · f_{i+1})``, to the draft's, ``softmax(head · f̂_{i+1})``, both on the draft vocabulary
  (FR-Spec: the target's distribution restricted to it and renormalized, the best a draft that is 0
  elsewhere can match), weighted by ``cls_weight`` (EAGLE: 0.1).

A position counts where ``x_{i+2}`` is a real token of the window (``mask[i + 1]``). The embedding and the
head are the target's, frozen. Held-out metrics: the loss, and ``agreement``, the share of positions
where the draft's argmax (on its vocabulary) is the target's argmax over the *full* vocabulary: greedy
BASS's acceptance of the first draft, exactly (the first draft reads only true features). Later drafts
read the draft's own features; their acceptance is measured by decoding (``experiments/draft_study``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.models import eagle
from bass_jax.training import distill


def feature_loss(params: Any, batch: dict[str, jax.Array], config: eagle.EagleConfig,
                 frozen: dict[str, jax.Array], dtype: str, cls_weight: float = 0.1):
  """EAGLE's loss on one batch of windows.

  Args:
    params: the draft's trainable weights (``fc``, ``layers_*``).
    batch: ``tokens i32[B, T]``, ``mask bool[B, T]``, ``features f16/f32[B, T, E]``.
    frozen: ``embedding [V, E]``, ``head [V', E]`` and ``vocab_ids i32[V']`` (``eagle.bind``'s).
    dtype: compute dtype name. cls_weight: weight of the token-distribution term.

  Returns:
    ``(loss f32[], metrics)`` with the masked means ``regression``, ``cross_entropy`` and
    ``agreement`` (draft argmax == target argmax, both on the draft vocabulary).
  """
  bound = {"draft": jax.tree_util.tree_map(lambda x: x.astype(dtype), params), **frozen}
  features = batch["features"]
  predicted, _ = eagle.forward(config, bound, batch["tokens"][:, 1:], features[:, :-1], None,
                               dtype=dtype)
  predicted = predicted.astype(jnp.float32)
  target = features[:, 1:].astype(jnp.float32)
  error = jnp.abs(predicted - target)
  regression = jnp.mean(jnp.where(error < 1.0, 0.5 * error * error, error - 0.5), axis=-1)
  log_q = jax.nn.log_softmax(eagle.draft_logits(bound, predicted.astype(dtype)), axis=-1)
  target_logits = eagle.draft_logits(bound, target)
  p = jax.nn.softmax(target_logits, axis=-1)
  cross_entropy = -jnp.sum(p * log_q, axis=-1)
  agree = (jnp.argmax(log_q, axis=-1) == jnp.argmax(target_logits, axis=-1)).astype(jnp.float32)
  mask = batch["mask"][:, 1:].astype(jnp.float32)
  denom = jnp.maximum(mask.sum(), 1.0)
  mean = lambda x: jnp.sum(x * mask) / denom
  loss = mean(regression + cls_weight * cross_entropy)
  return loss, {"regression": mean(regression), "cross_entropy": mean(cross_entropy),
                "agreement": mean(agree)}


@functools.partial(jax.jit, static_argnames=("config", "dtype", "cls_weight"))
def _evaluate_batch(params, frozen, full_head, batch, *, config, dtype, cls_weight):
  loss, metrics = feature_loss(params, batch, config, frozen, dtype, cls_weight)
  bound = {"draft": params, **frozen}
  predicted, _ = eagle.forward(config, bound, batch["tokens"][:, 1:], batch["features"][:, :-1],
                               None, dtype=dtype)
  drafted = frozen["vocab_ids"][jnp.argmax(eagle.draft_logits(bound, predicted), axis=-1)]
  target = jnp.argmax(jnp.einsum("BTE,VE->BTV", batch["features"][:, 1:].astype(jnp.float32),
                                 full_head.astype(jnp.float32)), axis=-1)
  mask = batch["mask"][:, 1:]
  return loss, metrics, jnp.sum((drafted == target) & mask), jnp.sum(mask)


def evaluate(params: Any, data: dict[str, np.ndarray], config: eagle.EagleConfig,
             frozen: dict[str, jax.Array], full_head: jax.Array, dtype: str, cls_weight: float = 0.1,
             batch_size: int = 16) -> dict[str, float]:
  """Held-out ``eval_loss``, ``eval_regression``, ``eval_cross_entropy`` and ``eval_agreement``.

  Args:
    data: ``tokens i32[N, T]``, ``mask bool[N, T]``, ``features f16[N, T, E]`` (held-out windows).
    frozen: as :func:`feature_loss`. full_head: ``[V, E]`` the target's whole LM head.
    batch_size: windows per jitted call (the last batch is smaller and compiles once more).

  ``eval_agreement`` compares the draft's argmax (on its vocabulary, mapped to token ids) with the
  target's argmax over the full vocabulary, so it also counts the positions the draft vocabulary cannot
  reach: greedy BASS's acceptance of the first draft (the first draft reads only true features).
  """
  totals = {"eval_loss": 0.0, "eval_regression": 0.0, "eval_cross_entropy": 0.0}
  agree = count = 0.0
  for start in range(0, len(data["tokens"]), batch_size):
    batch = {k: jnp.asarray(data[k][start:start + batch_size]) for k in ("tokens", "mask", "features")}
    loss, metrics, hits, n = _evaluate_batch(params, frozen, full_head, batch, config=config,
                                             dtype=dtype, cls_weight=cls_weight)
    n = float(n)
    totals["eval_loss"] += float(loss) * n
    totals["eval_regression"] += float(metrics["regression"]) * n
    totals["eval_cross_entropy"] += float(metrics["cross_entropy"]) * n
    agree += float(hits)
    count += n
  result = {k: v / max(count, 1.0) for k, v in totals.items()}
  result["eval_agreement"] = agree / max(count, 1.0)
  return result


def token_frequencies(tokens: np.ndarray, mask: np.ndarray, vocab_size: int) -> np.ndarray:
  """``i32[V]`` token ids by how often they are a labelled next token in the corpus, most frequent first
  (ties by id): the draft vocabulary is a prefix of it (FR-Spec)."""
  # Position t predicts tokens[t + 1]; count the tokens that are predicted.
  targets = tokens[:, 1:][mask[:, :-1]]
  counts = np.bincount(targets.ravel(), minlength=vocab_size)
  return np.lexsort((np.arange(vocab_size), -counts)).astype(np.int32)


def vocab_coverage(vocab_ids: np.ndarray, tokens: np.ndarray, mask: np.ndarray,
                   sizes) -> dict[int, float]:
  """For each V' in ``sizes``: the share of labelled next tokens of ``tokens i32[N, T]`` (``mask
  bool[N, T]`` as in the corpus) among the first V' of ``vocab_ids`` (FR-Spec's coverage). Sizes
  beyond ``len(vocab_ids)`` are left out."""
  targets = tokens[:, 1:][mask[:, :-1]]
  rank = np.full(int(max(tokens.max(), vocab_ids.max())) + 1, np.iinfo(np.int32).max)
  rank[np.asarray(vocab_ids)] = np.arange(len(vocab_ids))
  return {int(v): float(np.mean(rank[targets] < v)) for v in sizes if v <= len(vocab_ids)}


def objective(config: eagle.EagleConfig, cfg: distill.TrainConfig, target_config: Any,
              target_params: Any, vocab_ids: np.ndarray, cls_weight: float = 0.1) -> distill.Objective:
  """The EAGLE objective for :func:`distill.train`: :func:`feature_loss` and :func:`evaluate`, with the
  target's frozen embedding and head rows of ``vocab_ids[:config.draft_vocab_size]``.

  Raises:
    ValueError: a target outside the Llama family.
  """
  frozen = eagle.bind(None, vocab_ids, target_config, target_params, config.draft_vocab_size)
  del frozen["draft"]
  frozen = jax.tree_util.tree_map(
      lambda x: x if x.dtype == jnp.int32 else jnp.asarray(x, cfg.compute_dtype), frozen)
  full_head = eagle.lm_head_matrix(target_config, target_params)
  return distill.Objective(
      loss=lambda params, frozen, batch: feature_loss(params, batch, config, frozen,
                                                      cfg.compute_dtype, cls_weight),
      evaluate=lambda params, data: evaluate(params, data, config, frozen, full_head,
                                             cfg.compute_dtype, cls_weight),
      fields=("tokens", "mask", "features"),
      init=lambda key: eagle.init_draft_params(config, key),
      frozen=frozen)
