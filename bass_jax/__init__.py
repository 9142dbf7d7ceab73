"""bass-jax: batched speculative decoding (BASS, Qian et al., ACL Findings 2024) in JAX/Flax.

Public API::

    model = bass_jax.load_model("smollm2-135m-instruct")
    draft = model.with_first_layers(4)             # placeholder draft
    out = bass_jax.generate(model, draft, [prompt_ids_1, prompt_ids_2], max_new_tokens=64)
"""

from bass_jax.cache import KVCache
from bass_jax.loading import (ALIASES, Model, abstract_params, init_params, load_draft, load_model,
                              save_model)
from bass_jax.models.attention import attention_implementations, reference_attention
from bass_jax.models.codegen import CodeGenConfig
from bass_jax.models.gpt2 import GPT2Config
from bass_jax.models.llama import Llama, LlamaConfig
from bass_jax.models.opt import OPTConfig
from bass_jax.sampling.draft_len import DynamicDraftLen, FixedDraftLen
from bass_jax.sampling.generate import PAD_TOKEN, GenerateOutput, GenerateStats, generate

__all__ = [
    "ALIASES", "CodeGenConfig", "GPT2Config", "OPTConfig", "DynamicDraftLen", "FixedDraftLen", "GenerateOutput", "GenerateStats", "KVCache",
    "Llama", "LlamaConfig", "Model", "PAD_TOKEN", "abstract_params", "attention_implementations",
    "generate", "init_params", "load_draft", "load_model", "reference_attention", "save_model",
]
