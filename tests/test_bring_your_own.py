"""Bringing your own checkpoint: a model in a Hugging Face cache loads by its path or its repository id
(offline), and the stop ids of its ``generation_config.json`` end a decode.

Everything is built here in ``tmp_path``: a tiny transformers ``LlamaForCausalLM`` (vocabulary 200,
width 32, 2 layers; its weights in shards with an index) with a word-level tokenizer and a chat
template, laid out as huggingface_hub lays out its cache (``blobs/`` named by hash, ``snapshots/<commit>/``
of relative symlinks into them, ``refs/main``). Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil
import socket

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bass_jax as bj
from bass_jax import loading
from bass_jax import text
from bass_jax.checkpoints import sources

VOCAB = 200
SPECIAL = ["<unk>", "<s>", "</s>", "<|eot|>", "<|user|>", "<|assistant|>"]  # ids 0 to 5
CONFIG_EOS = 2  # config.json's eos_token_id, "</s>"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "org/tiny"
NEW_TOKENS = 12
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 7))


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  """Any attempt to connect fails the test: nothing here may download."""
  def refuse(*args, **kwargs):
    raise AssertionError(f"a network connection was attempted: {args}")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)


def word(i: int) -> str:
  return SPECIAL[i] if i < len(SPECIAL) else f"w{i}"


def save_tokenizer(directory: pathlib.Path, eos_token: str = "<|eot|>") -> None:
  """A word-level tokenizer over :data:`VOCAB` words (``w6`` … ``w199`` after the special tokens) with a
  one-turn chat template; ``eos_token`` goes into its tokenizer_config.json."""
  import tokenizers  # pylint: disable=g-import-not-at-top

  vocab = {word(i): i for i in range(VOCAB)}
  tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tk.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tk.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins the words with spaces
  template = ("{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>{% endif %}")
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token=eos_token,
      chat_template=template).save_pretrained(str(directory))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> pathlib.Path:
  """The checkpoint as transformers saves it: config.json, generation_config.json (one EOS id),
  sharded safetensors with their index, and the tokenizer."""
  path = tmp_path_factory.mktemp("tiny") / "ckpt"
  config = transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
      tie_word_embeddings=False, bos_token_id=1, eos_token_id=CONFIG_EOS)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(config)
  with torch.no_grad():
    for name, param in model.named_parameters():
      param.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.3 * torch.randn_like(param))
  model.save_pretrained(str(path), max_shard_size="30KB")
  save_tokenizer(path)
  assert (path / "model.safetensors.index.json").is_file()
  assert len(list(path.glob("model-*.safetensors"))) > 1
  return path


@pytest.fixture(scope="module")
def direct(source) -> bj.Model:
  return bj.load_model(source, dtype="float32")


def lay_out_cache(cache: pathlib.Path, source: pathlib.Path, *, repo: str = REPO,
                  commit: str = COMMIT, ref: bool = True) -> pathlib.Path:
  """``source``'s files as snapshot ``commit`` of ``repo`` in hub cache ``cache``: each file a blob
  named by its hash, the snapshot relative symlinks into ``../../blobs``, ``refs/main`` the commit
  (written without a newline, as huggingface_hub writes it). Returns the cache entry."""
  entry = cache / ("models--" + repo.replace("/", "--"))
  snapshot = entry / "snapshots" / commit
  (entry / "blobs").mkdir(parents=True, exist_ok=True)
  snapshot.mkdir(parents=True)
  for file in sorted(source.iterdir()):
    blob = hashlib.sha256(file.read_bytes()).hexdigest()
    shutil.copyfile(file, entry / "blobs" / blob)
    (snapshot / file.name).symlink_to(pathlib.Path("..", "..", "blobs", blob))
  if ref:
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(commit)
  return entry


def point_hub_cache(monkeypatch, cache: pathlib.Path) -> None:
  for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))


def logits(model: bj.Model) -> np.ndarray:
  return np.asarray(model.logits(jnp.asarray(TOKENS, jnp.int32)))


def assert_same_model(loaded: bj.Model, want: bj.Model, want_logits: np.ndarray) -> None:
  assert loaded.config == want.config
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded.params, want.params)
  np.testing.assert_array_equal(logits(loaded), want_logits)
  assert loaded.tokenizer.get_vocab() == want.tokenizer.get_vocab()


# -- a model in a Hugging Face cache ----------------------------------------------------------------


def test_a_cached_model_loads_by_snapshot_entry_and_repo_id(source, direct, tmp_path, monkeypatch):
  entry = lay_out_cache(tmp_path / "hub", source)
  snapshot = entry / "snapshots" / COMMIT
  assert all((snapshot / f.name).is_symlink() for f in source.iterdir())
  want = logits(direct)
  point_hub_cache(monkeypatch, tmp_path / "elsewhere")  # the entry and the snapshot need no cache
  for spec in (snapshot, entry, str(entry)):
    assert_same_model(bj.load_model(spec, dtype="float32"), direct, want)
  with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
    bj.load_model(REPO)  # not in the cache the environment names now
  point_hub_cache(monkeypatch, tmp_path / "hub")  # read at the call, not at import
  model = bj.load_model(REPO, dtype="float32")
  assert_same_model(model, direct, want)
  assert model.name == REPO
  # HF_HOME without HF_HUB_CACHE: the cache is $HF_HOME/hub.
  monkeypatch.delenv("HF_HUB_CACHE")
  monkeypatch.setenv("HF_HOME", str(tmp_path))
  assert loading.model_path(REPO) == snapshot
  # A local directory of that name comes first, and an alias before anything.
  monkeypatch.chdir(tmp_path)
  (tmp_path / "org").mkdir()
  (tmp_path / "org" / "tiny").symlink_to(source)
  assert loading.model_path(REPO) == pathlib.Path(REPO)
  assert loading.model_path("smollm2-135m-draft") == loading.resolve_alias("smollm2-135m-draft")


def test_an_entry_without_refs_main_takes_its_only_snapshot(source, tmp_path, monkeypatch):
  entry = lay_out_cache(tmp_path, source, ref=False)
  point_hub_cache(monkeypatch, tmp_path)
  assert loading.model_path(entry) == entry / "snapshots" / COMMIT
  assert loading.model_path(REPO) == entry / "snapshots" / COMMIT


def test_cache_refusals(source, tmp_path, monkeypatch):
  point_hub_cache(monkeypatch, tmp_path)
  # A repository id the cache does not hold: one line, saying so and how to get it.
  with pytest.raises(FileNotFoundError) as info:
    bj.load_model("org/absent")
  message = str(info.value)
  assert "\n" not in message and "not in the local Hugging Face cache" in message
  assert "hf download org/absent" in message and "pass its checkpoint directory" in message
  assert "nothing is downloaded" in message
  # Several snapshots and no refs/main: refused, each listed.
  entry = lay_out_cache(tmp_path, source, ref=False)
  other = "f" * 40
  shutil.copytree(entry / "snapshots" / COMMIT, entry / "snapshots" / other, symlinks=True)
  for spec in (entry, REPO):
    with pytest.raises(ValueError, match=f"2 snapshots \\({COMMIT}, {other}\\) and no refs/main"):
      bj.load_model(spec)
  # refs/main naming a snapshot that is not there.
  (entry / "refs").mkdir()
  (entry / "refs" / "main").write_text("e" * 40)
  with pytest.raises(FileNotFoundError, match=f"names snapshot '{'e' * 40}', which is not in"):
    bj.load_model(entry)
  # A blob that an interrupted download never wrote: the link is named, with the fix.
  (entry / "refs" / "main").write_text(COMMIT)
  shard = sorted(source.glob("model-*.safetensors"))[-1].name
  blob = (entry / "snapshots" / COMMIT / shard).resolve()
  blob.unlink()
  for spec in (entry / "snapshots" / COMMIT, entry, REPO):
    with pytest.raises(FileNotFoundError) as info:
      bj.load_model(spec)
    message = str(info.value)
    assert f"{shard}: a link to a missing file" in message, message
    assert "interrupted download" in message and f"hf download {REPO}" in message
    assert "\n" not in message


def test_a_snapshot_huggingface_hub_knows_incomplete_is_refused(source, tmp_path, monkeypatch):
  """huggingface_hub (2.x) records each commit's file list in ``trees/<commit>.json``; a snapshot that
  lacks a listed file is incomplete, and the repository id is refused with the fix."""
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

  if not hasattr(errors, "IncompleteSnapshotError"):
    pytest.skip("this huggingface_hub keeps no file lists")
  point_hub_cache(monkeypatch, tmp_path)
  entry = lay_out_cache(tmp_path, source)
  files = {f.name: {"size": f.stat().st_size, "blob_id": "0" * 40} for f in source.iterdir()}
  files["README.md"] = {"size": 10, "blob_id": "1" * 40}
  (entry / "trees").mkdir()
  (entry / "trees" / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": files}))
  with pytest.raises(FileNotFoundError) as info:
    bj.load_model(REPO)
  message = str(info.value)
  assert "is incomplete (1 file(s) are missing (README.md))" in message, message
  assert f"hf download {REPO}" in message and "\n" not in message


# -- stop ids from generation_config.json ----------------------------------------------------------


def greedy(model: bj.Model, prompts, **kwargs) -> bj.GenerateOutput:
  return bj.generate(model, None, prompts, method="regular", max_new_tokens=NEW_TOKENS, **kwargs)


def first_new(seq: list[int], avoid: set[int]) -> int:
  """The first step k >= 2 whose token is new in ``seq`` and not in ``avoid``."""
  return next(k for k in range(2, len(seq)) if seq[k] not in seq[:k] and seq[k] not in avoid)


def with_generation_config(source: pathlib.Path, directory: pathlib.Path, eos) -> pathlib.Path:
  shutil.copytree(source, directory)
  (directory / "generation_config.json").write_text(json.dumps(
      {"bos_token_id": 1, "eos_token_id": eos, "transformers_version": transformers.__version__}))
  return directory


@pytest.fixture(scope="module")
def runs_on(direct) -> list[list[int]]:
  """Greedy decodes of two prompts with config.json's one stop id: neither stops early."""
  out = greedy(direct, [[7, 8, 9], [40, 41]])
  assert direct.config.eos_token_id == CONFIG_EOS
  assert not out.finished.any() and list(out.lengths) == [NEW_TOKENS, NEW_TOKENS]
  return out.sequences()


def test_generation_config_stop_ids_end_a_decode(source, direct, runs_on, tmp_path):
  row0, row1 = runs_on
  k0 = first_new(row0, set())
  k1 = first_new(row1, {row0[k0]} | set(row0[:k0 + 1]))
  second, third = row0[k0], row1[k1]
  assert second not in row1[:k1 + 1]
  # Llama 3's way: config.json names one EOS, generation_config.json three (an int, or a list).
  path = with_generation_config(source, tmp_path / "ckpt", [CONFIG_EOS, second, third])
  model = bj.load_model(path, dtype="float32")
  assert model.config.eos_token_id == (CONFIG_EOS, second, third)
  out = greedy(model, [[7, 8, 9], [40, 41]])
  assert out.sequences() == [row0[:k0 + 1], row1[:k1 + 1]]  # each row ends at its stop id
  assert out.finished.all()
  # Merged with config.json's, each once, config.json's first.
  (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [third, CONFIG_EOS, third]}))
  assert bj.load_model(path, tokenizer=False).config.eos_token_id == (CONFIG_EOS, third)
  (path / "generation_config.json").write_text(json.dumps({"eos_token_id": CONFIG_EOS}))
  assert bj.load_model(path, tokenizer=False).config.eos_token_id == CONFIG_EOS  # nothing new: as is
  assert loading.merge_eos_ids(None, (5,)) == (5,)
  assert loading.merge_eos_ids((2, 3), (3, 4, 4)) == (2, 3, 4)


def test_save_model_writes_the_stop_ids_transformers_reads(source, tmp_path):
  path = with_generation_config(source, tmp_path / "ckpt", [CONFIG_EOS, 17, 33])
  model = bj.load_model(path, dtype="float32")
  bj.save_model(model, tmp_path / "saved")
  assert transformers.GenerationConfig.from_pretrained(tmp_path / "saved").eos_token_id == [
      CONFIG_EOS, 17, 33]
  assert transformers.AutoConfig.from_pretrained(tmp_path / "saved").eos_token_id == [CONFIG_EOS, 17, 33]
  assert bj.load_model(tmp_path / "saved").config.eos_token_id == (CONFIG_EOS, 17, 33)


@pytest.mark.parametrize("eos, message", [
    ("</s>", "must be a token id"),
    ([CONFIG_EOS, 3.0], "must be a token id"),
    (True, "must be a token id"),
    ([[CONFIG_EOS]], "must be a token id"),
    ([CONFIG_EOS, VOCAB], f"eos_token_id {VOCAB} is not a token id of this model"),
    (-1, "eos_token_id -1 is not a token id of this model"),
])
def test_bad_generation_config_stop_ids_are_refused(source, tmp_path, eos, message):
  path = with_generation_config(source, tmp_path / "ckpt", eos)
  file = re.escape(str(path / "generation_config.json"))
  with pytest.raises(ValueError, match=f"{file}: .*{re.escape(message)}"):
    bj.load_model(path)


def test_a_generation_config_that_is_not_an_object_is_refused(source, tmp_path):
  path = with_generation_config(source, tmp_path / "ckpt", None)
  (path / "generation_config.json").write_text("[2, 3]")
  with pytest.raises(ValueError, match="generation_config.json: holds an array"):
    bj.load_model(path)


# -- generate_text ends a chat reply at any stop id -------------------------------------------------


def test_generate_text_stops_at_the_tokenizers_eos_and_the_generation_configs(source, direct, tmp_path):
  prompt = ["w50 w51 w52"]
  ids = text.encode_prompts(direct.tokenizer, prompt, chat=True)
  assert ids == [[4, 50, 51, 52, 5]]  # <|user|> … <|assistant|>
  row = greedy(direct, ids, eos_token_id=[CONFIG_EOS, 3]).sequences()[0]
  assert len(row) == NEW_TOKENS  # no stop id met: the reply runs on
  k = first_new(row, set())
  end = row[k]
  kwargs = dict(chat=True, method="regular", max_new_tokens=NEW_TOKENS)
  assert bj.generate_text(direct, None, prompt, **kwargs) == [direct.tokenizer.decode(row)]
  want = [direct.tokenizer.decode(row[:k])]
  assert word(end) not in want[0].split()
  # The tokenizer marks the token as its EOS (tokenizer_config.json), config.json does not name it.
  save_tokenizer(tmp_path / "tok", eos_token=word(end))
  marked = bj.Model(direct.config, direct.params,
                    transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok")), "marked")
  assert text.stop_ids(marked) == (CONFIG_EOS, end)
  assert bj.generate_text(marked, None, prompt, **kwargs) == want
  # Only generation_config.json names it, as an ordinary word of the tokenizer: still cut and removed.
  model = bj.load_model(with_generation_config(source, tmp_path / "ckpt", [CONFIG_EOS, end]),
                        dtype="float32")
  assert text.stop_ids(model) == (CONFIG_EOS, end, 3)
  assert bj.generate_text(model, None, prompt, **kwargs) == want
  # An explicit eos_token_id replaces them.
  assert bj.generate_text(model, None, prompt, eos_token_id=CONFIG_EOS, **kwargs) == [
      direct.tokenizer.decode(row)]


def test_hub_cache_follows_the_environment(monkeypatch, tmp_path):
  for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert loading.hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert loading.hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
  monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
  assert loading.hf_hub_cache() == tmp_path / "home" / "hub"
  monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
  assert loading.hf_hub_cache() == tmp_path / "legacy"
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  assert loading.hf_hub_cache() == tmp_path / "hub"
  assert not sources.looks_like_repo_id("org/model.gguf") and not sources.looks_like_repo_id("a/b/c")
  assert sources.looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct")
