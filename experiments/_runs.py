"""Interrupted runs: `--resume` and `--overwrite`, the settings a run is made with, and its records on
disk (docs/design.md, "Interrupted runs").

A script that writes results records the settings it runs with (every flag of its own and of the shared
modules, less where it writes) in its summary or JSON file before it decodes anything. Rerun into the same
place:

* without ``--resume`` or ``--overwrite``, a non-empty output is refused before any model loads;
* with ``--resume``, the settings on disk must equal the new ones (the differences are named otherwise),
  and what is on disk is kept: records of finished sequences (``experiments.generate``) or finished runs
  (the paper's experiments), so that only what is missing is decoded;
* with ``--overwrite``, the old output is replaced.

Records are JSON lines appended and fsynced one by one (:class:`RecordsFile`); a line cut short by a
kill is dropped on resume (its sequence was in flight), any other damage is an error naming the line.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Iterable

from absl import flags
from absl import logging

from experiments import _io

RESUME = flags.DEFINE_bool(
    "resume", False, "Complete an interrupted run: keep what the output already holds (refused if it "
    "was made with other settings, which are named) and decode only what is missing.")
OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace an existing non-empty output (without it, and without --resume, a "
    "rerun into an existing output is refused before anything loads).")

flags.register_multi_flags_validator(
    ["resume", "overwrite"], lambda f: not (f["resume"] and f["overwrite"]),
    message="--resume keeps what the output holds and --overwrite replaces it: give one of them")

# Flags that say where a run writes or how it is launched, not what it measures.
NOT_SETTINGS = frozenset({
    "output", "summary_json", "results_dir", "resume", "overwrite", "compilation_cache_dir",
    "coordinator_address", "num_processes", "process_id", "summary_every"})


class RunError(ValueError):
  """A rerun that cannot go ahead; the message names the file, the difference and the fix."""


def settings(*modules: str) -> dict[str, Any]:
  """The values of every flag that ``modules`` (by ``__name__``) and ``experiments._io`` define, less
  :data:`NOT_SETTINGS`: what a resumed run must share with the run it completes."""
  values = {}
  for module in (*modules, _io.__name__):
    for flag in flags.FLAGS.get_flags_for_module(module):
      if flag.name not in NOT_SETTINGS:
        values[flag.name] = _CANONICAL.get(flag.name, lambda v: v)(flag.value)
  return dict(sorted(values.items()))


# Settings written in more than one way, in the one form a resumed run compares.
_CANONICAL = {"draft_tree": _io.canonical_tree_shapes}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  """``--name: <old> on disk, <new> now`` for every setting that differs (JSON round trip: lists and
  tuples compare equal)."""
  new = json.loads(json.dumps(new))
  return [f"--{k}: {old.get(k)!r} on disk, {new.get(k)!r} now"
          for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def check_settings(path: pathlib.Path, stored: Any, current: dict[str, Any]) -> None:
  """Refuses to resume ``path`` unless ``stored`` (its recorded settings) equal ``current``.

  A setting absent from ``stored`` that is at its flag's default now counts as equal (a flag added
  since the run was written).

  Raises:
    RunError: no settings on disk, or settings that differ (each named, with both values).
  """
  if not isinstance(stored, dict):
    raise RunError(f"--resume: {path} records no settings (written before runs could be resumed?); "
                   "rerun with --overwrite, or into another output")
  stored = dict(stored)
  for name, canonical in _CANONICAL.items():  # a run written before the canonical form existed
    if name in stored:
      try:
        stored[name] = canonical(stored[name])
      except (TypeError, ValueError):
        pass  # not a valid value: it differs, and is named as it is
  # A setting added since that run was written reads as its default there (a newer flag, unchanged).
  for name, value in current.items():
    if name not in stored and name in flags.FLAGS and value == flags.FLAGS[name].default:
      stored[name] = value
  diff = differences(stored, current)
  if diff:
    raise RunError(f"--resume: {path} was made with other settings: {'; '.join(diff)}. Rerun with "
                   "those settings, or with --overwrite to replace it")


def refuse_existing(path: pathlib.Path, what: str) -> None:
  """The one rule for a rerun into an existing output: with neither ``--resume`` nor ``--overwrite``,
  a non-empty ``path`` is refused.

  Raises:
    RunError: ``path`` exists, is not empty, and neither flag is set.
  """
  if RESUME.value or OVERWRITE.value:
    return
  if path.exists() and path.stat().st_size > 0:
    raise RunError(f"{path} already holds {what}; pass --resume to complete that run, --overwrite to "
                   "replace it, or write elsewhere")


def check_distinct(**paths: pathlib.Path | None) -> None:
  """Output paths given by ``flag=path`` must differ (one file would silently replace the other).

  Raises:
    RunError: two flags name the same file.
  """
  seen: dict[pathlib.Path, str] = {}
  for flag, path in paths.items():
    if path is None:
      continue
    key = path.absolute()
    if key in seen:
      raise RunError(f"--{seen[key]} and --{flag} are the same file ({path}); give them different "
                     "paths")
    seen[key] = flag


def read_json(path: pathlib.Path) -> Any:
  """``path``'s JSON, or None when it does not exist.

  Raises:
    RunError: the file is not valid JSON (named).
  """
  if not path.exists():
    return None
  try:
    return json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RunError(f"{path} is not valid JSON ({e}); move it away or pass --overwrite") from e


class RecordsFile:
  """A run's records: JSON lines, one per finished sequence, appended as they come.

  Each :meth:`append` writes whole lines and fsyncs, so a kill loses at most a line being written,
  which :meth:`read` drops (that sequence was in flight). Only process 0 of a multi-process run writes.
  """

  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)
    self._file = None

  def read(self, key) -> dict[Any, dict[str, Any]]:
    """The records on disk by ``key(record)``, dropping a last line cut short by a kill (the file is
    rewritten without it).

    Raises:
      RunError: a line other than the last that is not a JSON object, a record ``key`` rejects, or two
        records of one sequence (``file:line`` named).
    """
    if not self.path.exists():
      return {}
    text = self.path.read_text()
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # tail: what follows the last newline ('' when whole)
    records: dict[Any, dict[str, Any]] = {}
    for n, line in enumerate(complete, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        name = key(record)
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise RunError(f"{self.path}:{n}: not a record of this script ({e}); move the file away or "
                       "pass --overwrite") from e
      if name in records:
        raise RunError(f"{self.path}:{n}: a second record of {name}; the file mixes runs: move it "
                       "away or pass --overwrite")
      records[name] = record
    if tail:  # keep only whole lines
      logging.warning("%s: dropped a last line cut short (%d bytes; its sequence was in flight)",
                      self.path, len(tail))
      _io.write_text_atomic(self.path, "".join(l + "\n" for l in complete if l.strip()))
    return records

  def open(self, *, append: bool) -> "RecordsFile":
    """Opens for writing: ``append`` keeps the records on disk (a resumed run), else the file starts
    empty."""
    if _io.is_primary():
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._file = open(self.path, "a" if append else "w")  # pylint: disable=consider-using-with
    return self

  def append(self, record: dict[str, Any]) -> None:
    """Writes one record as a line, flushed and fsynced."""
    if self._file is None:
      return
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None

  def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
    """Replaces the file atomically with ``records`` (a finished run's, in plan order, so that a
    resumed run's file reads like an uninterrupted one's)."""
    self.close()
    _io.write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records))

  def __enter__(self) -> "RecordsFile":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
