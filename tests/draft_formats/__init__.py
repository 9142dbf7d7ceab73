"""Test-side references for published speculative-decoding draft formats.

One module per format -- ``eagle1`` (EAGLE-1/2), ``eagle3`` (EAGLE-3, SafeAILab/
SpecForge and speculators layouts), ``medusa`` (FasterDecoding and vLLM
layouts) -- each with

* ``write_<format>_checkpoint(directory, target_model, *, seed, ...)``: a tiny
  random head for a given ``transformers`` target, in the published file set,
  ``config.json`` fields, tensor names, shapes and dtypes;
* ``load_<format>(directory) -> (state_dict, config)``;
* ``<format>_forward(...)``: an independent PyTorch forward written from the
  published modeling code (float32), cited with repository, file and commit in
  each module's docstring.

``_common`` holds the shared Llama math and file helpers; nothing here imports
the project's own code, so these stay an outside reference for it.
"""

from ._common import draft_to_target_logits, tiny_llama_target
from .eagle1 import eagle1_forward, eagle1_inputs, load_eagle1, write_eagle1_checkpoint
from .eagle3 import (
  default_eagle3_layer_ids,
  eagle3_forward,
  eagle3_hidden_state_indices,
  eagle3_inputs,
  eagle3_taps,
  eagle3_target_logits,
  load_eagle3,
  write_eagle3_checkpoint,
)
from .medusa import load_medusa, medusa_features, medusa_forward, write_medusa_checkpoint

__all__ = [
  "tiny_llama_target",
  "draft_to_target_logits",
  "write_eagle1_checkpoint",
  "load_eagle1",
  "eagle1_forward",
  "eagle1_inputs",
  "write_eagle3_checkpoint",
  "load_eagle3",
  "eagle3_forward",
  "eagle3_taps",
  "eagle3_inputs",
  "eagle3_target_logits",
  "eagle3_hidden_state_indices",
  "default_eagle3_layer_ids",
  "write_medusa_checkpoint",
  "load_medusa",
  "medusa_forward",
  "medusa_features",
]
