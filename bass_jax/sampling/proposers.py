"""The draft side of BASS as proposers: a draft model, model-free n-gram lookup, and their hybrid.

The decode loop (``bass_jax.sampling.loop``) talks to the draft side only through this interface, the
one vLLM and SGLang give their speculators (docs/bass.md, "Proposers"). A proposer is a static, hashable
description (part of the compiled program's key) whose weights, if any, travel as a separate pytree;
each step it

1. **proposes** up to ``l`` tokens per row (:class:`Proposal`: the drafts, how many of them are real
   for each row, and their per-position distributions ``q``, or None for a deterministic proposer,
   whose ``q`` is one-hot at its draft, which keeps rejection sampling exact: Leviathan et al. 2023,
   §3.5 holds for any ``q``);
2. **rolls back** after acceptance: its state is brought in line with the text each row now has.

With continuous batching the loop also restarts one row of the state on a new prompt
(:meth:`Proposer.admit`; by default :meth:`Proposer.init_state` for that row, written into it), so an
``init_state`` must take the ``prefill_chunk`` keyword (and may ignore it).

Its state (a ragged draft cache, or nothing) lives in ``DecodeState.proposer_state``. A proposer also
says whether it could propose anything at all this step (:meth:`Proposer.can_propose`): when no row
can, the loop runs a plain decoding step instead of a verification (``loop.decode``).

Implementations:

* :class:`ModelProposer`: an independent draft model, the paper's method, autoregressive over a ragged
  cache that it brings up to date (catch-up) before drafting.
* :class:`NGramProposer`: prompt lookup decoding (Saxena 2023; vLLM's ``ngram`` speculator): match the
  row's last n tokens, longest n first, against its own prompt and output so far and propose what
  followed the most recent match. No weights, no state, one-hot ``q``.
* :class:`EagleProposer`: an EAGLE-style feature draft (``bass_jax.models.eagle``) that reads the
  target's own features, which the loop keeps for it (``needs_features``).
* :class:`HybridProposer`: n-gram where a row matches, a draft model (independent or EAGLE) elsewhere.

Axes: B batch, T token buffer (prompt bucket + output bucket), L max draft length, C verification
chunk, V vocabulary, E the target's feature size.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.cache import KVCache, write_row
from bass_jax.models import eagle
from bass_jax.models.common import DecoderConfig, prefill_cache
from bass_jax.models.common import forward as model_forward
from bass_jax.sampling import costs
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.acceptance import leading_true
from bass_jax.sampling.warp import categorical, coupled_choice, first_argmax, warped_log_probs


@flax.struct.dataclass
class StepContext:
  """What a proposer may read of the decode at the start of a step.

  Attributes:
    tokens: ``i32[B, T]`` each row's prompt then its output; ``tokens[b, :seq_len[b]]`` is the text.
    seq_len: ``i32[B]`` text length per row.
    live: ``bool[B]`` rows still decoding.
    draft_len: ``i32[]`` l, the step's draft length chosen by the policy (``1 <= l <= L``).
    key: PRNG key of the proposal.
    temperature: ``f32[]``. top_p: ``f32[]``.
    features: ``[B, T, E]`` the target's feature at every text position it has scored
      (``features[b, i]`` for ``i < seq_len[b] - 1`` are valid; the rest is stale), or None unless the
      proposer ``needs_features``.
    row_keys: ``u32[B, 2]`` each row's sequence key data when acceptance is drafter-invariant
      (``acceptance="gumbel"``): a sampled draft must then be drawn with :meth:`draw`, which uses the
      noise the target will use at the same text position; None for rejection sampling.
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

  def draw(self, log_q: jax.Array, i) -> jax.Array:
    """Draws draft ``i`` (0-based: the token at text position ``seq_len + i``) of every row from its
    warped ``log_q: f32[B, V]`` -> ``i32[B]`` indices into ``log_q``'s last axis.

    Rejection sampling: an independent draw keyed by ``fold_in(key, i)``. Drafter-invariant acceptance
    (``row_keys`` set): the Gumbel-max draw with the row's noise at that text position
    (``warp.coupled_choice``), which must then range over the target's whole vocabulary.
    """
    if self.row_keys is None:
      return categorical(jax.random.fold_in(self.key, i), log_q)
    return coupled_choice(log_q, self.row_keys, self.seq_len + i)


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
  """

  drafts: jax.Array
  num_drafts: jax.Array
  log_q: jax.Array | None


class Proposer(abc.ABC):
  """A static, hashable draft-side strategy (subclasses are frozen dataclasses)."""

  @property
  def name(self) -> str:
    """A short description for logs and result files."""
    return type(self).__name__

  # Static: True when the proposer reads the target's features (``StepContext.features``); the loop then
  # keeps a feature buffer, written by every target forward.
  needs_features = False
  # Static: the draft model's placement on a mesh (``bass_jax.sharding.ShardingPlan``); None on one device
  # or without a model.
  sharding = None

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

  def admit(self, params: Any, state: Any, row: jax.Array, prompt: jax.Array, prompt_len: jax.Array,
            *, cache_len: int, max_len: int, features: jax.Array | None = None,
            prefill_chunk: int | None = None) -> Any:
    """The state with row ``row`` restarted on a new prompt (continuous batching, ``loop.decode``): the
    other rows are untouched.

    The default builds :meth:`init_state` for the one row and writes it into ``row``
    (``bass_jax.cache.write_row``): per-row leaves (batch-leading) are replaced, scalar leaves, which
    are the batch's, kept. A proposer whose state holds more than that overrides it.

    Args:
      row: ``i32[]``. prompt: ``i32[1, P]`` right-padded. prompt_len: ``i32[1]``.
      features: ``[1, P, E]`` the target's features over the prompt (when ``needs_features``).
      prefill_chunk: as in :meth:`init_state`.
    """
    fresh = self.init_state(params, prompt, prompt_len, cache_len=cache_len, max_len=max_len,
                            features=features, prefill_chunk=prefill_chunk)
    return write_row(state, fresh, row)

  def forward_costs(self, params: Any, batch: int, cache_len: int, max_len: int) -> tuple[float, float]:
    """Measured seconds of the proposer's first forward of a step (catch-up and first draft) and of each
    further draft, at ``batch`` rows (``bass_jax.sampling.costs``; default 0, 0: no forward)."""
    del params, batch, cache_len, max_len
    return 0.0, 0.0

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
    node 0 the row's last token. Every node must be a deterministic function of the draft's state
    (one-hot ``q``), so that tree acceptance is exact at every temperature.

    The default is the proposer's own chain (:meth:`propose`, greedy, ``shape.nodes - 1`` drafts at
    most) as a tree, with unused nodes as padding; draft models override it with EAGLE-2's growth.
    The state's rollback after a tree step is :meth:`rollback`, as after a chain.
    """
    ctx = ctx.replace(draft_len=jnp.asarray(shape.nodes - 1, jnp.int32))
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
    ``f32[B, L + C, V]`` when sampling.
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

  carry, drafts, draft_log_probs = jax.lax.fori_loop(1, ctx.draft_len, body,
                                                     (carry, drafts, draft_log_probs))
  num_drafts = jnp.broadcast_to(ctx.draft_len, (batch,)).astype(jnp.int32)
  return carry, Proposal(drafts=drafts, num_drafts=num_drafts, log_q=draft_log_probs)


# -- draft model ---------------------------------------------------------------------------------------


@flax.struct.dataclass
class DraftCacheState:
  """A draft model's state: its ragged cache and the drafts it fed itself in the last step.

  Attributes:
    cache: the draft's KV cache; ``cache.lengths[b]`` tokens of row b's text are in it.
    fed: ``i32[B, L]`` the drafts whose K/V the last proposal wrote (``d_1 … d_{l-1}``; the last draft
      is never fed), for the rollback, at text positions from the step's ``old_seq_len`` on.
    num_fed: ``i32[]`` how many of ``fed`` were written.
  """

  cache: KVCache
  fed: jax.Array
  num_fed: jax.Array


@dataclasses.dataclass(frozen=True)
class ModelProposer(Proposer):
  """An independent draft model sharing the target's tokenizer (BASS, §3; the paper's method).

  Each step first brings the draft's cache up to the row's text (the 1 or 2 tokens emitted since it
  last saw the text; more after plain decoding steps, two at a time), then drafts ``l`` tokens
  autoregressively, sampling from its own warped distribution (argmax when greedy). After acceptance
  its cache keeps the longest prefix of what it consumed that the text confirms.

  Attributes:
    config: the draft's architecture. dtype: its parameter/compute dtype name.
    attention_impl: attention implementation name (``bass_jax.models.attention``).
    sharding: the draft's placement on a mesh (``bass_jax.sharding.ShardingPlan``), or None.
  """

  config: DecoderConfig
  dtype: str
  attention_impl: str = "reference"
  sharding: Any = None

  @property
  def name(self) -> str:
    return f"model({self.config.num_layers} layers)"

  def forward_costs(self, params, batch, cache_len, max_len):
    del max_len
    forward = functools.partial(costs.time_forward, self.config, self.dtype, self.attention_impl,
                                params, batch, cache_len=cache_len, sharding=self.sharding)
    return forward(positions=2), forward(positions=1)

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    del features
    batch = prompts.shape[0]
    cache = prefill_cache(self.config, params, prompts, prompt_len, cache_len=cache_len,
                          dtype=self.dtype, attention_impl=self.attention_impl,
                          sharding=self.sharding, chunk=prefill_chunk)
    return DraftCacheState(cache=cache, fed=jnp.zeros((batch, max_len), jnp.int32),
                           num_fed=jnp.zeros((), jnp.int32))

  def _forward(self, params):
    return functools.partial(model_forward, self.config, params, dtype=self.dtype,
                             attention_impl=self.attention_impl, sharding=self.sharding)

  def _catch_up(self, params, state, ctx):
    """The draft's cache brought up to each row's whole text, and its logits ``f32[B, V]`` for the
    token after it."""
    batch = ctx.tokens.shape[0]
    rows = jnp.arange(batch)
    last_slot = ctx.tokens.shape[1] - 1
    forward = self._forward(params)

    def window(lengths):  # the two text tokens at lengths, lengths + 1 (clipped to the buffer)
      return ctx.tokens[rows[:, None], jnp.minimum(lengths[:, None] + jnp.arange(2), last_slot)]

    # Catch up two tokens at a time while some row lags by more than two (only after plain decoding
    # steps or a hybrid step); a row that lags less rewrites K/V it already has, identically.
    def catch_up(cache):
      _, cache = forward(window(cache.lengths), cache)
      pending = ctx.seq_len - (cache.lengths - 2)
      return cache.with_lengths(jnp.where(pending > 2, cache.lengths, cache.lengths - 2))

    cache = jax.lax.while_loop(lambda c: jnp.any(ctx.live & (ctx.seq_len - c.lengths > 2)),
                               catch_up, state.cache)
    # The last 1 or 2 pending tokens; the first proposal comes from the logits of the last one. With 1
    # pending token the second input is a stale slot whose K/V lands past the row's length and is
    # overwritten by the first draft.
    pending = jnp.clip(ctx.seq_len - cache.lengths, 1, 2)
    logits, cache = forward(window(cache.lengths), cache)
    return cache.with_lengths(ctx.seq_len), logits[rows, pending - 1]

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    forward = self._forward(params)
    cache, logits = self._catch_up(params, state, ctx)

    def draw(logits, i):  # draft i: token i32[B] and its q f32[B, V] (None when greedy)
      if greedy:
        return first_argmax(logits), None
      log_q = warped_log_probs(logits, ctx.temperature, ctx.top_p)
      return ctx.draw(log_q, i), log_q

    def step(cache, previous, i):
      logits, cache = forward(previous, cache)
      return (cache, *draw(logits[:, 0], i))

    cache, proposal = draft_autoregressively(
        step, cache, draw(logits, 0), ctx,
        max_len=max_len, chunk=chunk, vocab_size=self.config.vocab_size)
    return DraftCacheState(cache=cache, fed=proposal.drafts, num_fed=ctx.draft_len - 1), proposal

  def propose_tree(self, params, state, ctx, *, shape, prior=None):
    """EAGLE-2's growth (``tree.grow_tree``) with this model: each level is one forward of the
    expanded nodes under their ancestor mask. Nothing drafted stays in the cache: the rollback keeps
    the text, and the next catch-up feeds the accepted tokens. ``prior``: a hybrid's chain, ranked
    first (``grow_tree``'s)."""
    forward = self._forward(params)
    cache, logits = self._catch_up(params, state, ctx)

    def expand(cache, tokens, parent, mask):
      del parent  # the mask says it all
      logits, cache = forward(tokens, cache, tree_mask=mask)
      return cache, jax.nn.log_softmax(logits, axis=-1)

    last = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    cache, tree = tree_lib.grow_tree(last, jax.nn.log_softmax(logits, axis=-1), expand, cache, shape,
                                     prior=prior)
    return state.replace(cache=cache.with_lengths(ctx.seq_len),
                         num_fed=jnp.zeros((), jnp.int32)), tree

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    # The step's proposal wrote K/V of fed[:, :num_fed] at old_seq_len…; keep those the text confirms.
    rows = jnp.arange(tokens.shape[0])
    width = state.fed.shape[1]
    slots = jnp.arange(width)
    pos = jnp.minimum(old_seq_len[:, None] + slots, tokens.shape[1] - 1)
    confirmed = ((tokens[rows[:, None], pos] == state.fed) & (slots < state.num_fed)
                 & (old_seq_len[:, None] + slots < new_seq_len[:, None]))
    kept = old_seq_len + leading_true(confirmed)
    return state.replace(cache=state.cache.with_lengths(jnp.minimum(state.cache.lengths, kept)),
                         num_fed=jnp.zeros((), jnp.int32))


# -- EAGLE feature draft -------------------------------------------------------------------------------


@flax.struct.dataclass
class EagleState:
  """An EAGLE draft's state: its ragged cache.

  Attributes:
    cache: the draft's KV cache over pairs ``(f_i, x_{i+1})``; between steps ``cache.lengths[b]`` is
      ``seq_len[b] - 1`` of the step before, the pairs of the text whose features the target had then
      computed. A step's own drafted pairs (read with the draft's predicted features) are dropped by the
      rollback and replaced by the catch-up, which reads the target's true features.
  """

  cache: KVCache


@dataclasses.dataclass(frozen=True)
class EagleProposer(Proposer):
  """An EAGLE-style feature draft (Li et al. 2024, §3; ``bass_jax.models.eagle``).

  Each step, for every row:

  1. **catch-up**: the pairs ``(f_i, x_{i+1})`` the text gained since the last step (a step that
     accepted a drafts adds a + 1), with the target's true features (``StepContext.features``), in one
     forward of ``W = min(L + 1, catch_up_width)`` positions; a row that lags by more (after a long
     acceptance or plain decoding steps) first takes forwards of W pairs in a loop. The last forward
     ends at the row's last pair (re-feeding already cached pairs, identically, when fewer are new), so
     that every row has the prediction ``f̂_{n-1}`` of its next position (n = ``seq_len``);
  2. **drafting**: ``d_1`` from the head on ``f̂_{n-1}``; then the pair ``(f̂_{n-1}, d_1)`` gives
     ``f̂_n`` and ``d_2``, and so on, ``l`` drafts per row, sampled from the draft's own warped
     distribution (0 outside its draft vocabulary; argmax when greedy);
  3. **rollback**: the cache goes back to the text's pairs (``old_seq_len - 1``); the next catch-up
     rewrites the accepted positions with the target's features, as EAGLE does.

  A one-token prompt has no pair before its first step; its first proposal reads a stale pair (and is
  verified like any other, so the output stays exact).

  Attributes:
    config: the draft's architecture (:class:`eagle.EagleConfig`). dtype: its compute dtype name.
    attention_impl: attention implementation name (``bass_jax.models.attention``).
    catch_up_width: the most pairs one catch-up forward takes (W above); each step pays one forward
      of W positions, so it trades that cost against extra forwards after long acceptances.
    sharding: the draft's placement on a mesh (``bass_jax.sharding.ShardingPlan``), or None.
  """

  config: eagle.EagleConfig
  dtype: str
  attention_impl: str = "reference"
  catch_up_width: int = 5
  sharding: Any = None
  needs_features = True

  def __post_init__(self):
    if self.config.fused_layers:
      raise ValueError(
          f"EagleProposer: a draft with fused_layers {self.config.fused_layers} (EAGLE-3) reads hidden "
          "states the decode loop does not carry; it is trained and measured offline only "
          "(docs/draft.md, 'Fused features'). Use a draft without fused_layers.")

  @property
  def name(self) -> str:
    return f"eagle({self.config.num_layers} layer, V'={self.config.draft_vocab_size})"

  def _forward(self, params, tokens, features, cache, tree_mask=None):
    return eagle.forward(self.config, params, tokens, features, cache, dtype=self.dtype,
                         attention_impl=self.attention_impl, sharding=self.sharding,
                         tree_mask=tree_mask)

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    del max_len, prefill_chunk  # one layer: a pass over all P pairs costs little
    if features is None:
      raise ValueError("EagleProposer.init_state needs the target's prompt features")
    cache = self.config.init_cache(prompts.shape[0], cache_len, jnp.dtype(self.dtype))
    if prompts.shape[1] > 1:  # pairs (f_i, x_{i+1}), i = 0 … P - 2
      _, update = self._forward(params, prompts[:, 1:], features[:, :-1], None)
      cache = cache.append(update)
    return EagleState(cache=cache.with_lengths(jnp.maximum(prompt_len - 1, 0)))

  def forward_costs(self, params, batch, cache_len, max_len):
    e = self.config.feature_size

    def run(params, tokens, cache):  # pairs with placeholder features, and the head on the last one
      features = jnp.ones(tokens.shape + (e,), jnp.dtype(self.dtype))
      predicted, cache = self._forward(params, tokens, features, cache)
      return eagle.draft_logits(params, predicted[:, -1]), cache

    timed = lambda positions: costs.time_cached_forward(
        run, params, costs.half_full_cache(self.config, batch, cache_len, self.dtype), positions)
    return timed(min(max_len + 1, self.catch_up_width)), timed(1)

  def _catch_up(self, params, state, ctx, max_len):
    """The draft's cache over every pair of the text (the target's features), and the predicted
    feature ``f̂_{n-1}: [B, E]`` of each row's next position (step 1 of the class docstring)."""
    batch, width = ctx.tokens.shape
    rows = jnp.arange(batch)[:, None]
    window = min(max_len + 1, self.catch_up_width)

    def pairs(start):  # tokens x_{i+1} and features f_i for i = start … start + window - 1
      i = start[:, None] + jnp.arange(window)
      return (ctx.tokens[rows, jnp.clip(i + 1, 0, width - 1)],
              ctx.features[rows, jnp.clip(i, 0, width - 1)])

    def catch_up(cache):
      _, cache = self._forward(params, *pairs(cache.lengths), cache)
      behind = ctx.seq_len - 1 - (cache.lengths - window) > window
      return cache.with_lengths(jnp.where(behind, cache.lengths, cache.lengths - window))

    cache = jax.lax.while_loop(
        lambda c: jnp.any(ctx.live & (ctx.seq_len - 1 - c.lengths > window)), catch_up,
        state.cache)
    # The last window ends at the row's last pair, n - 2, and re-feeds at least that one.
    start = jnp.maximum(jnp.minimum(cache.lengths, ctx.seq_len - 2), 0)
    predicted, cache = self._forward(params, *pairs(start), cache.with_lengths(start))
    last = jnp.clip(ctx.seq_len - 2 - start, 0, window - 1)
    feature = predicted[rows[:, 0], last]  # f̂_{n-1}: [B, E]
    return cache.with_lengths(jnp.maximum(ctx.seq_len - 1, 0)), feature

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    vocab_ids = params["vocab_ids"]
    cache, feature = self._catch_up(params, state, ctx, max_len)

    def draw(feature, i):  # draft i: token i32[B] in the full vocabulary; its q as f32[B, V] (sampled)
      logits = eagle.draft_logits(params, feature)
      if greedy:
        return vocab_ids[first_argmax(logits)], None
      log_q = warped_log_probs(logits, ctx.temperature, ctx.top_p)  # over the draft vocabulary
      full = eagle.to_full_vocab(log_q, vocab_ids, self.config.vocab_size)
      if ctx.row_keys is None:
        return vocab_ids[ctx.draw(log_q, i)], full
      return ctx.draw(full, i), full  # coupled: the target's noise is indexed by full-vocabulary id

    def step(carry, previous, i):  # the pair (f̂ of the last draft, the last draft) -> next draft
      cache, feature = carry
      predicted, cache = self._forward(params, previous, feature[:, None], cache)
      return ((cache, predicted[:, 0]), *draw(predicted[:, 0], i))

    (cache, _), proposal = draft_autoregressively(
        step, (cache, feature), draw(feature, 0), ctx,
        max_len=max_len, chunk=chunk, vocab_size=self.config.vocab_size)
    return EagleState(cache=cache), proposal

  def propose_tree(self, params, state, ctx, *, shape, prior=None):
    """EAGLE-2's growth (``tree.grow_tree``): each level forwards the pairs ``(f̂ of the parent,
    token)`` of its expanded nodes under their ancestor mask, whose predicted features score their
    children and feed the next level. The rollback drops every drafted pair, as after a chain.
    ``prior``: a hybrid's chain, ranked first (``grow_tree``'s)."""
    cache, feature = self._catch_up(params, state, ctx, shape.depth)

    def expand(carry, tokens, parent, mask):
      cache, parent_features = carry  # [B, k or 1, E]: the previous level's predictions
      features = jnp.take_along_axis(parent_features, parent[..., None], axis=1)
      predicted, cache = self._forward(params, tokens, features, cache, tree_mask=mask)
      return (cache, predicted), jax.nn.log_softmax(eagle.draft_logits(params, predicted), axis=-1)

    last = ctx.tokens[jnp.arange(ctx.tokens.shape[0]), ctx.seq_len - 1]
    first = jax.nn.log_softmax(eagle.draft_logits(params, feature), axis=-1)
    (cache, _), tree = tree_lib.grow_tree(last, first, expand, (cache, feature[:, None]), shape,
                                          token_of=lambda ids: params["vocab_ids"][ids], prior=prior)
    return EagleState(cache=cache), tree

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    del tokens, new_seq_len
    return EagleState(cache=state.cache.with_lengths(jnp.maximum(old_seq_len - 1, 0)))


# -- n-gram (prompt lookup) -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NGramProposer(Proposer):
  """Prompt lookup decoding: propose what followed the most recent earlier occurrence of the row's last
  n tokens in its own prompt and output, trying ``n = max_n`` down to ``min_n``.

  Deterministic (one-hot ``q``), so rejection sampling stays exact at any temperature. A row whose last
  ``min_n`` tokens occur nowhere earlier proposes nothing (``num_drafts = 0``): inside a verification
  it is a plain decoding step for that row, and when no live row matches the loop runs a plain
  decoding step (one target position per row) instead of a verification. A match proposes at most
  ``l`` tokens and never more than the text holds after it.

  Attributes:
    max_n: the longest suffix tried (>= min_n). min_n: the shortest (>= 1).

  Raises:
    ValueError: from the constructor, unless ``1 <= min_n <= max_n``.
  """

  max_n: int = 4
  min_n: int = 2
  always_proposes = False

  def __post_init__(self):
    object.__setattr__(self, "max_n", _checks.as_int("NGramProposer.max_n", self.max_n, min_value=1))
    object.__setattr__(self, "min_n", _checks.as_int("NGramProposer.min_n", self.min_n, min_value=1))
    if self.min_n > self.max_n:
      raise ValueError(f"NGramProposer needs min_n <= max_n, got min_n={self.min_n}, "
                       f"max_n={self.max_n}")

  @property
  def name(self) -> str:
    return f"ngram({self.max_n}-{self.min_n})"

  def lookup(self, tokens: jax.Array, seq_len: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Finds each row's continuation.

    Args:
      tokens: ``i32[B, T]``. seq_len: ``i32[B]``.

    Returns:
      ``(start i32[B], available i32[B])``: the proposal is ``tokens[b, start : start + available]``
      (``available = 0`` where no suffix of length ``min_n … max_n`` occurs earlier).
    """
    batch, width = tokens.shape
    rows = jnp.arange(batch)[:, None]
    starts = jnp.arange(width)[None, :]
    found = jnp.zeros((batch,), bool)
    start = jnp.zeros((batch,), jnp.int32)
    for n in range(self.max_n, self.min_n - 1, -1):
      suffix = tokens[rows, jnp.clip(seq_len[:, None] - n + jnp.arange(n), 0, width - 1)]  # [B, n]
      match = jnp.ones((batch, width), bool)
      for i in range(n):
        shifted = jnp.pad(tokens[:, i:], ((0, 0), (0, i)), constant_values=-1)  # tokens[b, j + i]
        match &= shifted == suffix[:, i:i + 1]
      # An occurrence at j must end before the suffix starts' continuation: j + n < seq_len, j + n is
      # then a known token; j = seq_len - n is the suffix itself and is excluded.
      match &= (starts + n < seq_len[:, None]) & (seq_len[:, None] >= n + 1)
      last = jnp.max(jnp.where(match, starts, -1), axis=1)
      hit = ~found & (last >= 0)
      start = jnp.where(hit, last + n, start)
      found |= hit
    available = jnp.where(found, seq_len - start, 0)
    return start, available

  def can_propose(self, ctx):
    _, available = self.lookup(ctx.tokens, ctx.seq_len)
    return jnp.any(ctx.live & (available > 0))

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    del params, chunk, greedy
    start, available = self.lookup(ctx.tokens, ctx.seq_len)
    rows = jnp.arange(ctx.tokens.shape[0])[:, None]
    pos = jnp.minimum(start[:, None] + jnp.arange(max_len), ctx.tokens.shape[1] - 1)
    num_drafts = jnp.minimum(available, ctx.draft_len).astype(jnp.int32)
    drafts = jnp.where(jnp.arange(max_len) < num_drafts[:, None], ctx.tokens[rows, pos], 0)
    return state, Proposal(drafts=drafts.astype(jnp.int32), num_drafts=num_drafts, log_q=None)


# -- hybrid ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HybridProposer(Proposer):
  """N-gram lookup where a row matches, the draft model elsewhere (per row, every step).

  The draft model runs every step (its cost is paid whatever matches), so the hybrid gains over the
  model alone where n-gram continuations are accepted longer, e.g. in code that repeats its own
  identifiers. Rows that took n-gram drafts keep only the draft-model K/V the text confirms.

  Attributes:
    ngram: the lookup. model: the draft model (independent or EAGLE).
  """

  ngram: NGramProposer
  model: "ModelProposer | EagleProposer"

  @property
  def name(self) -> str:
    return f"hybrid({self.ngram.name}, {self.model.name})"

  @property
  def needs_features(self) -> bool:
    return self.model.needs_features

  @property
  def sharding(self):
    return self.model.sharding

  def forward_costs(self, params, batch, cache_len, max_len):
    return self.model.forward_costs(params, batch, cache_len, max_len)

  def init_state(self, params, prompts, prompt_len, *, cache_len, max_len, features=None,
                 prefill_chunk=None):
    return self.model.init_state(params, prompts, prompt_len, cache_len=cache_len, max_len=max_len,
                                 features=features, prefill_chunk=prefill_chunk)

  def propose(self, params, state, ctx, *, max_len, chunk, greedy):
    state, by_model = self.model.propose(params, state, ctx, max_len=max_len, chunk=chunk,
                                         greedy=greedy)
    _, by_ngram = self.ngram.propose(None, None, ctx, max_len=max_len, chunk=chunk, greedy=greedy)
    use_ngram = by_ngram.num_drafts > 0
    drafts = jnp.where(use_ngram[:, None], by_ngram.drafts, by_model.drafts)
    num_drafts = jnp.where(use_ngram, by_ngram.num_drafts, by_model.num_drafts)
    log_q = by_model.log_q
    if log_q is not None:  # one-hot q for the n-gram rows
      padded = jnp.pad(drafts, ((0, 0), (0, log_q.shape[1] - max_len)))
      one_hot = jnp.where(jnp.arange(log_q.shape[2]) == padded[..., None], 0.0, -jnp.inf)
      log_q = jnp.where(use_ngram[:, None, None], one_hot, log_q)
    return state, Proposal(drafts=drafts, num_drafts=num_drafts, log_q=log_q)

  def propose_tree(self, params, state, ctx, *, shape):
    """One tree per row: the row's n-gram continuation (if any) as a chain from the root, kept whole,
    and the model's best EAGLE-2 nodes in the rest (``tree.grow_tree``'s ``prior``)."""
    width = min(shape.nodes - 1, shape.depth)
    _, chain = self.ngram.propose(None, None, ctx.replace(draft_len=jnp.asarray(width, jnp.int32)),
                                  max_len=width, chunk=1, greedy=True)
    return self.model.propose_tree(params, state, ctx, shape=shape,
                                   prior=(chain.drafts, chain.num_drafts))

  def rollback(self, state, tokens, old_seq_len, new_seq_len):
    return self.model.rollback(state, tokens, old_seq_len, new_seq_len)
