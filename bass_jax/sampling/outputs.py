"""What :func:`bass_jax.generate` returns: the tokens and log-probabilities (:class:`GenerateOutput`), what
the decode did and how long it took (:class:`GenerateStats`), and one prompt's share of both, as the
``on_finish`` stream hands it over (:class:`FinishedPrompt`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class GenerateStats:
  """What a decode did and how long it took.

  Attributes:
    steps: decode steps (BASS: draft + verify rounds and plain steps; regular: tokens).
    draft_lens: ``i32[steps]`` l_draft of each step, 0 for a plain step (empty for regular decoding).
    drafted: ``i32[steps, B]`` drafts proposed per row per step (a model-free proposer may propose
      fewer than l_draft, or none; empty for regular decoding).
    verified: ``i32[steps]`` positions the target scored per row in each step, the padding of its last
      verification chunk included (empty for regular decoding).
    trees: ``i32[steps]`` the token-tree shape each step verified, an index into ``draft_trees``; -1
      for chain and plain steps (empty for regular decoding). Tree steps record the tree's depth in
      ``draft_lens`` and its real nodes less the root in ``drafted``.
    draft_trees: the tree shapes the decode could verify (``generate``'s ``draft_tree``, as text).
    sources: ``i32[steps, B]`` where each row's drafts came from (an index into
      ``proposers.DRAFT_SOURCES``: ``model``, ``ngram``, ``siblings``; for a hybrid's tree, its lookup
      where one matched), -1 where the row drafted nothing (empty for regular decoding).
    accepted: ``i32[steps, B]`` accepted drafts per row per step, bonus/correction not counted; -1 where
      the row was already done (empty for regular decoding).
    finish_seconds: ``f64[B]`` per prompt, wall seconds from the start of the call (the prefill; every
      prompt arrives then) until the decode returned with the prompt done (the loop returns to the
      host whenever a row finishes). NaN with ``time_prompts=False``.
    admit_seconds: ``f64[B]`` per prompt, the wait before admission: seconds from the call's start
      until the decode call that prefilled its row began (0 for the prompts of the first rows, which
      the call's prefill admits; NaN for the others with ``time_prompts=False``).
    first_token_seconds: ``f64[B]`` per prompt, time to first token: seconds from the call's start
      until the decode returned with the prompt's first token emitted (its wait included; NaN with
      ``time_prompts=False``).
    wall_seconds: prefill plus decode, compilation excluded (at least the largest ``finish_seconds``:
      a continuous decode returns once more after its last finish, to retire that prompt).
    compile_seconds: time spent compiling in this call (0 when the programs were cached).
    calibration_seconds: time spent measuring the step costs in the decode's own programs before it
      ran (``sampling.calibration``; 0 when they were known), in neither the wall nor the compile.
    compiled: whether this call built its programs (False: it reused programs of an earlier call
      held in memory).
    program_source: where the programs came from (``programs.Built.source``): ``"memory"``,
      ``"disk"`` (JAX's persistent compilation cache), ``"compiled"`` or ``"partly disk"``.
    prepare_seconds: time ``prepare`` took (checks, placing the inputs and, for the cost-aware draft
      length on a CPU, measuring the step costs unless known: ``costs.measure_step_costs``).
    prompt_bucket: P, the length prompts were padded to for the prefill.
    batch_bucket: the number of rows the programs ran (B plus inert padding rows).
    verify_chunk: positions per verification forward (0 for regular decoding).
    attention_impl: the attention implementation both models ran.
    profile: the backend profile whose defaults the call took (``bass_jax.profiles``).
    proposer: the draft side's name (empty for regular decoding).
    step_costs: the ``StepCosts`` a cost-aware draft length used (None otherwise).
    mesh: ``{"data": d, "model": m}`` of the mesh the decode ran on (empty on one device).
    batch_size: rows decoding at once (the number of prompts for a static batch).
    continuous: whether finished rows took waiting prompts (``generate(..., batch_size=)``). The
      per-step histories (``drafted``, ``accepted``) are then per *row*, and a row serves several
      prompts in turn: prompt i ran in row ``prompt_rows[i]`` from step ``prompt_start_steps[i]`` until
      that row's next prompt started.
    prompt_rows: ``i32[B]`` the row each prompt ran in. prompt_start_steps: ``i32[B]`` the step count
      when it was admitted.
    admit_rows, admit_chunk: the most prompts one in-loop admission prefilled together, and its
      positions per forward (``DecodeSpec``; the profile's). admitted_positions: token positions
      those prefills computed, per model (rows times chunks times chunk, spare rows included; 0 for
      a static batch).
    prompt_steps: ``i32[B]`` steps in which each prompt was live (regular decoding: its tokens).
    prompt_drafted: ``i32[B]`` drafts proposed to each prompt (0 for regular decoding).
    prompt_accepted: ``i32[B]`` drafts each prompt accepted (0 for regular decoding).
  """

  steps: int
  draft_lens: np.ndarray
  accepted: np.ndarray
  finish_seconds: np.ndarray
  wall_seconds: float
  compile_seconds: float
  compiled: bool = False
  prompt_bucket: int = 0
  batch_bucket: int = 0
  verify_chunk: int = 0
  attention_impl: str = ""
  profile: str = ""
  admit_rows: int = 0
  admit_chunk: int = 0
  admitted_positions: int = 0
  verified: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  drafted: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int32))
  trees: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  draft_trees: tuple[str, ...] = ()
  sources: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.int32))
  proposer: str = ""
  step_costs: Any = None
  mesh: dict = dataclasses.field(default_factory=dict)
  admit_seconds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,)))
  first_token_seconds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,)))
  batch_size: int = 0
  continuous: bool = False
  prompt_rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  prompt_start_steps: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  prompt_steps: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  prompt_drafted: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  prompt_accepted: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  calibration_seconds: float = 0.0
  program_source: str = ""
  prepare_seconds: float = 0.0

  @property
  def startup_seconds(self) -> float:
    """Seconds before the decode started: ``prepare_seconds + compile_seconds +
    calibration_seconds``."""
    return self.prepare_seconds + self.compile_seconds + self.calibration_seconds


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """Result of :func:`generate`.

  Attributes:
    tokens: ``i32[B, max_new_tokens]`` emitted tokens, ``PAD_TOKEN`` (-1) past ``lengths[b]``.
    lengths: ``i32[B]`` tokens emitted per row (an EOS token, when emitted, is the last one counted).
    logprobs: ``f32[B, max_new_tokens]`` log-probability of each emitted token under the target's own
      distribution (temperature 1, no top-p); 0 past ``lengths[b]``.
    finished: ``bool[B]`` the row ended with an EOS token (else it hit ``max_new_tokens``).
    stats: :class:`GenerateStats`.
  """

  tokens: np.ndarray
  lengths: np.ndarray
  logprobs: np.ndarray
  finished: np.ndarray
  stats: GenerateStats

  def sequences(self) -> list[list[int]]:
    """Each row's emitted tokens, without padding."""
    return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]

  def prompt(self, index: int) -> "FinishedPrompt":
    """Prompt ``index``'s output and per-prompt statistics as one :class:`FinishedPrompt`."""
    s, n = self.stats, int(self.lengths[index])
    return FinishedPrompt(
        index=index, tokens=self.tokens[index, :n].copy(), logprobs=self.logprobs[index, :n].copy(),
        finished=bool(self.finished[index]), row=int(s.prompt_rows[index]),
        admit_seconds=float(s.admit_seconds[index]),
        first_token_seconds=float(s.first_token_seconds[index]),
        finish_seconds=float(s.finish_seconds[index]), steps=int(s.prompt_steps[index]),
        drafted=int(s.prompt_drafted[index]), accepted=int(s.prompt_accepted[index]))


@dataclasses.dataclass(frozen=True)
class FinishedPrompt:
  """One prompt's output, handed to ``generate(..., on_finish=)`` as soon as the prompt is complete.

  Attributes:
    index: the prompt's position in ``prompts``.
    tokens: ``i32[n]`` its emitted tokens (an EOS, when emitted, is the last). logprobs: ``f32[n]``
      the target's log-probability of each (temperature 1, no top-p).
    finished: it ended with an EOS token (else it reached ``max_new_tokens``).
    row: the batch row it ran in.
    admit_seconds, first_token_seconds, finish_seconds: wall seconds from the call's start (NaN with
      ``time_prompts=False``), as in :class:`GenerateStats`.
    steps, drafted, accepted: decode steps it was live in, drafts proposed to it, drafts it accepted
      (0 drafts for regular decoding, whose ``steps`` are its tokens).
  """

  index: int
  tokens: np.ndarray
  logprobs: np.ndarray
  finished: bool
  row: int
  admit_seconds: float
  first_token_seconds: float
  finish_seconds: float
  steps: int
  drafted: int
  accepted: int
