"""Distillation of a small draft model from the target (BASS §4.4, App. A.2; docs/bass.md).

The draft is trained to match the target's next-token distribution on the corpus of
:mod:`bass_jax.training.corpus`: the loss at every labelled position is the cross-entropy from the
target's top-k distribution (renormalized) to the draft's full softmax, i.e. the forward KL up to a
constant and the mass outside the top k. Optimizer: the paper's recipe (AdamW, betas (0.9, 0.95), linear
warm-up then cosine decay to 10 % of the peak, gradient clipping at 1.0), with its constants as flags.

Runs checkpoint every N steps with orbax and resume from the newest checkpoint: the data order and every
random number are functions of the step alone, so a run killed at any point (even ``kill -9``)
continues the same loss curve. ``tests/test_training.py`` kills one and checks it.

Evaluation is exact for greedy BASS: on a held-out continuation the target produced greedily, the draft's
teacher-forced argmax at every position is what it would propose there, so simulating the steps over
those predictions gives the mean accepted length of greedy BASS with a fixed draft length, without
running the target (:func:`simulated_greedy_acceptance`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any, Callable, Iterator

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bass_jax import dtypes
from bass_jax.models import model as model_lib
from bass_jax.models.llama import LlamaConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Hyper-parameters of a distillation run (defaults: BASS App. A.2 where it gives one).

  Attributes:
    steps: optimizer steps. batch_size: examples (windows) per step.
    peak_lr, warmup_steps, end_lr_fraction: linear warm-up to ``peak_lr``, cosine to
      ``end_lr_fraction * peak_lr`` at ``steps``.
    b1, b2, weight_decay, grad_clip: AdamW and global-norm clipping.
    compute_dtype: ``"float32"`` or ``"bfloat16"`` for the forward/backward (parameters and optimizer
      state stay f32).
    checkpoint_every, eval_every, log_every: in steps.
    seed: data order and initialization.
    eval_draft_len: fixed draft length of the simulated greedy BASS evaluation.

  Raises:
    ValueError: from ``__post_init__`` for non-positive sizes or an unknown dtype.
  """

  steps: int
  batch_size: int = 16
  peak_lr: float = 3.5e-4
  warmup_steps: int = 100
  end_lr_fraction: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  weight_decay: float = 0.1
  grad_clip: float = 1.0
  compute_dtype: str = "float32"
  checkpoint_every: int = 100
  eval_every: int = 200
  log_every: int = 10
  seed: int = 0
  eval_draft_len: int = 4

  def __post_init__(self):
    for name in ("steps", "batch_size", "checkpoint_every", "eval_every", "log_every",
                 "eval_draft_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
    dtypes.dtype_name(self.compute_dtype, dtypes.TRAINING_DTYPES, what="compute_dtype")


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def embedding_from_target(target_embedding: np.ndarray, width: int) -> np.ndarray:
  """Projects the target's ``[V, D]`` embedding onto its top ``width`` principal directions.

  A tied draft embedding initialized this way starts with the target's token geometry (similar
  tokens close, the head's logit structure approximately kept) instead of noise.

  Raises:
    ValueError: ``width`` larger than D.
  """
  embedding = np.asarray(target_embedding, np.float32)
  if width > embedding.shape[1]:
    raise ValueError(f"width {width} exceeds the target's embedding size {embedding.shape[1]}")
  _, _, vt = np.linalg.svd(embedding, full_matrices=False)
  return embedding @ vt[:width].T


def make_schedule(cfg: TrainConfig) -> optax.Schedule:
  """Linear warm-up from 0 to ``peak_lr``, then cosine decay to ``end_lr_fraction * peak_lr``."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.peak_lr, warmup_steps=min(cfg.warmup_steps, cfg.steps - 1),
      decay_steps=cfg.steps, end_value=cfg.peak_lr * cfg.end_lr_fraction)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Clip, then AdamW on :func:`make_schedule`; norm scales (a size-D vector per layer) are not decayed."""
  # Matrices (and the [V, D] embedding) are decayed; norm scales and biases (vectors) are not.
  decay_mask = lambda params: jax.tree_util.tree_map(lambda x: x.ndim >= 2, params)
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
                  mask=decay_mask))


def draft_logits(params: Any, tokens: jax.Array, config: LlamaConfig, dtype: str) -> jax.Array:
  """Full causal forward of the draft: ``i32[B, T] -> f32[B, T, V]`` (parameters cast to ``dtype``)."""
  cast = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
  logits, _ = config.make_module(dtype=jnp.dtype(dtype)).apply({"params": cast}, tokens)
  return logits


def distill_loss(params, batch, config: LlamaConfig, dtype: str):
  """Cross-entropy from the target's renormalized top-k distribution to the draft's softmax.

  Args:
    batch: ``tokens i32[B, T]``, ``mask bool[B, T]``, ``topk_ids i32[B, T, k]``,
      ``topk_logprobs f16/f32[B, T, k]``.

  Returns:
    ``(loss f32[], metrics)``: the masked mean loss and ``agreement``, the share of labelled positions
    where the draft's argmax is the target's.
  """
  logits = draft_logits(params, batch["tokens"], config, dtype).astype(jnp.float32)
  log_q = jax.nn.log_softmax(logits, axis=-1)
  log_q_topk = jnp.take_along_axis(log_q, batch["topk_ids"], axis=-1)
  p = jax.nn.softmax(batch["topk_logprobs"].astype(jnp.float32), axis=-1)
  per_position = -jnp.sum(p * log_q_topk, axis=-1)
  mask = batch["mask"].astype(jnp.float32)
  denom = jnp.maximum(mask.sum(), 1.0)
  agree = (jnp.argmax(logits, axis=-1) == batch["topk_ids"][..., 0]).astype(jnp.float32)
  return jnp.sum(per_position * mask) / denom, {"agreement": jnp.sum(agree * mask) / denom}


@dataclasses.dataclass(frozen=True)
class Objective:
  """What :func:`train` optimizes, and how it evaluates.

  Attributes:
    loss: ``(params, frozen, batch) -> (loss f32[], metrics)``; metrics include ``agreement`` (the share
      of labelled positions where the draft's argmax is the target's).
    evaluate: ``(params, eval_data) -> {name: float}`` held-out metrics.
    fields: the corpus arrays a batch holds.
    init: ``key -> params`` for a fresh run.
    frozen: arrays the loss reads but never trains (an EAGLE draft's share of the target), passed to
      the jitted step as an argument so that they are not compiled into it as constants; None if none.
  """

  loss: Callable[[Any, Any, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]
  evaluate: Callable[[Any, dict[str, np.ndarray]], dict[str, float]]
  fields: tuple[str, ...]
  init: Callable[[jax.Array], Any]
  frozen: Any = None


def distillation(config: LlamaConfig, cfg: TrainConfig,
                 init_params: Callable[[jax.Array], Any] | None = None) -> Objective:
  """The independent draft's objective: :func:`distill_loss` and :func:`evaluate` (the default)."""
  return Objective(
      loss=lambda params, frozen, batch: distill_loss(params, batch, config, cfg.compute_dtype),
      evaluate=lambda params, data: evaluate(params, config, data, dtype=cfg.compute_dtype,
                                             draft_len=cfg.eval_draft_len),
      fields=("tokens", "mask", "topk_ids", "topk_logprobs"),
      init=init_params or (lambda key: model_lib.init_params(config, key)))


def make_train_step(objective: Objective, optimizer: optax.GradientTransformation):
  """A jitted ``(state, frozen, batch) -> (state, metrics)`` that donates the state."""

  def step(state: TrainState, frozen, batch):
    (loss, metrics), grads = jax.value_and_grad(objective.loss, has_aux=True)(state.params, frozen,
                                                                             batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
    return TrainState(state.step + 1, params, opt_state), metrics

  return jax.jit(step, donate_argnums=0)


def batch_indices(num_examples: int, batch_size: int, step: int, seed: int) -> np.ndarray:
  """Example ids of a step: epoch-wise random permutations, a pure function of ``(step, seed)``.

  Raises:
    ValueError: fewer examples than one batch.
  """
  if num_examples < batch_size:
    raise ValueError(f"the corpus has {num_examples} examples, fewer than one batch ({batch_size})")
  per_epoch = num_examples // batch_size
  epoch, within = divmod(step, per_epoch)
  order = np.random.default_rng([seed, epoch]).permutation(num_examples)
  return np.sort(order[within * batch_size:(within + 1) * batch_size])


def simulate_greedy_steps(agree: np.ndarray, start: int, end: int, draft_len: int) -> list[int]:
  """Accepted drafts per step of greedy BASS along one sequence the target produced greedily.

  A step whose prefix ends at position c accepts draft i while the draft's argmax at ``c + i`` equals
  the target's (``agree[c + i]``), up to ``draft_len``, then emits the target's token and the next step
  starts at ``c + accepted + 1`` (docs/bass.md, step 3, greedy limit). Only steps whose drafts all lie before
  ``end`` are simulated.

  Args:
    agree: ``bool[T]`` draft argmax == target argmax at each position (teacher-forced).
    start: position of the first step (prompt length - 1). end: one past the last labelled position.
  """
  steps, c = [], start
  while c + draft_len < end:
    run = 0
    while run < draft_len and agree[c + run]:
      run += 1
    steps.append(run)
    c += run + 1
  return steps


def simulated_greedy_acceptance(draft_top1: np.ndarray, target_top1: np.ndarray, starts: np.ndarray,
                                ends: np.ndarray, draft_len: int) -> tuple[float, float]:
  """Mean accepted length and acceptance rate of greedy BASS with a fixed draft length, simulated.

  Args:
    draft_top1, target_top1: ``i32[N, T]`` argmax of each model at every position (teacher-forced) on
      sequences whose continuation the target produced greedily.
    starts: ``i32[N]`` first position whose prediction is the target's own (prompt length - 1).
    ends: ``i32[N]`` one past the last position with a label (sequence length - 1).
    draft_len: drafts per step.

  Returns:
    ``(mean_accepted_length, draft_acceptance_rate)``: tokens per step counting the bonus/correction,
    and accepted / drafted (NaN when no whole step fits).
  """
  agree = draft_top1 == target_top1
  steps = [n for row in range(len(agree))
           for n in simulate_greedy_steps(agree[row], int(starts[row]), int(ends[row]), draft_len)]
  if not steps:
    return float("nan"), float("nan")
  return (sum(steps) + len(steps)) / len(steps), sum(steps) / (draft_len * len(steps))


def evaluate(params, config: LlamaConfig, data: dict[str, np.ndarray], *, dtype: str, draft_len: int,
             batch_size: int = 16) -> dict[str, float]:
  """Held-out distillation loss, top-1 agreement, and simulated greedy BASS acceptance."""
  fn = jax.jit(lambda p, b: (distill_loss(p, b, config, dtype),
                             jnp.argmax(draft_logits(p, b["tokens"], config, dtype), axis=-1)))
  losses, agrees, weights, top1 = [], [], [], []
  for start in range(0, len(data["tokens"]), batch_size):
    batch = {k: jnp.asarray(v[start:start + batch_size]) for k, v in data.items()
             if k in ("tokens", "mask", "topk_ids", "topk_logprobs")}
    (loss, metrics), argmax = fn(params, batch)
    n = float(np.asarray(batch["mask"]).sum())
    losses.append(float(loss) * n)
    agrees.append(float(metrics["agreement"]) * n)
    weights.append(n)
    top1.append(np.asarray(argmax))
  result = {"eval_loss": sum(losses) / sum(weights), "eval_agreement": sum(agrees) / sum(weights)}
  if "prompt_lens" in data:
    mean_len, rate = simulated_greedy_acceptance(
        np.concatenate(top1), data["topk_ids"][..., 0], data["prompt_lens"] - 1,
        data["mask"].sum(axis=1), draft_len)
    result.update(eval_mean_accepted_length=mean_len, eval_acceptance_rate=rate)
  return result


class MetricsLog:
  """Append-only JSONL of metrics; on resume, re-run steps overwrite earlier lines of the same step."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    path.parent.mkdir(parents=True, exist_ok=True)

  def write(self, record: dict[str, Any]) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")

  def read(self) -> dict[int, dict[str, Any]]:
    """step -> the last record written for it."""
    records: dict[int, dict[str, Any]] = {}
    if self.path.exists():
      for line in self.path.read_text().splitlines():
        if line.strip():
          record = json.loads(line)
          records.setdefault(record["step"], {}).update(record)
    return records


def train(
    config: LlamaConfig,
    cfg: TrainConfig,
    train_data: dict[str, np.ndarray],
    workdir: str | pathlib.Path,
    *,
    eval_data: dict[str, np.ndarray] | None = None,
    init_params: Callable[[jax.Array], Any] | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
    objective: Objective | None = None,
) -> Any:
  """Trains (or resumes training) a draft; returns its final parameters (f32).

  Args:
    config: the draft's architecture (same vocabulary as the target), used by the default objective.
    cfg: :class:`TrainConfig`.
    train_data: the objective's ``fields`` (default ``tokens, mask, topk_ids, topk_logprobs``) as arrays
      with a leading example axis.
    workdir: holds ``checkpoints/`` (orbax) and ``metrics.jsonl``; an existing checkpoint is resumed.
    eval_data: held-out arrays (with ``prompt_lens`` for the simulated BASS acceptance); evaluated at
      step 0 of a fresh run, every ``eval_every`` steps and at the end.
    init_params: ``key -> params`` for a fresh run (default: the module's random init).
    progress: show a progress bar with loss, tokens/s and ETA.
    on_step: called after every step (tests use it to die mid-run).
    objective: what to optimize (:class:`Objective`); default: :func:`distillation` of ``config``
      with ``init_params``. An EAGLE feature draft passes ``bass_jax.training.feature_draft.objective``.

  Raises:
    ValueError: the corpus is smaller than one batch; the checkpoint's shapes differ from ``config``.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  import tqdm  # pylint: disable=g-import-not-at-top

  workdir = pathlib.Path(workdir).absolute()
  objective = objective or distillation(config, cfg, init_params)
  optimizer = make_optimizer(cfg)
  schedule = make_schedule(cfg)
  log = MetricsLog(workdir / "metrics.jsonl")
  manager = ocp.CheckpointManager(
      workdir / "checkpoints",
      options=ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=cfg.checkpoint_every))

  def fresh_state():
    key = jax.random.key(cfg.seed)
    params = objective.init(key)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))

  state = fresh_state()
  if manager.latest_step() is not None:
    state = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(state))
  start = int(state.step)
  if start:
    log.write({"step": start, "resumed_from": start})
  elif eval_data is not None:  # where the curve starts (for a fine-tune, the starting draft's values)
    log.write({"step": 0, **objective.evaluate(state.params, eval_data)})
  step_fn = make_train_step(objective, optimizer)
  window = train_data["tokens"].shape[1]
  fields = objective.fields
  bar = tqdm.tqdm(total=cfg.steps, initial=start, disable=not progress, unit="step", desc="distill")
  tokens_seen, clock = 0, time.perf_counter()
  for step in range(start, cfg.steps):
    idx = batch_indices(len(train_data["tokens"]), cfg.batch_size, step, cfg.seed)
    batch = {k: jnp.asarray(train_data[k][idx]) for k in fields}
    state, metrics = step_fn(state, objective.frozen, batch)
    tokens_seen += cfg.batch_size * window
    done = step + 1
    if done % cfg.log_every == 0 or done == cfg.steps:
      values = {k: float(v) for k, v in metrics.items()}  # waits for the step: time it after
      elapsed = time.perf_counter() - clock
      record = {"step": done, **values, "tokens_per_second": tokens_seen / elapsed,
                "lr": float(schedule(step))}
      log.write(record)
      bar.set_postfix(loss=f"{record['loss']:.3f}", agree=f"{record['agreement']:.3f}",
                      tok_s=f"{record['tokens_per_second']:.0f}")
      tokens_seen, clock = 0, time.perf_counter()
    if eval_data is not None and (done % cfg.eval_every == 0 or done == cfg.steps):
      eval_start = time.perf_counter()
      log.write({"step": done, **objective.evaluate(state.params, eval_data)})
      clock += time.perf_counter() - eval_start  # tokens/s counts training time only
    manager.save(done, args=ocp.args.StandardSave(state), force=done == cfg.steps)
    bar.update(1)
    if on_step is not None:
      on_step(done)
  manager.wait_until_finished()
  bar.close()
  return state.params


def iter_records(log_path: str | pathlib.Path) -> Iterator[dict[str, Any]]:
  """The metrics log in step order (one merged record per step)."""
  records = MetricsLog(pathlib.Path(log_path)).read()
  for step in sorted(records):
    yield records[step]


__all__ = ["Objective", "TrainConfig", "TrainState", "batch_indices", "distill_loss", "distillation",
           "evaluate", "iter_records", "make_optimizer", "make_schedule", "make_train_step", "simulate_greedy_steps",
           "simulated_greedy_acceptance", "train"]
