r"""The step costs the cost-aware draft length sees, and the acceptance at which speculating pays.

    python -m experiments.benchmarks.step_costs --draft=smollm2-135m-draft --batch_sizes=1,2,4,8

For each batch size, one ``draft_len="goodput"`` call of ``generate`` measures the setting's
``StepCosts`` exactly as a decode does (``bass_jax.sampling.costs``; the prompt and cache buckets of
the ``b`` longest of the first ``--num_prompts`` tuning prompts at ``--max_new_tokens``), and this
prints them with the break-even acceptance rate: the smallest per-position acceptance ``alpha`` (the
same at every position) at which some draft length ``l >= 1`` has a higher goodput than a plain step,
``(1 + alpha + ... + alpha^l) / cost(l) > 1 / plain`` (``sampling.step_costs.break_even_acceptance``). Above
it the cost-aware policy speculates; below it it decodes plainly.

On a GPU (the branch-free profile) the costs are measured in the decode's own programs
(``bass_jax.sampling.calibration``): a plain step and a whole speculative step, which the table shows
as "plain step" and "speculative step", its draft columns 0 (``fixed_drafts`` says the loop's L).
"""

from absl import flags

import bass_jax
from bass_jax.sampling.step_costs import break_even_acceptance
from experiments import _decode_flags
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_DRAFT = _io.define_draft_flag("smollm2-135m-draft")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set whose buckets are used.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts (>= the largest batch).",
                                    lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=48)["max_new_tokens"]  # the measured setting's bucket
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "2", "4", "8"], "Batch sizes.")
_io.require_positive_ints("batch_sizes")


def main(argv):
  del argv
  _io.init_script()
  batches = [int(b) for b in _BATCHES.value]
  target, draft, by_batch = _io.models_and_batches(_TARGET.value, _DRAFT.value, _PROMPTS.value,
                                                   _NUM_PROMPTS.value, batches)
  print(f"target {target.name}, draft {_DRAFT.value}; ms per piece of a step (fastest of 7; plain "
        "step and verification pass timed interleaved)\n")
  print("| B | plain step | verify pass (C positions), or the whole speculative step when calibrated | "
        "C | first draft | next draft | fixed drafts (calibrated) | break-even alpha | at l |")
  print("|---|---|---|---|---|---|---|---|---|")
  for b in batches:
    c = bass_jax.generate(target, draft, by_batch[b], max_new_tokens=_MAX_NEW.value,
                          draft_len="goodput").stats.step_costs
    alpha, length = break_even_acceptance(c, max_len=bass_jax.GoodputDraftLen().max_len)
    print(f"| {b} | {1e3 * c.plain:.1f} | {1e3 * c.verify_pass:.1f} | {c.chunk} | "
          f"{1e3 * c.propose_first:.1f} | {1e3 * c.propose_next:.1f} | {c.fixed_drafts or ''} | "
          f"{alpha:.2f} | {length} |",
          flush=True)


if __name__ == "__main__":
  _io.run(main)
