"""The decode's static settings and its fixed-size state: :class:`DecodeSpec`, :class:`DecodeState`, the
device-side :class:`Queue` every batch decodes from, the step telemetry :class:`StepLog`, and where each
part lies on a mesh (:func:`state_shardings`).

One state shape serves every decode (gemma's ``SamplingState`` pattern). Regular decoding is the decode
whose proposer never proposes (``proposers.NoProposer``: every step a plain step); a static batch is a
queue that holds exactly the batch (all its prompts are admitted by the prefill, and admission is not
compiled); continuous batching is a queue longer than the batch.

Axes: B batch, P padded prompt length, N output bucket, L max draft length, Q queue, H logged steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax import sharding as sharding_lib
from bass_jax.cache import KVCache
from bass_jax.models.attention_registry import CACHE_ALIGNMENT
from bass_jax.models.common import DecoderConfig
from bass_jax.sampling.acceptance import AcceptanceRule
from bass_jax.sampling.draft_len import DraftLenPolicy, GoodputDraftLen
from bass_jax.sampling.proposers import Proposer
from bass_jax.sampling.tree import TreeShape


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Everything static about a decode (a new value compiles a new program).

  Attributes:
    target: target architecture. proposer: the draft side (``proposers.NoProposer`` for regular
      decoding).
    target_dtype: parameter/compute dtype name of the target (``"float32"``, ``"bfloat16"``).
    attention_impl: name in the attention registry, used by the target (and by a draft model).
    prompt_len: P, the prompt capacity: prompts are right-padded to it (``DecodeConfig.max_prompt_len``,
      or the longest prompt's bucket, or a larger capacity already built for the setting).
    max_new_bucket: N, the size of the output buffer (the true limit is ``Limits.max_new``).
    acceptance: the :class:`acceptance.AcceptanceRule` (``Greedy`` at temperature 0, else the decode's
      sampled rule: rejection sampling, Gumbel acceptance or a user's), which also says whether the
      program is branch-free.
    draft_len: the draft-length policy (fixed, Algorithm 1, goodput, or ``NoDrafts``; ``draft_len.py``).
    verify_chunk: C, the positions one verification forward scores; ``l + 1`` positions take
      ``ceil((l + 1) / C)`` passes at most (0 without a proposer).
    target_sharding: the target's placement on a mesh (``bass_jax.sharding.ShardingPlan``); None on
      one device. The proposer carries its own (``Proposer.sharding``).
    queue_len: Q, the prompts of the queue (:class:`Queue`, padded). A queue no longer than the batch
      (a static batch) compiles no admission.
    history_len: H, the steps the :class:`StepLog` holds (0 for a decode without a proposer: nothing
      to log).
    draft_trees: :class:`tree.TreeShape` s: a speculative step may verify a token tree of one of these
      shapes per row (``step.tree_step``) instead of a chain. With a :class:`GoodputDraftLen` (whose
      ``trees`` must be these) the policy chooses per step among plain steps, chains and the shapes;
      with another policy there is one shape and every speculative step verifies it. Empty: chains.
    admit_rows: A, the prompts an admission prefills at once at most (``batching._admit``).
    admit_chunk: positions per forward of an admission's chunked prefill (a power of two, <= P).
    compiler_options: XLA options the decode's programs compile with (the backend profile's,
      ``profiles.BackendProfile.compiler_options``).
  """

  target: DecoderConfig
  proposer: Proposer
  target_dtype: str
  attention_impl: str
  prompt_len: int
  max_new_bucket: int
  acceptance: AcceptanceRule
  draft_len: DraftLenPolicy
  verify_chunk: int
  target_sharding: Any = None
  queue_len: int = 1
  history_len: int = 0
  draft_trees: tuple[TreeShape, ...] = ()
  admit_rows: int = 1
  admit_chunk: int = 64
  compiler_options: tuple[tuple[str, str], ...] = ()

  @property
  def xla_options(self) -> dict[str, str] | None:
    """:attr:`compiler_options` as ``jax.jit``'s ``compiler_options`` (None: XLA's defaults)."""
    return dict(self.compiler_options) or None

  def __post_init__(self):
    trees = tuple(self.draft_trees)
    object.__setattr__(self, "draft_trees", trees)
    if isinstance(self.draft_len, GoodputDraftLen):
      if self.draft_len.trees != trees:
        raise ValueError(f"GoodputDraftLen.trees {self.draft_len.trees} must be the decode's "
                         f"draft_trees {trees}")
    elif len(trees) > 1:
      raise ValueError(f"draft_tree has {len(trees)} shapes; choosing among them needs "
                       f"draft_len='goodput' ({type(self.draft_len).__name__} verifies one)")

  @property
  def step_kinds(self) -> tuple[int | None, ...]:
    """The speculative steps the decode compiles: None for a chain step, j for a tree step of
    ``draft_trees[j]``; none when the proposer never proposes (regular decoding)."""
    if not self.proposer.proposes:
      return ()
    if not self.draft_trees:
      return (None,)
    if isinstance(self.draft_len, GoodputDraftLen):
      return (None,) + tuple(range(len(self.draft_trees)))
    return (0,)

  @property
  def greedy(self) -> bool:
    """Temperature 0: argmax drafts and verification."""
    return self.acceptance.greedy

  @property
  def keyed(self) -> bool:
    """Whether the acceptance rule reads per-sequence keys (``AcceptanceRule.keyed``): the queue then
    carries each prompt's key data."""
    return self.acceptance.keyed

  @property
  def branch_free(self) -> bool:
    """No device-side decision where work can replace it (the GPU profile, ``bass_jax.profiles``)."""
    return self.acceptance.branch_free

  @property
  def max_draft(self) -> int:
    """The slots past the last emitted token a step may write, less one: the longest chain (when chain
    steps are compiled), or what a tree step's verification and draft growth need
    (``TreeShape.look_ahead``); 0 without speculative steps."""
    kinds = self.step_kinds
    chains = [self.draft_len.max_len] if None in kinds else []
    return max(chains + [self.draft_trees[k].look_ahead - 1 for k in kinds if k is not None],
               default=0)

  @property
  def keeps_features(self) -> bool:
    """Whether the decode keeps the target's features for the proposer (an EAGLE draft)."""
    return self.proposer.needs_features

  @property
  def feature_taps(self) -> tuple[int, ...]:
    """The target layers whose hidden states the decode keeps beside (or instead of) the final
    features, for the proposer (an EAGLE-3 draft's taps; ``Proposer.feature_taps``)."""
    return tuple(self.proposer.feature_taps) if self.keeps_features else ()

  @property
  def final_feature(self) -> bool:
    """Whether the kept features end with the target's final features (``Proposer.final_feature``)."""
    return bool(self.proposer.final_feature)

  @property
  def cache_needed(self) -> int:
    """The cache slots a row fills: prompt, every new token and the verification's look-ahead past
    the last one."""
    return self.prompt_len + self.max_new_bucket + self.max_draft + 1

  @property
  def cache_len(self) -> int:
    """S: :attr:`cache_needed`, rounded up to a multiple of ``CACHE_ALIGNMENT`` so that the Pallas
    kernels tile it."""
    return -(-self.cache_needed // CACHE_ALIGNMENT) * CACHE_ALIGNMENT


@flax.struct.dataclass
class Queue:
  """The prompts of a decode, which prompt each row serves, and the outputs of the prompts that
  finished (Orca's iteration-level scheduling, Yu et al. 2022, inside the jitted loop: no host round
  trip per refill). A static batch's queue holds exactly its rows' prompts.

  Attributes:
    prompts: ``i32[Q, P]`` right-padded prompts in input order (rows past ``size`` are padding of the
      queue bucket, never admitted). prompt_len: ``i32[Q]``.
    size: ``i32[]`` the real prompts. next: ``i32[]`` the first prompt not yet admitted.
    slot: ``bool[B]`` rows that take prompts (False for the batch bucket's inert padding rows).
    row_prompt: ``i32[B]`` the prompt each row serves, -1 for none.
    prompt_row: ``i32[Q]`` the row each admitted prompt ran in (-1 before admission).
    start_step: ``i32[Q]`` ``DecodeState.step`` when the prompt was admitted: its steps in its row's
      log start there and end where the row's next prompt starts.
    tokens: ``i32[Q, N]`` each retired prompt's output (valid below ``lengths``).
    logprobs: ``f32[Q, N]`` their target log-probabilities (``DecodeState.logprobs``).
    lengths: ``i32[Q]`` tokens emitted. eos: ``bool[Q]`` ended by an EOS token.
    group: ``i32[Q]`` each prompt's group: prompts that are identical share one, the index of the
      first of them (samples of one prompt are siblings, ``proposers.SiblingProposer``).
    keys: ``u32[Q, 2]`` each prompt's sequence key data (Gumbel acceptance's noise,
      ``warp.gumbel_noise``), else None.
    prefilled: ``i32[]`` token positions the admissions' prefills computed (per model), summed:
      each adds its rows (``DecodeSpec.admit_rows``, spare ones included) times its chunks times
      the chunk; for executed-FLOP counts.
    admits: static; the queue is longer than the batch, so prompts may wait for a row and a row's
      text is overwritten when it takes the next one. Otherwise (a static batch) a retired row's
      text stays in the batch, where sibling lookup reads it (:meth:`row_group`), and the retired
      outputs are not offered to it again (``step.step_context``): a static batch of 24,000 samples
      of one prompt would otherwise search 24,000 retired samples per row and step.
  """

  prompts: jax.Array
  prompt_len: jax.Array
  size: jax.Array
  next: jax.Array
  slot: jax.Array
  row_prompt: jax.Array
  prompt_row: jax.Array
  start_step: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  eos: jax.Array
  group: jax.Array
  keys: jax.Array | None = None
  prefilled: jax.Array | None = None
  admits: bool = flax.struct.field(pytree_node=False, default=False)

  def pending(self) -> jax.Array:
    """``bool[]``: a row still serves a prompt (decoding, or done and not retired) or, in a queue that
    :attr:`admits`, a prompt is waiting."""
    serving = jnp.any(self.row_prompt >= 0)
    return serving | (self.next < self.size) if self.admits else serving

  def row_group(self) -> jax.Array:
    """``i32[B]`` the group of the prompt each row serves. A row that serves none is a group of its
    own (negative), so no sibling reads its text: an inert row, or, in a queue that :attr:`admits`,
    a retired row (its text is in the queue's outputs). Without admission a retired row keeps its
    prompt's group (row r served prompt r)."""
    rows = self.row_prompt.shape[0]
    own = -1 - jnp.arange(rows, dtype=self.group.dtype)
    if not self.admits:
      return jnp.where(self.slot, self.group[:rows], own)
    return jnp.where(self.row_prompt >= 0, self.group[jnp.maximum(self.row_prompt, 0)], own)

  def row_keys(self) -> jax.Array | None:
    """``u32[B, 2]`` the sequence key data of each row's prompt (None without Gumbel acceptance)."""
    if self.keys is None:
      return None
    return self.keys[jnp.maximum(self.row_prompt, 0)]


@flax.struct.dataclass
class StepLog:
  """What each step did, written once per step (``StepLog.record``, in ``step._advance``) and read only by the host
  (``GenerateStats``) and the benchmarks: the next step never reads it. H rows, one per step; entries
  past ``DecodeState.step`` are the initial values. A decode without a proposer logs nothing (H = 0).

  Attributes:
    draft_len: ``i32[H]`` l_draft of each step (0 for plain steps; a tree step's depth).
    drafted: ``i32[H, B]`` drafts proposed per row (0 past ``step``).
    verified: ``i32[H]`` positions the target scored per row, padding of the last chunk included.
    tree: ``i32[H]`` the tree shape each step verified (index into ``DecodeSpec.draft_trees``), -1 for
      chain and plain steps.
    source: ``i32[H, B]`` where each row's drafts came from (an index into
      ``proposers.DRAFT_SOURCES``), -1 for no drafts.
    accepted: ``i32[H, B]`` accepted drafts per row (bonus/correction not counted; -1 for a row that
      was not live).
  """

  draft_len: jax.Array
  drafted: jax.Array
  verified: jax.Array
  tree: jax.Array
  source: jax.Array
  accepted: jax.Array

  @classmethod
  def empty(cls, steps: int, batch: int) -> "StepLog":
    """A log of ``steps`` steps of ``batch`` rows, before the first."""
    return cls(draft_len=jnp.zeros((steps,), jnp.int32), drafted=jnp.zeros((steps, batch), jnp.int32),
               verified=jnp.zeros((steps,), jnp.int32), tree=jnp.full((steps,), -1, jnp.int32),
               source=jnp.full((steps, batch), -1, jnp.int32),
               accepted=jnp.full((steps, batch), -1, jnp.int32))

  def record(self, step: jax.Array, **entries: jax.Array) -> "StepLog":
    """The log with step ``step``'s ``entries`` (by field name) set; the fields not given keep their
    initial values there. Writes past H are dropped; a log of H = 0 (a decode that logs nothing)
    stays as it is."""
    if not self.draft_len.shape[0]:
      return self
    return self.replace(**{name: getattr(self, name).at[step].set(value, mode="drop")
                           for name, value in entries.items()})


@flax.struct.dataclass
class Limits:
  """The decode's traced limits, constant through the decode.

  Attributes:
    max_new: ``i32[]`` tokens a row may emit (``<= N``).
    step_limit: ``i32[]`` steps the decode may take (``<= H`` when something is logged):
      ``max_new`` when the queue holds only the batch; else ``ceil(prompts * max_new / slots) +
      max_new`` (while prompts wait every slot is live and emits a token per step, then every row
      drains within ``max_new`` steps).
    eos_ids: ``i32[E]`` tokens that end a row, padded with -1 (never a token).
  """

  max_new: jax.Array
  step_limit: jax.Array
  eos_ids: jax.Array


@flax.struct.dataclass
class DecodeState:
  """What the next step reads, fixed-size (gemma's ``SamplingState`` pattern), and the step log.

  Attributes:
    tokens: ``i32[B, P + N]`` prompt then emitted tokens.
    prompt_len: ``i32[B]`` true prompt lengths.
    seq_len: ``i32[B]`` prompt plus emitted tokens.
    logprobs: ``f32[B, N]`` target log-probability (temperature 1, no top-p) of each emitted token.
    done: ``bool[B]`` row finished (EOS or ``max_new`` tokens, or a row serving no prompt); its
      outputs are frozen.
    eos: ``bool[B]`` row finished by emitting an EOS token.
    target_cache: the target's ragged cache (``KVCache``, ``[B, K, S, H]`` per layer).
    features: ``[B, P + N, E]`` the target's feature at each text position it has scored (in its
      compute dtype), or None unless ``spec.keeps_features``.
    proposer_state: the proposer's (None for a model-free proposer).
    draft_len: ``i32[]`` l_draft of the next step (0: a plain step).
    policy_state: the draft-length policy's state (``bass_jax.sampling.draft_len``).
    key: PRNG key.
    step: ``i32[]`` steps taken.
    queue: the :class:`Queue` the rows are served from.
    limits: the decode's :class:`Limits`.
    log: the :class:`StepLog` (telemetry; no step reads it).
  """

  tokens: jax.Array
  prompt_len: jax.Array
  seq_len: jax.Array
  logprobs: jax.Array
  done: jax.Array
  eos: jax.Array
  target_cache: KVCache
  features: jax.Array | None
  proposer_state: Any
  draft_len: jax.Array
  policy_state: Any
  key: jax.Array
  step: jax.Array
  queue: Queue
  limits: Limits
  log: StepLog


@flax.struct.dataclass
class DecodeInputs:
  """The arrays one decode call starts from (``loop.prefill``); what is static is in :class:`DecodeSpec`.

  Attributes:
    prompts: ``i32[Q, P]`` every prompt of the queue, right-padded (padding prompts are one token);
      the batch's rows start with the first B. prompt_len: ``i32[Q]``, each ``>= 1``.
    keys: ``u32[Q, 2]`` their sequence key data (used with Gumbel acceptance).
    group: ``i32[Q]`` their groups (:attr:`Queue.group`).
    num_prompts: ``i32[]`` the real prompts among the Q.
    inert: ``bool[B]`` padding rows of the batch bucket: done from the start, they never emit nor take
      prompts.
    max_new: ``i32[]`` tokens per row at most (``<= spec.max_new_bucket``).
    step_limit: ``i32[]`` :attr:`Limits.step_limit`.
    eos_ids: ``i32[E]`` EOS ids padded with -1.
    key: PRNG key for the whole decode.
    step_costs: ``f32[6 + T]`` ``StepCosts.as_array()`` for a cost-aware policy (ignored by others).
  """

  prompts: jax.Array
  prompt_len: jax.Array
  keys: jax.Array
  group: jax.Array
  num_prompts: jax.Array
  inert: jax.Array
  max_new: jax.Array
  step_limit: jax.Array
  eos_ids: jax.Array
  key: jax.Array
  step_costs: jax.Array

  def placed(self, rows: Any, replicated: Any) -> "DecodeInputs":
    """The same fields with per-row arrays given ``rows`` and the rest ``replicated``: the inputs' layout
    on a mesh (pass shardings), or any two values per field kind. The queue's per-prompt arrays are
    per row when the queue holds exactly the batch (row r serves prompt r)."""
    everything = jax.tree_util.tree_map(lambda _: replicated, self)
    if self.prompts.shape[0] == self.inert.shape[0]:
      everything = everything.replace(prompts=rows, prompt_len=rows, keys=rows, group=rows)
    return everything.replace(inert=rows)


def state_shardings(spec: DecodeSpec, state: DecodeState) -> DecodeState:
  """Where every part of the decode state lies on ``spec.target_sharding``'s mesh, derived from the
  shapes: an array whose leading axis is the batch's B is split over ``"data"`` (the queue's and the
  log's arrays, indexed by prompt or by step, are replicated: the log's per-row arrays lead with H);
  the target's cache as its plan says, the proposer's as the proposer's plan says (the target's when
  it has none); everything else replicated.

  Args:
    state: a :class:`DecodeState` of arrays or ``ShapeDtypeStruct`` (``jax.eval_shape`` of
      ``loop.prefill``).

  Returns:
    A :class:`DecodeState` of ``NamedSharding`` (the jitted programs' output shardings).
  """
  plan = spec.target_sharding
  batch = state.tokens.shape[0]
  per_row = lambda tree: jax.tree_util.tree_map(
      lambda x: plan.rows if x.ndim and x.shape[0] == batch else plan.replicate, tree)
  replicated = lambda tree: jax.tree_util.tree_map(lambda _: plan.replicate, tree)
  proposer_state = None
  if state.proposer_state is not None:
    proposer_state = sharding_lib.state_shardings(
        state.proposer_state, spec.proposer.sharding or plan, batch)
  # Without admission row r serves prompt r: the queue's per-prompt arrays split like the rows.
  queue = (per_row(state.queue) if not state.queue.admits
           else replicated(state.queue).replace(slot=plan.rows, row_prompt=plan.rows))
  return per_row(state).replace(
      target_cache=sharding_lib.state_shardings(state.target_cache, plan, batch),
      proposer_state=proposer_state, policy_state=replicated(state.policy_state), queue=queue,
      limits=replicated(state.limits), log=replicated(state.log))
