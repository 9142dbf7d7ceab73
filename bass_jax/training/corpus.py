"""The distillation corpus for draft models: real Python source and the target's own continuations.

Everything comes from this machine, nothing from a hub or from HumanEval (the evaluation set):

* **Real text**: the Python standard library's own ``.py`` files (``sysconfig``'s ``stdlib`` path, test
  suites and ``site-packages`` excluded), tokenized, joined with EOS, cut into fixed windows.
* **Target continuations**: HumanEval-shaped prompts built from the same library, one per documented
  function: its signature and docstring, dedented, body removed. The target continues each greedily,
  so the draft learns what the target *does* after such a prompt (the distribution BASS verifies),
  not only what human code looks like.

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
continuation shards also hold ``prompt_lens i32[N]`` (where the target's own tokens start).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import pathlib
import sysconfig
import textwrap
from typing import Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bass_jax.models.common import forward as model_forward

_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
HELD_OUT_FRACTION = 0.05  # the share of stdlib files held out of training (build_corpus's default)


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


def is_held_out(path: str | pathlib.Path, fraction: float) -> bool:
  """Deterministic train / held-out split by a hash of the file's name relative to the stdlib."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  try:
    key = str(pathlib.Path(path).relative_to(root))
  except ValueError:
    key = str(path)
  digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
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


def label_features(target, tokens: np.ndarray, *, batch_size: int,
                   hidden_layers: tuple[int, ...] = ()) -> Iterator[tuple[np.ndarray, ...]]:
  """The target's features (its LM head's input) for ``tokens: i32[N, T]``, batch by batch.

  Args:
    hidden_layers: also label the outputs of these decoder layers (``common.forward``'s).

  Yields ``(f16[b, T, E],)``, or with ``hidden_layers`` ``(features, f16[b, T, n * D])``, for
  consecutive batches of rows (the last batch padded to ``batch_size`` for one compiled shape, and
  trimmed). Stored in float16 to halve the corpus (the draft reads them in its compute dtype).
  """
  fn = jax.jit(_features_impl, static_argnums=(2, 3))
  for start in range(0, len(tokens), batch_size):
    chunk = tokens[start:start + batch_size]
    padded = np.zeros((batch_size, tokens.shape[1]), np.int32)
    padded[:len(chunk)] = chunk
    out = fn(target.params, jnp.asarray(padded), target.config, tuple(hidden_layers))
    yield tuple(np.asarray(x)[:len(chunk)] for x in out)


def save_shard(path: pathlib.Path, **arrays: np.ndarray) -> None:
  """Writes one shard atomically (a partial file never has the final name)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp.npz")
  np.savez(tmp, **arrays)
  tmp.replace(path)


def load_shards(paths: Sequence[pathlib.Path]) -> dict[str, np.ndarray]:
  """Concatenates shards along the example axis.

  Raises:
    FileNotFoundError: no shard given. ValueError: shards with different keys or window lengths.
  """
  if not paths:
    raise FileNotFoundError("no corpus shards found; build them with experiments/build_corpus.py")
  parts = [dict(np.load(p)) for p in paths]
  keys = set(parts[0])
  if any(set(p) != keys for p in parts) or len({p["tokens"].shape[1] for p in parts}) != 1:
    raise ValueError(f"shards {paths} disagree on fields or window length")
  return {k: np.concatenate([p[k] for p in parts]) for k in sorted(keys)}
