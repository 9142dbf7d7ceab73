"""bass-jax: batched speculative decoding (BASS, Qian et al., ACL Findings 2024) in JAX/Flax.

Public API::

    target = bass_jax.load_model("smollm2-135m-instruct")
    draft = bass_jax.load_model("smollm2-135m-draft")      # the distilled draft shipped with bass_jax
    texts = bass_jax.generate_text(target, draft, ["What is 2 + 2?"], chat=True, max_new_tokens=64)
    out = bass_jax.generate(target, draft, [ids_1, ids_2], max_new_tokens=64)   # token level
    plan = bass_jax.prepare(target, draft, [ids_1], bass_jax.DecodeConfig(temperature=0.7))
    out = bass_jax.run(plan)                                 # the seam generate is built on
"""

from bass_jax.cache import KVCache
from bass_jax.loading import (ALIASES, Model, abstract_params, check_same_tokenizer, default_dtype,
                              init_params, load_draft, load_model, save_model)
from bass_jax.models.attention import reference_attention
from bass_jax.models.attention_registry import (AttentionImpl, attention_implementations,
                                                register_attention)
from bass_jax.models.codegen import CodeGenConfig
from bass_jax.models.gpt2 import GPT2Config
from bass_jax.models.llama import LlamaConfig, register_llama_family
from bass_jax.models.llama_layers import Llama
from bass_jax.models.llama import Traits as LlamaTraits
from bass_jax.models.opt import OPTConfig
from bass_jax.sampling.acceptance import (AcceptanceRule, MatchingRule, acceptance_rules,
                                         register_acceptance)
from bass_jax.sampling.config import DecodeConfig
from bass_jax.sampling.draft_len import DynamicDraftLen, FixedDraftLen, GoodputDraftLen, StepCosts
from bass_jax.sampling.generate import (PAD_TOKEN, FinishedPrompt, GenerateOutput, GenerateStats,
                                        clear_compile_cache, compile_cache_stats,
                                        enable_persistent_compilation_cache, generate,
                                        load_draft_spec, lower, set_compile_cache_size)
from bass_jax.sampling.plan import Plan, prepare
from bass_jax.profiles import BackendProfile
from bass_jax.sampling.proposers import (Hybrid, NGramProposer, Proposal, Proposer, Replay,
                                         SiblingProposer, StepContext)
from bass_jax.sampling.proposers.registry import proposer_kinds, register_proposer
from bass_jax.sampling.runner import run
from bass_jax.sampling.tree import TreeShape
from bass_jax.sampling.warp import position_uniforms
from bass_jax.text import generate_text

__all__ = [
    "ALIASES", "AcceptanceRule", "AttentionImpl", "BackendProfile", "CodeGenConfig", "DecodeConfig",
    "DynamicDraftLen", "FinishedPrompt", "FixedDraftLen", "GPT2Config", "GenerateOutput", "GenerateStats",
    "GoodputDraftLen", "Hybrid", "KVCache", "Llama", "LlamaConfig", "LlamaTraits", "MatchingRule", "Model",
    "NGramProposer", "OPTConfig", "PAD_TOKEN", "Plan", "Proposal", "Proposer", "Replay", "SiblingProposer",
    "StepContext", "StepCosts", "TreeShape", "abstract_params", "acceptance_rules",
    "attention_implementations", "check_same_tokenizer", "clear_compile_cache", "compile_cache_stats",
    "default_dtype", "enable_persistent_compilation_cache", "generate", "generate_text", "init_params",
    "load_draft", "load_draft_spec", "load_model", "lower", "position_uniforms", "prepare", "proposer_kinds",
    "reference_attention", "register_acceptance", "register_attention", "register_llama_family",
    "register_proposer", "run", "save_model", "set_compile_cache_size",
]
