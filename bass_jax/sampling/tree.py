"""Acceptance of a token tree per row: greedy, speculative (SpecInfer) and drafter-invariant.

A tree step (EAGLE-2, Li et al. 2024; SpecInfer, Miao et al. 2024) generalizes the chain of drafts
that :mod:`bass_jax.sampling.acceptance` verifies: each row proposes a tree of candidate tokens
rooted at its last emitted token, the target scores every node in one pass (attending along
:func:`ancestor_mask`), and the row accepts one root-to-node path of the tree and then emits one
more token. This module is only the acceptance math, as pure functions with static shapes.

Axes: B rows, N nodes per row (static), V vocabulary. Node 0 of a row is its root (the last emitted
token, already in the text); nodes ``1 .. num_nodes - 1`` are drafts, each with a parent of smaller
index (topological order); nodes ``>= num_nodes`` are padding, whose values are never used. The
target's distribution at node i (``target_logits[:, i]``, ``target_log_probs[:, i]``) is the one of
the token after node i's path, so a child c of node u is checked against node u's distribution.

Every rule walks the tree from the root: at the current node u it tries u's children in index
order, moves to the first one it accepts and repeats; when no child of u is accepted (or u has none)
it emits ``next_token`` from u. Since a child's index exceeds its parent's, that walk is one scan
over nodes ``1 .. N - 1`` in index order (:func:`_walk`), trying node c iff its parent is the
current node when the scan reaches it: the siblings tried before c have smaller indices and c's
children come after c, so the scan tries exactly the nodes of a level-by-level walk, in order.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax.sampling import acceptance
from bass_jax.sampling import warp


@flax.struct.dataclass
class DraftTree:
  """A batch of token trees, one per row, padded to N nodes.

  Attributes:
    tokens: ``i32[B, N]``. Node 0 is the row's last emitted token (the root, which acceptance does
      not check); real nodes ``1 .. num_nodes - 1`` are draft tokens in ``[0, V)``.
    parents: ``i32[B, N]``: ``parents[:, 0] == -1`` and, for a real node ``i >= 1``,
      ``0 <= parents[b, i] < i`` (topological order). Not validated.
    num_nodes: ``i32[B]`` real nodes per row, ``1 <= num_nodes <= N``; nodes ``>= num_nodes`` are
      padding, with any tokens and parents.
  """

  tokens: jax.Array
  parents: jax.Array
  num_nodes: jax.Array

  def is_real(self) -> jax.Array:
    """``bool[B, N]``: node i of row b is real (``i < num_nodes[b]``)."""
    return jnp.arange(self.tokens.shape[1]) < self.num_nodes[:, None]


@flax.struct.dataclass
class TreeAcceptance:
  """The outcome of tree acceptance, per row.

  Attributes:
    path: ``i32[B, N]`` node indices of the accepted path: ``path[:, 0] == 0`` (the root), then the
      accepted nodes in depth order (each a child of the one before), then -1.
    num_accepted: ``i32[B]`` accepted draft nodes (the path's length minus 1).
    next_token: ``i32[B]`` the token emitted after the path: the correction at the node whose
      children were all rejected, or the bonus token at an accepted leaf.

  The row emits ``tokens[path[1 : num_accepted + 1]]`` and then ``next_token``.
  """

  path: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array


def chain_tree(last: jax.Array, drafts: jax.Array, num_drafts: jax.Array) -> DraftTree:
  """The chain ``last -> d_1 -> ... -> d_l`` as a tree (what a chain proposer drafts).

  Args:
    last: ``i32[B]`` each row's last emitted token. drafts: ``i32[B, L]``.
    num_drafts: ``i32[B]`` (or ``i32[]``) real drafts l per row, ``0 <= l <= L``.

  Returns:
    A :class:`DraftTree` with N = L + 1 nodes, ``parents[i] = i - 1`` and ``num_nodes = l + 1``.
  """
  batch, num_slots = drafts.shape
  tokens = jnp.concatenate([last[:, None], drafts], axis=1).astype(jnp.int32)
  parents = jnp.broadcast_to(jnp.arange(num_slots + 1, dtype=jnp.int32) - 1, tokens.shape)
  num_nodes = jnp.broadcast_to(jnp.asarray(num_drafts, jnp.int32) + 1, (batch,))
  return DraftTree(tokens=tokens, parents=parents, num_nodes=num_nodes)


def ancestor_mask(tree: DraftTree) -> jax.Array:
  """``bool[B, N, N]``: ``[b, i, j]`` is True iff nodes i and j of row b are real and j is i or an
  ancestor of i: the attention mask of a tree verification (node i sees its own path).

  Row i of the mask is row ``parents[i]`` plus i itself; parents come first, so one pass in index
  order fills it.
  """
  batch, num = tree.tokens.shape
  rows = jnp.arange(batch)
  real = tree.is_real()
  nodes = jnp.arange(num)

  def fill(i, mask):
    parent = jnp.clip(tree.parents[:, i], 0, num - 1)  # the root's -1, padding's garbage
    above = mask[rows, parent] & (i > 0)
    row = (above | (nodes == i)[None, :]) & real[:, i, None]
    return mask.at[:, i].set(row)

  return jax.lax.fori_loop(0, num, fill, jnp.zeros((batch, num, num), bool))


def node_depths(tree: DraftTree) -> jax.Array:
  """``i32[B, N]`` each real node's depth (the root 0, its children 1, ...); padding nodes 0."""
  depth = jnp.sum(ancestor_mask(tree), axis=-1, dtype=jnp.int32) - 1
  return jnp.where(tree.is_real(), depth, 0)


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


def _accept_chosen(tree: DraftTree, chosen: jax.Array) -> TreeAcceptance:
  """Accepts, from the root, the first child whose token is the target's choice at its parent
  (``chosen: i32[B, N]``, one token per node), and emits the choice at the last accepted node."""
  rows = jnp.arange(chosen.shape[0])

  def try_child(c, node, candidate, state):
    del candidate  # _walk masks it
    return tree.tokens[:, c] == chosen[rows, node], state

  result, _ = _walk(tree, try_child, None)
  next_token = jnp.take_along_axis(chosen, _last_node(result)[:, None], axis=1)[:, 0]
  return result.replace(next_token=next_token)


def greedy_accept_tree(tree: DraftTree, target_logits: jax.Array) -> TreeAcceptance:
  """Greedy tree verification (temperature 0): follow the target's argmax down the tree.

  From the root, accept the child whose token is ``argmax target_logits[:, u]`` at the current node
  u (the first such child in index order when siblings share it) and repeat; ``next_token`` is the
  argmax at the last accepted node. On a chain this is :func:`acceptance.greedy_accept_chunk`.

  Args:
    tree: the drafts. target_logits: ``f32[B, N, V]``, node i's logits for the token after its path.

  Returns:
    :class:`TreeAcceptance`.
  """
  return _accept_chosen(tree, warp.first_argmax(target_logits))


def coupled_accept_tree(tree: DraftTree, target_log_probs: jax.Array, row_keys: jax.Array,
                        seq_len: jax.Array) -> TreeAcceptance:
  """Drafter-invariant tree acceptance (Daliri, Musco and Suresh 2024; as
  :func:`acceptance.coupled_accept_chunk`).

  The target's token at node u is its Gumbel-max draw :func:`warp.coupled_choice` with the row's
  noise for text position ``seq_len + depth(u)``; the walk accepts the child equal to it (greedy
  acceptance on the perturbed log-probs), and ``next_token`` is that draw at the last accepted node.
  Every emitted token is then the target's own draw at its text position, whatever the tree: the
  row emits what regular decoding with ``acceptance="gumbel"`` emits.

  Args:
    tree: the drafts. target_log_probs: ``f32[B, N, V]`` warped ``log p`` at each node.
    row_keys: ``u32[B, 2]`` each row's sequence key data (:func:`warp.sequence_keys`).
    seq_len: ``i32[B]`` the rows' text lengths, root included (the root's children are drafts for
      text position ``seq_len``).

  Returns:
    :class:`TreeAcceptance`.
  """
  positions = seq_len[:, None] + node_depths(tree)
  return _accept_chosen(tree, warp.coupled_choice(target_log_probs, row_keys, positions))


def speculative_accept_tree(key: jax.Array, tree: DraftTree, target_log_probs: jax.Array,
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
  ``next_token`` is drawn from ``p'`` (with :func:`acceptance.correction_distribution`'s convention
  for an all-zero residual: ``p'`` stays as it was).

  Randomness, with ``accept_key, residual_key = split(key)``: the uniform of node c is row b of
  ``uniform(fold_in(accept_key, c), (B,))``, and a correction drawn at node u uses the key
  ``fold_in(fold_in(residual_key, u), b)``. Every decision is keyed by its node (and row), not by
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
    uniform = jax.random.uniform(jax.random.fold_in(accept_key, c), (batch,))
    accepted = uniform * q[rows, token] < residual[rows, token]  # u < min(1, p'(t) / q(t))
    rest = acceptance.correction_distribution(residual, q)
    rest = rest / jnp.sum(rest, axis=-1, keepdims=True)
    residual = jnp.where((candidate & ~accepted)[:, None], rest, residual)
    moved = jnp.exp(target_log_probs[:, c])
    return accepted, jnp.where((candidate & accepted)[:, None], moved, residual)

  result, residual = _walk(tree, try_child, jnp.exp(target_log_probs[:, 0]))
  fold = lambda u, b: jax.random.fold_in(jax.random.fold_in(residual_key, u), b)
  keys = jax.vmap(fold)(_last_node(result), rows)
  next_token = jax.vmap(warp.categorical)(keys, jnp.log(residual))
  return result.replace(next_token=next_token)
