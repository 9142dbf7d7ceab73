r"""Token trees against chains and regular decoding, side by side (issue 25's table).

    python -m experiments.benchmarks.bench_trees --prompts=humaneval --num_prompts=8 --batch_sizes=1,2 \
        --temperatures=0,0.2 --trees=top_k=4,depth=5,nodes=16

For every batch size and temperature, each configuration decodes the same prompts (distinct prompts
per batch when greedy, ``batch_size`` samples of each prompt when sampling) through
``experiment.run_problems``: regular decoding, each draft side as a chain at ``--chain_len`` and as
each tree of ``--trees`` (``generate(draft_tree=...)``). Each configuration runs its whole pass in turn; with ``--rounds``
the set repeats with the order reversed every other round, so that a machine that slows down mid-run
slows all alike, and the table pools the rounds. One markdown row per configuration: mean accepted length
(tokens per step per row, bonus counted), per-token latency All (ms, BASS §4.1) and its ratio to
regular decoding's in the same rounds, and the share of speculative steps that verified a tree, the
mean real nodes per tree and the share of plain steps. With ``--goodput`` each draft side also runs
under the goodput policy over chains alone and over chains and every tree of ``--trees`` (the policy
choosing per step, ``generate(draft_len="goodput", draft_tree=[...])``). Tuning uses ``--prompts=stdlib-heldout``; HumanEval only
evaluates a choice made there.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_DRAFTS = flags.DEFINE_list("drafts", ["smollm2-135m-eagle", "hybrid:smollm2-135m-eagle"],
                            "Draft sides (as experiments.generate's --draft).")
_TREES = flags.DEFINE_multi_string("trees", ["top_k=4,depth=5,nodes=16"],
                                   "Tree shapes (repeat the flag for several).")
_CHAIN_LEN = flags.DEFINE_string("chain_len", "4", "The chains' --draft_len ('dynamic', 'goodput', "
                                 "an int).")
_GOODPUT = flags.DEFINE_bool("goodput", False, "Also run each draft side under the goodput policy "
                             "with chains only and with chains and every tree of --trees (one "
                             "decode choosing per step).")
_FIXED = flags.DEFINE_bool("fixed_trees", True, "Run each tree of --trees on every step.")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt source.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "Prompts.", lower_bound=1)
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "2"], "Batch sizes.")
_TEMPERATURES = flags.DEFINE_list("temperatures", ["0", "0.2"], "Temperatures (top-p 0.95 when > 0).")
_MAX_NEW = _decode_flags.define(max_new_tokens=128)["max_new_tokens"]
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Repetitions of the whole set.", lower_bound=1)
_WARMUP = flags.DEFINE_bool("warmup", True, "Decode each run's first batch once, untimed, first "
                            "(run_problems(warmup=True)): a fresh program's first execution costs "
                            "more. The tables of 2026-11-24 in docs/design.md ran before this flag "
                            "existed, as --nowarmup does.")


def main(argv):
  del argv
  _io.init_script()
  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax as bj  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import experiment  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation.data import load_problems  # pylint: disable=g-import-not-at-top

  target = bj.load_model(_TARGET.value)
  drafts = {spec: bj.load_draft_spec(spec, target) for spec in _DRAFTS.value}
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  configs = [("regular", None, None, None)]
  for spec in drafts:
    configs.append((f"{spec} chain l={_CHAIN_LEN.value}", spec, _io.draft_len_value(_CHAIN_LEN.value),
                    None))
    if _FIXED.value:
      configs += [(f"{spec} tree {shape}", spec, "dynamic", shape) for shape in _TREES.value]
    if _GOODPUT.value:
      configs.append((f"{spec} goodput chains", spec, "goodput", None))
      configs.append((f"{spec} goodput chains + trees", spec, "goodput", list(_TREES.value)))
  print(f"target {_TARGET.value}; prompts {_PROMPTS.value} x {_NUM_PROMPTS.value}; "
        f"{_MAX_NEW.value} new tokens; {_ROUNDS.value} round(s)", flush=True)
  for temperature in map(float, _TEMPERATURES.value):
    for batch in map(int, _BATCHES.value):
      results = {name: [] for name, *_ in configs}
      for r in range(_ROUNDS.value):
        for name, spec, draft_len, tree in (configs if r % 2 == 0 else configs[::-1]):
          run = experiment.run_problems(
              target, drafts.get(spec), problems, batch_size=batch,
              method="regular" if spec is None else "bass", max_new_tokens=_MAX_NEW.value,
              temperature=temperature, top_p=0.95 if temperature > 0 else 1.0,
              draft_len=draft_len or "dynamic", draft_tree=tree, progress=False,
              warmup=_WARMUP.value)
          results[name].append(run.summary)
      regular = np.mean([s["ms_per_token_all"] for s in results["regular"]])
      print(f"\nT = {temperature}, B = {batch}\n\n| configuration | mean accepted length | "
            "ms/token All | vs regular | tree steps | nodes per tree | plain steps |\n"
            "|---|---|---|---|---|---|---|")
      for name, summaries in results.items():
        ms = np.mean([s["ms_per_token_all"] for s in summaries])
        accepted = np.mean([s["mean_accepted_length"] for s in summaries])
        share = lambda key: ("" if summaries[0].get(key) is None
                             else f"{np.mean([s[key] for s in summaries]):.2f}")
        print(f"| {name} | {accepted:.2f} | {ms:.1f} | {regular / ms:.2f}x | "
              f"{share('tree_step_share')} | {share('mean_tree_nodes')} | "
              f"{share('plain_step_share')} |", flush=True)


if __name__ == "__main__":
  _io.run(main)
