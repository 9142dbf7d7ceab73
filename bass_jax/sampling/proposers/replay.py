"""Cost at scale with a realistic acceptance: :class:`Replay`, a draft model whose tokens are replaced
by a recorded continuation, wrong at set per-position rates.

A benchmark of random weights at a published shape (Llama-3.1-8B, say) measures what a step costs but
not what it gains: a random draft is never right, so BASS accepts nothing. ``Replay`` keeps the draft
model's whole cost (its forwards run every step, exactly as they would) and replaces only the tokens it
proposes: draft ``i`` of a row is the token the target itself emitted at that text position in a
recorded decode (regular greedy decoding of the same prompts), replaced by another token with
probability ``1 - acceptance[i]``. Under greedy verification a chain then accepts draft ``i`` with
probability ``acceptance[i]`` given that it reached it, which is what a real pair's per-position
acceptance measures (``GenerateStats`` ``position_acceptance``, ``evaluation.metrics``), so the
accepted length follows the real pair's while every cost is the shape's own.

Exactness does not depend on the recording: the drafts are deterministic (one-hot ``q``) and verified
like any others, so a wrong recording only costs acceptance (greedy equality is tested like every
proposer's). Where the text has left the recording (a row past its recorded length, or a row whose
last token differs from the recording's at that position: a decode that diverged, or sampling) the
row proposes the draft model's own tokens.

Whether a draft is replaced is a fixed hash of (``seed``, row, text position) against the rate of the
draft's index in its step, so a rerun or another batch size replaces the same positions (another draft
length too where the rates are uniform), and it costs a few integer operations per draft.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from bass_jax.sampling.proposers.base import Proposal, WrapsModel

# The real SmolLM2-135M pair's per-position acceptance on one H200 (greedy, HumanEval 0-15, 128 new
# tokens, ``hybrid:smollm2-135m-eagle`` under the cost-aware draft length; the mean of B = 1, 4 and 16
# at each position, rounded to 0.005; results/gpu_h200_2026-11-28/, ``position_acceptance``): the
# probability that draft i is accepted given that drafts 1 ... i - 1 were. Later positions repeat
# the last rate. Replay's default, so that a random-weight benchmark accepts like the real pair. The
# later positions were reached mostly by n-gram drafts (the policy drafts long where lookup matches),
# so they flatter a model draft: at a fixed draft length the replay accepts a little more than the
# real pair did under its policy (2.4-2.6 tokens per step).
SMOLLM2_POSITION_ACCEPTANCE = (0.755, 0.745, 0.84, 0.935)


def _mix(x: jnp.ndarray) -> jnp.ndarray:
  """A 32-bit integer hash (Wellons' lowbias32): ``u32[...] -> u32[...]``, well mixed."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def replay_text(prompts: Any, tokens: Any, lengths: Any) -> np.ndarray:
  """The recording a :class:`Replay` reads: each row's prompt followed by its recorded output.

  Args:
    prompts: B token-id lists (the prompts, unpadded). tokens: ``i32[B, N]`` the recorded decode's
      output (``GenerateOutput.tokens``). lengths: ``i32[B]`` tokens emitted per row
      (``GenerateOutput.lengths``).

  Returns:
    ``i32[B, max(len(prompt) + length)]``: row b's text, ``-1`` past its end.

  Raises:
    ValueError: rows that do not agree in number, or a length outside ``[0, N]``.
  """
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  if tokens.ndim != 2 or lengths.shape != (tokens.shape[0],) or len(prompts) != tokens.shape[0]:
    raise ValueError(f"replay_text needs B prompts, tokens [B, N] and lengths [B]; got "
                     f"{len(prompts)} prompts, tokens {tokens.shape}, lengths {lengths.shape}")
  if (lengths < 0).any() or (lengths > tokens.shape[1]).any():
    raise ValueError(f"replay_text: lengths must lie in [0, {tokens.shape[1]}], got {lengths.tolist()}")
  rows = [list(map(int, p)) + tokens[b, :lengths[b]].tolist() for b, p in enumerate(prompts)]
  text = np.full((len(rows), max(len(r) for r in rows)), -1, np.int32)
  for b, row in enumerate(rows):
    text[b, :len(row)] = row
  return text


@dataclasses.dataclass(frozen=True)
class Replay(WrapsModel):
  """A draft model whose proposed tokens are a recorded continuation, each replaced by a wrong token
  at a set per-position rate (the module docstring says why).

  What a user passes to ``generate`` holds the draft *model* (a ``bass_jax.Model``: an independent
  draft or an EAGLE draft of the target) and the recording; ``drafts.resolve_draft`` replaces the
  model by its proposer and moves the recording, the rates and the seed into the proposer's weights
  (``{"model", "text", "acceptance", "seed"}``: data, not part of the compiled program's key, so
  another recording, rate or seed reuses the program). Static batches only: row b of the batch reads
  row b of ``text`` (``prepare`` refuses a queue longer than the batch).

  Attributes:
    model: the draft model (a ``Model``; once resolved, its ``ModelProposer`` or ``EagleProposer``),
      whose forwards run every step.
    text: ``i32[B', R]`` row b's recorded text, prompt then output, ``-1`` past its end
      (:func:`replay_text`); None once resolved. Rows past ``B'`` propose the model's own drafts.
    acceptance: ``acceptance[i]`` in ``[0, 1]``, the probability that draft ``i + 1`` of a step is
      the recorded token; positions past the tuple take its last rate. Default: the real SmolLM2
      pair's (:data:`SMOLLM2_POSITION_ACCEPTANCE`).
    seed: the replacement hash's seed.

  Raises:
    ValueError: from ``__post_init__``: an empty ``acceptance`` or a rate outside ``[0, 1]``, a
      ``text`` that is not a 2-D integer array of ids ``>= -1``, a negative or non-int ``seed``.
  """

  model: Any
  text: Any = dataclasses.field(default=None, compare=False, hash=False)
  # Not part of the compiled program's key: they travel in the weights (``resolve_draft``).
  acceptance: tuple[float, ...] = dataclasses.field(default=SMOLLM2_POSITION_ACCEPTANCE,
                                                    compare=False, hash=False)
  seed: int = dataclasses.field(default=0, compare=False, hash=False)
  source = "model"

  def __post_init__(self):
    rates = tuple(self.acceptance) if isinstance(self.acceptance, (tuple, list)) else None
    if not rates or any(isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1
                        for r in rates):
      raise ValueError(f"Replay.acceptance must be a non-empty sequence of rates in [0, 1], got "
                       f"{self.acceptance!r}")
    object.__setattr__(self, "acceptance", tuple(float(r) for r in rates))
    if (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
        or not 0 <= self.seed < 2**32):
      raise ValueError(f"Replay.seed must be an int in [0, 2**32), got {self.seed!r}")
    if self.text is not None:
      text = np.asarray(self.text)
      if text.ndim != 2 or text.shape[1] == 0 or not np.issubdtype(text.dtype, np.integer) or (
          text < -1).any():
        raise ValueError(f"Replay.text must be i32[rows, positions] of token ids, -1 past a row's "
                         f"end (bass_jax.sampling.proposers.replay_text builds it); got "
                         f"{text.dtype}{text.shape}")

  @property
  def name(self) -> str:
    """``replay(<model>, acceptance=0.755/0.745/...)``, as in results files."""
    model = getattr(self.model, "name", type(self.model).__name__)
    return f"replay({model}, acceptance={'/'.join(f'{r:g}' for r in self.acceptance)})"

  def model_params(self, params):
    return params["model"]

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    """The model's proposal (its forwards run), its tokens replaced by the recording's.

    Draft ``i`` (0-based) of row b sits at text position ``p = seq_len[b] + i``: it is ``text[b, p]``
    where the hash of (seed, b, p) falls below ``acceptance[i]``, else ``(text[b, p] + 1 + h) % V``
    for another hash h (never the recorded token), and the model's own draft where the recording has
    no token at p or the row's last token is not the recording's (the text left it). ``log_q``
    becomes one-hot at the drafts when sampling: each draft is chosen independently of the target's
    draws, which keeps rejection sampling exact (Leviathan et al. 2023, §3.5, for any ``q``).
    """
    state, by_model = self.model.propose(params["model"], state, ctx, max_len=max_len, chunk=chunk,
                                         greedy=greedy)
    text = params["text"]
    batch = ctx.seq_len.shape[0]
    if text.shape[0] < batch:  # rows without a recording (a padded batch) keep the model's drafts
      text = jnp.pad(text, ((0, batch - text.shape[0]), (0, 0)), constant_values=-1)
    text = text[:batch]
    given = params["acceptance"]  # f32[n]: the resolved proposer's rates travel as data
    rates = given[jnp.minimum(jnp.arange(max_len), given.shape[0] - 1)]
    positions = ctx.seq_len[:, None] + jnp.arange(max_len)  # [B, L]
    recorded = jnp.take_along_axis(text, jnp.clip(positions, 0, text.shape[1] - 1), axis=1)
    last = ctx.seq_len - 1  # the row's last token: still on the recording?
    on_track = jnp.take_along_axis(text, jnp.clip(last, 0, text.shape[1] - 1)[:, None], axis=1)[:, 0]
    on_track = (last < text.shape[1]) & (on_track == ctx.tokens[jnp.arange(batch), last])
    recorded = jnp.where((positions < text.shape[1]) & on_track[:, None], recorded, -1)
    rows = jnp.arange(batch, dtype=jnp.uint32)[:, None]
    h = _mix(_mix(positions.astype(jnp.uint32) ^ _mix(rows + jnp.uint32(0x9E3779B9)))
             ^ params["seed"])
    # The top 24 bits as a uniform in [0, 1): keep the recorded token below the position's rate.
    keep = (h >> 8).astype(jnp.float32) * (1.0 / (1 << 24)) < rates[None, :]
    vocab = self.model.config.vocab_size  # checked >= 2 by drafts.resolve_draft
    other = (recorded + 1 + (_mix(h) % jnp.uint32(vocab - 1)).astype(jnp.int32)) % vocab
    drafts = jnp.where(recorded < 0, by_model.drafts, jnp.where(keep, recorded, other))
    drafts = drafts.astype(jnp.int32)
    log_q = by_model.log_q
    if log_q is not None:  # one-hot q at the replayed drafts
      padded = jnp.pad(drafts, ((0, 0), (0, log_q.shape[1] - max_len)))
      log_q = jnp.where(jnp.arange(log_q.shape[2]) == padded[..., None], 0.0, -jnp.inf)
    return state, Proposal(drafts=drafts, num_drafts=by_model.num_drafts, log_q=log_q,
                           source=by_model.source)
