"""The paper's metrics on hand-made inputs, prompt loading, and the main job end to end."""

import dataclasses
import json
import os
import subprocess
import types

import jax
import numpy as np
import pytest

import bass_jax as bj
from bass_jax.evaluation import batches, experiment, metrics
from bass_jax.evaluation.data import load_problems
from conftest import PYTHON, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_per_token_latency_first_last_all():
  # Row 0 finishes first (1 s, 10 tokens: 100 ms/token); rows 1 and 2 tie for last at 2 s.
  lat = metrics.per_token_latency(np.array([1.0, 2.0, 2.0]), np.array([10, 40, 20]))
  assert lat.first == pytest.approx(100.0)
  assert lat.last == pytest.approx((50.0 + 100.0) / 2)
  assert lat.all == pytest.approx((100.0 + 50.0 + 100.0) / 3)
  for finish, lengths in (([1.0, np.nan], [3, 3]), ([1.0], [0]), ([], []), ([1.0, 2.0], [3])):
    with pytest.raises(ValueError):
      metrics.per_token_latency(np.array(finish), np.array(lengths))


def test_acceptance_counts_live_rows_and_the_bonus_token():
  # Step 0: l=3, row 0 accepts all 3, row 1 accepts 1. Step 1: l=5, row 0 is done (-1), row 1 takes 5.
  acc = metrics.acceptance(np.array([3, 5]), np.array([[3, 1], [-1, 5]]))
  assert (acc.drafted, acc.accepted, acc.sequence_steps) == (3 + 3 + 5, 3 + 1 + 5, 3)
  assert acc.draft_acceptance_rate == pytest.approx(9 / 11)
  assert acc.mean_accepted_length == pytest.approx((9 + 3) / 3)  # accepted + 1 per live step
  pooled = metrics.Acceptance.pooled([acc, metrics.acceptance(np.array([2]), np.array([[0]]))])
  assert pooled.draft_acceptance_rate == pytest.approx(9 / 13)
  with pytest.raises(ValueError):
    metrics.acceptance(np.array([3]), np.array([1, 2]))


def test_per_position_acceptance_matches_a_loop_over_steps():
  """alpha_k = accepted at k / tested at k, against a plain loop, on random ragged steps; pooling sums."""
  rng = np.random.default_rng()
  parts, offered, taken = [], np.zeros(9, int), np.zeros(9, int)
  for _ in range(3):
    steps, batch = rng.integers(1, 12), rng.integers(1, 5)
    drafted = rng.integers(0, rng.integers(1, 9), size=(steps, batch))  # a model-free proposer's rows
    accepted = np.where(rng.random((steps, batch)) < 0.2, -1, rng.integers(0, 9, (steps, batch)))
    accepted = np.where(accepted >= 0, np.minimum(accepted, drafted), -1)
    parts.append(metrics.acceptance(drafted.max(axis=1), accepted, drafted))
    for s_, b in np.ndindex(steps, batch):
      if accepted[s_, b] < 0:
        continue
      for k in range(1, drafted[s_, b] + 1):  # position k is tested only after k - 1 acceptances
        if accepted[s_, b] >= k - 1:
          offered[k - 1] += 1
          taken[k - 1] += accepted[s_, b] >= k
  pooled = metrics.Acceptance.pooled(parts)
  width = len(pooled.position_offered)
  assert pooled.position_offered == tuple(offered[:width]) and not offered[width:].any()
  assert pooled.position_accepted == tuple(taken[:width])
  assert sum(pooled.position_accepted) == pooled.accepted
  np.testing.assert_allclose(pooled.position_acceptance,
                             taken[:width] / np.where(offered[:width], offered[:width], np.nan))


def test_load_problems(tmp_path):
  problems = load_problems("humaneval")
  assert len(problems) == 164 and problems[0].task_id == "HumanEval/0"
  assert "def " in problems[0].prompt and "test" in problems[0].fields
  path = tmp_path / "p.jsonl"
  path.write_text('{"prompt": "a", "task_id": "x"}\n\n{"prompt": "b"}\n')
  assert [(p.task_id, p.prompt) for p in load_problems(path)] == [("x", "a"), ("line-3", "b")]
  with pytest.raises(ValueError, match="has 2 prompts"):
    load_problems(path, 3)
  path.write_text('{"text": "a"}\n')
  with pytest.raises(ValueError, match="p.jsonl:1"):
    load_problems(path)
  with pytest.raises(FileNotFoundError):
    load_problems(tmp_path / "missing.jsonl")


def test_the_tuning_prompts_are_neither_humaneval_nor_training_data():
  from bass_jax.training import corpus

  tuning = load_problems("stdlib-heldout")
  assert len(tuning) >= 100 and len({p.task_id for p in tuning}) == len(tuning)
  assert all(p.prompt.lstrip().startswith(("def ", "async def ", "@")) for p in tuning)
  assert not {p.prompt for p in tuning} & {p.prompt for p in load_problems("humaneval")}
  files = {p.fields["path"] for p in tuning}
  assert len(files) >= 10 and all(corpus.is_held_out(f, 0.05) for f in files)
  assert [p.task_id for p in load_problems("stdlib-heldout", 5)] == [p.task_id for p in tuning[:5]]


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path):
  """experiments/generate.py on a tiny random model that carries SmolLM2's tokenizer (read from the
  shipped draft, which shares it: loading the real target for its tokenizer would cost seconds)."""
  shipped = bj.load_model("smollm2-135m-draft")
  config = tiny_config(vocab_size=shipped.config.vocab_size, num_hidden_layers=2,
                       eos_token_id=shipped.config.eos_token_id)
  model = bj.Model(config, bj.init_params(config, jax.random.key(0)), shipped.tokenizer)
  bj.save_model(model, tmp_path / "tiny")
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": p}) + "\n"
                             for i, p in enumerate(["def add(a, b):", "import os\n# list files"])))
  out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
  # Regular decoding in static batches, BASS with continuous batching (the default): 6 sequences, 3 rows.
  for method, continuous in (("regular", False), ("bass", True)):
    result = subprocess.run(
        [PYTHON, "-m", "experiments.generate", f"--target={tmp_path / 'tiny'}",
         "--continuous" if continuous else "--nocontinuous",
         f"--draft={tmp_path / 'tiny'}", "--draft_num_layers=1", f"--method={method}",
         f"--prompts={prompts}", "--num_prompts=2", "--batch_size=3", "--max_new_tokens=6",
         "--temperature=0.7", "--top_p=0.9", "--draft_len=2", f"--output={out}",
         f"--summary_json={summary}", "--overwrite"],  # the second run replaces the first's files
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["task_id"], r["sample_index"]) for r in records] == [
        (t, j) for t in ("t0", "t1") for j in range(3)]
    for r in records:
      assert set(r) == {"task_id", "sample_index", "batch_index", "row", "batch_size", "drafted",
                        "steps",
                        "prompt_tokens", "completion", "num_tokens", "accepted_drafts",
                        "mean_logprob", "finished", "finish_seconds", "wait_seconds", "ttft_seconds"}
      wall = json.loads(summary.read_text())["wall_seconds"]
      assert 0 < r["finish_seconds"] <= wall + 1e-6
      assert 0 <= r["wait_seconds"] < r["ttft_seconds"] <= r["wait_seconds"] + r["finish_seconds"] + 1e-6
      assert (r["batch_index"] is None) == continuous
      assert 1 <= r["num_tokens"] <= 6 and r["mean_logprob"] <= 0 and isinstance(r["completion"], str)
    s = json.loads(summary.read_text())
    assert set(experiment.SUMMARY_KEYS) <= set(s) and s["method"] == method
    assert s["batch_size"] == 3 and s["num_prompts"] == 2 and s["continuous"] == continuous
    # No --attention_impl or --verify_chunk: the CPU profile's, recorded as what ran.
    assert (s["profile"], s["attention_impl"]) == ("cpu", "reference")
    assert s["verify_chunk"] == (4 if method == "bass" else None)
    if continuous:  # no batches: All only; the later sequences waited for a row
      assert s["ms_per_token_first"] is None and s["ms_per_token_last"] is None
      assert s["ms_per_token_all"] > 0 and max(r["wait_seconds"] for r in records) > 0
    else:
      assert min(s["ms_per_token_first"], s["ms_per_token_last"], s["ms_per_token_all"]) > 0
    assert s["tokens_per_second"] > 0 and s["compile_seconds"] > 0 and s["steps"] >= 2
    assert "ms_per_token_all" in result.stdout  # the printed table
    if method == "bass":
      assert 0 <= s["draft_acceptance_rate"] <= 1 and 1 <= s["mean_accepted_length"] <= 3


def test_pass_metrics_and_budget_cut_off():
  passed = np.array([True, False, True, False])
  mean_logprob = np.array([-0.9, -0.2, -0.5, -0.1])
  finish = np.array([3.0, 1.0, 2.0, 9.0])
  assert metrics.pass_at_batch(passed) and not metrics.pass_at_batch(np.zeros(3, bool))
  within = metrics.finished_within(finish, 2.5)
  assert within.tolist() == [False, True, True, False]
  # Finished by 2.5 s: rows 1 (-0.2, fails) and 2 (-0.5, passes): the top-ranked one fails.
  assert not metrics.pass_at_first(passed, mean_logprob, within)
  assert metrics.pass_at_finished(passed, within)
  # By 3 s row 0 (-0.9, passes) joins but row 1 still ranks first; by 1.5 s only row 1 finished.
  assert not metrics.pass_at_first(passed, mean_logprob, metrics.finished_within(finish, 3.0))
  assert not metrics.pass_at_finished(passed, metrics.finished_within(finish, 1.5))
  assert metrics.pass_at_first(passed, np.array([-0.9, -2.0, -0.5, -0.1]), within)  # row 2 now ranks
  assert not metrics.pass_at_first(passed, mean_logprob, np.zeros(4, bool))  # nothing finished


def test_flop_counts_by_hand():
  config = bj.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                          tie_word_embeddings=True)
  params = bj.abstract_params(config)  # the counts read shapes only: no weights drawn
  # Per layer q 8x8, k 8x4, v 8x4, o 8x8, gate and up 8x12, down 12x8 = 480; 2 layers; tied head 11x8.
  assert metrics.matmul_params(config, params) == 2 * 480 + 88
  # Two tokens attending to 3 and 5 slots: 2 * 2 * 1048 + 4 * layers 2 * heads 2 * dim 4 * (3 + 5).
  assert metrics.forward_flops(config, params, np.array([3, 5])) == 2 * 2 * 1048 + 4 * 2 * 2 * 4 * 8
  untied = dataclasses.replace(config, tie_word_embeddings=False)
  untied_params = bj.abstract_params(untied)
  assert metrics.matmul_params(untied, untied_params) == 2 * 480 + 8 * 11  # lookup table not counted

  # Regular decoding of one 3-token prompt for 2 tokens, prompt padded to 16.
  stats = bj.GenerateStats(steps=2, draft_lens=np.zeros(0, int), accepted=np.zeros((0, 1), int),
                           finish_seconds=np.array([1.0]), wall_seconds=1.0, compile_seconds=0.0,
                           prompt_bucket=16, batch_bucket=1)
  out = bj.GenerateOutput(tokens=np.zeros((1, 2), int), lengths=np.array([2]),
                          logprobs=np.zeros((1, 2)), finished=np.array([False]), stats=stats)
  flops = metrics.decode_flops(bj.Model(config, params), None, np.array([3]), out, method="regular")
  # Useful: the target over 4 positions (prompt + all but the last new token) at contexts 1..4.
  assert flops.useful == 4 * 2 * 1048 + 64 * (1 + 2 + 3 + 4)
  # Executed: 16 prefill + 2 decode positions, each at the mean context 3 + 2 / 2 = 4.
  assert flops.executed == 18 * (2 * 1048 + 64 * 4)


def test_pass_rates_within_a_budget_over_problems():
  from bass_jax.evaluation.reproduce import pass_rates_within

  record = lambda task, passed, logprob, seconds: dict(task_id=task, passed=passed,
                                                       mean_logprob=logprob, finish_seconds=seconds)
  records = [record("a", True, -0.5, 1.0), record("a", False, -0.1, 2.0),   # a: pass ranked 2nd
             record("b", False, -0.3, 0.5), record("b", True, -0.9, 3.0)]   # b: pass finishes late
  rates = lambda first, finished, share: dict(pass_at_first=first, pass_at_finished=finished,
                                              finished_share=share)
  assert pass_rates_within(records, 1.5) == rates(0.5, 0.5, 0.5)
  assert pass_rates_within(records, 2.5) == rates(0.0, 0.5, 0.75)
  assert pass_rates_within(records, 5.0) == rates(0.0, 1.0, 1.0)
  assert pass_rates_within(records, 0.1) == rates(0.0, 0.0, 0.0)


def test_report_renders_every_experiment(tmp_path):
  """experiments/paper/report.py on hand-made result files: every section and plot is written."""
  common = dict(setting="t", command="python -m experiments.x", date="2026-01-01", device="cpu:cpu",
                host="x86_64", jax_version="0", target="tgt", draft="drf", num_prompts=1,
                max_new_tokens=4)
  run = dict(ms_per_token_all=10.0, ms_per_token_first=9.0, ms_per_token_last=11.0,
             tokens_per_second=100.0, mean_accepted_length=1.0, draft_acceptance_rate=None,
             pass_at_batch=0.5, attention_impl="blocked_pad", batch_size=1, temperature=0.2)
  files = {
      "latency_t.json": dict(common, experiment="latency", runs=[
          dict(run, config="regular", sampling="greedy"),
          dict(run, config="bass_pad", sampling="greedy", ms_per_token_all=5.0,
               draft_acceptance_rate=0.5, mean_accepted_length=2.0)]),
      "utilization_t.json": dict(common, experiment="utilization", peak_flops=1e11, temperature=0.2,
                                 top_p=0.95, runs=[dict(run, method=m, useful_utilization=0.01,
                                                        executed_utilization=0.02)
                                                   for m in ("regular", "bass")]),
      "budget_t.json": dict(common, experiment="budget", budget_seconds=1.0, budget_fraction=0.7,
                            top_p=0.95, runs=[dict(run, method=m, pass_at_budget=dict(
                                pass_at_first=0.0, pass_at_finished=1.0,
                                finished_share=0.25 if m == "regular" else 0.75), pass_curve=dict(
                                    budget_seconds=[0.5, 1.0], pass_at_first=[0, 0],
                                    pass_at_finished=[0, 1])) for m in ("regular", "bass")]),
      "baselines_t.json": dict(common, experiment="baselines", temperature=0.0, top_p=1.0, runs=[
          dict(system=s, batch_size=1, ms_per_token_all=ms, ms_per_token_last=ms, tokens_per_second=1.0,
               tokens=4) for s, ms in (("bass-jax bass", 5.0), ("transformers generate", 20.0))]),
  }
  (tmp_path / "results").mkdir()
  for name, content in files.items():
    (tmp_path / "results" / name).write_text(json.dumps(content))
  result = subprocess.run(
      [PYTHON, "-m", "experiments.paper.report", f"--results={tmp_path / 'results'}",
       f"--output={tmp_path / 'docs' / 'results.md'}", f"--figures={tmp_path / 'docs' / 'figures'}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  text = (tmp_path / "docs" / "results.md").read_text()
  for heading in ("Latency and throughput", "Utilization", "time budget", "transformers"):
    assert heading in text
  assert "| BASS-PAD (dynamic) | 1 | 5.0 (9.0 / 11.0) | 2.00x |" in text  # speed-up over regular
  assert "| transformers generate | 1 | 20.0 | 1.0 | 4.00x |" in text
  assert {p.name for p in (tmp_path / "docs" / "figures").iterdir()} == {"utilization_t.png",
                                                                         "budget_t.png"}
  # The reading is computed from the same numbers.
  assert "B = 1: BASS-PAD (dynamic) 2.00x" in text
  assert "BASS-PAD (dynamic) is faster than regular decoding at every batch size (B = 1)" in text
  assert "Best bass Pass@Finished within the budget: 1.00" in text
  assert "| 0.2 | bass | 1 | 10.0 | 75% | 0.00 | 1.00 | 0.50 |" in text  # samples finished


def test_the_paper_experiments_pass_their_speculation_to_bass_runs(monkeypatch):
  """budget, throughput and utilization hand draft_len and draft_tree to every BASS run (and
  run_problems gets no tree for regular decoding), and record them in their headers."""
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top

  calls = []

  def fake_run_problems(target, draft, problems, **kwargs):
    calls.append(kwargs)
    summary = dict(tokens_per_second=1.0, ms_per_token_all=1.0, wall_seconds=1.0, useful_flops=1.0,
                   executed_flops=1.0, pass_at_batch=0.0, method=kwargs["method"],
                   batch_size=kwargs["batch_size"])
    records = [dict(task_id=p.task_id, finish_seconds=1.0, num_tokens=4, passed=False,
                    mean_logprob=-1.0) for p in problems]
    return experiment.RunResult(records=records, summary=summary)

  monkeypatch.setattr(experiment, "run_problems", fake_run_problems)
  monkeypatch.setattr(reproduce, "measure_peak_flops", lambda: 1e9)
  named = types.SimpleNamespace(name="m")
  shapes = ["top_k=2,depth=3,nodes=6", "top_k=2,depth=2,nodes=4"]
  kw = dict(batch_sizes=[2], max_new_tokens=4, draft_len="goodput", draft_tree=shapes,
            log=lambda line: None)
  results = [
      reproduce.throughput(named, named, [bj_problem(0)], temperatures=[0.0], **kw),
      reproduce.utilization(named, named, [bj_problem(0)], **kw),
      reproduce.budget(named, named, [bj_problem(0)], temperatures=[0.2], budget_fraction=0.5, **kw)]
  for result in results:
    assert result["draft_len"] == "goodput" and result["draft_tree"] == shapes
  assert {c["method"] for c in calls} == {"regular", "bass"}
  for c in calls:
    assert c["draft_len"] == "goodput"
    assert c["draft_tree"] == (shapes if c["method"] == "bass" else None)
  # The budget decodes B samples of each prompt, its queue interleaved when asked.
  calls.clear()
  reproduce.budget(named, named, [bj_problem(0)], temperatures=[0.2], budget_fraction=0.5,
                   continuous=True, sample_order="interleaved", **kw)
  assert {(c["samples_per_prompt"], c["sample_order"], c["continuous"]) for c in calls} == {
      (2, "interleaved", True)}
  with pytest.raises(ValueError, match="pass continuous=True"):
    reproduce.budget(named, named, [bj_problem(0)], temperatures=[0.2], budget_fraction=0.5,
                     sample_order="interleaved", **kw)


def test_batches_hold_distinct_prompts_or_samples_of_one():
  problems = [bj_problem(i) for i in range(5)]
  distinct = batches.make_batches(problems, 2, True)
  assert [[p.task_id for p in b] for b in distinct] == [["p0", "p1"], ["p2", "p3"], ["p4"]]
  copies = batches.make_batches(problems[:2], 3, False)
  assert [[p.task_id for p in b] for b in copies] == [["p0"] * 3, ["p1"] * 3]
  with pytest.raises(ValueError, match="at least batch_size=8 prompts"):
    batches.make_batches(problems, 8, True)
  with pytest.raises(ValueError, match="batch_size must be >= 1"):
    batches.make_batches(problems, 0, False)
  # s samples of each prompt in a row, cut into batches: here 3 samples into batches of 2.
  spread = batches.sequence_plan(problems[:2], 2, False, samples_per_prompt=3)
  assert [[(p.task_id, i) for p, i in b] for b in spread] == [
      [("p0", 0), ("p0", 1)], [("p0", 2), ("p1", 0)], [("p1", 1), ("p1", 2)]]
  with pytest.raises(ValueError, match="samples_per_prompt must be >= 1"):
    batches.make_batches(problems, 2, False, samples_per_prompt=0)
  # Interleaved: round robin over the prompts, each sample still numbered within its prompt.
  rounds = batches.sequence_plan(problems[:2], 2, False, samples_per_prompt=3,
                                    sample_order="interleaved")
  assert [[(p.task_id, i) for p, i in b] for b in rounds] == [
      [("p0", 0), ("p1", 0)], [("p0", 1), ("p1", 1)], [("p0", 2), ("p1", 2)]]
  with pytest.raises(ValueError, match="give samples_per_prompt too"):
    batches.make_batches(problems, 2, False, sample_order="interleaved")
  with pytest.raises(ValueError, match="sample_order must be one of"):
    batches.make_batches(problems, 2, False, samples_per_prompt=2, sample_order="shuffled")
  with pytest.raises(ValueError, match="not both"):
    experiment.run_problems(None, None, problems, batch_size=2, distinct_prompts=True,
                            samples_per_prompt=2)
  with pytest.raises(ValueError, match="run_problems needs batch_size"):
    experiment.run_problems(None, None, problems, bj.DecodeConfig(max_new_tokens=4))
  with pytest.raises(TypeError, match="unknown decode setting 'max_tokens'"):
    experiment.run_problems(None, None, problems, batch_size=2, max_tokens=4)


def bj_problem(i):
  from bass_jax.evaluation.data import Problem

  return Problem(f"p{i}", f"prompt {i}")


def test_raggedness_by_hand():
  # Prompts 3 and 9 tokens, 5 and 2 emitted: final lengths 8 and 11.
  # Steps: both live (2 vs 0 accepted), both live (1 vs 1), row 1 done (-1).
  r = metrics.raggedness(np.array([3, 9]), np.array([5, 2]), np.array([[2, 0], [1, 1], [1, -1]]))
  assert (r.length_spread, r.emitted_spread) == (3, 3)
  assert r.accepted_spread == pytest.approx((2 + 0) / 2)  # the step with one live row is left out
  assert r.accepted_total_spread == 3  # 4 accepted against 1
  regular = metrics.raggedness(np.array([4, 4]), np.array([6, 6]))
  assert regular == metrics.Raggedness(0, 0, 0.0, 0)
  with pytest.raises(ValueError):
    metrics.raggedness(np.array([1]), np.array([1, 2]))


@pytest.fixture(scope="module")
def tiny_pair():
  """A tiny random target carrying SmolLM2's tokenizer, and a draft of scaled copies of its weights;
  shared by the run_problems tests, so that their equal settings share compiled programs."""
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(os.path.join(REPO, "bass_jax", "drafts",
                                                                "smollm2-135m-draft"))
  config = tiny_config(vocab_size=tok.vocab_size)
  target = bj.Model(config, bj.init_params(config, jax.random.key(0)), tok, "tiny")
  draft = bj.Model(config, jax.tree_util.tree_map(lambda x: 1.3 * x, target.params), tok, "noisy")
  return target, draft


def test_greedy_runs_decode_distinct_prompts_and_report_how_ragged(tiny_pair):
  """run_problems at temperature 0: different prompts per batch, records streamed per batch."""
  target, draft = tiny_pair
  problems = [bj_problem(i) for i in range(3)] + [
      type(bj_problem(0))("long", "def function_with_a_much_longer_prompt(a, b, c):\n    return")]
  streamed = []
  result = experiment.run_problems(target, draft, problems, batch_size=2, max_new_tokens=12,
                                   draft_len=3, progress=False, on_record=streamed.append)
  # Streamed as each sequence finished: every record once, each batch's before the next batch's.
  assert sorted(r["task_id"] for r in streamed[:2]) == ["p0", "p1"]
  assert sorted(r["task_id"] for r in streamed[2:]) == ["long", "p2"]
  assert sorted(map(batches.record_key, streamed)) == sorted(map(batches.record_key,
                                                                    result.records))
  assert [r["task_id"] for r in result.records] == ["p0", "p1", "p2", "long"]  # plan order
  s = result.summary
  assert s["distinct_prompts"] and s["num_batches"] == 2
  assert s["length_spread"] > 0  # the long prompt makes the second batch ragged
  # One program for both batches (issue 52): the run's longest prompt is the capacity, so the short
  # batch reuses what the first built (0 when an earlier test of this module built it).
  assert s["prompt_capacity"] == max(r["prompt_tokens"] for r in result.records)
  assert s["settings_built"] <= 1 and s["programs_compiled"] + s["programs_loaded"] <= 2
  sampled = experiment.run_problems(target, draft, problems[:1], batch_size=2, max_new_tokens=12,
                                    draft_len=3, temperature=1.0, progress=False)
  assert not sampled.summary["distinct_prompts"]
  assert [r["sample_index"] for r in sampled.records] == [0, 1]
  # A warm-up decode changes nothing that is measured beyond the time (greedy: the same tokens; the
  # acceptance counts are per position and pool to the totals). The settings as one DecodeConfig are
  # the same run as keywords.
  config = bj.DecodeConfig(batch_size=2, max_new_tokens=12, draft_len=3)
  warm = experiment.run_problems(target, draft, problems, config, progress=False, warmup=True)
  assert [r["completion"] for r in warm.records] == [r["completion"] for r in result.records]
  assert warm.summary["settings_built"] == 0  # the first run's program, warm-up included
  # Every field reaches the decode: a larger prompt capacity than the run's longest prompt, a profile.
  wide = experiment.run_problems(target, draft, problems[:2], config, max_prompt_len=40,
                                 profile="cpu", progress=False)
  assert wide.summary["prompt_capacity"] == 40 and wide.summary["profile"] == "cpu"
  assert [r["completion"] for r in wide.records] == [r["completion"] for r in result.records[:2]]
  accept = warm.summary["acceptance"]
  assert accept == s["acceptance"] and sum(accept["position_accepted"]) == accept["accepted"]
  assert len(warm.summary["position_acceptance"]) == 3


def test_report_omits_a_plot_without_information_and_flags_incomplete_runs(tmp_path):
  from experiments.paper import report

  common = dict(setting="t", command="c", date="d", device="cpu", host="h", jax_version="0",
                target="tgt", draft="drf", num_prompts=6, max_new_tokens=96)
  zero = dict(pass_at_first=0.0, pass_at_finished=0.0)
  runs = [dict(method=m, batch_size=1, temperature=0.2, ms_per_token_all=10.0, pass_at_batch=0.0,
               pass_at_budget=zero, pass_curve=dict(budget_seconds=[1.0], pass_at_first=[0.0],
                                                    pass_at_finished=[0.0]))
          for m in ("regular", "bass")]
  figures = tmp_path / "docs" / "figures"
  figures.mkdir(parents=True)
  (figures / "budget_t.png").write_bytes(b"stale")
  text = "\n".join(report._budget(dict(common, experiment="budget", budget_seconds=2.0,
                                       budget_fraction=0.7, runs=runs), figures))
  assert "plot is not drawn: every curve would be flat at 0" in text and "![" not in text
  assert not (figures / "budget_t.png").exists()
  row = dict(config="regular", sampling="greedy", batch_size=2, ms_per_token_all=10.0,
             ms_per_token_first=10.0, ms_per_token_last=10.0, tokens_per_second=1.0,
             mean_accepted_length=1.0, draft_acceptance_rate=None, attention_impl="blocked_pad",
             length_spread=0.0, accepted_spread=0.0)
  bass = dict(row, config="bass_pad", mean_accepted_length=1.5, draft_acceptance_rate=0.25)
  text = "\n".join(report._latency(dict(common, experiment="latency", complete=False,
                                        runs=[row, bass])))
  assert "**Incomplete**" in text and "these are the 2 runs it finished" in text
  assert "measure nothing ragged" in text


# Fields that depend on the clock or on where a sequence ran, not on what was decoded.
TIMING_FIELDS = ("finish_seconds", "wait_seconds", "ttft_seconds", "row", "accepted_drafts",
                 "drafted", "steps")


def _content(records):
  """What a record says about the decoded text; log-probs to 5 significant digits (a resumed
  continuous run scores a sequence in batches of other shapes, which moves the last float bits)."""
  return {batches.record_key(r): {k: float(f"{v:.5g}") if k == "mean_logprob" else v
                                     for k, v in r.items() if k not in TIMING_FIELDS}
          for r in records}


@pytest.mark.parametrize("continuous,temperature", [(False, 0.0), (False, 1.0), (True, 0.0)])
def test_a_resumed_run_decodes_only_what_is_missing_and_equals_an_uninterrupted_one(
    tiny_pair, continuous, temperature, capsys):
  """run_problems(done=...) as `--resume` uses it: the sequences on disk are not decoded again, and
  the missing ones come out as an uninterrupted run's (a static batch with some records is decoded
  again whole, with its own seed and rows, so even sampled records are the same draws). Its progress
  bar counts the sequences it decodes, with tokens/s and tokens per step, as they finish."""
  target, draft = tiny_pair
  problems = [bj_problem(i) for i in range(5)]
  kwargs = dict(batch_size=2, max_new_tokens=12, draft_len=3, temperature=temperature, seed=3,
                progress=False, continuous=continuous, distinct_prompts=True)
  full = experiment.run_problems(target, draft, problems, **kwargs)
  assert len(full.records) == 5
  kept = [full.records[0], full.records[3]]  # batch 0 partly, batch 1 partly, batch 2 not at all
  streamed = []
  capsys.readouterr()
  rest = experiment.run_problems(target, draft, problems, done={batches.record_key(r): r
                                                                for r in kept},
                                 on_record=streamed.append, **{**kwargs, "progress": True})
  bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
  assert any("1/3" in line for line in bar) and "3/3" in bar[-1] and "seq" in bar[-1], bar
  tokens = sum(r["num_tokens"] for r in rest.records)
  per_step = tokens / sum(r["steps"] for r in rest.records)
  assert f"{per_step:.2f} tokens/step" in bar[-1] and "tok/s" in bar[-1], bar
  assert sorted(map(batches.record_key, rest.records)) == sorted(
      batches.record_key(r) for r in full.records if r not in kept)
  assert _content(kept + rest.records) == _content(full.records)
  assert rest.summary["decoded_records"] == 3 and rest.summary["resumed_records"] == 2
  assert len(streamed) == 3
  with pytest.raises(ValueError, match="does not plan"):
    experiment.run_problems(target, draft, problems[:2], done={("p4", 0): full.records[4]},
                            **kwargs)
  # Static batch i decodes with seed + i: a seed whose last batch's would overflow is refused first.
  from bass_jax.sampling import config  # pylint: disable=g-import-not-at-top

  top = 2**63 - 1 - (0 if continuous else 2)
  assert config.check_seed(top, 1 if continuous else 3) == top
  with pytest.raises(ValueError, match="seed"):
    experiment.run_problems(target, draft, problems, **{**kwargs, "seed": top + 1})


def test_tree_runs_report_their_shapes_and_tree_steps_and_latency_checks_its_tree_configs(tiny_pair):
  """run_problems with several tree shapes under goodput: the summary names the shapes and counts the
  tree steps and their nodes from the stats; the latency experiment's tree configs need shapes."""
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top

  target, draft = tiny_pair
  shapes = ["top_k=2,depth=3,nodes=6", "top_k=2,depth=2,nodes=4"]
  costs = bj.StepCosts(1.0, 1.2, 0.05, 0.05, 4, tree_steps=(1.25, 1.2))
  result = experiment.run_problems(
      target, draft, [bj_problem(i) for i in range(2)], batch_size=2, max_new_tokens=12,
      draft_len=bj.GoodputDraftLen(max_len=3, explore_every=2, costs=costs), draft_tree=shapes,
      progress=False)
  s = result.summary
  assert s["draft_tree"] == "; ".join(shapes)
  assert 0 < s["tree_step_share"] <= 1 and 1 < s["mean_tree_nodes"] <= 6
  with pytest.raises(ValueError, match="give their shapes"):
    reproduce.latency(target, draft, [], batch_sizes=[1], configs=["bass_pad_tree"],
                      sampling=["greedy"], max_new_tokens=4)
  with pytest.raises(ValueError, match="several shapes need 'bass_pad_goodput_trees'"):
    reproduce.latency(target, draft, [], batch_sizes=[1], configs=["bass_pad_tree"],
                      sampling=["greedy"], max_new_tokens=4, draft_tree=shapes)
