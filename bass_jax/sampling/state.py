"""The decode's static settings and its fixed-size state: :class:`DecodeSpec`, :class:`DecodeState` and
continuous batching's device-side :class:`Queue` (gemma's ``SamplingState`` pattern), and where each
part lies on a mesh (:func:`state_shardings`).

Axes: B batch, P padded prompt length, N output bucket, L max draft length, Q queue, H history steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax import sharding as sharding_lib
from bass_jax.cache import KVCache
from bass_jax.models.attention import CACHE_ALIGNMENT
from bass_jax.models.common import DecoderConfig
from bass_jax.sampling.draft_len import DraftLenPolicy, GoodputDraftLen
from bass_jax.sampling.proposers import Proposer
from bass_jax.sampling.tree import TreeShape


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Everything static about a decode (a new value compiles a new program).

  Attributes:
    method: ``"bass"`` or ``"regular"``.
    target: target architecture. proposer: the draft side (None for ``regular``).
    target_dtype: parameter/compute dtype name of the target (``"float32"``, ``"bfloat16"``).
    attention_impl: name in the attention registry, used by the target (and by a draft model).
    prompt_len: P, prompts are right-padded to it.
    max_new_bucket: N, the size of the output buffer (the true limit is ``DecodeState.max_new``).
    greedy: temperature 0 (argmax draft and verification).
    draft_len: the draft-length policy (fixed, Algorithm 1 or goodput; ``draft_len.py``).
    verify_chunk: C, the positions one verification forward scores; ``l + 1`` positions take
      ``ceil((l + 1) / C)`` passes at most.
    target_sharding: the target's placement on a mesh (``bass_jax.sharding.ShardingPlan``); None on
      one device. The proposer carries its own (``Proposer.sharding``).
    queue_len: Q, the prompts of a continuous batch's queue (:class:`Queue`, padded); 0 for a static
      batch, which decodes the rows it starts with and nothing else.
    history_len: H, the steps the per-step histories hold; 0 means N (a static batch takes at most N
      steps: every live row emits at least one token per step).
    acceptance: ``"rejection"`` (speculative rejection sampling, Leviathan et al. 2023) or ``"gumbel"``
      (drafter-invariant: every token is the target's Gumbel-max draw with per-sequence, per-position
      noise, ``acceptance.coupled_accept_chunk``). Greedy decoding ignores it.
    branch_free: no device-side decision where work can replace it (the GPU profile,
      ``sampling.profiles``): the draft loop runs its static L iterations, the nucleus comes from one
      sort per row; with ``verify_chunk >= L + 1`` verification is one pass, never a loop.
    draft_trees: :class:`tree.TreeShape` s: a speculative step may verify a token tree of one of these
      shapes per row (``step.tree_step``) instead of a chain. With a :class:`GoodputDraftLen` (whose
      ``trees`` must be these) the policy chooses per step among plain steps, chains and the shapes;
      with another policy there is one shape and every speculative step verifies it. Empty: chains.
    admit_rows: A, the prompts a continuous batch admits in one prefill at most (``continuous``).
    admit_chunk: positions per forward of an admission's chunked prefill (a power of two, <= P).
  """

  method: str
  target: DecoderConfig
  proposer: Proposer | None
  target_dtype: str
  attention_impl: str
  prompt_len: int
  max_new_bucket: int
  greedy: bool
  draft_len: DraftLenPolicy | None
  verify_chunk: int
  target_sharding: Any = None
  queue_len: int = 0
  history_len: int = 0
  acceptance: str = "rejection"
  draft_trees: tuple[TreeShape, ...] = ()
  branch_free: bool = False
  admit_rows: int = 1
  admit_chunk: int = 64

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
    ``draft_trees[j]``."""
    if not self.draft_trees:
      return (None,)
    if isinstance(self.draft_len, GoodputDraftLen):
      return (None,) + tuple(range(len(self.draft_trees)))
    return (0,)

  @property
  def coupled(self) -> bool:
    """Whether sampled tokens are Gumbel-max draws keyed by (sequence, text position)."""
    return self.acceptance == "gumbel" and not self.greedy

  @property
  def continuous(self) -> bool:
    """Whether finished rows take the next waiting prompt (continuous batching)."""
    return self.queue_len > 0

  @property
  def max_steps(self) -> int:
    """H, the length of the per-step histories."""
    return self.history_len or self.max_new_bucket

  @property
  def max_draft(self) -> int:
    """The slots past the last emitted token a step may write, less one: the longest chain (when chain
    steps are compiled), or what a tree step's verification and draft growth need
    (``TreeShape.look_ahead``)."""
    if self.method != "bass":
      return 0
    chains = [self.draft_len.max_len] if None in self.step_kinds else []
    return max(chains + [t.look_ahead - 1 for t in self.draft_trees])

  @property
  def keeps_features(self) -> bool:
    """Whether the decode keeps the target's features for the proposer (an EAGLE draft)."""
    return self.method == "bass" and self.proposer.needs_features

  @property
  def cache_len(self) -> int:
    """S: prompt, every new token and the verification's look-ahead past the last one, rounded up to
    a multiple of ``CACHE_ALIGNMENT`` so that the Pallas kernels tile it."""
    needed = self.prompt_len + self.max_new_bucket + self.max_draft + 1
    return -(-needed // CACHE_ALIGNMENT) * CACHE_ALIGNMENT


@flax.struct.dataclass
class Queue:
  """Continuous batching's device-side queue: the prompts waiting for a row, which prompt each row
  serves, and the outputs of the prompts that finished (Orca's iteration-level scheduling, Yu et al.
  2022, inside the jitted loop: no host round trip per refill).

  Attributes:
    prompts: ``i32[Q, P]`` right-padded prompts in input order (rows past ``size`` are padding of the
      queue bucket, never admitted). prompt_len: ``i32[Q]``.
    size: ``i32[]`` the real prompts. next: ``i32[]`` the first prompt not yet admitted.
    slot: ``bool[B]`` rows that take prompts (False for the batch bucket's inert padding rows).
    row_prompt: ``i32[B]`` the prompt each row serves, -1 for none.
    prompt_row: ``i32[Q]`` the row each admitted prompt ran in (-1 before admission).
    start_step: ``i32[Q]`` ``DecodeState.step`` when the prompt was admitted: its steps in its row's
      histories start there and end where the row's next prompt starts.
    tokens: ``i32[Q, N]`` each retired prompt's output (valid below ``lengths``).
    logprobs: ``f32[Q, N]`` their target log-probabilities (``DecodeState.logprobs``).
    lengths: ``i32[Q]`` tokens emitted. eos: ``bool[Q]`` ended by an EOS token.
    group: ``i32[Q]`` each prompt's group (:attr:`DecodeState.group`).
    keys: ``u32[Q, 2]`` each prompt's sequence key data (``DecodeSpec.coupled``), else None.
    prefilled: ``i32[]`` token positions the admissions' prefills computed (per model), summed:
      each adds its rows (``DecodeSpec.admit_rows``, spare ones included) times its chunks times
      the chunk; for executed-FLOP counts.
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

  def pending(self) -> jax.Array:
    """``bool[]``: a prompt is waiting or a row still serves one (decoding, or done and not retired)."""
    return jnp.any(self.row_prompt >= 0) | (self.next < self.size)


@flax.struct.dataclass
class DecodeState:
  """All decoding state, fixed-size (gemma's ``SamplingState`` pattern).

  Attributes:
    tokens: ``i32[B, P + N]`` prompt then emitted tokens.
    prompt_len: ``i32[B]`` true prompt lengths.
    seq_len: ``i32[B]`` prompt plus emitted tokens.
    target_cache: the target's ragged cache. proposer_state: the proposer's (None for regular decoding).
    features: ``[B, P + N, E]`` the target's feature at each text position it has scored (in its
      compute dtype), or None unless ``spec.keeps_features``.
    logprobs: ``f32[B, N]`` target log-probability (temperature 1, no top-p) of each emitted token.
    done: ``bool[B]`` row finished (EOS or ``max_new`` tokens, or a padding row); its outputs are frozen.
    eos: ``bool[B]`` row finished by emitting an EOS token.
    max_new: ``i32[]`` tokens a row may emit (``<= N``).
    step_limit: ``i32[]`` steps the decode may take (``<= H``): ``max_new`` for a static batch; for a
      continuous one ``ceil(prompts * max_new / slots) + max_new`` (while prompts wait every slot is
      live and emits a token per step, then every row drains within ``max_new`` steps).
    eos_ids: ``i32[E]`` tokens that end a row, padded with -1 (never a token).
    step: ``i32[]`` steps taken.
    draft_len: ``i32[]`` l_draft of the next step (0: a plain step). policy_state: the draft-length
      policy's state (``bass_jax.sampling.draft_len``).
    draft_len_history: ``i32[H]`` l_draft of each step (0 for plain steps and past ``step``).
    drafted_history: ``i32[H, B]`` drafts proposed per row per step (0 past ``step``).
    verified_history: ``i32[H]`` positions the target scored per row in each step, padding of the last
      chunk included (0 past ``step``).
    tree_history: ``i32[H]`` the tree shape each step verified (index into ``DecodeSpec.draft_trees``),
      -1 for chain and plain steps and past ``step``.
    source_history: ``i32[H, B]`` where each row's drafts came from in each step (an index into
      ``proposers.DRAFT_SOURCES``: a hybrid's lookups or its model), -1 for no drafts.
    accepted_history: ``i32[H, B]`` accepted drafts per row per step (bonus/correction not counted; -1
      for a row that was already done, and past ``step``).
    key: PRNG key.
    group: ``i32[B]`` the prompt group each row serves: rows (and queued prompts) whose prompts are
      identical share a group, the index of the first of them in the input; padding, and a
      continuous batch's row between its retirement and its next admission, has a group of its own
      (negative). Samples of one prompt are siblings (``proposers.SiblingProposer``).
    queue: the continuous batch's :class:`Queue`, or None for a static batch.
    row_keys: ``u32[B, 2]`` the sequence key data of each row's prompt (``DecodeSpec.coupled``: its
      noise, ``warp.gumbel_noise``), else None.
  """

  tokens: jax.Array
  prompt_len: jax.Array
  seq_len: jax.Array
  target_cache: KVCache
  proposer_state: Any
  features: jax.Array | None
  logprobs: jax.Array
  done: jax.Array
  eos: jax.Array
  max_new: jax.Array
  step_limit: jax.Array
  eos_ids: jax.Array
  step: jax.Array
  draft_len: jax.Array
  policy_state: Any
  draft_len_history: jax.Array
  drafted_history: jax.Array
  verified_history: jax.Array
  tree_history: jax.Array
  source_history: jax.Array
  accepted_history: jax.Array
  key: jax.Array
  group: jax.Array
  queue: Queue | None = None
  row_keys: jax.Array | None = None


@flax.struct.dataclass
class DecodeInputs:
  """The arrays one decode call starts from (``loop.prefill``); what is static is in :class:`DecodeSpec`.

  Attributes:
    prompts: ``i32[B, P]`` right-padded prompts. prompt_len: ``i32[B]``, each ``>= 1``.
    inert: ``bool[B]`` padding rows of the batch bucket: done from the start, they never emit (nor,
      in a continuous batch, take prompts).
    row_keys: ``u32[B, 2]`` the rows' sequence key data (used when ``spec.coupled``).
    max_new: ``i32[]`` tokens per row at most (``<= spec.max_new_bucket``).
    eos_ids: ``i32[E]`` EOS ids padded with -1.
    key: PRNG key for the whole decode.
    step_costs: ``f32[5]`` ``StepCosts.as_array()`` for a cost-aware policy (ignored by others).
    group: ``i32[B]`` each row's prompt group (:attr:`DecodeState.group`).
    queue_prompts: ``i32[Q, P]`` every prompt of a continuous batch (``spec.continuous``; None for a
      static one), of which the live rows of ``prompts`` are the first. queue_prompt_len: ``i32[Q]``.
    queue_keys: ``u32[Q, 2]`` their sequence key data (of which ``row_keys`` are the first).
    queue_group: ``i32[Q]`` the queued prompts' groups (of which ``group`` are the first).
    num_prompts: ``i32[]`` the real prompts among the Q.
    step_limit: ``i32[]`` :attr:`DecodeState.step_limit` of a continuous batch (None: ``max_new``).
  """

  prompts: jax.Array
  prompt_len: jax.Array
  inert: jax.Array
  row_keys: jax.Array
  max_new: jax.Array
  eos_ids: jax.Array
  key: jax.Array
  step_costs: jax.Array
  group: jax.Array
  queue_prompts: jax.Array | None = None
  queue_prompt_len: jax.Array | None = None
  queue_keys: jax.Array | None = None
  num_prompts: jax.Array | None = None
  queue_group: jax.Array | None = None
  step_limit: jax.Array | None = None

  def placed(self, rows: Any, replicated: Any) -> "DecodeInputs":
    """The same fields with per-row arrays given ``rows`` and the rest ``replicated``: the inputs' layout
    on a mesh (pass shardings), or any two values per field kind."""
    everything = jax.tree_util.tree_map(lambda _: replicated, self)
    return everything.replace(prompts=rows, prompt_len=rows, inert=rows, row_keys=rows, group=rows)


def state_shardings(spec: DecodeSpec, state: DecodeState) -> DecodeState:
  """Where every part of the decode state lies on ``spec.target_sharding``'s mesh: per-row arrays split
  over ``"data"``; the target's cache as its plan says, the proposer's as the proposer's plan says
  (the target's when it has none); counters, histories, the key and the queue's per-prompt arrays
  replicated.

  Args:
    state: a :class:`DecodeState` of arrays or ``ShapeDtypeStruct`` (``jax.eval_shape`` of
      :func:`prefill`).

  Returns:
    A :class:`DecodeState` of ``NamedSharding`` (the jitted programs' output shardings).
  """
  plan = spec.target_sharding
  batch = state.tokens.shape[0]
  rows, replicated = plan.rows, plan.replicate
  every = lambda tree: jax.tree_util.tree_map(lambda _: replicated, tree)
  proposer_state = None
  if state.proposer_state is not None:
    proposer_state = sharding_lib.state_shardings(
        state.proposer_state, spec.proposer.sharding or plan, batch)
  return DecodeState(
      tokens=rows, prompt_len=rows, seq_len=rows,
      target_cache=sharding_lib.state_shardings(state.target_cache, plan, batch),
      proposer_state=proposer_state, features=None if state.features is None else rows,
      logprobs=rows, done=rows, eos=rows, max_new=replicated, step_limit=replicated,
      eos_ids=replicated, step=replicated, draft_len=replicated,
      policy_state=every(state.policy_state), draft_len_history=replicated,
      drafted_history=replicated, verified_history=replicated, tree_history=replicated,
      source_history=replicated,
      accepted_history=replicated,
      key=replicated, queue=None if state.queue is None else every(state.queue).replace(
          slot=rows, row_prompt=rows), row_keys=None if state.row_keys is None else rows,
      group=rows)
