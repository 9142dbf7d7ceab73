r"""Decode speed of this checkout against another commit, side by side in one run.

    python -m experiments.benchmarks.ab_commits --baseline=f18e40c --repeats=2 \
        --settings=configs/ab_settings.txt --results_dir=results

A regression check for changes that should not slow any setting down (issue 27: "no setting slower
than today's commit in one run"). The baseline commit is checked out into a temporary git worktree;
every setting runs ``python -m experiments.generate`` once per repeat in each tree, as separate
processes in alternating order (baseline first on even repeats, this checkout first on odd ones), so
that the shared machine's load falls on both alike. Each process reports the per-token latency per
sequence (All, ms/token, compilation excluded: ``bass_jax.evaluation.experiment.run_problems``); the table gives
each side's median over the repeats and their ratio. Both trees run with this checkout's virtual
environment, whose packages they must share: a baseline whose ``experiments.generate`` lacks one of
a setting's flags fails that setting with its own error message.

A settings file holds one setting per line, ``name: flags`` (flags as ``experiments.generate`` takes
them; a name of letters, digits, ``_``, ``.`` and ``-``); a word that starts with ``#`` starts a
comment.

Relative paths in the flags (``--flagfile=configs/...``) and the shipped drafts' aliases resolve inside
each tree, so each side decodes with its own commit's flag files and draft weights. Where those
differ between the commits the comparison mixes a draft's acceptance into the decode's speed: the
result names the differing paths under ``differs`` and the log warns. Results are rewritten after
every setting, so a failed setting keeps the ones before it. A run killed before it cleans up leaves
a registered worktree in the temporary directory: ``git worktree prune`` forgets it.
"""

from __future__ import annotations

import json
import os
import re
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

from bass_jax.evaluation import reproduce
from experiments import _io

_BASELINE = flags.DEFINE_string("baseline", None, "The commit to compare against (any git revision).",
                                required=True)
_SETTINGS = flags.DEFINE_string("settings", "configs/ab_settings.txt", "The settings file.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each setting in each tree.", lower_bound=1)
_RESULTS = flags.DEFINE_string("results_dir", None, "Write ab_commits.json and ab_commits.md here "
                               "(default: a fresh outputs/ab_commits-<time>/).")

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _words(line: str) -> list[str]:
  """A line's shell words up to the first one that starts with ``#`` (a ``#`` inside a word, as in
  ``--prompts=a#b.jsonl``, is kept)."""
  words = shlex.split(line)
  return words[:next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]


def read_settings(path: pathlib.Path) -> list[tuple[str, list[str]]]:
  """``[(name, flags)]`` from a settings file (module docstring).

  Raises:
    ValueError: a line without ``name:``, a repeated name, a ``--output``/``--summary_json`` flag
      (this script sets both), or no setting at all.
  """
  settings = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    try:
      words = _words(line)
    except ValueError as e:  # shlex: an unclosed quote
      raise ValueError(f"{path}:{number}: {e}") from e
    line = shlex.join(words)
    name, sep, rest = line.partition(":")
    if not sep or not re.fullmatch(r"[\w.][\w.-]*", name.strip()):
      raise ValueError(f"{path}:{number}: write a setting as 'name: --flag=value ...' (a name of "
                       f"letters, digits, _ . -), got {line.strip()!r}")
    args = shlex.split(rest)
    if any(a.startswith(("--output", "--summary_json")) for a in args):
      raise ValueError(f"{path}:{number}: leave --output and --summary_json out; this script sets them")
    settings.append((name.strip(), args))
  names = [n for n, _ in settings]
  if len(set(names)) != len(names):
    raise ValueError(f"{path}: setting names repeat: {names}")
  if not settings:
    raise ValueError(f"{path} holds no setting")
  return settings


def _decode(tree: pathlib.Path, args: list[str], scratch: pathlib.Path) -> float:
  """One ``experiments.generate`` process in ``tree``; its All latency in ms/token."""
  summary = scratch / "summary.json"
  summary.unlink(missing_ok=True)  # a run that writes none must not report the previous run's number
  command = [sys.executable, "-m", "experiments.generate", *args, f"--output={scratch / 'records.jsonl'}",
             f"--summary_json={summary}", "--overwrite"]
  # `python -m` puts the working directory first on sys.path: the tree's own bass_jax is imported,
  # not the one this environment has installed in editable mode.
  env = {**os.environ, "PYTHONPATH": str(tree)}
  done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"in {tree}: {shlex.join(command)} failed:\n{done.stderr[-3000:]}")
  return float(json.loads(summary.read_text())["ms_per_token_all"])


def _table(rows: list[dict]) -> str:
  lines = ["| setting | baseline ms/token (All) | this checkout | this / baseline |",
           "|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['setting']} | {', '.join(f'{x:.1f}' for x in r['baseline_ms'])} | "
                 f"{', '.join(f'{x:.1f}' for x in r['head_ms'])} | {r['ratio_of_medians']:.3f} |")
  return "\n".join(lines)


def main(argv):
  del argv
  _io.init_script()
  try:
    settings = read_settings(pathlib.Path(_SETTINGS.value))
  except (OSError, ValueError) as e:
    raise app.UsageError(str(e)) from e
  out_dir = _io.run_directory(_RESULTS.value, "ab_commits")
  baseline = subprocess.run(["git", "rev-parse", "--verify", f"{_BASELINE.value}^{{commit}}"],
                            cwd=_ROOT, capture_output=True, text=True, check=False)
  if baseline.returncode:
    raise app.UsageError(f"--baseline={_BASELINE.value} is not a commit of this repository")
  base_rev = baseline.stdout.strip()
  head_rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
  dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip())
  inputs = ["bass_jax/drafts"] + [a.split("=", 1)[1] for _, args in settings for a in args
                                             if a.startswith("--flagfile=")]
  differs = subprocess.run(["git", "diff", "--name-only", base_rev, "--", *sorted(set(inputs))],
                           cwd=_ROOT, capture_output=True, text=True, check=False).stdout.split()
  if differs:
    logging.warning("the trees' drafts or flag files differ, so each side decodes with its own: %s",
                    differs)
  result = {"baseline": base_rev, "head": head_rev, "head_has_uncommitted_changes": dirty,
            "differs": differs, "repeats": _REPEATS.value, "settings_file": _SETTINGS.value,
            "rows": [], "complete": False, **reproduce.machine()}
  rows = result["rows"]
  with tempfile.TemporaryDirectory(prefix="ab_commits-") as tmp:
    worktree = pathlib.Path(tmp) / "baseline"
    added = subprocess.run(["git", "worktree", "add", "--detach", str(worktree), base_rev], cwd=_ROOT,
                           capture_output=True, text=True, check=False)
    if added.returncode:
      raise app.UsageError(f"git worktree add failed: {added.stderr.strip()}")
    try:
      trees = {"baseline": worktree, "head": _ROOT}
      for name, args in settings:
        times = {"baseline": [], "head": []}
        for repeat in range(_REPEATS.value):
          order = ("baseline", "head") if repeat % 2 == 0 else ("head", "baseline")
          for side in order:
            times[side].append(_decode(trees[side], args, pathlib.Path(tmp)))
            logging.info("%s, %s, run %d: %.1f ms/token", name, side, repeat, times[side][-1])
        rows.append({"setting": name, "flags": args, "baseline_ms": times["baseline"],
                     "head_ms": times["head"],
                     "ratio_of_medians": statistics.median(times["head"]) /
                                         statistics.median(times["baseline"])})
        print(_table(rows[-1:]).splitlines()[-1], flush=True)
        _io.write_json_atomic(out_dir / "ab_commits.json", result)
    finally:
      subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=_ROOT,
                     capture_output=True, check=False)
  result["complete"] = True
  _io.write_json_atomic(out_dir / "ab_commits.json", result)
  text = (f"Baseline {base_rev[:10]} against {head_rev[:10]}"
          f"{' (with uncommitted changes)' if dirty else ''}, {_REPEATS.value} alternating runs each, "
          f"`python -m experiments.benchmarks.ab_commits --baseline={_BASELINE.value} --settings={_SETTINGS.value}"
          f" --repeats={_REPEATS.value}`"
          + (f"; drafts or flag files differ between the trees: {', '.join(differs)}" if differs else "")
          + f"\n\n{_table(rows)}\n")
  _io.write_text_atomic(out_dir / "ab_commits.md", text)
  print(text)


if __name__ == "__main__":
  _io.run(main)
