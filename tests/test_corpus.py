"""The prompts of the docstring-style draft corpus (issue 28; ``bass_jax.training.corpus``): nothing of
HumanEval (the evaluation set) enters, the train/held-out split does not depend on where Python or the
virtual environment lives, and the mix of prompt kinds is what was asked or says it is not; the
feature labelling, cut to each batch's longest row, equals a full forward of each row."""

import random
import re
import sysconfig

import numpy as np
import pytest

from bass_jax.evaluation.data import load_problems
from bass_jax.models import common
from bass_jax.training import corpus
from bass_jax.training.corpus import SourcePrompt
from conftest import tiny_model


@pytest.fixture(scope="module")
def humaneval():
  return load_problems("humaneval")


def _normalized(text):
  return " ".join(re.findall(r"\w+", text.lower()))


def test_prompts_sharing_text_or_a_name_with_humaneval_are_dropped(humaneval):
  """A HumanEval prompt under another name, a docstring quoting a canonical solution, and a function
  named like an entry point are dropped; an unrelated prompt is kept."""
  first = humaneval[0]
  renamed = first.prompt.replace(first.fields["entry_point"], "close_pairs")
  solution = humaneval[81].fields["canonical_solution"]
  candidates = [
      SourcePrompt("a.py", "close_pairs", renamed),
      SourcePrompt("b.py", "grades", f'def grades(g):\n    """{solution}"""\n'),
      SourcePrompt("c.py", humaneval[5].fields["entry_point"], 'def f(x):\n    """Unrelated."""\n'),
      SourcePrompt("d.py", "file_size", 'def file_size(path):\n    """Return the size in bytes of '
                   'the file at path, following symbolic links."""\n'),
      # Shorter than 13 words: looked for whole (a line of HumanEval/0's solution).
      SourcePrompt("e.py", "gap", "distance = abs(elem - elem2)"),
      SourcePrompt("f.py", "gap", "distance = abs(left - right)"),
  ]
  kept, dropped = corpus.drop_humaneval_overlap(candidates, corpus.humaneval_reference(humaneval))
  assert [p.path for p in kept] == ["d.py", "f.py"]
  assert [p.path for p in dropped] == ["a.py", "b.py", "c.py", "e.py"]


def test_real_package_prompts_left_by_the_filter_contain_no_humaneval_13_words(humaneval):
  """The build's filter over real sources, checked by plain string search: no 13-word window of a
  kept prompt occurs in a HumanEval prompt or solution, and no kept function has an entry point's
  name. The filter had work to do (it dropped some)."""
  prompts = corpus.docstring_prompts(corpus.package_files(["packaging", "jinja2"]))
  kept, dropped = corpus.drop_humaneval_overlap(prompts, corpus.humaneval_reference(humaneval))
  assert dropped and len(kept) > 400
  haystack = "|".join(_normalized(p.prompt) + "|" + _normalized(p.fields["canonical_solution"])
                      for p in humaneval)
  haystack = f" {haystack.replace('|', ' | ')} "
  names = {p.fields["entry_point"] for p in humaneval}
  n = corpus.OVERLAP_NGRAM
  for prompt in kept:
    words = _normalized(prompt.text).split()
    assert prompt.name not in names
    assert not any(f" {' '.join(words[i:i + n])} " in haystack
                   for i in range(len(words) - n + 1)), prompt.name


def test_the_split_follows_the_path_inside_site_packages_not_the_environment():
  a = "/srv/u/.venv/lib/python3.11/site-packages/numpy/linalg/_linalg.py"
  b = "/opt/env/lib/python3.12/site-packages/numpy/linalg/_linalg.py"
  debian = "/usr/lib/python3/dist-packages/numpy/linalg/_linalg.py"
  assert corpus.split_key(a) == corpus.split_key(b) == corpus.split_key(debian) == \
      "numpy/linalg/_linalg.py"
  stdlib = f"{sysconfig.get_paths()['stdlib']}/json/decoder.py"
  assert corpus.split_key(stdlib) == "json/decoder.py"
  keys = [f"/x/site-packages/pkg/m{i}.py" for i in range(2000)]
  held = [corpus.is_held_out(k, 0.05) for k in keys]
  assert held == [corpus.is_held_out(k.replace("/x/", "/y/z/"), 0.05) for k in keys]
  assert 0.03 < sum(held) / len(held) < 0.07


def test_the_mix_draws_the_asked_shares_and_reports_a_shortfall():
  groups = {"doctest": list(range(30)), "docstring": list(range(100, 400)),
            "instruction": list(range(1000, 1300))}
  chosen, report = corpus.mix(groups, {"doctest": 0.4, "docstring": 0.3, "instruction": 0.3}, 200,
                              random.Random(0))
  kinds = [k for k, _ in chosen]
  assert report["doctest"] == {"asked": 80, "used": 30, "available": 30}  # all it has, said so
  assert kinds.count("docstring") == kinds.count("instruction") == 60
  assert all(item in groups[kind] for kind, item in chosen)
  assert len(set(chosen)) == len(chosen)
  with pytest.raises(ValueError, match="over the kinds"):
    corpus.mix(groups, {"docstrings": 1.0}, 10, random.Random(0))
  # Shares rounded by largest remainder add up to the total; one seed, one order.
  many = {kind: list(range(10_000)) for kind in groups}
  for total in (8192, 513, 7):
    drawn, _ = corpus.mix(many, {"doctest": 0.4, "docstring": 0.3, "instruction": 0.3}, total,
                          random.Random("1:gen_train"))
    again, _ = corpus.mix(many, {"doctest": 0.4, "docstring": 0.3, "instruction": 0.3}, total,
                          random.Random("1:gen_train"))
    assert len(drawn) == total and drawn == again


def test_an_instruction_states_the_signature_and_the_documentation():
  prompt = SourcePrompt("e.py", "clamp", 'def clamp(x: float, lo: float = 0.0) -> float:\n'
                        '    """Limit x to [lo, 1].\n\n    >>> clamp(2.0)\n    1.0\n    """\n')
  text = corpus.instruction(prompt)
  assert text.startswith("Write a Python function `clamp(x: float, lo: float=0.0) -> float`.")
  assert "Limit x to [lo, 1]." in text and ">>> clamp(2.0)" in text
  assert corpus.instruction(SourcePrompt("e.py", "C", 'class C:\n    """A class."""\n')) is None

  class NoTemplate:
    chat_template = None

  with pytest.raises(ValueError, match="chat template"):
    corpus.chat_prompt(NoTemplate(), text)


def test_labelling_cut_to_the_rows_lengths_equals_a_full_forward_of_each_row():
  target = tiny_model(seed=3)
  rng = np.random.default_rng(7)
  # A window that is no multiple of the bucket: the longest rows' cut is the window itself.
  sequences = [rng.integers(1, 61, size=n).tolist() for n in (44, 3, 17, 1, 33, 41, 9)]
  tokens, mask = corpus.pack(sequences, window=44, pad_id=0)
  lengths = corpus.row_lengths(mask)
  np.testing.assert_array_equal(lengths, [44, 3, 17, 0, 33, 41, 9])  # a 1-token row predicts nothing
  features, hidden = corpus.label_features(target, tokens, batch_size=3, hidden_layers=(0,),
                                           lengths=lengths, bucket=8)
  assert features.shape == (7, 44, 32) and hidden.shape == (7, 44, 32)
  for row, n in enumerate(lengths):
    out = common.forward(target.config, target.params, tokens[row:row + 1], return_features=True,
                         hidden_layers=(0,))
    np.testing.assert_allclose(features[row, :n], out[2][0, :n], atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(hidden[row, :n], out[3][0, :n], atol=2e-3, rtol=2e-3)
    assert not features[row, n:].any() and not hidden[row, n:].any()


@pytest.mark.parametrize("lengths, bucket", [
    (np.array([3, 4]), 8),                    # not one per row
    (np.array([3, 4, 45, 1, 1, 1, 1]), 8),    # past the window
    (np.array([3.0, 4, 5, 1, 1, 1, 1]), 8),   # not integers
    (np.array([3, 4, 5, 1, 1, 1, 1]), 0),     # no bucket
])
def test_bad_labelling_arguments_are_named(lengths, bucket):
  tokens = np.ones((7, 44), np.int32)
  with pytest.raises(ValueError, match="lengths must be|bucket must be"):
    corpus.label_features(tiny_model(), tokens, batch_size=3, lengths=lengths, bucket=bucket)


def _shard(rng, n, kinds=True, dtype=np.float16):
  arrays = {"tokens": rng.integers(0, 61, (n, 12)).astype(np.int32), "mask": rng.random((n, 12)) < 0.8,
            "features": rng.standard_normal((n, 12, 5)).astype(dtype)}
  if kinds:
    arrays["prompt_kinds"] = rng.integers(0, 3, n).astype(np.int8)
  return arrays


def test_shards_load_as_their_concatenation_and_mixed_kinds_load_by_field(tmp_path):
  rng = np.random.default_rng(11)
  gen = [_shard(rng, n) for n in (4, 7)]
  src = [_shard(rng, 3, kinds=False)]
  for i, arrays in enumerate(gen + src):
    corpus.save_shard(tmp_path / f"s{i}.npz", compress=i == 1, **arrays)
  paths = [tmp_path / f"s{i}.npz" for i in range(3)]
  whole = corpus.load_shards(paths[:2])
  assert sorted(whole) == ["features", "mask", "prompt_kinds", "tokens"]
  for k in whole:
    np.testing.assert_array_equal(whole[k], np.concatenate([g[k] for g in gen]))
    assert whole[k].dtype == gen[0][k].dtype
  mixed = corpus.load_shards(paths, fields=("tokens", "features"))
  assert sorted(mixed) == ["features", "tokens"]
  np.testing.assert_array_equal(mixed["features"],
                                np.concatenate([a["features"] for a in gen + src]))
  with pytest.raises(ValueError, match="the first .*prompt_kinds.*: pass fields="):
    corpus.load_shards(paths)  # a source shard has no prompt_kinds
  with pytest.raises(ValueError, match=r"lacks \['hidden'\]: label the corpus"):
    corpus.load_shards(paths, fields=("tokens", "hidden"))
  for fields in ((), "tokens"):
    with pytest.raises(ValueError, match="pass a sequence of array names"):
      corpus.load_shards(paths, fields=fields)


def test_shards_of_another_dtype_or_window_are_named(tmp_path):
  rng = np.random.default_rng(12)
  corpus.save_shard(tmp_path / "a.npz", **_shard(rng, 3))
  corpus.save_shard(tmp_path / "b.npz", **_shard(rng, 2, dtype=np.float32))
  with pytest.raises(ValueError, match=r"features is float32 of rows \[12, 5\], in .*a.npz float16"):
    corpus.load_shards([tmp_path / "a.npz", tmp_path / "b.npz"])
  short = _shard(rng, 3)
  short["mask"] = short["mask"][:1]  # would broadcast over the 3 rows
  corpus.save_shard(tmp_path / "d.npz", **short)
  with pytest.raises(ValueError, match="mask has 1 rows, its tokens 3"):
    corpus.load_shards([tmp_path / "a.npz", tmp_path / "d.npz"])
  other = _shard(rng, 2)
  other["tokens"] = other["tokens"][:, :8]
  corpus.save_shard(tmp_path / "c.npz", **other)
  with pytest.raises(ValueError, match="window length"):
    corpus.load_shards([tmp_path / "a.npz", tmp_path / "c.npz"])
