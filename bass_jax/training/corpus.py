"""The distillation corpus for draft models: real Python source and the target's own continuations.

Everything comes from this machine, nothing from a hub or from HumanEval (the evaluation set):

* **Real text**: the Python standard library's own ``.py`` files (``sysconfig``'s ``stdlib`` path, test
  suites and ``site-packages`` excluded), tokenized, joined with EOS, cut into fixed windows.
* **Target continuations**: HumanEval-shaped prompts, one per documented function: its signature and
  docstring, dedented, body removed. They come from the standard library and, for a corpus like the
  use (:data:`DEFAULT_PACKAGES`), from the installed packages' sources too, in three kinds
  (:data:`PROMPT_KINDS`): a docstring with doctest examples (``>>>``, as HumanEval's have), a plain
  docstring, and a natural-language instruction built from the docstring in the target's chat template
  (:func:`instruction`). Every prompt sharing a 13-word sequence or a function name with HumanEval's
  prompts and solutions is dropped (:func:`drop_humaneval_overlap`). The target continues each
  greedily, so the draft learns what the target *does* after such a prompt (the distribution BASS
  verifies), not only what human code looks like.

Every window is then labelled by one batched target forward, with either the target's top-k
log-probabilities at each position (the soft labels of distillation, for an independent draft) or its
*features* at each position (the LM head's input, for an EAGLE-style feature draft:
``bass_jax.models.eagle``; the target's distribution is then ``softmax(head(feature))``, computed in
training on the draft's vocabulary). Files are split into train and held-out sets by a hash of
their path, so evaluation prompts come from files the draft never saw.

Shards are ``.npz`` files with ``tokens i32[N, T]``, ``mask bool[N, T]`` (positions that carry a label),
``topk_ids i32[N, T, k]`` and ``topk_logprobs f16[N, T, k]`` (log-softmax of the target's logits at
temperature 1, so ``1 - sum(exp)`` is the mass outside the top k) or ``features f16[N, T, E]`` (with
``hidden f16[N, T, n * D]``, the outputs of n chosen decoder layers, for EAGLE-3's fused features);
features and hidden states are 0 past a row's real tokens (:func:`row_lengths`), which no loss reads;
continuation shards also hold ``prompt_lens i32[N]`` (where the target's own tokens start) and
``prompt_kinds i8[N]`` (indices into :data:`PROMPT_KINDS`). A token-only corpus (``labels=none``) has
``tokens`` and ``mask`` alone, compressed, for a later labelling pass.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import random
import re
import sysconfig
import textwrap
from typing import Any, Iterable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.models.common import forward as model_forward

_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
HELD_OUT_FRACTION = 0.05  # the share of stdlib files held out of training (build_corpus's default)
# Installed packages whose documented functions become prompts (build_corpus --prompt_sources=packages):
# numerical and symbolic code with many doctests, and the ML stack this project runs on. All are
# installed by `make` (dependencies of the package and its extras); their versions go to the manifest.
DEFAULT_PACKAGES = ("numpy", "scipy", "sympy", "networkx", "mpmath", "matplotlib", "dateutil", "jax",
                    "flax", "optax", "transformers", "torch", "fontTools", "packaging", "jinja2",
                    "click")
# The kinds of prompt a continuation starts from (module docstring).
PROMPT_KINDS = ("doctest", "docstring", "instruction")
# Word n-grams shared with HumanEval that make a prompt overlap it (GPT-3's contamination check, 13).
OVERLAP_NGRAM = 13


@dataclasses.dataclass(frozen=True)
class SourcePrompt:
  """A HumanEval-shaped prompt: a function's signature and docstring (``text``), and where it is from."""

  path: str
  name: str
  text: str


def stdlib_files() -> list[pathlib.Path]:
  """The standard library's Python files on this interpreter, sorted (test suites excluded)."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = [p for p in root.rglob("*.py")
           if not _EXCLUDED_DIRS.intersection(p.relative_to(root).parts)]
  return sorted(files)


def package_files(packages: Sequence[str]) -> list[pathlib.Path]:
  """The ``.py`` files of installed packages (found by import name, never imported), sorted, test
  suites excluded.

  Raises:
    ValueError: a package that is not installed (named).
  """
  files = []
  for name in packages:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
      raise ValueError(f"package {name!r} is not installed (or is a single module); choose among the "
                       f"installed ones, e.g. {DEFAULT_PACKAGES}")
    for root in map(pathlib.Path, spec.submodule_search_locations):
      files += [p for p in root.rglob("*.py")
                if not _EXCLUDED_DIRS.intersection(p.relative_to(root).parts)]
  return sorted(set(files))


def package_versions(packages: Sequence[str]) -> dict[str, str]:
  """``{import name: installed version}`` (what a corpus built from their sources depends on)."""
  dists = importlib.metadata.packages_distributions()
  versions = {}
  for name in packages:
    dist = (dists.get(name) or [name])[0]
    try:
      versions[name] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = "unknown"
  return versions


def split_key(path: str | pathlib.Path) -> str:
  """The name a file is split by: relative to the ``site-packages`` (or Debian's ``dist-packages``)
  directory that holds it (``numpy/linalg/_linalg.py``), else to the standard library, so the split
  does not depend on where the interpreter or the virtual environment lives."""
  path = pathlib.Path(path)
  parts = path.parts
  for i in range(len(parts) - 1, -1, -1):  # the innermost packages directory
    if parts[i] in ("site-packages", "dist-packages"):
      return str(pathlib.Path(*parts[i + 1:]))
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def is_held_out(path: str | pathlib.Path, fraction: float) -> bool:
  """Deterministic train / held-out split by a hash of the file's :func:`split_key`."""
  digest = int(hashlib.sha256(split_key(path).encode()).hexdigest()[:8], 16)
  return digest / 0xFFFFFFFF < fraction


def docstring_prompts(files: Iterable[pathlib.Path]) -> list[SourcePrompt]:
  """One prompt per documented function: ``def …:`` through the end of its docstring, dedented.

  Files that do not parse (the stdlib holds a few deliberately broken ones) are skipped.
  """
  prompts = []
  for path in files:
    try:
      source = path.read_text(encoding="utf-8")
      tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
        continue
      doc = node.body[0]
      if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
              and isinstance(doc.value.value, str)):
        continue
      start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
      text = textwrap.dedent("".join(lines[start:doc.end_lineno]))
      prompts.append(SourcePrompt(str(path), node.name, text))
  return prompts


def prompt_kind(prompt: SourcePrompt) -> str:
  """``"doctest"`` when the docstring holds an interactive example (``>>>``), else ``"docstring"``."""
  return "doctest" if ">>>" in prompt.text else "docstring"


def instruction(prompt: SourcePrompt) -> str | None:
  """A natural-language task built from a docstring prompt: ``Write a Python function `name(args)`
  ...`` followed by the docstring's text (its examples included), as a user would ask; None when the
  prompt does not parse as one function."""
  try:
    node = ast.parse(prompt.text + "\n    pass\n").body[0]
  except (SyntaxError, IndexError):
    return None
  if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
    return None
  doc = ast.get_docstring(node)
  if not doc:
    return None
  returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
  return (f"Write a Python function `{node.name}({ast.unparse(node.args)}){returns}`. "
          f"Its documentation:\n\n{doc}")


def chat_prompt(tokenizer, text: str) -> str:
  """``text`` as one user turn in the tokenizer's chat template, with the assistant's turn opened.

  Raises:
    ValueError: a tokenizer without a chat template.
  """
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("instruction prompts need a tokenizer with a chat template; drop 'instruction' "
                     "from the mix for this target")
  return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)


def _words(text: str) -> list[str]:
  return re.findall(r"\w+", text.lower())


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
  return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@dataclasses.dataclass(frozen=True)
class HumanEvalReference:
  """What :func:`drop_humaneval_overlap` checks against (:func:`humaneval_reference`).

  Attributes:
    grams: the word n-grams (:data:`OVERLAP_NGRAM`) of HumanEval's prompts and canonical solutions.
    text: the same texts' words, lower-cased, one space apart, texts separated by ``" | "`` (where a
      prompt too short to hold an n-gram is looked for whole).
    names: the entry points' function names.
  """

  grams: frozenset
  text: str
  names: frozenset


def humaneval_reference(problems: Iterable[Any]) -> HumanEvalReference:
  """:class:`HumanEvalReference` of ``problems``, the ``bass_jax.evaluation.data.Problem`` s of
  ``load_problems("humaneval")``."""
  grams, texts, names = set(), [], set()
  for problem in problems:
    fields = getattr(problem, "fields", {}) or {}
    for text in (problem.prompt, fields.get("canonical_solution", "")):
      words = _words(text)
      grams |= _ngrams(words, OVERLAP_NGRAM)
      texts.append(" ".join(words))
    if fields.get("entry_point"):
      names.add(fields["entry_point"])
  return HumanEvalReference(frozenset(grams), f" {' | '.join(texts)} ", frozenset(names))


def overlaps_humaneval(text: str, name: str | None, reference: HumanEvalReference) -> bool:
  """Whether ``text`` shares a word n-gram (:data:`OVERLAP_NGRAM`) with HumanEval, or is shorter than
  one and occurs in it whole, or ``name`` is an entry point's."""
  words = _words(text)
  if name in reference.names:
    return True
  if len(words) < OVERLAP_NGRAM:
    return bool(words) and f" {' '.join(words)} " in reference.text
  return bool(_ngrams(words, OVERLAP_NGRAM) & reference.grams)


def drop_humaneval_overlap(prompts: Sequence[SourcePrompt], reference: HumanEvalReference
                           ) -> tuple[list[SourcePrompt], list[SourcePrompt]]:
  """Splits ``prompts`` into ``(kept, dropped)``: a prompt is dropped when it overlaps HumanEval's
  prompts or solutions (:func:`overlaps_humaneval`, on its text and its function's name)."""
  kept, dropped = [], []
  for prompt in prompts:
    (dropped if overlaps_humaneval(prompt.text, prompt.name, reference) else kept).append(prompt)
  return kept, dropped


def mix(groups: Mapping[str, Sequence[Any]], weights: Mapping[str, float], total: int,
        rng: random.Random) -> tuple[list[tuple[str, Any]], dict[str, dict[str, int]]]:
  """``total`` items drawn from ``groups`` in the proportions ``weights`` (each group shuffled, then
  the kinds interleaved in a shuffled order; the shares rounded by largest remainder, so they add up
  to ``total``).

  A group with fewer items than its share gives all it has; the shortfall is reported, not refilled
  from the others, so the mix stays what was asked or says it is not.

  Returns:
    ``([(kind, item)], {kind: {"asked": n, "used": m, "available": a}})``.

  Raises:
    ValueError: a weight for a group that does not exist, a negative weight or all weights zero.
  """
  unknown = set(weights) - set(groups)
  if unknown or any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
    raise ValueError(f"mix weights {dict(weights)} must be >= 0, not all zero, over the kinds "
                     f"{sorted(groups)}")
  norm = sum(weights.values())
  exact = {kind: total * weights[kind] / norm for kind in sorted(weights)}
  shares = {kind: int(x) for kind, x in exact.items()}
  by_remainder = sorted(exact, key=lambda kind: (shares[kind] - exact[kind], kind))
  for kind in by_remainder[:total - sum(shares.values())]:
    shares[kind] += 1
  chosen, report = [], {}
  for kind in sorted(weights):
    items = list(groups[kind])
    rng.shuffle(items)
    asked = shares[kind]
    chosen += [(kind, item) for item in items[:asked]]
    report[kind] = {"asked": asked, "used": min(asked, len(items)), "available": len(items)}
  rng.shuffle(chosen)
  return chosen, report


def source_windows(files: Iterable[pathlib.Path], tokenizer, *, window: int,
                   eos_id: int) -> np.ndarray:
  """The files' tokens joined with EOS and cut into ``i32[N, window]`` (the ragged tail dropped)."""
  stream: list[int] = []
  for path in files:
    try:
      text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
      continue
    stream.extend(tokenizer(text).input_ids)
    stream.append(eos_id)
  usable = len(stream) // window * window
  return np.asarray(stream[:usable], np.int32).reshape(-1, window)


def pack(sequences: Sequence[Sequence[int]], *, window: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads sequences (each cut to ``window``) into ``tokens i32[N, window]`` and ``mask bool[N, window]``.

  ``mask[n, t]`` is True where position t predicts a real next token, i.e. ``t < len - 1``.
  """
  tokens = np.full((len(sequences), window), pad_id, np.int32)
  mask = np.zeros((len(sequences), window), bool)
  for i, seq in enumerate(sequences):
    seq = list(seq)[:window]
    tokens[i, :len(seq)] = seq
    mask[i, :max(len(seq) - 1, 0)] = True
  return tokens, mask


def _topk_impl(params, tokens, config, k):
  logits, _ = config.make_module().apply({"params": params}, tokens)
  values, ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), k)
  return ids.astype(jnp.int32), values


def label_topk(target, tokens: np.ndarray, *, k: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """The target's top-k log-probabilities for ``tokens: i32[N, T]``, batch by batch.

  Yields ``(ids i32[b, T, k], logprobs f16[b, T, k])`` for consecutive batches of rows (the last batch
  is padded to ``batch_size`` for one compiled shape, and trimmed).
  """
  fn = jax.jit(_topk_impl, static_argnums=(2, 3))
  for start in range(0, len(tokens), batch_size):
    chunk = tokens[start:start + batch_size]
    padded = np.zeros((batch_size, tokens.shape[1]), np.int32)
    padded[:len(chunk)] = chunk
    ids, values = fn(target.params, jnp.asarray(padded), target.config, k)
    yield np.asarray(ids)[:len(chunk)], np.asarray(values, np.float16)[:len(chunk)]


def _features_impl(params, tokens, config, hidden_layers):
  out = model_forward(config, params, tokens, compute_logits=False, return_features=True,
                      hidden_layers=hidden_layers)
  return tuple(x.astype(jnp.float16) for x in out[2:])


def label_features(target, tokens: np.ndarray, *, batch_size: int, hidden_layers: tuple[int, ...] = (),
                   lengths: np.ndarray | None = None, bucket: int = 32) -> tuple[np.ndarray, ...]:
  """The target's features (its LM head's input) for ``tokens: i32[N, T]``.

  A causal target's features at positions ``< t`` do not depend on the tokens from ``t`` on, so with
  ``lengths`` each forward runs only as far as its rows need: rows are labelled in order of length and
  each batch is cut to its longest row, rounded up to a multiple of ``bucket`` (a few compiled
  widths). The forwards are as many as without ``lengths``, only narrower: on the docstring corpus's
  continuations (two thirds of a window on average) they cover about three quarters of the positions
  at ``bucket=32`` and ``batch_size=8``. Positions at or past a row's length are 0 in the output.

  Args:
    batch_size: rows per forward (the last batch is padded to it: one compiled shape per width).
    hidden_layers: also label the outputs of these decoder layers (``common.forward``'s).
    lengths: ``int[N]``, the leading positions of each row whose features are needed (from the
      corpus's mask: :func:`row_lengths`); None labels every position of every row.
    bucket: the granularity of the cut widths, >= 1.

  Returns:
    ``(features f16[N, T, E],)``, or with ``hidden_layers`` ``(features, hidden f16[N, T, n * D])``,
    in the rows' input order. Stored in float16 to halve the corpus (the draft reads them in its
    compute dtype).

  Raises:
    ValueError: ``lengths`` not integers of shape ``[N]`` in ``[0, T]``, or ``bucket < 1``.
  """
  n, width = tokens.shape
  lengths = np.full(n, width) if lengths is None else np.asarray(lengths)
  if (lengths.shape != (n,) or not np.issubdtype(lengths.dtype, np.integer)
      or lengths.min(initial=0) < 0 or lengths.max(initial=0) > width):
    raise ValueError(f"lengths must be {n} integers in [0, {width}] (corpus.row_lengths(mask)), got "
                     f"shape {lengths.shape}, dtype {lengths.dtype}, range [{lengths.min(initial=0)}, "
                     f"{lengths.max(initial=0)}]")
  if bucket < 1:
    raise ValueError(f"bucket must be >= 1, got {bucket}")
  fn = jax.jit(_features_impl, static_argnums=(2, 3))
  outputs = None
  order = np.argsort(lengths, kind="stable")
  for start in range(0, n, batch_size):
    rows = order[start:start + batch_size]
    cut = min(width, max(bucket, -(-int(lengths[rows].max()) // bucket) * bucket))
    padded = np.zeros((batch_size, cut), np.int32)
    padded[:len(rows)] = tokens[rows, :cut]
    host = [np.asarray(x) for x in fn(target.params, jnp.asarray(padded), target.config,
                                      tuple(hidden_layers))]
    if outputs is None:
      outputs = tuple(np.zeros((n, width, x.shape[-1]), np.float16) for x in host)
    for out, x in zip(outputs, host):
      for i, row in enumerate(rows):
        out[row, :lengths[row]] = x[i, :lengths[row]]
  return outputs


def row_lengths(mask: np.ndarray) -> np.ndarray:
  """``i32[N]``: the real tokens of each row of a corpus ``mask bool[N, T]`` (:func:`pack`'s: a row of
  n tokens has ``mask[:n - 1]`` set), the positions whose features a draft can read; 0 for a row with
  no label.

  Raises:
    ValueError: ``mask`` not two-dimensional.
  """
  if mask.ndim != 2:
    raise ValueError(f"mask must be [N, T], got shape {mask.shape}")
  last = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
  return np.where(mask.any(axis=1), np.minimum(last + 1, mask.shape[1]), 0).astype(np.int32)


def check_hidden_layers(corpus_dir: str | os.PathLike, layers: Sequence[int]) -> None:
  """Refuses a corpus whose stored hidden layers are not the ``layers`` an EAGLE draft reads (a fused
  draft's ``fused_layers``, an EAGLE-3 draft's taps: ``EagleConfig.target_taps``).

  Raises:
    ValueError: ``layers`` is not empty and the corpus's ``manifest.json`` records other (or no)
      ``hidden_layers``; the message says how to relabel.
  """
  if not layers:
    return
  manifest = pathlib.Path(corpus_dir) / "manifest.json"
  stored = json.loads(manifest.read_text()).get("hidden_layers") if manifest.exists() else None
  if stored != list(layers):
    raise ValueError(f"the draft reads target layers {list(layers)} but {manifest} records "
                     f"hidden_layers {stored}: "
                     "relabel with `python -m experiments.build_corpus --relabel_from=... "
                     f"--labels=features --hidden_layers={','.join(map(str, layers))}`")


def save_shard(path: pathlib.Path, compress: bool = False, **arrays: np.ndarray) -> None:
  """Writes one shard atomically (a partial file never has the final name); ``compress``: zip-deflated
  (token-id shards, a fraction of their raw size; labels barely compress)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp.npz")
  (np.savez_compressed if compress else np.savez)(tmp, **arrays)
  tmp.replace(path)


def load_shards(paths: Sequence[pathlib.Path], fields: Sequence[str] | None = None
                ) -> dict[str, np.ndarray]:
  """Concatenates shards along the example axis, in one copy (the peak is the result and one shard).

  Args:
    paths: ``.npz`` shards (``save_shard``'s). fields: the arrays to load (default: all, and every
      shard must hold the same ones); with ``fields``, shards of different kinds (continuations with
      ``prompt_kinds``, source windows without) load together.

  Raises:
    FileNotFoundError: no shard given. ValueError: shards with different keys, a shard without one of
      ``fields``, or different window lengths, shapes or dtypes.
  """
  if not paths:
    raise FileNotFoundError("no corpus shards found; build them with experiments/build_corpus.py")
  if isinstance(fields, str) or (fields is not None and not fields):
    raise ValueError(f"load_shards: fields={fields!r}; pass a sequence of array names, e.g. "
                     "('tokens', 'mask', 'features')")
  # Keys and row counts first, then each shard copied into its place: the peak is the corpus plus one
  # array of one shard, not twice the corpus (a corpus with three taps holds 4.6 KB per position).
  headers = []
  for path in paths:
    with np.load(path) as shard:
      if "tokens" not in shard.files:
        raise ValueError(f"shard {path} holds no tokens: not a build_corpus shard")
      headers.append((set(shard.files), shard["tokens"].shape))
  keys = set(fields) if fields is not None else headers[0][0]
  for path, (held, _) in zip(paths, headers):
    if fields is None and held != keys:
      raise ValueError(f"shard {path} holds {sorted(held)}, the first {sorted(keys)}: pass fields= to "
                       "load shards of different kinds (continuations and source windows) together")
    if not keys <= held:
      raise ValueError(f"shard {path} lacks {sorted(keys - held)}: label the corpus with them "
                       "(build_corpus --labels, --hidden_layers)")
  if len({shape[1] for _, shape in headers}) != 1:
    raise ValueError(f"shards {paths} disagree on the window length")
  total = sum(shape[0] for _, shape in headers)
  out, start = {}, 0
  for path, (_, shape) in zip(paths, headers):
    with np.load(path) as shard:
      for k in keys:
        x = shard[k]
        if k not in out:
          out[k] = np.empty((total,) + x.shape[1:], x.dtype)
        if len(x) != shape[0]:
          raise ValueError(f"shard {path}: {k} has {len(x)} rows, its tokens {shape[0]}")
        if out[k].shape[1:] != x.shape[1:] or out[k].dtype != x.dtype:
          raise ValueError(f"shard {path}: {k} is {x.dtype} of rows {list(x.shape[1:])}, in {paths[0]} "
                           f"{out[k].dtype} of rows {list(out[k].shape[1:])}")
        out[k][start:start + shape[0]] = x
    start += shape[0]
  return {k: out[k] for k in sorted(keys)}
