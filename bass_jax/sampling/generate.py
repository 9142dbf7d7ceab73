"""`generate`: validate, bucket the shapes, compile once per bucket, run the jitted decode, time every row.

Compilation. A program is specialized to its shapes and to the static settings of
:class:`state.DecodeSpec`; to let nearby calls share one, the batch is padded with inert rows to a batch
bucket (1, 2, 4, 8, 16, then multiples of 16), prompts to a power of two (at least 16) and the output
buffer to a multiple of 32 tokens, while ``max_new_tokens``, the EOS ids, ``temperature``, ``top_p`` and
the seed are traced values. The prefill and decode programs of a setting are compiled in parallel and
kept in a bounded LRU cache (:func:`clear_compile_cache`, :func:`set_compile_cache_size`); JAX's
persistent compilation cache (:func:`enable_persistent_compilation_cache`, or the environment variable
``JAX_COMPILATION_CACHE_DIR``) makes them survive the process.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax import _checks
from bass_jax import preflight
from bass_jax import sharding as sharding_lib
from bass_jax.loading import Model
from bass_jax.models import attention as attention_lib
from bass_jax.sampling import costs as costs_lib
from bass_jax.sampling import loop
from bass_jax.sampling import profiles
from bass_jax.sampling import state as state_lib
from bass_jax.sampling import warp
# The compiled programs' LRU (tests read _PROGRAMS and patch _compiled here); the public names stay
# importable from this module.
from bass_jax.sampling.programs import _PROGRAMS  # pylint: disable=unused-import
from bass_jax.sampling.programs import compiled as _compiled
from bass_jax.sampling.programs import (clear_compile_cache,  # pylint: disable=unused-import
                                        enable_persistent_compilation_cache,
                                        set_compile_cache_size)
from bass_jax.sampling.draft_len import MAX_DRAFT_LEN, DraftLenPolicy, GoodputDraftLen, as_policy
from bass_jax.sampling.tree import TreeShape, tree_shapes  # pylint: disable=unused-import
# The draft side and the outputs live in their own modules; their names stay importable from here.
from bass_jax.sampling.drafts import (Hybrid, load_draft_spec,  # pylint: disable=unused-import
                                      resolve_draft)
from bass_jax.sampling.outputs import FinishedPrompt, GenerateOutput, GenerateStats
from bass_jax.sampling.profiles import BackendProfile
from bass_jax.sampling.proposers import NGramProposer, SiblingProposer

PAD_TOKEN = -1  # fills ``GenerateOutput.tokens`` past each row's length; never a real token id
_MIN_PROMPT_BUCKET = 16
_OUTPUT_BUCKET = 32  # the output buffer holds a multiple of this many tokens
_MAX_EOS_IDS = 8  # EOS ids are a traced array of this many slots (padded with -1)
ACCEPTANCE_RULES = ("rejection", "gumbel")  # generate's acceptance= (state.DecodeSpec.acceptance)


@dataclasses.dataclass
class _Call:
  """What :func:`_prepare` builds for one ``generate`` call: its spec, the programs' arguments, and
  what the host needs to run them and read the results."""

  spec: state_lib.DecodeSpec
  args_prefill: tuple
  args_tail: tuple
  bass: bool
  continuous: bool
  num_prompts: int
  slots: int
  rows: int
  inert: np.ndarray
  lengths: np.ndarray
  max_new_tokens: int
  time_prompts: bool
  on_finish: Any
  host: Callable
  proposer: Any
  step_costs: Any
  mesh: Any
  profile: str


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


def _eos_ids(eos_token_id, target: Model) -> tuple[int, ...]:
  if eos_token_id is None:
    eos_token_id = target.config.eos_token_id
  if eos_token_id is None:
    return ()
  return _checks.as_int_tuple("eos_token_id", eos_token_id, min_value=0,
                              max_value=target.config.vocab_size - 1)


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


MAX_SEED = preflight.MAX_SEED


def _sequence_ids(sequence_ids, num_prompts: int) -> np.ndarray:
  """``generate``'s ``sequence_ids`` checked: ``num_prompts`` distinct ints in ``[0, 2**32)``, or the
  prompt indices when None."""
  if sequence_ids is None:
    return np.arange(num_prompts, dtype=np.uint32)
  ids = _checks.as_int_tuple("sequence_ids", sequence_ids, min_value=0, max_value=2**32 - 1)
  if len(ids) != num_prompts:
    raise ValueError(f"sequence_ids has {len(ids)} ids for {num_prompts} prompts; give one per prompt")
  if len(set(ids)) != len(ids):
    repeated = sorted({i for i in ids if ids.count(i) > 1})[:5]
    raise ValueError(f"sequence_ids repeats {repeated}: two sequences with one id would share their "
                     "noise (acceptance='gumbel'); give each sequence its own id")
  return np.asarray(ids, np.uint32)


def prng_key(seed: int) -> jax.Array:
  """The PRNG key of a seed in ``[0, 2**63)``: all 64 bits count (``jax.random.key`` keeps only the low
  32 without x64, so seed 2**32 would repeat seed 0). Equal to ``jax.random.key(seed)`` (threefry)
  below 2**32.

  Raises:
    ValueError: a seed that is not an int in range (names ``seed``).
  """
  seed = preflight.check_seed(seed)
  data = np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)
  return jax.random.wrap_key_data(data, impl="threefry2x32")


def generate(
    target: Model,
    draft: Model | NGramProposer | SiblingProposer | Hybrid | None,
    prompts: Sequence[Sequence[int]] | np.ndarray | jax.Array,
    *,
    method: str = "bass",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    draft_len: int | str | DraftLenPolicy = "dynamic",
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    attention_impl: str | None = None,
    verify_chunk: int | None = None,
    max_cache_len: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    draft_sharding: str = "replicated",
    batch_size: int | None = None,
    time_prompts: bool = True,
    on_finish: Callable[[FinishedPrompt], None] | None = None,
    acceptance: str = "rejection",
    sequence_ids: Sequence[int] | None = None,
    draft_tree: str | TreeShape | Sequence[str | TreeShape] | None = None,
    profile: str | BackendProfile | None = None,
) -> GenerateOutput:
  """Decodes a batch of prompts with batched speculative sampling (BASS) or regular decoding.

  Implements BASS (Qian et al. 2024, §3; docs/bass.md): every step the draft proposes ``l_draft`` tokens
  for each live row, the target scores ``l_draft + 1`` positions per row, each row accepts its own
  prefix by rejection sampling (greedy at temperature 0) plus a correction or bonus token, and each
  row's caches advance by its own count. Output tokens follow the target's distribution exactly
  (warped by ``temperature`` and ``top_p``); at temperature 0 they equal the target's greedy decoding up
  to float near-ties.

  Rows are independent: each stops at its first EOS or after ``max_new_tokens`` and is then frozen.
  The decode is one jitted ``lax.while_loop`` (compiled once per bucket of shapes, module docstring;
  timed apart) that returns to the host only to time a prompt's admission, first token or finish.

  Continuous batching: with ``batch_size`` smaller than the number of prompts, ``batch_size`` rows
  decode at a time and a row that finishes takes the next waiting prompt inside the jitted loop (a
  device-side queue, a chunked prefill of the admitted rows into their cache slots, the proposer's
  state restarted for them; ``loop.decode``, ``sampling.continuous``), as serving systems do (Orca's
  iteration-level scheduling; vLLM, SGLang). Outputs come back in the order of the prompts, each equal to decoding that prompt alone
  (greedy, up to float near-ties) or distributed as the target's (sampled).

  Args:
    target: the model whose distribution is sampled.
    draft: the draft side (``bass_jax.sampling.proposers``): a draft model sharing the target's
      tokenizer (same vocabulary size and special token ids, and the same vocabulary when both carry
      tokenizers); an ``NGramProposer`` (model-free prompt lookup); a ``SiblingProposer`` (model-free
      lookup in the other samples of each row's prompt: rows with identical prompts are siblings);
      or ``Hybrid(model, ngram, siblings=None)``.
      Ignored (may be None) for ``method="regular"``.
    prompts: B token-id lists of any lengths, each non-empty; or an integer array ``[B, T]`` of B
      prompts of equal length. Ints may be Python or NumPy integers.
    method: ``"bass"`` or ``"regular"`` (batched autoregressive decoding with the same model code).
    max_new_tokens: N >= 1, tokens to emit per row at most.
    temperature: >= 0; 0 is greedy.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    draft_len: ``"dynamic"`` (Algorithm 1 with the paper's defaults), a ``DynamicDraftLen`` with other
      constants, a fixed int, or ``"goodput"`` / a ``GoodputDraftLen``: per step the length (0 = a plain
      decoding step) that maximizes expected tokens per second, from running acceptance rates and the
      step costs of this setting (measured on first use, once per process, unless given).
    seed: PRNG seed, an int in ``[0, 2**63)`` (all 64 bits used; unused when greedy).
    eos_token_id: an id or a sequence of at most 8 ids that end a row; None takes the target config's;
      ``()`` disables stopping.
    attention_impl: attention implementation for both models (see ``attention_implementations()``);
      None takes the profile's (``"reference"`` on a CPU, ``"pallas_split"`` on a GPU).
    verify_chunk: C, the positions one verification forward scores (compiled once): a step with
      ``l_draft`` drafts scores its ``l_draft + 1`` positions in passes of C, and stops once every
      row has rejected. A larger C suits drafts that are accepted often; a smaller one wastes less
      on padding. None takes the profile's: 4 on a CPU; on a GPU ``L + 1`` (the longest chain and
      its bonus position), one pass and no verification loop. At most ``MAX_DRAFT_LEN + 1`` = 33.
    max_cache_len: if given, the most cache slots per row this call may allocate.
    mesh: a ``jax.sharding.Mesh`` with axes ``"data"`` and ``"model"`` (``bass_jax.sharding``): the
      rows (tokens, decode state, caches) split over ``data``, padded with inert rows to a multiple of
      its size; the target's weights tensor-parallel over ``model`` by its family's rule table, its
      caches split by KV head where the head count allows. None takes the mesh set with
      ``jax.set_mesh`` if it has those axes, else one device. The tokens do not depend on the mesh:
      the same seed gives the same tokens on every mesh shape (``jax_threefry_partitionable``), up to
      float near-ties, since split sums add in another order. A target loaded with
      ``load_model(..., mesh=m)`` runs on ``m`` when no mesh is given or set. Weights laid out
      otherwise than the rules say (another mesh, a draft loaded tensor-parallel) are copied into
      place on every call: load them as they run.
    draft_sharding: how a draft model lies on the mesh: ``"replicated"`` (whole on every device, its
      rows split over ``data``: no communication in drafting; docs/scaling.md measures the choice) or
      ``"tensor_parallel"`` (like the target).
    batch_size: rows that decode at once (continuous batching, above); None or at least the number
      of prompts decodes them all as one static batch. On a mesh, continuous batching needs a
      ``data`` axis of size 1 (its admission prefill does not split over rows).
    time_prompts: return to the host at every admission, first token and finish to time each prompt
      (``GenerateStats.admit_seconds``, ``first_token_seconds``, ``finish_seconds``); False runs the
      whole decode as one program call and times only the total.
    on_finish: called on the host with a :class:`FinishedPrompt` for every prompt, once, as soon as
      the decode has returned with it complete (with ``time_prompts``, at the return that saw it
      finish; without, after the single call). Streaming writers (``experiments.generate``) save each
      sequence the moment it exists, so that a killed run loses only the sequences in flight. The
      values equal the prompt's entries of the returned :class:`GenerateOutput`. An exception raised
      by the callback ends the decode and propagates. The callback's own time is excluded from every
      time in the stats.
    acceptance: how sampled drafts are accepted (greedy decoding ignores it). ``"rejection"``: speculative
      rejection sampling (Leviathan et al. 2023; the paper's), the highest acceptance. ``"gumbel"``:
      drafter-invariant speculative decoding (Daliri, Musco and Suresh 2024): the token at each text
      position is the target's Gumbel-max draw with noise keyed by the prompt's sequence key and that
      position, drafts drawn with the same noise, a draft accepted when it equals the target's draw.
      Equally exact, and a sequence's tokens then depend only on the seed, its sequence id and the
      target: the same with any draft, draft length, batch, ``batch_size`` or ``method="regular"``
      (up to float near-ties), so an interrupted run can be resumed exactly. A model draft is
      accepted somewhat less often (at worst ``(1 - TV) / (1 + TV)`` instead of ``1 - TV``); a
      deterministic proposer (n-gram) loses nothing.
    sequence_ids: with ``acceptance="gumbel"``, prompt i's noise is keyed by
      ``fold_in(key(seed), sequence_ids[i])``: distinct ints in ``[0, 2**32)``, one per prompt (default:
      the prompt's index). Give a sequence the same id wherever it is decoded (a resumed run decodes
      only what is missing) and it gets the same tokens. Unused by rejection sampling.
    draft_tree: None verifies a chain per row each step (above). A :class:`TreeShape` or its text
      (``"top_k=4,depth=5,nodes=16"``) verifies a token tree per row instead (EAGLE-2, Li et al. 2024;
      docs/design.md "Token trees"): a draft model grows it (expand the ``top_k`` best nodes per level
      for ``depth`` levels, keep the ``nodes - 1`` best drafts), a hybrid puts its n-gram
      continuation in first, and the target scores all ``nodes`` positions of a row in one forward;
      each row accepts the longest path the acceptance rule allows, exactly as for chains (greedy,
      ``"rejection"`` with top-k children, ``"gumbel"``). With ``draft_len`` at its default every
      step verifies the tree; with ``draft_len="goodput"`` (or a ``GoodputDraftLen``) each step
      chooses among a plain step, chains and the tree shapes given (a sequence of shapes compiles
      each as a static variant), by measured cost and running acceptance.
    profile: the backend profile whose defaults fill ``attention_impl`` and ``verify_chunk`` when
      they are None, say whether the program is branch-free, and how a continuous batch prefills
      the prompts it admits (rows per prefill, positions per forward; ``sampling.profiles``;
      override them with ``dataclasses.replace`` of a profile): ``"cpu"``,
      ``"gpu"``, a :class:`BackendProfile`, or None for the profile of the platform the decode is
      compiled for (``jax.default_backend()``).

  Returns:
    :class:`GenerateOutput` with tokens ``i32[B, N]``, lengths ``i32[B]``, target log-probs
    ``f32[B, N]``, finished flags and :class:`GenerateStats`.

  Raises:
    ValueError: naming the parameter, for an argument of the wrong type or out of range (a string,
      ``None`` or bool where a number is meant, a float where an int is meant: ``seed=1.5``,
      ``eos_token_id="70"``); an unknown method or attention_impl; no draft for BASS; a draft whose
      tokenizer differs from the target's (says which part); an empty prompt list or prompt; token ids
      outside the vocabulary; a bad draft length or chunk size; prompt + ``max_new_tokens`` beyond the
      models' context or beyond ``max_cache_len``; a mesh without the axes ``data`` and ``model``, or
      whose ``model`` size divides neither the heads nor the MLP (``bass_jax.sharding.plan``); a mesh
      with ``jax_threefry_partitionable`` off, or with a model whose layers are scanned;
      ``batch_size < 1``; continuous batching on a mesh whose
      ``data`` axis is larger than 1; an unknown ``acceptance``; ``sequence_ids`` of the wrong length,
      out of range or repeated; a bad ``draft_tree`` (``TreeShape``'s errors, a repeated shape), or
      one with ``method="regular"``, a ``draft_len`` other than the default or goodput, several
      shapes without goodput, or a sliding-window target on an attention implementation other than
      ``"reference"``; an unknown ``profile``.
  """
  call = _prepare(**locals())  # the first statement: locals() are exactly the arguments
  spec, args_prefill, args_tail = call.spec, call.args_prefill, call.args_tail
  bass, continuous, num_prompts, slots, rows = (call.bass, call.continuous, call.num_prompts,
                                                call.slots, call.rows)
  inert, lengths, max_new_tokens, host = call.inert, call.lengths, call.max_new_tokens, call.host
  time_prompts, on_finish, proposer, step_costs, mesh = (call.time_prompts, call.on_finish,
                                                         call.proposer, call.step_costs, call.mesh)
  (prefill, decode), compile_seconds = _compiled(spec, args_prefill, args_tail)

  clock = _PromptClock(num_prompts, started=min(slots, num_prompts))
  reported = np.zeros(num_prompts, bool)  # prompts handed to on_finish
  start = time.perf_counter()
  state = prefill(*args_prefill)
  while True:
    call_start = time.perf_counter() - start
    state = decode(state, *args_tail)
    done = host(state.done)
    # The prompt each row serves (read once per return: it decides both the clock and the stop).
    row_prompt = (host(state.queue.row_prompt) if continuous
                  else np.where(inert, -1, np.arange(rows)))
    if time_prompts:
      generated = host(state.seq_len) - host(state.prompt_len)
      clock.observe(row_prompt, generated, done, call_start, time.perf_counter() - start)
      if on_finish is not None:  # the callback's time (a record written to disk) is not the decode's
        paused = time.perf_counter()
        _report_finished(on_finish, state, host, row_prompt, done, reported, clock, bass=bass,
                         slots=slots)
        start += time.perf_counter() - paused
    left = ((row_prompt >= 0).any() or int(host(state.queue.next)) < num_prompts
            if continuous else not done.all())  # loop.unfinished, less the step limit
    if not left:
      break
    limit = int(host(state.step_limit))
    if int(host(state.step)) >= limit:
      raise RuntimeError(f"generate: the decode reached its step limit ({limit}) with prompts left; "
                         "this is a bug in bass_jax, please report it with the call's arguments")
  wall = time.perf_counter() - start

  steps = int(host(state.step))
  if continuous:
    queue = state.queue
    out_len = host(queue.lengths)[:num_prompts]
    tokens = np.where(np.arange(max_new_tokens)[None] < out_len[:, None],
                      host(queue.tokens)[:num_prompts, :max_new_tokens], PAD_TOKEN).astype(np.int32)
    logprobs = host(queue.logprobs)[:num_prompts, :max_new_tokens]
    finished = host(queue.eos)[:num_prompts]
    prompt_rows = host(queue.prompt_row)[:num_prompts]
    prompt_start_steps = host(queue.start_step)[:num_prompts]
  else:
    out_len = (host(state.seq_len) - host(state.prompt_len))[:num_prompts]
    all_tokens = host(state.tokens)
    tokens = np.full((num_prompts, max_new_tokens), PAD_TOKEN, np.int32)
    for b in range(num_prompts):
      tokens[b, :out_len[b]] = all_tokens[b, lengths[b]:lengths[b] + out_len[b]]
    logprobs = host(state.logprobs)[:num_prompts, :max_new_tokens]
    finished = host(state.eos)[:num_prompts]
    prompt_rows = np.arange(num_prompts, dtype=np.int32)
    prompt_start_steps = np.zeros(num_prompts, np.int32)
  logprobs = np.where(np.arange(max_new_tokens)[None] < out_len[:, None], logprobs, 0.0)
  accepted = host(state.accepted_history)[:steps, :slots] if bass else np.zeros((0, slots), np.int32)
  drafted = host(state.drafted_history)[:steps, :slots] if bass else np.zeros((0, slots), np.int32)
  per_prompt = _per_prompt_counts(prompt_rows, prompt_start_steps, steps, accepted, drafted)
  stats = GenerateStats(
      steps=steps,
      draft_lens=host(state.draft_len_history)[:steps] if bass else np.zeros((0,), np.int32),
      accepted=accepted,
      finish_seconds=clock.finish,
      wall_seconds=wall,
      compile_seconds=compile_seconds,
      compiled=compile_seconds > 0,
      prompt_bucket=spec.prompt_len,
      batch_bucket=rows,
      verify_chunk=spec.verify_chunk,
      attention_impl=spec.attention_impl,
      profile=call.profile,
      admit_rows=spec.admit_rows,
      admit_chunk=spec.admit_chunk,
      admitted_positions=int(host(state.queue.prefilled)) if continuous else 0,
      verified=host(state.verified_history)[:steps] if bass else np.zeros((0,), np.int32),
      drafted=drafted,
      trees=host(state.tree_history)[:steps] if bass else np.zeros((0,), np.int32),
      draft_trees=tuple(map(str, spec.draft_trees)),
      sources=(host(state.source_history)[:steps, :slots] if bass
               else np.zeros((0, slots), np.int32)),
      proposer=proposer.name if bass else "",
      step_costs=step_costs,
      mesh={} if mesh is None else dict(mesh.shape),
      admit_seconds=clock.admit,
      first_token_seconds=clock.first_token,
      batch_size=slots,
      continuous=continuous,
      prompt_rows=prompt_rows,
      prompt_start_steps=prompt_start_steps,
      prompt_steps=per_prompt[0] if bass else out_len.astype(np.int32),
      prompt_drafted=per_prompt[1],
      prompt_accepted=per_prompt[2],
  )
  output = GenerateOutput(tokens=tokens, lengths=out_len, logprobs=logprobs.astype(np.float32),
                          finished=finished, stats=stats)
  if on_finish is not None:  # whatever no return reported (time_prompts=False; a last retirement)
    for i in np.flatnonzero(~reported):
      on_finish(output.prompt(int(i)))
  return output


def _prepare(target, draft, prompts, *, method, max_new_tokens, temperature, top_p, draft_len, seed,
             eos_token_id, attention_impl, verify_chunk, max_cache_len, mesh, draft_sharding,
             batch_size, time_prompts, on_finish, acceptance, sequence_ids, draft_tree,
             profile) -> "_Call":
  """Validates :func:`generate`'s arguments (all of them, defaults filled: :func:`_arguments`) and
  builds the decode's spec and program arguments (no device work but placing the inputs and, for a
  cost-aware draft length, measuring the step costs)."""
  if not isinstance(target, Model):
    raise ValueError(f"target must be a bass_jax.Model (see bass_jax.load_model), got "
                     f"{type(target).__name__}")
  if not isinstance(method, str) or method not in ("bass", "regular"):
    raise ValueError(f"method must be 'bass' or 'regular', got {method!r}")
  profile = profiles.backend_profile(profile)
  if attention_impl is None:
    attention_impl = profile.attention_impl
  if not isinstance(attention_impl, str):
    raise ValueError(f"attention_impl must be a name, one of {attention_lib.attention_implementations()}")
  attention_lib.get_attention(attention_impl)  # raises for an unknown name
  bass = method == "bass"
  mesh = sharding_lib.resolve_mesh(mesh) or sharding_lib.mesh_of(target.params)
  if draft_sharding not in sharding_lib.RULES:
    raise ValueError(f"draft_sharding must be one of {sorted(sharding_lib.RULES)}, got "
                     f"{draft_sharding!r}")
  target_plan = None
  if mesh is not None and target.scanned_layers:
    raise ValueError("generate on a mesh needs models with unrolled layers (scanned layers do not run "
                     "sharded yet): load them with scan_layers=False or convert with "
                     "model.with_scanned_layers(False)")
  if mesh is not None:
    if not jax.config.jax_threefry_partitionable:
      raise ValueError("generate on a mesh needs jax.config.update('jax_threefry_partitionable', True) "
                       "(JAX's default), so that random draws do not depend on how arrays are split")
    target_plan = sharding_lib.plan(target.config, mesh, "tensor_parallel", name="the target")
  proposer, draft_params, draft_models = None, None, []
  if bass:
    if draft is None:
      raise ValueError("method='bass' needs a draft: a draft model, an NGramProposer, a "
                       "SiblingProposer or a Hybrid")
    proposer, draft_params, draft_models = resolve_draft(draft, target, attention_impl, mesh=mesh,
                                                         draft_sharding=draft_sharding)
  if mesh is not None and any(m.scanned_layers for m in draft_models):
    raise ValueError("generate on a mesh needs models with unrolled layers (scanned layers do not run "
                     "sharded yet): load them with scan_layers=False or convert with "
                     "model.with_scanned_layers(False)")
  max_new_tokens = _checks.as_int("max_new_tokens", max_new_tokens, min_value=1)
  temperature = _checks.as_float("temperature", temperature, min_value=0.0)
  top_p = _checks.as_float("top_p", top_p, min_value=0.0, min_exclusive=True, max_value=1.0)
  key = prng_key(seed)
  if max_cache_len is not None:
    max_cache_len = _checks.as_int("max_cache_len", max_cache_len, min_value=1)
  context = min(m.config.max_positions for m in [target] + draft_models)
  policy, trees = preflight.check_speculation(method, draft_len, draft_tree,
                                              vocab_size=target.config.vocab_size, context=context)
  if trees:
    if getattr(target.config, "sliding_window", None) is not None and attention_impl != "reference":
      raise ValueError("draft_tree with a sliding-window target runs on attention_impl='reference' "
                       "only (the kernels place a query by slot, a tree node by depth)")
    windowed = [m.name for m in draft_models  # an EAGLE draft's window is its layer's
                if getattr(getattr(m.config, "layer", m.config), "sliding_window", None) is not None]
    if windowed:
      raise ValueError(f"draft_tree: the draft model {windowed[0]} has a sliding window, and a tree "
                       "grows its levels as queries over earlier nodes, which a window over a tree "
                       "does not support; use a draft without a window, n-gram lookup or chains")
  chunk = 0  # for bass, None until the spec knows L: one pass of L + 1 (profiles.BackendProfile)
  if bass:
    chunk = (profile.verify_chunk if verify_chunk is None
             else _checks.as_int("verify_chunk", verify_chunk, min_value=1,
                                 max_value=MAX_DRAFT_LEN + 1))
  if batch_size is not None:
    batch_size = _checks.as_int("batch_size", batch_size, min_value=1)
  time_prompts = _checks.as_bool("time_prompts", time_prompts)
  if acceptance not in ACCEPTANCE_RULES:
    raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}, got {acceptance!r}")
  if on_finish is not None and not callable(on_finish):
    raise ValueError(f"on_finish must be callable or None, got {type(on_finish).__name__}")
  eos_ids = _eos_ids(eos_token_id, target)
  if len(eos_ids) > _MAX_EOS_IDS:
    raise ValueError(f"eos_token_id has {len(eos_ids)} ids; at most {_MAX_EOS_IDS} are supported")

  arrays = _validate_prompts(prompts, target.config.vocab_size)
  lengths = np.array([len(a) for a in arrays], np.int32)
  sequence_ids = _sequence_ids(sequence_ids, len(arrays))
  if lengths.max() + max_new_tokens > context:
    raise ValueError(
        f"longest prompt ({lengths.max()} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
        f"models' context of {context} positions; shorten the prompt or lower max_new_tokens")

  num_prompts = len(arrays)
  continuous = batch_size is not None and batch_size < num_prompts
  slots = batch_size if continuous else num_prompts  # rows decoding at once
  rows = batch_bucket(slots)
  queue_len = batch_bucket(num_prompts) if continuous else 0
  max_new_bucket = output_bucket(max_new_tokens)
  history_len = 0
  if continuous:
    if mesh is not None and mesh.shape[sharding_lib.DATA] > 1:
      raise ValueError(
          f"continuous batching (batch_size={batch_size} < {num_prompts} prompts) runs its admission "
          f"prefill unsplit over rows, so it needs a mesh whose data axis has size 1, got "
          f"{dict(mesh.shape)}; use a mesh of shape (1, n), or batch_size=None for static batches")
    # state.DecodeState.step_limit at the bucket's sizes; any batch_size of this bucket fills >= rows/2.
    history_len = -(-queue_len * max_new_bucket // -(-rows // 2)) + max_new_bucket

  bucket = prompt_bucket(int(lengths.max()))  # P; an admission's chunk tiles it
  spec = state_lib.DecodeSpec(
      method=method, target=target.config, proposer=proposer,
      target_dtype=jnp.dtype(target.dtype).name,
      attention_impl=attention_impl, prompt_len=bucket,
      max_new_bucket=max_new_bucket, greedy=temperature == 0,
      draft_len=policy, verify_chunk=chunk or 0, target_sharding=target_plan, queue_len=queue_len,
      history_len=history_len, acceptance="rejection" if temperature == 0 else acceptance,
      draft_trees=trees, branch_free=profile.branch_free,
      admit_rows=min(profile.admit_rows, rows),
      admit_chunk=min(profile.admit_chunk, bucket))
  if bass and chunk is None:
    spec = dataclasses.replace(spec, verify_chunk=spec.max_draft + 1)
  if max_cache_len is not None and spec.cache_len > max_cache_len:
    raise ValueError(
        f"the decode needs {spec.cache_len} cache slots per row (prompt padded to {spec.prompt_len} + "
        f"{spec.max_new_bucket} output slots + {spec.max_draft + 1} verification look-ahead), more "
        f"than max_cache_len={max_cache_len}")

  if mesh is not None:  # inert rows up to a multiple of the data axis
    rows = -(-rows // mesh.shape[sharding_lib.DATA]) * mesh.shape[sharding_lib.DATA]
  queued = np.zeros((max(rows, queue_len), spec.prompt_len), np.int32)
  for i, a in enumerate(arrays):
    queued[i, :len(a)] = a
  queued_len = np.ones(len(queued), np.int32)  # padding: a one-token prompt, never decoded
  queued_len[:num_prompts] = lengths
  queued_keys = np.zeros((len(queued), 2), np.uint32)
  if spec.coupled:
    queued_keys[:num_prompts] = warp.sequence_keys(key, sequence_ids)
  # Rows of identical prompts are siblings (a proposer may draft from each other's text); padding
  # prompts are groups of their own.
  first_of = {}
  queued_group = -1 - np.arange(len(queued), dtype=np.int32)
  for i, a in enumerate(arrays):
    queued_group[i] = first_of.setdefault(a.tobytes(), i)
  inert = np.arange(rows) >= slots
  padded = np.where(inert[:, None], 0, queued[:rows])
  prompt_len = np.where(inert, 1, queued_len[:rows]).astype(np.int32)
  eos_array = np.full(_MAX_EOS_IDS, -1, np.int32)
  eos_array[:len(eos_ids)] = eos_ids
  target_params = target.params
  if mesh is not None:  # after every check: a bad argument copies no weights
    target_params = sharding_lib.shard_params(target_params, target_plan)
    if draft_params is not None:
      draft_params = sharding_lib.shard_params(draft_params, proposer.sharding)
  step_costs = None
  if isinstance(policy, GoodputDraftLen):
    step_costs = policy.costs or costs_lib.measure_step_costs(spec, target_params, draft_params, rows)
  inputs = state_lib.DecodeInputs(
      prompts=padded, prompt_len=prompt_len, inert=inert, row_keys=queued_keys[:rows],
      group=np.where(inert, -1 - np.arange(rows), queued_group[:rows]).astype(np.int32),
      max_new=np.int32(max_new_tokens), eos_ids=eos_array, key=key,
      step_costs=step_costs.as_array() if step_costs else np.zeros(5, np.float32))
  if continuous:
    inputs = inputs.replace(
        queue_prompts=queued[:queue_len], queue_prompt_len=queued_len[:queue_len],
        queue_keys=queued_keys[:queue_len], queue_group=queued_group[:queue_len],
        num_prompts=np.int32(num_prompts),
        step_limit=np.int32(-(-num_prompts * max_new_tokens // slots) + max_new_tokens))
  # top_p = 1 is None: no nucleus, decided when compiling (warp.warped_log_probs).
  scalars = (np.float32(max(temperature, 1e-6)), None if top_p == 1 else np.float32(top_p),
             np.bool_(time_prompts))
  if mesh is None:
    inputs = jax.tree_util.tree_map(jnp.asarray, inputs)
    scalars = jax.tree_util.tree_map(jnp.asarray, scalars)
    host = np.asarray
  else:  # rows over data, the rest replicated
    inputs = jax.tree_util.tree_map(sharding_lib.put, inputs,
                                    inputs.placed(target_plan.rows, target_plan.replicate))
    scalars = jax.tree_util.tree_map(lambda a: sharding_lib.put(a, target_plan.replicate), scalars)
    host = sharding_lib.to_host
  args_prefill = (target_params, draft_params, inputs)
  args_tail = (target_params, draft_params, *scalars)
  return _Call(spec=spec, args_prefill=args_prefill, args_tail=args_tail, bass=bass,
               continuous=continuous, num_prompts=num_prompts, slots=slots, rows=rows, inert=inert,
               lengths=lengths, max_new_tokens=max_new_tokens, time_prompts=time_prompts,
               on_finish=on_finish, host=host, proposer=proposer, step_costs=step_costs, mesh=mesh,
               profile=profile.name)


@dataclasses.dataclass(frozen=True)
class LoweredDecode:
  """What :func:`lower` returns.

  Attributes:
    prefill, decode: ``jax.export.Exported`` programs (``.mlir_module()`` is their StableHLO).
    spec: the decode's :class:`state.DecodeSpec`.
    cache_arrays: the shapes of every KV cache array of the decode state (target and draft) and of
      the EAGLE feature buffer, as ``"f32[B,K,S,H]"`` (``"f32[L,B,K,S,H]"`` for a model with scanned
      layers; ``hlo_census`` spells shapes so).
    host_decode_hlo: with ``compile_on_host``, the decode compiled for this machine from the same
      settings and profile, the jnp reference attention standing in for a kernel (XLA's optimized
      HLO text, where copy insertion has run); else None.
  """

  prefill: Any
  decode: Any
  spec: state_lib.DecodeSpec
  cache_arrays: tuple[str, ...]
  host_decode_hlo: str | None = None


def _arguments(target, draft, prompts, **kwargs) -> dict[str, Any]:
  """Every argument of :func:`generate` by name, its defaults filled in (what :func:`_prepare` takes).

  Raises:
    TypeError: a keyword :func:`generate` does not take.
  """
  bound = inspect.signature(generate).bind(target, draft, prompts, **kwargs)
  bound.apply_defaults()
  return bound.arguments


def lower(target: Model, draft: Any, prompts: Any, *, platform: str,
          sm_count: int = attention_lib.H100_SM_COUNT, compile_on_host: bool = False,
          **kwargs) -> LoweredDecode:
  """Lowers the programs a :func:`generate` call would run, for ``platform``, without running them:
  ``jax.export`` of the prefill and of the decode (Pallas kernels included), on any machine.

  Args:
    target, draft, prompts: as for :func:`generate`.
    platform: ``"cuda"``, ``"rocm"`` or ``"cpu"``: the programs are traced as for it
      (``models.attention.compiling_for``), and the default profile is its.
    sm_count: the SMs the Pallas kernels' cache splits assume on a GPU platform.
    compile_on_host: also compile the decode of the same settings (the same profile) for this
      machine, for what only a compiler shows (copies of the caches). The jnp reference attention
      stands in for a Pallas kernel there: the kernel is a custom call that reads the cache as the
      reference's ops do, while the Pallas interpreter would copy its operands into state.
    **kwargs: :func:`generate`'s keyword arguments. A cost-aware draft length without costs gets
      placeholders: the step costs are a traced input (``StepCosts.as_array``), so any values
      lower the same program, and measuring them would run programs.

  Returns:
    A :class:`LoweredDecode`.

  Raises:
    ValueError: as :func:`generate`.
  """
  from jax import export  # pylint: disable=g-import-not-at-top

  from pallas_kernels.ragged_attention import TRITON_CUSTOM_CALL  # pylint: disable=g-import-not-at-top

  policy = kwargs.get("draft_len")
  if (isinstance(policy, str) and policy == "goodput") or (isinstance(policy, GoodputDraftLen)
                                                           and policy.costs is None):
    trees = tree_shapes(kwargs.get("draft_tree"))
    kwargs["draft_len"] = dataclasses.replace(
        as_policy(policy), costs=costs_lib.StepCosts(1.0, 1.0, 0.0, 0.0, 1, (1.0,) * len(trees)))
  # A Pallas Triton kernel lowers to a custom call that export does not vouch for by default.
  checks = [export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)]
  with attention_lib.compiling_for(platform, sm_count=sm_count):
    call = _prepare(**_arguments(target, draft, prompts, **kwargs))
    spec = call.spec
    state = jax.eval_shape(lambda *a: loop.prefill(spec, *a), *call.args_prefill)
    prefill = export.export(jax.jit(lambda *a: loop.prefill(spec, *a)), platforms=[platform],
                            disabled_checks=checks)(*call.args_prefill)
    decode = export.export(jax.jit(lambda *a: loop.decode(spec, *a), donate_argnums=0),
                           platforms=[platform], disabled_checks=checks)(state, *call.args_tail)
  caches = [leaf for cache in (state.target_cache, state.proposer_state)  # [B, K, S, H] per layer,
            for leaf in jax.tree_util.tree_leaves(cache) if leaf.ndim in (4, 5)]  # or [L, ...] scanned
  caches += [] if state.features is None else [state.features]
  cache_arrays = tuple(sorted({f"{jnp.dtype(x.dtype).name.replace('float', 'f')}"
                               f"[{','.join(map(str, x.shape))}]" for x in caches}))
  host_hlo = None
  if compile_on_host:
    with attention_lib.compiling_for(jax.default_backend()):
      # The jnp reference stands in for a Pallas kernel: XLA sees a kernel (a custom call) read the
      # cache as it sees the reference's ops read it, where the Pallas interpreter would copy its
      # operands into state, copies no GPU program makes.
      profile = profiles.backend_profile(kwargs.get("profile")
                                         or profiles.platform_profile(platform))
      host = _prepare(**_arguments(target, draft, prompts, **{**kwargs, "profile": profile,
                                                              "attention_impl": "reference"}))
      (_, host_decode), _ = _compiled(host.spec, host.args_prefill, host.args_tail)
    host_hlo = host_decode.as_text()
  return LoweredDecode(prefill=prefill, decode=decode, spec=spec, cache_arrays=cache_arrays,
                       host_decode_hlo=host_hlo)


class _PromptClock:
  """Per-prompt wall times, read by the host whenever the decode returns (``loop.decode``'s
  ``observe``): admission (the start of the call that prefilled the prompt's row), first token, finish.
  All start NaN; the first ``started`` prompts are admitted by the prefill, at 0."""

  def __init__(self, num_prompts: int, started: int):
    self.admit = np.full(num_prompts, np.nan)
    self.admit[:started] = 0.0
    self.first_token = np.full(num_prompts, np.nan)
    self.finish = np.full(num_prompts, np.nan)

  def observe(self, row_prompt: np.ndarray, generated: np.ndarray, done: np.ndarray,
              call_start: float, now: float) -> None:
    """Stamps what the decode call that started at ``call_start`` and returned at ``now`` did: each row
    serving prompt ``row_prompt[r] >= 0`` was admitted by then, has emitted ``generated[r]`` tokens and
    is ``done[r]`` or not."""
    for prompt, count, finished in zip(row_prompt, generated, done):
      if prompt < 0:
        continue
      for stamps, happened, at in ((self.admit, True, call_start), (self.first_token, count > 0, now),
                                   (self.finish, finished, now)):
        if happened and np.isnan(stamps[prompt]):
          stamps[prompt] = at


def _report_finished(on_finish, state: state_lib.DecodeState, host, row_prompt: np.ndarray,
                     done: np.ndarray, reported: np.ndarray, clock: _PromptClock, *, bass: bool,
                     slots: int) -> None:
  """Hands every prompt that a done row still holds, and that was not reported yet, to
  ``on_finish``: its tokens read from the row (a continuous batch retires it into the queue only at
  the next round), its counts from the row's histories since the prompt's admission
  (:func:`_per_prompt_counts` up to the current step: the row is not live after its finish, so the
  steps since add nothing), its times from the clock. Reads the device only when something finished."""
  rows = [r for r, p in enumerate(row_prompt) if p >= 0 and done[r] and not reported[p]]
  if not rows:
    return
  tokens, logprobs = host(state.tokens), host(state.logprobs)
  prompt_len, seq_len, eos = host(state.prompt_len), host(state.seq_len), host(state.eos)
  prompts = row_prompt[rows]
  starts = (host(state.queue.start_step)[prompts] if state.queue is not None
            else np.zeros(len(rows), np.int32))
  counts = np.zeros((3, len(rows)), np.int64)
  if bass:
    steps = int(host(state.step))
    counts = _per_prompt_counts(np.asarray(rows), starts, steps,
                                host(state.accepted_history)[:steps, :slots],
                                host(state.drafted_history)[:steps, :slots])
  else:
    counts[0] = seq_len[rows] - prompt_len[rows]  # regular decoding: a step per token
  for j, (r, p) in enumerate(zip(rows, prompts)):
    n = int(seq_len[r] - prompt_len[r])
    reported[p] = True
    on_finish(FinishedPrompt(
        index=int(p), tokens=tokens[r, prompt_len[r]:seq_len[r]].astype(np.int32),
        logprobs=logprobs[r, :n].astype(np.float32), finished=bool(eos[r]), row=r,
        admit_seconds=float(clock.admit[p]), first_token_seconds=float(clock.first_token[p]),
        finish_seconds=float(clock.finish[p]), steps=int(counts[0, j]),
        drafted=int(counts[1, j]), accepted=int(counts[2, j])))


def _per_prompt_counts(prompt_rows: np.ndarray, start_steps: np.ndarray, steps: int,
                       accepted: np.ndarray, drafted: np.ndarray) -> np.ndarray:
  """``i32[3, B]``: live steps, drafts and accepted drafts per prompt, from the per-row histories
  ``accepted, drafted: i32[steps, rows]`` (-1 in ``accepted`` where the row was not live): prompt i's
  steps are those of its row from its start to the start of that row's next prompt."""
  counts = np.zeros((3, len(prompt_rows)), np.int32)
  if not accepted.size:
    return counts
  order = np.lexsort((start_steps, prompt_rows))  # by row, then by start
  ends = np.full(len(order), steps)
  same_row = prompt_rows[order[1:]] == prompt_rows[order[:-1]]
  ends[order[:-1][same_row]] = start_steps[order[1:][same_row]]
  live = accepted >= 0
  for k, per_step in enumerate((live, np.where(live, drafted, 0), np.where(live, accepted, 0))):
    totals = np.concatenate([np.zeros((1, per_step.shape[1]), np.int64), np.cumsum(per_step, axis=0)])
    counts[k] = totals[ends, prompt_rows] - totals[start_steps, prompt_rows]
  return counts
