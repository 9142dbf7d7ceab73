r"""What a BASS decode costs when it never speculates: its plain steps against regular decoding.

    python -m experiments.benchmarks.bench_plain_steps --batch_size=8 --rounds=3

The cost-aware draft length falls back to plain steps (one target position per row) where speculation
cannot pay; its promise is then "no slower than regular decoding". This measures how close the BASS
program comes to it. Each proposer runs under a ``GoodputDraftLen`` whose step costs make every draft
length lose (``verify_pass`` 100x a plain step), so every step is plain and the tokens are exactly
regular decoding's; rounds alternate regular decoding and each proposer, so the machine's drift hits
every configuration alike. Prints the median per-token latency All over the rounds and its ratio to
regular decoding's. The prompts are the tuning set by default.
"""

import statistics

from absl import app
from absl import flags

import bass_jax
from bass_jax.evaluation import experiment
from bass_jax.evaluation.data import load_problems
from experiments import _decode_flags
from experiments import _io

_PROPOSERS = flags.DEFINE_list(
    "proposers", ["smollm2-135m-draft", "ngram", "hybrid:smollm2-135m-draft"],
    "Draft specs (bass_jax.load_draft_spec; the grammar: --draft=help of experiments.generate), "
    "comma-separated, so without settings.")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set (bass_jax.evaluation.data.load_problems).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts (>= batch_size).", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 8, "Distinct prompts per batch.", lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=48)["max_new_tokens"]
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.", lower_bound=1)


def main(argv):
  del argv
  _io.init_script()
  if _NUM_PROMPTS.value < _BATCH.value:
    raise app.UsageError(f"--num_prompts={_NUM_PROMPTS.value} is fewer than --batch_size={_BATCH.value}")
  target = bass_jax.load_model("smollm2-135m-instruct")
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  never = bass_jax.GoodputDraftLen(costs=bass_jax.StepCosts(
      plain=1.0, verify_pass=100.0, propose_first=0.0, propose_next=0.0, chunk=4))
  configs = {"regular decoding": (None, {"method": "regular"})}
  for spec in _PROPOSERS.value:
    configs[f"BASS, {spec}, plain steps only"] = (bass_jax.load_draft_spec(spec, target),
                                                  {"method": "bass", "draft_len": never})
  times: dict[str, list[float]] = {name: [] for name in configs}
  for _ in range(_ROUNDS.value):
    for name, (draft, kw) in configs.items():
      s = experiment.run_problems(target, draft, problems, batch_size=_BATCH.value,
                                  max_new_tokens=_MAX_NEW.value, progress=False, warmup=True,
                                  distinct_prompts=True, **kw).summary
      if kw["method"] == "bass" and s["plain_step_share"] != 1.0:
        raise RuntimeError(f"{name}: {s['plain_step_share']:.0%} plain steps, expected all")
      times[name].append(s["ms_per_token_all"])
  reference = statistics.median(times["regular decoding"])
  print(f"B = {_BATCH.value}, {len(problems)} prompts of {_PROMPTS.value}, {_MAX_NEW.value} new tokens, "
        f"{_ROUNDS.value} alternating rounds\n")
  print("| configuration | ms/token All (median) | vs regular | rounds |")
  print("|---|---|---|---|")
  for name, values in times.items():
    print(f"| {name} | {statistics.median(values):.1f} | {statistics.median(values) / reference:.3f} | "
          + ", ".join(f"{v:.1f}" for v in values) + " |")


if __name__ == "__main__":
  _io.run(main)
