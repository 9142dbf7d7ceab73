r"""Trains an EAGLE feature draft for the BASS target (bass_jax.training.feature_draft).

    python -m experiments.build_corpus --labels=features --out_dir=data/eagle   # once
    python -m experiments.train_eagle --corpus=data/eagle --workdir=runs/eagle --steps=400

The draft is one decoder layer shaped after the target (bass_jax.models.eagle); its embedding and LM
head are the target's, frozen, and its head scores the --draft_vocab_size most frequent next tokens of
the training corpus (FR-Spec). Training uses the distillation trainer: orbax checkpoints every
--checkpoint_every steps and a restart with the same --workdir resumes (also after kill -9); progress
shows loss, agreement, tokens/s and the ETA; every --eval_every steps the held-out loss and first-draft
agreement go to <workdir>/metrics.jsonl. At the end the draft is exported to <workdir>/export
(config.json + float16 model.safetensors, with the whole frequency-sorted vocabulary so that a smaller
V' can be chosen at load time); an existing export is an error, checked before training, unless
--overwrite is given.
"""

import dataclasses
import json
import pathlib
import shutil

from absl import app
from absl import flags
from absl import logging
import numpy as np

import bass_jax
from bass_jax.checkpoints import atomic
from bass_jax.models import eagle
from bass_jax.training import corpus, distill, feature_draft
from experiments import _io

_CORPUS = flags.DEFINE_string("corpus", "data/eagle", "Feature corpus (build_corpus --labels=features).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/eagle", "Checkpoints, metrics and export.")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "The target whose features it reads.")
_VOCAB = flags.DEFINE_integer("draft_vocab_size", 16384, "V': tokens the draft's head scores.")
_LAYERS = flags.DEFINE_integer("num_layers", 1, "Draft decoder layers (EAGLE: 1).")
_STEPS = flags.DEFINE_integer("steps", 400, "Optimizer steps.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Windows per step.")
_LR = flags.DEFINE_float("peak_lr", 1e-3, "Peak learning rate.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 40, "Linear warm-up steps.")
_CLS = flags.DEFINE_float("cls_weight", 0.1, "Weight of the token-distribution loss (EAGLE: 0.1).")
_DTYPE = flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Forward/backward dtype.")
_CKPT = flags.DEFINE_integer("checkpoint_every", 25, "Steps between checkpoints.")
_EVAL = flags.DEFINE_integer("eval_every", 100, "Steps between evaluations.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of data order and initialization.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing <workdir>/export whole.")


def _load(pattern):
  return corpus.load_shards(sorted(pathlib.Path(_CORPUS.value).glob(pattern)))


def main(argv):
  del argv
  _io.init_script()
  workdir = pathlib.Path(_WORKDIR.value)
  export = workdir / "export"
  try:  # before the training, not after
    atomic.check_destination(export, overwrite=_OVERWRITE.value)
  except (FileExistsError, NotADirectoryError) as e:
    raise app.UsageError(str(e)) from e
  fields = ("tokens", "mask", "features")
  generated, source = _load("gen_train_*.npz"), _load("src_train_*.npz")
  if "features" not in generated:
    raise app.UsageError(f"{_CORPUS.value} holds no features: build it with "
                         "`python -m experiments.build_corpus --labels=features`")
  train_data = {k: np.concatenate([generated[k], source[k]]) for k in fields}
  del generated, source
  eval_data = _load("gen_eval_*.npz")
  logging.info("train: %d windows (%d labelled tokens); eval: %d", len(train_data["tokens"]),
               int(train_data["mask"].sum()), len(eval_data["tokens"]))

  target = bass_jax.load_model(_TARGET.value, tokenizer=False)
  vocab_ids = feature_draft.token_frequencies(train_data["tokens"], train_data["mask"],
                                              target.config.vocab_size)
  # FR-Spec's trade-off, before training: the share of held-out next tokens each V' can draft at all.
  held_out = eval_data["tokens"][:, 1:][eval_data["mask"][:, :-1]]
  rank = np.empty_like(vocab_ids)
  rank[vocab_ids] = np.arange(len(vocab_ids))
  coverage = {v: float(np.mean(rank[held_out] < v)) for v in (1024, 2048, 4096, 8192, 16384, 32768)
              if v <= len(vocab_ids)}
  logging.info("held-out next tokens inside the top V' of the training corpus: %s", coverage)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "vocab_coverage.json").write_text(json.dumps(coverage, indent=2))
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=_VOCAB.value,
                                        num_layers=_LAYERS.value)
  cfg = distill.TrainConfig(
      steps=_STEPS.value, batch_size=_BATCH.value, peak_lr=_LR.value, warmup_steps=_WARMUP.value,
      compute_dtype=_DTYPE.value, checkpoint_every=_CKPT.value, eval_every=_EVAL.value,
      seed=_SEED.value)
  settings = {"target": _TARGET.value, "corpus": _CORPUS.value, "draft_vocab_size": _VOCAB.value,
              "num_layers": _LAYERS.value, "cls_weight": _CLS.value, **dataclasses.asdict(cfg)}
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "train_config.json").write_text(json.dumps(settings, indent=2))
  objective = feature_draft.objective(config, cfg, target.config, target.params, vocab_ids,
                                      cls_weight=_CLS.value)
  params = distill.train(config, cfg, train_data, workdir, eval_data=eval_data, objective=objective)
  if export.exists():  # --overwrite: checked above
    shutil.rmtree(export)
  eagle.save_eagle(export, config, params, vocab_ids,
                   extra={"trained": {"corpus": _CORPUS.value, "steps": _STEPS.value,
                                      "batch_size": _BATCH.value}})
  logging.info("exported %s (%d trained parameters)", export, config.num_params())


if __name__ == "__main__":
  app.run(main)
