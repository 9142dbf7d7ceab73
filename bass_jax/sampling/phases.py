"""Where a BASS step's time goes: :func:`measure_step_phases`, the per-phase cost breakdown of a chain
step (propose, verify, accept and commit, control) on the machine at hand.

A decode step is one jitted program, so its phases cannot be timed inside it (no clock runs in the
loop). Instead each phase is compiled on its own, as ``k`` repetitions in a ``fori_loop`` (one program
call, so no dispatch cost is counted per step), over the state of a real decode ``warm_steps`` steps
in, and the step and the loop around it are timed the same way:

- **loop**: the decode itself (``loop.decode``), run for ``k`` more steps: what a step costs in a run;
- **step**: ``k`` chain steps (``step.bass_step``) in a ``fori_loop``, without the decode loop's
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
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.sampling import costs
from bass_jax.sampling import loop as loop_lib
from bass_jax.sampling.proposers import HybridProposer
from bass_jax.sampling.step import _target_forward, bass_step, plain_step, step_context


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
  from bass_jax.sampling import generate as generate_lib  # pylint: disable=g-import-not-at-top

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
  arguments = generate_lib._arguments(target, draft, prompts, method="bass", **kwargs)
  max_new = arguments["max_new_tokens"]  # generate's default where not given
  if warm_steps + steps > max_new:
    raise ValueError(f"warm_steps + steps = {warm_steps + steps} steps need max_new_tokens >= that "
                     f"(a row emits at least one token per step), got {max_new}")
  call = generate_lib._prepare(**arguments)
  spec = call.spec
  target_params, draft_params, temperature, top_p, _ = call.args_tail
  state = jax.jit(functools.partial(loop_lib.prefill, spec))(*call.args_prefill)
  decode_until = jax.jit(lambda s, limit: loop_lib.decode(
      spec, s.replace(step_limit=limit), target_params, draft_params, temperature, top_p,
      jnp.bool_(False)), donate_argnums=0)
  state = decode_until(state, jnp.int32(warm_steps))
  k = steps
  batch = state.tokens.shape[0]

  def repeat(body):  # k repetitions of body(state) -> state, one program, the state donated
    return jax.jit(lambda s: jax.lax.fori_loop(0, k, lambda _, s: body(s), s), donate_argnums=0)

  loop_program = jax.jit(lambda s: decode_until(s, s.step + k), donate_argnums=0)
  ran = loop_program(_fresh(state))  # what the timed steps do (the step alone does the same)
  if int(ran.step - state.step) != k:
    raise ValueError(f"every row finished within {int(ran.step)} steps, before the {k} timed steps "
                     f"after {warm_steps} warm-up steps; raise max_new_tokens or use prompts whose "
                     "answers are longer")

  def proposing(proposer):
    own = proposer is spec.proposer  # else one of a hybrid's lookups, stateless

    def body(s):
      ctx = step_context(s, s.key, temperature, top_p, branch_free=spec.branch_free)
      proposer_state, proposal = proposer.propose(draft_params if own else None, s.proposer_state,
                                                  ctx, max_len=spec.max_draft,
                                                  chunk=spec.verify_chunk, greedy=spec.greedy)
      if own:  # the same text again next time
        s = s.replace(proposer_state=proposer.rollback(proposer_state, s.tokens, s.seq_len,
                                                       s.seq_len))
      # The drafts feed the next repetition's key, so that no repetition is dead code.
      return s.replace(key=jax.random.fold_in(s.key, jnp.sum(proposal.drafts)))
    return repeat(body)

  def verifying(s):
    tokens = jnp.broadcast_to(s.tokens[:, :1], (batch, spec.verify_chunk))
    logits, cache, features = _target_forward(spec, target_params, tokens, s.target_cache, s.features)
    # The logits feed the next repetition, or the compiler would drop the head's projection.
    return s.replace(target_cache=cache.with_lengths(s.target_cache.lengths), features=features,
                     key=jax.random.fold_in(s.key, jnp.sum(logits).astype(jnp.int32)))

  lookups = spec.proposer.lookups if isinstance(spec.proposer, HybridProposer) else ()
  programs = [loop_program,
              repeat(functools.partial(bass_step, spec, target_params, draft_params, temperature,
                                       top_p)),
              repeat(functools.partial(plain_step, spec, target_params, temperature, top_p)),
              proposing(spec.proposer), repeat(verifying)] + [proposing(p) for p in lookups]
  seconds = costs.fastest_seconds(programs, repeats, inputs=lambda: (_fresh(state),))
  loop_s, step_s, plain_s, propose_s, pass_s, *lookup_s = [t / k for t in seconds]

  timed = slice(int(state.step), int(state.step) + k)
  live = ran.accepted_history[timed] >= 0
  return StepPhases(
      loop=loop_s, step=step_s, plain=plain_s, propose=propose_s, lookup=sum(lookup_s),
      verify_pass=pass_s,
      passes=float(jnp.mean(ran.verified_history[timed])) / spec.verify_chunk,
      chunk=spec.verify_chunk,
      draft_len=float(jnp.mean(ran.draft_len_history[timed])),
      accepted=float(jnp.sum(jnp.where(live, ran.accepted_history[timed], 0)) / jnp.sum(live)),
      batch=len(prompts), steps=k)
