"""The proposer interface (what the decode loop asks of a draft side each step), what a proposer may
read of the decode (:class:`StepContext`), what it returns (:class:`Proposal`), and the autoregressive
drafting loop the model drafts share (:func:`draft_autoregressively`). The package docstring
(``bass_jax.sampling.proposers``) describes the protocol."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax.cache import write_rows
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.acceptance import AcceptanceRule, Gumbel, Rejection
from bass_jax.sampling.warp import warped_log_probs


@flax.struct.dataclass
class FinishedSamples:
  """The retired samples, as the queue keeps them (``state.Queue``): what sibling lookup reads of
  the samples that left the batch.

  Attributes:
    prompts: ``i32[Q, P]`` every queued prompt, right-padded. prompt_len: ``i32[Q]``.
    tokens: ``i32[Q, N]`` each retired sample's output (valid below ``lengths``).
    lengths: ``i32[Q]`` tokens emitted; 0 for a prompt not retired yet.
    group: ``i32[Q]`` each prompt's group (``state.Queue.group``).
  """

  prompts: jax.Array
  prompt_len: jax.Array
  tokens: jax.Array
  lengths: jax.Array
  group: jax.Array


@flax.struct.dataclass
class StepContext:
  """What a proposer may read of the decode at the start of a step.

  Attributes:
    tokens: ``i32[B, T]`` each row's prompt then its output; ``tokens[b, :seq_len[b]]`` is the text.
    seq_len: ``i32[B]`` text length per row.
    live: ``bool[B]`` rows still decoding.
    draft_len: ``i32[]`` l, the step's draft length chosen by the policy (``1 <= l <= L``).
    key: PRNG key of the proposal.
    temperature: ``f32[]``. top_p: ``f32[]``, or None when there is no nucleus (``top_p = 1``, a static
      property of the program: ``warp.warped_log_probs``).
    features: ``[B, T, E]`` the target's feature at every text position it has scored
      (``features[b, i]`` for ``i < seq_len[b] - 1`` are valid; the rest is stale), or None unless the
      proposer ``needs_features``.
    row_keys: ``u32[B, 2]`` each row's sequence key data under a keyed acceptance rule (Gumbel
      acceptance, ``acceptance="gumbel"``): a sampled draft must then be drawn with :meth:`draw`,
      which couples it to the target's draw at the same text position, and range over the target's
      whole vocabulary; None under an unkeyed rule (rejection sampling).
    group: ``i32[B]`` each row's prompt group (``state.Queue.row_group``): rows with identical prompts
      share one; None (a context built by hand) means every row is its own group.
    finished: the samples retired into the queue (:class:`FinishedSamples`); None for a context
      built by hand.
    branch_free: static; draft loops run their static ``L`` iterations and warps find the nucleus
      with one sort per row (``DecodeSpec.branch_free``, ``bass_jax.profiles``).
    acceptance: static; the decode's ``acceptance.AcceptanceRule``, whose ``draw_draft`` :meth:`draw`
      uses; None (a context built by hand) draws as Gumbel acceptance does when ``row_keys`` is set,
      else as rejection sampling does.
  """

  tokens: jax.Array
  seq_len: jax.Array
  live: jax.Array
  draft_len: jax.Array
  key: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  features: jax.Array | None = None
  row_keys: jax.Array | None = None
  group: jax.Array | None = None
  finished: FinishedSamples | None = None
  branch_free: bool = flax.struct.field(pytree_node=False, default=False)
  acceptance: AcceptanceRule | None = flax.struct.field(pytree_node=False, default=None)

  def warp(self, logits: jax.Array) -> jax.Array:
    """``logits: f32[..., V]`` warped by the step's temperature and nucleus
    (``warp.warped_log_probs``)."""
    return warped_log_probs(logits, self.temperature, self.top_p, branch_free=self.branch_free)

  def draw(self, log_q: jax.Array, i) -> jax.Array:
    """Draws draft ``i`` (0-based: the token at text position ``seq_len + i``) of every row from its
    warped ``log_q: f32[B, V]`` -> ``i32[B]`` indices into ``log_q``'s last axis.

    The rule's ``AcceptanceRule.draw_draft``: under rejection sampling an independent draw keyed by
    ``fold_in(key, i)``; under Gumbel acceptance (a keyed rule: ``row_keys`` set) the Gumbel-max draw
    with the row's noise at that text position (``warp.gumbel_choice``), which must then range over
    the target's whole vocabulary.
    """
    rule = self.acceptance
    if rule is None:
      rule = Gumbel() if self.row_keys is not None else Rejection()
    return rule.draw_draft(log_q, key=jax.random.fold_in(self.key, i), row_keys=self.row_keys,
                           positions=self.seq_len + i)


# Where a row's drafts came from (``StepLog.source``, ``GenerateStats.sources``): an index
# into this tuple; -1 for a row with no drafts that step.
DRAFT_SOURCES = ("model", "ngram", "siblings")


@flax.struct.dataclass
class Proposal:
  """One step's drafts.

  Attributes:
    drafts: ``i32[B, L]`` proposed tokens ``d_1 … d_L``; slots ``>= num_drafts[b]`` are padding.
    num_drafts: ``i32[B]`` real drafts per row, ``0 <= num_drafts[b] <= l`` (0: the row proposes
      nothing and its step is a plain decoding step inside the verification).
    log_q: ``f32[B, L + C, V]`` warped log-probabilities of the distribution each draft was drawn from
      (padded by C positions so that a verification chunk's slice never runs off the end), or None when
      every draft is deterministic (one-hot ``q``) or decoding is greedy.
    source: ``i32[B]`` where each row's drafts came from (an index into :data:`DRAFT_SOURCES`), or
      None: all from the proposer's own :attr:`Proposer.source`.
  """

  drafts: jax.Array
  num_drafts: jax.Array
  log_q: jax.Array | None
  source: jax.Array | None = None


class Proposer(abc.ABC):
  """A static, hashable draft-side strategy (subclasses are frozen dataclasses)."""

  @property
  def name(self) -> str:
    """A short description for logs and result files."""
    return type(self).__name__

  # Static: True when the proposer reads the target's features (``StepContext.features``); the loop then
  # keeps a feature buffer, written by every target forward.
  needs_features = False
  # With needs_features: the target layers (0-based, their outputs) whose hidden states the decode
  # keeps per position, concatenated, and whether the target's final features follow them.
  feature_taps: tuple[int, ...] = ()
  final_feature = True
  # Static: the draft model's placement on a mesh (``bass_jax.sharding.ShardingPlan``); None on one device
  # or without a model.
  sharding = None
  # Static: where this proposer's drafts come from (one of DRAFT_SOURCES), for the statistics.
  source = "model"
  # Static: False for :class:`NoProposer` only: the decode then compiles no speculative step.
  proposes = True
  # Static: True for a proposer whose drafts are a draft model's forwards (draft models, EAGLE,
  # Medusa, and what wraps them): never model-free (:func:`not_model_free`).
  drafts_with_model = False

  @property
  def source_index(self) -> int:
    """:attr:`source` as its index into :data:`DRAFT_SOURCES` (what the histories record).

    Raises:
      ValueError: a ``source`` that is not one of :data:`DRAFT_SOURCES`.
    """
    if self.source not in DRAFT_SOURCES:
      raise ValueError(f"{type(self).__name__}.source is {self.source!r}; it must be one of "
                       f"{DRAFT_SOURCES}")
    return DRAFT_SOURCES.index(self.source)

  def init_state(self, params: Any, prompts: jax.Array, prompt_len: jax.Array, *, cache_len: int,
                 max_len: int, features: jax.Array | None = None,
                 prefill_chunk: int | None = None) -> Any:
    """The proposer's state after the prefill (default: none).

    Args:
      params: the proposer's weights (None for a model-free proposer).
      prompts: ``i32[B, P]`` right-padded prompts. prompt_len: ``i32[B]``.
      cache_len: S, the slots a ragged cache must hold. max_len: L, the most drafts per step.
      features: ``[B, P, E]`` the target's features over the prompts (when ``needs_features``).
      prefill_chunk: a draft model may prefill in chunks of this many positions, up to the true
        prompt length (``models.common.prefill_cache``'s ``chunk``); None: one pass over all P.
    """
    del params, prompts, prompt_len, cache_len, max_len, features, prefill_chunk
    return None

  def admit(self, params: Any, state: Any, rows: jax.Array, prompts: jax.Array,
            prompt_len: jax.Array, *, cache_len: int, max_len: int,
            features: jax.Array | None = None, prefill_chunk: int | None = None) -> Any:
    """The state with rows ``rows`` restarted on new prompts (continuous batching, ``loop.decode``):
    the other rows are untouched.

    The default builds :meth:`init_state` for the A rows and writes it into them
    (``bass_jax.cache.write_rows``): per-row leaves (batch-leading) are replaced, scalar leaves, which
    are the batch's, kept. A proposer whose state holds more than that overrides it.

    Args:
      rows: ``i32[A]`` distinct rows; an index out of ``[0, B)`` is a padding slot of the admission,
        whose prompt is computed and dropped. prompts: ``i32[A, P]`` right-padded.
      prompt_len: ``i32[A]``, each ``>= 1``.
      cache_len: the slots of the state built for the rows: the prompt bucket P, which holds every
        prompt (``write_rows`` fills the rows' first P slots; their later slots keep stale entries,
        past each row's length).
      features: ``[A, P, E]`` the target's features over the prompts (when ``needs_features``).
      prefill_chunk: as in :meth:`init_state`.
    """
    fresh = self.init_state(params, prompts, prompt_len, cache_len=cache_len, max_len=max_len,
                            features=features, prefill_chunk=prefill_chunk)
    return write_rows(state, fresh, rows)

  def forward_costs(self, params: Any, batch: int, cache_len: int, max_len: int) -> tuple[float, float]:
    """Measured seconds of the proposer's first forward of a step (catch-up and first draft) and of each
    further draft, at ``batch`` rows (``bass_jax.sampling.costs``; default 0, 0: no forward)."""
    del params, batch, cache_len, max_len
    return 0.0, 0.0

  def tree_costs(self, params: Any, batch: int, cache_len: int, shape: tree_lib.TreeShape) -> float:
    """Measured seconds of growing a tree of ``shape`` after the first forward of a step (the
    ``depth - 1`` levels below the first, each :meth:`tree_level_cost`; a slight overestimate, since
    each level is timed at the widest level's mask), at ``batch`` rows (``bass_jax.sampling.costs``)."""
    if shape.depth == 1:
      return 0.0
    return (shape.depth - 1) * self.tree_level_cost(params, batch, cache_len, shape)

  def tree_level_cost(self, params: Any, batch: int, cache_len: int,
                      shape: tree_lib.TreeShape) -> float:
    """Measured seconds of one level of tree growth (a forward of ``shape.top_k`` nodes under their
    ancestor mask) at ``batch`` rows; default 0: a model-free proposer grows with no forward."""
    del params, batch, cache_len, shape
    return 0.0

  # Static: False when some step may have nothing to propose (then the loop compiles plain steps).
  always_proposes = True

  def can_propose(self, ctx: StepContext) -> jax.Array:
    """``bool[]``: whether any live row would get at least one draft this step (default: True)."""
    del ctx
    return jnp.bool_(True)

  @abc.abstractmethod
  def propose(self, params: Any, state: Any, ctx: StepContext, *, max_len: int, chunk: int,
              greedy: bool) -> tuple[Any, Proposal]:
    """Drafts up to ``ctx.draft_len`` tokens per row.

    Args:
      max_len: L, the static width of ``Proposal.drafts``. chunk: C, the padding of ``log_q``.
      greedy: temperature 0 (then ``log_q`` is None).

    Returns:
      ``(state, proposal)``.
    """

  def propose_tree(self, params: Any, state: Any, ctx: StepContext, *,
                   shape: tree_lib.TreeShape) -> tuple[Any, tree_lib.DraftTree]:
    """Drafts a token tree per row (a tree step, docs/design.md "Token trees"): ``shape.nodes`` nodes,
    node 0 the row's last token, no path deeper than ``shape.depth``. Every node must be a
    deterministic function of the draft's state (one-hot ``q``), so that tree acceptance is exact at
    every temperature (Miao et al. 2024, SpecInfer; Li et al. 2024, EAGLE-2).

    The default is the proposer's own chain (:meth:`propose`, greedy, ``shape.depth`` drafts at most)
    as a tree, with unused nodes as padding; draft models override it with EAGLE-2's growth, n-gram
    lookup with several matches as branches. The state's rollback after a tree step is
    :meth:`rollback`, as after a chain.

    Args:
      params: the proposer's weights (None for a model-free one). state: its state.
      ctx: the step's :class:`StepContext`. shape: the tree's static ``tree.TreeShape``.

    Returns:
      ``(state, tree)``: a ``tree.DraftTree`` with ``tokens i32[B, N]``, ``parents i32[B, N]``
      (topological, ``-1`` at the root) and ``num_nodes i32[B]`` (1 for a row with no drafts),
      N = ``shape.nodes``.
    """
    ctx = ctx.replace(draft_len=jnp.asarray(shape.depth, jnp.int32))
    state, proposal = self.propose(params, state, ctx, max_len=shape.nodes - 1, chunk=1, greedy=True)
    last = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    return state, tree_lib.chain_tree(last, proposal.drafts, proposal.num_drafts)

  def rollback(self, state: Any, tokens: jax.Array, old_seq_len: jax.Array,
               new_seq_len: jax.Array) -> Any:
    """The state after acceptance: rows now hold ``tokens[b, :new_seq_len[b]]``, of which the step
    emitted ``tokens[b, old_seq_len[b]:new_seq_len[b]]`` (default: stateless)."""
    del tokens, old_seq_len, new_seq_len
    return state


def draft_autoregressively(step, carry: Any, first: tuple[jax.Array, jax.Array | None],
                           ctx: StepContext, *, max_len: int, chunk: int,
                           vocab_size: int) -> tuple[Any, Proposal]:
  """Drafts ``ctx.draft_len`` tokens per row, each from the last: the loop a draft model's proposal runs.

  Args:
    step: ``(carry, previous i32[B, 1], i) -> (carry, token i32[B], log_q f32[B, V] | None)``: feeds
      the previous draft and draws draft ``i`` (0-based, with ``ctx.draw``; ``log_q`` None when greedy).
    carry: the model's state (its cache, and whatever else it feeds itself).
    first: ``(token i32[B], log_q f32[B, V] | None)``, draft 0.
    max_len: L, the static width of the drafts. chunk: C, the padding of ``log_q``. vocab_size: V.

  Returns:
    ``(carry, proposal)``: every row proposes ``ctx.draft_len`` drafts; ``proposal.log_q`` is
    ``f32[B, L + C, V]`` when sampling. With ``ctx.branch_free`` the loop runs all ``L - 1`` steps
    (a static trip count: no device-side loop condition); the drafts past ``l`` are padding.
  """
  token, log_q = first
  batch = token.shape[0]
  drafts = jnp.zeros((batch, max_len), jnp.int32).at[:, 0].set(token)
  draft_log_probs = None
  if log_q is not None:
    draft_log_probs = jnp.zeros((batch, max_len + chunk, vocab_size), jnp.float32).at[:, 0].set(log_q)

  def body(i, loop_carry):
    carry, drafts, draft_log_probs = loop_carry
    previous = jax.lax.dynamic_slice_in_dim(drafts, i - 1, 1, axis=1)
    carry, token, log_q = step(carry, previous, i)
    drafts = jax.lax.dynamic_update_slice_in_dim(drafts, token[:, None], i, axis=1)
    if draft_log_probs is not None:
      draft_log_probs = jax.lax.dynamic_update_slice_in_dim(draft_log_probs, log_q[:, None], i,
                                                            axis=1)
    return carry, drafts, draft_log_probs

  stop = max_len if ctx.branch_free else ctx.draft_len
  carry, drafts, draft_log_probs = jax.lax.fori_loop(1, stop, body, (carry, drafts, draft_log_probs))
  num_drafts = jnp.broadcast_to(ctx.draft_len, (batch,)).astype(jnp.int32)
  return carry, Proposal(drafts=drafts, num_drafts=num_drafts, log_q=draft_log_probs)


def not_model_free(proposer: "Proposer | type[Proposer]") -> str | None:
  """Why a proposer (or proposer class) is not model-free, or None when it is: when it drafts with
  no weights, no state and no target features, what a ``Hybrid`` may use as a lookup (it calls
  lookups with ``params`` and ``state`` None). A proposer that drafts with a model
  (:attr:`Proposer.drafts_with_model`: a draft model, EAGLE, Medusa, a :class:`WrapsModel`), one that
  overrides the state methods (``init_state``, ``admit``, ``rollback``: every draft model's
  proposer does) or one that reads the target's features is not."""
  cls = proposer if isinstance(proposer, type) else type(proposer)
  if cls.drafts_with_model:
    return "drafts with a model (pass the model as Hybrid's model)"
  if any(getattr(cls, m) is not getattr(Proposer, m) for m in ("init_state", "admit", "rollback")):
    return "keeps a state"
  if cls.needs_features is not False:
    return "reads the target features"
  return None


class WrapsModel(Proposer):
  """A proposer built around a draft model's proposer (its ``model`` field, once resolved a
  ``ModelProposer`` or ``EagleProposer``), whose forwards and state it keeps: what the decode asks of
  the draft side's features, placement, costs, state and rollback is the model's
  (``Hybrid``, ``Replay``). ``model_params`` picks the model's weights out of the proposer's."""

  model: Any
  drafts_with_model = True

  def model_params(self, params: Any) -> Any:
    """The model's weights among the proposer's (default: they are the same)."""
    return params

  @property
  def needs_features(self) -> bool:
    return self.model.needs_features

  @property
  def feature_taps(self) -> tuple[int, ...]:
    return self.model.feature_taps

  @property
  def final_feature(self) -> bool:
    return self.model.final_feature

  @property
  def sharding(self):
    return self.model.sharding

  def forward_costs(self, params, batch, cache_len, max_len):
    return self.model.forward_costs(self.model_params(params), batch, cache_len, max_len)

  def tree_level_cost(self, params, batch, cache_len, shape):
    return self.model.tree_level_cost(self.model_params(params), batch, cache_len, shape)

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    return self.model.init_state(self.model_params(params), prompts, prompt_len,
                                 cache_len=cache_len, max_len=max_len, features=features,
                                 prefill_chunk=prefill_chunk)

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    return self.model.rollback(state, tokens, old_seq_len, new_seq_len)


@dataclasses.dataclass(frozen=True)
class NoProposer(Proposer):
  """The proposer of regular decoding: it never proposes, so every step of the decode is a plain
  step (the target alone, one token per row) and nothing speculative is compiled."""

  proposes = False
  always_proposes = False

  @property
  def name(self) -> str:
    return ""

  def can_propose(self, ctx: StepContext) -> jax.Array:
    del ctx
    return jnp.bool_(False)

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    raise NotImplementedError("NoProposer proposes nothing: the decode runs plain steps only")
