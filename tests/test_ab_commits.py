"""The settings file of experiments.benchmarks.ab_commits (the cross-commit regression check)."""

import pathlib

import pytest

from experiments.benchmarks import ab_commits

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_settings_are_named_flag_lists_and_comments_are_dropped(tmp_path):
  path = tmp_path / "s.txt"
  path.write_text("# a comment\n\nfast: --batch_size=1 --prompts='a b.jsonl'  # trailing\n"
                  "slow:--method=regular\n")
  assert ab_commits.read_settings(path) == [
      ("fast", ["--batch_size=1", "--prompts=a b.jsonl"]), ("slow", ["--method=regular"])]


@pytest.mark.parametrize("text, message", [
    ("--batch_size=1\n", "name: --flag"),
    ("a: --x=1\na: --x=2\n", "names repeat"),
    ("a: --output=o.jsonl\n", "leave --output"),
    ("# nothing\n", "holds no setting"),
])
def test_bad_settings_are_named(tmp_path, text, message):
  path = tmp_path / "s.txt"
  path.write_text(text)
  with pytest.raises(ValueError, match=message):
    ab_commits.read_settings(path)


def test_the_shipped_settings_parse_into_distinct_settings():
  settings = ab_commits.read_settings(ROOT / "configs" / "ab_settings.txt")
  assert len(settings) >= 4 and all(flags for _, flags in settings)


def test_a_hash_inside_a_word_is_kept_and_a_nameless_line_with_a_colon_is_refused(tmp_path):
  path = tmp_path / "s.txt"
  path.write_text("a: --prompts=x#y.jsonl --draft=hybrid:smollm2-135m-eagle # comment\n")
  assert ab_commits.read_settings(path) == [
      ("a", ["--prompts=x#y.jsonl", "--draft=hybrid:smollm2-135m-eagle"])]
  path.write_text("--draft=hybrid:smollm2-135m-eagle --batch_size=1\n")
  with pytest.raises(ValueError, match="name: --flag"):
    ab_commits.read_settings(path)
