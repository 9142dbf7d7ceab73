"""``generate``: the front door, ``run(prepare(target, draft, prompts, DecodeConfig(**keywords)))``.

The seam underneath is public: ``DecodeConfig`` (``sampling.config``) says what to do, ``prepare``
(``sampling.plan``) checks it and builds the programs' spec and arguments, ``run``
(``sampling.runner``) compiles, decodes and reads back; ``lower`` (``sampling.lowering``) exports the
same programs for a platform without running them.

Compilation. A program is specialized to its shapes and to the static settings of
:class:`state.DecodeSpec`; shapes come in buckets (``plan``'s docstring) so that nearby calls share
one. The prefill and decode programs of a setting are compiled in parallel and kept in a bounded LRU
cache (:func:`clear_compile_cache`, :func:`set_compile_cache_size`); JAX's persistent compilation cache, on
by default (``sampling.compile_cache``; ``BASS_JAX_COMPILATION_CACHE_DIR``, the ``compilation_cache``
keyword), makes them survive the process. :func:`compile_cache_stats` counts what was compiled.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from bass_jax.loading import Model
# The names below are the sampling package's public surface; they stay importable from here.
from bass_jax.sampling import compile_cache
from bass_jax.sampling.acceptance import AcceptanceRule, acceptance_rules  # pylint: disable=unused-import
from bass_jax.sampling.config import DecodeConfig, with_settings  # pylint: disable=unused-import
from bass_jax.sampling.draft_len import (MAX_DRAFT_LEN, DraftLenPolicy,  # pylint: disable=unused-import
                                         GoodputDraftLen, as_policy)
from bass_jax.sampling.drafts import load_draft_spec, resolve_draft  # pylint: disable=unused-import
from bass_jax.sampling.lowering import LoweredDecode, lower  # pylint: disable=unused-import
from bass_jax.sampling.outputs import FinishedPrompt, GenerateOutput, GenerateStats  # pylint: disable=unused-import
from bass_jax.sampling.plan import (MAX_SEED, Plan, batch_bucket,  # pylint: disable=unused-import
                                    output_bucket, prepare, prng_key, prompt_bucket)
from bass_jax.profiles import BackendProfile
from bass_jax.sampling.programs import (clear_compile_cache,  # pylint: disable=unused-import
                                        enable_persistent_compilation_cache,
                                        set_compile_cache_size)
from bass_jax.sampling.compile_cache import stats as compile_cache_stats  # pylint: disable=unused-import
from bass_jax.sampling.proposers import Hybrid, NGramProposer, Proposer, Replay, SiblingProposer
from bass_jax.sampling.runner import PAD_TOKEN, check_run_arguments, run  # pylint: disable=unused-import
from bass_jax.sampling.tree import TreeShape, tree_shapes  # pylint: disable=unused-import


def generate(
    target: Model,
    draft: Model | NGramProposer | SiblingProposer | Hybrid | Replay | Proposer
           | tuple[Proposer, Any] | None,
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
    max_prompt_len: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    draft_sharding: str = "replicated",
    batch_size: int | None = None,
    time_prompts: bool = True,
    on_finish: Callable[[FinishedPrompt], None] | None = None,
    acceptance: str | AcceptanceRule = "rejection",
    sequence_ids: Sequence[int] | None = None,
    draft_tree: str | TreeShape | Sequence[str | TreeShape] | None = None,
    profile: str | BackendProfile | None = None,
    compilation_cache: str | os.PathLike | bool | None = None,
) -> GenerateOutput:
  """Decodes a batch of prompts with batched speculative sampling (BASS) or regular decoding.

  Implements BASS (Qian et al. 2024, §3; docs/bass.md): every step the draft proposes ``l_draft`` tokens
  for each live row, the target scores ``l_draft + 1`` positions per row, each row accepts its own
  prefix by the acceptance rule (rejection sampling; greedy at temperature 0; or Gumbel acceptance)
  plus a correction or bonus token, and each row's caches advance by its own count. Output tokens
  follow the target's distribution exactly (warped by ``temperature`` and ``top_p``); at temperature 0
  they equal the target's greedy decoding up to float near-ties. Rows are independent: each stops at
  its first EOS or after ``max_new_tokens`` and is then frozen. The decode is one jitted
  ``lax.while_loop`` (compiled once per bucket of shapes, timed apart) that returns to the host only
  to time a prompt's admission, first token or finish.

  Args:
    target: the model whose distribution is sampled.
    draft: the draft side: a draft model sharing the target's tokenizer, an ``NGramProposer``, a
      ``SiblingProposer``, ``Hybrid(model, lookups)``, ``Replay(model, text)``, or your
      own ``Proposer``, alone or as ``(proposer, params)`` (``plan.prepare``; docs/extending.md).
      Ignored (may be None) for ``method="regular"``.
    prompts: B token-id lists of any lengths, each non-empty; or an integer array ``[B, T]`` of B
      prompts of equal length. Ints may be Python or NumPy integers.
    method, max_new_tokens, temperature, top_p, draft_len, seed, eos_token_id, attention_impl,
      verify_chunk, max_cache_len, max_prompt_len, mesh, draft_sharding, batch_size, acceptance,
      draft_tree, profile: the fields of :class:`DecodeConfig` (documented there).
    time_prompts, on_finish: as ``runner.run``: time every prompt's admission, first token and
      finish; hand each prompt to ``on_finish`` as soon as it is complete.
    sequence_ids: as ``plan.prepare``: the ids that key each prompt's draws under a keyed acceptance
      rule (Gumbel acceptance).
    compilation_cache: the persistent compilation cache, for this process from this call on
      (``sampling.compile_cache``): a directory, False (or ``"off"``) to turn it off, True for the
      default directory; None (default) leaves it as it is (on by default, in
      ``$XDG_CACHE_HOME/bass_jax/xla`` or ``~/.cache/bass_jax/xla``, or
      ``$BASS_JAX_COMPILATION_CACHE_DIR``).

  Returns:
    :class:`GenerateOutput` with tokens ``i32[B, N]``, lengths ``i32[B]``, target log-probs
    ``f32[B, N]``, finished flags and :class:`GenerateStats`.

  Raises:
    ValueError: naming the setting, as ``plan.prepare`` and ``runner.run`` say.
  """
  config = DecodeConfig(**{name: value for name, value in locals().items() if name in _SETTINGS})
  check_run_arguments(time_prompts, on_finish)  # before prepare: a bad argument copies no weights
  if compilation_cache is not None:
    compile_cache.configure(compilation_cache)
  plan = prepare(target, draft, prompts, config, sequence_ids=sequence_ids)
  return run(plan, time_prompts=time_prompts, on_finish=on_finish)


_SETTINGS = frozenset(DecodeConfig.__dataclass_fields__)  # generate's keywords that are config fields
