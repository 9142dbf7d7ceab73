"""The import layering of the project (docs/design.md, "Import layers"), held by a test.

The layers are read from that section of docs/design.md, its numbered list: the backticked module
names before an item's first colon are that layer's (a name covers the modules under it; the longest
name that covers a module decides its layer). The checks walk every module's syntax tree (nothing is
imported): no module imports from a layer above its own, the modules' imports form no cycle, no
function imports a module of the project, and nothing in the library imports ``experiments``, whose
scripts import only its helpers (the modules whose names start with ``_``); no library module is
longer than 500 lines. The last test builds a small package with one fault of each kind, so that each
check is shown to fail.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ("bass_jax", "pallas_kernels")


def modules(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
  """``{dotted name: file}`` of every module under ``packages`` (a package by its ``__init__``)."""
  found = {}
  for package in packages:
    for path in sorted((root / package).rglob("*.py")):
      parts = list(path.relative_to(root).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      found[".".join(parts)] = path
  return found


def imports(path: pathlib.Path, prefixes: tuple[str, ...]) -> list[tuple[str, int, bool]]:
  """``(imported name, line, at module level)`` of each import of a name under ``prefixes``; an
  ``from a import b`` gives ``a.b``. Imports under ``if TYPE_CHECKING:`` never run and are left out."""
  tree = ast.parse(path.read_text(), str(path))
  found = []

  def visit(node: ast.AST, top: bool) -> None:
    for child in ast.iter_child_nodes(node):
      if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
          and child.test.id == "TYPE_CHECKING"):
        continue
      names = []
      if isinstance(child, ast.Import):
        names = [a.name for a in child.names]
      elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
        names = [f"{child.module}.{a.name}" for a in child.names]
      elif isinstance(child, ast.ImportFrom):
        raise AssertionError(f"{path}:{child.lineno}: a relative import; write the module's full name")
      found.extend((n, child.lineno, top) for n in names if n.split(".")[0] in prefixes)
      inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
      visit(child, top and not inner)

  visit(tree, True)
  return found


def resolve(name: str, known: dict[str, pathlib.Path]) -> str:
  """The module an imported name lives in: the longest known module that is ``name`` or contains it."""
  while name not in known and "." in name:
    name = name.rpartition(".")[0]
  return name


def read_layers(design: str, prefixes: tuple[str, ...] = LIBRARY) -> list[tuple[str, ...]]:
  """The layers of docs/design.md's "Import layers" list, lowest first: each item's backticked module
  names before its first colon."""
  section = design.split("**Import layers.**", 1)[1].split("\n\n**", 1)[0]
  layers = []
  for item in re.findall(r"^\d+\. (.*)$", section, re.M):
    names = tuple(n for n in re.findall(r"`([\w.]+)`", item.split(":", 1)[0])
                  if n.split(".")[0] in prefixes)
    if names:
      layers.append(names)
  return layers


def layer_of(module: str, layers: list[tuple[str, ...]]) -> int | None:
  """The index of the layer whose longest name covers ``module``, or None."""
  best, index = "", None
  for i, names in enumerate(layers):
    for name in names:
      if (module == name or module.startswith(name + ".")) and len(name) > len(best):
        best, index = name, i
  return index


def graph(known: dict[str, pathlib.Path], prefixes: tuple[str, ...]):
  """``{module: {(imported module, line, at module level)}}`` within ``known``."""
  edges = {}
  for module, path in known.items():
    edges[module] = {(resolve(name, known), line, top) for name, line, top in imports(path, prefixes)}
    edges[module] = {e for e in edges[module] if e[0] in known and e[0] != module}
  return edges


def upward(edges, layers) -> list[str]:
  """Every import of a module in a higher layer than the importer's, and every module in no layer."""
  found = [f"{m}: in no layer of docs/design.md's 'Import layers'" for m in edges
           if layer_of(m, layers) is None]
  for module, targets in sorted(edges.items()):
    mine = layer_of(module, layers)
    for target, line, _ in sorted(targets):
      theirs = layer_of(target, layers)
      if mine is not None and theirs is not None and theirs > mine:
        found.append(f"{module} (layer {mine + 1}) imports {target} (layer {theirs + 1}), line {line}")
  return found


def cycles(edges) -> list[list[str]]:
  """The import cycles: strongly connected sets of more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted({t for t, _, _ in edges.get(v, ())}):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return found


def inner_imports(edges) -> list[str]:
  """Imports of the project's own modules inside a function or class."""
  return [f"{m} imports {t} inside a function or class, line {line}"
          for m, targets in sorted(edges.items()) for t, line, top in sorted(targets) if not top]


@pytest.fixture(scope="module")
def library():
  known = modules(ROOT, LIBRARY)
  return known, graph(known, LIBRARY)


@pytest.fixture(scope="module")
def layers():
  found = read_layers((ROOT / "docs" / "design.md").read_text())
  assert len(found) >= 10, found  # the list was read, not an empty match
  return found


def test_no_module_imports_from_a_layer_above_its_own(library, layers):
  _, edges = library
  assert upward(edges, layers) == []


def test_the_modules_imports_form_no_cycle(library):
  _, edges = library
  assert cycles(edges) == []


def test_no_function_imports_a_module_of_the_project(library):
  _, edges = library
  assert inner_imports(edges) == []


def test_the_library_never_imports_experiments_and_scripts_import_only_its_helpers():
  known = modules(ROOT, LIBRARY)
  library_edges = [f"{m} imports {name}, line {line}" for m, path in known.items()
                   for name, line, _ in imports(path, ("experiments",))]
  assert library_edges == []
  scripts = modules(ROOT, ("experiments",))
  between = [f"{m} imports {name}, line {line}" for m, path in scripts.items()
             for name, line, _ in imports(path, ("experiments",))
             if not resolve(name, scripts).rpartition(".")[2].startswith("_")]
  assert between == []


# A module that grows past this many lines holds more than one concern (issue 53: loading.py, 877
# lines, mixed the model object, hub-cache resolution, format dispatch and saving); split it by what
# each part describes, as docs/design.md's layers do.
MAX_LINES = 500


def long_modules(known: dict[str, pathlib.Path], limit: int = MAX_LINES) -> list[str]:
  """``"<module>: <n> lines"`` for each module longer than ``limit`` lines."""
  lengths = {m: len(path.read_text().splitlines()) for m, path in known.items()}
  return [f"{m}: {n} lines" for m, n in sorted(lengths.items()) if n > limit]


def test_no_module_of_the_library_is_longer_than_500_lines(library, tmp_path):
  known, _ = library
  assert long_modules(known) == []
  (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
  assert long_modules({"long": tmp_path / "long.py"}) == [f"long: {MAX_LINES + 1} lines"]


def test_each_check_fails_on_its_fault(tmp_path):
  """A package ``pkg`` with layers ``pkg.low`` < ``pkg.high``: ``low`` imports ``high`` (upward),
  ``high.a`` and ``high.b`` import each other (a cycle), ``high.b`` imports ``stray`` inside a
  function (``high.a`` only under ``TYPE_CHECKING``, which is no import), and ``pkg.stray`` is in no
  layer."""
  files = {
      "pkg/__init__.py": "",
      "pkg/low.py": "from pkg.high import a\n",
      "pkg/high/__init__.py": "",
      "pkg/high/a.py": "from pkg.high import b\nfrom typing import TYPE_CHECKING\n"
                       "if TYPE_CHECKING:\n  from pkg import stray\n",
      "pkg/high/b.py": "import pkg.high.a\n\ndef f():\n  from pkg import stray\n",
      "pkg/stray.py": "",
  }
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  design = ("**Import layers.** Lowest first:\n\n1. `pkg.low`: nothing.\n2. `pkg.high`, `pkg`: "
            "`pkg.low`.\n\n**Next.**\n")
  layers = read_layers(design, ("pkg",))
  assert layers == [("pkg.low",), ("pkg.high", "pkg")]
  known = modules(tmp_path, ("pkg",))
  edges = graph(known, ("pkg",))
  assert upward(edges, layers) == ["pkg.low (layer 1) imports pkg.high.a (layer 2), line 1"]
  assert cycles(edges) == [["pkg.high.a", "pkg.high.b"]]
  assert inner_imports(edges) == ["pkg.high.b imports pkg.stray inside a function or class, line 4"]
  assert upward(edges, [("pkg.low",), ("pkg.high",)]) == [
      "pkg: in no layer of docs/design.md's 'Import layers'",
      "pkg.stray: in no layer of docs/design.md's 'Import layers'",
      "pkg.low (layer 1) imports pkg.high.a (layer 2), line 1"]
