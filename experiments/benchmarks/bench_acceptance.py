r"""What Gumbel acceptance costs: rejection sampling vs Gumbel acceptance (or any acceptance rules,
``--acceptance``), side by side.

    python -m experiments.benchmarks.bench_acceptance --draft=smollm2-135m-eagle --temperatures=0.2,0.6,0.8,1.0

``generate(acceptance="gumbel")`` (Daliri, Musco and Suresh 2024) makes every sampled token the target's
own Gumbel-max draw, so a sequence's tokens no longer depend on the draft, the batch or the queue (an
interrupted continuous run resumes exactly), at the price of some acceptance: a model draft's token
matches the target's draw with probability at least ``(1 - TV) / (1 + TV)`` instead of rejection
sampling's ``1 - TV``; a deterministic proposer loses nothing. This script measures that price on the
tuning prompts (never HumanEval): for each temperature, both rules decode the same batches
(``--batch_size`` samples of each of ``--num_prompts`` prompts, a fixed draft length), the rules
taking turns to go first batch by batch so that a busy machine slows both alike. It prints one markdown row per
temperature and rule: mean accepted length (tokens per step per row), the share of drafts accepted,
and tokens per second with its ratio to the first rule's.
"""

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_DRAFT = _io.define_draft_flag("smollm2-135m-eagle")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt source (the tuning prompts).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 4, "Prompts; each is one batch.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 4, "Samples of each prompt decoded together.", lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=64)["max_new_tokens"]
_DRAFT_LEN = flags.DEFINE_integer("draft_len", 4, "Fixed draft length.", lower_bound=1)
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0.2", "0.6", "0.8", "1.0"], "Temperatures (> 0).")
_TOP_P = flags.DEFINE_float("top_p", 0.95, "Nucleus mass.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed in [0, 2**63 - 1].", lower_bound=0,
                             upper_bound=2**63 - 1)

_ACCEPTANCE = flags.DEFINE_list(
    "acceptance", None, "The acceptance rules compared: registered names or py:<module>.<Class> (a "
    "bass_jax.AcceptanceRule of one's own); the first is the ratio column's baseline. Default: every "
    "registered rule, rejection sampling first.")


def main(argv):
  del argv
  _io.init_script()
  temperatures = [float(t) for t in _TEMPERATURES.value]
  if min(temperatures) <= 0:
    raise app.UsageError("--temperatures must all be > 0: greedy decoding has one acceptance rule")
  _io.inspect_models(_TARGET.value, _DRAFT.value)
  import bass_jax as bj  # pylint: disable=g-import-not-at-top
  from bass_jax import text  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import metrics, reproduce  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import acceptance  # pylint: disable=g-import-not-at-top

  rules = tuple(dict.fromkeys(_ACCEPTANCE.value or bj.acceptance_rules()))  # each rule once
  for rule in rules:
    try:
      acceptance.acceptance_rule(rule)
    except ValueError as e:
      raise app.UsageError(f"--acceptance: {e}") from None
  target, draft = reproduce.load_pair(_TARGET.value, _DRAFT.value)
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  prompts = text.encode_prompts(target.tokenizer, [p.prompt for p in problems])

  def decode(prompt, rule, temperature, seed):
    return bj.generate(target, draft, [prompt] * _BATCH.value, max_new_tokens=_MAX_NEW.value,
                       temperature=temperature, top_p=_TOP_P.value, draft_len=_DRAFT_LEN.value,
                       seed=seed, acceptance=rule)

  for rule in rules:  # compile every rule's program first (the temperature is traced: one per rule)
    decode(prompts[0], rule, temperatures[0], _SEED.value)
  print(f"| T | acceptance | mean accepted length | draft acceptance | tokens/s | vs {rules[0]} |")
  print("|---|---|---|---|---|---|")
  for temperature in temperatures:
    parts = {rule: [] for rule in rules}
    tokens = {rule: 0 for rule in rules}
    seconds = {rule: 0.0 for rule in rules}
    for i, prompt in enumerate(prompts):
      turn = i % len(rules)
      for rule in rules[turn:] + rules[:turn]:  # rotate which rule runs first
        out = decode(prompt, rule, temperature, _SEED.value + i)
        stats = out.stats
        parts[rule].append(metrics.acceptance(stats.draft_lens, stats.accepted, stats.drafted))
        tokens[rule] += int(out.lengths.sum())
        seconds[rule] += stats.wall_seconds
    speed = {rule: tokens[rule] / seconds[rule] for rule in rules}
    for rule in rules:
      pooled = metrics.Acceptance.pooled(parts[rule])
      print(f"| {temperature:g} | {rule} | {pooled.mean_accepted_length:.2f} | "
            f"{pooled.draft_acceptance_rate:.3f} | {speed[rule]:.1f} | "
            f"{speed[rule] / speed[rules[0]]:.2f}x |", flush=True)
  machine = reproduce.machine()
  print(f"\n{machine['device']}, JAX {machine['jax_version']}, {machine['date']}; "
        f"B={_BATCH.value}, {_NUM_PROMPTS.value} prompts of {_PROMPTS.value}, l={_DRAFT_LEN.value}, "
        f"top-p {_TOP_P.value}, {_MAX_NEW.value} new tokens; draft {_DRAFT.value}")


if __name__ == "__main__":
  _io.run(main)
