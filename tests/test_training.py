"""Draft distillation: the loss, the data order, resuming after kill -9, and the simulated acceptance."""

import os
import pathlib
import subprocess
import textwrap

import jax
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.training import distill
from conftest import PYTHON, right_padded, shared_jax_cache, tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _random_corpus(seed, n=48, window=24, k=6, vocab=61):
  rng = np.random.default_rng(seed)
  return dict(tokens=rng.integers(0, vocab, (n, window)).astype(np.int32),
              mask=rng.random((n, window)) < 0.9,
              topk_ids=rng.integers(0, vocab, (n, window, k)).astype(np.int32),
              topk_logprobs=(rng.normal(size=(n, window, k)) * 2).astype(np.float16))


def test_loss_is_cross_entropy_from_the_renormalized_top_k():
  model = tiny_model(seed=2, scale=2.0, tie_word_embeddings=True)
  data = _random_corpus(0, n=3)
  loss, metrics = distill.distill_loss(model.params, {k: jax.numpy.asarray(v) for k, v in data.items()},
                                       model.config, "float32")
  logits = np.asarray(model.logits(data["tokens"]), np.float64)
  log_q = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  lp = data["topk_logprobs"].astype(np.float64)
  p = np.exp(lp) / np.exp(lp).sum(-1, keepdims=True)
  ce = -(p * np.take_along_axis(log_q, data["topk_ids"], -1)).sum(-1)
  want = (ce * data["mask"]).sum() / data["mask"].sum()
  assert float(loss) == pytest.approx(want, rel=1e-5)
  agree = (logits.argmax(-1) == data["topk_ids"][..., 0])
  assert float(metrics["agreement"]) == pytest.approx((agree * data["mask"]).sum() / data["mask"].sum())


def test_batch_order_is_a_function_of_the_step():
  epoch = [distill.batch_indices(50, 8, s, seed=3) for s in range(6)]  # 6 batches per epoch
  flat = np.concatenate(epoch)
  assert len(set(flat)) == 48  # no repeats within an epoch
  assert all(np.array_equal(distill.batch_indices(50, 8, s, seed=3), epoch[s]) for s in range(6))
  assert not np.array_equal(distill.batch_indices(50, 8, 6, seed=3), epoch[0])  # next epoch reshuffles
  with pytest.raises(ValueError, match="fewer"):
    distill.batch_indices(5, 8, 0, seed=0)


def test_training_learns_a_learnable_teacher(tmp_path):
  """A teacher that always predicts token + 1: the draft must reach near-perfect agreement."""
  vocab, n, window = 37, 64, 16
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab, (n, window)).astype(np.int32)
  data = dict(tokens=tokens, mask=np.ones((n, window), bool),
              topk_ids=np.stack([(tokens + j) % vocab for j in (1, 2)], -1).astype(np.int32),
              topk_logprobs=np.tile(np.array([0.0, -6.0], np.float16), (n, window, 1)))
  config = bj.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                          tie_word_embeddings=True)
  cfg = distill.TrainConfig(steps=150, batch_size=16, peak_lr=1e-2, warmup_steps=10,
                            checkpoint_every=1000, eval_every=150, log_every=50)
  params = distill.train(config, cfg, data, tmp_path, eval_data=data, progress=False)
  records = list(distill.iter_records(tmp_path / "metrics.jsonl"))
  assert records[-1]["eval_agreement"] > 0.95
  assert records[-1]["loss"] < 0.1  # from about ln(37) = 3.6 at initialization
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      bj.init_params(config, jax.random.key(0)))


def _train(workdir, on_step=None):
  """The run the kill test repeats: 24 steps, a checkpoint every 5, a loss logged every step."""
  config = bj.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                          tie_word_embeddings=True)
  cfg = distill.TrainConfig(steps=24, batch_size=8, peak_lr=3e-3, warmup_steps=4,
                            checkpoint_every=5, eval_every=100, log_every=1)
  distill.train(config, cfg, _random_corpus(1), workdir, progress=False, on_step=on_step)


_RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from test_training import _train
    kill_at = int(os.environ.get("KILL_AT", "0"))
    def on_step(step):
      if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    _train(sys.argv[1], on_step=on_step)
""")


def _run(workdir, kill_at=0):
  # The killed and the resumed child share JAX's persistent cache (beside the workdir): the resumed
  # one loads the training step the killed one compiled.
  env = dict(os.environ, KILL_AT=str(kill_at),
             **shared_jax_cache(pathlib.Path(workdir).parent / "xla"))
  return subprocess.run([PYTHON, "-c", _RUN.format(tests=os.path.join(REPO, "tests")),
                         str(workdir)], env=env, capture_output=True, text=True, timeout=600,
                        cwd=REPO)


def test_a_killed_run_resumes_on_the_same_loss_curve(tmp_path):
  _train(tmp_path / "straight")  # uninterrupted, in this process (one child's imports fewer)
  killed = _run(tmp_path / "killed", kill_at=13)
  assert killed.returncode == -9  # SIGKILL: no chance to clean up
  resumed = _run(tmp_path / "killed")
  assert resumed.returncode == 0, resumed.stderr[-2000:]

  want = {r["step"]: r for r in distill.iter_records(tmp_path / "straight" / "metrics.jsonl")}
  got = {r["step"]: r for r in distill.iter_records(tmp_path / "killed" / "metrics.jsonl")}
  resumed_from = [r["resumed_from"] for r in got.values() if "resumed_from" in r]
  assert resumed_from and 5 <= resumed_from[0] <= 13  # from a checkpoint, not from scratch
  assert sorted(want) == sorted(got) == list(range(1, 25))
  for step in want:
    assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), step


def test_simulated_steps_on_a_hand_made_sequence():
  agree = np.array([1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1], bool)
  # 3 drafts per step from position 0: accept 2 (position 2 disagrees), the next step starts at 3 and
  # accepts all 3, the next at 7 accepts 1; a step at 9 would need drafts up to 12 >= end: not whole.
  assert distill.simulate_greedy_steps(agree, 0, len(agree), 3) == [2, 3, 1]
  mean, rate = distill.simulated_greedy_acceptance(agree[None].astype(int), np.ones((1, 12), int),
                                                   np.array([0]), np.array([12]), 3)
  assert mean == pytest.approx((6 + 3) / 3) and rate == pytest.approx(6 / 9)


def test_simulation_reproduces_real_greedy_bass():
  """The teacher-forced simulation predicts the accepted counts of an actual greedy BASS run."""
  target = tiny_model(seed=0, scale=2.5)
  leaves, treedef = jax.tree_util.tree_flatten(target.params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  noisy = [x + 0.4 * jax.numpy.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  draft = bj.Model(target.config, jax.tree_util.tree_unflatten(treedef, noisy))
  prompts = [np.random.default_rng(i).integers(0, 61, n).tolist() for i, n in enumerate((4, 9, 15))]
  draft_len, new = 3, 40
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=new)
  bass = bj.generate(target, draft, prompts, method="bass", max_new_tokens=new, draft_len=draft_len)
  # Both models' logits over the three sequences padded to the longest, in one program each: a
  # position's logits depend only on the tokens up to it.
  seqs = [prompt + cont for prompt, cont in zip(prompts, regular.sequences())]
  padded = right_padded(seqs)
  agrees = np.asarray(draft.logits(padded)).argmax(-1) == np.asarray(target.logits(padded)).argmax(-1)
  for row, (prompt, seq) in enumerate(zip(prompts, seqs)):
    agree = agrees[row, :len(seq)]
    simulated = distill.simulate_greedy_steps(agree, len(prompt) - 1, len(seq) - 1, draft_len)
    real = bass.stats.accepted[:, row]
    assert len(simulated) >= 5
    assert real[:len(simulated)].tolist() == simulated, row
  assert (bass.stats.accepted > 0).any() and (bass.stats.accepted < draft_len).any()


def test_train_config_validates():
  with pytest.raises(ValueError, match="steps"):
    distill.TrainConfig(steps=0)
  with pytest.raises(ValueError, match="compute_dtype"):
    distill.TrainConfig(steps=1, compute_dtype="float16")
