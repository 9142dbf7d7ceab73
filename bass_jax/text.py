"""Text in, text out: :func:`generate_text` wraps the token-level :func:`bass_jax.generate` with the target's
tokenizer, its chat template, its stop ids (:func:`stop_ids`) and stop strings."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import numpy as np

from bass_jax import _checks
from bass_jax.evaluation import data
from bass_jax.loading import Model
from bass_jax.sampling import programs
from bass_jax.sampling.generate import generate


def _stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
  if stop is None:
    return ()
  stops = (stop,) if isinstance(stop, str) else stop
  if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
    raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
  if any(not s for s in stops):
    raise ValueError("stop strings must be non-empty (an empty one would cut every output to '')")
  return tuple(stops)


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
  """``text`` up to (not including) the earliest occurrence of any of ``stop``; all of it if none occurs."""
  cut = len(text)
  for s in stop:
    at = text.find(s)
    if at != -1:
      cut = min(cut, at)
  return text[:cut]


def stop_ids(target: Model) -> tuple[int, ...]:
  """The token ids that end a row of :func:`generate_text`: the target config's ``eos_token_id``
  (config.json's, with ``generation_config.json``'s merged in by ``load_model``) and then the
  tokenizer's ``eos_token_id`` (its ``tokenizer_config.json``'s ``eos_token``: an Instruct model's
  end-of-turn token such as ``<|im_end|>`` or ``<|eot_id|>``, which a base config.json may not name),
  each once; ``()`` when neither names one."""
  ids = target.config.eos_token_id
  ids = () if ids is None else (tuple(ids) if isinstance(ids, (tuple, list)) else (ids,))
  tok_eos = getattr(target.tokenizer, "eos_token_id", None)
  if isinstance(tok_eos, int) and not isinstance(tok_eos, bool):
    ids += (tok_eos,)
  return tuple(dict.fromkeys(int(i) for i in ids))


def cut_at_stop_id(tokens: Sequence[int], ids: Sequence[int]) -> list[int]:
  """``tokens`` up to (not including) the first of ``ids``; all of them if none occurs."""
  ends = set(ids)
  for j, t in enumerate(tokens):
    if t in ends:
      return list(tokens[:j])
  return list(tokens)


def encode_prompts(tokenizer: Any, prompts: Sequence[str], *, chat: bool = False) -> list[list[int]]:
  """Token ids of each prompt: plain (``tokenizer(text)``, special tokens as the tokenizer adds them), or
  as one user turn of the tokenizer's chat template followed by the assistant's generation prompt.

  Raises:
    ValueError: ``prompts`` is not a non-empty list of strings, or one cannot be encoded (a lone
      surrogate; its index named); ``chat=True`` with a tokenizer that has no chat template.
  """
  if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
    raise ValueError("prompts must be a non-empty list of strings (for one prompt pass [text])")
  for i, p in enumerate(prompts):
    if not isinstance(p, str):
      raise ValueError(f"prompt {i} must be a string, got {type(p).__name__}; for token ids use "
                       "bass_jax.generate")
    data.check_text(p, f"prompt {i}")
  if not chat:
    return [list(tokenizer(p).input_ids) for p in prompts]
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("chat=True but the target's tokenizer has no chat template; pass chat=False")
  ids = []
  for p in prompts:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                            add_generation_prompt=True, tokenize=True)
    if not isinstance(encoded, list):  # transformers 5 returns a BatchEncoding
      encoded = encoded["input_ids"]
    ids.append(list(encoded))
  return ids


def generate_text(target: Model, draft: Any, prompts: Sequence[str], *, chat: bool = False,
                  stop: str | Sequence[str] | None = None, verbose: bool = True,
                  **generate_kwargs: Any) -> list[str]:
  """Decodes strings to strings with BASS (or regular decoding), using the target's tokenizer.

  Args:
    target: the target model; it must carry a tokenizer (``load_model`` loads it with the checkpoint).
    draft: the draft side as ``generate`` takes it (a draft model, an ``NGramProposer``, a
      ``SiblingProposer`` or a ``Hybrid``; None with ``method="regular"``).
    prompts: B strings.
    chat: wrap each prompt as one user turn of the tokenizer's chat template with the assistant's
      generation prompt (for Instruct models such as SmolLM2-135M-Instruct).
    stop: a string or strings; each output is cut on the host, after decoding, before the earliest
      occurrence of any of them (the stop string itself is not returned). Decoding still runs to a
      stop id or ``max_new_tokens``.
    **generate_kwargs: passed to :func:`bass_jax.generate` (``method``, ``max_new_tokens``,
      ``temperature``, ``top_p``, ``draft_len``, ``seed``, …). ``eos_token_id`` left out (or None)
      takes :func:`stop_ids`: the target config's EOS ids (config.json and generation_config.json)
      and the tokenizer's EOS token, so that a chat reply ends at the template's end-of-turn token
      (``<|im_end|>``, ``<|eot_id|>``) even where config.json names only ``<|end_of_text|>``; given, it
      replaces them.
    verbose: say on stderr, in one line, when the decode's programs compile and how long it took
      (``programs.printing``), so that a first call is not mistaken for a hang.

  Returns:
    B strings: each row's emitted tokens up to (not including) its first stop id, decoded with special
    tokens skipped (no ``<|im_end|>``), cut at the first stop string. A stop id that the tokenizer does
    not count as special (one that only generation_config.json names) is removed all the same.

  Raises:
    ValueError: no tokenizer on the target; prompts not a list of strings; a bad stop; ``chat=True``
      without a chat template; and whatever :func:`bass_jax.generate` rejects.
  """
  if target.tokenizer is None:
    raise ValueError(f"target {target.name!r} has no tokenizer; load one that ships it, or use "
                     "bass_jax.generate with token ids")
  stops = _stop_strings(stop)
  ids = encode_prompts(target.tokenizer, prompts, chat=chat)
  if generate_kwargs.get("eos_token_id") is None:
    generate_kwargs["eos_token_id"] = stop_ids(target) or None
  with programs.printing() if _checks.as_bool("verbose", verbose) else contextlib.nullcontext():
    out = generate(target, draft, ids, **generate_kwargs)
  ends = generate_kwargs["eos_token_id"]
  ends = [] if ends is None else np.asarray(ends).reshape(-1).tolist()  # generate checked them
  texts = [target.tokenizer.decode(cut_at_stop_id(seq, ends), skip_special_tokens=True)
           for seq in out.sequences()]
  return [cut_at_stop(t, stops) for t in texts]
