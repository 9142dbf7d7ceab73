"""The speculators library's own EAGLE-3 modules, run on a speculators-layout head.

Optional: needs the ``speculators`` package (vllm-project/speculators; written
against 0.9.0, whose ``src/speculators/models/eagle3/core.py`` equals main @
c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b). No release installs beside this
project's pins (every release caps ``transformers`` below 5.24 -- 0.9.0 at
``<=5.19``, 0.8.x ``<5.17``, 0.7.x ``<5.15``, 0.6.x ``<5.11`` and
``torch<=2.12`` -- and requires ``datasets``/``openai``/``torchvision``...), so
the test that uses this is skipped unless the package is importable; with
``--no-deps`` and its import-time dependencies on ``PYTHONPATH`` it imports and
runs under transformers 5.24.

``Eagle3DraftModel.forward`` is a training loop that returns argmax tokens or a
loss, not logits, so ``forward`` here drives the model's own modules through one
first step the way that loop does (``fc`` with its optional norms, ``cat(embed,
hidden)``, the first layer with its ``norm_before_residual``, ``norm``,
``lm_head``), and ``first_step_tokens`` runs the loop itself for one step.
``reference_forward`` uses the library where it imports and
``eagle3.eagle3_forward`` otherwise, and says which one answered.
"""

from __future__ import annotations

import os

import torch

from ._common import load_weights, target_embedding

__all__ = ["available", "load_model", "forward", "first_step_tokens", "reference_forward"]

_VERIFIER_ONLY = {"verifier_norm.weight", "verifier_lm_head.weight"}


def available() -> bool:
  try:
    import speculators.models.eagle3  # noqa: F401
  except ImportError:
    return False
  return True


def load_model(directory: str | os.PathLike, target_model=None):
  """Build ``Eagle3DraftModel`` from a speculators-layout directory without
  attaching a verifier (``from_pretrained`` would load one by name), eager
  attention, float32. A checkpoint without ``embed_tokens`` gets the target's."""
  from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

  config = Eagle3SpeculatorConfig.from_pretrained(os.fspath(directory))
  config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
  model = Eagle3DraftModel(config)
  state = load_weights(os.path.join(directory, "model.safetensors"))
  if "embed_tokens.weight" not in state:
    if target_model is None:
      raise ValueError("this head has no embed_tokens; pass the target")
    state["embed_tokens.weight"] = target_embedding(target_model)
  missing, unexpected = model.load_state_dict(state, strict=False)
  if set(missing) - _VERIFIER_ONLY or unexpected:
    raise ValueError(f"speculators model does not match the checkpoint: {missing=} {unexpected=}")
  return model.float().eval()


@torch.no_grad()
def forward(directory, target_model, tokens, taps, *, positions=None):
  """``(hidden_out, draft_logits)`` of one first step, like ``eagle3.eagle3_forward``."""
  model = load_model(directory, target_model)
  b, t = tokens.shape
  if positions is None:
    positions = torch.arange(t).expand(b, t)
  h = taps.float()
  if model.input_norm is not None:
    h = model.input_norm(h)
  if model.fc_norm is not None:
    h = torch.cat([n(c) for n, c in zip(model.fc_norm, h.chunk(len(model.fc_norm), dim=-1))], dim=-1)
  h = torch.cat([model.embed_tokens(tokens), model.fc(h)], dim=-1)
  position_embeddings = model.rotary_emb(h, positions)
  mask = torch.full((t, t), float("-inf")).triu(1)[None, None].expand(b, 1, t, t)
  for layer in model.layers:
    h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=position_embeddings)
    h = h[0] if isinstance(h, tuple) else h
  normed = model.norm(h)
  return (normed if model.config.norm_output else h), model.lm_head(normed)


@torch.no_grad()
def first_step_tokens(directory, target_model, tokens, taps):
  """The library's own ``Eagle3DraftModel.forward`` for one TTT step over one
  packed sequence (batch of one, positions ``1 + arange`` as it defaults to):
  the draft-vocabulary argmax ``[1, T]``."""
  model = load_model(directory, target_model)
  if tokens.shape[0] != 1:
    raise ValueError("the speculators training forward takes one packed sequence")
  document_ids = torch.zeros_like(tokens)
  return model(taps.float(), tokens, document_ids, ttt_steps=1)[0]


def reference_forward(directory, target_model, tokens, taps, *, positions=None):
  """``(hidden_out, draft_logits, source)`` for a speculators-layout head: the
  library's modules when ``speculators`` imports (``source == "speculators"``),
  else this package's own reference (``source == "draft_formats"``)."""
  if available():
    return (*forward(directory, target_model, tokens, taps, positions=positions), "speculators")
  from .eagle3 import eagle3_forward, load_eagle3

  state, config = load_eagle3(directory)
  return (*eagle3_forward(state, config, target_model, tokens, taps, positions=positions), "draft_formats")
