r"""Main job: decode HumanEval (or a JSONL prompt file) with BASS or regular decoding and summarize.

    python -m experiments.generate --method=bass --num_prompts=3 --batch_size=4 \
        --max_new_tokens=64 --temperature=0.2 --top_p=0.95 --summary_json=outputs/bass.json

Each prompt is decoded as one batch of ``--batch_size`` sequences. Per-token latency per sequence
(First / Last / All, BASS paper §4.1) is the wall time from the start of the batch until that sequence
was complete, over its token count; compilation is excluded and reported apart
(``bass_jax.experiment.run_problems`` has the details).

The default draft is ``smollm2-135m-draft``, the small Llama draft this project distilled from the
target and ships inside ``bass_jax/drafts`` (docs/draft.md). ``--draft=smollm2-135m-instruct
--draft_num_layers=4`` gives the old placeholder instead (the target's first four layers), which agrees
with the target a few percent of the time and makes BASS slower than regular decoding.
"""

import json
import pathlib

from absl import app
from absl import flags
from absl import logging
import jax.numpy as jnp

import bass_jax
from bass_jax import experiment
from bass_jax.data import load_problems


_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target: alias, .gguf, or HF dir.")
_DRAFT = flags.DEFINE_string("draft", "smollm2-135m-draft", "Draft: alias, .gguf, or HF dir.")
_DRAFT_LAYERS = flags.DEFINE_integer(
    "draft_num_layers", 0, "Keep only the draft's first N layers (0 = all). With --draft equal to "
    "--target this is the placeholder draft built from the target.")
_METHOD = flags.DEFINE_enum("method", "bass", ["bass", "regular"], "Decoding method.")
_PROMPTS = flags.DEFINE_string("prompts", "humaneval", "'humaneval' or a JSONL file with 'prompt'.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 3, "First N prompts (0 = all).")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Sequences per prompt (the batch).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per sequence at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass in (0, 1].")
_DRAFT_LEN = flags.DEFINE_string("draft_len", "dynamic", "'dynamic' (BASS Algorithm 1) or an int.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed (prompt i uses seed + i).")
_ATTENTION = flags.DEFINE_string("attention_impl", "reference", "Attention implementation.")
_BUCKETS = flags.DEFINE_list(
    "verify_buckets", [], "Draft lengths with a compiled verification shape (default: the fixed "
    "draft length, or 1, 2, 4, ... up to the limit for 'dynamic'). '32' alone compiles one shape "
    "at the maximum and masks.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter/compute dtype.")
_OUTPUT = flags.DEFINE_string("output", None, "JSONL file, one record per sequence.")
_SUMMARY = flags.DEFINE_string("summary_json", None, "JSON file for the summary.")


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value or None)
  logging.info("loading target %s", _TARGET.value)
  target = bass_jax.load_model(_TARGET.value, dtype=dtype)
  draft = None
  if _METHOD.value == "bass":
    draft = bass_jax.load_draft(_DRAFT.value, target, num_layers=_DRAFT_LAYERS.value or None,
                                dtype=dtype)
  result = experiment.run_problems(
      target, draft, problems, batch_size=_BATCH.value, method=_METHOD.value,
      max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
      draft_len=int(_DRAFT_LEN.value) if _DRAFT_LEN.value.isdigit() else _DRAFT_LEN.value,
      seed=_SEED.value, attention_impl=_ATTENTION.value,
      verify_buckets=[int(b) for b in _BUCKETS.value] or None)

  print(experiment.format_summary(result.summary), flush=True)
  for path, write in ((_OUTPUT.value, lambda f: f.writelines(json.dumps(r) + "\n" for r in result.records)),
                      (_SUMMARY.value, lambda f: json.dump(result.summary, f, indent=2))):
    if path:
      pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
      with open(path, "w") as f:
        write(f)
      logging.info("wrote %s", path)


if __name__ == "__main__":
  app.run(main)
