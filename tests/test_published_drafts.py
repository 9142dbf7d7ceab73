"""Published EAGLE drafts (EAGLE-1/2, EAGLE-3 in SafeAILab's and the speculators layout) load with
``load_model``, compute what the published modeling code computes, and draft exactly in the decode.

The references are PyTorch restatements of the published code (``tests/draft_formats``, which cites
each file and commit), over tiny random checkpoints written in exactly the published layouts for a
tiny random 8-layer transformers Llama target. For each layout: the draft's output features and
logits equal the reference's (f32, 1e-4), for the target's taps or features and for a fed-back step;
greedy BASS with the draft equals greedy regular decoding, with chains and with a tree; mismatched
pairs and tensors are refused by name.
"""

import json

import jax
import numpy as np
import pytest
import torch

import bass_jax as bj
from bass_jax import preflight
from bass_jax.checkpoints import eagle_formats
from bass_jax.checkpoints import locate
from bass_jax.models import common, eagle
from draft_formats import _common, eagle1, eagle3

B, T = 2, 9


@pytest.fixture(scope="module", autouse=True)
def one_thread():
  with _common.one_torch_thread():
    yield


@pytest.fixture(scope="module")
def target_pair(tmp_path_factory):
  """(transformers target, its bass_jax load)."""
  hf = _common.tiny_llama_target(num_hidden_layers=8, seed=0)
  path = tmp_path_factory.mktemp("target")
  hf.save_pretrained(path)
  return hf, bj.load_model(path, tokenizer=False)


@pytest.fixture(scope="module")
def tokens(target_pair):
  gen = torch.Generator().manual_seed(1)
  return torch.randint(3, target_pair[0].config.vocab_size, (B, T), generator=gen)


LAYOUTS = {
    "eagle1-vicuna": lambda d, hf: eagle1.write_eagle1_checkpoint(d, hf, style="vicuna", seed=3),
    "eagle1-llama3-no-bias": lambda d, hf: eagle1.write_eagle1_checkpoint(d, hf, style="llama3",
                                                                          seed=3),
    "eagle3-safeailab": lambda d, hf: eagle3.write_eagle3_checkpoint(d, hf, flavor="llama3", seed=4),
    "eagle3-speculators": lambda d, hf: eagle3.write_eagle3_checkpoint(
        d, hf, flavor="speculators", seed=4, norm_before_residual=True),
    "eagle3-explicit-sglang-ids": lambda d, hf: eagle3.write_eagle3_checkpoint(
        d, hf, flavor="llama3", seed=5, layer_ids=[0, 3, 6]),
    "eagle3-explicit-vllm-ids": lambda d, hf: eagle3.write_eagle3_checkpoint(
        d, hf, flavor="speculators", seed=5, layer_ids=[1, 4, 8]),
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def published(request, tmp_path_factory, target_pair):
  name = request.param
  path = tmp_path_factory.mktemp(name)
  LAYOUTS[name](path, target_pair[0])
  return name, path


def _jax_draft(draft, target, features, tokens):
  bound = eagle.bind(draft.params["draft"], draft.params["vocab_ids"], target.config, target.params,
                     draft.config.draft_vocab_size, norm_eps=draft.config.layer.rms_norm_eps)
  config = eagle.resolve_taps(draft.config, target.config)
  hidden, _ = eagle.forward(config, bound, np.asarray(tokens), np.asarray(features))
  return config, bound, np.asarray(hidden), np.asarray(eagle.draft_logits(bound, hidden))


def test_outputs_match_the_published_code(published, target_pair, tokens):
  name, path = published
  hf, target = target_pair
  draft = bj.load_model(path)
  assert draft.config.kind == name.split("-")[0]
  if draft.config.kind == "eagle1":
    state, config = eagle1.load_eagle1(path)
    step_tokens, features = eagle1.eagle1_inputs(hf, tokens)
    want_hidden, want_logits = eagle1.eagle1_forward(state, config, hf, step_tokens, features)
  else:
    state, config = eagle3.load_eagle3(path)
    convention = "vllm" if "speculators" in name or "vllm" in name else "sglang"
    ids = ([0, 3, 6] if "sglang" in name else [1, 4, 8] if "vllm" in name else None)
    step_tokens, features = eagle3.eagle3_inputs(hf, tokens, ids, convention)
    want_hidden, want_logits = eagle3.eagle3_forward(state, config, hf, step_tokens, features)
  # The decode's own feature buffer: the target's taps (or final features) from bass_jax's forward.
  resolved = eagle.resolve_taps(draft.config, target.config)
  out = common.forward(target.config, target.params, np.asarray(tokens), return_features=True,
                       hidden_layers=resolved.target_taps)
  ours = np.asarray(common.feature_value(out, resolved.target_taps, resolved.reads_final_feature))
  np.testing.assert_allclose(ours[:, :-1], features.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
  _, bound, hidden, logits = _jax_draft(draft, target, ours[:, :-1], step_tokens.numpy())
  np.testing.assert_allclose(hidden, want_hidden.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
  np.testing.assert_allclose(logits, want_logits.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
  assert np.std(logits) > 0.1
  if draft.config.kind == "eagle3":
    # a fed-back step reads the draft's own hidden state and skips fc
    fed_want, fed_logits = eagle3.eagle3_forward(state, config, hf, step_tokens,
                                                 hidden=want_hidden)
    _, _, fed, logits = _jax_draft(draft, target, want_hidden.numpy(), step_tokens.numpy())
    np.testing.assert_allclose(fed, fed_want.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
    np.testing.assert_allclose(logits, fed_logits.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)
    # draft ids map to target ids as d2t says
    d2t = state.get("d2t")
    if d2t is not None:
      np.testing.assert_array_equal(np.asarray(bound["vocab_ids"]),
                                    np.arange(len(d2t)) + d2t.numpy())


def test_every_published_draft_saves_and_loads_back_equal_in_both_formats(published, target_pair,
                                                                         tmp_path):
  """Whatever a published draft carries (its own embed_tokens, a reduced vocabulary with its head cut
  to V', tapped layers), ``save_model`` in safetensors and in orbax and ``load_draft`` give back the
  same config, the same parameters bit for bit and the same draft vocabulary. Before
  ``EagleConfig.own_embedding``, the four layouts with their own embedding saved but did not load."""
  name, path = published
  _, target = target_pair
  draft = bj.load_draft(path, target)
  assert draft.config.own_embedding == ("embed_tokens" in draft.params["draft"]), name
  for format in ("safetensors", "orbax"):  # pylint: disable=redefined-builtin
    bj.save_model(draft, tmp_path / format, format=format)
    again = bj.load_draft(tmp_path / format, target)
    assert again.config == draft.config, (name, format)
    assert jax.tree.structure(again.params) == jax.tree.structure(draft.params), (name, format)
    for mine, theirs in zip(jax.tree.leaves(again.params), jax.tree.leaves(draft.params)):
      assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), (name, format)


@pytest.mark.parametrize("name", ["eagle1-vicuna", "eagle3-safeailab", "eagle3-speculators"])
def test_greedy_bass_with_a_published_draft_equals_regular_decoding(name, tmp_path, target_pair):
  _, target = target_pair
  LAYOUTS[name](tmp_path, target_pair[0])
  draft = bj.load_draft(tmp_path, target)
  prompts = [np.random.default_rng(i).integers(3, 300, n).tolist() for i, n in enumerate((5, 11, 8))]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=16, eos_token_id=())
  chain = bj.generate(target, draft, prompts, method="bass", max_new_tokens=16, eos_token_id=(),
                      draft_len=3)
  assert np.array_equal(chain.tokens, regular.tokens), name
  tree = bj.generate(target, draft, prompts, method="bass", max_new_tokens=16, eos_token_id=(),
                     draft_tree="depth=3,top_k=2,nodes=6")
  assert np.array_equal(tree.tokens, regular.tokens), name


def test_published_kinds_are_told_apart(tmp_path, target_pair):
  """By eagle_formats, and the same by the one dispatch that load_model and the preflight share
  (``checkpoints.locate``), Medusa heads and a plain model included."""
  hf, _ = target_pair
  for name, write in LAYOUTS.items():
    write(tmp_path / name, hf)
    kind = ("eagle1" if name.startswith("eagle1") else
            "eagle3-speculators" if "speculators" in name or "vllm" in name else "eagle3")
    assert eagle_formats.published_kind(tmp_path / name) == kind, name
    assert locate.locate(tmp_path / name).kind == kind, name
    assert preflight.inspect_model(tmp_path / name).kind == "eagle", name
  hf.save_pretrained(tmp_path / "plain")
  assert eagle_formats.published_kind(tmp_path / "plain") is None
  assert locate.locate(tmp_path / "plain").kind == "hf"
  for layout in MEDUSA:
    medusa_ref.write_medusa_checkpoint(tmp_path / layout, hf, seed=6, **MEDUSA[layout])
    assert locate.locate(tmp_path / layout).kind == "medusa", layout
    assert preflight.inspect_model(tmp_path / layout).kind == "medusa", layout


def test_refusals_name_the_problem(tmp_path, target_pair):
  hf, target = target_pair
  eagle3.write_eagle3_checkpoint(tmp_path / "ok", hf, flavor="speculators", seed=4)
  config = json.loads((tmp_path / "ok" / "config.json").read_text())
  # a speculators option the port does not implement
  (tmp_path / "fc").mkdir()
  eagle3.write_eagle3_checkpoint(tmp_path / "fc", hf, flavor="speculators", seed=4, fc_norm=True)
  with pytest.raises(ValueError, match="fc_norm"):
    bj.load_model(tmp_path / "fc")
  # explicit taps the target does not have
  eagle3.write_eagle3_checkpoint(tmp_path / "deep", hf, flavor="speculators", seed=4,
                                 layer_ids=[2, 4, 12])
  draft = bj.load_model(tmp_path / "deep")
  with pytest.raises(ValueError, match="do not exist"):
    bj.generate(target, draft, [[5, 6, 7]], method="bass", max_new_tokens=4)
  # a draft of another vocabulary
  small = _common.tiny_llama_target(num_hidden_layers=8, vocab_size=200, seed=2)
  eagle3.write_eagle3_checkpoint(tmp_path / "other", small, flavor="llama3", seed=4)
  with pytest.raises(ValueError, match="different vocabulary sizes"):
    bj.generate(target, bj.load_model(tmp_path / "other"), [[5, 6, 7]], method="bass",
                max_new_tokens=4)
  # a mis-shaped tensor, named
  import safetensors.torch
  state = safetensors.torch.load_file(str(tmp_path / "ok" / "model.safetensors"))
  state["fc.weight"] = state["fc.weight"][:, :-8].contiguous()
  safetensors.torch.save_file(state, str(tmp_path / "ok" / "model.safetensors"))
  with pytest.raises(ValueError, match="'fc.weight'"):
    bj.load_model(tmp_path / "ok")
  assert config["speculators_model_type"] == "eagle3"


# -- Medusa --------------------------------------------------------------------------------------------

from draft_formats import medusa as medusa_ref  # noqa: E402

MEDUSA = {
    "fasterdecoding": dict(layout="fasterdecoding", num_heads=3, num_layers=1),
    "fasterdecoding-2-layers-stale-config": dict(layout="fasterdecoding", num_heads=4,
                                                 num_layers=2, config_num_heads=2),
    "vllm-truncated": dict(layout="vllm", num_heads=3, num_layers=1, truncated_vocab_size=120),
}


@pytest.mark.parametrize("name", sorted(MEDUSA))
def test_medusa_heads_match_the_published_code(name, tmp_path, target_pair, tokens):
  hf, target = target_pair
  medusa_ref.write_medusa_checkpoint(tmp_path, hf, seed=6, **MEDUSA[name])
  heads = bj.load_model(tmp_path)
  state, config = medusa_ref.load_medusa(tmp_path)
  features = medusa_ref.medusa_features(hf, tokens)
  want = medusa_ref.medusa_forward(state, config, features, vocab_size=hf.config.vocab_size).numpy()
  from bass_jax.models import medusa
  logits = np.asarray(medusa.head_logits(heads.params, np.asarray(features)))  # [B, T, K, V']
  full = np.full(logits.shape[:-1] + (hf.config.vocab_size,), -np.inf, np.float32)
  full[..., np.asarray(heads.params["vocab_ids"])] = logits
  assert heads.config.num_heads == MEDUSA[name]["num_heads"]  # the file's heads
  finite = np.isfinite(want)
  np.testing.assert_array_equal(np.isfinite(full), finite)
  np.testing.assert_allclose(full[finite], want[finite], atol=1e-4, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("layout", ["fasterdecoding", "vllm-truncated"])
def test_greedy_bass_with_medusa_heads_equals_regular_decoding(layout, tmp_path, target_pair):
  hf, target = target_pair
  medusa_ref.write_medusa_checkpoint(tmp_path, hf, seed=6, **MEDUSA[layout])
  heads = bj.load_draft(tmp_path, target)
  prompts = [np.random.default_rng(i).integers(3, 300, n).tolist() for i, n in enumerate((5, 11, 1))]
  regular = bj.generate(target, None, prompts, method="regular", max_new_tokens=16, eos_token_id=())
  # draft_len=5 past the 3 heads drafts 3 (min(l, K), whatever the layout): once, on one layout.
  longer = [dict(draft_len=5)] if layout == "fasterdecoding" else []
  for kwargs in (dict(draft_len=3), *longer, dict(draft_tree="depth=3,top_k=2,nodes=6")):
    bass = bj.generate(target, heads, prompts, method="bass", max_new_tokens=16, eos_token_id=(),
                       **kwargs)
    assert np.array_equal(bass.tokens, regular.tokens), (layout, kwargs)


def test_medusa_heads_load_beside_a_scanned_target(tmp_path, target_pair):
  """A scanned target makes its drafts scanned by default, unless they have no decoder layers to
  scan (EAGLE drafts, Medusa heads): loading heads beside a scanned target raised before."""
  hf, target = target_pair
  medusa_ref.write_medusa_checkpoint(tmp_path, hf, seed=6, **MEDUSA["fasterdecoding"])
  scanned = target.with_scanned_layers(True)
  heads = bj.load_draft(tmp_path, scanned)
  assert not heads.scanned_layers
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(
      np.array_equal, heads.params, bj.load_draft(tmp_path, target).params))


def test_the_command_lines_preflight_reads_published_drafts(tmp_path, target_pair):
  """``--draft=<dir>`` in every script goes through preflight before any weight loads: published
  EAGLE layouts and Medusa heads are recognized and checked against the target there."""
  from bass_jax import preflight

  hf, _ = target_pair
  hf.save_pretrained(tmp_path / "target")
  target = preflight.inspect_model(str(tmp_path / "target"))
  for name in ("eagle1-vicuna", "eagle3-safeailab", "eagle3-speculators"):
    LAYOUTS[name](tmp_path / name, hf)
    draft = preflight.inspect_model(str(tmp_path / name))
    assert draft.kind == "eagle" and draft.hidden_size == hf.config.hidden_size, name
    preflight.check_pair(target, draft)
  medusa_ref.write_medusa_checkpoint(tmp_path / "medusa", hf, layout="vllm")
  heads = preflight.inspect_model(str(tmp_path / "medusa"))
  assert heads.kind == "medusa"
  preflight.check_pair(target, heads)
  wide = _common.tiny_llama_target(num_hidden_layers=8, hidden_size=96, seed=3)
  wide.save_pretrained(tmp_path / "wide")
  with pytest.raises(ValueError, match="width hidden_size=64"):
    preflight.check_pair(preflight.inspect_model(str(tmp_path / "wide")),
                         preflight.inspect_model(str(tmp_path / "eagle3-safeailab")))


@pytest.mark.parametrize("source,layout", [("eagle1-llama3-no-bias", "safeailab"),
                                           ("eagle3-speculators", "safeailab"),
                                           ("eagle3-explicit-sglang-ids", "speculators"),
                                           ("eagle3-safeailab", "speculators")])
def test_a_draft_exported_here_loads_in_the_reference_with_equal_logits(source, layout, tmp_path,
                                                                        target_pair, tokens):
  """save_model(format=<published layout>) writes what the published code reads: the reference
  restatement's logits on the exported files equal bass_jax's on the original, taps included (a
  tap list crosses between vLLM's and SGLang's conventions)."""
  hf, target = target_pair
  LAYOUTS[source](tmp_path / "source", hf)
  draft = bj.load_model(tmp_path / "source")
  bj.save_model(draft, tmp_path / "exported", format=layout)
  assert eagle_formats.published_kind(tmp_path / "exported").startswith(draft.config.kind)
  again = bj.load_model(tmp_path / "exported")
  assert eagle.resolve_taps(again.config, target.config).taps == \
      eagle.resolve_taps(draft.config, target.config).taps
  if draft.config.kind == "eagle1":
    state, config = eagle1.load_eagle1(tmp_path / "exported")
    step_tokens, features = eagle1.eagle1_inputs(hf, tokens)
    _, want = eagle1.eagle1_forward(state, config, hf, step_tokens, features)
  else:
    state, config = eagle3.load_eagle3(tmp_path / "exported")
    spec = eagle3.eagle3_spec(config)
    ids = spec["layer_ids"]
    step_tokens, features = eagle3.eagle3_inputs(hf, tokens, ids, spec["convention"])
    _, want = eagle3.eagle3_forward(state, config, hf, step_tokens, features)
  resolved = eagle.resolve_taps(draft.config, target.config)
  out = common.forward(target.config, target.params, np.asarray(tokens), return_features=True,
                       hidden_layers=resolved.target_taps)
  ours = np.asarray(common.feature_value(out, resolved.target_taps, resolved.reads_final_feature))
  _, _, _, logits = _jax_draft(draft, target, ours[:, :-1], step_tokens.numpy())
  np.testing.assert_allclose(logits, want.numpy(), atol=1e-3, rtol=1e-3, err_msg=source)


def test_published_drafts_on_a_mesh_and_more_refusals(tmp_path, target_pair):
  """Loaded onto a (one-device) mesh, EAGLE-3 and Medusa drafts decode as without one; a top-level
  tap list in SafeAILab's layout is read (vLLM reads it there too); Medusa heads whose token_map
  disagrees with their rows are refused."""
  import safetensors.torch
  from bass_jax import sharding

  hf, target = target_pair
  mesh = sharding.make_mesh(1, 1)
  # Three prompts, as the greedy tests': the reference runs their regular program (4 rows, 16-token
  # prompt capacity, a 32-token output buffer).
  prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
  want = bj.generate(target, None, prompts, method="regular", max_new_tokens=6, eos_token_id=())
  eagle3.write_eagle3_checkpoint(tmp_path / "e3", hf, flavor="speculators", seed=4)
  medusa_ref.write_medusa_checkpoint(tmp_path / "m", hf, layout="vllm", seed=6)
  for name in ("e3", "m"):
    draft = bj.load_draft(tmp_path / name, target, mesh=mesh)
    got = bj.generate(target, draft, prompts, method="bass", max_new_tokens=6, eos_token_id=(),
                      draft_len=2, mesh=mesh)
    np.testing.assert_array_equal(got.tokens, want.tokens)
  eagle3.write_eagle3_checkpoint(tmp_path / "top", hf, flavor="llama3", seed=5, layer_ids=[0, 3, 6])
  config = json.loads((tmp_path / "top" / "config.json").read_text())
  config["eagle_aux_hidden_state_layer_ids"] = config.pop("eagle_config")[
      "eagle_aux_hidden_state_layer_ids"]
  (tmp_path / "top" / "config.json").write_text(json.dumps(config))
  assert bj.load_model(tmp_path / "top").config.taps == (0, 3, 6)
  medusa_ref.write_medusa_checkpoint(tmp_path / "cut", hf, layout="vllm", seed=6,
                                     truncated_vocab_size=120)
  state = safetensors.torch.load_file(str(tmp_path / "cut" / "model.safetensors"))
  state["token_map"] = state["token_map"][:100].contiguous()
  safetensors.torch.save_file(state, str(tmp_path / "cut" / "model.safetensors"))
  with pytest.raises(ValueError, match="120 rows and token_map names 100"):
    bj.load_model(tmp_path / "cut")


def test_medusa_heads_do_not_save_and_say_so(tmp_path, target_pair):
  medusa_ref.write_medusa_checkpoint(tmp_path / "m", target_pair[0], layout="vllm", seed=6)
  with pytest.raises(ValueError, match="Medusa heads load but do not save"):
    bj.save_model(bj.load_model(tmp_path / "m"), tmp_path / "out")
  assert not (tmp_path / "out").exists()
