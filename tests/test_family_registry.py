"""The model family registry (``bass_jax.models.family``): every family's record agrees with the tables
that read it (its config class, transformers' classes, the GGUF reader, the sharding rules, the EAGLE
checks), and a ``model_type`` string appears only in its family's own file, so that adding a family
touches one file. The scan is shown to catch a literal put elsewhere."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib

import pytest
import transformers

import bass_jax  # noqa: F401  # registers every family
from bass_jax.checkpoints import gguf_architectures as gguf
from bass_jax.models import eagle, family, llama

LIBRARY = pathlib.Path(bass_jax.__file__).resolve().parent
# Strings equal to a model_type that are another namespace's names, with the reason they stay.
NOT_MODEL_TYPES = {
    # llama.cpp's general.architecture names (the families claim them in gguf_architectures). Six of
    # them equal model types, so a stray model_type string among them there would pass here.
    "checkpoints/gguf_architectures.py": {a for f in family.families() for a in f.gguf_architectures},
    # The published EAGLE heads' config.json says model_type "llama": a fact of that file format.
    "checkpoints/eagle_formats.py": {"llama"},
}


def _names() -> dict[str, str]:
  """Every registered model_type (and wrapper type) -> its family's file, relative to the library."""
  out = {}
  for registered in family.families():
    file = pathlib.Path(inspect.getfile(registered.config_class)).resolve().relative_to(LIBRARY)
    for name in (registered.model_type, *registered.wrapper_types):
      out[name] = str(file)
  return out


def stray_literals(source: str, file: str, names: dict[str, str]) -> list[tuple[int, str]]:
  """``(line, name)`` for each string constant of ``source`` (docstrings aside) equal to a model type
  whose family lives in another file than ``file``, and not another namespace's name there."""
  tree = ast.parse(source)
  docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)}
  allowed = NOT_MODEL_TYPES.get(file, set())
  return sorted((node.lineno, node.value) for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value in names and names[node.value] != file
                and node.value not in allowed and id(node) not in docstrings)


def test_model_type_literals_appear_only_in_their_familys_file():
  names = _names()
  found = {}
  for path in sorted(LIBRARY.rglob("*.py")):
    file = str(path.relative_to(LIBRARY))
    stray = stray_literals(path.read_text(encoding="utf-8"), file, names)
    if stray:
      found[file] = stray
  assert not found, f"model_type strings outside their family's file (use models.family): {found}"


def test_the_scan_catches_a_literal_outside_its_familys_file():
  names = _names()
  source = '"""phi3 in a docstring is prose."""\nRULES = {"phi3": 1}\nX = "gpt2"\n'
  assert stray_literals(source, "sampling/x.py", names) == [(2, "phi3"), (3, "gpt2")]
  assert stray_literals(source, "models/llama.py", names) == [(3, "gpt2")]
  assert stray_literals('A = "phi3"\n', "checkpoints/gguf_architectures.py", names) == []  # llama.cpp's name


def test_every_familys_record_agrees_with_the_tables_that_read_it():
  assert len(family.model_types()) >= 10
  for registered in family.families():
    cls = registered.config_class
    assert family.find(registered.model_type) is registered
    assert hasattr(transformers, registered.architecture), registered.architecture
    assert registered.model_type in transformers.CONFIG_MAPPING, registered.model_type
    assert isinstance(cls.PARAM_AXES, tuple) and cls.PARAM_AXES  # its sharding rules, in its file
    for name in ("max_positions", "hidden_size", "num_layers", "num_heads"):
      field = getattr(cls.FIELDS, name)
      assert field in {f.name for f in dataclasses.fields(cls)}, (cls, field)
    if registered.eagle_target:  # EAGLE reads an unscaled embedding and uncapped logits
      assert cls is llama.LlamaConfig and not llama.TRAITS[registered.model_type].gemma
  assert set(eagle.target_types()) == {f.model_type for f in family.families() if f.eagle_target}
  # Every GGUF architecture the reader knows is claimed by exactly one family, and no family claims
  # one the reader lacks.
  claimed = [a for f in family.families() for a in f.gguf_architectures]
  assert sorted(claimed) == sorted(gguf.FAMILIES)
  assert family.wrapped_by("gemma3").model_type == "gemma3_text"
  assert family.find("gemma3") is None and family.find(["llama"]) is None


def test_a_model_type_cannot_be_registered_twice():
  @dataclasses.dataclass(frozen=True)
  class OtherConfig:
    pass

  with pytest.raises(ValueError, match="'qwen3' is already registered to LlamaConfig"):
    family.register_family(family.Family("qwen3", OtherConfig, "X"))
  with pytest.raises(ValueError, match="'llama' is already registered to LlamaConfig"):
    family.register_family(family.Family("llama", llama.LlamaConfig, "X"))  # same class, new record
  with pytest.raises(ValueError, match=r"\['phi3'\] already belong to the family 'phi3'"):
    family.register_family(family.Family("phi5", OtherConfig, "X", gguf_architectures=("phi3",)))
  with pytest.raises(ValueError, match=r"\['qwen2'\] would be both a model_type and a multimodal"):
    family.register_family(family.Family("phi5", OtherConfig, "X", wrapper_types=("qwen2",)))
  assert family.find("phi5") is None
  family.register_family(family.find("qwen3"))  # the same record again: a reloaded module
