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
head are the target's, frozen.

Later drafts read the draft's *own* features, which teacher forcing never shows it. EAGLE-3's
*training-time test* (Li et al. 2025, §3.2) closes that gap: :func:`chained_drafts` runs chains of D
drafts from many starts exactly as the proposer would (true pairs up to the start, then the draft's own
features), and ``ttt_depth = D`` adds their losses. With ``fused_layers`` (EAGLE-3's fused features,
``bass_jax.models.eagle``) the first draft also reads the corpus's ``hidden`` states.

Held-out metrics (:func:`evaluate`): the loss; ``agreement``, the share of positions where the draft's
argmax (on its vocabulary) is the target's argmax over the *full* vocabulary, which is greedy BASS's
acceptance of the first draft, exactly; the same per depth of chains from every position; and the mean
accepted length of greedy BASS that those chains simulate.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.cache import KVCache
from bass_jax.models import eagle
from bass_jax.models import eagle_init
from bass_jax.training import corpus
from bass_jax.training import distill


def _scores(bound: dict[str, jax.Array], predicted: jax.Array, target: jax.Array):
  """Per-position ``(regression, cross_entropy, agree)``, each ``f32[...]``, of predicted features
  against the target's (both ``[..., E]``): Smooth L1 averaged over E; the cross-entropy from the
  target's distribution to the draft's on the draft vocabulary; argmax agreement on it. An EAGLE-3
  draft (``bound["target_head"]``: the target's head rows of the draft vocabulary) predicts no
  feature: its regression is 0 and the target's distribution comes from the target's own head."""
  predicted, target = predicted.astype(jnp.float32), target.astype(jnp.float32)
  log_q = jax.nn.log_softmax(eagle.draft_logits(bound, predicted), axis=-1)
  if "target_head" in bound:
    regression = jnp.zeros(predicted.shape[:-1], jnp.float32)
    target_logits = jnp.einsum("...E,VE->...V", target, bound["target_head"].astype(jnp.float32))
  else:
    error = jnp.abs(predicted - target)
    regression = jnp.mean(jnp.where(error < 1.0, 0.5 * error * error, error - 0.5), axis=-1)
    target_logits = eagle.draft_logits(bound, target)
  cross_entropy = -jnp.sum(jax.nn.softmax(target_logits, axis=-1) * log_q, axis=-1)
  agree = (jnp.argmax(log_q, axis=-1) == jnp.argmax(target_logits, axis=-1)).astype(jnp.float32)
  return regression, cross_entropy, agree


def chain_starts(window: int, depth: int, stride: int = 1) -> np.ndarray:
  """``i32[S]``: the pair positions ``c`` a chain of ``depth`` drafts can start from in a window of
  ``window`` tokens (``c + depth <= window - 1``), every ``stride``-th.

  Raises:
    ValueError: ``depth < 1``, ``stride < 1``, or a window too short for one chain.
  """
  if depth < 1 or stride < 1 or window < depth + 2:
    raise ValueError(f"chain_starts: need depth >= 1, stride >= 1 and window >= depth + 2, got depth "
                     f"{depth}, stride {stride}, window {window}")
  return np.arange(0, window - depth, stride, dtype=np.int32)


def chained_drafts(config: eagle.EagleConfig, bound: dict[str, Any], tokens: jax.Array,
                   first: jax.Array, update: Any, starts: jax.Array, depth: int, dtype: str
                   ) -> jax.Array:
  """Drafts ``depth`` features from every start as the proposer does, on the window's tokens.

  This is EAGLE-3's *training-time test* (Li et al. 2025, §3.2), written with the decode's own ragged
  cache instead of its custom attention mask. A chain from pair position ``c`` begins with the
  teacher-forced prediction ``f̂_{c+1}`` (from the true ``f_c``). Draft ``d >= 2`` reads the pair
  ``(f̂_{c+d-1}, x_{c+d})``: the draft's *own* previous feature and the window's token. It attends to
  the true pairs ``0 … c`` (the depth-1 keys and values) and to the chain's earlier drafts. Each
  ``(window, start)`` is one row of a cache, ragged at length ``c + 1``: the decode's state after a
  catch-up to position c.

  Args:
    tokens: ``i32[B, T]``. first: ``[B, T-1, E]`` the depth-1 forward's output (pair i predicts
      ``f̂_{i+1}``). update: its :class:`KVUpdate` (``[B, T-1, K, H]`` per layer).
    starts: ``i32[S]`` pair positions (:func:`chain_starts`; ``c + depth <= T - 1``).

  Returns:
    ``[B, S, depth, E]``: draft d of the chain from ``starts[s]`` is ``f̂_{c+d}`` at index ``d - 1``.
  """
  batch, num_starts = tokens.shape[0], starts.shape[0]
  rows_b = jnp.repeat(jnp.arange(batch), num_starts)  # [R], R = B * S
  rows_c = jnp.tile(starts, batch)
  drafts = [first[rows_b, rows_c]]  # f̂_{c+1}: [R, E]
  if depth > 1:
    as_cache = lambda x: x[rows_b].transpose(0, 2, 1, 3)  # [R, K, T-1, H]
    cache = KVCache(k=tuple(map(as_cache, update.k)), v=tuple(map(as_cache, update.v)),
                    lengths=rows_c + 1)
    for d in range(2, depth + 1):
      token = tokens[rows_b, rows_c + d][:, None]
      predicted, cache = eagle.forward(config, bound, token, drafts[-1][:, None].astype(dtype), cache,
                                       dtype=dtype)
      drafts.append(predicted[:, 0])
  return jnp.stack(drafts, axis=1).reshape(batch, num_starts, depth, -1)


def bound_params(params: Any, frozen: dict[str, jax.Array]) -> dict[str, Any]:
  """What ``eagle.forward`` and ``eagle.draft_logits`` take: the trainable weights with the frozen
  inputs; an EAGLE-3 draft's own head and final norm (trained) come out of ``params``, and so does a
  published draft's own ``embed_tokens`` (in place of the target's embedding, as ``eagle.bind``)."""
  frozen = dict(frozen)
  own, replaced = eagle.own_weights(params, frozen["vocab_ids"].shape[0], frozen.pop("norm_eps", None))
  return {"draft": own, **frozen, **replaced}


def input_features(config: eagle.EagleConfig, batch: dict[str, jax.Array]) -> jax.Array:
  """What the first draft reads at every position: ``features [B, T, E]``, or with fused layers
  ``concat(hidden, features) [B, T, (n+1)E]`` (the corpus's ``hidden`` holds those layers' outputs);
  an EAGLE-3 draft's taps alone, ``hidden [B, T, nE]``."""
  if config.kind == "eagle3":
    return batch["hidden"]
  if not config.fused_layers:
    return batch["features"]
  return jnp.concatenate([batch["hidden"], batch["features"].astype(batch["hidden"].dtype)], axis=-1)


def fields(config: eagle.EagleConfig) -> tuple[str, ...]:
  """The corpus arrays training and evaluation read."""
  return ("tokens", "mask", "features") + (("hidden",) if config.target_taps else ())


def _chain_gather(x: jax.Array, starts: jax.Array, depth: int) -> jax.Array:
  """``x[b, starts[s] + d]`` for d = 1 … depth: ``[B, T, ...] -> [B, S, depth, ...]``."""
  index = starts[:, None] + jnp.arange(1, depth + 1)  # [S, depth]
  return x[:, index]


def feature_loss(params: Any, batch: dict[str, jax.Array], config: eagle.EagleConfig,
                 frozen: dict[str, jax.Array], dtype: str, cls_weight: float = 0.1,
                 ttt_depth: int = 1, ttt_stride: int = 8):
  """EAGLE's loss on one batch of windows, optionally with EAGLE-3's training-time test.

  Args:
    params: the draft's trainable weights (``fc``, ``layers_*``).
    batch: ``tokens i32[B, T]``, ``mask bool[B, T]``, ``features f16/f32[B, T, E]`` (and ``hidden
      [B, T, nE]`` with fused layers, :func:`input_features`).
    frozen: ``embedding [V, E]``, ``head [V', E]`` and ``vocab_ids i32[V']`` (``eagle.bind``'s).
    dtype: compute dtype name. cls_weight: weight of the token-distribution term.
    ttt_depth: 1 trains on teacher-forced features only (EAGLE). D > 1 also scores drafts 2 … D of
      chains (:func:`chained_drafts`) that start every ``ttt_stride`` positions; the loss is the mean
      of the D depths' losses, each a masked mean over its positions.

  Returns:
    ``(loss f32[], metrics)`` with the masked means ``regression``, ``cross_entropy`` and
    ``agreement`` (draft argmax == target argmax, both on the draft vocabulary) of depth 1, and
    ``agreement_d{d}`` for the deeper drafts.
  """
  bound = bound_params(jax.tree_util.tree_map(lambda x: x.astype(dtype), params), frozen)
  tokens, features = batch["tokens"], batch["features"]
  predicted, update = eagle.forward(config, bound, tokens[:, 1:], input_features(config, batch)[:, :-1],
                                    None, dtype=dtype)
  regression, cross_entropy, agree = _scores(bound, predicted, features[:, 1:])
  mask = batch["mask"][:, 1:].astype(jnp.float32)
  mean = lambda x, m: jnp.sum(x * m) / jnp.maximum(m.sum(), 1.0)
  loss = mean(regression + cls_weight * cross_entropy, mask)
  metrics = {"regression": mean(regression, mask), "cross_entropy": mean(cross_entropy, mask),
             "agreement": mean(agree, mask)}
  if ttt_depth > 1:
    starts = jnp.asarray(chain_starts(tokens.shape[1], ttt_depth, ttt_stride))
    chains = chained_drafts(config, bound, tokens, predicted, update, starts, ttt_depth, dtype)
    # A chain's draft d reads x_{c+2} … x_{c+d}; it counts while they and x_{c+d+1} are real tokens.
    valid = jnp.cumprod(_chain_gather(batch["mask"], starts, ttt_depth), axis=-1).astype(jnp.float32)
    deep = _scores(bound, chains[:, :, 1:], _chain_gather(features, starts, ttt_depth)[:, :, 1:])
    for d in range(2, ttt_depth + 1):
      m = valid[:, :, d - 1]
      term = [x[:, :, d - 2] for x in deep]
      loss = loss + mean(term[0] + cls_weight * term[1], m)
      metrics[f"agreement_d{d}"] = mean(term[2], m)
    loss = loss / ttt_depth
  return loss, metrics


@functools.partial(jax.jit, static_argnames=("config", "dtype", "cls_weight", "depth"))
def _evaluate_batch(params, frozen, full_head, batch, *, config, dtype, cls_weight, depth):
  """Sums over one batch of windows: depth-1 loss terms, first-draft hits, and the chains' hits."""
  bound = bound_params(params, frozen)
  tokens, features, mask = batch["tokens"], batch["features"], batch["mask"]
  predicted, update = eagle.forward(config, bound, tokens[:, 1:], input_features(config, batch)[:, :-1],
                                    None, dtype=dtype)
  regression, cross_entropy, _ = _scores(bound, predicted, features[:, 1:])
  drafted = lambda f: frozen["vocab_ids"][jnp.argmax(eagle.draft_logits(bound, f), axis=-1)]
  # The target's greedy token after each position, over its full vocabulary.
  greedy = jnp.argmax(jnp.einsum("BTE,VE->BTV", features.astype(jnp.float32),
                                 full_head.astype(jnp.float32)), axis=-1)  # [B, T]
  first = mask[:, 1:]
  agree = (drafted(predicted) == greedy[:, 1:]) & first
  sums = {"loss": jnp.sum((regression + cls_weight * cross_entropy) * first),
          "regression": jnp.sum(regression * first), "cross_entropy": jnp.sum(cross_entropy * first),
          "agreement": jnp.sum(agree), "count": jnp.sum(first),
          "row_agreement": jnp.sum(agree, axis=1), "row_count": jnp.sum(first, axis=1)}

  starts = jnp.asarray(chain_starts(tokens.shape[1], depth))
  chains = chained_drafts(config, bound, tokens, predicted, update, starts, depth, dtype)
  valid = jnp.cumprod(_chain_gather(mask, starts, depth), axis=-1).astype(bool)  # [B, S, depth]
  target = _chain_gather(greedy, starts, depth)
  hit = (drafted(chains) == target) & valid
  # Greedy verification accepts draft d if drafts 1 … d-1 were accepted; the window's next token must
  # also be the target's greedy one for the teacher-forced chain to be the one the decode would run.
  on_path = hit & (target == _chain_gather(tokens, starts + 1, depth))
  alive = jnp.cumprod(jnp.concatenate([jnp.ones_like(on_path[..., :1]), on_path[..., :-1]], -1), -1)
  sums.update(chain_hits=jnp.sum(hit, axis=(0, 1)), chain_counts=jnp.sum(valid, axis=(0, 1)),
              accepted=jnp.sum(alive * hit), starts=jnp.sum(valid[..., 0]))
  return sums


def evaluate(params: Any, data: dict[str, np.ndarray], config: eagle.EagleConfig,
             frozen: dict[str, jax.Array], full_head: jax.Array, dtype: str, cls_weight: float = 0.1,
             depth: int = 4, batch_size: int = 4) -> dict[str, float]:
  """Held-out metrics of a feature draft, teacher-forced and chained.

  Args:
    data: ``tokens i32[N, T]``, ``mask bool[N, T]``, ``features f16[N, T, E]`` (held-out windows;
      with fused layers also ``hidden``).
    frozen: as :func:`feature_loss`. full_head: ``[V, E]`` the target's whole LM head.
    depth: drafts per chain (the draft length l of the simulated greedy BASS).
    batch_size: windows per jitted call (the last batch is smaller and compiles once more).

  Returns:
    * ``eval_loss``, ``eval_regression``, ``eval_cross_entropy``: :func:`feature_loss` at depth 1;
    * ``eval_agreement``: the draft's argmax (on its vocabulary, as token ids) equals the target's
      argmax over the full vocabulary: greedy BASS's acceptance of the first draft, exactly (the first
      draft reads only true features);
    * ``eval_agreement_d{d}``, d = 1 … depth: the same for draft d of the chains of
      :func:`chained_drafts` from every position (the window's tokens, the draft's own features);
    * ``eval_mean_accepted_length``: 1 + the drafts greedy BASS with draft length ``depth`` accepts,
      averaged over every start: the leading drafts that equal the target's argmax. A chain is
      followed past draft d only where the window's token is the target's argmax (true of the
      target's greedy continuations, the corpus's ``gen_*`` windows), so elsewhere it is a lower bound;
    * ``eval_agreement_<kind>`` when ``data`` holds ``prompt_kinds i8[N]`` (indices into
      ``corpus.PROMPT_KINDS``): ``eval_agreement`` over the windows of each kind present.
  """
  sums, kind_hits, kind_counts = None, {}, {}
  kinds = data.get("prompt_kinds")
  for start in range(0, len(data["tokens"]), batch_size):
    batch = {k: jnp.asarray(data[k][start:start + batch_size]) for k in fields(config)}
    part = _evaluate_batch(params, frozen, full_head, batch, config=config, dtype=dtype,
                           cls_weight=cls_weight, depth=depth)
    part = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), part)
    row_hits, row_counts = part.pop("row_agreement"), part.pop("row_count")
    if kinds is not None:
      for kind, hits, count in zip(kinds[start:start + batch_size], row_hits, row_counts):
        name = corpus.PROMPT_KINDS[int(kind)]
        kind_hits[name] = kind_hits.get(name, 0.0) + hits
        kind_counts[name] = kind_counts.get(name, 0.0) + count
    sums = part if sums is None else jax.tree_util.tree_map(np.add, sums, part)
  count = max(float(sums["count"]), 1.0)
  result = {f"eval_{k}": float(sums[k]) / count
            for k in ("loss", "regression", "cross_entropy", "agreement")}
  for d in range(depth):
    result[f"eval_agreement_d{d + 1}"] = float(sums["chain_hits"][d] / max(sums["chain_counts"][d], 1))
  result["eval_mean_accepted_length"] = 1.0 + float(sums["accepted"]) / max(float(sums["starts"]), 1.0)
  for name in sorted(kind_hits):
    result[f"eval_agreement_{name}"] = kind_hits[name] / max(kind_counts[name], 1.0)
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


def frozen_inputs(config: eagle.EagleConfig, target_config: Any, target_params: Any,
                  vocab_ids: np.ndarray, dtype: Any) -> tuple[dict[str, jax.Array], jax.Array]:
  """What a feature draft reads of its target, for :func:`feature_loss` and :func:`evaluate`.

  Args:
    config: the draft's config; its ``draft_vocab_size`` V' picks the head rows.
    target_config, target_params: the target (a Llama-family model).
    vocab_ids: ``i32[n]`` the frequency-sorted vocabulary, n >= V' (:func:`token_frequencies`, or a
      draft's stored order: ``eagle_files.load_vocab_order``).
    dtype: the compute dtype of the embedding and head rows.

  Returns:
    ``(frozen, full_head)``: ``frozen`` holds ``embedding [V, E]`` and ``head [V', E]`` in ``dtype``
    and ``vocab_ids i32[V']``; ``full_head [V, E]`` is the target's whole LM head in the target's own
    dtype (the reference argmax of the agreement metrics).

  Raises:
    ValueError: fewer than V' ``vocab_ids`` (pass the whole stored order), or a target outside the
      Llama family (``eagle.bind``).
  """
  if len(vocab_ids) < config.draft_vocab_size:
    raise ValueError(f"V' = {config.draft_vocab_size} needs as many vocab_ids, got {len(vocab_ids)}: "
                     "pass the draft's whole stored order (eagle_files.load_vocab_order)")
  frozen = eagle.bind(None, vocab_ids, target_config, target_params, config.draft_vocab_size)
  del frozen["draft"]
  if config.kind == "eagle3":  # its own head is trained; the target's rows give the target's law
    frozen["target_head"] = frozen.pop("head")
    frozen["norm_eps"] = jnp.asarray(config.layer.rms_norm_eps, jnp.float32)
  frozen = jax.tree_util.tree_map(
      lambda x: x if x.dtype == jnp.int32 or x.ndim == 0 else jnp.asarray(x, dtype), frozen)
  return frozen, eagle.lm_head_matrix(target_config, target_params)


def objective(config: eagle.EagleConfig, cfg: distill.TrainConfig, target_config: Any,
              target_params: Any, vocab_ids: np.ndarray, cls_weight: float = 0.1, *,
              ttt_depth: int = 1, ttt_stride: int = 8, eval_depth: int = 4,
              init: Any = None) -> distill.Objective:
  """The EAGLE objective for :func:`distill.train`: :func:`feature_loss` and :func:`evaluate`, with the
  target's frozen embedding and head rows of ``vocab_ids[:config.draft_vocab_size]``.

  Args:
    ttt_depth, ttt_stride: :func:`feature_loss`'s training-time test (1: none).
    eval_depth: the chain length :func:`evaluate` measures.
    init: ``key -> params`` for a fresh run (default: :func:`initial_params`; a fine-tune passes a
      trained draft's weights).

  Raises:
    ValueError: a target outside the Llama family.
  """
  frozen, full_head = frozen_inputs(config, target_config, target_params, vocab_ids, cfg.compute_dtype)
  return distill.Objective(
      loss=lambda params, frozen, batch: feature_loss(params, batch, config, frozen,
                                                      cfg.compute_dtype, cls_weight,
                                                      ttt_depth=ttt_depth, ttt_stride=ttt_stride),
      evaluate=lambda params, data: evaluate(params, data, config, frozen, full_head,
                                             cfg.compute_dtype, cls_weight, depth=eval_depth),
      fields=fields(config),
      init=init or (lambda key: initial_params(config, key, target_config, target_params, vocab_ids)),
      frozen=frozen)


def initial_params(config: eagle.EagleConfig, key: jax.Array, target_config: Any, target_params: Any,
                   vocab_ids: np.ndarray) -> dict[str, Any]:
  """A fresh draft's trainable parameters: :func:`eagle_init.init_draft_params`, and for an EAGLE-3 draft a
  warm start of its own head and final norm from the target's.

  EAGLE-3's head ``lm_head [V', E]`` and final norm are its own (trained), where this project's draft
  reads the target's frozen rows. Starting them at the target's head rows of
  ``vocab_ids[:V']`` and the target's final-norm scale makes the draft's logits, at step 0, the target's
  head applied to the draft's hidden state as to a last pre-norm hidden state of the target; only the
  layer and ``fc`` start random. SpecForge offers the same start for a draft with the target's whole
  vocabulary (``Eagle3DraftModel.load_lm_head``, ``specforge/modeling/draft/base.py`` at 078d71c); here
  it takes the draft vocabulary's rows.

  Args:
    key: PRNG key of the random parts. vocab_ids: ``i32[>= V']`` the frequency-sorted vocabulary.

  Returns:
    the parameter tree :func:`feature_loss` trains (``fc``, ``layers_*``; an EAGLE-3 draft's also
    ``lm_head [V', E]`` and ``norm {"scale" [E]}``), float32.

  Raises:
    ValueError: a target outside the Llama family (``eagle.lm_head_matrix``).
  """
  params = eagle_init.init_draft_params(config, key)
  if config.kind != "eagle3":
    return params
  ids = jnp.asarray(vocab_ids[:config.draft_vocab_size], jnp.int32)
  head = jnp.take(eagle.lm_head_matrix(target_config, target_params), ids, axis=0)
  # Copies: the trainer donates its parameters, and the target's own arrays must outlive it.
  return {**params, "lm_head": jnp.array(head, jnp.float32, copy=True),
          "norm": {"scale": jnp.array(target_params["norm"]["scale"], jnp.float32, copy=True)}}
