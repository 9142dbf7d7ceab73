"""Token trees: their static shape (:class:`TreeShape`), the drafts of a step as a tree per row
(:class:`DraftTree`; a chain is the tree ``parents[i] = i - 1``, :func:`chain_tree`), EAGLE-2's growth
(:func:`grow_tree`) and the ancestor mask. Accepting a tree is ``acceptance.AcceptanceRule.accept``.

A tree step (EAGLE-2, Li et al. 2024; SpecInfer, Miao et al. 2024) generalizes the chain of drafts:
each row proposes a tree of candidate tokens rooted at its last emitted token, the target scores
every node in one pass (attending along :func:`ancestor_mask`), and the row accepts one root-to-node
path of the tree and then emits one more token. Everything here is a pure function of static shapes;
the decode step that uses it is ``bass_jax.sampling.step.tree_step``.

Axes: B rows, N nodes per row (static), V vocabulary. Node 0 of a row is its root (the last emitted
token, already in the text); nodes ``1 .. num_nodes - 1`` are drafts, each with a parent of smaller
index (topological order); nodes ``>= num_nodes`` are padding, whose values are never used. The
target's distribution at node i (``target_logits[:, i]``, ``target_log_probs[:, i]``) is the one of
the token after node i's path, so a child c of node u is checked against node u's distribution.

"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from bass_jax import _checks
from bass_jax.models.attention import mask_depths


MAX_TOP_K = 16  # children per expanded node (TreeShape's limits; its docstring says why)
MAX_DEPTH = 32  # levels below the root: a chain's limit too (draft_len.MAX_DRAFT_LEN)
MAX_NODES = 256  # nodes per row, root included


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """The static shape of a step's draft tree (EAGLE-2's growth, Li et al. 2024, §4; the same three
  numbers as SGLang's ``speculative_eagle_topk``, ``speculative_num_steps`` and
  ``speculative_num_draft_tokens``).

  Attributes:
    top_k: children drafted per expanded node, and nodes expanded per level.
    depth: levels drafted below the root (the longest path accepts ``depth`` drafts).
    nodes: N, the tree's nodes per row, root included: the positions the target scores per row.

  Limits (:data:`MAX_TOP_K`, :data:`MAX_DEPTH`, :data:`MAX_NODES`): a step scores ``nodes`` positions
  per row and growth ranks ``top_k + (depth - 1) * top_k**2`` candidates per row, one traced level per
  depth, so an unbounded shape compiles for minutes or exhausts memory; the limits are well above
  what EAGLE-2 and SGLang use (top_k <= 10, depth <= 8, nodes <= 64). A shape must also fit its models
  (:meth:`check_fits`: ``top_k`` below the vocabulary, ``depth`` below the context).

  Raises:
    ValueError: from the constructor, naming the argument: a value that is not an int in ``[1,
      limit]``, ``nodes < depth + 1`` (no room for one full-depth path) or more drafts than growth
      proposes (``nodes - 1 > top_k + (depth - 1) * top_k**2``).
  """

  top_k: int = 4
  depth: int = 5
  nodes: int = 16

  def __post_init__(self):
    for name, limit in (("top_k", MAX_TOP_K), ("depth", MAX_DEPTH), ("nodes", MAX_NODES)):
      object.__setattr__(self, name, _checks.as_int(f"draft_tree {name}", getattr(self, name),
                                                    min_value=1, max_value=limit))
    if self.nodes < self.depth + 1:
      raise ValueError(f"draft_tree nodes={self.nodes} must be at least depth + 1 = {self.depth + 1} "
                       "(the root and one path of full depth)")
    if self.nodes - 1 > self.candidates:
      raise ValueError(f"draft_tree nodes={self.nodes}: growth with top_k={self.top_k} and "
                       f"depth={self.depth} drafts only {self.candidates} candidates; lower nodes or "
                       "raise top_k or depth")

  @classmethod
  def parse(cls, text: str) -> "TreeShape":
    """``"top_k=4,depth=5,nodes=16"``: the fields in any order, each at most once, spaces around them
    allowed; an omitted field keeps its default (``str`` of the result is the canonical form, which
    comparisons and resumed runs use).

    Raises:
      ValueError: not a string, an empty text, an empty part, a part without ``=``, an unknown or
        repeated field, a value that is not a decimal integer, or a value the constructor refuses.
    """
    if not isinstance(text, str):
      raise ValueError(f"draft_tree must be text such as 'top_k=4,depth=5,nodes=16', got {text!r}")
    if not text.strip():
      raise ValueError("draft_tree is empty; write its shape, e.g. 'top_k=4,depth=5,nodes=16', or "
                       "leave it out for chains")
    fields = {}
    for part in (p.strip() for p in text.split(",")):
      name, sep, value = part.partition("=")
      name, value = name.strip(), value.strip()
      if not part:
        raise ValueError(f"draft_tree {text!r} has an empty part (a stray comma?); write "
                         "top_k=..,depth=..,nodes=..")
      if not sep or name not in ("top_k", "depth", "nodes"):
        raise ValueError(f"draft_tree {text!r}: expected the fields top_k=, depth=, nodes= separated "
                         f"by commas, got {part!r}")
      if name in fields:
        raise ValueError(f"draft_tree {text!r}: {name} is given twice; give each field once")
      if not (value.isascii() and value.isdigit()) or len(value) > 9:
        raise ValueError(f"draft_tree {text!r}: {name} must be a positive integer, got {value!r}")
      fields[name] = int(value)
    return cls(**fields)

  def check_fits(self, *, vocab_size: int, context: int) -> None:
    """Checks the shape against its models: ``top_k`` children of a node are distinct tokens, so
    ``top_k < vocab_size``; a path of ``depth`` drafts after a one-token prompt fits the context.

    Raises:
      ValueError: ``top_k >= vocab_size`` or ``depth >= context``, naming both values.
    """
    if self.top_k >= vocab_size:
      raise ValueError(f"draft_tree {self}: top_k={self.top_k} must be below the vocabulary of "
                       f"{vocab_size} tokens; lower top_k")
    if self.depth >= context:
      raise ValueError(f"draft_tree {self}: depth={self.depth} must be below the models' context of "
                       f"{context} positions; lower depth")

  def __str__(self) -> str:
    return f"top_k={self.top_k},depth={self.depth},nodes={self.nodes}"

  @property
  def candidates(self) -> int:
    """Nodes growth drafts before reranking: ``top_k`` at level 1, ``top_k**2`` at each deeper level."""
    return self.top_k + (self.depth - 1) * self.top_k**2

  @property
  def draft_slots(self) -> int:
    """Cache slots a draft model writes past the text while growing (the expanded nodes)."""
    return (self.depth - 1) * self.top_k

  @property
  def look_ahead(self) -> int:
    """Cache slots past the last emitted token a tree step needs, target's and draft's."""
    return max(self.nodes, self.draft_slots + 1)


def tree_shapes(draft_tree: Any) -> tuple[TreeShape, ...]:
  """``generate``'s ``draft_tree`` (and the scripts' ``--draft_tree``) as distinct :class:`TreeShape` s,
  in the order given (empty for None): the one parser of tree shapes.

  Args:
    draft_tree: None, a :class:`TreeShape`, its text (:meth:`TreeShape.parse`), or a sequence of those.

  Returns:
    The shapes, each once, as given.

  Raises:
    ValueError: a value that is not a shape or its text, an empty sequence, or a shape given twice
      (however it is written).
  """
  if draft_tree is None:
    return ()
  items = [draft_tree] if isinstance(draft_tree, (str, TreeShape)) else draft_tree
  try:
    items = list(items)
  except TypeError:
    items = [draft_tree]
  shapes = []
  for item in items:
    if isinstance(item, str):
      item = TreeShape.parse(item)
    if not isinstance(item, TreeShape):
      raise ValueError(f"draft_tree must be None, a TreeShape, text such as 'top_k=4,depth=5,nodes=16' "
                       f"or a sequence of those, got {type(item).__name__} {str(item)[:80]!r}")
    shapes.append(item)
  if not shapes:
    raise ValueError("draft_tree is an empty sequence; pass None for chains")
  if len(set(shapes)) < len(shapes):
    raise ValueError(f"draft_tree repeats a shape: {[str(t) for t in shapes]}; give each once")
  return tuple(shapes)


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
    source: ``i32[B]`` where each row's tree came from (``proposers.DRAFT_SOURCES``; a hybrid's
      lookup where one matched), or None: the proposer's own.
    first: ``i32[]`` the index of node 0 in the step's whole tree (0; a chain verified in chunks
      of C positions, ``step._verify``, passes the chunk starting at position ``first`` as the chain
      of its C + 1 nodes): acceptance keys its randomness by a node's index in the whole tree.
    chain: static; every row is the chain ``parents[i] = i - 1`` (:func:`chain_tree`), which
      acceptance then checks for all nodes at once instead of walking them.
  """

  tokens: jax.Array
  parents: jax.Array
  num_nodes: jax.Array
  source: jax.Array | None = None
  first: jax.Array | int = 0
  chain: bool = flax.struct.field(pytree_node=False, default=False)

  def is_real(self) -> jax.Array:
    """``bool[B, N]``: node i of row b is real (``i < num_nodes[b]``)."""
    return jnp.arange(self.tokens.shape[1]) < self.num_nodes[:, None]

  def where(self, take: jax.Array, other: "DraftTree") -> "DraftTree":
    """Row by row, this tree where ``take: bool[B]``, ``other`` (of the same N) elsewhere (a chain
    only if both are)."""
    pick = lambda a, b: jnp.where(take.reshape(take.shape + (1,) * (a.ndim - 1)), a, b)
    source = None
    if self.source is not None or other.source is not None:
      own = lambda t: jnp.full(take.shape, -1, jnp.int32) if t.source is None else t.source
      source = pick(own(self), own(other))
    return DraftTree(tokens=pick(self.tokens, other.tokens), parents=pick(self.parents, other.parents),
                     num_nodes=pick(self.num_nodes, other.num_nodes), source=source,
                     first=self.first, chain=self.chain and other.chain)


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


def chain_tree(last: jax.Array, drafts: jax.Array, num_drafts: jax.Array, *,
               first: jax.Array | int = 0) -> DraftTree:
  """The chain ``last -> d_1 -> ... -> d_l`` as a tree (what a chain proposer drafts).

  Args:
    last: ``i32[B]`` each row's last emitted token (or, for a chunk, the token at position
      ``first``). drafts: ``i32[B, L]``.
    num_drafts: ``i32[B]`` (or ``i32[]``) real drafts l per row, ``0 <= l <= L``.
    first: the index of ``last`` in the step's whole chain (:attr:`DraftTree.first`).

  Returns:
    A :class:`DraftTree` with N = L + 1 nodes, ``parents[i] = i - 1``, ``num_nodes = l + 1`` and
    ``chain=True``.
  """
  batch, num_slots = drafts.shape
  tokens = jnp.concatenate([last[:, None], drafts], axis=1).astype(jnp.int32)
  parents = jnp.broadcast_to(jnp.arange(num_slots + 1, dtype=jnp.int32) - 1, tokens.shape)
  num_nodes = jnp.broadcast_to(jnp.asarray(num_drafts, jnp.int32) + 1, (batch,))
  return DraftTree(tokens=tokens, parents=parents, num_nodes=num_nodes, first=first, chain=True)


def branch_tree(root: jax.Array, branches: jax.Array, lengths: jax.Array, nodes: int) -> DraftTree:
  """Chains under one root as a tree (a lookup's several continuations): branch i of row b is the
  chain of its first ``lengths[b, i]`` tokens of ``branches[b, i]``, hanging from the root; branches
  take the node slots in order, each as many as remain below ``nodes`` (a branch that does not fit
  is cut, later ones dropped).

  Args:
    root: ``i32[B]`` each row's last emitted token. branches: ``i32[B, k, D]``.
    lengths: ``i32[B, k]`` real tokens per branch, ``0 <= lengths <= D``. nodes: N, static.

  Returns:
    A :class:`DraftTree` of N nodes: node 0 the root, then branch 0's chain, branch 1's, ...;
    ``num_nodes = 1 + `` the tokens placed.
  """
  # Branch i takes the node slots from offset[i] on, as many as remain below N.
  offset = 1 + jnp.cumsum(lengths, axis=1) - lengths
  lengths = jnp.clip(nodes - offset, 0, lengths)
  slots = jnp.arange(nodes)[None, :, None]  # [1, N, 1]
  inside = (slots >= offset[:, None]) & (slots < (offset + lengths)[:, None])  # [B, N, k]
  branch = jnp.argmax(inside, axis=2)
  real = jnp.any(inside, axis=2)  # slot 0 (the root) and unused slots are not in a branch
  depth = jnp.arange(nodes)[None, :] - jnp.take_along_axis(offset, branch, axis=1)
  flat = branches.reshape(branches.shape[0], -1)  # [B, k * D]
  index = branch * branches.shape[2] + jnp.clip(depth, 0, branches.shape[2] - 1)
  tokens = jnp.where(real, jnp.take_along_axis(flat, index, axis=1), 0)
  tokens = tokens.at[:, 0].set(root)
  parents = jnp.where(real & (depth > 0), jnp.arange(nodes)[None, :] - 1, 0).at[:, 0].set(-1)
  return DraftTree(tokens=tokens.astype(jnp.int32), parents=parents.astype(jnp.int32),
                   num_nodes=(1 + jnp.sum(lengths, axis=1)).astype(jnp.int32))


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
  return mask_depths(ancestor_mask(tree))  # a padding node's mask row is all False: depth 0


# A draft model's level of tree growth: ``(carry, tokens i32[B, k], parent i32[B, k], tree_mask bool[B,
# k, M]) -> (carry, log_q f32[B, k, V'])``: forwards the level's k expanded nodes (``parent`` indexes
# the previous level's k nodes, all 0 at the first level, whose parent is the root) with the mask of
# their ancestors among the M = level * k expanded nodes so far, and returns the draft's log-probs for
# their children.
Expand = Callable[[Any, jax.Array, jax.Array, jax.Array], tuple[Any, jax.Array]]


def grow_tree(root: jax.Array, first_log_q: jax.Array, expand: Expand, carry: Any, shape: TreeShape,
              token_of: Callable[[jax.Array], jax.Array] = lambda ids: ids,
              prior: DraftTree | None = None) -> tuple[Any, DraftTree]:
  """EAGLE-2's dynamic draft tree (Li et al. 2024, §4), per row, at a static shape.

  Expansion: the root's ``top_k`` most likely children form level 1; at each further level the
  draft scores the children of the level's ``top_k`` nodes (one forward of ``top_k`` positions,
  ``expand``) and the ``top_k`` children with the highest *path score* (the sum of draft log-probs
  from the root) are expanded next. Reranking: of all ``shape.candidates`` drafted nodes, the
  ``nodes - 1`` of highest path score form the tree. A child's score is at most its parent's, and
  ties go to the lower (earlier) candidate, so the kept set contains every kept node's parent.

  ``prior`` (a hybrid's deterministic tree, e.g. n-gram lookup's branches) enters the candidates
  first with scores above any draft's, in its node order: each row's prior tree is kept whole (its
  real nodes below the root, at most ``nodes - 1`` of them, a topological prefix) and the model's
  best nodes fill the rest.

  Every node is a deterministic function of the draft's distributions, so
  ``AcceptanceRule.accept`` accepts it with ``draft_log_probs=None`` (exact at any
  temperature).

  Args:
    root: ``i32[B]`` each row's last emitted token (node 0).
    first_log_q: ``f32[B, V']`` the draft's log-probs for the token after the root.
    expand: one level of growth (:data:`Expand`). carry: its state (a draft cache).
    shape: the static :class:`TreeShape`.
    token_of: maps the draft's indices ``[0, V')`` to token ids (an EAGLE draft's smaller vocabulary).
    prior: a :class:`DraftTree` (``i32[B, M]``, ``M <= nodes``, the same root) or None: a tree
      ranked before every drafted node (above).

  Returns:
    ``(carry, tree)``: the tree has ``shape.nodes`` nodes per row, all real, in topological order
    (candidates in the order they were drafted).
  """
  k, depth, nodes = shape.top_k, shape.depth, shape.nodes
  batch = root.shape[0]
  rows = jnp.arange(batch)[:, None]
  pool_tokens, pool_scores, pool_parents = [], [], []  # candidates, in drafting order
  offset = 0
  if prior is not None:  # its nodes 1 .. M - 1 are candidates 0 .. M - 2; its root is ours
    length = min(prior.tokens.shape[1], nodes) - 1
    slots = jnp.arange(length)
    pool_tokens.append(prior.tokens[:, 1:length + 1].astype(jnp.int32))
    # 0 ranks above every log-prob; the tiny decrements keep each prior node above its successors.
    pool_scores.append(jnp.where(slots < prior.num_nodes[:, None] - 1,
                                 -1e-6 * slots.astype(jnp.float32), -jnp.inf))
    pool_parents.append(prior.parents[:, 1:length + 1].astype(jnp.int32) - 1)
    offset = length
  score, index = jax.lax.top_k(first_log_q, k)  # level 1: [B, k]
  tokens = token_of(index).astype(jnp.int32)
  pool_tokens.append(tokens)
  pool_scores.append(score)
  pool_parents.append(jnp.full((batch, k), -1, jnp.int32))
  frontier = offset + jnp.broadcast_to(jnp.arange(k), (batch, k))  # candidates being expanded
  parent = jnp.zeros((batch, k), jnp.int32)
  eye = jnp.broadcast_to(jnp.eye(k, dtype=bool), (batch, k, k))
  mask = eye  # [B, k, level * k]: each expanded node's ancestors among the expanded nodes, itself too
  offset += k
  for level in range(1, depth):
    carry, log_q = expand(carry, tokens, parent, mask)
    child_score, child_index = jax.lax.top_k(log_q, k)  # [B, k, k]
    child_score = (score[:, :, None] + child_score).reshape(batch, k * k)
    child_tokens = token_of(child_index).astype(jnp.int32).reshape(batch, k * k)
    pool_tokens.append(child_tokens)
    pool_scores.append(child_score)
    pool_parents.append(jnp.repeat(frontier, k, axis=1))
    if level < depth - 1:
      score, pick = jax.lax.top_k(child_score, k)
      parent = pick // k
      tokens = child_tokens[rows, pick]
      frontier = offset + pick
      mask = jnp.concatenate([mask[rows, parent], eye], axis=2)
    offset += k * k

  scores = jnp.concatenate(pool_scores, axis=1)
  kept = jnp.sort(jax.lax.top_k(scores, nodes - 1)[1], axis=1)  # [B, N - 1], drafting order
  node_of = jnp.zeros(scores.shape, jnp.int32).at[rows, kept].set(jnp.arange(1, nodes))
  parent_candidate = jnp.concatenate(pool_parents, axis=1)[rows, kept]
  parents = jnp.where(parent_candidate < 0, 0, node_of[rows, jnp.maximum(parent_candidate, 0)])
  tree = DraftTree(
      tokens=jnp.concatenate([root[:, None].astype(jnp.int32),
                              jnp.concatenate(pool_tokens, axis=1)[rows, kept]], axis=1),
      parents=jnp.concatenate([jnp.full((batch, 1), -1, jnp.int32), parents], axis=1),
      num_nodes=jnp.full((batch,), nodes, jnp.int32))
  return carry, tree
