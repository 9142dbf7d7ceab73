r"""Builds the distillation corpus for draft training (bass_jax.training.corpus explains what is in it).

    python -m experiments.build_corpus --out_dir=data/distill

Resumable: every shard is written atomically and skipped when it exists, so an interrupted build (or a
``kill -9``) continues where it stopped. ``manifest.json`` records the settings, the token counts and
the time each stage took. About 2 hours on a 2-core CPU with the defaults (the target generates ~0.5 M
tokens and labels ~1.5 M).

    python -m experiments.build_corpus --relabel_from=data/eagle --out_dir=data/eagle3 \
        --labels=features --hidden_layers=2,14

labels an existing corpus's windows again (same tokens, masks and prompt lengths) instead of building
one: here with the features plus the outputs of decoder layers 2 and 14 (EAGLE-3's fused features).

    python -m experiments.build_corpus --flagfile=configs/eagle_corpus_v2.flags

builds the docstring-style corpus of issue 28 in two passes: token ids only (``--labels=none``:
prompts from the standard library and the installed packages in a mix of doctest, docstring and
chat-instruction prompts, continued by the target; small, compressed shards), then features by
``--relabel_from`` (the expensive, teacher-forced pass). Every prompt that overlaps HumanEval's
prompts or solutions is dropped first (``corpus.drop_humaneval_overlap``; counted in the manifest).
"""

import hashlib
import json
import math
import pathlib
import random
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tqdm

import bass_jax
from bass_jax.evaluation.data import load_problems
from bass_jax.training import corpus
from experiments import _io

_OUT = flags.DEFINE_string("out_dir", "data/distill", "Output directory.")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Teacher (the BASS target).")
_WINDOW = flags.DEFINE_integer("window", 256, "Tokens per training example.")
_LABELS = flags.DEFINE_enum("labels", "topk", ["topk", "features", "none"],
                            "What labels each position: the target's top-k log-probabilities (for an "
                            "independent draft), its features, the LM head's input (for an EAGLE "
                            "draft), or nothing: token ids only, to label later with --relabel_from.")
_SOURCES = flags.DEFINE_list("prompt_sources", ["stdlib"], "Where continuation prompts come from: "
                             "'stdlib' and/or 'packages' (--packages).")
_PACKAGES = flags.DEFINE_list("packages", list(corpus.DEFAULT_PACKAGES),
                              "Installed packages whose documented functions become prompts.")
_MIX = flags.DEFINE_string("mix", "", "Prompt kinds and weights, e.g. 'doctest=0.4,docstring=0.3,"
                           "instruction=0.3' (corpus.PROMPT_KINDS); empty: every docstring prompt as "
                           "found, no instructions.")
_DRAFT = _io.define_draft_flag("", "Continue the prompts with greedy BASS and this draft side "
                                "(lossless: the target's greedy tokens up to float near-ties) instead "
                                "of regular decoding; empty: regular decoding. The draft side is")
_K = flags.DEFINE_integer("k", 16, "Top-k log-probabilities kept per position (--labels=topk).")
_HIDDEN = flags.DEFINE_list("hidden_layers", [], "With --labels=features: also store these decoder "
                            "layers' outputs (0-based) as `hidden`, for an EAGLE-3 draft.")
_RELABEL = flags.DEFINE_string("relabel_from", None, "Label the windows of this corpus again (its "
                               "tokens, masks, prompt lengths) instead of building new ones.")
_HELD_OUT = flags.DEFINE_float("held_out_fraction", corpus.HELD_OUT_FRACTION,
                                "Share of stdlib files held out for eval.")
_PROMPTS = flags.DEFINE_integer("max_prompts", 4096, "Train prompts the target continues (0 = all).")
_EVAL_PROMPTS = flags.DEFINE_integer("max_eval_prompts", 256, "Held-out prompts continued.")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 160, "Longer prompts are skipped (counted).")
_NEW = flags.DEFINE_integer("max_new_tokens", 96, "Tokens the target adds to each prompt.")
_SOURCE_WINDOWS = flags.DEFINE_integer("max_source_windows", 3072,
                                       "Windows of real stdlib source (0 = all).")
_SHARD = flags.DEFINE_integer("shard_size", 256, "Examples per shard.")
_GEN_BATCH = flags.DEFINE_integer("generate_batch", 32, "Rows per generate call.")
_LABEL_BATCH = flags.DEFINE_integer("label_batch", 8, "Rows per labelling forward.")
_SEED = flags.DEFINE_integer("seed", 0, "Shuffle seed.")


def _label(target, tokens, mask):
  if _LABELS.value == "none":
    return dict(tokens=tokens, mask=mask)
  if _LABELS.value == "features":
    hidden_layers = tuple(int(i) for i in _HIDDEN.value)
    labels = corpus.label_features(target, tokens, batch_size=_LABEL_BATCH.value,
                                   hidden_layers=hidden_layers, lengths=corpus.row_lengths(mask))
    arrays = dict(tokens=tokens, mask=mask, features=labels[0])
    if hidden_layers:
      arrays["hidden"] = labels[1]
    return arrays
  ids, logprobs = zip(*corpus.label_topk(target, tokens, k=_K.value, batch_size=_LABEL_BATCH.value))
  return dict(tokens=tokens, mask=mask, topk_ids=np.concatenate(ids),
              topk_logprobs=np.concatenate(logprobs))


def _continue(target, draft, prompts):
  """Greedy target continuations, prompts batched by length; returns prompt + continuation per prompt."""
  order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
  out = [None] * len(prompts)
  for start in range(0, len(order), _GEN_BATCH.value):
    idx = order[start:start + _GEN_BATCH.value]
    result = bass_jax.generate(target, draft, [prompts[i] for i in idx],
                               method="regular" if draft is None else "bass",
                               max_new_tokens=_NEW.value)
    for i, seq in zip(idx, result.sequences()):
      out[i] = list(prompts[i]) + seq
  return out


def _mix_weights() -> dict[str, float]:
  """``--mix`` as ``{kind: weight}`` ({} without a mix).

  Raises:
    app.UsageError: not ``kind=weight,...`` with finite weights >= 0, an unknown kind, or all zero.
  """
  if not _MIX.value:
    return {}
  weights = {}
  for part in _MIX.value.split(","):
    kind, sep, weight = part.partition("=")
    try:
      value = float(weight)
    except ValueError:
      value = float("nan")
    if not sep or not math.isfinite(value) or value < 0 or kind.strip() not in corpus.PROMPT_KINDS:
      raise app.UsageError(f"--mix={_MIX.value}: give kind=weight pairs, weights finite and >= 0, "
                           f"kinds among {corpus.PROMPT_KINDS}, e.g. "
                           "doctest=0.4,docstring=0.3,instruction=0.3")
    weights[kind.strip()] = value
  if not sum(weights.values()) > 0:
    raise app.UsageError(f"--mix={_MIX.value}: the weights are all zero")
  return weights


def _choose_prompts(prompts, tok, rng, limit, weights):
  """The token ids of the prompts to continue, their kinds (indices into ``corpus.PROMPT_KINDS``) and
  the stage's counts: without a mix every docstring prompt in a shuffled order; with one, each
  kind's prompts (an instruction in the target's chat template for ``instruction``) drawn in the
  mix's proportions (``limit`` 0: as many as the prompts). Prompts longer than
  ``--max_prompt_tokens`` are skipped and counted per kind."""
  if not weights:
    rng.shuffle(prompts)
    ids = [tok(p.text).input_ids for p in prompts]
    fits = [(i, corpus.PROMPT_KINDS.index(corpus.prompt_kind(p))) for i, p in zip(ids, prompts)
            if 1 <= len(i) <= _MAX_PROMPT.value]
    too_long = len(ids) - len(fits)
    fits = fits[:limit or None]
    return [i for i, _ in fits], [k for _, k in fits], {"prompts_too_long": too_long}
  groups = {kind: [] for kind in corpus.PROMPT_KINDS}
  too_long = {kind: 0 for kind in corpus.PROMPT_KINDS}
  for prompt in prompts:
    texts = {corpus.prompt_kind(prompt): prompt.text}
    if weights.get("instruction") and (task := corpus.instruction(prompt)) is not None:
      texts["instruction"] = corpus.chat_prompt(tok, task)
    for kind, text in texts.items():
      if not weights.get(kind):
        continue
      ids = tok(text).input_ids
      if 1 <= len(ids) <= _MAX_PROMPT.value:
        groups[kind].append(ids)
      else:
        too_long[kind] += 1
  chosen, report = corpus.mix(groups, weights, limit or len(prompts), rng)
  return ([ids for _, ids in chosen], [corpus.PROMPT_KINDS.index(k) for k, _ in chosen],
          {"prompts_too_long": too_long, "mix": report})


def _check_order(out_dir: pathlib.Path, name: str, prompts: list[list[int]]) -> None:
  """Records a hash of the stage's prompts in order (``prompts_<name>.sha256``) and refuses to resume a
  build whose shards were made from another order (other flags, seed or package versions).

  Raises:
    app.UsageError: the stored hash differs.
  """
  digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()
  path = out_dir / f"prompts_{name}.sha256"
  if path.exists() and path.read_text().strip() != digest:
    raise app.UsageError(
        f"{out_dir} holds {name} shards made from another order of prompts (other flags, seed or "
        "package versions than manifest.json records): rebuild into a new --out_dir")
  path.write_text(digest + "\n")


def _relabel(target, source: pathlib.Path, out_dir: pathlib.Path) -> None:
  paths = sorted(p for p in source.glob("*_*_*.npz") if not p.name.endswith(".tmp.npz"))
  if not paths:
    raise app.UsageError(f"--relabel_from={source} holds no corpus shards")
  start = time.time()
  for path in tqdm.tqdm(paths, desc="relabel", unit="shard"):
    if (out_dir / path.name).exists():
      continue
    shard = np.load(path)
    kept = {k: shard[k] for k in ("prompt_lens", "prompt_kinds") if k in shard}
    corpus.save_shard(out_dir / path.name, **kept, **_label(target, shard["tokens"], shard["mask"]))
  manifest = {"target": _TARGET.value, "relabelled_from": str(source), "labels": _LABELS.value,
              "hidden_layers": [int(i) for i in _HIDDEN.value], "shards": len(paths),
              "seconds_this_run": round(time.time() - start)}
  (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
  logging.info("corpus: %s", json.dumps(manifest))


def main(argv):
  del argv
  _io.init_script()
  if _HIDDEN.value and _LABELS.value != "features":
    raise app.UsageError("--hidden_layers needs --labels=features")
  out_dir = pathlib.Path(_OUT.value)
  if _RELABEL.value and pathlib.Path(_RELABEL.value).resolve() == out_dir.resolve():
    raise app.UsageError("--relabel_from and --out_dir must differ (shards are written beside)")
  unknown = set(_SOURCES.value) - {"stdlib", "packages"}
  if unknown or not _SOURCES.value:
    raise app.UsageError(f"--prompt_sources={','.join(_SOURCES.value)}: choose 'stdlib' and/or "
                         f"'packages' ({sorted(unknown)} unknown)")
  weights = _mix_weights()  # before the model loads: a bad flag fails in a moment
  out_dir.mkdir(parents=True, exist_ok=True)
  target = bass_jax.load_model(_TARGET.value)
  if _RELABEL.value:
    _relabel(target, pathlib.Path(_RELABEL.value), out_dir)
    return
  tok = target.tokenizer
  eos = target.config.eos_token_id
  eos = eos[0] if isinstance(eos, tuple) else eos
  draft = bass_jax.load_draft_spec(_DRAFT.value, target) if _DRAFT.value else None
  files = corpus.stdlib_files()
  split = {name: [f for f in files if corpus.is_held_out(f, _HELD_OUT.value) == (name == "eval")]
           for name in ("train", "eval")}
  prompt_files = ((files if "stdlib" in _SOURCES.value else [])
                  + (corpus.package_files(_PACKAGES.value) if "packages" in _SOURCES.value else []))
  prompt_split = {name: [f for f in prompt_files
                         if corpus.is_held_out(f, _HELD_OUT.value) == (name == "eval")]
                  for name in ("train", "eval")}
  manifest = {"target": _TARGET.value, "window": _WINDOW.value, "labels": _LABELS.value, "k": _K.value,
              "hidden_layers": [int(i) for i in _HIDDEN.value],
              "held_out_fraction": _HELD_OUT.value, "max_new_tokens": _NEW.value,
              "prompt_sources": _SOURCES.value, "mix": _MIX.value, "draft": _DRAFT.value or None,
              "packages": (corpus.package_versions(_PACKAGES.value)
                           if "packages" in _SOURCES.value else {}),
              "files": {k: len(v) for k, v in split.items()},
              "prompt_files": {k: len(v) for k, v in prompt_split.items()}, "stages": {}}
  reference = corpus.humaneval_reference(load_problems("humaneval"))

  # Held out first: a build cut short can already be evaluated on.
  for name, limit in (("eval", _EVAL_PROMPTS.value), ("train", _PROMPTS.value)):
    start = time.time()
    prompts, dropped = corpus.drop_humaneval_overlap(corpus.docstring_prompts(prompt_split[name]),
                                                      reference)
    # Each stage its own generator: a stage's order depends on its own inputs only.
    kept, kinds, stage = _choose_prompts(prompts, tok, random.Random(f"{_SEED.value}:gen_{name}"),
                                         limit, weights)
    _check_order(out_dir, f"gen_{name}", kept)
    shards = range(0, len(kept), _SHARD.value)
    for n, s in enumerate(tqdm.tqdm(shards, desc=f"continuations/{name}", unit="shard")):
      path = out_dir / f"gen_{name}_{n:04d}.npz"
      if path.exists():
        continue
      seqs = _continue(target, draft, kept[s:s + _SHARD.value])
      tokens, mask = corpus.pack(seqs, window=_WINDOW.value, pad_id=eos)
      prompt_lens = np.array([len(p) for p in kept[s:s + _SHARD.value]], np.int32)
      prompt_kinds = np.array(kinds[s:s + _SHARD.value], np.int8)
      corpus.save_shard(path, compress=_LABELS.value == "none", prompt_lens=prompt_lens,
                        prompt_kinds=prompt_kinds, **_label(target, tokens, mask))
    manifest["stages"][f"continuations/{name}"] = {
        "prompts_found": len(prompts) + len(dropped), "dropped_overlapping_humaneval": len(dropped),
        **stage, "prompts_used": len(kept), "seconds_this_run": round(time.time() - start)}

  for name, limit in (("train", _SOURCE_WINDOWS.value), ("eval", _SOURCE_WINDOWS.value // 16)):
    start = time.time()
    files_shuffled = list(split[name])
    random.Random(f"{_SEED.value}:src_{name}").shuffle(files_shuffled)
    windows = corpus.source_windows(files_shuffled, tok, window=_WINDOW.value, eos_id=eos)
    windows = windows[:limit or None]
    for n, s in enumerate(tqdm.tqdm(range(0, len(windows), _SHARD.value), desc=f"source/{name}",
                                    unit="shard")):
      path = out_dir / f"src_{name}_{n:04d}.npz"
      if path.exists():
        continue
      chunk = windows[s:s + _SHARD.value]
      mask = np.ones_like(chunk, bool)
      mask[:, -1] = False  # the last position's next token is in the next window
      corpus.save_shard(path, **_label(target, chunk, mask))
    manifest["stages"][f"source/{name}"] = {"windows_used": len(windows),
                                            "seconds_this_run": round(time.time() - start)}

  for kind in ("gen", "src"):
    for name in ("train", "eval"):
      paths = sorted(p for p in out_dir.glob(f"{kind}_{name}_*.npz") if not p.name.endswith(".tmp.npz"))
      masks = [np.load(p)["mask"] for p in paths]
      manifest[f"{kind}_{name}"] = {"shards": len(paths), "examples": int(sum(len(m) for m in masks)),
                                    "labelled_tokens": int(sum(m.sum() for m in masks))}
  (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
  logging.info("corpus: %s", json.dumps(manifest))


if __name__ == "__main__":
  _io.run(main)
