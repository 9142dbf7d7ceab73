"""The EAGLE feature draft (bass_jax.models.eagle) as a proposer, its files, and its training.

The draft's cached forward is checked against its own full causal forward (NaN-filled cache padding);
its proposals inside the jitted loop against a from-scratch reference that recomputes the target's
features and the draft's autoregressive drafts with full forwards at every step; its catch-up after a
long lag against a fresh prefill; greedy BASS with it against regular decoding (tiny target here, the
real SmolLM2 target with the shipped draft in test_shipped_draft.py). Sampling exactness is in
test_sampling_exact.py.
"""

import functools
import pathlib
import subprocess

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import bass_jax as bj
from bass_jax.checkpoints import eagle_files
from bass_jax.models import common, eagle, eagle_init
from bass_jax.sampling import proposers
from bass_jax.training import distill, feature_draft
from conftest import PYTHON, tiny_model

DRAFT_VOCAB = 48  # of the tiny target's 61 tokens


def _vocab_ids(vocab=61, seed=0):
  return jnp.asarray(np.random.default_rng(seed).permutation(vocab).astype(np.int32))


def _random_draft(target, seed=1, draft_vocab=DRAFT_VOCAB):
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=draft_vocab)
  params = eagle_init.init_draft_params(config, jax.random.key(seed))
  return bj.Model(config, {"draft": params, "vocab_ids": _vocab_ids()[:draft_vocab]}, name="eagle")


def _correlated_draft(target, feature_weight=0.3, draft_vocab=DRAFT_VOCAB, num_layers=1):
  """A draft that predicts a 1-layer target well: its layer is the target's, and ``fc`` passes the
  token's embedding plus ``feature_weight`` times the feature, so it is accepted often but not always,
  and what it drafts depends on the features it is given. A second layer is random, its output
  projections scaled down: it changes the predictions, not so much that nothing is accepted."""
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=draft_vocab,
                                        num_layers=num_layers)
  e = config.feature_size
  kernel = jnp.concatenate([jnp.eye(e), feature_weight * jnp.eye(e)], axis=0)
  params = {"fc": {"kernel": kernel, "bias": jnp.zeros((e,))},
            "layers_0": target.params["layers_0"]}
  if num_layers == 2:
    layer = eagle_init.init_draft_params(config, jax.random.key(7))["layers_1"]
    params["layers_1"] = jax.tree_util.tree_map_with_path(
        lambda path, x: 0.3 * x if "o_proj" in str(path) or "down_proj" in str(path) else x, layer)
  return bj.Model(config, {"draft": params, "vocab_ids": _vocab_ids()[:draft_vocab]}, name="eagle")


def _bound(target, draft):
  return eagle.bind(draft.params["draft"], draft.params["vocab_ids"], target.config, target.params,
                    draft.config.draft_vocab_size)


def _target_features(target, text):
  _, _, features = common.forward(target.config, target.params, jnp.asarray([text]),
                                  return_features=True)
  return features[0]


def test_cached_forward_equals_the_full_forward():
  """Pairs fed in two ragged pieces through a NaN-padded cache give the full forward's outputs."""
  target = tiny_model(0)
  draft = _random_draft(target)
  params = _bound(target, draft)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 61, (2, 9)), jnp.int32)
  features = jnp.asarray(rng.normal(size=(2, 9, 32)), jnp.float32)
  full, _ = eagle.forward(draft.config, params, tokens, features)
  cache = draft.config.init_cache(2, 32, fill_value=float("nan"))
  first = [4, 6]
  _, update = eagle.forward(draft.config, params, tokens[:, :6], features[:, :6])
  cache = cache.append(update).with_lengths(jnp.asarray(first))
  for row, n in enumerate(first):
    rest_tokens = jnp.asarray(tokens[row:row + 1, n:])
    rest_features = features[row:row + 1, n:]
    row_cache = bj.KVCache(k=tuple(k[row:row + 1] for k in cache.k),
                           v=tuple(v[row:row + 1] for v in cache.v), lengths=cache.lengths[row:row + 1])
    out, row_cache = eagle.forward(draft.config, params, rest_tokens, rest_features, row_cache)
    np.testing.assert_allclose(out[0], full[row, n:], atol=2e-5, rtol=2e-5)
    assert int(row_cache.lengths[0]) == 9


def _reference_steps(target, draft, texts, prompt_lens, draft_len):
  """Greedy BASS's accepted drafts per step along each of ``texts`` (the target's greedy outputs),
  recomputed from scratch: at each step the target's features of the text so far, the draft's full
  forward over the pairs, then ``draft_len`` autoregressive drafts on its own features. Only steps
  whose drafts all lie inside the text are returned, one list per text.

  Texts and pairs are zero-padded to one width: both forwards are causal, so the padding changes
  nothing before it (the features of a text's first c tokens are those of the text so far), and one
  program of each runs every row and step."""
  params = _bound(target, draft)
  width = max(map(len, texts)) + draft_len
  padded = np.zeros((len(texts), width), np.int32)
  for row, text in enumerate(texts):
    padded[row, :len(text)] = text
  _, _, features = jax.jit(lambda p, t: common.forward(target.config, p, t, return_features=True))(
      target.params, jnp.asarray(padded))
  features = np.asarray(features)

  @jax.jit
  def predict(params, tokens, pair_features, last):  # the draft at pair `last`, its greedy token
    out, _ = eagle.forward(draft.config, params, tokens[None], pair_features[None])
    predicted = out[0, last]
    return predicted, params["vocab_ids"][jnp.argmax(eagle.draft_logits(params, predicted))]

  all_steps = []
  for text, prompt_len, text_features in zip(texts, prompt_lens, features):
    steps, c = [], prompt_len
    while c + draft_len < len(text):
      pair_tokens = np.zeros(width, np.int32)
      pair_tokens[:c - 1] = text[1:c]
      pair_features = np.zeros((width, features.shape[-1]), np.float32)
      pair_features[:c - 1] = text_features[:c - 1]
      drafts = []
      for k in range(draft_len):
        last = c - 2 + k  # the pair whose output predicts the next draft
        predicted, token = predict(params, jnp.asarray(pair_tokens), jnp.asarray(pair_features),
                                   jnp.int32(last))
        drafts.append(int(token))
        pair_tokens[last + 1] = int(token)
        pair_features[last + 1] = np.asarray(predicted)
      accepted = 0
      while accepted < draft_len and drafts[accepted] == text[c + accepted]:
        accepted += 1
      steps.append(accepted)
      c += accepted + 1
    all_steps.append(steps)
  return all_steps


@pytest.mark.parametrize("num_layers", [1, 2])
def test_proposals_in_the_loop_equal_a_from_scratch_reference(num_layers):
  """Every step's accepted count, per row of a ragged batch, equals the reference's: the feature
  buffer, the catch-up, the autoregressive drafts and the rollback all line up, for a one-layer
  draft (EAGLE's) and a deeper one (each layer its own ragged cache)."""
  target = tiny_model(0, num_hidden_layers=1, scale=2.0)
  draft = _correlated_draft(target, num_layers=num_layers)
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 61, n).tolist() for n in (2, 9, 5)]
  draft_len = 3
  out = bj.generate(target, draft, prompts, max_new_tokens=24, draft_len=draft_len, eos_token_id=())
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=24, eos_token_id=())
  np.testing.assert_array_equal(out.tokens, regular.tokens)
  texts = [prompt + seq for prompt, seq in zip(prompts, out.sequences())]
  total = 0
  for row, want in enumerate(_reference_steps(target, draft, texts, list(map(len, prompts)),
                                              draft_len)):
    got = out.stats.accepted[:, row]
    np.testing.assert_array_equal(got[:len(want)], want)
    total += sum(want)
  assert 0 < total < draft_len * out.stats.steps * len(prompts)  # accepted often, not always


def test_catch_up_after_a_long_lag_equals_a_fresh_prefill():
  """After plain steps the draft lags by many pairs; one propose brings its cache to a fresh prefill's
  over the whole text, and its first draft is the full forward's."""
  target = tiny_model(2)
  draft = _random_draft(target)
  params = _bound(target, draft)
  proposer = proposers.EagleProposer(draft.config, "float32")
  text = np.random.default_rng(2).integers(0, 61, 19).tolist()
  width = 32
  tokens = jnp.asarray([text + [0] * (width - len(text))], jnp.int32)
  features = _target_features(target, tokens[0].tolist())[None]
  state = proposer.init_state(params, tokens[:, :4], jnp.asarray([4]), cache_len=48, max_len=2,
                              features=features[:, :4])
  ctx = proposers.StepContext(tokens=tokens, seq_len=jnp.asarray([19]), live=jnp.asarray([True]),
                              draft_len=jnp.int32(1), key=jax.random.key(0),
                              temperature=jnp.float32(1), top_p=jnp.float32(1), features=features)
  state, proposal = jax.jit(lambda s: proposer.propose(params, s, ctx, max_len=2, chunk=2,
                                                       greedy=True))(state)
  fresh = proposer.init_state(params, tokens[:, :19], jnp.asarray([19]), cache_len=48, max_len=2,
                              features=features[:, :19])
  assert int(state.cache.lengths[0]) == 18
  for got, want in zip(state.cache.k + state.cache.v, fresh.cache.k + fresh.cache.v):
    np.testing.assert_allclose(got[0, :, :18], want[0, :, :18], atol=1e-5)
  out, _ = eagle.forward(draft.config, params, tokens[:, 1:19], features[:, :18])
  want = params["vocab_ids"][jnp.argmax(eagle.draft_logits(params, out[0, -1]))]
  assert int(proposal.drafts[0, 0]) == int(want)


@pytest.mark.parametrize("kind,draft_len", [("eagle", "dynamic"), ("hybrid", "goodput")])
def test_greedy_bass_with_an_eagle_draft_is_lossless(kind, draft_len):
  target = tiny_model(0, num_hidden_layers=1, scale=2.0)
  draft = _correlated_draft(target)
  side = draft if kind == "eagle" else bj.Hybrid(draft, bj.NGramProposer(max_n=3, min_n=1))
  if draft_len == "goodput":  # costs under which speculation pays, with plain steps possible
    draft_len = bj.GoodputDraftLen(max_len=4, costs=bj.StepCosts(1.0, 1.2, 0.01, 0.01, 4))
  prompts = [np.random.default_rng(i).integers(0, 61, n).tolist() for i, n in enumerate((7, 1, 12, 3))]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=30, eos_token_id=())
  bass = bj.generate(target, side, prompts, max_new_tokens=30, draft_len=draft_len, eos_token_id=())
  np.testing.assert_array_equal(bass.tokens, regular.tokens)
  assert (bass.stats.accepted > 0).any()


def test_files_round_trip_and_load_model_reads_them(tmp_path):
  target = tiny_model(0)
  draft = _random_draft(target)
  vocab = np.asarray(_vocab_ids())
  eagle_files.save_eagle(tmp_path / "d", draft.config, draft.params["draft"], vocab, dtype=np.float32)
  loaded = bj.load_model(tmp_path / "d")
  assert loaded.config == draft.config
  np.testing.assert_array_equal(loaded.params["vocab_ids"], vocab[:DRAFT_VOCAB])
  for a, b in zip(jax.tree_util.tree_leaves(loaded.params["draft"]),
                  jax.tree_util.tree_leaves(draft.params["draft"])):
    np.testing.assert_array_equal(a, b)
  smaller = draft.config.with_draft_vocab_size(8)
  eagle_files.save_eagle(tmp_path / "small", smaller, draft.params["draft"], vocab)
  assert bj.load_model(tmp_path / "small").params["vocab_ids"].tolist() == vocab[:8].tolist()


def _every_leaf_random(draft, seed):
  """``draft`` with every trained parameter redrawn (biases and norm scales start constant, so a swap
  of two of them would otherwise go unnoticed)."""
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype),
                                  draft.params["draft"])
  return bj.Model(draft.config, {**draft.params, "draft": params}, name=draft.name)


def _assert_same_draft(loaded, draft):
  """Config equal, every trained parameter bit-equal (and of the same dtype), vocab_ids equal."""
  assert loaded.config == draft.config
  assert loaded.params.keys() == draft.params.keys()
  want = flax.traverse_util.flatten_dict(draft.params["draft"], sep="/")
  got = flax.traverse_util.flatten_dict(loaded.params["draft"], sep="/")
  assert got.keys() == want.keys()
  for name, value in want.items():
    assert got[name].dtype == value.dtype, name
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(value), err_msg=name)
  assert loaded.params["vocab_ids"].dtype == jnp.int32
  np.testing.assert_array_equal(loaded.params["vocab_ids"], draft.params["vocab_ids"])


@pytest.mark.parametrize("fmt, files", [("safetensors", ["config.json", "model.safetensors"]),
                                        ("orbax", ["config.json", "params"])])
def test_save_model_writes_an_eagle_draft_that_loads_back_equal(tmp_path, fmt, files):
  target = tiny_model(0)
  seed = int(np.random.default_rng().integers(1 << 30))
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=DRAFT_VOCAB, num_layers=2,
                                        fused_layers=(1,))
  draft = _every_leaf_random(bj.Model(config, {
      "draft": eagle_init.init_draft_params(config, jax.random.key(seed)),
      "vocab_ids": _vocab_ids(seed=seed)[:DRAFT_VOCAB]}, name="eagle"), seed)
  bj.save_model(draft, tmp_path / "d", format=fmt)
  assert sorted(p.name for p in (tmp_path / "d").iterdir()) == files
  _assert_same_draft(bj.load_model(tmp_path / "d", dtype="float32"), draft)
  # The draft's own dtype is what is written (bf16 here), unless save_model is told another.
  half = bj.Model(config, {**draft.params, "draft": jax.tree_util.tree_map(
      lambda x: x.astype(jnp.bfloat16), draft.params["draft"])}, name="eagle")
  bj.save_model(half, tmp_path / "bf16", format=fmt)
  _assert_same_draft(bj.load_model(tmp_path / "bf16", dtype="bfloat16"), half)
  if fmt == "safetensors":
    stored = safetensors.numpy.load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert {str(v.dtype) for k, v in stored.items() if k != "vocab_ids"} == {"bfloat16"}
    bj.save_model(half, tmp_path / "f16", format=fmt, dtype="float16")
    stored = safetensors.numpy.load_file(str(tmp_path / "f16" / "model.safetensors"))
    assert {str(v.dtype) for k, v in stored.items() if k != "vocab_ids"} == {"float16"}
    assert stored["vocab_ids"].dtype == np.int32


def test_convert_script_converts_an_eagle_draft_both_ways(tmp_path):
  """experiments.convert: an EAGLE draft directory -> orbax -> safetensors, each loading back equal."""
  target = tiny_model(0)
  draft = _every_leaf_random(_random_draft(target, seed=3), int(np.random.default_rng().integers(1 << 30)))
  bj.save_model(draft, tmp_path / "src")
  repo = pathlib.Path(__file__).resolve().parents[1]
  for src, dst, fmt in (("src", "orbax", "orbax"), ("orbax", "st", "safetensors")):
    result = subprocess.run([PYTHON, "-m", "experiments.convert", f"--from={tmp_path / src}",
                             f"--to={tmp_path / dst}", f"--format={fmt}"], cwd=repo,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same_draft(bj.load_model(tmp_path / dst, dtype="float32"), draft)
  assert (tmp_path / "orbax" / "params").is_dir() and (tmp_path / "st" / "model.safetensors").is_file()


@pytest.mark.parametrize("damage", ["truncated", "header-only"])
def test_a_damaged_draft_file_is_named(tmp_path, damage):
  target = tiny_model(0)
  draft = _random_draft(target)
  bj.save_model(draft, tmp_path / "d")
  file = tmp_path / "d" / "model.safetensors"
  data = file.read_bytes()
  cut = int(np.random.default_rng().integers(9, len(data) - 1)) if damage == "truncated" else 8
  file.write_bytes(data[:cut])
  for read in (bj.load_model, eagle_files.load_vocab_order):
    with pytest.raises(ValueError) as error:
      read(tmp_path / "d")
    message = str(error.value)
    assert "\n" not in message and str(file) in message, message
    assert "damaged or truncated" in message and "re-save" in message, message


def test_bad_input_is_named(tmp_path):
  target = tiny_model(0)
  with pytest.raises(ValueError, match="draft_vocab_size"):
    eagle.EagleConfig.for_target(target.config, draft_vocab_size=62)
  with pytest.raises(ValueError, match="needs a target of llama, qwen2, mistral, qwen3, phi3"):
    eagle.EagleConfig.for_target(bj.GPT2Config(vocab_size=61, n_embd=32, n_layer=1, n_head=4),
                                 draft_vocab_size=8)
  draft = _random_draft(target)
  wrong = eagle.EagleConfig.for_target(tiny_model(0, intermediate_size=40).config,
                                       draft_vocab_size=DRAFT_VOCAB)
  eagle_files.save_eagle(tmp_path / "d", wrong, draft.params["draft"], np.asarray(_vocab_ids()))
  with pytest.raises(ValueError, match="mlp"):
    bj.load_model(tmp_path / "d")


def _feature_corpus(target, windows=48, width=24, seed=0):
  """Windows of text the target itself continues greedily, with its features (a tiny corpus)."""
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(0, 61, 4).tolist() for _ in range(windows)]
  out = bj.generate(target, None, prompts, method="regular", max_new_tokens=width - 4, eos_token_id=())
  tokens = np.asarray([p + s for p, s in zip(prompts, out.sequences())], np.int32)
  _, _, features = common.forward(target.config, target.params, jnp.asarray(tokens),
                                  return_features=True)
  mask = np.ones_like(tokens, bool)
  mask[:, -1] = False
  return {"tokens": tokens, "mask": mask, "features": np.asarray(features, np.float16)}


def test_training_lowers_the_loss_and_raises_agreement(tmp_path):
  target = tiny_model(0, scale=2.0)
  data = _feature_corpus(target)
  vocab = feature_draft.token_frequencies(data["tokens"], data["mask"], 61)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=61)
  cfg = distill.TrainConfig(steps=80, batch_size=8, peak_lr=1e-2, warmup_steps=5, eval_every=80,
                            checkpoint_every=40, log_every=10)
  objective = feature_draft.objective(config, cfg, target.config, target.params, vocab)
  before = objective.evaluate(objective.init(jax.random.key(cfg.seed)), data)
  params = distill.train(config, cfg, data, tmp_path, eval_data=data, progress=False,
                         objective=objective)
  after = objective.evaluate(params, data)
  assert after["eval_loss"] < 0.5 * before["eval_loss"]
  assert after["eval_agreement"] > before["eval_agreement"] + 0.3


def test_a_deeper_draft_grown_from_a_shallower_one_starts_at_its_predictions():
  """eagle_init.grown_params: the new layers are the identity, so a 2-layer draft grown from a 1-layer one
  predicts the same features (fed the same pairs); the new layers are not all zero (they train); a
  draft with more layers than the config, or another shape, is refused by name."""
  target = tiny_model(0)
  small = _random_draft(target, seed=4)
  deep_config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=DRAFT_VOCAB, num_layers=2)
  grown = eagle_init.grown_params(deep_config, small.params["draft"], jax.random.key(9))
  assert float(jnp.abs(grown["layers_1"]["self_attn"]["q_proj"]["kernel"]).sum()) > 0
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(0, 61, (2, 7)), jnp.int32)
  features = jnp.asarray(rng.normal(size=(2, 7, 32)), jnp.float32)
  deep = bj.Model(deep_config, {"draft": grown, "vocab_ids": small.params["vocab_ids"]}, name="eagle")
  want, _ = eagle.forward(small.config, _bound(target, small), tokens, features)
  got, _ = eagle.forward(deep_config, _bound(target, deep), tokens, features)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="lacks"):
    eagle_init.grown_params(small.config, grown, jax.random.key(0))
  wide = eagle.EagleConfig.for_target(tiny_model(0, hidden_size=48).config, draft_vocab_size=DRAFT_VOCAB)
  with pytest.raises(ValueError, match="has shape"):
    eagle_init.grown_params(wide, small.params["draft"], jax.random.key(0))


def test_token_frequencies_sort_by_count_then_id():
  tokens = np.asarray([[0, 3, 3, 1, 3, 1, 2]])
  mask = np.ones_like(tokens, bool)
  mask[0, -1] = False
  # Predicted tokens: 3, 3, 1, 3, 1, 2 -> 3 (x3), 1 (x2), 2 (x1), then 0, 4 (x0).
  assert feature_draft.token_frequencies(tokens, mask, 5).tolist() == [3, 1, 2, 0, 4]


# -- training-time test and fused features (EAGLE-3) ----------------------------------------------------


def _reference_chain(config, bound, tokens, inputs, c, depth, forward):
  """Drafts 1 … depth of the chain from pair position ``c``, recomputed from scratch: the true pairs
  ``(inputs_i, x_{i+1})`` for i <= c, then the draft's own features with the window's tokens.

  ``forward`` is ``jax.jit(functools.partial(eagle.forward, config))``. Pairs of one width go through
  one full causal forward, zero-padded to the window (causal, so the padding changes nothing); a fused
  draft's pairs (fused inputs, then its own features) go pair by pair through a NaN-filled cache."""
  width = len(tokens)
  pair_tokens = list(tokens[1:c + 2])
  pair_features = [np.asarray(x, np.float32) for x in inputs[:c + 1]]
  drafts = []
  for d in range(1, depth + 1):
    if d > 1:
      pair_tokens.append(tokens[c + d])
      pair_features.append(drafts[-1])
    if len({len(f) for f in pair_features}) > 1:
      cache = config.init_cache(1, width, fill_value=float("nan"))
      for t, f in zip(pair_tokens, pair_features):
        out, cache = forward(bound, jnp.asarray([[t]]), jnp.asarray([[f]]), cache)
      drafts.append(np.asarray(out[0, -1]))
    else:
      n = len(pair_tokens)
      padded_tokens = np.zeros((1, width), np.int32)
      padded_tokens[0, :n] = pair_tokens
      padded_features = np.zeros((1, width, len(pair_features[0])), np.float32)
      padded_features[0, :n] = pair_features
      out, _ = forward(bound, jnp.asarray(padded_tokens), jnp.asarray(padded_features))
      drafts.append(np.asarray(out[0, n - 1]))
  return np.stack(drafts)


@pytest.mark.parametrize("fused_layers", [(), (0,)])
def test_chained_drafts_equal_a_from_scratch_reference(fused_layers):
  """The training-time test's chains (the decode's cache, one row per start) are the drafts an
  autoregressive reference makes from each start: true pairs up to c, then the draft's own features."""
  target = tiny_model(0)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=DRAFT_VOCAB,
                                        fused_layers=fused_layers)
  params = eagle_init.init_draft_params(config, jax.random.key(3))
  if fused_layers:  # a fusion that mixes the hidden state in, not the pass-through it starts as
    params["fuse"]["kernel"] = jax.random.normal(jax.random.key(4), params["fuse"]["kernel"].shape) * 0.3
  bound = eagle.bind(params, _vocab_ids(), target.config, target.params, DRAFT_VOCAB)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, 61, (2, 12)), jnp.int32)
  inputs = jnp.asarray(rng.normal(size=(2, 12, config.input_feature_size)), jnp.float32)
  first, update = eagle.forward(config, bound, tokens[:, 1:], inputs[:, :-1])
  depth = 3
  starts = jnp.asarray(feature_draft.chain_starts(12, depth, stride=2))
  chains = feature_draft.chained_drafts(config, bound, tokens, first, update, starts, depth, "float32")
  forward = jax.jit(functools.partial(eagle.forward, config))
  assert chains.shape == (2, len(starts), depth, 32)
  for b in range(2):
    for s, c in enumerate(np.asarray(starts)):
      want = _reference_chain(config, bound, np.asarray(tokens[b]), np.asarray(inputs[b]), int(c), depth,
                              forward)
      np.testing.assert_allclose(chains[b, s], want, atol=3e-5, rtol=3e-5)


def test_held_out_chain_metrics_equal_a_reference():
  """evaluate's per-depth agreement and simulated accepted length, recounted from reference chains."""
  target = tiny_model(0, num_hidden_layers=1, scale=2.0)
  draft = _correlated_draft(target)
  bound = _bound(target, draft)
  data = _feature_corpus(target, windows=3, width=14)
  full_head = eagle.lm_head_matrix(target.config, target.params)
  frozen = {k: v for k, v in bound.items() if k != "draft"}
  depth = 3
  got = feature_draft.evaluate(bound["draft"], data, draft.config, frozen, full_head, "float32",
                               depth=depth, batch_size=2)
  hits, counts, accepted, starts = np.zeros(depth), np.zeros(depth), 0, 0
  forward = jax.jit(functools.partial(eagle.forward, draft.config))
  for tokens, mask, features in zip(data["tokens"], data["mask"], data["features"]):
    greedy = np.argmax(np.asarray(features, np.float32) @ np.asarray(full_head).T, axis=-1)
    for c in feature_draft.chain_starts(len(tokens), depth):
      chain = _reference_chain(draft.config, bound, tokens, features, int(c), depth, forward)
      drafted = np.asarray(bound["vocab_ids"])[np.argmax(chain @ np.asarray(bound["head"]).T, -1)]
      alive = True
      for d in range(1, depth + 1):
        if not mask[c + 1:c + d + 1].all():
          break
        hit = drafted[d - 1] == greedy[c + d]
        hits[d - 1] += hit
        counts[d - 1] += 1
        starts += d == 1
        accepted += alive and hit
        alive = alive and hit and greedy[c + d] == tokens[c + d + 1]
  assert counts[0] > 20 and 0 < accepted < depth * starts  # accepted often, not always
  for d in range(depth):
    assert got[f"eval_agreement_d{d + 1}"] == pytest.approx(hits[d] / counts[d], abs=1e-9)
  assert got["eval_mean_accepted_length"] == pytest.approx(1 + accepted / starts, abs=1e-9)
  # With the windows' prompt kinds, the agreement per kind is that of the kind's windows alone.
  kinds = np.array([0, 2, 0], np.int8)  # corpus.PROMPT_KINDS: doctest, docstring, instruction
  by_kind = feature_draft.evaluate(bound["draft"], {**data, "prompt_kinds": kinds}, draft.config,
                                   frozen, full_head, "float32", depth=depth, batch_size=2)
  for kind, rows in (("doctest", [0, 2]), ("instruction", [1])):
    alone = feature_draft.evaluate(bound["draft"], {k: v[rows] for k, v in data.items()},
                                   draft.config, frozen, full_head, "float32", depth=depth,
                                   batch_size=2)
    assert by_kind[f"eval_agreement_{kind}"] == pytest.approx(alone["eval_agreement"], abs=1e-12)
  assert "eval_agreement_docstring" not in by_kind
  assert by_kind["eval_agreement_doctest"] != by_kind["eval_agreement_instruction"]  # rows told apart
  assert by_kind["eval_agreement"] == got["eval_agreement"]


def test_a_fused_draft_starts_as_the_plain_draft_and_names_bad_widths():
  """The fusion is initialized to pass the feature through: with the plain draft's weights it drafts
  exactly what the plain draft drafts, whatever the hidden states; features of a third width fail."""
  target = tiny_model(0)
  plain = eagle.EagleConfig.for_target(target.config, draft_vocab_size=DRAFT_VOCAB)
  fused = eagle.EagleConfig.for_target(target.config, draft_vocab_size=DRAFT_VOCAB, fused_layers=(1, 0))
  params = eagle_init.init_draft_params(plain, jax.random.key(5))
  fused_params = {**eagle_init.init_draft_params(fused, jax.random.key(6)), **params}
  rng = np.random.default_rng(2)
  tokens = jnp.asarray(rng.integers(0, 61, (2, 7)), jnp.int32)
  features = jnp.asarray(rng.normal(size=(2, 7, 32)), jnp.float32)
  hidden = jnp.asarray(rng.normal(size=(2, 7, 64)) * 100, jnp.float32)
  bind = lambda p: eagle.bind(p, _vocab_ids(), target.config, target.params, DRAFT_VOCAB)
  want, _ = eagle.forward(plain, bind(params), tokens, features)
  got, _ = eagle.forward(fused, bind(fused_params), tokens, jnp.concatenate([hidden, features], -1))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="width 48"):
    eagle.forward(fused, bind(fused_params), tokens, jnp.concatenate([features, features[..., :16]], -1))
  with pytest.raises(ValueError, match=r"fused_layers \(2,\)"):
    eagle.EagleConfig.for_target(target.config, draft_vocab_size=8, fused_layers=(2,))
  assert eagle.EagleConfig.from_json(fused.to_json()) == fused
  # In the decode: the loop keeps those layers' hidden states and the features for it.
  proposer = proposers.EagleProposer(fused, "float32")
  assert proposer.feature_taps == (1, 0) and proposer.final_feature
  draft = bj.Model(fused, {"draft": fused_params, "vocab_ids": _vocab_ids()}, name="fused")
  prompts = [[3, 9, 4, 1], [7, 2, 8, 8, 5, 6, 1]]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=10, eos_token_id=())
  bass = bj.generate(target, draft, prompts, method="bass", max_new_tokens=10, eos_token_id=(),
                     draft_len=3)
  np.testing.assert_array_equal(bass.tokens, regular.tokens)


def test_the_training_time_test_loss_is_the_mean_of_the_depths():
  """feature_loss with ttt_depth = 3 is the mean of depth 1's loss and the chains' depth-2 and depth-3
  losses, recomputed from reference chains."""
  target = tiny_model(0, scale=2.0)
  data = _feature_corpus(target, windows=2, width=14)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=DRAFT_VOCAB)
  params = eagle_init.init_draft_params(config, jax.random.key(7))
  bound = eagle.bind(params, _vocab_ids(), target.config, target.params, DRAFT_VOCAB)
  frozen = {k: v for k, v in bound.items() if k != "draft"}
  batch = {k: jnp.asarray(v) for k, v in data.items()}
  depth, stride = 3, 4
  plain, _ = feature_draft.feature_loss(params, batch, config, frozen, "float32")
  got, metrics = feature_draft.feature_loss(params, batch, config, frozen, "float32", ttt_depth=depth,
                                            ttt_stride=stride)
  head = np.asarray(bound["head"], np.float64)

  def term(predicted, true):  # Smooth L1 + 0.1 x cross-entropy on the draft vocabulary
    error = np.abs(predicted - true)
    regression = np.mean(np.where(error < 1, 0.5 * error ** 2, error - 0.5))
    logits_q, logits_p = predicted @ head.T, true @ head.T
    log_q = logits_q - logits_q.max() - np.log(np.sum(np.exp(logits_q - logits_q.max())))
    p = np.exp(logits_p - logits_p.max())
    return regression - 0.1 * float(np.sum(p / p.sum() * log_q))

  deep = [[], []]
  forward = jax.jit(functools.partial(eagle.forward, config))
  for tokens, mask, features in zip(data["tokens"], data["mask"], data["features"]):
    features = np.asarray(features, np.float64)
    for c in feature_draft.chain_starts(len(tokens), depth, stride):
      chain = _reference_chain(config, bound, tokens, features, int(c), depth, forward)
      for d in (2, 3):
        if mask[c + 1:c + d + 1].all():
          deep[d - 2].append(term(chain[d - 1].astype(np.float64), features[c + d]))
  assert all(len(x) > 3 for x in deep)
  want = (float(plain) + np.mean(deep[0]) + np.mean(deep[1])) / depth
  assert float(got) == pytest.approx(want, rel=2e-4)
  assert set(metrics) >= {"agreement", "agreement_d2", "agreement_d3"}


def test_training_with_the_training_time_test_and_fused_features_learns(tmp_path):
  """A fused draft trained with the training-time test raises its chained agreement well past its
  start (a tiny target that continues its own text)."""
  target = tiny_model(0, scale=2.0)
  data = _feature_corpus(target)
  _, _, _, hidden = common.forward(target.config, target.params, jnp.asarray(data["tokens"]),
                                   return_features=True, hidden_layers=(0,))
  data["hidden"] = np.asarray(hidden, np.float16)
  vocab = feature_draft.token_frequencies(data["tokens"], data["mask"], 61)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=61, fused_layers=(0,))
  cfg = distill.TrainConfig(steps=80, batch_size=8, peak_lr=1e-2, warmup_steps=5, eval_every=80,
                            checkpoint_every=80, log_every=10)
  objective = feature_draft.objective(config, cfg, target.config, target.params, vocab, ttt_depth=3,
                                      ttt_stride=4, eval_depth=3)
  assert "hidden" in objective.fields
  before = objective.evaluate(objective.init(jax.random.key(cfg.seed)), data)
  params = distill.train(config, cfg, data, tmp_path, eval_data=data, progress=False,
                         objective=objective)
  after = objective.evaluate(params, data)
  assert after["eval_agreement_d1"] > before["eval_agreement_d1"] + 0.15
  assert after["eval_agreement_d3"] > before["eval_agreement_d3"] + 0.15
  assert after["eval_mean_accepted_length"] > before["eval_mean_accepted_length"] + 0.2


def test_an_eagle_draft_for_another_target_is_refused_by_name_before_tracing():
  """A draft trained for a target of another width (or vocabulary) fails in generate's checks, naming
  the field and both values, not inside JAX's tracing."""
  from conftest import random_eagle_draft  # pylint: disable=g-import-not-at-top

  target = tiny_model(0)
  wide = tiny_model(1, hidden_size=48, head_dim=12)
  draft = random_eagle_draft(wide)
  with pytest.raises(ValueError, match="reads features of width hidden_size=48, and the target's are "
                     "32"):
    bj.generate(target, draft, [[1, 2, 3]], max_new_tokens=4)
  other_vocab = random_eagle_draft(tiny_model(2, vocab_size=67))
  with pytest.raises(ValueError, match=r"different vocabulary sizes \(67 vs 61\)"):
    bj.generate(target, other_vocab, [[1, 2, 3]], max_new_tokens=4)


def test_a_fresh_eagle3_draft_starts_with_the_targets_head_over_its_vocabulary():
  """feature_draft.initial_params: EAGLE-3's own head and final norm begin as the target's head rows of
  the draft vocabulary and the target's final norm, so its logits on any hidden state h are the
  target's head on RMSNorm(h) (a jnp reference here); fc and the layer stay random."""
  target = tiny_model(0, scale=2.0)
  norm_scale = 1.0 + 0.5 * jax.random.normal(jax.random.key(5), target.params["norm"]["scale"].shape)
  params = {**target.params, "norm": {"scale": norm_scale}}  # a final norm that is not all ones
  layer = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40).layer
  config = eagle.EagleConfig(layer, 40, kind="eagle3", fc_bias=False, taps=(0, 1))
  vocab = np.random.default_rng(3).permutation(61).astype(np.int32)
  fresh = feature_draft.initial_params(config, jax.random.key(0), target.config, params, vocab)
  random = eagle_init.init_draft_params(config, jax.random.key(0))
  np.testing.assert_array_equal(fresh["fc"]["kernel"], random["fc"]["kernel"])
  bound = eagle.bind(fresh, vocab, target.config, params, 40, norm_eps=layer.rms_norm_eps)
  h = 3.0 * jax.random.normal(jax.random.key(6), (2, 5, target.config.hidden_size))
  normed = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + layer.rms_norm_eps) * norm_scale
  head = eagle.lm_head_matrix(target.config, target.params)[vocab[:40]]
  np.testing.assert_allclose(eagle.draft_logits(bound, h), normed @ head.T, rtol=1e-5, atol=1e-5)
  # At a smaller V' the training/evaluation binding scores the head's first rows, as eagle.bind does.
  frozen, _ = feature_draft.frozen_inputs(config.with_draft_vocab_size(24), target.config, params, vocab,
                                          "float32")
  np.testing.assert_allclose(eagle.draft_logits(feature_draft.bound_params(fresh, frozen), h),
                             (normed @ head.T)[..., :24], rtol=1e-5, atol=1e-5)
  plain = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40)
  assert set(feature_draft.initial_params(plain, jax.random.key(0), target.config, params, vocab)) \
      == set(eagle_init.init_draft_params(plain, jax.random.key(0)))  # nothing added to this project's


def test_an_eagle3_draft_trains_here_and_exports_for_the_published_runtimes(tmp_path):
  """EAGLE-3's architecture trained here (taps of both target layers, its own head over the draft
  vocabulary, the training-time test) raises its agreement, then exports in the speculators layout,
  which loads back and drafts greedily equal to regular decoding (test_published_drafts checks that
  the exported files are what the published code reads)."""
  target = tiny_model(0, scale=2.0)
  data = _feature_corpus(target)
  _, _, _, hidden = common.forward(target.config, target.params, jnp.asarray(data["tokens"]),
                                   return_features=True, hidden_layers=(0, 1))
  data["hidden"] = np.asarray(hidden, np.float16)
  vocab = feature_draft.token_frequencies(data["tokens"], data["mask"], 61)
  layer = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40).layer
  config = eagle.EagleConfig(layer, 40, kind="eagle3", fc_bias=False, taps=(0, 1))
  cfg = distill.TrainConfig(steps=80, batch_size=8, peak_lr=1e-2, warmup_steps=5, eval_every=80,
                            checkpoint_every=80, log_every=10)
  objective = feature_draft.objective(config, cfg, target.config, target.params, vocab,
                                      cls_weight=1.0, ttt_depth=2, ttt_stride=4, eval_depth=3)
  before = objective.evaluate(objective.init(jax.random.key(cfg.seed)), data)
  params = distill.train(config, cfg, data, tmp_path / "run", eval_data=data, progress=False,
                         objective=objective)
  after = objective.evaluate(params, data)
  assert before["eval_regression"] == after["eval_regression"] == 0.0  # no feature to regress
  assert after["eval_agreement"] > before["eval_agreement"] + 0.1  # 0.03 -> 0.19 when written
  draft = bj.Model(config, {"draft": params, "vocab_ids": jnp.asarray(vocab[:40])}, name="eagle3")
  bj.save_model(draft, tmp_path / "export", format="speculators")
  exported = bj.load_model(tmp_path / "export")
  assert exported.config.kind == "eagle3" and exported.config.taps == (0, 1)
  prompts = [[3, 9, 4, 1], [7, 2, 8, 8, 5, 6, 1]]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=10, eos_token_id=())
  bass = bj.generate(target, exported, prompts, method="bass", max_new_tokens=10, eos_token_id=(),
                     draft_len=3)
  np.testing.assert_array_equal(bass.tokens, regular.tokens)


def test_init_draft_params_compiles_once_per_config_and_draws_flax_s_initializers():
  """One jitted program per (config, dtype), as bass_jax.init_params: a second draft of the config
  compiles nothing and draws other weights for another key; the weights are the same function's
  eager draws up to f32 rounding."""
  target = tiny_model(0)
  config = eagle.EagleConfig.for_target(target.config, draft_vocab_size=40)
  first = eagle_init.init_draft_params(config, jax.random.key(0))
  program = eagle_init._draft_initializer(config, jnp.dtype(jnp.float32))  # pylint: disable=protected-access
  second = eagle_init.init_draft_params(config, jax.random.key(1))
  assert program._cache_size() == 1  # pylint: disable=protected-access
  assert not np.array_equal(first["fc"]["kernel"], second["fc"]["kernel"])
  eager = eagle.draw_draft_params(config, jnp.dtype(jnp.float32), jax.random.key(0))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), first, eager)
