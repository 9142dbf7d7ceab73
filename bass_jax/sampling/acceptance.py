"""Acceptance of a step's drafts, per row: the acceptance rule protocol (:class:`AcceptanceRule`,
one entry point :meth:`AcceptanceRule.accept` over a :class:`tree.DraftTree` of drafts per row), the
built-in rules (:class:`Greedy`, :class:`Rejection`, :class:`Gumbel`; :class:`MatchingRule` for
rules whose target token at each node is its own choice) and the registry of the names a decode
takes (:func:`register_acceptance`, :func:`acceptance_rule`). A chain is the tree ``parents[i] = i -
1`` (``tree.chain_tree``); a plain step is the tree of its root alone.

Implements step 3 of BASS (docs/bass.md, "One step for the whole batch"), i.e. Leviathan et al. 2023
(Algorithm 1) and Chen et al. 2023 (Algorithm 2), independently for every row of a batch: draft token
``d_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))`` in order until the first rejection;
at the first rejection position ``n`` one token is drawn from ``norm(max(0, p_n - q_n))``; if all ``l``
drafts are accepted a bonus token is drawn from ``p_l``. With ``q_l := 0`` the correction and the bonus
are the same draw, which is how it is coded. On trees, SpecInfer's multi-step speculative sampling
(Miao et al. 2024) and EAGLE-2's walk (Li et al. 2024). Gumbel acceptance (``acceptance="gumbel"``) is
drafter-invariant speculative decoding (Daliri, Musco and Suresh 2024): the target's token at each text
position is its own Gumbel-max draw with per-sequence, per-position noise, and a draft is accepted when
it equals it: exact too, and the tokens do not depend on the draft.

How a tree is checked. A chain (``DraftTree.chain``, static) is checked at all its nodes at once
(a cumulative product over the matches); the decode's chunked verification (``step``) calls the rule
once per chunk of C positions, the chunk being the chain of its C + 1 nodes from ``DraftTree.first``,
and stops once every row has rejected. Any other tree is walked from the root: at the current node u
the rule tries u's children in index order, moves to the first one it accepts and repeats; when no
child of u is accepted (or u has none) it emits ``next_token`` from u. Since a child's index exceeds
its parent's, that walk is one scan over nodes ``1 .. N - 1`` in index order (:func:`_walk`), trying
node c iff its parent is the current node when the scan reaches it: the siblings tried before c have
smaller indices and c's children come after c, so the scan tries exactly the nodes of a level-by-level
walk, in order. Every random decision is keyed by its node's index in the whole tree (and its row),
never by the organization of the check, so a chain accepted as a chain, in chunks or as a walked tree
makes the very same draws (``tests/test_tree_acceptance.py``).

Axes: B batch, N nodes per row (node 0 the root: the last emitted token), V vocabulary.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.sampling import warp
from bass_jax.sampling.tree import DraftTree, TreeAcceptance, node_depths

@dataclasses.dataclass(frozen=True)
class AcceptanceRule(abc.ABC):
  """How a row's drafts are accepted and its next token drawn: the acceptance rule protocol.

  A rule is a frozen dataclass (static: part of the compiled program's key) with one entry point,
  :meth:`accept`, which sees every row's drafts as a :class:`tree.DraftTree` (a chain, a chunk of one,
  a token tree, or the root alone for a plain step) and the target's logits at its nodes. The built-in
  rules: :class:`Greedy` (temperature 0), :class:`Rejection` (speculative rejection sampling, the
  paper's) and :class:`Gumbel` (drafter-invariant Gumbel acceptance). A rule whose target token at
  every node is a fixed function of that node's law (and of the row's keys) subclasses
  :class:`MatchingRule` and writes only :meth:`MatchingRule.choose`. A new rule registers its name with
  :func:`register_acceptance`, or is passed as an instance (``generate(acceptance=MyRule())``;
  docs/extending.md, "Your own acceptance rule").

  **Exactness** is the rule's to keep: the tokens a row emits must follow the target's warped law
  whatever the drafts. ``tests/test_sampling_exact.py``'s chi-square test checks the built-in rules,
  ``tests/test_extending.py`` the documented user rule.

  Attributes:
    branch_free: the warp finds the nucleus with one sort per row, no device-side loop
      (``bass_jax.profiles``); set by the decode from its backend profile.
    keyed: class-level; True when the rule reads per-sequence keys: the decode then gives every
      sequence the key data ``fold_in(key(seed), sequence_id)`` (``warp.sequence_keys``), which
      :meth:`accept` and :meth:`draw_draft` receive as ``row_keys`` (else None).
    greedy: class-level; True only for :class:`Greedy`.
  """

  branch_free: bool = False
  keyed: ClassVar[bool] = False
  greedy: ClassVar[bool] = False

  @property
  def name(self) -> str:
    """The registered name of the rule's class (:func:`register_acceptance`), else its class name."""
    for name, cls in _RULES.items():
      if cls is type(self):
        return name
    return type(self).__name__

  def warp(self, logits: jax.Array, temperature: jax.Array, top_p: jax.Array | None) -> jax.Array:
    """``warp.warped_log_probs`` of ``logits: f32[..., V]`` (branch-free as the rule says)."""
    return warp.warped_log_probs(logits, temperature, top_p, branch_free=self.branch_free)

  @abc.abstractmethod
  def accept(self, tree: DraftTree, logits: jax.Array, *, temperature: jax.Array | None = None,
             top_p: jax.Array | None = None, key: jax.Array | None = None,
             draft_log_probs: jax.Array | None = None, row_keys: jax.Array | None = None,
             seq_len: jax.Array | None = None) -> TreeAcceptance:
    """Accepts one root-to-node path per row and draws the token after it.

    Every random decision must be keyed by its node's index in the whole tree (``tree.first + u``)
    or its text position, never by how the check is organized: the decode checks a chain in chunks
    and must make the draws a whole check would (module docstring).

    Args:
      tree: the drafts (node 0 the root). A chain may come with one position fewer of ``logits``
        than nodes (a chunk whose last node the next chunk scores): a row that accepts all its
        nodes then has no ``next_token`` (garbage; its verification goes on).
      logits: ``f32[B, N, V]`` (or ``[B, N - 1, V]`` for a chain) the target's raw logits at each
        node, for the token after the node's path.
      temperature: ``f32[]`` > 0, and top_p: ``f32[]`` in (0, 1) or None (no nucleus): the warp of
        sampled rules (:meth:`warp`). Unused when greedy.
      key: PRNG key of the step's acceptance (the same for every chunk of a step).
      draft_log_probs: None for deterministic drafts (one-hot ``q``), or ``f32[B, N, V]`` warped
        ``log q_u`` at each node that has children.
      row_keys: ``u32[B, 2]`` each row's sequence key data for a :attr:`keyed` rule, else None.
      seq_len: ``i32[B]`` the rows' text lengths, root included: node u's token is at text position
        ``seq_len + tree.first + depth(u)``.

    Returns:
      :class:`tree.TreeAcceptance`: the row emits ``tokens[path[1 : num_accepted + 1]]`` and then
      ``next_token``.
    """

  def draw_draft(self, log_q: jax.Array, *, key: jax.Array, row_keys: jax.Array | None,
                 positions: jax.Array) -> jax.Array:
    """How a proposer draws a sampled draft under this rule (``StepContext.draw``).

    Args:
      log_q: ``f32[B, V]`` the draft's warped log-probabilities.
      key: the draw's own PRNG key (``fold_in(step key, draft index)``).
      row_keys: ``u32[B, 2]`` the rows' sequence key data for a :attr:`keyed` rule, else None.
      positions: ``i32[B]`` the draft's text position in each row.

    Returns:
      ``i32[B]`` tokens. The default is an independent draw with ``key``; a keyed rule may couple
      the draft to the target's own draw at the same text position.
    """
    del row_keys, positions
    return warp.categorical(key, log_q)


@dataclasses.dataclass(frozen=True)
class MatchingRule(AcceptanceRule):
  """A rule under which the target's token at each node is its own choice, a function of that node's
  warped law, the row's keys and the node's text position (:meth:`choose`): a draft is accepted when
  it equals the choice at its parent, and the row emits the choice where it stops. Exact when
  ``choose`` is a draw from the law it is given, independent across positions given the text; the
  emitted tokens then do not depend on the draft at all (drafter invariance). A keyed matching rule
  draws sampled drafts with the same ``choose`` at the same position, which couples them to the
  target's draws."""

  @abc.abstractmethod
  def choose(self, log_probs: jax.Array, row_keys: jax.Array | None,
             positions: jax.Array | None) -> jax.Array:
    """Its only randomness is what ``row_keys`` and ``positions`` give it (the step's ``key`` is not
    passed), so a sampled matching rule must be :attr:`keyed`; an unkeyed one is refused for sampling.

    The token chosen from ``log_probs: f32[B, V]`` or ``f32[B, C, V]`` (warped, ``-inf`` outside
    the nucleus) at text ``positions: i32[B]`` or ``i32[B, C]`` of rows keyed by ``row_keys: u32[B,
    2]`` (None unless :attr:`keyed`; positions None when the caller gave no ``seq_len``) ->
    ``i32[B]`` or ``i32[B, C]``."""

  def accept(self, tree: DraftTree, logits: jax.Array, *, temperature: jax.Array | None = None,
             top_p: jax.Array | None = None, key: jax.Array | None = None,
             draft_log_probs: jax.Array | None = None, row_keys: jax.Array | None = None,
             seq_len: jax.Array | None = None) -> TreeAcceptance:
    """:meth:`AcceptanceRule.accept` by matching: ``key`` and ``draft_log_probs`` are not read."""
    del key, draft_log_probs
    plain = tree.tokens.shape[1] == 1
    log_probs = self.warp(logits[:, 0] if plain else logits, temperature, top_p)
    positions = None
    if seq_len is not None and plain:
      positions = seq_len + tree.first
    elif seq_len is not None:
      depths = (jnp.arange(tree.tokens.shape[1])[None, :] if tree.chain else node_depths(tree))
      positions = seq_len[:, None] + tree.first + depths[:, :logits.shape[1]]
    chosen = self.choose(log_probs, row_keys, positions)
    if plain:
      return _root_only(chosen)
    return _match_chain(tree, chosen) if tree.chain else _match_tree(tree, chosen)

  def draw_draft(self, log_q: jax.Array, *, key: jax.Array, row_keys: jax.Array | None,
                 positions: jax.Array) -> jax.Array:
    """A keyed rule's draft is its own :meth:`choose` at the draft's text position (coupled to the
    target's draw there); an unkeyed rule's an independent draw."""
    if self.keyed:
      return self.choose(log_q, row_keys, positions)
    return super().draw_draft(log_q, key=key, row_keys=row_keys, positions=positions)


@dataclasses.dataclass(frozen=True)
class Greedy(MatchingRule):
  """Temperature 0: the target's token is its argmax (the first on ties), drafts accepted while they
  equal it; the logits are not warped."""

  greedy: ClassVar[bool] = True

  def warp(self, logits, temperature, top_p):
    """The raw ``logits`` (temperature 0 has no warp)."""
    del temperature, top_p
    return logits

  def choose(self, log_probs, row_keys, positions):
    """The first argmax of the raw logits, ``f32[..., V] -> i32[...]``."""
    del row_keys, positions
    return warp.first_argmax(log_probs)


@dataclasses.dataclass(frozen=True)
class Rejection(AcceptanceRule):
  """Speculative rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm
  2), on trees SpecInfer's multi-step speculative sampling: a draft ``d`` is accepted with probability
  ``min(1, p(d) / q(d))``, a rejection emits a draw from ``norm(max(0, p - q))``. The highest
  acceptance of the exact rules (``1 - TV(p, q)`` per position)."""

  def accept(self, tree: DraftTree, logits: jax.Array, *, temperature: jax.Array | None = None,
             top_p: jax.Array | None = None, key: jax.Array | None = None,
             draft_log_probs: jax.Array | None = None, row_keys: jax.Array | None = None,
             seq_len: jax.Array | None = None) -> TreeAcceptance:
    """:meth:`AcceptanceRule.accept` by rejection sampling (:func:`_rejection_chain`,
    :func:`_rejection_tree`); ``row_keys`` and ``seq_len`` are not read."""
    del row_keys, seq_len
    if tree.tokens.shape[1] == 1:  # a plain step: a draw from the warped law at the root
      return _root_only(warp.categorical(key, self.warp(logits[:, 0], temperature, top_p)))
    log_p = self.warp(logits, temperature, top_p)
    if tree.chain:
      return _rejection_chain(key, tree, log_p, draft_log_probs)
    return _rejection_tree(key, tree, log_p, draft_log_probs)


@dataclasses.dataclass(frozen=True)
class Gumbel(MatchingRule):
  """Gumbel acceptance, i.e. drafter-invariant speculative decoding (Daliri, Musco and Suresh 2024):
  the target's token at text position ``t`` is its Gumbel-max draw with noise keyed by the sequence
  and ``t`` (``warp.gumbel_choice``), so a sequence's tokens depend only on the seed, its sequence id
  and the target. A model draft drawn with the same noise is accepted somewhat less often than under
  :class:`Rejection`: at worst ``(1 - TV) / (1 + TV)`` instead of ``1 - TV``."""

  keyed: ClassVar[bool] = True

  def choose(self, log_probs, row_keys, positions):
    """The Gumbel-max draw with the row's noise at each text position (``warp.gumbel_choice``)."""
    return warp.gumbel_choice(log_probs, row_keys, positions)


def _check_rule_class(cls: Any, where: str) -> None:
  """Refuses what is not a sampled rule class: not an :class:`AcceptanceRule` subclass, or
  :class:`Greedy` (temperature 0 chooses it), abstract, not itself a frozen dataclass (its fields
  would be left out of its equality and hash, which key the compiled programs), or an unkeyed
  :class:`MatchingRule` (its ``choose`` would get no randomness).

  Raises:
    ValueError: naming ``where``, the class and the fix.
  """
  if not (isinstance(cls, type) and issubclass(cls, AcceptanceRule)) or cls.greedy:
    raise ValueError(f"{where}: {cls!r} is not a sampled AcceptanceRule dataclass (temperature 0 is "
                     "greedy whatever the rule); subclass bass_jax.AcceptanceRule or "
                     "bass_jax.MatchingRule")
  if inspect.isabstract(cls):
    missing = ", ".join(sorted(cls.__abstractmethods__))
    raise ValueError(f"{where}: {cls.__name__} is abstract (it lacks {missing}); name a rule that "
                     "implements them")
  params = cls.__dict__.get("__dataclass_params__")
  if params is None or not params.frozen:
    raise ValueError(f"{where}: decorate {cls.__name__} with @dataclasses.dataclass(frozen=True): a "
                     "rule's fields are part of the compiled program's key")
  if issubclass(cls, MatchingRule) and not cls.keyed:
    raise ValueError(f"{where}: {cls.__name__} is a MatchingRule without keyed = True, so its choose "
                     "gets no randomness and cannot sample; set keyed = True and draw with row_keys")


# -- the registry: the rules a decode (generate's acceptance=, the scripts' --acceptance) can name ------

_RULES: dict[str, type[AcceptanceRule]] = {}


def register_acceptance(name: str, rule: type[AcceptanceRule] | None = None):
  """Registers a sampled acceptance rule under ``name`` (``generate(acceptance=name)``,
  ``--acceptance=name``); as a call, or as a class decorator when ``rule`` is None.

  Args:
    name: letters, digits and ``_``, starting with a letter.
    rule: an :class:`AcceptanceRule` dataclass, constructible as ``rule(branch_free=...)``; not
      :class:`Greedy` (temperature 0 chooses it).

  Returns:
    ``rule`` (so that it decorates), or a decorator when ``rule`` is None.

  A class registered under two names has the first as its :attr:`AcceptanceRule.name`.

  Raises:
    ValueError: a malformed name, a name registered to another class, or what ``_check_rule_class``
      refuses (not a sampled AcceptanceRule class, abstract, not a frozen dataclass of its own, an
      unkeyed MatchingRule).
  """
  if rule is None:
    return lambda cls: register_acceptance(name, cls)
  _checks.registry_name(name, "an acceptance rule's name")
  _check_rule_class(rule, f"register_acceptance({name!r})")
  old = _RULES.get(name)
  if old is not None and not _checks.same_definition(old, rule):
    raise ValueError(f"acceptance rule {name!r} is already registered to {old.__qualname__}; pick "
                     "another name")
  _RULES[name] = rule
  return rule


register_acceptance("rejection", Rejection)
register_acceptance("gumbel", Gumbel)


def acceptance_rules() -> tuple[str, ...]:
  """The registered rules' names, in order of registration (``"rejection"`` first: the default)."""
  return tuple(_RULES)


def acceptance_rule(choice: str | AcceptanceRule, *, greedy: bool = False,
                    branch_free: bool = False) -> AcceptanceRule:
  """The rule of a decode: ``choice`` checked, then :class:`Greedy` at temperature 0, else the rule it
  names.

  Args:
    choice: a registered name (:func:`acceptance_rules`), ``py:<module>.<Class>`` (an
      :class:`AcceptanceRule` class, imported), or an :class:`AcceptanceRule` instance.
    greedy: the decode's temperature is 0 (then ``choice`` is only checked).
    branch_free: the backend profile's (``AcceptanceRule.branch_free``).

  A class is made as ``cls(branch_free=...)`` even when ``greedy`` (so that a bad choice is refused
  at any temperature).

  Raises:
    ValueError: an unknown name or a value of another type; a ``py:`` path that does not import;
      what ``_check_rule_class`` refuses (not a sampled AcceptanceRule class, abstract, not a frozen
      dataclass of its own, an unkeyed MatchingRule); a class that cannot be made with
      ``branch_free`` alone.
  """
  if isinstance(choice, str) and choice in _RULES:
    rule = _RULES[choice]
  elif isinstance(choice, str) and choice.startswith("py:"):
    rule = _checks.import_object(choice[3:], f"acceptance {choice!r}")
  elif isinstance(choice, AcceptanceRule):
    rule = choice
  else:
    raise ValueError(f"acceptance must be one of {acceptance_rules()}, py:<module>.<Class> or an "
                     f"AcceptanceRule, got {choice!r}")
  cls = rule if isinstance(rule, type) else type(rule)
  _check_rule_class(cls, f"acceptance {choice!r}")
  try:
    rule = rule() if isinstance(rule, type) else rule
    if greedy:
      return Greedy(branch_free=branch_free)
    return dataclasses.replace(rule, branch_free=branch_free)
  except TypeError as e:  # a constructor that needs arguments
    raise ValueError(f"acceptance {choice!r}: {cls.__name__} cannot be made with branch_free alone "
                     f"({e}); give its other fields defaults, or pass an instance") from None


def _root_only(token: jax.Array) -> TreeAcceptance:
  """A plain step's :class:`TreeAcceptance`: no drafts, ``token: i32[B]`` next."""
  batch = token.shape[0]
  return TreeAcceptance(path=jnp.zeros((batch, 1), jnp.int32),
                        num_accepted=jnp.zeros((batch,), jnp.int32), next_token=token)


def leading_true(mask: jax.Array) -> jax.Array:
  """Length of the all-True prefix of each row of ``bool[B, L]`` -> ``i32[B]``."""
  return jnp.sum(jnp.cumprod(mask.astype(jnp.int32), axis=-1), axis=-1)


def correction_distribution(p: jax.Array, q: jax.Array) -> jax.Array:
  """``norm(max(0, p - q))`` as unnormalized probabilities ``f32[B, V]``: the distribution of the token
  emitted at the first rejection (``q = 0`` at the bonus position, which makes it ``p``).

  The residual is all zero only where ``p == q`` up to rounding, and then a rejection had probability
  ~0; ``p`` is returned there, which keeps that (rounding-level) case a valid draw.
  """
  residual = jnp.maximum(p - q, 0.0)
  return jnp.where(jnp.sum(residual, axis=-1, keepdims=True) > 0, residual, p)


def _chain_parts(tree: DraftTree, width: int):
  """A chain's drafts as the C = ``width`` positions that check them: ``(next_drafts i32[B, C], real
  bool[B, C], nodes i32[C])``, position i checking node i + 1 (padding past the tree's N - 1)."""
  drafts = tree.tokens[:, 1:]
  if drafts.shape[1] < width:
    drafts = jnp.pad(drafts, ((0, 0), (0, width - drafts.shape[1])))
  positions = jnp.arange(width)
  real = positions[None, :] < (tree.num_nodes - 1)[:, None]
  return drafts[:, :width], real, positions


def _chain_result(tree: DraftTree, matched: jax.Array, next_token: jax.Array) -> TreeAcceptance:
  """A chain's :class:`TreeAcceptance`: the path is nodes ``0 … matched``."""
  nodes = jnp.arange(tree.tokens.shape[1])[None, :]
  path = jnp.where(nodes <= matched[:, None], nodes, -1).astype(jnp.int32)
  return TreeAcceptance(path=path, num_accepted=matched, next_token=next_token)


def _match_chain(tree: DraftTree, chosen: jax.Array) -> TreeAcceptance:
  """Accepts a chain's drafts while they equal the target's chosen token ``chosen: i32[B, C]``
  (greedy or Gumbel), all positions at once; ``next_token`` is the choice at the first mismatch (or
  the bonus position)."""
  width = chosen.shape[1]
  next_drafts, real, _ = _chain_parts(tree, width)
  matched = leading_true((chosen == next_drafts) & real)
  at = jnp.minimum(matched, width - 1)
  return _chain_result(tree, matched, jnp.take_along_axis(chosen, at[:, None], axis=1)[:, 0])


def _rejection_chain(key: jax.Array, tree: DraftTree, log_p: jax.Array,
                     draft_log_probs: jax.Array | None) -> TreeAcceptance:
  """Speculative rejection sampling on a chain, all positions at once: position i accepts node
  ``i + 1``'s draft d with probability ``min(1, p_i(d) / q_i(d))`` (``q`` one-hot at d without
  ``draft_log_probs``). Keys as :func:`_rejection_tree` keys the same chain walked: with
  ``accept_key, residual_key = split(key)``, node c's uniform is row b of ``uniform(fold_in(accept_key,
  first + c), (B,))``, and a correction at node u uses ``fold_in(fold_in(residual_key, first + u),
  b)``."""
  batch, width, _ = log_p.shape
  accept_key, residual_key = jax.random.split(key)
  next_drafts, real, positions = _chain_parts(tree, width)
  nodes = tree.first + positions  # position i's node index in the whole chain
  u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(accept_key, i + 1), (batch,)))(
      nodes).T
  log_p_d = jnp.take_along_axis(log_p, next_drafts[..., None], axis=-1)[..., 0]
  if draft_log_probs is None:
    log_q_d = jnp.zeros_like(log_p_d)
  else:
    log_q_d = jnp.take_along_axis(draft_log_probs, next_drafts[..., None], axis=-1)[..., 0]
  matched = leading_true((jnp.log(u) < log_p_d - log_q_d) & real)

  rows = jnp.arange(batch)
  at = jnp.minimum(matched, width - 1)
  p_n = jnp.exp(log_p[rows, at])  # [B, V]
  if draft_log_probs is None:
    q_at = jax.nn.one_hot(next_drafts[rows, at], p_n.shape[-1], dtype=p_n.dtype)
  else:
    q_at = jnp.exp(draft_log_probs[rows, at])
  q_n = jnp.where(real[rows, at][:, None], q_at, 0.0)
  residual = correction_distribution(p_n, q_n)
  fold = lambda n, b: jax.random.fold_in(jax.random.fold_in(residual_key, n), b)
  keys = jax.vmap(fold)(nodes[at], rows)
  return _chain_result(tree, matched, jax.vmap(warp.categorical)(keys, jnp.log(residual)))


# A child test of :func:`_walk`: ``(c, node, candidate, state) -> (accepted, state)`` for node index
# c, the rows' current nodes ``i32[B]`` and ``candidate: bool[B]`` (c is a real child of the current
# node). Only candidate rows may accept, and the other rows' state must come back unchanged.
ChildTest = Callable[[jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def _walk(tree: DraftTree, try_child: ChildTest, state: Any) -> tuple[TreeAcceptance, Any]:
  """Walks every row from its root, trying each node when the scan in index order reaches it
  (module docstring).

  Returns:
    ``(acceptance, state)``: the paths with ``next_token`` left at 0, and the final state. The node
    a row stopped at is ``path[num_accepted]`` (:func:`_last_node`).
  """
  batch, num = tree.tokens.shape
  real = tree.is_real()
  slots = jnp.arange(num)

  def step(c, carry):
    node, num_accepted, path, state = carry
    candidate = (tree.parents[:, c] == node) & real[:, c]
    accepted, state = try_child(c, node, candidate, state)
    accepted = accepted & candidate
    num_accepted = num_accepted + accepted
    path = jnp.where(accepted[:, None] & (slots == num_accepted[:, None]), c, path)
    return jnp.where(accepted, c, node), num_accepted, path, state

  path = jnp.where(slots == 0, 0, jnp.full((batch, num), -1, jnp.int32))
  init = (jnp.zeros(batch, jnp.int32), jnp.zeros(batch, jnp.int32), path, state)
  _, num_accepted, path, state = jax.lax.fori_loop(1, num, step, init)
  result = TreeAcceptance(path=path, num_accepted=num_accepted,
                          next_token=jnp.zeros(batch, jnp.int32))
  return result, state


def _last_node(result: TreeAcceptance) -> jax.Array:
  """``i32[B]`` the node each row's walk stopped at."""
  return jnp.take_along_axis(result.path, result.num_accepted[:, None], axis=1)[:, 0]


def _match_tree(tree: DraftTree, chosen: jax.Array) -> TreeAcceptance:
  """Accepts, from the root, the first child whose token is the target's choice at its parent
  (``chosen: i32[B, N]``, one token per node), and emits the choice at the last accepted node."""
  rows = jnp.arange(chosen.shape[0])

  def try_child(c, node, candidate, state):
    del candidate  # _walk masks it
    return tree.tokens[:, c] == chosen[rows, node], state

  result, _ = _walk(tree, try_child, None)
  next_token = jnp.take_along_axis(chosen, _last_node(result)[:, None], axis=1)[:, 0]
  return result.replace(next_token=next_token)


def _rejection_tree(key: jax.Array, tree: DraftTree, target_log_probs: jax.Array,
                    draft_log_probs: jax.Array | None = None) -> TreeAcceptance:
  """Speculative sampling on a tree: the emitted tokens follow the target's warped law exactly.

  At the current node u the walk keeps a residual ``p'``, at first ``p_u``, and tries u's children
  c in index order, each with its token t:

  * ``draft_log_probs=None``: the children are deterministic (e.g. the draft's top-k, duplicates
    allowed). c is accepted with probability ``p'(t)``; on rejection ``p'(t)`` is set to 0 and
    ``p'`` renormalized (so a duplicate of a rejected token is rejected).
  * ``draft_log_probs`` given: u's children were drawn i.i.d. from ``q_u`` (SpecInfer's multi-step
    speculative sampling, Miao et al. 2024). c is accepted with probability
    ``min(1, p'(t) / q_u(t))``; on rejection ``p' <- norm(max(0, p' - q_u))``.

  The first rule is the second with ``q_u`` one-hot at t, which is how both are coded. On acceptance
  the walk moves to c with ``p' = p_c``; when every child of u is rejected, or u has none,
  ``next_token`` is drawn from ``p'`` (with :func:`correction_distribution`'s convention
  for an all-zero residual: ``p'`` stays as it was).

  Randomness, with ``accept_key, residual_key = split(key)``: the uniform of node c is row b of
  ``uniform(fold_in(accept_key, first + c), (B,))``, and a correction drawn at node u uses the key
  ``fold_in(fold_in(residual_key, first + u), b)`` (``first = tree.first``, 0 for a whole tree). Every decision is keyed by its node (and row), not by
  the organization of the walk.

  Args:
    key: PRNG key of the step's acceptance.
    tree: the drafts; real tokens in ``[0, V)``.
    target_log_probs: ``f32[B, N, V]`` warped (normalized) ``log p`` at each node.
    draft_log_probs: None, or ``f32[B, N, V]`` warped ``log q_u`` at each node that has children
      (anything at the others).

  Returns:
    :class:`TreeAcceptance`.
  """
  batch, _, vocab = target_log_probs.shape
  accept_key, residual_key = jax.random.split(key)
  rows = jnp.arange(batch)
  tokens = jnp.where(tree.is_real(), jnp.clip(tree.tokens, 0, vocab - 1), 0)  # gathers in range

  def try_child(c, node, candidate, residual):
    token = tokens[:, c]
    if draft_log_probs is None:
      q = jax.nn.one_hot(token, vocab, dtype=residual.dtype)
    else:
      q = jnp.exp(draft_log_probs[rows, node])
    uniform = jax.random.uniform(jax.random.fold_in(accept_key, tree.first + c), (batch,))
    accepted = uniform * q[rows, token] < residual[rows, token]  # u < min(1, p'(t) / q(t))
    rest = correction_distribution(residual, q)
    rest = rest / jnp.sum(rest, axis=-1, keepdims=True)
    residual = jnp.where((candidate & ~accepted)[:, None], rest, residual)
    moved = jnp.exp(target_log_probs[:, c])
    return accepted, jnp.where((candidate & accepted)[:, None], moved, residual)

  result, residual = _walk(tree, try_child, jnp.exp(target_log_probs[:, 0]))
  fold = lambda u, b: jax.random.fold_in(jax.random.fold_in(residual_key, u), b)
  keys = jax.vmap(fold)(tree.first + _last_node(result), rows)
  next_token = jax.vmap(warp.categorical)(keys, jnp.log(residual))
  return result.replace(next_token=next_token)
