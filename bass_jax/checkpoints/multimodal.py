"""A multimodal checkpoint's text decoder: the config a ``model_type`` wraps (Gemma 3's ``gemma3``
around ``gemma3_text``, ``models.family.Family.wrapper_types``) and its tensors under the text
model's names, its vision tower dropped."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from bass_jax.models import decoder_config
from bass_jax.models import family as family_lib


# The fields of a multimodal Gemma 3 config (``Gemma3Config``) beside its ``text_config``: the vision
# tower and the image tokens, which a text decode does not use.
_GEMMA3_VISION_FIELDS = frozenset({"vision_config", "mm_tokens_per_image", "boi_token_index",
                                   "eoi_token_index", "image_token_index", "image_token_id",
                                   "boi_token_id", "eoi_token_id", "initializer_range"})


def text_config(fields: dict[str, Any], model_type: str, text_type: str) -> dict[str, Any]:
  """The ``text_type`` config inside a multimodal ``model_type`` one (Gemma 3's
  ``Gemma3ForConditionalGeneration`` checkpoints such as gemma-3-4b-it): its ``text_config``, decoded
  as text only. The vision fields it drops and the final soft cap it removes are Gemma 3's, the only
  wrapper registered (``models.family.Family.wrapper_types``); another wrapper family would add its
  own here.

  Raises:
    ValueError: no ``text_config``, or a top-level field that is neither the vision tower's nor
      transformers' generic bookkeeping (named).
  """
  text = fields.get("text_config")
  if not isinstance(text, dict):
    raise ValueError(f"{model_type}: config.json has no text_config object; a text-only checkpoint "
                     f"has model_type {text_type!r}")
  rest = {k: v for k, v in fields.items() if k != "text_config"}
  decoder_config.parse_hf_fields(rest, model_types=(model_type,),
                         known=("tie_word_embeddings", "bos_token_id", "eos_token_id",
                                "pad_token_id"), ignored=_GEMMA3_VISION_FIELDS)
  text = dict(text)
  text.setdefault("model_type", text_type)
  # transformers' Gemma3ForConditionalGeneration applies no final soft cap, whatever text_config says
  text["final_logit_softcapping"] = None
  for name in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
    if text.get(name) is None and fields.get(name) is not None:
      text[name] = fields[name]
  return text


# A multimodal Gemma 3's text decoder under its two published layouts (transformers 4's
# ``language_model.model.*`` and 5's ``model.language_model.*``) -> the text model's names; its vision
# tower and projector are not read.
_GEMMA3_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                    ("language_model.lm_head.", "lm_head."))
_GEMMA3_VISION = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")


def text_decoder_tensors(fields: dict[str, Any], tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The tensors of the text decoder under the text model's names: a multimodal checkpoint's (a
  ``model_type`` that wraps a family's text config, ``models.family.Family.wrapper_types``: Gemma 3's)
  renamed and its vision tower dropped; any other's as they are. Never raises."""
  if family_lib.wrapped_by(fields.get("model_type")) is None:
    return tensors
  out = {}
  for name, value in tensors.items():
    if _GEMMA3_VISION.match(name):
      continue
    for old, new in _GEMMA3_PREFIXES:
      if name.startswith(old):
        name = new + name[len(old):]
        break
    out[name] = value
  return out
