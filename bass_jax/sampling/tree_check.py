"""How a step's drafts are checked against the target, per row, over a :class:`tree.DraftTree`: the
matching walk (a draft is accepted when it equals the target's own choice) and the rejection walk
(speculative sampling), each with its chain fast path, and the helpers proposers share
(:func:`leading_true`, :func:`correction_distribution`). The acceptance rules
(``bass_jax.sampling.acceptance``) call these; a rule of one's own may too.

How a tree is checked. A chain (``DraftTree.chain``, static) is checked at all its nodes at once
(a cumulative product over the matches); the decode's chunked verification (``step``) calls the rule
once per chunk of C positions, the chunk being the chain of its C + 1 nodes from ``DraftTree.first``,
and stops once every row has rejected. Any other tree is walked from the root: at the current node u
the rule tries u's children in index order, moves to the first one it accepts and repeats; when no
child of u is accepted (or u has none) it emits ``next_token`` from u. Since a child's index exceeds
its parent's, that walk is one scan over nodes ``1 .. N - 1`` in index order (:func:`walk`), trying
node c iff its parent is the current node when the scan reaches it: the siblings tried before c have
smaller indices and c's children come after c, so the scan tries exactly the nodes of a level-by-level
walk, in order. Every random decision is keyed by its node's index in the whole tree (and its row),
never by the organization of the check, so a chain accepted as a chain, in chunks or as a walked tree
makes the very same draws (``tests/test_tree_acceptance.py``).

Axes: B batch, N nodes per row (node 0 the root: the last emitted token), V vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from bass_jax.sampling import warp
from bass_jax.sampling.tree import DraftTree, TreeAcceptance


def root_only(token: jax.Array) -> TreeAcceptance:
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


def match_chain(tree: DraftTree, chosen: jax.Array) -> TreeAcceptance:
  """Accepts a chain's drafts while they equal the target's chosen token ``chosen: i32[B, C]``
  (greedy or Gumbel), all positions at once; ``next_token`` is the choice at the first mismatch (or
  the bonus position)."""
  width = chosen.shape[1]
  next_drafts, real, _ = _chain_parts(tree, width)
  matched = leading_true((chosen == next_drafts) & real)
  at = jnp.minimum(matched, width - 1)
  return _chain_result(tree, matched, jnp.take_along_axis(chosen, at[:, None], axis=1)[:, 0])


def rejection_chain(key: jax.Array, tree: DraftTree, log_p: jax.Array,
                     draft_log_probs: jax.Array | None) -> TreeAcceptance:
  """Speculative rejection sampling on a chain, all positions at once: position i accepts node
  ``i + 1``'s draft d with probability ``min(1, p_i(d) / q_i(d))`` (``q`` one-hot at d without
  ``draft_log_probs``). Keys as :func:`rejection_tree` keys the same chain walked: with
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


# A child test of :func:`walk`: ``(c, node, candidate, state) -> (accepted, state)`` for node index
# c, the rows' current nodes ``i32[B]`` and ``candidate: bool[B]`` (c is a real child of the current
# node). Only candidate rows may accept, and the other rows' state must come back unchanged.
ChildTest = Callable[[jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def walk(tree: DraftTree, try_child: ChildTest, state: Any) -> tuple[TreeAcceptance, Any]:
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


def match_tree(tree: DraftTree, chosen: jax.Array) -> TreeAcceptance:
  """Accepts, from the root, the first child whose token is the target's choice at its parent
  (``chosen: i32[B, N]``, one token per node), and emits the choice at the last accepted node."""
  rows = jnp.arange(chosen.shape[0])

  def try_child(c, node, candidate, state):
    del candidate  # walk masks it
    return tree.tokens[:, c] == chosen[rows, node], state

  result, _ = walk(tree, try_child, None)
  next_token = jnp.take_along_axis(chosen, _last_node(result)[:, None], axis=1)[:, 0]
  return result.replace(next_token=next_token)


def rejection_tree(key: jax.Array, tree: DraftTree, target_log_probs: jax.Array,
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

  result, residual = walk(tree, try_child, jnp.exp(target_log_probs[:, 0]))
  fold = lambda u, b: jax.random.fold_in(jax.random.fold_in(residual_key, u), b)
  keys = jax.vmap(fold)(tree.first + _last_node(result), rows)
  next_token = jax.vmap(warp.categorical)(keys, jnp.log(residual))
  return result.replace(next_token=next_token)
