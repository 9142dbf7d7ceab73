"""``prepare``: a decode's arguments checked and turned into a :class:`Plan` (its static spec, the
programs' arguments placed on the device or mesh, and what the host needs to read the results), the
first half of the public seam ``plan = prepare(target, draft, prompts, config)``; ``run(plan)``
(``bass_jax.sampling.runner``) is the second.

Shapes come in buckets so that nearby calls share one compiled program: the batch is padded with inert
rows to a batch bucket (1, 2, 4, 8, 16, then multiples of 16), prompts to a prompt capacity (a power of
two, at least 16: ``max_prompt_len``'s, else the longest prompt's, or the larger capacity of programs
already built for the same setting, so that a shorter call compiles nothing) and the output buffer to
a multiple of 32 tokens, while ``max_new_tokens``, the EOS ids, ``temperature``, ``top_p`` and the seed
are traced values.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax import _checks
from bass_jax import profiles
from bass_jax import sharding as sharding_lib
from bass_jax.loading import Model
from bass_jax.models import attention_registry
from bass_jax.sampling import calibration
from bass_jax.sampling import compile_cache
from bass_jax.sampling import config as config_lib
from bass_jax.sampling import costs as costs_lib
from bass_jax.sampling import programs
from bass_jax.sampling import state as state_lib
from bass_jax.sampling import warp
from bass_jax.sampling.acceptance import acceptance_rule
from bass_jax.sampling.config import DecodeConfig
from bass_jax.sampling.draft_len import MAX_DRAFT_LEN, GoodputDraftLen, NoDrafts
from bass_jax.sampling.drafts import resolve_draft
from bass_jax.sampling.proposers import NoProposer, Replay

_MIN_PROMPT_BUCKET = 16
_OUTPUT_BUCKET = 32  # the output buffer holds a multiple of this many tokens
MAX_EOS_IDS = 8  # EOS ids are a traced array of this many slots (padded with -1)
MAX_SEED = config_lib.MAX_SEED


@dataclasses.dataclass(frozen=True)
class Plan:
  """A checked decode, ready to run (:func:`prepare`; ``runner.run``): its programs' spec and
  arguments, and what the host needs to run them and read the results.

  Attributes:
    config: the :class:`DecodeConfig` it was prepared from.
    spec: the decode's static :class:`state.DecodeSpec` (one compiled program per spec and shapes).
    args_prefill: ``loop.prefill``'s arguments after the spec: ``(target_params, draft_params,
      inputs)``, placed on the device or mesh.
    args_tail: ``loop.decode``'s arguments after the state, less ``observe``: ``(target_params,
      draft_params, temperature, top_p)``.
    num_prompts: the real prompts. slots: rows decoding at once (``batch_size``, at most the
      prompts). rows: the rows the programs run (the batch bucket, a multiple of the mesh's data
      axis), inert past ``slots``.
    max_new_tokens: tokens per row at most.
    place: puts a host scalar where the programs expect it (the device, or replicated on the mesh).
    host: reads a device array back (``np.asarray``, or ``sharding.to_host`` on a mesh).
    step_costs: the ``StepCosts`` a cost-aware draft length uses (None otherwise, and None until
      ``run`` has measured them when ``calibrate``).
    profile: the backend profile's name.
    calibrate: the step costs are still to be measured in the decode's own program
      (``calibration.calibrate``, which ``run`` calls first); until then the decode's traced costs
      make every step plain.
    prepare_seconds: the wall seconds :func:`prepare` took.
  """

  config: DecodeConfig
  spec: state_lib.DecodeSpec
  args_prefill: tuple
  args_tail: tuple
  num_prompts: int
  slots: int
  rows: int
  max_new_tokens: int
  place: Callable[[Any], Any]
  host: Callable[[Any], np.ndarray]
  step_costs: Any
  profile: str
  calibrate: bool = False
  prepare_seconds: float = 0.0


def prompt_bucket(length: int) -> int:
  """Prompt padding: the next power of two (at least 16), so new prompts rarely recompile."""
  return max(_MIN_PROMPT_BUCKET, 1 << (length - 1).bit_length())


def batch_bucket(batch: int) -> int:
  """Rows a batch of ``batch`` prompts runs as: 1, 2, 4, 8, 16, then the next multiple of 16. The extra
  rows are inert (done from the start) but are computed, so a batch just past a bucket costs more."""
  if batch <= 16:
    return 1 << (batch - 1).bit_length()
  return -(-batch // 16) * 16


def output_bucket(max_new_tokens: int) -> int:
  """The output buffer's size for ``max_new_tokens``: the next multiple of 32."""
  return -(-max_new_tokens // _OUTPUT_BUCKET) * _OUTPUT_BUCKET


def prng_key(seed: int) -> jax.Array:
  """The PRNG key of a seed in ``[0, 2**63)``: all 64 bits count (``jax.random.key`` keeps only the low
  32 without x64, so seed 2**32 would repeat seed 0). Equal to ``jax.random.key(seed)`` (threefry)
  below 2**32.

  Raises:
    ValueError: a seed that is not an int in range (names ``seed``).
  """
  seed = config_lib.check_seed(seed)
  data = np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)
  return jax.random.wrap_key_data(data, impl="threefry2x32")


def _eos_ids(eos_token_id, target: Model) -> tuple[int, ...]:
  if eos_token_id is None:
    eos_token_id = target.config.eos_token_id
  if eos_token_id is None:
    return ()
  return _checks.as_int_tuple("eos_token_id", eos_token_id, min_value=0,
                              max_value=target.config.vocab_size - 1)


_BOOLS = frozenset({bool, np.bool_})  # numpy reads [True, 2] as the ids [1, 2]


def _validate_prompts(prompts: Any, vocab_size: int) -> list[np.ndarray]:
  """B prompts as a list of ``i32[len_b]`` arrays: a list of token-id sequences, or a 2-D integer array
  (NumPy or JAX) of B prompts of equal length."""
  if isinstance(prompts, (str, bytes)):
    raise ValueError("prompts must be token ids (a list of token-id lists or an i32[B, T] array), got "
                     "a string; tokenize it first, or call bass_jax.generate_text")
  if isinstance(prompts, (np.ndarray, jax.Array)):
    if prompts.ndim != 2 or not np.issubdtype(prompts.dtype, np.integer):
      raise ValueError(f"a prompts array must be a 2-D integer array [batch, time], got "
                       f"{prompts.dtype}{tuple(prompts.shape)}")
    prompts = list(np.asarray(prompts))
  if not isinstance(prompts, Sequence):
    raise ValueError(f"prompts must be a list of token-id lists or an i32[B, T] array, got "
                     f"{type(prompts).__name__}")
  if len(prompts) < 1:
    raise ValueError("prompts is empty: the batch needs at least one prompt (batch_size >= 1)")
  arrays = []
  for i, prompt in enumerate(prompts):
    if isinstance(prompt, (str, bytes)):
      raise ValueError(f"prompt {i} is a string; tokenize it first, or call bass_jax.generate_text")
    if _checks.is_int(prompt):
      raise ValueError(f"prompt {i} is a single int: prompts must be a list of prompts, each a list "
                       "of token ids (for one prompt pass [ids])")
    if isinstance(prompt, (list, tuple)) and not _BOOLS.isdisjoint(map(type, prompt)):  # C-level scan
      raise ValueError(f"prompt {i} holds a boolean; token ids are ints (True is not token 1)")
    arr = np.asarray(prompt)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
      raise ValueError(f"prompt {i} must be a flat list of integer token ids, got {arr.dtype}{arr.shape}")
    if arr.size == 0:
      raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")
    if arr.min() < 0 or arr.max() >= vocab_size:
      raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): "
                       f"min {arr.min()}, max {arr.max()}")
    arrays.append(arr.astype(np.int32))
  return arrays


def _sequence_ids(sequence_ids, num_prompts: int) -> np.ndarray:
  """``sequence_ids`` checked: ``num_prompts`` distinct ints in ``[0, 2**32)``, or the prompt indices
  when None."""
  if sequence_ids is None:
    return np.arange(num_prompts, dtype=np.uint32)
  ids = _checks.as_int_tuple("sequence_ids", sequence_ids, min_value=0, max_value=2**32 - 1)
  if len(ids) != num_prompts:
    raise ValueError(f"sequence_ids has {len(ids)} ids for {num_prompts} prompts; give one per prompt")
  if len(set(ids)) != len(ids):
    repeated = sorted({i for i in ids if ids.count(i) > 1})[:5]
    raise ValueError(f"sequence_ids repeats {repeated}: two sequences with one id would share their "
                     "keys under a keyed acceptance rule (acceptance='gumbel'); give each sequence "
                     "its own id")
  return np.asarray(ids, np.uint32)


def _scanned_on_mesh(models) -> None:
  if any(m.scanned_layers for m in models):
    raise ValueError("generate on a mesh needs models with unrolled layers (scanned layers do not run "
                     "sharded yet): load them with scan_layers=False or convert with "
                     "model.with_scanned_layers(False)")


def prepare(target: Model, draft: Any, prompts: Any, config: DecodeConfig = DecodeConfig(), *,
            sequence_ids: Sequence[int] | None = None) -> Plan:
  """Checks a decode and builds its :class:`Plan`: no device work but placing the inputs and, for a
  cost-aware draft length without costs, measuring the step costs.

  Args:
    target: the model whose distribution is sampled (``bass_jax.load_model``).
    draft: the draft side (``bass_jax.sampling.proposers``): a draft model sharing the target's
      tokenizer; an ``NGramProposer`` (model-free prompt lookup); a ``SiblingProposer`` (model-free
      lookup in the other samples of each row's prompt: rows with identical prompts are siblings);
      ``Hybrid(model, lookups)``; ``Replay(model, text)`` (a benchmark's recorded
      continuation at set acceptance rates); or your own ``Proposer``, alone or as ``(proposer,
      params)`` with its weights (docs/extending.md). Ignored (may be None) for ``method="regular"``.
    prompts: B token-id lists of any lengths, each non-empty; or an integer array ``[B, T]``.
    config: the :class:`DecodeConfig`.
    sequence_ids: with a keyed acceptance rule (Gumbel acceptance), prompt i's draws are keyed by
      ``fold_in(key(seed), sequence_ids[i])``: distinct ints in ``[0, 2**32)``, one per prompt (default: the prompt's
      index). Give a sequence the same id wherever it is decoded (a resumed run decodes only what is
      missing) and it gets the same tokens.

  Returns:
    The :class:`Plan`.

  Raises:
    ValueError: naming the setting, for an argument of the wrong type or out of range; an unknown
      method, acceptance, attention_impl or profile; no draft for BASS; a draft whose tokenizer
      differs from the target's; empty prompts or token ids outside the vocabulary; a bad draft
      length, chunk size or tree shape (``config_lib.check_speculation``); prompt + ``max_new_tokens``
      beyond the models' context or ``max_cache_len``; a mesh without the axes ``data`` and
      ``model``, with ``jax_threefry_partitionable`` off, with scanned layers, or with a ``data``
      axis larger than 1 under continuous batching; ``sequence_ids`` of the wrong length, out of
      range or repeated.
  """
  started = time.perf_counter()
  c = config
  if not isinstance(c, DecodeConfig):
    raise ValueError(f"config must be a DecodeConfig, got {type(c).__name__}")
  if not isinstance(target, Model):
    raise ValueError(f"target must be a bass_jax.Model (see bass_jax.load_model), got "
                     f"{type(target).__name__}")
  if not isinstance(c.method, str) or c.method not in ("bass", "regular"):
    raise ValueError(f"method must be 'bass' or 'regular', got {c.method!r}")
  profile = profiles.backend_profile(c.profile)
  attention_impl = profile.attention_impl if c.attention_impl is None else c.attention_impl
  if not isinstance(attention_impl, str):
    raise ValueError("attention_impl must be a name, one of "
                     f"{attention_registry.attention_implementations()}")
  attention_registry.lookup(attention_impl)  # raises for an unknown name
  bass = c.method == "bass"
  attention_impl = attention_registry.implementation_for_heads(
      attention_impl, _head_dims(target, draft if bass else None),
      chosen_by_user=c.attention_impl is not None)
  mesh = sharding_lib.resolve_mesh(c.mesh) or sharding_lib.mesh_of(target.params)
  if c.draft_sharding not in sharding_lib.RULES:
    raise ValueError(f"draft_sharding must be one of {sorted(sharding_lib.RULES)}, got "
                     f"{c.draft_sharding!r}")
  target_plan = None
  if mesh is not None:
    _scanned_on_mesh([target])
    if not jax.config.jax_threefry_partitionable:
      raise ValueError("generate on a mesh needs jax.config.update('jax_threefry_partitionable', True) "
                       "(JAX's default), so that random draws do not depend on how arrays are split")
    target_plan = sharding_lib.plan(target.config, mesh, "tensor_parallel", name="the target")
  proposer, draft_params, draft_models = NoProposer(), None, []
  if bass:
    if draft is None:
      raise ValueError("method='bass' needs a draft: a draft model, an NGramProposer, a "
                       "SiblingProposer, a Hybrid or a Replay")
    proposer, draft_params, draft_models = resolve_draft(draft, target, attention_impl, mesh=mesh,
                                                         draft_sharding=c.draft_sharding)
  if mesh is not None:
    _scanned_on_mesh(draft_models)
  max_new_tokens = _checks.as_int("max_new_tokens", c.max_new_tokens, min_value=1)
  temperature = _checks.as_float("temperature", c.temperature, min_value=0.0)
  top_p = _checks.as_float("top_p", c.top_p, min_value=0.0, min_exclusive=True, max_value=1.0)
  key = prng_key(c.seed)
  max_cache_len = (None if c.max_cache_len is None
                   else _checks.as_int("max_cache_len", c.max_cache_len, min_value=1))
  context = min(m.config.max_positions for m in [target] + draft_models)
  policy, trees = config_lib.check_speculation(c.method, c.draft_len, c.draft_tree,
                                              vocab_size=target.config.vocab_size, context=context)
  _check_tree_windows(trees, target, draft_models, attention_impl)
  chunk = 0  # with a proposer, None until the spec knows L: one pass of L + 1 (profiles)
  if bass:
    chunk = (profile.verify_chunk if c.verify_chunk is None
             else _checks.as_int("verify_chunk", c.verify_chunk, min_value=1,
                                 max_value=MAX_DRAFT_LEN + 1))
  batch_size = (None if c.batch_size is None
                else _checks.as_int("batch_size", c.batch_size, min_value=1))
  rule = acceptance_rule(c.acceptance, greedy=temperature == 0, branch_free=profile.branch_free)
  eos_ids = _eos_ids(c.eos_token_id, target)
  if len(eos_ids) > MAX_EOS_IDS:
    raise ValueError(f"eos_token_id has {len(eos_ids)} ids; at most {MAX_EOS_IDS} are supported")

  arrays = _validate_prompts(prompts, target.config.vocab_size)
  lengths = np.array([len(a) for a in arrays], np.int32)
  sequence_ids = _sequence_ids(sequence_ids, len(arrays))
  if lengths.max() + max_new_tokens > context:
    notes = [getattr(m.config, "context_note", None) for m in [target] + draft_models]
    why = "".join(f" ({note})" for note in dict.fromkeys(n for n in notes if n))
    raise ValueError(
        f"longest prompt ({lengths.max()} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
        f"models' context of {context} positions{why}; shorten the prompt or lower max_new_tokens")

  # The queue: every prompt, the rows taking the first `slots`. Prompts wait for a row only when
  # there are more than `slots` of them (continuous batching); the queue is then longer than the
  # rows, which is what compiles the admission (batching.refill).
  num_prompts = len(arrays)
  slots = min(batch_size or num_prompts, num_prompts)  # rows decoding at once
  rows = bucket_rows = batch_bucket(slots)
  if mesh is not None:  # inert rows up to a multiple of the data axis
    rows = -(-rows // mesh.shape[sharding_lib.DATA]) * mesh.shape[sharding_lib.DATA]
  waits = num_prompts > slots
  if waits and isinstance(draft, Replay) and bass:
    raise ValueError(f"a Replay draft reads row b's recording for row b: decode its {num_prompts} "
                     f"prompts in one static batch (batch_size >= {num_prompts}), not {slots} at a "
                     "time")
  if waits and mesh is not None and mesh.shape[sharding_lib.DATA] > 1:
    raise ValueError(
        f"continuous batching (batch_size={batch_size} < {num_prompts} prompts) runs its admission "
        f"prefill unsplit over rows, so it needs a mesh whose data axis has size 1, got "
        f"{dict(mesh.shape)}; use a mesh of shape (1, n), or batch_size=None for static batches")
  # A queue that admits is longer than the batch (Queue.admits): the prompts' bucket, or the next one
  # past the rows where the two buckets meet.
  queue_len = batch_bucket(max(num_prompts, rows + 1)) if waits else rows
  max_new_bucket = output_bucket(max_new_tokens)
  # The log's steps: Limits.step_limit at the bucket's sizes (any batch_size of this bucket fills
  # >= rows / 2); nothing to log without a proposer.
  history_len = max_new_bucket + (
      -(-batch_bucket(num_prompts) * max_new_bucket // -(-rows // 2)) if waits else 0)
  step_limit = max_new_tokens + (-(-num_prompts * max_new_tokens // slots) if waits else 0)

  longest = int(lengths.max())
  max_prompt_len = (None if c.max_prompt_len is None
                    else _checks.as_int("max_prompt_len", c.max_prompt_len, min_value=1))
  if max_prompt_len is not None and longest > max_prompt_len:
    raise ValueError(f"a prompt has {longest} tokens, more than max_prompt_len={max_prompt_len}; "
                     "raise max_prompt_len (or leave it None) or shorten the prompt")
  bucket = prompt_bucket(max(longest, max_prompt_len or 0))  # P; an admission's chunk tiles it
  spec = state_lib.DecodeSpec(
      target=target.config, proposer=proposer, target_dtype=jnp.dtype(target.dtype).name,
      attention_impl=attention_impl, prompt_len=bucket, max_new_bucket=max_new_bucket,
      acceptance=rule, draft_len=policy or NoDrafts(), verify_chunk=chunk or 0,
      target_sharding=target_plan, queue_len=queue_len,
      history_len=history_len if proposer.proposes else 0, draft_trees=trees,
      admit_rows=min(profile.admit_rows, bucket_rows), admit_chunk=min(profile.admit_chunk, bucket),
      compiler_options=profile.compiler_options)
  if chunk is None:
    spec = dataclasses.replace(spec, verify_chunk=spec.max_draft + 1)
  if max_prompt_len is None:  # the prompt capacity of programs already built, where they fit
    spec = _reuse_capacity(spec, rows, profile, max_cache_len)
  if max_cache_len is not None and spec.cache_len > max_cache_len:
    raise ValueError(
        f"the decode needs {spec.cache_len} cache slots per row (prompt padded to {spec.prompt_len} + "
        f"{spec.max_new_bucket} output slots (max_new_tokens={max_new_tokens} padded) + "
        f"{spec.max_draft + 1} verification look-ahead = {spec.cache_needed}, rounded up to a multiple of "
        f"{state_lib.CACHE_ALIGNMENT} for the kernels' tiles), more than max_cache_len={max_cache_len};"
        " raise max_cache_len, or lower max_new_tokens, the draft length or the prompt length")

  prompts_q = np.zeros((queue_len, spec.prompt_len), np.int32)
  for i, a in enumerate(arrays):
    prompts_q[i, :len(a)] = a
  prompt_len_q = np.ones(queue_len, np.int32)  # padding: a one-token prompt, never decoded
  prompt_len_q[:num_prompts] = lengths
  keys_q = np.zeros((queue_len, 2), np.uint32)
  if spec.keyed:
    keys_q[:num_prompts] = warp.sequence_keys(key, sequence_ids)
  # Identical prompts are siblings (a proposer may draft from each other's text); padding prompts
  # are groups of their own.
  first_of = {}
  group_q = -1 - np.arange(queue_len, dtype=np.int32)
  for i, a in enumerate(arrays):
    group_q[i] = first_of.setdefault(a.tobytes(), i)
  eos_array = np.full(MAX_EOS_IDS, -1, np.int32)
  eos_array[:len(eos_ids)] = eos_ids
  target_params = target.params
  if mesh is not None:  # after every check: a bad argument copies no weights
    target_params = sharding_lib.shard_params(target_params, target_plan)
    if draft_params is not None:
      draft_params = sharding_lib.shard_params(draft_params, proposer.sharding)
  compile_cache.ensure_configured()  # the persistent cache, before the cost forwards compile
  step_costs, calibrate = None, calibration.needs_calibration(spec, policy)
  traced_costs = calibration.forced(spec, speculate=False) if calibrate else None  # plain until run
  if isinstance(policy, GoodputDraftLen) and not calibrate:
    step_costs = policy.costs or costs_lib.measure_step_costs(spec, target_params, draft_params, rows)
    traced_costs = step_costs
  inputs = state_lib.DecodeInputs(
      prompts=prompts_q, prompt_len=prompt_len_q, keys=keys_q, group=group_q,
      num_prompts=np.int32(num_prompts), inert=np.arange(rows) >= slots,
      max_new=np.int32(max_new_tokens), step_limit=np.int32(step_limit), eos_ids=eos_array,
      key=key, step_costs=(traced_costs.as_array() if traced_costs is not None
                           else np.zeros(6, np.float32)))
  if mesh is None:
    place, host = jnp.asarray, np.asarray
    inputs = jax.tree_util.tree_map(place, inputs)
  else:  # rows over data, the rest replicated
    place = lambda a: sharding_lib.put(a, target_plan.replicate)
    host = sharding_lib.to_host
    inputs = jax.tree_util.tree_map(sharding_lib.put, inputs,
                                    inputs.placed(target_plan.rows, target_plan.replicate))
  # top_p = 1 is None: no nucleus, decided when compiling (warp.warped_log_probs).
  scalars = (place(np.float32(max(temperature, 1e-6))),
             None if top_p == 1 else place(np.float32(top_p)))
  return Plan(config=c, spec=spec, args_prefill=(target_params, draft_params, inputs),
              args_tail=(target_params, draft_params, *scalars), num_prompts=num_prompts,
              slots=slots, rows=rows, max_new_tokens=max_new_tokens, place=place, host=host,
              step_costs=step_costs, profile=profile.name, calibrate=calibrate,
              prepare_seconds=time.perf_counter() - started)


def _reuse_capacity(spec: state_lib.DecodeSpec, rows: int, profile: profiles.BackendProfile,
                    max_cache_len: int | None) -> state_lib.DecodeSpec:
  """``spec`` at the largest prompt capacity P of the programs in memory for its setting
  (``programs.largest_prompt_len``), if that is larger and its cache fits ``max_cache_len``: a call
  with shorter prompts then runs those programs (paying their capacity's prefill) instead of compiling
  programs of its own bucket."""
  largest = programs.largest_prompt_len(programs.family_key(spec, rows))
  if largest <= spec.prompt_len:
    return spec
  wider = dataclasses.replace(spec, prompt_len=largest, admit_chunk=min(profile.admit_chunk, largest))
  if max_cache_len is not None and wider.cache_len > max_cache_len:
    return spec
  return wider


def _head_dims(target: Model, draft: Any) -> dict[str, int]:
  """``{name: head dim}`` of the target and of the draft model inside ``draft`` (itself, or the model
  a ``Hybrid`` or ``Replay`` wraps; an EAGLE draft's layer), for the attention's kernel choice."""
  models = [target]
  inner = draft
  while inner is not None and not isinstance(inner, Model):
    inner = getattr(inner, "model", None)
  if isinstance(inner, Model):
    models.append(inner)
  dims = {}
  for i, model in enumerate(models):
    config = getattr(model.config, "layer", model.config)
    head_dim = getattr(config, "head_dim", None)
    if isinstance(head_dim, int):
      dims[model.name or ("the target" if i == 0 else "the draft")] = head_dim
  return dims


def _check_tree_windows(trees, target: Model, draft_models, attention_impl: str) -> None:
  """Token trees and sliding windows: a windowed target runs trees on the reference attention only,
  a windowed draft model not at all (one-line errors that say why)."""
  if not trees:
    return
  if getattr(target.config, "sliding_window", None) is not None and attention_impl != "reference":
    raise ValueError("draft_tree with a sliding-window target runs on attention_impl='reference' "
                     "only (the kernels place a query by slot, a tree node by depth)")
  windowed = [m.name for m in draft_models  # an EAGLE draft's window is its layer's
              if getattr(getattr(m.config, "layer", m.config), "sliding_window", None) is not None]
  if windowed:
    raise ValueError(f"draft_tree: the draft model {windowed[0]} has a sliding window, and a tree "
                     "grows its levels as queries over earlier nodes, which a window over a tree "
                     "does not support; use a draft without a window, n-gram lookup or chains")
