"""What a GPU runs for a compiled program, counted from XLA:GPU's thunk sequence, with no GPU.

XLA compiles a program for an H100 on a CPU-only machine given the device's target description
(``configs/gpu/h100_sxm.txtpb``, an XLA ``GpuTargetConfig``) and JAX's CUDA plugin (no CUDA libraries
needed), in a process that set ``JAX_PLATFORMS=cpu`` and XLA's dump flags before importing JAX
(``experiments._deviceless.prepare``): :func:`compile_deviceless`. With ``--xla_dump_to`` XLA
writes ``*.thunk_sequence.txt``, the
exact list of kernels, device copies, loops and conditionals the GPU runtime will execute, in order;
:func:`parse_thunks` reads it into a tree and :func:`count` multiplies loops by their trip counts
(XLA's ``known_trip_count`` in the optimized HLO; such a loop runs its body that many times with no
condition and no host read, as XLA:GPU's ``WhileThunk`` does), so that one iteration of a chosen loop
(a decode step) can be priced in launches.

What it cannot see: deviceless compilation skips autotuning, so a ``sort`` is compiled as XLA's own
kernels (about 15 launches) where a real H100 runs one CUB sort, and a GEMM's algorithm is not chosen;
a conditional's branch is chosen at run time (:func:`count` takes the costliest branch); a loop whose
trip count XLA does not know is counted once per iteration and reported apart. Every count here says
so next to it, and should be checked against a real GPU's thunk sequence when one is lent.

Units: launches are kernels (every thunk that runs device code: fusions, GEMMs, custom calls, memsets)
plus device copies; host reads are the values the host must read to go on (a ``while`` predicate per
evaluation of a loop of unknown trip count, a conditional's branch index), each a round trip.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Any, Iterator

# Thunk kinds that launch no device work of their own (containers and host-side bookkeeping).
_NOT_LAUNCHES = frozenset({"kWhile", "kConditional", "kSequential", "kWaitForStreams", "kCopyDone",
                           "kHostSend", "kHostRecv", "kHostSendDone", "kHostRecvDone"})
COPY_KINDS = frozenset({"kCopy", "kDeviceToDevice"})
_LINE = re.compile(r"^(?P<indent>\s*)(?P<id>\d+): (?P<kind>k\w+)\s*\[[^\]]*\]\s*(?P<name>\S*)")
_HEADER = re.compile(r"^\s*(?P<name>[\w ]+):\s*$")
_TRIP = re.compile(r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = .*\bwhile\(.*\"known_trip_count\":"
                   r"\{\"n\":\"(?P<n>\d+)\"")
_ANNOTATION = re.compile(r'profile_annotation: "(?P<name>[^"]*)"\s*thunk_id: (?P<id>\d+)')


@dataclasses.dataclass
class Thunk:
  """One thunk of the sequence.

  Attributes:
    id: its number in the sequence. kind: ``kCustomKernel``, ``kCopy``, ``kWhile``, ... name: the
      kernel's name (a fusion's), or the kind's. annotation: its HLO instruction (``while.5``), from
      the thunk metadata. sections: a ``kWhile``'s ``condition`` and ``body``, a ``kConditional``'s
      branches, each a list of thunks; empty for a leaf.
  """

  id: int
  kind: str
  name: str
  annotation: str = ""
  sections: dict[str, list["Thunk"]] = dataclasses.field(default_factory=dict)


def parse_thunks(sequence: str, metadata: str = "") -> list[Thunk]:
  """The top-level thunks of a ``*.thunk_sequence.txt``, nested loops and branches as sections.

  The format, as XLA writes it: four spaces of indentation per level; a ``kWhile``'s ``condition:``
  header right after it (at column 0) and its ``body:`` header two spaces deeper than the loop; a
  ``kConditional``'s branch headers likewise; a thunk that wraps another (``kDynamicSliceFusion``
  around the copy or kernel it runs) has it one level deeper with no header, kept as its
  ``embedded`` section.

  Args:
    sequence: the thunk sequence text.
    metadata: the matching ``*.thunk_metadata.txt`` (each thunk's HLO instruction), or empty.

  Returns:
    The top-level thunks in order.

  Raises:
    ValueError: a line that is neither a thunk nor a section header, a thunk nested two levels
      deeper than the one before it, or a header with no loop or conditional to open.
  """
  annotations = {int(m["id"]): m["name"] for m in _ANNOTATION.finditer(metadata)}
  top: list[Thunk] = []
  open_: list[tuple[int, Thunk]] = []  # (depth, thunk) from the top level down to the last thunk
  current: dict[int, str] = {}  # id of a loop or conditional -> the section being read
  for number, line in enumerate(sequence.splitlines(), start=1):
    if not line.strip():
      continue
    if line.strip() == "No thunks.":  # an empty condition, body or branch
      continue
    match = _LINE.match(line)
    if match is None:
      header = _HEADER.match(line)
      name = header["name"].strip() if header else None
      if name == "condition" and open_ and open_[-1][1].kind == "kWhile":
        container = open_[-1][1]
      elif name is not None:
        depth = (len(line) - len(line.lstrip()) - 2) // 4
        while open_ and open_[-1][0] > depth:
          open_.pop()
        container = open_[-1][1] if open_ and open_[-1][0] == depth else None
      if name is None or container is None or container.kind not in ("kWhile", "kConditional"):
        raise ValueError(f"thunk sequence line {number}: not a thunk, or a header with no loop or "
                         f"conditional to open: {line!r}")
      container.sections.setdefault(name, [])
      current[container.id] = name
      continue
    depth = len(match["indent"]) // 4
    thunk = Thunk(int(match["id"]), match["kind"], match["name"] or match["kind"],
                  annotations.get(int(match["id"]), ""))
    while open_ and open_[-1][0] >= depth:
      open_.pop()
    if not open_:
      if depth:
        raise ValueError(f"thunk sequence line {number}: nested with nothing to nest in")
      top.append(thunk)
    else:
      parent_depth, parent = open_[-1]
      if parent_depth != depth - 1:
        raise ValueError(f"thunk sequence line {number}: nested two levels below the thunk before")
      section = current.get(parent.id, "embedded")
      parent.sections.setdefault(section, []).append(thunk)
    open_.append((depth, thunk))
  return top


def trip_counts(optimized_hlo: str) -> dict[str, int]:
  """``{while instruction name: known trip count}`` from XLA's optimized HLO text."""
  return {m["name"]: int(m["n"]) for line in optimized_hlo.splitlines()
          if (m := _TRIP.match(line))}


@dataclasses.dataclass
class Count:
  """Launches and host reads of running some thunks once.

  Attributes:
    kernels: kernel launches. copies: device copies. host_reads: values the host reads (loop
      predicates, branch indices). unknown_loops: loops without a known trip count, counted as one
      iteration each. graphs: command buffers (CUDA graphs) launched, each one launch whatever it
      holds (in a sequence after XLA's thunk passes).
  """

  kernels: int = 0
  copies: int = 0
  host_reads: int = 0
  unknown_loops: int = 0
  graphs: int = 0

  @property
  def launches(self) -> int:
    return self.kernels + self.copies + self.graphs

  def __add__(self, other: "Count") -> "Count":
    return Count(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

  def times(self, n: int) -> "Count":
    return Count(*(a * n for a in dataclasses.astuple(self)))


def count(thunks: list[Thunk], trips: dict[str, int]) -> Count:
  """Launches and host reads of running ``thunks`` once: a loop of known trip count n as n bodies (XLA:
  GPU's ``WhileThunk`` then runs no condition and reads nothing), a loop of unknown count as one
  iteration, a condition, a body and a host read (the steady state: the first evaluation before the
  loop is not counted; counted in ``unknown_loops``), a conditional as its costliest branch plus one host read, a wrapper
  (``kDynamicSliceFusion``) as what it wraps, a command buffer as one launch."""
  total = Count()
  for thunk in thunks:
    if thunk.kind == "kWhile":
      body = count(thunk.sections.get("body", []), trips)
      condition = count(thunk.sections.get("condition", []), trips)
      n = trips.get(thunk.annotation)
      if n is None:  # each iteration evaluates the condition and the host reads the predicate
        total += body + condition + Count(host_reads=1, unknown_loops=1)
      else:  # XLA:GPU's WhileThunk runs the body n times: no condition, no host read
        total += body.times(n)
    elif thunk.kind == "kConditional":
      branches = [count(b, trips) for b in thunk.sections.values()] or [Count()]
      total += max(branches, key=lambda c: c.launches) + Count(host_reads=1)
    elif thunk.kind == "kCommandBuffer":  # one graph launch, loops and branches inside included
      total += Count(graphs=1)
    elif "embedded" in thunk.sections:  # a wrapper runs what it wraps
      total += count(thunk.sections["embedded"], trips)
    elif thunk.kind in COPY_KINDS:
      total += Count(copies=1)
    elif thunk.kind not in _NOT_LAUNCHES:
      total += Count(kernels=1)
  return total


def loops(thunks: list[Thunk], depth: int = 0) -> Iterator[tuple[int, Thunk]]:
  """Every ``kWhile`` in the tree, outermost first, with its depth."""
  for thunk in thunks:
    if thunk.kind == "kWhile":
      yield depth, thunk
    for section in thunk.sections.values():
      yield from loops(section, depth + 1)


def in_command_buffer(thunks: list[Thunk], target: Thunk) -> bool:
  """Whether ``target`` runs inside a command buffer (a CUDA graph: with XLA's WHILE and CONDITIONAL
  command types a whole loop is one graph node, and an iteration costs the host no launch)."""

  def search(ts: list[Thunk], inside: bool) -> bool | None:
    for t in ts:
      if t is target:
        return inside
      for section in t.sections.values():
        found = search(section, inside or t.kind == "kCommandBuffer")
        if found is not None:
          return found
    return None

  return bool(search(thunks, False))


def per_iteration(loop: Thunk, trips: dict[str, int]) -> Count:
  """One iteration of ``loop``: its body and one evaluation of its condition (with its host read)."""
  return (count(loop.sections.get("body", []), trips) + count(loop.sections.get("condition", []), trips)
          + Count(host_reads=1))




def leaves(thunks: list[Thunk]) -> Iterator[Thunk]:
  """Every thunk that launches device work (a kernel or a copy) in ``thunks``, loops' bodies and
  conditions and conditionals' branches included, in order (each once, whatever its trip count)."""
  for thunk in thunks:
    if thunk.sections:
      for section in thunk.sections.values():
        yield from leaves(section)
    elif thunk.kind not in _NOT_LAUNCHES:
      yield thunk


def kernels_per_layer(thunks: "Thunk | list[Thunk]", marker: str = "attention") -> dict[str, Any]:
  """The kernels and copies one decoder layer launches in ``thunks``, counted as the period between
  consecutive launches of the layer's attention kernel (``marker`` in the kernel's name: the Pallas
  kernels are ``bass_ragged_attention_*``, one launch per layer).

  XLA's op names cannot say which layer a kernel serves (every unrolled layer is one traced
  function, so each carries the first layer's name), but a decoder layer launches its attention
  kernel once, so the launches from one attention kernel to the next are one layer's, whatever
  XLA fused across the layer boundary.

  Returns:
    ``{"median": the median period, "layers": attention launches found, "example": the kernel names
    of the middle period, in order}``; ``median`` None with fewer than two attention launches (the
    jnp attention has no kernel of its own).

  Args:
    thunks: a program's thunks (``Dump.thunks``), or a loop ``Thunk``, whose body is counted (one
      iteration). A nested loop's body and condition count once each.
    marker: the substring that names the attention kernel.
  """
  if isinstance(thunks, Thunk):
    thunks = thunks.sections.get("body", [])
  names = [t.name for t in leaves(thunks)]
  marks = [i for i, name in enumerate(names) if marker in name]
  if len(marks) < 2:
    return {"median": None, "layers": len(marks), "example": []}
  gaps = sorted(b - a for a, b in zip(marks, marks[1:]))
  middle = len(marks) // 2
  return {"median": gaps[len(gaps) // 2], "layers": len(marks),
          "example": names[marks[middle - 1]:marks[middle]]}


_WHILE_BODY = re.compile(r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = .*\bwhile\(.*\bbody=%?(?P<body>[\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?(?P<name>[\w.\-]+) \(.*\) -> .*\{\s*$")


def computations(optimized_hlo: str) -> dict[str, str]:
  """``{computation name: its text}`` of an HLO module's text."""
  out, name, lines = {}, None, []
  for line in optimized_hlo.splitlines():
    match = _COMPUTATION.match(line)
    if match is not None:
      name, lines = match["name"], []
    elif name is not None and line.strip() == "}":
      out[name] = "\n".join(lines)
      name = None
    elif name is not None:
      lines.append(line)
  return out


def find_loop(thunks: list[Thunk], optimized_hlo: str, function: str) -> Thunk | None:
  """The outermost ``kWhile`` whose body runs the jitted function named ``function`` (JAX writes
  ``jit(<name>)`` into the op names of its instructions, which XLA keeps when it inlines the call):
  the loop of a decode's steps of one kind (``sampling.loop`` names them ``plain_step``,
  ``chain_step``, ``tree_step_<i>``). None when no loop runs it."""
  bodies = {m["name"]: m["body"] for line in optimized_hlo.splitlines()
            if (m := _WHILE_BODY.match(line))}
  texts = computations(optimized_hlo)
  marker = f"jit({function})/"
  for _, loop in loops(thunks):
    if marker in texts.get(bodies.get(loop.annotation, ""), ""):
      return loop
  return None


@dataclasses.dataclass(frozen=True)
class Dump:
  """The files XLA wrote for one compiled module: its thunk sequence, metadata and optimized HLO."""

  module: str
  sequence: str
  metadata: str
  optimized_hlo: str

  def thunks(self) -> list[Thunk]:
    return parse_thunks(self.sequence, self.metadata)

  def trips(self) -> dict[str, int]:
    return trip_counts(self.optimized_hlo)


def read_dump(directory: str | os.PathLike, module: str, *, after_passes: bool = False) -> Dump:
  """The dump of the module whose name contains ``module`` (the last one written, if several).

  Args:
    after_passes: read the sequence after XLA's thunk passes (``*.thunk_sequence_after_thunk_passes
      .txt``: consecutive thunks grouped into command buffers, what the runtime launches) where XLA
      wrote one, else the sequence before them (every kernel). Thunk ids, and so the metadata, are
      shared by the two.

  Raises:
    FileNotFoundError: no thunk sequence of such a module in ``directory``.
  """
  directory = pathlib.Path(directory)
  sequences = sorted(p for p in directory.glob("*.thunk_sequence.txt") if module in p.name)
  if not sequences:
    raise FileNotFoundError(f"{directory}: no *.thunk_sequence.txt of a module named like {module!r}")
  path = sequences[-1]
  stem = path.name[:-len(".thunk_sequence.txt")]
  after = directory / f"{stem}.thunk_sequence_after_thunk_passes.txt"
  if after_passes and after.exists():
    path = after
  metadata = directory / f"{stem}.thunk_metadata.txt"
  optimized = sorted(directory.glob(f"{stem}.*after_optimizations.txt"))
  return Dump(stem, path.read_text(), metadata.read_text() if metadata.exists() else "",
              optimized[0].read_text() if optimized else "")


def compile_deviceless(fn: Any, args: Any, kwargs: dict[str, Any], target_config: str,
                       compiler_options: dict[str, str] | None = None,
                       donate_argnums: tuple[int, ...] = ()) -> Any:
  """Compiles ``fn`` (a jittable callable, e.g. ``Exported.call``) for one GPU described by
  ``target_config`` (``GpuTargetConfig`` text), on a machine without one (after
  ``experiments.benchmarks.lower_decode``'s set-up).

  Args:
    fn: the function. args, kwargs: its arguments as pytrees of shapes and dtypes
      (``jax.ShapeDtypeStruct`` or anything with ``.shape`` and ``.dtype``, e.g. an ``Exported``'s
      ``in_avals`` unflattened by its ``in_tree``). target_config: the device's description.
    compiler_options: XLA options for this compile (``jax.jit``'s), e.g. a backend profile's.
    donate_argnums: arguments whose buffers the program may update in place (a KV cache: without
      it XLA copies the cache before writing it, copies a decode loop never makes).

  Returns:
    The compiled executable (XLA has written its dump).

  Raises:
    RuntimeError: JAX's CUDA plugin is not installed (``jax.experimental.topologies`` finds no
      ``cuda`` platform).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  try:
    topology = topologies.get_topology_desc(platform="cuda", target_config=target_config,
                                            topology="1x1x1")
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(f"no deviceless CUDA compiler ({type(e).__name__}: {str(e)[:200]}); run `make "
                       "aot-plugin` and pass its folder") from e
  sharding = jax.sharding.SingleDeviceSharding(topology.devices[0])
  args, kwargs = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), (tuple(args), kwargs))
  return jax.jit(fn, compiler_options=compiler_options, donate_argnums=donate_argnums).lower(
      *args, **kwargs).compile()
