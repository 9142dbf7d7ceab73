"""Checkpoint writes are atomic and whole; directories that mix saves are refused, never misread.

Every case starts from a directory written by an earlier save, and checks the directory byte for byte:
a refused or failed save must leave it identical, and ``overwrite=True`` must replace it whole, so that
nothing of the earlier save (config, tokenizer, shards, orbax ``params/``) survives into the new one.
Models are tiny random Llamas; two saves always differ in shape (V = 61 vs 8) so a stale file cannot go
unnoticed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import re
import select
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy

import bass_jax as bj
from bass_jax.checkpoints import atomic, orbax_ckpt
from bass_jax.checkpoints import hf as hf_ckpt
from bass_jax.checkpoints._mapping import CheckpointError
from conftest import PYTHON, script_pid, send_signal, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "bass_jax" / "drafts" / "smollm2-135m-draft"


@functools.lru_cache(maxsize=None)  # a Model is immutable; initializing one takes seconds on a CPU
def _model(seed: int, vocab: int, tokenizer=None) -> bj.Model:
  config = tiny_config(vocab_size=vocab)
  return bj.Model(config, bj.init_params(config, jax.random.key(seed)), tokenizer, f"tiny-{seed}")


@pytest.fixture(scope="module")
def tokenizer():
  import transformers

  return transformers.AutoTokenizer.from_pretrained(str(SHIPPED_DRAFT))


def _snapshot(path: pathlib.Path) -> dict[str, str]:
  """Relative path -> sha256 of every file under ``path`` (the directory's exact content)."""
  return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(path.rglob("*")) if p.is_file()}


def _no_temporaries(parent: pathlib.Path) -> None:
  leftovers = [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]
  assert not leftovers, leftovers


def _logits(model: bj.Model) -> np.ndarray:
  tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, (1, 5))
  return np.asarray(model.logits(tokens))


def test_orbax_over_orbax_refused_then_replaced_whole(tmp_path):
  old, new = _model(0, 61), _model(1, 8)
  path = tmp_path / "ckpt"
  bj.save_model(old, path, format="orbax")
  before = _snapshot(path)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    bj.save_model(new, path, format="orbax")
  assert _snapshot(path) == before
  bj.save_model(new, path, format="orbax", overwrite=True)
  loaded = bj.load_model(path)
  assert loaded.config.vocab_size == 8
  np.testing.assert_allclose(_logits(loaded), _logits(new), atol=1e-5)
  _no_temporaries(tmp_path)


def test_safetensors_over_orbax_replaces_params(tmp_path):
  old, new = _model(0, 61), _model(1, 61)
  path = tmp_path / "ckpt"
  bj.save_model(old, path, format="orbax")
  with pytest.raises(FileExistsError):
    bj.save_model(new, path)
  bj.save_model(new, path, overwrite=True)
  assert not (path / "params").exists()  # the orbax weights are gone, not silently preferred
  np.testing.assert_allclose(_logits(bj.load_model(path)), _logits(new), atol=1e-5)


def test_save_without_tokenizer_leaves_no_stale_tokenizer(tmp_path, tokenizer):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, tokenizer.vocab_size, tokenizer), path)
  assert (path / "tokenizer.json").exists()
  bj.save_model(_model(1, 8), path, overwrite=True)
  assert not any(p.name.startswith("tokenizer") for p in path.iterdir())
  loaded = bj.load_model(path)
  assert loaded.tokenizer is None and loaded.config.vocab_size == 8


def test_tokenizer_that_does_not_fit_the_vocabulary_is_refused(tmp_path, tokenizer):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, 8), path)
  tokenizer.save_pretrained(str(path))  # a stale tokenizer, as the old non-atomic save left it
  with pytest.raises(ValueError, match=r"tokenizer has 49152 tokens but the model's vocab_size is 8"):
    bj.load_model(path)
  assert bj.load_model(path, tokenizer=False).config.vocab_size == 8


def test_leftover_shards_cannot_survive_or_mislead(tmp_path):
  path = tmp_path / "ckpt"
  old = _model(0, 61)
  bj.save_model(old, path)
  # An earlier sharded save: two shards and their index, holding other weights.
  tensors = safetensors.numpy.load_file(str(path / "model.safetensors"))
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  for shard, keys in shards.items():
    safetensors.numpy.save_file({k: tensors[k] + 1.0 for k in keys}, str(path / shard))
  index = {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
  (path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(CheckpointError, match="two saves mixed"):
    bj.load_model(path)
  # Without the single file, the index names exactly the shards to read (as transformers does).
  (path / "model.safetensors").unlink()
  bj.load_model(path)
  # Replacing the directory whole removes every shard and the index.
  new = _model(1, 8)
  bj.save_model(new, path, overwrite=True)
  assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
  np.testing.assert_allclose(_logits(bj.load_model(path)), _logits(new), atol=1e-5)


def test_failed_save_leaves_the_old_directory_byte_identical(tmp_path, monkeypatch):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, 61), path, format="orbax")
  before = _snapshot(path)

  def crash(directory, params):
    pathlib.Path(directory).mkdir()
    (pathlib.Path(directory) / "half_written").write_bytes(b"x" * 100)
    raise OSError("disk full")

  monkeypatch.setattr(orbax_ckpt, "save_params", crash)
  with pytest.raises(OSError, match="disk full"):
    bj.save_model(_model(1, 8), path, format="orbax", overwrite=True)
  assert _snapshot(path) == before
  _no_temporaries(tmp_path)
  assert bj.load_model(path).config.vocab_size == 61


def test_a_directory_with_two_weight_formats_is_refused(tmp_path):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, 61), path, format="orbax")
  safetensors.numpy.save_file({"x": np.ones(2, np.float32)}, str(path / "model.safetensors"))
  with pytest.raises(ValueError, match=r"2 formats \(params/ \(orbax\); safetensors: model.safetensors\)"):
    bj.load_model(path)


def test_overwrite_never_deletes_a_directory_that_is_not_a_checkpoint(tmp_path):
  path = tmp_path / "notes"
  path.mkdir()
  (path / "thesis.tex").write_text("years of work")
  with pytest.raises(FileExistsError, match=r"1 entry that a save does not write \(thesis\.tex\)"):
    bj.save_model(_model(0, 8), path, overwrite=True)
  assert (path / "thesis.tex").read_text() == "years of work"
  (tmp_path / "file").write_text("")
  with pytest.raises(FileExistsError, match="is a file"):
    bj.save_model(_model(0, 8), tmp_path / "file")
  with pytest.raises(NotADirectoryError, match="is a file"):
    bj.save_model(_model(0, 8), tmp_path / "file" / "ckpt")
  with pytest.raises(ValueError, match="overwrite must be True or False"):
    bj.save_model(_model(0, 8), tmp_path / "x", overwrite="yes")


def _project(path: pathlib.Path) -> None:
  """A user's project directory that happens to have a config.json at its top (issue 24)."""
  (path / "src").mkdir(parents=True)
  (path / "config.json").write_text(json.dumps({"model_type": "llama", "learning_rate": 3e-4}))
  (path / "src" / "train.py").write_text("print('months of work')\n")
  (path / "NOTES.md").write_text("# notes\n")


def test_overwrite_refuses_a_project_directory_with_a_config_json(tmp_path):
  path = tmp_path / "project"
  _project(path)
  before, siblings = _snapshot(tmp_path), sorted(os.listdir(tmp_path))
  for fmt in ("safetensors", "orbax"):
    with pytest.raises(FileExistsError) as info:
      bj.save_model(_model(0, 8), path, format=fmt, overwrite=True)
    message = str(info.value)
    assert "2 entries that a save does not write (NOTES.md, src/)" in message, message
    assert str(path) in message and "Choose an empty or new directory, or remove those files" in message
    assert _snapshot(tmp_path) == before  # the project, byte for byte, and nothing written beside it
    assert sorted(os.listdir(tmp_path)) == siblings
  with pytest.raises(FileExistsError, match="NOTES.md"):  # the scripts' early check says the same
    atomic.check_destination(path, overwrite=True)
  # Many strangers: a few are named, with the count.
  for i in range(7):
    (path / f"data_{i}.csv").write_text("1,2\n")
  with pytest.raises(FileExistsError, match=r"9 entries that a save does not write \(NOTES\.md, "
                                            r"data_0\.csv, data_1\.csv, data_2\.csv, data_3\.csv, …\)"):
    bj.save_model(_model(0, 8), path, overwrite=True)
  # Once the stranger files are removed, what is left is replaceable.
  shutil.rmtree(path / "src")
  for p in path.glob("*.csv"):
    p.unlink()
  (path / "NOTES.md").unlink()
  bj.save_model(_model(0, 8), path, overwrite=True)
  assert bj.load_model(path).config.vocab_size == 8


@pytest.mark.parametrize("stranger", ["params/", "additional_chat_templates/", "model.safetensors/",
                                      "README.md", "adapter_model.safetensors", "model-1.safetensors"])
def test_overwrite_refuses_look_alikes_of_saved_files(tmp_path, stranger):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, 8), path)
  if stranger == "model.safetensors/":
    (path / "model.safetensors").unlink()
  if stranger.endswith("/"):  # a directory by a save's name, but not holding what a save writes there
    (path / stranger).mkdir()
    (path / stranger / "mine.txt").write_text("not a checkpoint")
  else:
    (path / stranger).write_text("not a checkpoint")
  before = _snapshot(path)
  with pytest.raises(FileExistsError, match=re.escape(f"1 entry that a save does not write ({stranger})")):
    bj.save_model(_model(1, 8), path, overwrite=True)
  assert _snapshot(path) == before


def test_overwrite_accepts_every_name_a_save_writes(tmp_path):
  path = tmp_path / "ckpt"
  path.mkdir()
  names = sorted(atomic.SAVE_FILES) + ["model-00001-of-00002.safetensors",
                                       "pytorch_model-00002-of-00002.bin"]
  for name in names:
    (path / name).write_text("{}")
  orbax_ckpt.save_params(path / "params", {"w": np.ones(3, np.float32)})
  (path / "additional_chat_templates").mkdir()
  (path / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
  assert atomic.unexpected_entries(path) == []
  bj.save_model(_model(0, 8), path, overwrite=True)
  assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]


# -- EAGLE drafts: the same atomic writer and the same guards ---------------------------------------


@functools.lru_cache(maxsize=None)
def _draft() -> bj.Model:
  from conftest import random_eagle_draft, tiny_model  # pylint: disable=g-import-not-at-top

  return random_eagle_draft(tiny_model(0))


def _eagle_writers():
  """Every way an EAGLE draft is written: ``(name, write(path, overwrite))``."""
  from bass_jax.checkpoints import eagle_files  # pylint: disable=g-import-not-at-top

  draft = _draft()
  return [("save_model-safetensors",
           lambda p, overwrite: bj.save_model(draft, p, overwrite=overwrite)),
          ("save_model-orbax",
           lambda p, overwrite: bj.save_model(draft, p, format="orbax", overwrite=overwrite)),
          ("save_eagle", lambda p, overwrite: eagle_files.save_eagle(
              p, draft.config, draft.params["draft"], np.asarray(draft.params["vocab_ids"]),
              overwrite=overwrite))]


def test_an_eagle_save_refuses_a_directory_with_other_files_and_replaces_its_own_whole(tmp_path):
  path = tmp_path / "project"
  _project(path)
  before, siblings = _snapshot(tmp_path), sorted(os.listdir(tmp_path))
  for name, write in _eagle_writers():
    for overwrite in (False, True):
      with pytest.raises(FileExistsError, match="NOTES.md" if overwrite else "overwrite=True"):
        write(path, overwrite)
      assert _snapshot(tmp_path) == before, (name, overwrite)  # config.json too, byte for byte
      assert sorted(os.listdir(tmp_path)) == siblings, (name, overwrite)
  # Over an earlier save: refused without overwrite; with it, replaced whole (no params/ beside
  # model.safetensors, no model.safetensors beside params/).
  ckpt = tmp_path / "ckpt"
  expected = {"save_model-safetensors": ["config.json", "model.safetensors"],
              "save_model-orbax": ["config.json", "params"],
              "save_eagle": ["config.json", "model.safetensors"]}
  writers = dict(_eagle_writers())
  for previous, name in [("save_model-orbax", "save_model-safetensors"),
                         ("save_model-orbax", "save_eagle"),
                         ("save_model-safetensors", "save_model-orbax")]:
    shutil.rmtree(ckpt, ignore_errors=True)
    writers[previous](ckpt, False)
    before = _snapshot(ckpt)
    with pytest.raises(FileExistsError, match="overwrite=True"):
      writers[name](ckpt, False)
    assert _snapshot(ckpt) == before, name
    writers[name](ckpt, True)
    assert sorted(os.listdir(ckpt)) == expected[name], (previous, name)
    loaded = bj.load_model(ckpt, dtype="float32")
    assert loaded.config == _draft().config
    np.testing.assert_array_equal(loaded.params["vocab_ids"], _draft().params["vocab_ids"])
  _no_temporaries(tmp_path)


def test_a_failed_eagle_save_leaves_no_partial_destination(tmp_path, monkeypatch):
  from bass_jax.checkpoints import eagle_files  # pylint: disable=g-import-not-at-top

  real_save_file = safetensors.numpy.save_file

  def half_then_crash(tensors, filename, *args, **kwargs):  # a disk that fills midway through
    real_save_file(tensors, filename, *args, **kwargs)
    pathlib.Path(filename).write_bytes(pathlib.Path(filename).read_bytes()[:100])
    raise OSError("disk full")

  def orbax_crash(directory, params):
    pathlib.Path(directory).mkdir()
    (pathlib.Path(directory) / "half_written").write_bytes(b"x" * 100)
    raise OSError("disk full")

  existing = tmp_path / "existing"
  eagle_files.save_eagle(existing, _draft().config, _draft().params["draft"],
                   np.asarray(_draft().params["vocab_ids"]))
  before = _snapshot(existing)
  monkeypatch.setattr(safetensors.numpy, "save_file", half_then_crash)
  monkeypatch.setattr(orbax_ckpt, "save_params", orbax_crash)
  for name, write in _eagle_writers():
    with pytest.raises(OSError, match="disk full"):
      write(tmp_path / "new", False)
    assert not (tmp_path / "new").exists(), name
    with pytest.raises(OSError, match="disk full"):
      write(existing, True)
    assert _snapshot(existing) == before, name
    _no_temporaries(tmp_path)
  monkeypatch.undo()
  assert bj.load_model(existing).config == _draft().config


def _dead_pid() -> int:
  child = subprocess.Popen([sys.executable, "-c", ""])
  child.wait()
  return child.pid


def _leftover(parent: pathlib.Path, name: str, kind: str, pid: int, host: str | None = None,
              size: int = 0) -> pathlib.Path:
  """A temporary directory named as ``atomic.replace_directory`` names it for ``parent / name``."""
  host = atomic._host() if host is None else host  # pylint: disable=protected-access
  tag = os.urandom(6).hex()
  path = parent / (f".{name}.{kind}-{host}-{pid}-{tag}" if pid else f".{name}.{kind}-{tag}")
  (path / "params").mkdir(parents=True)
  (path / "config.json").write_text("{}")
  with open(path / "params" / "blob", "wb") as f:
    f.truncate(size)
  return path


def test_next_save_removes_only_its_own_dead_leftovers(tmp_path):
  path = tmp_path / "ckpt"
  dead = _dead_pid()
  assert dead != os.getpid()
  mine = [_leftover(tmp_path, "ckpt", "partial", dead, size=64 << 20),  # a large-ish half write
          _leftover(tmp_path, "ckpt", "old", dead),
          _leftover(tmp_path, "ckpt", "partial", 0),  # the names before they carried a pid
          _leftover(tmp_path, "ckpt", "old", 0)]
  kept = [_leftover(tmp_path, "ckpt", "partial", os.getpid()),  # a save still running: this process
          _leftover(tmp_path, "ckpt", "partial", dead, host="another-node"),  # cannot be checked here
          _leftover(tmp_path, "other", "partial", dead),  # another path's
          _leftover(tmp_path, "ckpt.v2", "old", dead),
          _leftover(tmp_path, "ckpt.partial-x", "partial", dead),
          tmp_path / ".ckpt.partial-notes"]
  kept[-1].mkdir()
  assert sorted(atomic.leftovers(path)) == sorted(mine)
  bj.save_model(_model(0, 8), path)
  assert [p for p in mine if p.exists()] == []
  assert [p for p in kept if not p.exists()] == []
  # A refused save removes nothing, leftovers included.
  again = _leftover(tmp_path, "ckpt", "partial", dead)
  with pytest.raises(FileExistsError):
    bj.save_model(_model(1, 8), path)
  assert again.exists()
  bj.save_model(_model(1, 8), path, overwrite=True)
  assert not again.exists() and all(p.exists() for p in kept)
  assert bj.load_model(path).config.vocab_size == 8


_KILLED_SAVE = """
import sys, time
import jax
import numpy as np
import bass_jax as bj
from bass_jax.checkpoints import hf
from conftest import tiny_config

real = hf.save_hf_checkpoint

def stalled(path, config, params):  # writes the whole checkpoint, then waits to be killed
  real(path, config, params)
  print("WRITTEN", path, flush=True)
  time.sleep(600)

hf.save_hf_checkpoint = stalled
config = tiny_config(vocab_size=8)
params = jax.tree.map(lambda x: np.ones(x.shape, x.dtype), bj.abstract_params(config))  # no init: fast
bj.save_model(bj.Model(config, params), sys.argv[1], overwrite=True)
"""


def test_a_save_killed_midway_leaves_a_leftover_that_the_next_save_removes(tmp_path):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, 61), path)
  before = _snapshot(path)
  env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu")
  child = subprocess.Popen([PYTHON, "-c", _KILLED_SAVE, str(path)], cwd=REPO / "tests",
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
  try:
    ready, _, _ = select.select([child.stdout], [], [], 240)
    line = child.stdout.readline() if ready else ""
    assert line.startswith("WRITTEN"), (line, child.poll(), child.stderr.read() if child.poll() else "")
    partial = pathlib.Path(line.split(maxsplit=1)[1].strip())
    assert partial.parent == tmp_path
    assert partial.name.startswith(f".ckpt.partial-{atomic._host()}-{script_pid(child)}-")  # pylint: disable=protected-access
    assert (partial / "model.safetensors").is_file()
    assert atomic.leftovers(path) == []  # its save is still running: not a leftover yet
  finally:
    send_signal(child, signal.SIGKILL)  # nothing of the child's cleans up
    child.wait()
    child.stdout.close()
    child.stderr.close()
  assert child.returncode == -signal.SIGKILL
  assert partial.is_dir() and atomic.leftovers(path) == [partial]
  assert _snapshot(path) == before  # the killed save never touched the checkpoint
  new = _model(2, 8)
  bj.save_model(new, path, overwrite=True)
  _no_temporaries(tmp_path)
  np.testing.assert_allclose(_logits(bj.load_model(path)), _logits(new), atol=1e-5)


def test_save_model_names_a_wrong_argument(tmp_path):
  with pytest.raises(ValueError, match="model must be a bass_jax.Model, got NoneType"):
    bj.save_model(None, tmp_path / "ckpt")
  model = _model(0, 8)
  with pytest.raises(ValueError, match="model must be a bass_jax.Model, got dict"):
    bj.save_model(model.params, tmp_path / "ckpt")
  with pytest.raises(ValueError, match="path must be a directory path.*got NoneType"):
    bj.save_model(model, None)
  assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("fmt", ["safetensors", "orbax"])
@pytest.mark.parametrize("file, content, message", [
    pytest.param("tokenizer.json", None, "not valid JSON", id="truncated-tokenizer.json"),
    pytest.param("tokenizer_config.json", "[1, 2]", "holds an array", id="tokenizer_config-a-list"),
])
def test_a_corrupt_tokenizer_is_named_before_any_weights_load(tmp_path, tokenizer, monkeypatch, fmt,
                                                              file, content, message):
  path = tmp_path / "ckpt"
  bj.save_model(_model(0, tokenizer.vocab_size, tokenizer), path, format=fmt)
  target = path / file
  target.write_text(target.read_text()[:1000] if content is None else content)

  def no_weights(*args, **kwargs):
    raise AssertionError("weights were read before the tokenizer was checked")

  monkeypatch.setattr(hf_ckpt, "load_hf_checkpoint", no_weights)
  monkeypatch.setattr(hf_ckpt, "_read_tensors", no_weights)
  monkeypatch.setattr(orbax_ckpt, "restore_params", no_weights)
  with pytest.raises(ValueError, match=re.escape(str(target)) + ": " + message):
    bj.load_model(path)
  monkeypatch.undo()
  assert bj.load_model(path, tokenizer=False).config.vocab_size == tokenizer.vocab_size


def test_replace_directory_is_all_or_nothing(tmp_path):
  path = tmp_path / "out"
  with atomic.replace_directory(path) as tmp:
    (tmp / "config.json").write_text("1")
  assert (path / "config.json").read_text() == "1"
  with pytest.raises(KeyboardInterrupt):
    with atomic.replace_directory(path, overwrite=True) as tmp:
      (tmp / "config.json").write_text("2")
      raise KeyboardInterrupt
  assert (path / "config.json").read_text() == "1"
  _no_temporaries(tmp_path)
  empty = tmp_path / "empty"
  empty.mkdir()
  bj.save_model(_model(0, 8), empty)  # an empty directory holds nothing to lose
  assert bj.load_model(empty).config.vocab_size == 8


def _run(*args, timeout=300):
  env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  return subprocess.run([PYTHON, "-m", *args], cwd=REPO, capture_output=True, text=True,
                        timeout=timeout, env=env)


def test_convert_refuses_an_existing_directory_without_a_traceback(tmp_path):
  src, dst = tmp_path / "src", tmp_path / "dst"
  bj.save_model(_model(0, 61), src)
  bj.save_model(_model(1, 8), dst)
  before = _snapshot(dst)
  result = _run("experiments.convert", f"--from={src}", f"--to={dst}", "--format=orbax")
  assert result.returncode != 0
  assert "Traceback" not in result.stderr and "--overwrite" in result.stderr
  assert _snapshot(dst) == before
  result = _run("experiments.convert", f"--from={src}", f"--to={dst}", "--format=orbax", "--overwrite")
  assert result.returncode == 0, result.stderr[-2000:]
  assert bj.load_model(dst).config.vocab_size == 61 and (dst / "params").is_dir()
