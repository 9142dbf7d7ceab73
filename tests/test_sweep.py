"""The decode benchmark harness (bass_jax.evaluation.sweep, experiments/benchmarks/sweep.py): every cell
of the grid decodes, rounds alternate their order, speedups are same-round ratios recomputed here from
the rounds, resumed points are not decoded again, bad sweeps are refused before anything decodes; the
script writes its JSON and markdown and resumes."""

import json
import pathlib
import shutil
import statistics
import subprocess

import jax
import pytest

import bass_jax as bj
from bass_jax.evaluation import experiment
from bass_jax.evaluation import sweep
from bass_jax.evaluation.data import Problem
from conftest import PYTHON, tiny_config, tiny_model

REPO = pathlib.Path(__file__).resolve().parents[1]


class _Tokenizer:
  """Characters as token ids (what run_problems needs of a tokenizer: encode, decode, EOS)."""

  eos_token_id = None

  def __call__(self, text):
    return type("Encoded", (), {"input_ids": [1 + ord(c) % 50 for c in text]})()

  def decode(self, ids, **kwargs):
    del kwargs
    return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def pair():
  target = tiny_model(seed=0)
  target = bj.Model(target.config, target.params, _Tokenizer(), name="tiny")
  return target, target  # a draft that is the target: every drafted token is accepted


PROBLEMS = [Problem(f"p{i}", "def f(x):\n" + "y" * (3 + 4 * i)) for i in range(3)]


def test_every_cell_decodes_in_alternating_rounds_and_speedups_are_same_round_ratios(pair, monkeypatch):
  target, draft = pair
  calls = []
  real = experiment.run_problems

  def spy(target, draft, problems, config, **kw):
    calls.append((kw["batch_size"], "regular" if draft is None else "bass", kw["warmup"]))
    return real(target, draft, problems, config, **kw)

  monkeypatch.setattr(experiment, "run_problems", spy)
  variants = [sweep.Variant("regular"), sweep.Variant("bass", draft, {"draft_len": 2})]
  saved = []
  cells = sweep.run_sweep(target, PROBLEMS, variants, {"batch_size": [1, 2]},
                          base=bj.DecodeConfig(max_new_tokens=6), rounds=3, baseline="regular",
                          on_point=lambda key, c: saved.append((key, [x.variant for x in c])))
  # Rounds alternate: regular first, then bass first, then regular first again; every call warms up.
  assert calls == [(b, v, True) for b in (1, 2) for v in ("regular", "bass", "bass", "regular",
                                                          "regular", "bass")]
  assert saved == [("batch_size=1", ["regular", "bass"]), ("batch_size=2", ["regular", "bass"])]
  assert [(c.point, c.variant, len(c.rounds)) for c in cells] == [
      ({"batch_size": b}, v, 3) for b in (1, 2) for v in ("regular", "bass")]
  for regular, bass in (cells[:2], cells[2:]):
    assert regular.speedup == 1.0
    ratios = [r["ms_per_token_all"] / s["ms_per_token_all"] for r, s in zip(regular.rounds, bass.rounds)]
    assert bass.speedup == pytest.approx(statistics.median(ratios))
    assert bass.median("ms_per_token_all") == pytest.approx(
        statistics.median(s["ms_per_token_all"] for s in bass.rounds))
    # The draft is the target: each step accepts both drafts and the bonus; regular drafts nothing.
    assert {s["mean_accepted_length"] for s in bass.rounds} == {3.0}
    assert {s["mean_accepted_length"] for s in regular.rounds} == {1.0}
    assert regular.median("plain_step_share") is None and bass.median("mean_draft_len") > 0
  # The records round-trip through JSON, and a resumed sweep decodes only the points it lacks.
  records = json.loads(json.dumps([c.to_json() for c in cells]))
  again = [sweep.Cell.from_json(r) for r in records]
  assert again == cells
  calls.clear()
  resumed = sweep.run_sweep(target, PROBLEMS, variants, {"batch_size": [1, 2]},
                            base=bj.DecodeConfig(max_new_tokens=6), rounds=1, baseline="regular",
                            done={"batch_size=1": again[:2]})
  assert [c[0] for c in calls] == [2, 2] and resumed[:2] == again[:2] and len(resumed[2].rounds) == 1
  table = sweep.markdown(cells, ["batch_size"], "regular").splitlines()
  assert table[0].startswith("| batch_size | variant | ms/token All |") and "speedup vs regular" in table[0]
  assert len(table) == 2 + len(cells) and table[4].startswith("| 2 | regular |") and "1.00x" in table[4]


@pytest.mark.parametrize("variants,axes,baseline,match", [
    ([], None, None, "at least one variant"),
    ([sweep.Variant("a"), sweep.Variant("a")], None, None, "unique"),
    ([sweep.Variant("a")], None, "b", "baseline 'b' is not a variant"),
    ([sweep.Variant("a")], {"batch": [1]}, None, "'batch' is not a DecodeConfig field"),
    ([sweep.Variant("a")], {"batch_size": []}, None, "has no values"),
    ([sweep.Variant("a", None, {"batch_size": 2})], {"batch_size": [1]}, None, "also varies"),
    ([sweep.Variant("a", None, {"method": "bass"})], None, None, "has no draft"),
    ([sweep.Variant("a", "d", {"draft_len": "often"})], {"temperature": [0.0]}, None,
     "variant 'a' at temperature=0.0: .*draft_len"),
    ([sweep.Variant("a", None, {"draft_tree": "top_k=2,depth=2,nodes=3"})], None, None,
     "variant 'a' at the base settings: draft_tree needs method='bass'"),
])
def test_bad_sweeps_are_refused_before_anything_decodes(variants, axes, baseline, match):
  with pytest.raises(ValueError, match=match):
    sweep.check(variants, axes, baseline)


def test_unknown_settings_and_bad_rounds_are_refused(pair):
  target, _ = pair
  with pytest.raises(TypeError, match="unknown decode setting 'draftlen'"):
    sweep.check([sweep.Variant("a", None, {"draftlen": 2})], None, None)
  with pytest.raises(ValueError, match="rounds must be an int >= 1"):
    sweep.run_sweep(target, PROBLEMS, [sweep.Variant("a")], rounds=0)


def test_the_grid_is_the_product_with_the_last_axis_fastest():
  points = sweep.grid({"batch_size": [1, 4], "temperature": [0.0, 0.6]})
  assert points == [{"batch_size": 1, "temperature": 0.0}, {"batch_size": 1, "temperature": 0.6},
                    {"batch_size": 4, "temperature": 0.0}, {"batch_size": 4, "temperature": 0.6}]
  assert sweep.grid(None) == [{}] and sweep.point_key(points[1]) == "batch_size=1, temperature=0.6"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("sweep")
  # The shipped draft's tokenizer files beside a tiny model of its vocabulary: what the script loads,
  # without loading transformers in this process.
  shipped = REPO / "bass_jax" / "drafts" / "smollm2-135m-draft"
  config = tiny_config(vocab_size=json.loads((shipped / "config.json").read_text())["vocab_size"])
  bj.save_model(bj.Model(config, bj.init_params(config, jax.random.key(0))), root / "tiny")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copyfile(shipped / name, root / "tiny" / name)
  (root / "prompts.jsonl").write_text("".join(
      json.dumps({"prompt": f"def f{i}(x):\n    return " + "x + " * i}) + "\n" for i in range(3)))
  return root


def _script(tiny_dir, out, *extra):
  return subprocess.run(
      [PYTHON, "-m", "experiments.benchmarks.sweep", f"--target={tiny_dir / 'tiny'}",
       f"--prompts={tiny_dir / 'prompts.jsonl'}", "--num_prompts=2", "--max_new_tokens=5",
       "--rounds=2", f"--results_dir={out}", "--variant=name=regular",
       f"--variant=name=bass l=2;draft={tiny_dir / 'tiny'};draft_len=2", *extra],
      cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_script_writes_json_and_a_table_and_resumes(tiny_dir, tmp_path):
  run = _script(tiny_dir, tmp_path, "--sweep=batch_size=1,2")
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads((tmp_path / "sweep_quick.json").read_text())
  assert result["complete"] and result["device"].startswith("cpu") and result["jax_version"]
  assert [(c["point"]["batch_size"], c["variant"]) for c in result["cells"]] == [
      (1, "regular"), (1, "bass l=2"), (2, "regular"), (2, "bass l=2")]
  # A draft that is the target itself: every drafted token is accepted (2 drafted + 1 bonus).
  assert all(c["median"]["mean_accepted_length"] == 3.0 for c in result["cells"][1::2])
  table = (tmp_path / "sweep_quick.md").read_text()
  assert "experiments.benchmarks.sweep" in table and table.count("| bass l=2 |") == 2
  again = _script(tiny_dir, tmp_path, "--sweep=batch_size=1,2")
  assert again.returncode == 2 and "--resume" in again.stderr and len(again.stderr.splitlines()) == 1
  resumed = _script(tiny_dir, tmp_path, "--sweep=batch_size=1,2", "--resume")
  assert resumed.returncode == 0 and "| regular |" not in resumed.stdout, resumed.stderr[-2000:]
  assert "every point was already in" in resumed.stdout  # finished: no model was loaded
  assert json.loads((tmp_path / "sweep_quick.json").read_text())["cells"] == result["cells"]


@pytest.mark.parametrize("flag,message", [
    ("--variant=draft_len=2", "give it a name"),
    ("--variant=name=x;temperature=hot", "temperature=hot"),
    ("--variant=name=x;speed=2", "no decode setting 'speed'"),
    ("--sweep=draft_tree=top_k=2,depth=2,nodes=3", "give each tree as a --variant"),
    ("--sweep=batch_size=4", "--num_prompts=2 is fewer than batch_size=4"),
])
def test_the_script_refuses_bad_variants_and_sweeps_in_one_line(tiny_dir, tmp_path, flag, message):
  run = _script(tiny_dir, tmp_path, flag)
  assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]
  assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "sweep_quick.json").exists()
