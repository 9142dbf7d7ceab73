r"""Held-out metrics of exported EAGLE feature drafts on a corpus, side by side.

    python -m experiments.eval_eagle --drafts=smollm2-135m-eagle,runs/eagle2/export \
        --names=shipped,eagle2 --corpus=data/eagle2

Evaluates each draft on the corpus's held-out target continuations (``gen_eval_*`` shards with
features: ``experiments.build_corpus --labels=features``) exactly as ``train_eagle`` does every
``--eval_every`` steps (``bass_jax.training.feature_draft.evaluate``): the teacher-forced first-draft
agreement with the target's greedy token (greedy BASS's acceptance of the first draft), split by prompt
kind when the shards record it, each draft depth's agreement along chains of the draft's own
features, and the mean accepted length of the greedy BASS those chains simulate at draft length
``--depth``. A draft keeps its own V' unless ``--draft_vocab_size`` sets one for all.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags
from absl import logging

import numpy as np

import bass_jax
from bass_jax.checkpoints import eagle_formats
from bass_jax.evaluation import reproduce
from bass_jax.checkpoints import eagle_files
from bass_jax.models import eagle
from bass_jax.training import corpus, feature_draft
from experiments import _io

_DRAFTS = flags.DEFINE_list("drafts", ["smollm2-135m-eagle"], "Exported EAGLE drafts: aliases or "
                            "directories (train_eagle's <workdir>/export, in any --export_layout; a "
                            "published EAGLE or EAGLE-3 draft of the target).")
_NAMES = flags.DEFINE_list("names", [], "A name per draft for the table (default: the specs).")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "The target whose features they read.")
_DEPTH = flags.DEFINE_integer("depth", 4, "Drafts per chain (the simulated draft length).",
                              lower_bound=1)
_VOCAB = flags.DEFINE_integer("draft_vocab_size", None, "Evaluate every draft at this V' (a prefix of "
                              "its frequency-sorted vocabulary) instead of its own: drafts in this "
                              "project's layout only.", lower_bound=1)
_CORPUS = flags.DEFINE_string("corpus", "data/eagle2", "Corpus directory with held-out feature shards.")
_RESULTS = flags.DEFINE_string("results_dir", None, "Write eval_eagle.json here (default: a fresh "
                               "outputs/eval_eagle-<time>/).")


def _load_draft(path: pathlib.Path, name: str, target_config) -> tuple[eagle.EagleConfig, dict,
                                                                       np.ndarray, bool]:
  """``(config, params, vocab_order, published)`` of one draft, checked against the target and with an
  EAGLE-3 draft's default taps resolved: a ``train_eagle`` export in this project's layout with its
  whole frequency-sorted vocabulary, or a published-layout draft (EAGLE-1/2, EAGLE-3 in the SafeAILab
  or speculators layout, also ``train_eagle --export_layout``'s) with its V' target ids.

  Raises:
    app.UsageError: the draft does not fit the target (``eagle.check_pair_configs``, named).
  """
  published = eagle_formats.published_kind(path) is not None
  if published:
    config, params = eagle_formats.load_published(path)
    order = np.asarray(params["vocab_ids"], np.int32)
  else:
    config, params = eagle_files.load_eagle(path)
    order = eagle_files.load_vocab_order(path)
  try:
    eagle.check_pair_configs(config, target_config, name)
    config = eagle.resolve_taps(config, target_config)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  return config, params, order, published


def _vocab_size(config: eagle.EagleConfig, order: np.ndarray, published: bool, name: str) -> int:
  """The V' ``--draft_vocab_size`` asks for ``name``, or its own.

  Raises:
    app.UsageError: another V' for a published-layout draft (its ids need not be frequency-sorted, so
      a prefix is no draft vocabulary), or a V' above what the draft stores (its vocabulary order, an
      EAGLE-3 draft's head rows).
  """
  asked = _VOCAB.value
  if not asked or asked == config.draft_vocab_size:
    return config.draft_vocab_size
  if published:
    raise app.UsageError(f"--draft_vocab_size={asked}: {name} is a published-layout draft, evaluated "
                         f"at its own V' = {config.draft_vocab_size} (its ids need not be sorted by "
                         "frequency, so a prefix is no draft vocabulary)")
  stored = config.draft_vocab_size if config.kind == "eagle3" else len(order)
  if asked > stored:
    raise app.UsageError(f"--draft_vocab_size={asked} exceeds {name}'s stored vocabulary of {stored} "
                         "tokens" + (" (an EAGLE-3 draft's head rows)" if config.kind == "eagle3" else ""))
  return asked


def main(argv):
  del argv
  _io.init_script()
  names = _NAMES.value or _DRAFTS.value
  if len(names) != len(_DRAFTS.value) or len(set(names)) != len(names):
    raise app.UsageError(f"--names must give one distinct name per draft: {len(names)} names "
                         f"({len(set(names))} distinct) for {len(_DRAFTS.value)} --drafts")
  paths = [bass_jax.loading.model_path(spec) for spec in _DRAFTS.value]
  missing = [str(p) for p in paths if not (p / "config.json").exists()]
  if missing:
    raise app.UsageError(f"no exported EAGLE draft (config.json) at {', '.join(missing)}")
  shards = sorted(p for p in pathlib.Path(_CORPUS.value).glob("gen_eval_*.npz")
                  if not p.name.endswith(".tmp.npz"))
  if not shards:
    raise app.UsageError(f"{_CORPUS.value} holds no gen_eval_*.npz shards: build them with "
                         "`python -m experiments.build_corpus --labels=features` (or --relabel_from)")
  out_dir = _io.run_directory(_RESULTS.value, "eval_eagle")
  data = corpus.load_shards(shards)
  target = bass_jax.load_model(_TARGET.value, tokenizer=False)
  # Every draft is loaded and checked before any is evaluated: a bad last draft is refused before the
  # first one's evaluation, not after it.
  drafts = []
  for name, path in zip(names, paths):
    config, params, vocab_order, published = _load_draft(path, name, target.config)
    config = config.with_draft_vocab_size(_vocab_size(config, vocab_order, published, name))
    try:
      corpus.check_hidden_layers(_CORPUS.value, config.target_taps)
    except ValueError as e:
      raise app.UsageError(f"{name}: {e}") from e
    drafts.append((config, params, vocab_order))
  rows = {}
  for name, spec, (config, params, vocab_order) in zip(names, _DRAFTS.value, drafts):
    frozen, full_head = feature_draft.frozen_inputs(config, target.config, target.params, vocab_order,
                                                    "float32")
    # eval_loss by the draft's own training loss: EAGLE's (regression + 0.1 x the token loss), or the
    # token loss alone for an EAGLE-3 draft (train_eagle --architecture=eagle3 --cls_weight=1.0).
    metrics = feature_draft.evaluate(params["draft"], data, config, frozen, full_head, "float32",
                                     cls_weight=1.0 if config.kind == "eagle3" else 0.1,
                                     depth=_DEPTH.value)
    rows[name] = {"draft": spec, "draft_vocab_size": config.draft_vocab_size, **metrics}
    logging.info("%s: %s", name, rows[name])
  result = {"corpus": _CORPUS.value, "held_out_windows": int(len(data["tokens"])),
            "held_out_positions": int(data["mask"].sum()), "depth": _DEPTH.value, "drafts": rows,
            **reproduce.machine()}
  _io.write_json_atomic(out_dir / "eval_eagle.json", result)
  kinds = [k for k in corpus.PROMPT_KINDS if any(f"eval_agreement_{k}" in r for r in rows.values())]
  depths = [f"eval_agreement_d{d}" for d in range(1, _DEPTH.value + 1)]
  header = (["draft", "V'", "first-draft agreement"] + [f"  {k}" for k in kinds]
            + [f"depth {d}" for d in range(1, _DEPTH.value + 1)] + ["mean accepted length"])
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name, r in rows.items():
    cells = ([name, str(r["draft_vocab_size"]), f"{r['eval_agreement']:.3f}"]
             + [f"{r[f'eval_agreement_{k}']:.3f}" if f"eval_agreement_{k}" in r else "-" for k in kinds]
             + [f"{r[d]:.3f}" for d in depths] + [f"{r['eval_mean_accepted_length']:.3f}"])
    lines.append("| " + " | ".join(cells) + " |")
  print(f"{_CORPUS.value}: {result['held_out_windows']} held-out windows, "
        f"{result['held_out_positions']} positions; {result['device']}, JAX {result['jax_version']}, "
        f"{result['date']}\n\n" + "\n".join(lines))


if __name__ == "__main__":
  _io.run(main)
