"""The baselines a user would otherwise pick, timed on the same prompts: transformers' PyTorch ``generate``
(batched) and its assisted generation (Leviathan-style speculative decoding, batch 1 only in
transformers) with our draft as the assistant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import time
from typing import Any, Sequence

import numpy as np
from bass_jax import loading


@dataclasses.dataclass(frozen=True)
class HFRun:
  """One transformers ``generate`` call.

  Attributes:
    wall_seconds: the call, prompt processing included.
    tokens: ``i32[B]`` new tokens per row (up to and including EOS).
    ms_per_token: wall time over the longest row's tokens: every row of a transformers batch is
      returned when the last one finishes, so First = Last = All.
    tokens_per_second: all new tokens over the wall time.
    sequences: the new tokens per row.
  """

  wall_seconds: float
  tokens: np.ndarray
  ms_per_token: float
  tokens_per_second: float
  sequences: list[list[int]]


@contextlib.contextmanager
def _gguf_name_maps_built_once():
  """While it lasts, ``gguf.get_tensor_name_map(arch, n_blocks)`` builds each map once.

  transformers' GGUF loader (``modeling_gguf_pytorch_utils.get_gguf_hf_weights_map``) calls it once
  per module of the model it fills, 397 times for SmolLM2-135M: about 10 s of a 26 s load on the
  project's 2-core machine (2026-11-30, docs/testing.md, "Where the time goes", names the command).
  The map is a pure function of its arguments, which the
  loader only reads, so one per ``(arch, n_blocks)`` gives the same weights. Not thread-safe: it
  swaps a module attribute of ``gguf`` for the duration.
  """
  import gguf  # pylint: disable=g-import-not-at-top

  build, built = gguf.get_tensor_name_map, {}

  def once(arch, n_blocks):
    if (arch, n_blocks) not in built:
      built[arch, n_blocks] = build(arch, n_blocks)
    return built[arch, n_blocks]

  gguf.get_tensor_name_map = once
  try:
    yield
  finally:
    gguf.get_tensor_name_map = build


def load_torch_model(spec: str | os.PathLike):
  """A transformers ``AutoModelForCausalLM`` (f32, eval mode) for a bass_jax model spec.

  Aliases and ``.gguf`` files are loaded by transformers from the same GGUF file (dequantized to
  f32; gguf's tensor-name map built once per load, not once per module:
  :func:`_gguf_name_maps_built_once`); directories with ``from_pretrained``.

  Raises:
    FileNotFoundError: an alias whose package file is missing (:func:`bass_jax.loading.resolve_alias`).
    OSError: a path transformers cannot read as a checkpoint.
    ImportError: torch or transformers not installed (``make test`` installs both).
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  spec = str(spec)
  if spec in loading.ALIASES:
    path = loading.resolve_alias(spec)
  else:
    path = pathlib.Path(spec)
  # float32 at load time: transformers marks a GGUF-loaded model as quantized and refuses .float().
  if path.suffix == ".gguf":
    with _gguf_name_maps_built_once():
      model = transformers.AutoModelForCausalLM.from_pretrained(
          str(path.parent), gguf_file=path.name, dtype=torch.float32)
  else:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
  return model.eval()


def hf_generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
                top_p: float, seed: int, eos_token_id: int | Sequence[int] | None,
                assistant: Any = None) -> HFRun:
  """Times ``model.generate`` on a batch of prompts (the experiments' batches: distinct prompts, or
  copies of one prompt when sampling).

  Prompts of different lengths are left-padded (with ``eos_token_id``) under an attention mask, as
  transformers' batched generation of decoder-only models needs.

  Args:
    prompts: B token-id lists.
    eos_token_id: the stop id, or several (a config whose generation_config.json adds ids: Llama 3's
      three); the first pads.
    assistant: a draft model for transformers' assisted generation (B must be 1).

  Raises:
    ValueError: an assistant with more than one prompt (transformers supports batch 1 only), or no
      pad id (``eos_token_id`` None) for prompts of different lengths.
  """
  import torch  # pylint: disable=g-import-not-at-top

  batch = len(prompts)
  if assistant is not None and batch != 1:
    raise ValueError("transformers' assisted generation supports batch size 1 only")
  width = max(len(p) for p in prompts)
  if eos_token_id is None and any(len(p) != width for p in prompts):
    raise ValueError("prompts of different lengths need a pad id; pass eos_token_id")
  if isinstance(eos_token_id, (tuple, list)):
    eos_token_id = list(eos_token_id) or None
  pad = 0 if eos_token_id is None else (eos_token_id[0] if isinstance(eos_token_id, list)
                                        else eos_token_id)
  inputs = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
  torch.manual_seed(seed)
  kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, min_new_tokens=0,
                                pad_token_id=pad, eos_token_id=eos_token_id)
  if temperature > 0:
    kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
  else:
    kwargs.update(do_sample=False)
  if assistant is not None:
    kwargs["assistant_model"] = assistant
  with torch.no_grad():
    start = time.perf_counter()
    out = model.generate(inputs, attention_mask=mask, **kwargs)
    wall = time.perf_counter() - start
  sequences = []
  for row in out[:, width:].tolist():
    if eos_token_id is not None and eos_token_id in row:
      row = row[:row.index(eos_token_id) + 1]
    sequences.append(row)
  tokens = np.array([len(s) for s in sequences])
  return HFRun(wall_seconds=wall, tokens=tokens, ms_per_token=1000 * wall / max(tokens.max(), 1),
               tokens_per_second=tokens.sum() / wall, sequences=sequences)
