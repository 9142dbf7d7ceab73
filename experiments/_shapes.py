"""Published model shapes with random weights, for the benchmarks that measure cost at scale
(``experiments.benchmarks.bench_forward``, ``experiments.benchmarks.bench_scale``): ``random:<shape>``
model specs and a random EAGLE draft of a target's shape.

Random weights measure what a step costs, never what it gains: a random draft is almost never right
(``bass_jax.Replay`` supplies a realistic acceptance where a benchmark needs one).
"""

from __future__ import annotations

from typing import Any

# Published model shapes (cost only; the rotary type does not change a cost), as their config.json
# files give them: SmolLM2-135M, Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B, Llama-2-7B (the BASS
# paper's era: full multi-head attention), and Phi-3-mini's (a 96-channel head, which the Pallas
# kernel takes in column tiles) as a Llama-family layout.
SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, tie_word_embeddings=True),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, tie_word_embeddings=True),
    "llama-3.2-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192,
                         num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         head_dim=128, tie_word_embeddings=True),
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, tie_word_embeddings=False),
    "llama-2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       head_dim=128, tie_word_embeddings=False),
    "phi-3-mini": dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       head_dim=96, tie_word_embeddings=False),
}


def shape_config(spec: str):
  """The ``LlamaConfig`` of ``random:<shape>[:layers=N][:vocab=V]`` (or without ``random:``): the
  shape's sizes (:data:`SHAPES`), ``N`` decoder layers and a vocabulary of ``V`` tokens if given, no
  stop ids. A cut vocabulary is for smoke runs on a CPU (the suite's), where drawing SmolLM2's random
  49,152 x 576 embedding alone took about 5 s under the suite's XLA settings.

  Raises:
    ValueError: an unknown shape, or an option other than ``layers=N`` or ``vocab=V`` (N, V >= 1).
  """
  import bass_jax  # pylint: disable=g-import-not-at-top

  rest = spec[len("random:"):] if spec.startswith("random:") else spec
  name, *options = rest.split(":")
  if name not in SHAPES:
    raise ValueError(f"{spec}: unknown shape {name!r}; choose from {', '.join(SHAPES)}")
  given = {}
  for option in options:
    key, _, value = option.partition("=")
    field = {"layers": "num_hidden_layers", "vocab": "vocab_size"}.get(key)
    if field is None or field in given or not value.isdigit() or int(value) < 1:
      raise ValueError(f"{spec}: write random:<shape>[:layers=N][:vocab=V], N, V >= 1, each once")
    given[field] = int(value)
  return bass_jax.LlamaConfig(**{**SHAPES[name], **given}, max_position_embeddings=131072,
                              rope_theta=500000.0, eos_token_id=None, bos_token_id=None)


def random_model(spec: str, dtype: str):
  """``random:<shape>[:layers=N][:vocab=V]``: a Llama-family model of a published shape
  (:data:`SHAPES`, options as :func:`shape_config`) with random weights (``bass_jax.init_params``,
  seed 0, initialized in one jitted program on the default device) in ``dtype``.

  Raises:
    ValueError: as :func:`shape_config`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top

  config = shape_config(spec)
  params = jax.jit(lambda key: bass_jax.init_params(config, key, jnp.dtype(dtype)))(jax.random.key(0))
  return bass_jax.Model(config, params, name=spec)


def random_eagle_draft(target: Any, draft_vocab_size: int | None = None, seed: int = 1):
  """A random one-layer EAGLE draft of ``target``'s shape (``bass_jax.models.eagle``: ``fc`` over the
  token's embedding and the target's feature, one decoder layer of the target's shape, the target's
  head over ``draft_vocab_size`` of its tokens, the first ones; default the whole vocabulary), in the
  target's dtype: what an EAGLE draft costs at that scale.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax.models import eagle, eagle_init  # pylint: disable=g-import-not-at-top

  vocab = target.config.vocab_size
  size = vocab if draft_vocab_size is None else min(draft_vocab_size, vocab)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=size)
  dtype = jnp.dtype(target.dtype)
  params = jax.jit(lambda key: eagle_init.init_draft_params(config, key, dtype))(jax.random.key(seed))
  vocab_ids = jnp.arange(size, dtype=jnp.int32)
  return bass_jax.Model(config, {"draft": params, "vocab_ids": vocab_ids}, name=f"eagle({target.name})")
