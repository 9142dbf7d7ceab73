"""GGUF (llama.cpp) checkpoints, read as the Hugging Face checkpoints they were converted from.

A GGUF file is translated into what transformers holds for the same model, and that is loaded by the HF
path (:mod:`bass_jax.checkpoints.hf`), exactly as a checkpoint directory is:

1. its ``{arch}.*`` metadata into a ``config.json``-style dict: ``model_type`` and transformers' field
   names (``rope_parameters``, ``head_dim``, ``sliding_window``, ``layer_types``, ``query_pre_attn_scalar``,
   ``attn_logit_softcapping``, ``partial_rotary_factor`` …), for ``hf.config_from_hf``;
2. its tensors into transformers' state-dict names (``blk.{i}.attn_q.weight`` ->
   ``model.layers.{i}.self_attn.q_proj.weight``) with llama.cpp's re-layouts undone and quantized tensors
   (Q4_1, Q8_0, …) dequantized to f32 with ``gguf.quants.dequantize``, for ``hf.params_from_tensors``
   and the family's name table.

Supporting a llama.cpp architecture is one row of ``FAMILIES`` in
:mod:`bass_jax.checkpoints.gguf_architectures` (an ``Architecture``, after llama.cpp's
``convert_hf_to_gguf.py``; that module says what each row undoes). Every ``{arch}.*`` key is mapped,
checked or refused by name: a key the row does not list, or one that does not apply with the file's
other settings (a yarn parameter beside linear scaling), is refused rather than ignored. So is a tensor
with no place in the HF model, and an architecture without a row.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import re
from typing import Any

import numpy as np

from bass_jax._checks import short
from bass_jax.checkpoints import config_schema
from bass_jax.checkpoints import hf
from bass_jax.checkpoints._mapping import CheckpointError
from bass_jax.checkpoints.gguf_architectures import (
    FAMILIES, INT_FIELDS, LAYER, Architecture, Source, dequantize, unpermute_rotary)

# -- reading a file -------------------------------------------------------------------------------------


@functools.cache
def reader_class() -> type:
  """``gguf.GGUFReader`` reading through a plain ``numpy.ndarray`` view of its memory map.

  The reader slices its map once for every piece of metadata: about half a million slices for a
  vocabulary of 49k tokens and their merges. A slice of a ``numpy.memmap`` is a new ``memmap`` object,
  set up by its ``__array_finalize__``, which made most of the read's time; a slice of a plain view of
  the same map is the same bytes without it (``experiments.benchmarks.bench_gguf_read`` times both).
  The reader stores the map in its public ``data`` attribute, as its first step; this class keeps the
  plain view there instead. Fields and tensors are what ``gguf.GGUFReader`` gives, tensor data plain
  read-only arrays over the file instead of memmaps (tests/test_gguf_families.py).

  Returns:
    The subclass of ``gguf.GGUFReader`` (made once); call it with a path as the reader.

  Raises:
    ImportError: the ``gguf`` package is not installed.
  """
  import gguf  # pylint: disable=g-import-not-at-top

  class PlainViewReader(gguf.GGUFReader):
    @property
    def data(self) -> np.ndarray:
      return self._plain_view

    @data.setter
    def data(self, value: np.ndarray) -> None:
      self._plain_view = value.view(np.ndarray)  # keeps the map alive through its .base

  return PlainViewReader


def _open(path: pathlib.Path):
  if not path.is_file():
    raise FileNotFoundError(f"GGUF file not found: {path}")
  try:
    return reader_class()(str(path))
  except Exception as e:  # the reader raises ValueError, struct errors, numpy errors …
    raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _family(reader, path: pathlib.Path) -> tuple[str, Architecture]:
  field = reader.fields.get("general.architecture")
  arch = field.contents() if field is not None else None
  if arch not in FAMILIES:
    raise ValueError(f"{path}: general.architecture is {arch!r}; supported GGUF architectures: "
                     f"{', '.join(sorted(FAMILIES))}")
  split = reader.fields.get("split.count")
  if split is not None and int(split.contents()) > 1:
    raise ValueError(f"{path}: one part of a split GGUF (split.count={split.contents()}); merge the "
                     "parts first (llama-gguf-split --merge)")
  return arch, FAMILIES[arch]


def _translate_config(src: Source, family: Architecture) -> dict[str, Any]:
  unknown = sorted(set(src.meta) - family.keys)
  if unknown:
    raise ValueError(f"{src.path}: unsupported GGUF metadata key {src.key(unknown[0])!r}="
                     f"{short(src.meta[unknown[0]])} for a {src.arch!r} model (the port would ignore "
                     "it)" + (f"; also {[src.key(k) for k in unknown[1:4]]}" if unknown[1:] else ""))
  missing = [k for k in family.renames if k not in src.meta]
  if missing:
    raise ValueError(f"{src.path}: no {src.key(missing[0])!r} (a {src.arch} GGUF file always has it)")
  out: dict[str, Any] = {"model_type": family.model_type, "architectures": [family.architecture],
                         **family.fields}
  for key, name in family.renames.items():
    out[name] = src.int(key) if name in INT_FIELDS else src.float(key)

  def check() -> None:
    """The ranges a config.json is held to (sizes >= 1, finite floats, stop ids in the vocabulary),
    named by the HF field the metadata became."""
    config_schema.check(out, f"{src.path}: its metadata, read as config.json",
                        fix="re-convert the file")

  check()  # the renamed sizes, before the steps divide by them (heads)
  for step in family.steps:
    step(src, out, family)
  unused = sorted(set(src.meta) - src.used_keys)
  if unused:
    src.refuse(unused[0], "does not apply to this file's other settings; refusing to ignore it")
  for name, key in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
    value = src.tokenizer.get(f"tokenizer.ggml.{key}_token_id")
    out[name] = None if value is None else int(value)
  # llama.cpp's end-of-turn and end-of-message ids (Llama 3 Instruct's <|eot_id|> and <|eom_id|>,
  # Gemma's <end_of_turn>) stop a generation as its EOS does: they join the stop ids.
  extra = [int(src.tokenizer[f"tokenizer.ggml.{key}_token_id"]) for key in ("eot", "eom")
           if src.tokenizer.get(f"tokenizer.ggml.{key}_token_id") is not None]
  extra = [i for i in extra if i != out["eos_token_id"]]
  if extra:
    out["eos_token_id"] = list(dict.fromkeys(
        ([] if out["eos_token_id"] is None else [out["eos_token_id"]]) + extra))
  check()  # and what the steps and the tokenizer's ids added
  return out


@dataclasses.dataclass(frozen=True)
class HFView:
  """A GGUF file as transformers holds the same model: its ``config.json`` dict and its state dict's
  tensor names, each read (dequantized, llama.cpp's transforms undone) on demand by :meth:`read`.

  Attributes:
    path: the ``.gguf`` file.
    arch: its ``general.architecture``.
    config: the HF config dict (``hf.config_from_hf`` takes it).
    names: HF tensor name -> the GGUF tensor it is read from.
  """

  path: pathlib.Path
  arch: str
  config: dict[str, Any]
  names: dict[str, str]
  _family: Architecture
  _tensors: dict[str, Any]

  def read(self, name: str) -> np.ndarray:
    """HF tensor ``name`` as f32 numpy, in transformers' layout."""
    x = dequantize(self._tensors[self.names[name]], self.path)
    family, config = self._family, self.config
    if family.permute_qk and re.search(r"self_attn\.q_proj\.(weight|bias)$", name):
      x = unpermute_rotary(x, config["num_attention_heads"])
    elif family.permute_qk and re.search(r"self_attn\.k_proj\.(weight|bias)$", name):
      x = unpermute_rotary(x, config["num_key_value_heads"])
    if family.norm_shift and name.endswith("norm.weight"):
      x = x - np.float32(family.norm_shift)
    return x

  def shape(self, name: str) -> tuple[int, ...]:
    """HF tensor ``name``'s shape, from the header (GGML lists dimensions innermost first); nothing
    is read."""
    return tuple(int(d) for d in reversed(self._tensors[self.names[name]].shape))

  def gguf_names(self, message: str) -> str:
    """``message`` with each quoted HF tensor name followed by its GGUF name."""
    inverse = {hf_stem: gguf_stem for gguf_stem, hf_stem in self._family.tensors.items()}

    def name(match: re.Match) -> str:
      hf_name = match.group(1)
      layer = re.match(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$", hf_name)
      if layer:
        stem, suffix = LAYER + layer.group(2), layer.group(3)
        gguf_stem = inverse.get(stem)
        gguf_name = gguf_stem and gguf_stem.format(i=layer.group(1)) + "." + suffix
      else:
        stem, _, suffix = hf_name.rpartition(".")
        gguf_name = inverse.get(stem) and inverse[stem] + "." + suffix
      return match.group(0) if not gguf_name else f"'{hf_name}' (GGUF '{gguf_name}')"

    return re.sub(r"'((?:model|lm_head)[\w.]*)'", name, message)


def _hf_name(gguf_name: str, family: Architecture) -> str | None:
  layer = re.match(r"blk\.(\d+)\.(.+)\.(weight|bias)$", gguf_name)
  if layer:
    stem = family.tensors.get("blk.{i}." + layer.group(2))
    return stem and stem.format(i=layer.group(1)) + "." + layer.group(3)
  stem, _, suffix = gguf_name.rpartition(".")
  hf_stem = family.tensors.get(stem) if suffix in ("weight", "bias") else None
  return hf_stem and hf_stem + "." + suffix


def _view(reader, path: pathlib.Path) -> HFView:
  arch, family = _family(reader, path)
  src = Source(reader, path, arch)
  config = _translate_config(src, family)
  names: dict[str, str] = {}
  for gguf_name in src.tensors:
    if gguf_name in src.used_tensors:
      continue
    hf_name = _hf_name(gguf_name, family)
    if hf_name is None:
      raise CheckpointError(f"{path}: GGUF tensor {gguf_name!r} has no place in transformers' "
                            f"{family.architecture}")
    names[hf_name] = gguf_name
  return HFView(path, arch, config, names, family, src.tensors)


def read_hf(path: str | os.PathLike) -> HFView:
  """Translates the GGUF file at ``path`` into transformers' config dict and tensor names.

  Raises:
    FileNotFoundError: no such file. CheckpointError: an unreadable file, or a tensor with no place in
      the HF model. ValueError: an unsupported architecture or metadata key (named).
  """
  path = pathlib.Path(path)
  return _view(_open(path), path)


def hf_config(reader, path: pathlib.Path) -> dict[str, Any]:
  """The HF config dict of an open GGUF file (``reader``: a ``gguf.GGUFReader``).

  Raises:
    ValueError: an unsupported architecture or metadata key (named). CheckpointError: a tensor with
      no place in the HF model.
  """
  return _view(reader, path).config


def _config(fields: dict[str, Any], path: pathlib.Path):
  try:
    return hf.config_from_hf(fields)
  except ValueError as e:
    raise ValueError(f"{path}: the {fields['model_type']} config of this GGUF file is not "
                     f"supported: {e}") from e


def read_config(path: str | os.PathLike) -> Any:
  """The family config (``hf.config_from_hf``) of a GGUF file, from its header (no tensor is read).

  Args:
    path: the ``.gguf`` file (one file: a split model's parts are refused).

  Raises:
    FileNotFoundError: no file at ``path``.
    CheckpointError: not a readable GGUF file, or a tensor with no place in the HF model.
    ValueError: an unsupported architecture or metadata key, or a config the port refuses.
  """
  path = pathlib.Path(path)
  return _config(hf_config(_open(path), path), path)


def load_gguf(path: str | os.PathLike, *, expected: Any, dtype: Any) -> tuple[Any, dict[str, Any]]:
  """Reads a GGUF file into ``(config, params)`` through the HF path, dequantizing every tensor.

  Args:
    path: the ``.gguf`` file.
    expected: ``config -> abstract params`` callable, used to check every shape.
    dtype: dtype of the returned parameters.

  Raises:
    FileNotFoundError: no such file. CheckpointError: unreadable file, or a tensor missing (named
      under both its HF and its GGUF name), left over or mis-shaped. ValueError: unsupported
      architecture or metadata.
  """
  view = read_hf(path)
  config = _config(view.config, view.path)
  try:
    params = hf.params_from_tensors(config, view.names, view.read, expected=expected, dtype=dtype,
                                    where=str(view.path), source="the GGUF metadata",
                                    fields=view.config, shape_of=view.shape)
  except CheckpointError as e:
    raise CheckpointError(view.gguf_names(str(e))) from e
  return config, params
