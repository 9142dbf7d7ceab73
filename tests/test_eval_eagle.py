"""experiments.eval_eagle, run as a user runs it: exported EAGLE drafts evaluated on a corpus's held-out
feature shards, each at its own V' or at one given for all, with the numbers the library's own
evaluation gives for the same draft, vocabulary and windows; bad requests named before any work."""

import json
import os
import pathlib
import subprocess

import jax
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import eagle_files
from bass_jax.models import eagle, eagle_init
from bass_jax.training import corpus, feature_draft
from conftest import PYTHON, shared_jax_cache, tiny_model

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("eval_eagle")
  # The scripts' runs share JAX's persistent cache: train_eagle's two runs compile the same steps.
  ENV.update(shared_jax_cache(root / "xla"))
  target = tiny_model(seed=5)
  bj.save_model(target, root / "target")
  target = bj.load_model(root / "target", tokenizer=False)  # what the script reads: the saved weights
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40)
  order = np.random.default_rng(0).permutation(61).astype(np.int32)
  eagle_files.save_eagle(root / "draft", config, eagle_init.init_draft_params(config, jax.random.key(2)), order)
  rng = np.random.default_rng(1)
  tokens, mask = corpus.pack([rng.integers(1, 61, size=n).tolist() for n in (24, 9, 17, 2, 24, 13)],
                             window=24, pad_id=0)
  features, hidden = corpus.label_features(target, tokens, batch_size=4, hidden_layers=(0, 1),
                                           lengths=corpus.row_lengths(mask))
  corpus.save_shard(root / "corpus" / "gen_eval_0000.npz", tokens=tokens, mask=mask, features=features,
                    hidden=hidden, prompt_kinds=np.array([0, 1, 2, 0, 1, 2], np.int8))
  (root / "corpus" / "manifest.json").write_text(json.dumps({"hidden_layers": [0, 1]}))
  # An EAGLE-3 draft over both layers, exported as train_eagle --export_layout=speculators writes it.
  layer = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40).layer
  config3 = eagle.EagleConfig(layer, 40, kind="eagle3", fc_bias=False, taps=(0, 1))
  params3 = feature_draft.initial_params(config3, jax.random.key(4), target.config, target.params, order)
  bj.save_model(bj.Model(config3, {"draft": params3, "vocab_ids": order[:40]}, name="eagle3"),
                root / "eagle3", format="speculators")
  return root, target


def _run(root, *flags):
  return subprocess.run([PYTHON, "-m", "experiments.eval_eagle", f"--target={root / 'target'}",
                         f"--corpus={root / 'corpus'}", *flags], cwd=REPO, env=ENV,
                        capture_output=True, text=True, timeout=300, check=False)


def _reference(target, path, vocab_size, data):
  config, params = eagle_files.load_eagle(path)
  config = config.with_draft_vocab_size(vocab_size)
  order = eagle_files.load_vocab_order(path)
  frozen, head = feature_draft.frozen_inputs(config, target.config, target.params, order, "float32")
  return feature_draft.evaluate(params["draft"], data, config, frozen, head, "float32")


@pytest.fixture(scope="module")
def both_drafts(setup):
  """One run over both drafts at their own V' (the plain EAGLE draft and the EAGLE-3 export), as a
  user compares drafts in one table: ``(stdout, {name: row})``."""
  root, _ = setup
  done = _run(root, f"--drafts={root / 'draft'},{root / 'eagle3'}", "--names=tiny,e3",
              f"--results_dir={root / 'own'}")
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout, json.loads((root / "own" / "eval_eagle.json").read_text())["drafts"]


def test_each_draft_at_its_own_and_at_a_given_vocabulary_equals_the_librarys_evaluation(setup,
                                                                                       both_drafts):
  root, target = setup
  data = corpus.load_shards([root / "corpus" / "gen_eval_0000.npz"])
  given = _run(root, f"--drafts={root / 'draft'}", "--names=tiny", f"--results_dir={root / '61'}",
               "--draft_vocab_size=61")
  assert given.returncode == 0, given.stderr[-2000:]
  runs = {40: (both_drafts[0], both_drafts[1]["tiny"]),
          61: (given.stdout, json.loads((root / "61" / "eval_eagle.json").read_text())["drafts"]["tiny"])}
  for vocab_size, (stdout, row) in runs.items():
    assert row["draft_vocab_size"] == vocab_size
    reference = _reference(target, root / "draft", vocab_size, data)
    for key in ("eval_agreement", "eval_agreement_doctest", "eval_mean_accepted_length"):
      assert row[key] == pytest.approx(float(reference[key]), abs=1e-9), key
    assert f"| tiny | {vocab_size} |" in stdout


def test_an_eagle3_export_in_the_speculators_layout_is_evaluated_as_the_library_does(setup,
                                                                                     both_drafts):
  """A published-layout draft (train_eagle --architecture=eagle3 --export_layout=speculators) reads the
  corpus's tapped hidden states; its V' target ids are its whole stored vocabulary."""
  root, target = setup
  data = corpus.load_shards([root / "corpus" / "gen_eval_0000.npz"])
  stdout, rows = both_drafts
  row = rows["e3"]
  assert "| e3 | 40 |" in stdout
  config, params = eagle_formats.load_published(root / "eagle3")
  frozen, head = feature_draft.frozen_inputs(config, target.config, target.params,
                                             np.asarray(params["vocab_ids"]), "float32")
  reference = feature_draft.evaluate(params["draft"], data, config, frozen, head, "float32")
  assert row["draft_vocab_size"] == 40
  # The cross-entropy is a continuous function of every weight, the tapped states and the d2t ids; an
  # EAGLE-3 draft's loss is the token loss alone.
  assert row["eval_cross_entropy"] == pytest.approx(float(reference["eval_cross_entropy"]), rel=1e-6)
  assert row["eval_loss"] == pytest.approx(row["eval_cross_entropy"], rel=1e-9)
  for key in ("eval_agreement", "eval_agreement_d2", "eval_mean_accepted_length"):
    assert row[key] == pytest.approx(float(reference[key]), abs=1e-9), key
  # Another V' for a published-layout draft is refused, and before the draft listed first (which
  # would take V' = 20) is evaluated: no row is logged.
  other = _run(root, f"--drafts={root / 'draft'},{root / 'eagle3'}", "--names=tiny,e3",
               "--draft_vocab_size=20", f"--results_dir={root / 'e3other'}")
  assert other.returncode == 2 and "published-layout draft, evaluated at its own V' = 40" in other.stderr
  assert "tiny: {" not in other.stderr, other.stderr[-2000:]
  wrong_taps = root / "corpus_layer1"
  wrong_taps.mkdir()
  (wrong_taps / "gen_eval_0000.npz").symlink_to(root / "corpus" / "gen_eval_0000.npz")
  (wrong_taps / "manifest.json").write_text(json.dumps({"hidden_layers": [1]}))
  done = _run(root, f"--drafts={root / 'eagle3'}", "--names=e3", f"--corpus={wrong_taps}",
              f"--results_dir={root / 'e3taps'}")
  assert done.returncode == 2 and "reads target layers [0, 1] but" in done.stderr, done.stderr[-800:]


def test_train_eagle_trains_eagle3_on_continuations_alone_and_eval_eagle_reads_its_export(setup):
  """train_eagle as a user runs it: an EAGLE-3 draft on a corpus of continuations and source windows
  (only the continuations carry prompt kinds) or of continuations alone (a corpus relabelled from token
  ids), exported in the speculators layout, which eval_eagle then evaluates; bad taps and a corpus
  without the tapped states are named before training."""
  root, _ = setup
  held_out = root / "corpus" / "gen_eval_0000.npz"
  shard = dict(np.load(held_out))
  both, alone, untapped = root / "train_both", root / "train_alone", root / "train_untapped"
  for directory in (both, alone, untapped):
    directory.mkdir()
    (directory / "gen_eval_0000.npz").symlink_to(held_out)
    (directory / "manifest.json").write_text(json.dumps({"hidden_layers": [0, 1]}))
  corpus.save_shard(both / "gen_train_0000.npz", **shard)
  corpus.save_shard(both / "src_train_0000.npz", **{k: v for k, v in shard.items() if k != "prompt_kinds"})
  corpus.save_shard(alone / "gen_train_0000.npz", **shard)
  corpus.save_shard(untapped / "gen_train_0000.npz", **{k: v for k, v in shard.items() if k != "hidden"})

  def train(corpus_dir, workdir, *extra):
    return subprocess.run(
        [PYTHON, "-m", "experiments.train_eagle", f"--target={root / 'target'}",
         f"--corpus={corpus_dir}", f"--workdir={workdir}", "--architecture=eagle3", "--taps=0,1",
         "--draft_vocab_size=40", "--cls_weight=1.0", "--ttt_depth=2", "--steps=2", "--batch_size=2",
         "--warmup_steps=1", "--eval_every=2", "--checkpoint_every=2", "--export_layout=speculators",
         *extra], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False)

  for corpus_dir in (both, alone):
    done = train(corpus_dir, root / f"run_{corpus_dir.name}")
    assert done.returncode == 0, done.stderr[-2000:]
    windows = 12 if corpus_dir == both else 6
    assert f"train: {windows} windows" in done.stderr
  metrics = [json.loads(line) for line in (root / "run_train_alone" / "metrics.jsonl").read_text().splitlines()]
  assert "eval_agreement_d2" in metrics[-1] and "eval_agreement_doctest" in metrics[-1]
  export = bj.load_model(root / "run_train_alone" / "export")
  assert export.config.kind == "eagle3" and export.config.taps == (0, 1)
  done = _run(root, f"--drafts={root / 'run_train_alone' / 'export'}", "--names=trained",
              f"--results_dir={root / 'trained'}")
  assert done.returncode == 0, done.stderr[-2000:]
  row = json.loads((root / "trained" / "eval_eagle.json").read_text())["drafts"]["trained"]
  # The export is bfloat16; training evaluated the float32 weights: close, not equal.
  assert row["eval_cross_entropy"] == pytest.approx(metrics[-1]["eval_cross_entropy"], rel=0.05)
  for extra, corpus_dir, message in (((), untapped, "holds no hidden"),
                                     (("--taps=1,0",), alone, "ascending order")):
    done = train(corpus_dir, root / "refused", *extra)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("flags, message", [
    (("--drafts=DRAFT,DRAFT", "--names=a,a"), "one distinct name per draft"),
    (("--drafts=DRAFT", "--draft_vocab_size=62"), "exceeds tiny's stored vocabulary of 61"),
    (("--drafts=/nonexistent",), "no exported EAGLE draft"),
])
def test_bad_requests_are_named(setup, flags, message):
  root, _ = setup
  flags = [f.replace("DRAFT", str(root / "draft")) for f in flags]
  if not any(f.startswith("--names") for f in flags):
    flags.append("--names=tiny")
  done = _run(root, *flags, f"--results_dir={root / 'bad'}")
  assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
