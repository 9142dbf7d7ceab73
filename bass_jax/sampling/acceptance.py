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

How a tree is checked: ``bass_jax.sampling.tree_check``.

Axes: B batch, N nodes per row (node 0 the root: the last emitted token), V vocabulary.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.sampling import tree_check, warp
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
      return tree_check.root_only(chosen)
    return tree_check.match_chain(tree, chosen) if tree.chain else tree_check.match_tree(tree, chosen)

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
    """:meth:`AcceptanceRule.accept` by rejection sampling (:func:`tree_check.rejection_chain`,
    :func:`tree_check.rejection_tree`); ``row_keys`` and ``seq_len`` are not read."""
    del row_keys, seq_len
    if tree.tokens.shape[1] == 1:  # a plain step: a draw from the warped law at the root
      return tree_check.root_only(warp.categorical(key, self.warp(logits[:, 0], temperature, top_p)))
    log_p = self.warp(logits, temperature, top_p)
    if tree.chain:
      return tree_check.rejection_chain(key, tree, log_p, draft_log_probs)
    return tree_check.rejection_tree(key, tree, log_p, draft_log_probs)


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
