r"""Greedy BASS against greedy regular decoding on real prompts: exact-match rate and near-ties.

    python -m experiments.paper.lossless --num_prompts=16 --batch_size=4 --max_new_tokens=64

Batches hold *different* HumanEval prompts (so rows have different lengths). For every row whose BASS
tokens differ from regular decoding, prints where, and the target's top-2 logit gap there: verification
runs the target on ``l_draft + 1`` tokens and regular decoding on 1, so float rounding differs in the
last bits and can flip a near-tie, never a clear decision.

With ``--summary_json`` the result is rewritten after every batch (``"complete": false`` until the
last); ``--resume`` keeps the batches it holds (same settings required) and decodes the rest.
"""


from absl import flags
import tqdm

import bass_jax
from bass_jax import text
from bass_jax.evaluation import metrics
from bass_jax.evaluation.data import load_problems
from experiments import _decode_flags
from experiments import _io
from experiments import _runs

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target: alias, .gguf, or HF dir.")
_DRAFT = _io.define_draft_flag("smollm2-135m-instruct")
_DRAFT_LAYERS = flags.DEFINE_integer("draft_num_layers", 4, "Keep the draft's first N layers (0 = all).")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 16, "First N HumanEval prompts.")
_DECODE = _decode_flags.define("draft_len", max_new_tokens=64, batch_size=4)  # distinct prompts a batch
_BATCH, _MAX_NEW = _DECODE["batch_size"], _DECODE["max_new_tokens"]
_SUMMARY = flags.DEFINE_string("summary_json", None, "JSON file for the result.")


def main(argv):
  del argv
  _io.init_script()
  try:
    summary_path = _io.check_output_file(_SUMMARY.value, flag="summary_json")
    earlier = {}
    if summary_path is not None:
      _runs.refuse_existing(summary_path, "a lossless result")
      if _runs.RESUME.value:
        stored = _runs.read_json(summary_path)
        if stored is not None:
          _runs.check_settings(summary_path, stored.get("settings"), _runs.settings(__name__))
          earlier = {b["start"]: b for b in stored.get("batches", [])}
    elif _runs.RESUME.value:
      raise _io.Refusal("--resume needs --summary_json, where the finished batches are kept")
  except (_io.OutputError, _runs.RunError) as e:
    raise _io.Refusal(str(e)) from e
  _io.inspect_models(_TARGET.value, _DRAFT.value)
  target = bass_jax.load_model(_TARGET.value)
  draft = bass_jax.load_draft_spec(_DRAFT.value, target, num_layers=_DRAFT_LAYERS.value or None)
  draft_len = _DECODE.values()["draft_len"]
  prompts = text.encode_prompts(
      target.tokenizer, [p.prompt for p in load_problems("humaneval", _NUM_PROMPTS.value)])
  header = dict(target=target.name, draft=draft.name, num_prompts=len(prompts),
                max_new_tokens=_MAX_NEW.value, draft_len=str(draft_len),
                settings=_runs.settings(__name__))
  batches = []  # per batch: tokens compared, matched, divergences (the unit --resume keeps)
  bar = tqdm.tqdm(total=len(prompts), desc="lossless", unit="seq")
  for start in range(0, len(prompts), _BATCH.value):
    if start in earlier:
      batches.append(earlier[start])
      bar.update(len(prompts[start:start + _BATCH.value]))
      continue
    batch = prompts[start:start + _BATCH.value]
    regular = bass_jax.generate(target, None, batch, method="regular", max_new_tokens=_MAX_NEW.value)
    bass = bass_jax.generate(target, draft, batch, method="bass", max_new_tokens=_MAX_NEW.value,
                             draft_len=draft_len)
    agreement = metrics.greedy_agreement(target, batch, regular.sequences(), bass.sequences())
    n = int(regular.lengths.sum())
    batches.append(dict(start=start, tokens=n, matched=round(agreement.exact_match_rate * n),
                        divergences=[dict(prompt=start + d.row, index=d.index, top2_gap=d.top2_gap)
                                     for d in agreement.divergences]))
    bar.update(len(batch))
    bar.set_postfix_str(f"{sum(b['matched'] for b in batches)}/{sum(b['tokens'] for b in batches)} "
                        "tokens equal")
    if summary_path:
      _io.write_json_atomic(summary_path, {**header, "batches": batches, "complete": False})
  bar.close()
  total = sum(b["tokens"] for b in batches)
  matched = sum(b["matched"] for b in batches)
  divergences = [d for b in batches for d in b["divergences"]]
  result = dict(header, tokens=total, exact_match_rate=matched / total,
                rows_diverged=len(divergences),
                max_top2_gap_at_divergence=max((d["top2_gap"] for d in divergences), default=None),
                divergences=divergences, batches=batches, complete=True)
  print(f"exact-match rate {matched}/{total} = {matched / total:.4f}; "
        f"{len(divergences)} of {len(prompts)} rows diverged")
  for d in divergences:
    print(f"  prompt {d['prompt']}: first differs at token {d['index']}, "
          f"target top-2 logit gap {d['top2_gap']:.2e}")
  if summary_path:
    _io.write_json_atomic(summary_path, result)


if __name__ == "__main__":
  _io.run(main)
