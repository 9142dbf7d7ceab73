"""What a decode is asked to do, as one value: :class:`DecodeConfig` (sampling, speculation, batching,
backend). ``generate(target, draft, prompts, **keywords)`` builds one from its keywords; the seam
underneath is ``plan = prepare(target, draft, prompts, config)`` and ``run(plan)``
(``bass_jax.sampling.plan``, ``bass_jax.sampling.runner``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax

from bass_jax import _checks
from bass_jax.profiles import BackendProfile
from bass_jax.sampling import draft_len as draft_len_lib
from bass_jax.sampling import tree as tree_lib
from bass_jax.sampling.acceptance import AcceptanceRule
from bass_jax.sampling.draft_len import DraftLenPolicy
from bass_jax.sampling.tree import TreeShape


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """The settings of a decode (frozen: derive variants with ``dataclasses.replace``). Values are
  checked by ``prepare``, which knows the models (one-line errors naming the field).

  **Sampling.**

  Attributes:
    max_new_tokens: N >= 1, tokens to emit per row at most.
    temperature: >= 0; 0 is greedy.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    seed: PRNG seed, an int in ``[0, 2**63)`` (all 64 bits used; unused when greedy).
    eos_token_id: an id or a sequence of at most 8 ids that end a row; None takes the target
      config's; ``()`` disables stopping.
    acceptance: how sampled drafts are accepted (greedy decoding ignores it; ``acceptance.py``).
      ``"rejection"``: speculative rejection sampling (Leviathan et al. 2023; the paper's), the
      highest acceptance. ``"gumbel"``: Gumbel acceptance, i.e. drafter-invariant speculative
      decoding (Daliri, Musco and Suresh 2024): the token at each text position is the target's
      Gumbel-max draw with noise keyed by the sequence and that position, drafts drawn with the same
      noise, a draft accepted when it equals the target's draw. Equally exact, and a sequence's
      tokens then depend only on the seed, its sequence id and the target: the same with any draft,
      draft length, batch, ``batch_size`` or ``method="regular"`` (up to float near-ties), so an
      interrupted run can be resumed exactly. A model draft is accepted somewhat less often (at
      worst ``(1 - TV) / (1 + TV)`` instead of ``1 - TV``); a deterministic proposer loses nothing.
      Also: another registered name (``acceptance.register_acceptance``), ``py:<module>.<Class>``,
      or an ``AcceptanceRule`` instance of one's own (docs/extending.md).

  **Speculation.**

  Attributes:
    method: ``"bass"`` (batched speculative sampling, Qian et al. 2024, §3) or ``"regular"``
      (batched autoregressive decoding with the same model code: the decode without a proposer).
    draft_len: ``"dynamic"`` (Algorithm 1 with the paper's defaults), a ``DynamicDraftLen`` with
      other constants, a fixed int (at most ``MAX_DRAFT_LEN`` = 32), or ``"goodput"`` / a
      ``GoodputDraftLen``: per step the length (0 = a plain decoding step) that maximizes expected
      tokens per second, from running acceptance rates and the step costs of this setting
      (measured on first use, once per process, unless given).
    draft_tree: None verifies a chain per row each step. A :class:`TreeShape` or its text
      (``"top_k=4,depth=5,nodes=16"``) verifies a token tree per row instead (EAGLE-2, Li et al.
      2024; docs/design.md "Token trees"): a draft model grows it, a hybrid puts its lookup
      continuations in first, and the target scores all ``nodes`` positions of a row in one forward;
      each row accepts the longest path the acceptance rule allows. With ``draft_len`` at its
      default every step verifies the tree; with ``"goodput"`` each step chooses among a plain step,
      chains and the shapes given (a sequence of shapes compiles each as a static variant).
    verify_chunk: C, the positions one verification forward scores (compiled once): a step with
      ``l`` drafts scores its ``l + 1`` positions in passes of C and stops once every row has
      rejected. None takes the profile's: 4 on a CPU; on a GPU ``L + 1`` (one pass, no loop). At
      most ``MAX_DRAFT_LEN + 1`` = 33.

  **Batching.**

  Attributes:
    batch_size: rows that decode at once. None, or at least the number of prompts, decodes them all
      as one static batch; fewer is continuous batching: a row that finishes takes the next waiting
      prompt inside the jitted loop (a device-side queue, a chunked prefill of the admitted rows,
      the proposer's state restarted for them; Orca's iteration-level scheduling, as vLLM and SGLang
      do). Outputs come back in the order of the prompts, each equal to decoding that prompt alone
      (greedy, up to float near-ties) or distributed as the target's (sampled). On a mesh,
      continuous batching needs a ``data`` axis of size 1 (its admission prefill does not split
      over rows).
    max_cache_len: if given, the most cache slots per row the decode may allocate.
    max_prompt_len: the prompt capacity the programs are built for (rounded up to a power of two,
      at least 16): every call of this setting with prompts up to this long runs the same programs,
      whatever its prompts' lengths (the prefill and the cache have the capacity's positions). None: the longest prompt's bucket, or the capacity of programs this process
      already built for the setting if larger (a later call with shorter prompts compiles nothing).
      Scripts pass the longest prompt of the whole run, so that a run compiles once per batch size.

  **Backend.**

  Attributes:
    attention_impl: attention implementation for both models (``attention_implementations()``);
      None takes the profile's (``"reference"`` on a CPU, ``"pallas_split"`` on a GPU).
    profile: the backend profile whose defaults fill ``attention_impl`` and ``verify_chunk``, say
      whether the program is branch-free, and how a continuous batch prefills the prompts it admits
      (``bass_jax.profiles``): ``"cpu"``, ``"gpu"``, a :class:`BackendProfile`, or None for the
      profile of the platform the decode is compiled for (``jax.default_backend()``).
    mesh: a ``jax.sharding.Mesh`` with axes ``"data"`` and ``"model"`` (``bass_jax.sharding``): rows
      split over ``data`` (padded with inert rows to a multiple of its size), the target's weights
      tensor-parallel over ``model`` by its family's rule table, its caches split by KV head where
      the head count allows. None takes the mesh set with ``jax.set_mesh`` if it has those axes,
      else the target's (``load_model(..., mesh=m)``), else one device. The tokens do not depend on
      the mesh (``jax_threefry_partitionable``), up to float near-ties.
    draft_sharding: how a draft model lies on the mesh: ``"replicated"`` (whole on every device, its
      rows split over ``data``; docs/scaling.md) or ``"tensor_parallel"`` (like the target).
  """

  # Sampling.
  max_new_tokens: int = 128
  temperature: float = 0.0
  top_p: float = 1.0
  seed: int = 0
  eos_token_id: int | Sequence[int] | None = None
  acceptance: str | AcceptanceRule = "rejection"
  # Speculation.
  method: str = "bass"
  draft_len: int | str | DraftLenPolicy = "dynamic"
  draft_tree: str | TreeShape | Sequence[str | TreeShape] | None = None
  verify_chunk: int | None = None
  # Batching.
  batch_size: int | None = None
  max_cache_len: int | None = None
  max_prompt_len: int | None = None
  # Backend.
  attention_impl: str | None = None
  profile: str | BackendProfile | None = None
  mesh: jax.sharding.Mesh | None = None
  draft_sharding: str = "replicated"



# generate's keywords that are not DecodeConfig fields: what prepare takes beside the config, and what
# run takes.
PREPARE_KEYWORDS = ("sequence_ids",)
RUN_KEYWORDS = ("time_prompts", "on_finish", "compilation_cache")  # the last: the process's cache


def split_keywords(keywords: dict[str, Any]) -> tuple[DecodeConfig, dict[str, Any], dict[str, Any]]:
  """``generate``'s keywords as ``(config, prepare's keywords, run's keywords)``.

  Raises:
    TypeError: a keyword ``generate`` does not take, naming it.
  """
  prepare_kw = {k: v for k, v in keywords.items() if k in PREPARE_KEYWORDS}
  run_kw = {k: v for k, v in keywords.items() if k in RUN_KEYWORDS}
  settings = {k: v for k, v in keywords.items() if k not in PREPARE_KEYWORDS + RUN_KEYWORDS}
  return with_settings(None, settings), prepare_kw, run_kw


def with_settings(config: DecodeConfig | None, settings: dict[str, Any]) -> DecodeConfig:
  """``config`` (default :class:`DecodeConfig`) with ``settings`` (field name -> value) over it.

  Raises:
    TypeError: a setting that is not a field, naming it and the fields.
  """
  names = {f.name for f in dataclasses.fields(DecodeConfig)}
  unknown = sorted(set(settings) - names)
  if unknown:
    raise TypeError(f"unknown decode setting {unknown[0]!r}; DecodeConfig's fields are "
                    f"{sorted(names)}")
  return dataclasses.replace(config or DecodeConfig(), **settings)


MAX_SEED = 2**63 - 1  # generate's seeds: all 64 bits of the threefry key count (generate.prng_key)


def check_seed(seed: Any, runs: int = 1) -> int:
  """Checks a run's seed: an int such that every seed the run derives from it, ``seed .. seed + runs -
  1`` (a static batch ``i`` decodes with ``seed + i``), lies in ``[0, MAX_SEED]``.

  Args:
    seed: the run's seed (a Python or NumPy int). runs: the seeds the run derives (its static batches).

  Returns:
    The seed as a Python int.

  Raises:
    ValueError: not an int, negative, or too large for ``runs`` batches (the largest allowed named).
  """
  runs = _checks.as_int("runs", runs, min_value=1)
  return _checks.as_int("seed" if runs == 1 else f"seed (with {runs} batches, seed + {runs - 1})",
                        seed, min_value=0, max_value=MAX_SEED - (runs - 1))


def check_speculation(method: str, draft_len: Any, draft_tree: Any, *, vocab_size: int | None = None,
                      context: int | None = None) -> tuple[Any, tuple[Any, ...]]:
  """The speculation settings of a run, checked together: the one place ``generate`` and every script
  decide them.

  Args:
    method: ``"bass"`` or ``"regular"``.
    draft_len: ``"dynamic"``, ``"goodput"``, an int in ``[1, draft_len.MAX_DRAFT_LEN]`` or a policy.
    draft_tree: None, or shapes as ``tree.tree_shapes`` takes them.
    vocab_size, context: the models' (when known), which a tree shape must fit
      (``TreeShape.check_fits``) and a fixed draft length must stay below.

  Returns:
    ``(policy, trees)``: the draft-length policy (None for regular decoding; with one tree shape and
    the default policy, a fixed length of its depth; with goodput, the policy choosing among the
    shapes) and the tree shapes (empty for chains).

  Raises:
    ValueError: an unknown method, a bad draft length or tree shape (``tree.TreeShape.parse``), a tree
      with regular decoding, several shapes without ``draft_len="goodput"``, a tree with a fixed
      length, or a shape or length that does not fit the models.
  """
  if method not in ("bass", "regular"):
    raise ValueError(f"method must be 'bass' or 'regular', got {method!r}")
  trees = tree_lib.tree_shapes(draft_tree)
  if method == "regular":
    if trees:
      raise ValueError("draft_tree needs method='bass': regular decoding drafts nothing")
    return None, ()
  policy = draft_len_lib.as_policy(draft_len)
  if context is not None and isinstance(policy, draft_len_lib.FixedDraftLen):
    if policy.length >= context:
      raise ValueError(f"draft_len={policy.length} must be below the models' context of {context} "
                       "positions; lower it")
  for shape in trees:
    if vocab_size is not None and context is not None:
      shape.check_fits(vocab_size=vocab_size, context=context)
  if not trees:
    return policy, ()
  if isinstance(policy, draft_len_lib.GoodputDraftLen):
    return dataclasses.replace(policy, trees=trees), trees
  if not (isinstance(draft_len, str) and draft_len == "dynamic"):
    raise ValueError(f"draft_len={draft_len!r} chooses chain lengths; with draft_tree leave it at its "
                     "default (every step verifies the tree) or pass 'goodput' (each step chooses "
                     "among plain steps, chains and the tree shapes)")
  if len(trees) > 1:
    raise ValueError(f"draft_tree names {len(trees)} shapes: choosing among them per step needs "
                     "draft_len='goodput' (or give one shape)")
  return draft_len_lib.as_policy(trees[0].depth), trees
