"""A census of a lowered decode program: its control flow, where each step begins, host callbacks,
kernels and the largest arrays, read from StableHLO text (``jax.export``'s ``mlir_module()``).

Why count control flow. On XLA:GPU the host reads a ``while`` loop's predicate, and a conditional's
branch index, before it launches what follows: every evaluation is a device-to-host round trip and
exposes the launch gap of the next body (docs/design.md, "Backend profiles"). A loop whose trip count
is a compile-time constant (``fori_loop`` with static bounds, which JAX lowers as a scan: a counter
compared with a constant) needs no such read once XLA knows the count, so the census tells the two
apart: a *data-dependent* op is a ``while`` whose condition is anything but a counter against a
constant, or any ``case``/``if``.

Where a step begins. ``sampling.loop`` outlines every kind of step as its own function
(``func.func @chain_step``, ``@plain_step``, ``@tree_step_<i>``), so a step loop is
a ``while`` whose body calls one of them. One step evaluates its loop's condition once and every
data-dependent op inside the step's function once per iteration of the static loops around it:
:func:`census`'s ``per_step`` counts those evaluations.

Reads the module with JAX's own MLIR bindings (``jax._src.interpreters.mlir``, JAX 0.10): the
``stablehlo`` and ``func`` dialects are registered in its context.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

CONTROL_FLOW = ("stablehlo.while", "stablehlo.case", "stablehlo.if")
STEP_FUNCTIONS = ("chain_step", "plain_step", "tree_step")
_CALLBACK = re.compile(r"callback", re.IGNORECASE)
_FRAME = re.compile(r'"([^"/()]+)"\("([^"]+)":(\d+)')
_BYTES = {"f64": 8, "i64": 8, "ui64": 8, "f32": 4, "i32": 4, "ui32": 4, "bf16": 2, "f16": 2,
          "i16": 2, "ui16": 2, "i8": 1, "ui8": 1, "i1": 1}


@dataclasses.dataclass
class ControlFlowOp:
  """One ``while``, ``case`` or ``if`` of the program, with what it nests.

  Attributes:
    kind: ``"while"``, ``"case"`` or ``"if"``.
    data_dependent: whether evaluating it needs a value computed on the device (module docstring).
    trip_count: a static loop's iterations (None for a data-dependent op).
    where: the Python frame that traced it, ``"function (file.py:line)"``.
    step: the step function this op lies in (``"chain_step"``, …), or None outside every step.
    calls_step: for a step loop, the step function its body calls, else None.
    children: the control flow nested in its regions (and in the functions they call).
  """

  kind: str
  data_dependent: bool
  trip_count: int | None
  where: str
  step: str | None = None
  calls_step: str | None = None
  children: list["ControlFlowOp"] = dataclasses.field(default_factory=list)

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready, children included."""
    out = {"kind": self.kind, "data_dependent": self.data_dependent, "where": self.where}
    if self.trip_count is not None:
      out["trip_count"] = self.trip_count
    if self.calls_step:
      out["step_loop_of"] = self.calls_step
    if self.children:
      out["children"] = [c.as_dict() for c in self.children]
    return out


def _where(location) -> str:
  """``"function (file.py:line)"`` of the innermost Python frame in an MLIR location."""
  frame = _FRAME.search(str(location))
  if frame is None:
    return "?"
  return f"{frame.group(1)} ({frame.group(2).rsplit('/', 1)[-1]}:{frame.group(3)})"


def _step_name(function: str) -> str | None:
  for name in STEP_FUNCTIONS:
    if function == name or function.startswith(name + "_"):
      return function
  return None


class _Module:
  """The parsed module: its functions by name, and a walk over control flow that follows calls."""

  def __init__(self, text: str):
    from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
    from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top

    self.ir = ir
    self.context = mlir.make_ir_context()
    with self.context:
      self.module = ir.Module.parse(text)
      self.functions = {ir.StringAttr(op.attributes["sym_name"]).value: op
                        for op in self.module.body.operations if "sym_name" in op.attributes}

  def callee(self, op) -> str:
    return self.ir.FlatSymbolRefAttr(op.attributes["callee"]).value

  def static_trip_count(self, while_op) -> int | None:
    """The iterations of a ``while`` whose condition compares a counter with a constant, else None."""
    cond = while_op.regions[0].blocks[0]
    ops = list(cond.operations)
    returned = ops[-1].operands[0].owner
    if getattr(returned, "name", None) != "stablehlo.compare":
      return None
    for operand in returned.operands:
      owner = operand.owner
      if getattr(owner, "name", None) == "stablehlo.constant":
        try:
          return int(self.ir.DenseIntElementsAttr(owner.attributes["value"])[0])
        except (ValueError, TypeError, IndexError):
          return None
    return None

  def walk(self, op, step: str | None, visiting: tuple[str, ...] = ()) -> list[ControlFlowOp]:
    """The control flow under ``op`` (its regions and the functions they call), as a forest."""
    found = []
    for region in op.regions:
      for block in region.blocks:
        for inner in block.operations:
          name = inner.operation.name
          if name == "func.call":
            callee = self.callee(inner)
            if callee in visiting:
              continue
            found += self.walk(self.functions[callee], _step_name(callee) or step,
                               visiting + (callee,))
          elif name in CONTROL_FLOW:
            kind = name.split(".")[1]
            trips = self.static_trip_count(inner) if kind == "while" else None
            node = ControlFlowOp(kind=kind, data_dependent=trips is None, trip_count=trips,
                                 where=_where(inner.location), step=step)
            node.children = self.walk(inner, step, visiting)
            if kind == "while":
              node.calls_step = self.called_step(inner)
            found.append(node)
          else:
            found += self.walk(inner, step, visiting)
    return found

  def called_step(self, while_op) -> str | None:
    """The step function a ``while``'s body calls directly, if any."""
    body = while_op.regions[1].blocks[0]
    for inner in body.operations:
      if inner.operation.name == "func.call" and _step_name(self.callee(inner)):
        return self.callee(inner)
    return None

  def operations(self):
    """Every operation of every function (no call following)."""
    def visit(op):
      for region in op.regions:
        for block in region.blocks:
          for inner in block.operations:
            yield inner
            yield from visit(inner)
    for function in self.functions.values():
      yield from visit(function)


def _flatten(nodes):
  for node in nodes:
    yield node
    yield from _flatten(node.children)


def _per_step(loop: ControlFlowOp) -> dict[str, Any]:
  """One step of a step loop: its condition, and every data-dependent op in the step times the
  iterations of the static loops around it (within the step)."""
  evaluations = [{"where": f"{loop.calls_step} loop condition ({loop.where})", "times": 1}]

  def visit(nodes, times):
    for node in nodes:
      if node.data_dependent:
        evaluations.append({"where": f"{node.kind} {node.where}", "times": times})
        visit(node.children, times)
      else:
        visit(node.children, times * node.trip_count)

  visit(loop.children, 1)
  return {"data_dependent_control_flow": sum(e["times"] for e in evaluations),
          "evaluations": evaluations}


def _tensor_bytes(type_text: str) -> tuple[int, str] | None:
  """``(bytes, "f32[8,3,512,64]")`` of a ranked tensor type's text, or None."""
  match = re.fullmatch(r"tensor<((?:\d+x)*)([a-z]+\d*)>", type_text)
  if match is None or match.group(2) not in _BYTES:
    return None
  dims = [int(d) for d in match.group(1).split("x") if d]
  return math.prod(dims) * _BYTES[match.group(2)], f"{match.group(2)}[{','.join(map(str, dims))}]"


def census(text: str, *, largest: int = 8) -> dict[str, Any]:
  """The census of a lowered program's StableHLO ``text`` (module docstring).

  Args:
    text: the module, as ``jax.export.Exported.mlir_module()`` or ``Lowered.as_text()`` give it.
    largest: how many of the largest intermediate arrays to list.

  Returns:
    A JSON-ready dict: ``control_flow`` (the forest of while/case/if ops from ``main``),
    ``while_ops``, ``conditional_ops`` and ``data_dependent_ops`` (distinct ops, step functions
    included), ``steps`` (per step function: ``data_dependent_control_flow`` evaluations in one step
    and their ``evaluations``), ``data_dependent_control_flow_per_step`` (the largest over the step
    kinds, None without a step loop), ``host_callbacks``, ``custom_calls`` (target -> count) and
    ``largest_arrays`` (``{"array", "bytes", "op", "where"}``, largest first, one per shape: the
    first op that makes it).

  Raises:
    ValueError: text that is not a module with a ``main`` function.
  """
  module = _Module(text)
  if "main" not in module.functions:
    raise ValueError("census needs a StableHLO module with a main function (jax.export's "
                     "mlir_module())")
  with module.context:
    forest = module.walk(module.functions["main"], None)
    nodes = list(_flatten(forest))
    steps = {}
    for node in nodes:
      if node.calls_step:
        per_step = _per_step(node)
        if node.calls_step not in steps or (per_step["data_dependent_control_flow"]
                                            > steps[node.calls_step]["data_dependent_control_flow"]):
          steps[node.calls_step] = per_step
    custom_calls: dict[str, int] = {}
    arrays: dict[str, dict[str, Any]] = {}
    for op in module.operations():
      name = op.operation.name
      if name == "stablehlo.custom_call":
        target = module.ir.StringAttr(op.attributes["call_target_name"]).value
        custom_calls[target] = custom_calls.get(target, 0) + 1
      for result in op.results:
        sized = _tensor_bytes(str(result.type))
        if sized and sized[1] not in arrays:
          arrays[sized[1]] = {"array": sized[1], "bytes": sized[0], "op": name,
                              "where": _where(op.location)}
  return {
      "control_flow": [n.as_dict() for n in forest],
      "while_ops": sum(n.kind == "while" for n in nodes),
      "conditional_ops": sum(n.kind != "while" for n in nodes),
      "data_dependent_ops": sum(n.data_dependent for n in nodes),
      "steps": steps,
      "data_dependent_control_flow_per_step": (
          max(s["data_dependent_control_flow"] for s in steps.values()) if steps else None),
      "host_callbacks": sum(n for t, n in custom_calls.items() if _CALLBACK.search(t)),
      "custom_calls": custom_calls,
      "largest_arrays": sorted(arrays.values(), key=lambda a: -a["bytes"])[:largest],
  }


def cache_copies(hlo_text: str, cache_arrays: list[str]) -> list[str]:
  """The ``copy`` instructions of a *compiled* XLA program (``Compiled.as_text()``) whose result is
  one of ``cache_arrays`` (``"f32[4,2,64,16]"``, as :func:`census` spells shapes): each would be a
  whole-cache copy per execution. Copy insertion is a compiler pass, so this needs the program
  compiled, not only lowered."""
  copies = []
  for array in cache_arrays:
    pattern = re.compile(rf"= {re.escape(array)}\S* copy(-start)?\(")
    copies += [line.strip() for line in hlo_text.splitlines() if pattern.search(line)]
  return copies
