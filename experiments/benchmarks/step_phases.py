r"""Where a BASS step's time goes: the per-phase cost breakdown of a chain step.

    python -m experiments.benchmarks.step_phases --draft=hybrid:smollm2-135m-eagle --batch_sizes=1,4

For each batch size (the ``b`` longest of the first ``--num_prompts`` tuning prompts, distinct rows),
``bass_jax.sampling.phases.measure_step_phases`` decodes ``--warm_steps`` steps at the fixed draft
length ``--draft_len`` and then times, from that state, ``--steps`` steps of each program: the decode
loop, the chain step alone, a plain step, the proposer's drafts (and a hybrid's lookups alone), one
verification pass. The table gives milliseconds per step and, in plain steps, the step's overhead
(loop - verify - propose: acceptance, commit and loop control), whose goal is at most 0.1 plain step.

With ``--profile``, a second table splits the real decode's compiled work by step scope
(``phases.profile_step_scopes``: a profiler trace of one ``generate`` call at the same setting, its
events summed by the ``jax.named_scope`` of the step code that traced each instruction), milliseconds
per step summed over the CPU's threads, and each scope's share of the total.
"""

from absl import flags

from bass_jax.sampling.phases import measure_step_phases, profile_step_scopes
from bass_jax.sampling.step import STEP_SCOPES
from experiments import _decode_flags
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_DRAFT = _io.define_draft_flag("hybrid:smollm2-135m-eagle")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set (a tuning set, not HumanEval).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts (>= the largest batch).",
                                    lower_bound=1)
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "4"], "Batch sizes.")
_io.require_positive_ints("batch_sizes")
_DRAFT_LEN = flags.DEFINE_integer("draft_len", 3, "Fixed draft length l of every step.", lower_bound=1)
_DECODE = _decode_flags.define("temperature", "top_p", max_new_tokens=128)  # >= warm_steps + steps
_TEMPERATURE, _TOP_P, _MAX_NEW = (_DECODE[n] for n in ("temperature", "top_p", "max_new_tokens"))
_WARM = flags.DEFINE_integer("warm_steps", 4, "Steps decoded before the timed state.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 16, "Steps per timed call.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per program (the fastest counts).",
                                lower_bound=1)
_PROFILE = flags.DEFINE_bool("profile", False, "Also split a traced decode's work by step scope.")


def main(argv):
  del argv
  _io.init_script()
  batches = [int(b) for b in _BATCHES.value]
  target, draft, by_batch = _io.models_and_batches(_TARGET.value, _DRAFT.value, _PROMPTS.value,
                                                   _NUM_PROMPTS.value, batches)
  print(f"target {target.name}, draft {_DRAFT.value}, l = {_DRAFT_LEN.value}, temperature "
        f"{_TEMPERATURE.value}, top-p {_TOP_P.value}; ms per step, fastest of {_REPEATS.value} calls "
        f"of {_STEPS.value} steps after {_WARM.value} warm-up steps; overhead = loop - verify - "
        "propose, in plain steps\n")
  print("| B | accepted | plain | loop | step alone | propose (lookup) | verify (passes x C) | "
        "accept + commit | control | overhead (plain steps) |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for b in batches:
    p = measure_step_phases(target, draft, by_batch[b], draft_len=_DRAFT_LEN.value,
                            temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
                            max_new_tokens=_MAX_NEW.value, warm_steps=_WARM.value,
                            steps=_STEPS.value, repeats=_REPEATS.value)
    ms = lambda s: f"{1e3 * s:.1f}"
    print(f"| {b} | {p.accepted:.2f} | {ms(p.plain)} | {ms(p.loop)} | {ms(p.step)} | "
          f"{ms(p.propose)} ({ms(p.lookup)}) | {ms(p.verify)} ({p.passes:.2f} x {p.chunk}) | "
          f"{ms(p.accept_commit)} | {ms(p.control)} | {p.overhead / p.plain:.2f} |", flush=True)
  if not _PROFILE.value:
    return
  scopes = STEP_SCOPES + ("other",)
  print(f"\nThe traced decode by step scope (max_new_tokens {_MAX_NEW.value}): ms per step summed over "
        "threads, and each scope's share\n")
  print("| B | " + " | ".join(scopes) + " |")
  print("|---|" + "---|" * len(scopes))
  for b in batches:
    seconds = profile_step_scopes(target, draft, by_batch[b], method="bass", draft_len=_DRAFT_LEN.value,
                                  temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
                                  max_new_tokens=_MAX_NEW.value)
    total = sum(seconds.values())
    print(f"| {b} | " + " | ".join(f"{1e3 * seconds[s]:.2f} ({seconds[s] / total:.0%})"
                                   for s in scopes) + " |", flush=True)


if __name__ == "__main__":
  _io.run(main)
