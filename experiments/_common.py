"""Flags and I/O shared by the experiment scripts (absl flags live only in experiments/)."""

import json
import pathlib

from absl import flags

from bass_jax import reproduce
from bass_jax.data import load_problems

SETTING = flags.DEFINE_string("setting", "quick", "Name of the setting (recorded, and the file suffix).")
TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
DRAFT = flags.DEFINE_string("draft", "smollm2-135m-draft", "Draft model spec.")
DRAFT_LAYERS = flags.DEFINE_integer("draft_num_layers", 0, "Keep the draft's first N layers (0 = all).")
NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 2, "First N HumanEval prompts.")
MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per sequence.")
BATCHES = flags.DEFINE_list("batch_sizes", ["1", "2", "4", "8", "16"], "Batch sizes.")
KERNELS = flags.DEFINE_enum("kernels", "auto", ["auto", "pallas", "blocked"],
                            "PAD/SPLIT attention: Pallas kernels (GPU) or their plain-JAX versions.")
OUT_DIR = flags.DEFINE_string("out_dir", "results", "Directory for <experiment>_<setting>.json.")


def setup():
  """(target, draft, problems, batch sizes) from the shared flags."""
  target, draft = reproduce.load_pair(TARGET.value, DRAFT.value, DRAFT_LAYERS.value or None)
  return target, draft, load_problems("humaneval", NUM_PROMPTS.value), [int(b) for b in BATCHES.value]


def write(result: dict) -> pathlib.Path:
  result["setting"] = SETTING.value
  path = pathlib.Path(OUT_DIR.value) / f"{result['experiment']}_{SETTING.value}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=2, default=float))
  print(f"wrote {path}")
  return path
