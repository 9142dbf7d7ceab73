"""What the draft-training scripts share (``train_draft``, ``train_eagle``): the trainer's flags, the
export check, and loading the corpus's train and held-out shards.

A script sets its own defaults with ``flags.set_default`` (its corpus directory, its learning rate).
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from absl import logging
import numpy as np

from bass_jax.checkpoints import atomic
from bass_jax.training import corpus, distill

CORPUS = flags.DEFINE_string("corpus", "data/distill", "Corpus directory (experiments.build_corpus).")
STEPS = flags.DEFINE_integer("steps", 400, "Optimizer steps.")
BATCH = flags.DEFINE_integer("batch_size", 16, "Windows per step.")
LR = flags.DEFINE_float("peak_lr", 1.5e-3, "Peak learning rate.")
WARMUP = flags.DEFINE_integer("warmup_steps", 40, "Linear warm-up steps.")
DTYPE = flags.DEFINE_enum("compute_dtype", "float32", ["float32", "bfloat16"], "Forward/backward dtype.")
CKPT = flags.DEFINE_integer("checkpoint_every", 25, "Steps between checkpoints.")
EVAL = flags.DEFINE_integer("eval_every", 100, "Steps between evaluations.")
SEED = flags.DEFINE_integer("seed", 0, "Seed of data order and initialization.")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing <workdir>/export whole.")


def check_export(path: pathlib.Path) -> None:
  """Fails before the training, not after it, when the export could not be written.

  Raises:
    app.UsageError: ``path`` exists (without ``--overwrite``) or is not a directory.
  """
  try:
    atomic.check_destination(path, overwrite=OVERWRITE.value)
  except (FileExistsError, NotADirectoryError) as e:
    raise app.UsageError(str(e)) from e


def train_config(**overrides) -> distill.TrainConfig:
  """A :class:`distill.TrainConfig` from the shared flags (and ``overrides``)."""
  return distill.TrainConfig(
      steps=STEPS.value, batch_size=BATCH.value, peak_lr=LR.value, warmup_steps=WARMUP.value,
      compute_dtype=DTYPE.value, checkpoint_every=CKPT.value, eval_every=EVAL.value, seed=SEED.value,
      **overrides)


def _paths(pattern: str) -> list[pathlib.Path]:
  return sorted(p for p in pathlib.Path(CORPUS.value).glob(pattern) if not p.name.endswith(".tmp.npz"))


def load_train_and_eval(fields: tuple[str, ...], labels: str
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """The training windows (target continuations, then source windows when the corpus has them: a
  corpus relabelled from token ids alone, ``build_corpus --relabel_from``, holds continuations only)
  and the held-out continuations.

  Args:
    fields: the arrays training reads. labels: the ``build_corpus --labels`` value that writes them
      (for the error message).

  Raises:
    app.UsageError: no training or held-out continuations, or the corpus lacks one of ``fields``
      (every training shard is checked).
  """
  generated, source = _paths("gen_train_*.npz"), _paths("src_train_*.npz")
  if not generated:
    raise app.UsageError(f"{CORPUS.value} holds no gen_train_*.npz shards (target continuations): "
                         "build them with `python -m experiments.build_corpus`")
  missing = set()
  for path in generated + source:
    with np.load(path) as shard:
      missing |= set(fields) - set(shard.files)
  if missing:
    raise app.UsageError(f"{CORPUS.value} holds no {', '.join(sorted(missing))}: build it with "
                         f"`python -m experiments.build_corpus --labels={labels}` (and --hidden_layers "
                         "for a draft that reads hidden states)")
  train_data = corpus.load_shards(generated + source, fields)
  held_out = _paths("gen_eval_*.npz")
  if not held_out:
    raise app.UsageError(f"{CORPUS.value} holds no gen_eval_*.npz shards (held-out continuations): "
                         "build them with `python -m experiments.build_corpus`")
  with np.load(held_out[0]) as first:
    kinds = ("prompt_kinds",) if "prompt_kinds" in first.files else ()
  eval_data = corpus.load_shards(held_out, tuple(fields) + kinds)
  logging.info("train: %d windows (%d labelled tokens; %d shards of continuations, %d of source "
               "windows); eval: %d", len(train_data["tokens"]), int(train_data["mask"].sum()),
               len(generated), len(source), len(eval_data["tokens"]))
  return train_data, eval_data
