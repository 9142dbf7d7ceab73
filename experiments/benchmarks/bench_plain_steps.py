r"""What a BASS decode costs when it never speculates: its plain steps against regular decoding.

    python -m experiments.benchmarks.bench_plain_steps --batch_size=8 --rounds=3

The cost-aware draft length falls back to plain steps (one target position per row) where speculation
cannot pay; its promise is then "no slower than regular decoding". This measures how close the BASS
program comes to it. Each proposer runs under a ``GoodputDraftLen`` whose step costs make every draft
length lose (``verify_pass`` 100x a plain step), so every step is plain and the tokens are exactly
regular decoding's. The timing is ``bass_jax.evaluation.sweep``'s (warm-up, rounds in alternating
order, medians, ratios within a round): one markdown row per configuration, its median per-token
latency All and its ratio to regular decoding's. The prompts are the tuning set by default.
"""

from absl import app
from absl import flags

import bass_jax
from bass_jax.evaluation import sweep
from bass_jax.evaluation.data import load_problems
from experiments import _decode_flags
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target model spec.")
_PROPOSERS = flags.DEFINE_list(
    "proposers", ["smollm2-135m-draft", "ngram", "hybrid:smollm2-135m-draft"],
    "Draft specs (bass_jax.load_draft_spec; the grammar: --draft=help of experiments.generate), "
    "comma-separated, so without settings.")
_PROMPTS = flags.DEFINE_string("prompts", "stdlib-heldout", "Prompt set (bass_jax.evaluation.data.load_problems).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "First N prompts (>= batch_size).", lower_bound=1)
_DECODE = _decode_flags.define(max_new_tokens=48, batch_size=8)  # distinct prompts a batch
_BATCH, _MAX_NEW = _DECODE["batch_size"], _DECODE["max_new_tokens"]
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.", lower_bound=1)


def main(argv):
  del argv
  _io.init_script()
  if _NUM_PROMPTS.value < _BATCH.value:
    raise app.UsageError(f"--num_prompts={_NUM_PROMPTS.value} is fewer than --batch_size={_BATCH.value}")
  target = bass_jax.load_model(_TARGET.value)
  problems = load_problems(_PROMPTS.value, _NUM_PROMPTS.value)
  never = bass_jax.GoodputDraftLen(costs=bass_jax.StepCosts(
      plain=1.0, verify_pass=100.0, propose_first=0.0, propose_next=0.0, chunk=4))
  variants = [sweep.Variant("regular decoding")] + [
      sweep.Variant(f"BASS, {spec}, plain steps only", bass_jax.load_draft_spec(spec, target),
                    {"method": "bass", "draft_len": never}) for spec in _PROPOSERS.value]
  cells = sweep.run_sweep(target, problems, variants,
                          base=bass_jax.DecodeConfig(batch_size=_BATCH.value,
                                                     max_new_tokens=_MAX_NEW.value),
                          rounds=_ROUNDS.value, baseline="regular decoding", distinct_prompts=True)
  for cell in cells[1:]:
    shares = [r["plain_step_share"] for r in cell.rounds]
    if shares != [1.0] * len(shares):
      raise RuntimeError(f"{cell.variant}: plain step shares {shares}, expected all plain")
  print(f"B = {_BATCH.value}, {len(problems)} prompts of {_PROMPTS.value}, {_MAX_NEW.value} new tokens, "
        f"{_ROUNDS.value} rounds (bass_jax.evaluation.sweep's timing policy)\n")
  print(sweep.markdown(cells, baseline="regular decoding"))


if __name__ == "__main__":
  _io.run(main)
