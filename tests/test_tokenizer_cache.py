"""A GGUF file's tokenizer converted once (bass_jax.checkpoints.tokenizer_cache): the cached tokenizer
encodes, decodes and names its special tokens as transformers' own conversion does; a second load
reads the entry instead of the file; an edited file, the cache turned off, or a directory that cannot
be written behave as they should; load_model and the preflight go through it."""

import pathlib
import warnings

import gguf
import pytest
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from bass_jax import loading, preflight
from bass_jax.checkpoints import tokenizer_cache

TEXTS = ["def f(x):\n    return x + 1  # héllo", "ab ba  abab\t", ""]


def _write(path: pathlib.Path, merges=("a b", "Ġ a")) -> pathlib.Path:
  """A GGUF holding only a byte-level BPE tokenizer: GPT-2's 256 byte symbols, a few merges, and
  their results (what llama.cpp writes for a "gpt2" tokenizer; no tensors)."""
  symbols = list(bytes_to_unicode().values())
  tokens = symbols + [m.replace(" ", "") for m in merges] + ["<|end|>"]
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_tokenizer_model("gpt2")
  writer.add_token_list(tokens)
  writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL])
  writer.add_token_merges(list(merges))
  writer.add_bos_token_id(len(tokens) - 1)
  writer.add_eos_token_id(len(tokens) - 1)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def _same(a, b):
  assert type(a) is type(b) and len(a) == len(b)
  assert (a.eos_token_id, a.bos_token_id, a.all_special_ids) == (b.eos_token_id, b.bos_token_id,
                                                                  b.all_special_ids)
  for text in TEXTS:
    ids = a(text).input_ids
    assert ids == b(text).input_ids and a.decode(ids) == b.decode(ids)


def test_a_cached_tokenizer_is_transformers_own_and_the_second_load_reads_the_entry(
    tmp_path, monkeypatch):
  monkeypatch.setenv(tokenizer_cache.ENV_VAR, str(tmp_path / "cache"))
  path = _write(tmp_path / "m.gguf")
  direct = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
  first = tokenizer_cache.load(path)
  _same(first, direct)
  assert [e.name for e in (tmp_path / "cache").iterdir()] == [tokenizer_cache.key(path)]
  calls = []
  real = transformers.AutoTokenizer.from_pretrained
  monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                      lambda *a, **kw: calls.append((a, kw)) or real(*a, **kw))
  _same(tokenizer_cache.load(path), direct)
  assert calls == [((str(tmp_path / "cache" / tokenizer_cache.key(path)),), {})]
  # Another file at the same path (one merge fewer): another key, converted afresh.
  _write(path, merges=("a b",))
  third = tokenizer_cache.load(path)
  assert len(list((tmp_path / "cache").iterdir())) == 2 and len(third) == len(direct) - 1
  assert calls[-1][1] == {"gguf_file": "m.gguf"}


def test_the_cache_off_writes_nothing_and_an_unwritable_one_warns_once(tmp_path, monkeypatch):
  path = _write(tmp_path / "m.gguf")
  monkeypatch.setenv(tokenizer_cache.ENV_VAR, "off")
  assert tokenizer_cache.directory() is None
  tokenizer_cache.load(path)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  monkeypatch.setenv(tokenizer_cache.ENV_VAR, str(blocker / "cache"))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _same(tokenizer_cache.load(path), tokenizer_cache.load(path))
  messages = [str(w.message) for w in caught if "tokenizer cache" in str(w.message)]
  assert len(messages) == 1 and "could not be written" in messages[0] and "'off'" in messages[0]


def test_the_default_directory_follows_xdg(monkeypatch, tmp_path):
  monkeypatch.delenv(tokenizer_cache.ENV_VAR, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert tokenizer_cache.directory() == tmp_path / "bass_jax" / "tokenizers"


@pytest.mark.parametrize("route", ["load_model", "preflight"])
def test_load_model_and_the_preflight_read_gguf_tokenizers_through_the_cache(tmp_path, monkeypatch,
                                                                             route):
  path = _write(tmp_path / "m.gguf")
  seen = []
  monkeypatch.setattr(tokenizer_cache, "load", lambda p: seen.append(pathlib.Path(p)) or "tok")
  if route == "load_model":
    got = loading._load_tokenizer(tmp_path, "m.gguf")  # pylint: disable=protected-access
  else:
    source = type("Source", (), {"has_tokenizer": True, "kind": "gguf", "path": path, "spec": "m"})()
    got = preflight.load_tokenizer(source)
  assert got == "tok" and seen == [path]


@pytest.mark.parametrize("model", ["llama", "t5"])
def test_a_tokenizer_without_scores_is_refused_naming_the_key(tmp_path, monkeypatch, model):
  """Issue 54, finding 4: a sentencepiece vocabulary without merges (its merges come from the scores)
  or a unigram one, without tokenizer.ggml.scores, was transformers' bare ``KeyError: 'scores'``."""
  monkeypatch.setenv(tokenizer_cache.ENV_VAR, "off")
  path = tmp_path / "m.gguf"
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_tokenizer_model(model)
  writer.add_token_list(["<unk>", "<s>", "</s>", "\u2581a", "a", "b", "\u2581b", "ab"])
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(ValueError) as caught:
    tokenizer_cache.load(path)
  message = str(caught.value)
  assert "\n" not in message and message.startswith(f"{path}: its tokenizer has no "
                                                    "tokenizer.ggml.scores"), message

