"""Where a BASS step's time goes: :func:`measure_step_phases`, the per-phase cost breakdown of a chain
step (propose, verify, accept and commit, control) on the machine at hand.

A decode step is one jitted program, so its phases cannot be timed inside it (no clock runs in the
loop). Instead each phase is compiled on its own, as ``k`` repetitions in a ``fori_loop`` (one program
call, so no dispatch cost is counted per step), over the state of a real decode ``warm_steps`` steps
in, and the step and the loop around it are timed the same way:

- **loop**: the decode itself (``loop.decode``), run for ``k`` more steps: what a step costs in a run;
- **step**: ``k`` chain steps (``step.chain_step``) in a ``fori_loop``, without the decode loop's
  conditions;
- **propose**: the proposer's ``propose`` for the step (draft forwards, catch-up, lookups), the
  proposer rolled back after each so that every repetition proposes from the same text; of it,
  **lookup**: a hybrid's model-free lookups alone;
- **verify**: the target's forwards: one verification pass of C positions (with the EAGLE feature
  write when the proposer reads features) times the passes the ``k`` steps made on average;
- **plain**: ``k`` plain decoding steps (``step.plain_step``), the unit of the other costs.

Then **accept and commit** is ``step - propose - verify`` (acceptance and sampling over the scored
positions, emission, the cache's new lengths, the proposer's rollback, the histories, the draft-length
policy) and **control** is ``loop - step`` (the loop conditions: whether to speculate, whether any row
finished, and the step loops around the step). The step's **overhead** is ``loop - verify - propose``,
the part of a step that is neither a target nor a draft forward.

Every program starts from a fresh copy of the same state (made outside the clock) and donates it, so
caches are updated in place as in a decode. The programs are timed interleaved, each the fastest of
``repeats`` calls (``costs.fastest_seconds``: interference only adds time, and interleaving keeps the
ratios).

:func:`profile_step_scopes` answers the same question from the other side: it times the real steps
inside the real loop, with nothing compiled apart, from a ``jax.profiler`` trace of one decode whose
events are summed by the step scope (``step.STEP_SCOPES``) of the code that traced each instruction.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import gzip
import json
import re
import tempfile
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.sampling import calibration
from bass_jax.sampling import costs
from bass_jax.sampling import runner
from bass_jax.sampling import loop as loop_lib
from bass_jax.sampling import programs
from bass_jax.sampling.config import split_keywords
from bass_jax.sampling.plan import prepare
from bass_jax.sampling.proposers import Hybrid
from bass_jax.sampling.step import (STEP_SCOPES, _target_forward, chain_step, plain_step,
                                    step_context)
from bass_jax.sampling import generate as generate_lib


@dataclasses.dataclass(frozen=True)
class StepPhases:
  """Seconds per step of each phase of a BASS chain step (:func:`measure_step_phases`).

  Attributes:
    loop: a step inside the decode's loop. step: a step alone. plain: a plain decoding step.
    propose: the proposer's drafts (catch-up, draft forwards, lookups). lookup: of ``propose``, a
      hybrid's model-free lookups (0 for other proposers, whose lookup is all of ``propose``).
    verify_pass: one verification pass of ``chunk`` positions per row. passes: verification passes per
      step, the mean over the timed steps. verify: ``verify_pass * passes``.
    chunk: C, positions per verification pass. draft_len: the mean l of the timed steps. accepted:
      mean drafts accepted per live row and step. batch: rows. steps: k, steps per timed call.
  """

  loop: float
  step: float
  plain: float
  propose: float
  lookup: float
  verify_pass: float
  passes: float
  chunk: int
  draft_len: float
  accepted: float
  batch: int
  steps: int

  @property
  def verify(self) -> float:
    """Seconds of target forwards per step."""
    return self.verify_pass * self.passes

  @property
  def accept_commit(self) -> float:
    """``step - propose - verify``: acceptance, sampling, emission, cache lengths, rollback, histories,
    policy."""
    return self.step - self.propose - self.verify

  @property
  def control(self) -> float:
    """``loop - step``: what the decode loop adds around a step."""
    return self.loop - self.step

  @property
  def overhead(self) -> float:
    """``loop - verify - propose``: a step's time outside the target's and the draft's forwards."""
    return self.loop - self.verify - self.propose

  def in_plain_steps(self) -> dict[str, float]:
    """Every phase in plain steps (its seconds over :attr:`plain`)."""
    names = ("loop", "step", "propose", "lookup", "verify", "accept_commit", "control", "overhead")
    return {name: getattr(self, name) / self.plain for name in names}


def _fresh(tree: Any) -> Any:
  """A copy of every array of ``tree`` in new buffers (a donated call may then consume it)."""
  return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)


def measure_step_phases(target, draft, prompts, *, warm_steps: int = 4, steps: int = 16,
                        repeats: int = 5, **kwargs) -> StepPhases:
  """Measures the per-phase costs of a BASS chain step in one setting (module docstring).

  Args:
    target, draft, prompts: as for ``bass_jax.generate`` (one row per prompt).
    warm_steps: steps decoded before the timed state (the caches then hold real text).
    steps: k, the steps of each timed call.
    repeats: timed calls per program (the fastest counts), after one compiling call.
    **kwargs: ``generate``'s keyword arguments; ``draft_len`` must be a fixed length (an int) so that
      every step is a chain step of one length.

  Returns:
    A :class:`StepPhases`.

  Raises:
    ValueError: ``draft_len`` is not an int, ``draft_tree`` or ``batch_size`` is given (trees and
      continuous batching are not broken down), ``warm_steps + steps`` exceeds ``max_new_tokens``, or
      the rows finished before ``warm_steps + steps`` steps (raise ``max_new_tokens``); and as
      ``generate``.
  """
  if not isinstance(kwargs.get("draft_len"), int) or isinstance(kwargs.get("draft_len"), bool):
    raise ValueError(f"measure_step_phases needs a fixed draft_len (an int >= 1), got "
                     f"{kwargs.get('draft_len')!r}: a policy that varies l (or takes plain steps) "
                     "would time different steps in the loop and alone")
  for name in ("draft_tree", "batch_size"):
    if kwargs.get(name) is not None:
      raise ValueError(f"measure_step_phases breaks down static batches of chain steps; leave "
                       f"{name} out (got {kwargs[name]!r})")
  for name, value in (("warm_steps", warm_steps), ("steps", steps), ("repeats", repeats)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an int >= 1, got {value!r}")
  if kwargs.pop("method", "bass") != "bass":
    raise ValueError("measure_step_phases breaks down BASS steps: leave method out or pass 'bass'")
  config, prepare_kw, _ = split_keywords(dict(kwargs, method="bass"))
  if warm_steps + steps > config.max_new_tokens:
    raise ValueError(f"warm_steps + steps = {warm_steps + steps} steps need max_new_tokens >= that "
                     f"(a row emits at least one token per step), got {config.max_new_tokens}")
  plan = prepare(target, draft, prompts, config, **prepare_kw)
  if plan.calibrate:  # the costs the decode would decide by (runner.run does the same first)
    plan, _ = calibration.calibrate(plan, runner.run)
  spec = plan.spec
  target_params, draft_params, temperature, top_p = plan.args_tail
  options = spec.xla_options
  state = jax.jit(functools.partial(loop_lib.prefill, spec),
                  compiler_options=options)(*plan.args_prefill)
  # Every program takes the weights and sampling parameters as arguments, as the decode does: closed
  # over, they would be constants, which XLA's CPU backend folds and pre-packs for its matmuls (a
  # SmolLM2 head then costs about half of what it costs in the decode), and the programs would time
  # a different computation from the one they stand for.
  weights = (target_params, draft_params, temperature, top_p)

  def decode_until(s, limit, target_params, draft_params, temperature, top_p):
    return loop_lib.decode(spec, s.replace(limits=s.limits.replace(step_limit=limit)), target_params,
                           draft_params, temperature, top_p, jnp.bool_(False))

  state = jax.jit(decode_until, donate_argnums=0, compiler_options=options)(
      state, jnp.int32(warm_steps), *weights)
  k = steps
  batch = state.tokens.shape[0]

  def repeat(body):  # k repetitions of body(weights, state) -> state, one program, the state donated
    return jax.jit(lambda s, *w: jax.lax.fori_loop(0, k, lambda _, s: body(*w, s), s),
                   compiler_options=options,
                   donate_argnums=0)

  loop_program = jax.jit(lambda s, *w: decode_until(s, s.step + k, *w), donate_argnums=0,
                         compiler_options=options)
  ran = loop_program(_fresh(state), *weights)  # what the timed steps do (the step alone does the same)
  if int(ran.step - state.step) != k:
    raise ValueError(f"every row finished within {int(ran.step)} steps, before the {k} timed steps "
                     f"after {warm_steps} warm-up steps; raise max_new_tokens or use prompts whose "
                     "answers are longer")

  def proposing(proposer):
    own = proposer is spec.proposer  # else one of a hybrid's lookups, stateless

    def body(target_params, draft_params, temperature, top_p, s):
      del target_params
      ctx = step_context(s, s.key, temperature, top_p, spec.acceptance)
      proposer_state, proposal = proposer.propose(draft_params if own else None, s.proposer_state,
                                                  ctx, max_len=spec.max_draft,
                                                  chunk=spec.verify_chunk, greedy=spec.greedy)
      if own:  # the same text again next time
        s = s.replace(proposer_state=proposer.rollback(proposer_state, s.tokens, s.seq_len,
                                                       s.seq_len))
      # The drafts feed the next repetition's key, so that no repetition is dead code.
      return s.replace(key=jax.random.fold_in(s.key, jnp.sum(proposal.drafts)))
    return repeat(body)

  def verifying(target_params, draft_params, temperature, top_p, s):
    del draft_params, temperature, top_p
    tokens = jnp.broadcast_to(s.tokens[:, :1], (batch, spec.verify_chunk))
    logits, cache, features = _target_forward(spec, target_params, tokens, s.target_cache, s.features)
    # The logits feed the next repetition, or the compiler would drop the head's projection. Through
    # their log-normalizer, as acceptance reads them: a single reduction (a sum, a max) would be
    # fused into the head's matmul, and a sum rewritten as x @ sum(W), timing a cheaper head.
    return s.replace(target_cache=cache.with_lengths(s.target_cache.lengths), features=features,
                     key=jax.random.fold_in(s.key, jnp.sum(jax.nn.logsumexp(logits, axis=-1))
                                            .astype(jnp.int32)))

  def plain(target_params, draft_params, temperature, top_p, s):
    del draft_params
    return plain_step(spec, target_params, temperature, top_p, s)

  lookups = spec.proposer.lookups if isinstance(spec.proposer, Hybrid) else ()
  programs = [loop_program, repeat(functools.partial(chain_step, spec)), repeat(plain),
              proposing(spec.proposer), repeat(verifying)] + [proposing(p) for p in lookups]
  seconds = costs.fastest_seconds(programs, repeats, inputs=lambda: (_fresh(state), *weights))
  loop_s, step_s, plain_s, propose_s, pass_s, *lookup_s = [t / k for t in seconds]

  timed = slice(int(state.step), int(state.step) + k)
  live = ran.log.accepted[timed] >= 0
  return StepPhases(
      loop=loop_s, step=step_s, plain=plain_s, propose=propose_s, lookup=sum(lookup_s),
      verify_pass=pass_s,
      passes=float(jnp.mean(ran.log.verified[timed])) / spec.verify_chunk,
      chunk=spec.verify_chunk,
      draft_len=float(jnp.mean(ran.log.draft_len[timed])),
      accepted=float(jnp.sum(jnp.where(live, ran.log.accepted[timed], 0)) / jnp.sum(live)),
      batch=len(prompts), steps=k)

_CONTROL_OPCODES = ("while", "conditional", "call")


def instruction_scopes(hlo_text: str) -> dict[str, tuple[str, str]]:
  """Every instruction of a compiled HLO module with its opcode and step scope.

  An instruction's scope is the first of ``step.STEP_SCOPES`` in its op name (the ``jax.named_scope``
  of the code that traced it), or ``"other"`` if its op name names none (code outside the step's
  phases: loop control, keys, the policy). XLA drops the metadata of some instructions it creates
  (the outer instruction of a fusion, a dot it splits out), so an instruction with no op name at all
  takes, in this order, the scope of the first instruction with an op name inside the computation it
  fuses, that of its first operand with one (by op name or fusion), and the scope of the instruction
  that calls its computation (a loop's body or condition, a call); in the entry computation,
  ``"other"``.

  Args:
    hlo_text: a compiled module's text (``jax.stages.Compiled.as_text()``): computations headed
      ``%name (...) -> ... {``, the entry one ``ENTRY``-prefixed, one instruction per line.

  Returns:
    ``{instruction name: (opcode, scope)}`` for every instruction of the entry computation and of
    the computations it reaches; empty for a text without an entry computation.
  """
  computations: dict[str, list[tuple[str, str, str | None, list[str], list[str]]]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    header = re.match(r"(ENTRY )?%?([\w.\-]+) \(.*\{$", line)
    if header:
      current = header.group(2)
      computations[current] = []
      entry = current if header.group(1) else entry
      continue
    found = re.match(r"\s+(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w-]*)\((.*)", line)
    if current is None or not found:
      continue
    op_name = re.search(r'op_name="([^"]*)"', line)
    scope = None if op_name is None else next(
        (part for part in op_name.group(1).split("/") if part in STEP_SCOPES), "other")
    callees = re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", line)
    for branches in re.findall(r"branch_computations=\{([^}]*)\}", line):
      callees += [b.strip().lstrip("%") for b in branches.split(",")]
    operands = re.findall(r"%([\w.\-]+)", found.group(3).split("), ")[0])
    computations[current].append((found.group(1), found.group(2), scope, callees, operands))

  def named_inside(computation, seen=()):  # the scope of its first instruction with an op name
    for _, opcode, scope, callees, _ in computations.get(computation, ()):
      if scope:
        return scope
      for callee in callees if opcode == "fusion" else ():
        if callee not in seen and (found := named_inside(callee, seen + (callee,))):
          return found
    return None

  named = {}  # instruction -> the scope its op name or its fusion's computation gives, or None
  for instructions in computations.values():
    for name, opcode, scope, callees, _ in instructions:
      named[name] = scope or (named_inside(callees[0]) if opcode == "fusion" and callees else None)
  scopes: dict[str, tuple[str, str]] = {}
  inherited = {entry: "other"}
  pending = [entry] if entry is not None else []
  while pending:  # callers before callees, each computation once (the first caller's scope)
    computation = pending.pop()
    for name, opcode, _, callees, operands in computations.get(computation, ()):
      scope = (named[name] or next((named[o] for o in operands if named.get(o)), None)
               or inherited[computation])
      scopes[name] = (opcode, scope)
      for callee in callees:
        if callee not in inherited:
          inherited[callee] = scope
          pending.append(callee)
  return scopes


def profile_step_scopes(target, draft, prompts, **kwargs) -> dict[str, float]:
  """Where a decode's compiled work goes, by step phase: a ``jax.profiler`` trace of one ``generate``
  call (after one compiling call of the same setting), its events mapped to the decode program's
  instructions, and each instruction to the first of ``step.STEP_SCOPES`` in its op name (the
  ``jax.named_scope`` of the step code that traced it), else ``"other"`` (loop control, the random
  keys, the draft-length policy, bookkeeping).

  Unlike :func:`measure_step_phases` it times the real steps inside the real loop, with nothing
  compiled apart; the price is that it sums the events' durations: work that runs on several threads
  at once counts on each, so the values add up to more than the wall time and are read as shares.
  On the CPU backend, whose events name their HLO module and instruction (a GPU trace names kernels:
  read the op names in TensorBoard's or Perfetto's view there); only the decode program's events
  count, not the prefill's.

  Args:
    target, draft, prompts: as for ``bass_jax.generate``.
    **kwargs: ``generate``'s keyword arguments.

  Returns:
    ``{scope: seconds per decode step}`` for each of ``STEP_SCOPES`` and ``"other"``, summed over
    threads (a control-flow instruction's own event, which spans its body's, is left out).

  Raises:
    ValueError: not on the CPU backend; the profiler wrote no trace file, or several; and as
      ``generate`` (the two ``generate`` calls and the compiled program looked up take the same
      ``**kwargs``).
  """
  if jax.default_backend() != "cpu":
    raise ValueError(f"profile_step_scopes reads the CPU backend's trace; this is "
                     f"{jax.default_backend()!r} (read the op names in a profiler's view there)")
  generate_lib.generate(target, draft, prompts, **kwargs)  # compiles, and warms the caches
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      out = generate_lib.generate(target, draft, prompts, **kwargs)
    paths = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    if len(paths) != 1:
      raise ValueError(f"profile_step_scopes: the profiler wrote {len(paths)} trace files, expected 1")
    path, = paths
    with gzip.open(path) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  config, prepare_kw, _ = split_keywords(kwargs)
  plan = prepare(target, draft, prompts, config, **prepare_kw)
  (_, decode), _, _ = programs.compiled(plan.spec, plan.args_prefill,
                                     (*plan.args_tail, plan.place(True)))  # cached
  text = decode.as_text()
  module = re.match(r"HloModule ([\w.\-]+)", text).group(1)
  scope_of = {name: scope for name, (opcode, scope) in instruction_scopes(text).items()
              if opcode not in _CONTROL_OPCODES}
  seconds = dict.fromkeys(STEP_SCOPES + ("other",), 0.0)
  for event in events:
    args = event.get("args", {})
    if event.get("ph") == "X" and args.get("hlo_module") == module and args.get("hlo_op") in scope_of:
      seconds[scope_of[args["hlo_op"]]] += 1e-6 * event.get("dur", 0)
  steps = max(int(out.stats.steps), 1)
  return {scope: s / steps for scope, s in seconds.items()}
