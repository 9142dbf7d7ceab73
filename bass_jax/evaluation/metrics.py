"""The paper's metrics (BASS §4; docs/bass.md, "Metrics") computed from what `generate` returns."""

from __future__ import annotations

import dataclasses

import numpy as np

from bass_jax.models import eagle


@dataclasses.dataclass(frozen=True)
class Latency:
  """Per-token latency per sequence of one batch, in ms/token (BASS §4.1).

  Attributes:
    first: the sequence that finished first (mean over sequences tied for first).
    last: the sequence that finished last (mean over those tied for last).
    all: mean over every sequence of the batch.
  """

  first: float
  last: float
  all: float


def per_token_latency(finish_seconds: np.ndarray, lengths: np.ndarray) -> Latency:
  """Per-token latency of each sequence: its completion time over its own token count.

  Args:
    finish_seconds: ``f64[B]`` seconds from the batch's start until each sequence was complete.
    lengths: ``i32[B]`` tokens each sequence emitted (>= 1).

  Returns:
    :class:`Latency` in milliseconds per token.

  Raises:
    ValueError: empty batch, mismatched shapes, a NaN time or a sequence without tokens.
  """
  finish = np.asarray(finish_seconds, np.float64)
  lengths = np.asarray(lengths)
  if finish.ndim != 1 or finish.shape != lengths.shape or finish.size == 0:
    raise ValueError(f"need matching non-empty [B] arrays, got {finish.shape} and {lengths.shape}")
  if np.isnan(finish).any() or (lengths < 1).any():
    raise ValueError("every sequence needs a finish time and at least one token")
  ms = 1000.0 * finish / lengths
  return Latency(first=float(ms[finish == finish.min()].mean()),
                 last=float(ms[finish == finish.max()].mean()), all=float(ms.mean()))


@dataclasses.dataclass(frozen=True)
class Acceptance:
  """Speculation statistics over every (sequence, step) in which the sequence was live.

  Attributes:
    draft_acceptance_rate: accepted draft tokens / drafted tokens.
    mean_accepted_length: tokens emitted per sequence per step *counting the bonus/correction token*
      (accepted + 1; the vLLM/SGLang/EAGLE convention), before EOS or length truncation.
    drafted: drafted tokens. accepted: accepted draft tokens. sequence_steps: live (sequence, step)
      pairs.
    position_offered: ``position_offered[k]`` is how many live (sequence, step) pairs had a draft at
      position ``k + 1`` *tested*: drafted at least ``k + 1`` tokens and accepted the first ``k``. In a
      token-tree step, position k is depth k (some node at depth k on the accepted path's way).
    position_accepted: ``position_accepted[k]``: of those, how many accepted the draft at position
      ``k + 1``.
  """

  draft_acceptance_rate: float
  mean_accepted_length: float
  drafted: int
  accepted: int
  sequence_steps: int
  position_offered: tuple[int, ...] = ()
  position_accepted: tuple[int, ...] = ()

  @classmethod
  def from_counts(cls, drafted: int, accepted: int, sequence_steps: int,
                  position_offered: tuple[int, ...] = (),
                  position_accepted: tuple[int, ...] = ()) -> "Acceptance":
    return cls(
        draft_acceptance_rate=accepted / drafted if drafted else float("nan"),
        mean_accepted_length=(accepted + sequence_steps) / sequence_steps if sequence_steps
        else float("nan"),
        drafted=drafted, accepted=accepted, sequence_steps=sequence_steps,
        position_offered=tuple(position_offered), position_accepted=tuple(position_accepted))

  @property
  def position_acceptance(self) -> tuple[float, ...]:
    """Per-position (conditional) acceptance rate: ``alpha_k`` = P(draft k accepted | drafts 1..k-1
    accepted and draft k proposed), k = 1, 2, ... (NaN where no draft reached position k). Their
    running product is what a draft length must weigh (SpecInfer, SmartSpec's goodput)."""
    return tuple(a / o if o else float("nan")
                 for a, o in zip(self.position_accepted, self.position_offered))

  @classmethod
  def pooled(cls, parts: "list[Acceptance]") -> "Acceptance":
    """Pools several batches by summing their counts (not by averaging their rates)."""
    width = max((len(p.position_offered) for p in parts), default=0)

    def total(counts):  # per-position counts of every part, zero-padded to the longest, summed
      padded = [np.pad(np.asarray(c, np.int64), (0, width - len(c))) for c in counts]
      return tuple(int(c) for c in np.sum(padded, axis=0, dtype=np.int64)) if padded else ()

    return cls.from_counts(sum(p.drafted for p in parts), sum(p.accepted for p in parts),
                           sum(p.sequence_steps for p in parts),
                           total(p.position_offered for p in parts),
                           total(p.position_accepted for p in parts))


def acceptance(draft_lens: np.ndarray, accepted: np.ndarray,
               drafted: np.ndarray | None = None) -> Acceptance:
  """Aggregates ``GenerateStats.draft_lens: i32[steps]`` and ``accepted: i32[steps, B]`` (-1 = not live),
  with ``drafted: i32[steps, B]`` (``GenerateStats.drafted``) where rows proposed different numbers of
  drafts (a model-free proposer); without it every live row is taken to have drafted ``l_draft``.

  Raises:
    ValueError: shapes that do not match.
  """
  draft_lens = np.asarray(draft_lens)
  accepted = np.asarray(accepted)
  if accepted.ndim != 2 or accepted.shape[0] != draft_lens.shape[0]:
    raise ValueError(f"need draft_lens [steps] and accepted [steps, B], got {draft_lens.shape} and "
                     f"{accepted.shape}")
  live = accepted >= 0
  if drafted is None:  # every live row drafted the step's l_draft
    drafted = draft_lens[:, None] * live
  elif np.shape(drafted) != accepted.shape:
    raise ValueError(f"need drafted [steps, B] like accepted, got {np.shape(drafted)}")
  drafted = np.where(live, np.asarray(drafted), 0)
  # A path's depth: a tree step drafts more nodes than its depth (draft_lens), a chain at most l_draft.
  reach = np.minimum(drafted, draft_lens[:, None])
  positions = np.arange(1, int(reach.max(initial=0)) + 1)[:, None, None]  # [L, 1, 1]
  # Position k is tested where a path of k drafts was proposed and its first k - 1 were accepted (-1:
  # not live).
  offered = ((reach[None] >= positions) & (accepted[None] >= positions - 1)).sum(axis=(1, 2))
  taken = (accepted[None] >= positions).sum(axis=(1, 2))
  return Acceptance.from_counts(int(drafted.sum()), int(accepted[live].sum()), int(live.sum()),
                                tuple(int(c) for c in offered), tuple(int(c) for c in taken))


@dataclasses.dataclass(frozen=True)
class Raggedness:
  """How ragged one batch really was: what BASS's per-row acceptance and lengths are about.

  Attributes:
    length_spread: max - min over rows of the final sequence length (prompt + emitted), in tokens: the
      spread of the ragged KV caches at the end.
    emitted_spread: max - min over rows of the emitted token count.
    accepted_spread: mean over steps with two or more live rows of (max - min) accepted drafts across
      those rows (BASS only; 0 for regular decoding, where every row emits one token per step).
    accepted_total_spread: max - min over rows of the total accepted drafts (BASS only).
  """

  length_spread: int
  emitted_spread: int
  accepted_spread: float
  accepted_total_spread: int


def raggedness(prompt_lengths: np.ndarray, emitted: np.ndarray,
               accepted: np.ndarray | None = None) -> Raggedness:
  """:class:`Raggedness` of one batch.

  Args:
    prompt_lengths: ``i32[B]`` true prompt lengths. emitted: ``i32[B]`` tokens emitted per row.
    accepted: ``i32[steps, B]`` accepted drafts per row per step, -1 where the row was not live
      (``GenerateStats.accepted``); None or empty for regular decoding.

  Raises:
    ValueError: shapes that do not match.
  """
  prompt_lengths, emitted = np.asarray(prompt_lengths), np.asarray(emitted)
  if prompt_lengths.shape != emitted.shape or prompt_lengths.ndim != 1 or not prompt_lengths.size:
    raise ValueError(f"need matching non-empty [B] arrays, got {prompt_lengths.shape} and {emitted.shape}")
  total = prompt_lengths + emitted
  spread, total_spread = 0.0, 0
  if accepted is not None and np.asarray(accepted).size:
    accepted = np.asarray(accepted)
    if accepted.ndim != 2 or accepted.shape[1] != emitted.shape[0]:
      raise ValueError(f"accepted must be [steps, {emitted.shape[0]}], got {accepted.shape}")
    live = accepted >= 0
    multi = live.sum(axis=1) >= 2
    if multi.any():
      hi = np.where(live, accepted, np.iinfo(np.int32).min).max(axis=1)
      lo = np.where(live, accepted, np.iinfo(np.int32).max).min(axis=1)
      spread = float(np.mean((hi - lo)[multi]))
    per_row = np.where(live, accepted, 0).sum(axis=0)
    total_spread = int(per_row.max() - per_row.min())
  return Raggedness(length_spread=int(total.max() - total.min()),
                    emitted_spread=int(emitted.max() - emitted.min()), accepted_spread=spread,
                    accepted_total_spread=total_spread)


@dataclasses.dataclass(frozen=True)
class Divergence:
  """Where a row's tokens first differ from the reference decode.

  Attributes:
    row: batch row. index: position of the first differing token.
    top2_gap: the target's logit gap between its two best tokens at that position, computed by one full
      forward over the reference's prefix; a gap near float rounding means a legitimate near-tie.
  """

  row: int
  index: int
  top2_gap: float


@dataclasses.dataclass(frozen=True)
class GreedyAgreement:
  """Token agreement of a greedy decode with the reference greedy decode.

  Attributes:
    exact_match_rate: reference tokens reproduced before each row's first divergence, over all
      reference tokens.
    divergences: one per row that diverged.
  """

  exact_match_rate: float
  divergences: list[Divergence]


def greedy_agreement(target, prompts, reference: list[list[int]],
                     candidate: list[list[int]]) -> GreedyAgreement:
  """Compares two greedy decodes of ``prompts`` token by token (BASS lossless check).

  Greedy speculative decoding must reproduce the target's greedy tokens; since verification runs the
  target on ``l_draft + 1`` tokens and plain decoding on 1, float rounding differs in the last bits and
  can flip a near-tie. Each divergence is reported with the target's top-2 logit gap at that point.

  Args:
    target: a ``bass_jax.Model`` (for the gap computation).
    prompts: the B prompts (token lists).
    reference, candidate: B emitted-token lists each.
  """
  matched = total = 0
  divergences = []
  for row, (prompt, want, got) in enumerate(zip(prompts, reference, candidate)):
    total += len(want)
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
    if first is None and len(want) != len(got):
      first = min(len(want), len(got))
    if first is None:
      matched += len(want)
      continue
    matched += first
    logits = np.asarray(target.logits(np.array([list(prompt) + list(want[:first])])))[0, -1]
    best = np.sort(logits)[-2:]
    divergences.append(Divergence(row, first, float(best[1] - best[0])))
  return GreedyAgreement(matched / total if total else float("nan"), divergences)


# -- accuracy within a time budget (BASS §4.3, Fig. 5) ----------------------------------------------


def finished_within(finish_seconds: np.ndarray, budget_seconds: float) -> np.ndarray:
  """``bool[B]``: the sequence was complete (EOS or its token limit) within the wall-clock budget."""
  return np.asarray(finish_seconds) <= budget_seconds


def pass_at_batch(passed: np.ndarray) -> bool:
  """Pass@Batch: some sequence of the batch passes (no budget)."""
  return bool(np.any(passed))


def pass_at_first(passed: np.ndarray, mean_logprob: np.ndarray, finished: np.ndarray) -> bool:
  """Pass@First: among the finished sequences, the one with the highest mean log-probability passes.

  Args:
    passed: ``bool[B]`` unit tests pass. mean_logprob: ``f32[B]`` mean per-token log-probability under
      the target. finished: ``bool[B]`` complete within the budget.

  Returns:
    False when nothing finished. Ties in mean log-probability go to the lowest index.
  """
  finished = np.asarray(finished, bool)
  if not finished.any():
    return False
  scores = np.where(finished, np.asarray(mean_logprob, np.float64), -np.inf)
  return bool(np.asarray(passed)[int(np.argmax(scores))])


def pass_at_finished(passed: np.ndarray, finished: np.ndarray) -> bool:
  """Pass@Finished (the abstract's Pass@All): some sequence finished within the budget passes."""
  return bool(np.any(np.asarray(passed, bool) & np.asarray(finished, bool)))


# -- FLOPs and utilization (BASS §4.2, Fig. 1) ------------------------------------------------------

# Parameter subtrees that are looked up, not multiplied (token tables are counted when they double as
# the tied LM head).
_LOOKUP_TABLES = {"embed_positions", "wpe"}
_TOKEN_TABLES = {"embed_tokens", "wte"}


def matmul_params(config, params) -> int:
  """Weights that take part in a matrix product per token: every >= 2-D parameter except lookup tables
  (positions, and the token embedding unless it is also the tied LM head)."""
  import flax.traverse_util  # pylint: disable=g-import-not-at-top

  tied = getattr(config, "tie_word_embeddings", False)
  total = 0
  for path, value in flax.traverse_util.flatten_dict(dict(params)).items():
    if len(getattr(value, "shape", ())) < 2 or path[0] in _LOOKUP_TABLES:
      continue
    if path[0] in _TOKEN_TABLES and not tied:
      continue
    total += int(np.prod(value.shape))
  return total


def forward_flops(config, params, contexts: np.ndarray) -> float:
  """FLOPs of a forward over tokens that attend to ``contexts`` cache slots each.

  ``2 * matmul_params`` per token (multiply-add) plus attention: ``2 * N * H * context`` for the scores
  and as many for the weighted sum, per layer. An EAGLE draft's head is the target's rows of its draft
  vocabulary, ``V' x E`` more per token.
  """
  contexts = np.asarray(contexts, np.float64)
  per_token = 2.0 * matmul_params(config, params)
  if isinstance(config, eagle.EagleConfig):
    per_token += 2.0 * config.draft_vocab_size * config.feature_size
    config = config.layer
  heads = getattr(config, "num_attention_heads", None) or config.n_head
  head_dim = config.head_dim
  return contexts.size * per_token + 4.0 * config.num_layers * heads * head_dim * contexts.sum()


@dataclasses.dataclass(frozen=True)
class Flops:
  """Analytic FLOPs of one decode: ``useful`` (the target's forward over every emitted token and the
  prompt, BASS §4.2) and ``executed`` (every position computed: prompt padding, both models' draft and
  verification positions including rejected and padded ones, rows that already finished)."""

  useful: float
  executed: float


def decode_flops(target, draft, prompt_lengths: np.ndarray, output, *, method: str) -> Flops:
  """Counts :class:`Flops` for a ``generate`` result.

  Useful FLOPs count each position's attention at its true context; executed FLOPs count every
  computed position (prompt padding, the padding rows of the batch bucket, draft steps, every verified
  position of every verification chunk, the chunked prefill of every prompt a continuous batch admits)
  with its attention at the batch's mean context (prompt plus
  half the output), an approximation of the small attention term that keeps the count analytic.

  Args:
    target: the target ``Model``. draft: the draft side as given to ``generate`` (a ``Model``, a
      ``Hybrid``, whose model is counted, or a model-free proposer, counted as 0; None for regular).
    prompt_lengths: ``i32[B]`` true prompt lengths.
    output: the ``GenerateOutput`` (its stats carry the prefill and verification shapes).
    method: ``"bass"`` or ``"regular"``.

  Returns:
    :class:`Flops` of the whole batch's decode, in floating-point operations (multiply-add = 2). A
    draft's admission prefills count at the target's admitted positions: exact for a draft model,
    which chunks them as the target does; an approximation for an EAGLE draft, which takes each
    admission's P pairs in one pass.
  """
  prompt_lengths = np.asarray(prompt_lengths)
  stats = output.stats
  batch = stats.batch_bucket or len(prompt_lengths)  # inert padding rows are computed too
  tc, tp = target.config, target.params
  useful = sum(forward_flops(tc, tp, np.arange(1, p + n)) for p, n in zip(prompt_lengths, output.lengths))
  mean_context = float(np.mean(prompt_lengths + output.lengths / 2))
  per_pos = lambda config, params, n: forward_flops(config, params, np.full(int(n), mean_context))
  executed = per_pos(tc, tp, batch * stats.prompt_bucket)  # prefill, padding included
  # Continuous batching: the prompts admitted inside the loop are prefilled in chunks up to the
  # longest of each admission's rows, spare rows included (GenerateStats.admitted_positions), by the
  # target and a draft model.
  admitted = stats.admitted_positions
  executed += per_pos(tc, tp, admitted)
  if method == "regular":
    executed += per_pos(tc, tp, batch * stats.steps)
  else:
    model = getattr(draft, "model", draft)  # a Hybrid's draft model; None-like for n-gram
    drafting = hasattr(model, "config") and hasattr(model, "params")
    if drafting:
      executed += per_pos(model.config, model.params, batch * stats.prompt_bucket + admitted)
    for l, verified in zip(stats.draft_lens, stats.verified):
      if drafting and l > 0:
        executed += per_pos(model.config, model.params, batch * (l + 1))
      executed += per_pos(tc, tp, batch * verified)
  return Flops(useful=float(useful), executed=float(executed))
