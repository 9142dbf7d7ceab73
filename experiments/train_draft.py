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
from bass_jax.training import distill
from experiments import _io
from experiments import _training

_PRESET = flags.DEFINE_string("preset", "d192_l4", "Architecture: configs/drafts/<preset>.json.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and export (default runs/<preset>).")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target (for the embedding init).")
_INIT = flags.DEFINE_enum("init_embedding", "pca", ["pca", "random"],
                          "Tied embedding: the target's projected onto its top principal directions, "
                          "or random.")
_EVAL_LEN = flags.DEFINE_integer("eval_draft_len", 4, "Draft length of the simulated greedy BASS.")


def main(argv):
  del argv
  _io.init_script()
  preset = pathlib.Path("configs/drafts") / f"{_PRESET.value}.json"
  config = bass_jax.LlamaConfig(**json.loads(preset.read_text()))
  workdir = pathlib.Path(_WORKDIR.value or f"runs/{_PRESET.value}")
  _training.check_export(workdir / "export")
  train_data, eval_data = _training.load_train_and_eval(
      ("tokens", "mask", "topk_ids", "topk_logprobs"), labels="topk")

  init = None
  if _INIT.value == "pca":
    target = bass_jax.load_model(_TARGET.value, tokenizer=False)
    embedding = distill.embedding_from_target(target.params["embed_tokens"]["embedding"],
                                              config.hidden_size)
    del target

    def init(key):
      params = bass_jax.init_params(config, key)
      return dict(params, embed_tokens={"embedding": jax.numpy.asarray(embedding)})

  cfg = _training.train_config(eval_draft_len=_EVAL_LEN.value)
  (workdir / "train_config.json").parent.mkdir(parents=True, exist_ok=True)
  (workdir / "train_config.json").write_text(json.dumps(
      {"preset": _PRESET.value, "init_embedding": _INIT.value, **dataclasses.asdict(cfg)}, indent=2))
  params = distill.train(config, cfg, train_data, workdir, eval_data=eval_data, init_params=init)
  half = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float16), params)
  bass_jax.save_model(bass_jax.Model(config, half, name=_PRESET.value), workdir / "export",
                      overwrite=_training.OVERWRITE.value)
  logging.info("exported %s", workdir / "export")


if __name__ == "__main__":
  _io.run(main)
