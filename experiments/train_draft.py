r"""Trains a draft model for the BASS target by distillation (bass_jax.training.distill).

    python -m experiments.build_corpus --out_dir=data/distill          # once, ~2 h on 2 cores
    python -m experiments.train_draft --preset=d192_l4 --workdir=runs/d192_l4 --steps=400

Architectures are presets in configs/drafts/<name>.json (transformers LlamaConfig fields). A run
checkpoints every --checkpoint_every steps and resumes from the newest checkpoint when started again
with the same --workdir (also after kill -9); progress shows loss, tokens/s and ETA, and every
--eval_every steps the held-out loss, top-1 agreement with the target and the simulated mean accepted
length of greedy BASS at --eval_draft_len are appended to <workdir>/metrics.jsonl. At the end the draft
is exported to <workdir>/export as a transformers LlamaForCausalLM directory (float16 safetensors),
written atomically (bass_jax.save_model); an existing export is an error, checked before training,
unless --overwrite is given.
"""

import dataclasses
import json
import pathlib

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

import bass_jax
from bass_jax.checkpoints import atomic
from bass_jax.training import corpus, distill
from experiments import _io

_PRESET = flags.DEFINE_string("preset", "d192_l4", "Architecture: configs/drafts/<preset>.json.")
_CORPUS = flags.DEFINE_string("corpus", "data/distill", "Corpus directory (experiments.build_corpus).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and export (default runs/<preset>).")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target (for the embedding init).")
_INIT = flags.DEFINE_enum("init_embedding", "pca", ["pca", "random"],
                          "Tied embedding: the target's projected onto its top principal directions, "
                          "or random.")
_STEPS = flags.DEFINE_integer("steps", 400, "Optimizer steps.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Windows per step.")
_LR = flags.DEFINE_float("peak_lr", 1.5e-3, "Peak learning rate.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 40, "Linear warm-up steps.")
_DTYPE = flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Forward/backward dtype.")
_CKPT = flags.DEFINE_integer("checkpoint_every", 25, "Steps between checkpoints.")
_EVAL = flags.DEFINE_integer("eval_every", 100, "Steps between evaluations.")
_EVAL_LEN = flags.DEFINE_integer("eval_draft_len", 4, "Draft length of the simulated greedy BASS.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of data order and initialization.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing <workdir>/export whole.")


def _load(pattern):
  return corpus.load_shards(sorted(pathlib.Path(_CORPUS.value).glob(pattern)))


def main(argv):
  del argv
  _io.init_script()
  preset = pathlib.Path("configs/drafts") / f"{_PRESET.value}.json"
  config = bass_jax.LlamaConfig(**json.loads(preset.read_text()))
  workdir = pathlib.Path(_WORKDIR.value or f"runs/{_PRESET.value}")
  try:  # before hours of training, not after
    atomic.check_destination(workdir / "export", overwrite=_OVERWRITE.value)
  except (FileExistsError, NotADirectoryError) as e:
    raise app.UsageError(str(e)) from e
  fields = ("tokens", "mask", "topk_ids", "topk_logprobs")
  generated, source = _load("gen_train_*.npz"), _load("src_train_*.npz")
  train_data = {k: np.concatenate([generated[k], source[k]]) for k in fields}
  eval_data = _load("gen_eval_*.npz")
  logging.info("train: %d windows (%d labelled tokens); eval: %d", len(train_data["tokens"]),
               int(train_data["mask"].sum()), len(eval_data["tokens"]))

  init = None
  if _INIT.value == "pca":
    target = bass_jax.load_model(_TARGET.value, tokenizer=False)
    embedding = distill.embedding_from_target(target.params["embed_tokens"]["embedding"],
                                              config.hidden_size)
    del target

    def init(key):
      params = bass_jax.init_params(config, key)
      return dict(params, embed_tokens={"embedding": jax.numpy.asarray(embedding)})

  cfg = distill.TrainConfig(
      steps=_STEPS.value, batch_size=_BATCH.value, peak_lr=_LR.value, warmup_steps=_WARMUP.value,
      compute_dtype=_DTYPE.value, checkpoint_every=_CKPT.value, eval_every=_EVAL.value,
      eval_draft_len=_EVAL_LEN.value, seed=_SEED.value)
  (workdir / "train_config.json").parent.mkdir(parents=True, exist_ok=True)
  (workdir / "train_config.json").write_text(json.dumps(
      {"preset": _PRESET.value, "init_embedding": _INIT.value, **dataclasses.asdict(cfg)}, indent=2))
  params = distill.train(config, cfg, train_data, workdir, eval_data=eval_data, init_params=init)
  half = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float16), params)
  bass_jax.save_model(bass_jax.Model(config, half, name=_PRESET.value), workdir / "export",
                      overwrite=_OVERWRITE.value)
  logging.info("exported %s", workdir / "export")


if __name__ == "__main__":
  app.run(main)
