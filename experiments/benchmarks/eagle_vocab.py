r"""FR-Spec's trade-off for an EAGLE draft: draft vocabulary size V' against acceptance and cost.

    python -m experiments.benchmarks.eagle_vocab --draft=smollm2-135m-eagle --corpus=data/eagle \
        --vocab_sizes=1024,2048,4096,8192 --batch_sizes=1,4,8 --output=results/eagle_vocab.json

For each V' (a prefix of the draft's frequency-sorted vocabulary; the head scores only those tokens):

* **coverage**: the share of held-out next tokens (continuations of prompts from held-out stdlib files,
  never HumanEval) inside the V' tokens;
* **agreement**: the share of held-out positions where the draft's argmax is the target's argmax over
  the whole vocabulary, with teacher-forced features: greedy BASS's acceptance of the first draft;
* **cost**: the draft's single-pair forward plus head (one further draft) and its catch-up forward, in
  ms, and the single draft's cost as a share of one target forward (one position per row), all at the
  same batch size, timed side by side in this process (medians of 5 calls after a compiling one).
"""

import pathlib

from absl import app
from absl import flags
import jax
import numpy as np

import bass_jax
from bass_jax.checkpoints import eagle_files
from bass_jax.models import eagle
from bass_jax.sampling import costs
from bass_jax.sampling.generate import output_bucket, prompt_bucket
from bass_jax.sampling.proposers import EagleProposer
from bass_jax.training import corpus, feature_draft
from experiments import _io

_DRAFT = flags.DEFINE_string("draft", "smollm2-135m-eagle", "The EAGLE draft (alias or directory).")
_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Its target.")
_CORPUS = flags.DEFINE_string("corpus", "data/eagle", "Feature corpus with gen_eval_*.npz shards.")
_SIZES = flags.DEFINE_list("vocab_sizes", ["1024", "2048", "4096", "8192"], "V' values to compare.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "4", "8"], "Batch sizes of the cost measurement.")
_DRAFT_LEN = flags.DEFINE_integer("max_draft_len", 4, "L: sets the catch-up width, min(L + 1, 5).")
_OUTPUT = flags.DEFINE_string("output", None, "JSON file for the table's numbers.")
_io.require_positive_ints("vocab_sizes")
_io.require_positive_ints("batch_sizes")


def main(argv):
  del argv  # _io.run refuses arguments that are not flags
  _io.init_script()
  try:
    output = _io.check_output_file(_OUTPUT.value, flag="output")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  shards = sorted(pathlib.Path(_CORPUS.value).glob("gen_eval_*.npz"))
  if not shards:
    raise app.UsageError(f"--corpus={_CORPUS.value} holds no gen_eval_*.npz shards: build them with "
                         "experiments.build_corpus --labels=features")
  eval_data = corpus.load_shards(shards)
  if "features" not in eval_data:
    raise app.UsageError(f"{_CORPUS.value} holds no features: build_corpus --labels=features")
  target = bass_jax.load_model(_TARGET.value, tokenizer=False)
  draft = bass_jax.load_model(_DRAFT.value, tokenizer=False)
  if not isinstance(draft.config, eagle.EagleConfig):
    raise app.UsageError(f"{_DRAFT.value} is not an EAGLE draft")
  # The whole stored frequency order (the loaded draft keeps only its own V' of it).
  full_vocab = eagle_files.load_vocab_order(bass_jax.loading.model_path(_DRAFT.value))
  sizes = list(map(int, _SIZES.value))
  coverage = feature_draft.vocab_coverage(full_vocab, eval_data["tokens"], eval_data["mask"], sizes)
  dtype = np.dtype(draft.dtype).name
  # A decode of 8 prompts of <= 256 tokens and 64 new ones: the cache length the costs are timed at.
  cache_len = prompt_bucket(256) + output_bucket(64) + _DRAFT_LEN.value + 1
  head = eagle.lm_head_matrix(target.config, target.params)
  rows = []
  for size in sizes:
    if size > len(full_vocab):
      raise app.UsageError(f"V' = {size} exceeds the draft's vocabulary of {len(full_vocab)} tokens")
    config = draft.config.with_draft_vocab_size(size)
    frozen, _ = feature_draft.frozen_inputs(config, target.config, target.params, full_vocab, dtype)
    params = {"draft": draft.params["draft"], **frozen}  # eagle.bind's layout
    metrics = feature_draft.evaluate(draft.params["draft"], eval_data, config, frozen, head, dtype)
    row = {"vocab_size": size, "coverage": coverage[size],
           "agreement": metrics["eval_agreement"], "costs": {}}
    proposer = EagleProposer(config, dtype)
    for batch in map(int, _BATCHES.value):
      first, nxt = proposer.forward_costs(params, batch, cache_len, _DRAFT_LEN.value)
      plain = costs.time_forward(target.config, np.dtype(target.dtype).name, "reference",
                                 target.params, batch, positions=1, cache_len=cache_len)
      row["costs"][batch] = {"catch_up_ms": 1e3 * first, "draft_ms": 1e3 * nxt,
                             "target_ms": 1e3 * plain, "draft_over_target": nxt / plain}
    rows.append(row)
    jax.clear_caches()

  batches = list(map(int, _BATCHES.value))
  print("| V' | held-out coverage | first-draft agreement | " +
        " | ".join(f"draft / target forward, B = {b}" for b in batches) + " |")
  print("|---|---|---|" + "---|" * len(batches))
  for row in rows:
    cells = [f"{c['draft_ms']:.2f} / {c['target_ms']:.1f} ms = {c['draft_over_target']:.3f}"
             for c in (row["costs"][b] for b in batches)]
    print(f"| {row['vocab_size']} | {row['coverage']:.4f} | {row['agreement']:.4f} | "
          + " | ".join(cells) + " |")
  if output:
    _io.write_json_atomic(output, {"draft": _DRAFT.value, "target": _TARGET.value,
                                   "cache_len": cache_len, "rows": rows})


if __name__ == "__main__":
  _io.run(main)
