"""Checkpoint writes are atomic and whole; directories that mix saves are refused, never misread.

Every case starts from a directory written by an earlier save, and checks the directory byte for byte:
a refused or failed save must leave it identical, and ``overwrite=True`` must replace it whole, so that
nothing of the earlier save (config, tokenizer, shards, orbax ``params/``) survives into the new one.
Models are tiny random Llamas; two saves always differ in shape (V = 61 vs 8) so a stale file cannot go
unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy

import bass_jax as bj
from bass_jax.checkpoints import atomic, orbax_ckpt
from bass_jax.checkpoints._mapping import CheckpointError
from conftest import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED_DRAFT = REPO / "bass_jax" / "drafts" / "smollm2-135m-draft"


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
  with pytest.raises(FileExistsError, match="not a model checkpoint"):
    bj.save_model(_model(0, 8), path, overwrite=True)
  assert (path / "thesis.tex").read_text() == "years of work"
  (tmp_path / "file").write_text("")
  with pytest.raises(FileExistsError, match="is a file"):
    bj.save_model(_model(0, 8), tmp_path / "file")
  with pytest.raises(NotADirectoryError, match="is a file"):
    bj.save_model(_model(0, 8), tmp_path / "file" / "ckpt")
  with pytest.raises(ValueError, match="overwrite must be True or False"):
    bj.save_model(_model(0, 8), tmp_path / "x", overwrite="yes")


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
  return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
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
