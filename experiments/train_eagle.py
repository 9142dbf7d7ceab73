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

--architecture=eagle3 trains EAGLE-3's architecture instead (Li et al. 2025): fc over the target's
three tapped layers (--taps, default the inputs of layers 2, L // 2 and L - 3; the corpus must hold
them: build_corpus --hidden_layers), one layer over (normed embedding, normed hidden), its own final
norm and head over the draft vocabulary, trained on the token distribution alone (--cls_weight scales
it); --export_layout=speculators or safeailab writes it as vLLM/SGLang and SafeAILab read it.

EAGLE-3's training-time test (--ttt_depth=D > 1) also trains drafts 2 … D of chains that read the
draft's own features; --init_from fine-tunes an exported draft (docs/draft.md, "Training-time test"),
or grows a deeper one from it (--num_layers above the export's: the new layers start as the
identity, eagle_init.grown_params).
"""

import dataclasses
import json
import pathlib

from absl import app
from absl import flags
from absl import logging

import bass_jax
from bass_jax.checkpoints import eagle_files
from bass_jax.models import eagle
from bass_jax.models import eagle_init
from bass_jax.training import corpus, distill, feature_draft
from experiments import _io
from experiments import _training

_WORKDIR = flags.DEFINE_string("workdir", "runs/eagle", "Checkpoints, metrics and export.")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "The target whose features it reads.")
_VOCAB = flags.DEFINE_integer("draft_vocab_size", 16384, "V': tokens the draft's head scores.")
_LAYERS = flags.DEFINE_integer("num_layers", 1, "Draft decoder layers (EAGLE: 1).")
_CLS = flags.DEFINE_float("cls_weight", 0.1, "Weight of the token-distribution loss (EAGLE: 0.1).")
_TTT = flags.DEFINE_integer("ttt_depth", 1, "Training-time test (EAGLE-3): also train drafts 2 … D of "
                            "chains on the draft's own features (1: teacher-forced only, EAGLE).")
_TTT_STRIDE = flags.DEFINE_integer("ttt_stride", 8, "A chain starts every this many positions.")
_EVAL_DEPTH = flags.DEFINE_integer("eval_depth", 4, "Drafts per chain in the held-out evaluation (the "
                                   "draft length of its simulated greedy BASS).")
_FUSED = flags.DEFINE_list("fused_layers", [], "EAGLE-3's fused features: the target's decoder layers "
                           "(0-based) whose outputs the first draft reads with the feature; the corpus "
                           "must hold them (build_corpus --hidden_layers).")
_ARCHITECTURE = flags.DEFINE_enum("architecture", "bass", ["bass", "eagle3"],
                                  "bass: this project's feature draft; eagle3: EAGLE-3's.")
_TAPS = flags.DEFINE_list("taps", [], "EAGLE-3: the target layers (0-based outputs) fc reads; empty: "
                          "the inputs of layers 2, L // 2, L - 3 (EAGLE's and vLLM's default).")
_EXPORT_LAYOUT = flags.DEFINE_enum("export_layout", "bass", ["bass", "safeailab", "speculators"],
                                   "bass: this project's files; safeailab / speculators: an EAGLE-3 "
                                   "draft in the published layouts (bass_jax.save_model's formats).")
_INIT_FROM = flags.DEFINE_string("init_from", None, "Fine-tune: start from this exported draft "
                                 "(train_eagle's export; same layer shape) instead of random weights.")
flags.set_default(_training.CORPUS, "data/eagle")
flags.set_default(_training.LR, 1e-3)


def main(argv):
  del argv
  _io.init_script()
  workdir = pathlib.Path(_WORKDIR.value)
  export = workdir / "export"
  _training.check_export(export)
  target = bass_jax.load_model(_TARGET.value, tokenizer=False)
  fused = tuple(int(i) for i in _FUSED.value)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=_VOCAB.value,
                                        num_layers=_LAYERS.value, fused_layers=fused)
  if _ARCHITECTURE.value == "eagle3":
    if fused or _LAYERS.value != 1 or _INIT_FROM.value:
      raise app.UsageError("--architecture=eagle3 is one layer reading --taps; --fused_layers, "
                           "--num_layers and --init_from are for this project's drafts")
    taps = tuple(int(i) for i in _TAPS.value)
    if list(taps) != sorted(set(taps)):
      raise app.UsageError(f"--taps={_TAPS.value}: give distinct layers in ascending order (fc reads "
                           "them in that order, as the published runtimes do)")
    try:
      config = eagle.resolve_taps(eagle.EagleConfig(config.layer, _VOCAB.value, kind="eagle3",
                                                    fc_bias=False, taps=taps), target.config)
    except ValueError as e:
      raise app.UsageError(str(e)) from e
  elif _TAPS.value or _EXPORT_LAYOUT.value != "bass":
    raise app.UsageError("--taps and --export_layout are for --architecture=eagle3")
  try:
    corpus.check_hidden_layers(_training.CORPUS.value, config.target_taps)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  train_data, eval_data = _training.load_train_and_eval(feature_draft.fields(config),
                                                        labels="features")
  vocab_ids = feature_draft.token_frequencies(train_data["tokens"], train_data["mask"],
                                              target.config.vocab_size)
  # FR-Spec's trade-off, before training: the share of held-out next tokens each V' can draft at all.
  coverage = feature_draft.vocab_coverage(vocab_ids, eval_data["tokens"], eval_data["mask"],
                                          (1024, 2048, 4096, 8192, 16384, 32768))
  logging.info("held-out next tokens inside the top V' of the training corpus: %s", coverage)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "vocab_coverage.json").write_text(json.dumps(coverage, indent=2))
  init = None
  if _INIT_FROM.value:
    start_config, start = eagle_files.load_eagle(_INIT_FROM.value)
    same_layers = dataclasses.replace(config.layer, num_hidden_layers=start_config.num_layers)
    if (start_config.layer != same_layers or start_config.num_layers > config.num_layers
        or start_config.fused_layers not in ((), fused)):
      raise app.UsageError(f"--init_from={_INIT_FROM.value} has another layer shape, more layers or "
                           f"other fused layers than --num_layers={_LAYERS.value} "
                           f"--fused_layers={_FUSED.value} give")
    # A plain draft fine-tuned with fused layers gains the fusion, initialized to pass f through; a
    # deeper draft grows from a shallower one, its new layers starting as the identity.
    init = lambda key: eagle_init.grown_params(config, start["draft"], key)
  cfg = _training.train_config()
  settings = {"target": _TARGET.value, "corpus": _training.CORPUS.value, "draft_vocab_size": _VOCAB.value,
              "num_layers": _LAYERS.value, "fused_layers": list(fused), "cls_weight": _CLS.value,
              "architecture": _ARCHITECTURE.value, "taps": list(config.target_taps),
              "export_layout": _EXPORT_LAYOUT.value,
              "ttt_depth": _TTT.value,
              "ttt_stride": _TTT_STRIDE.value, "eval_depth": _EVAL_DEPTH.value,
              "init_from": _INIT_FROM.value, **dataclasses.asdict(cfg)}
  (workdir / "train_config.json").write_text(json.dumps(settings, indent=2))
  objective = feature_draft.objective(config, cfg, target.config, target.params, vocab_ids,
                                      cls_weight=_CLS.value, ttt_depth=_TTT.value,
                                      ttt_stride=_TTT_STRIDE.value, eval_depth=_EVAL_DEPTH.value,
                                      init=init)
  params = distill.train(config, cfg, train_data, workdir, eval_data=eval_data, objective=objective)
  if _EXPORT_LAYOUT.value != "bass":  # --overwrite: checked above
    draft = bass_jax.Model(config, {"draft": params,
                                    "vocab_ids": vocab_ids[:config.draft_vocab_size]}, name="eagle3")
    bass_jax.save_model(draft, export, format=_EXPORT_LAYOUT.value, overwrite=True, dtype="bfloat16")
  else:
    eagle_files.save_eagle(export, config, params, vocab_ids, overwrite=True,
                     extra={"trained": {"corpus": _training.CORPUS.value, "steps": cfg.steps,
                                        "batch_size": cfg.batch_size}})
  logging.info("exported %s (%d trained parameters)", export, config.num_params())


if __name__ == "__main__":
  _io.run(main)
