"""Every refusal of ``experiments.generate``, in one process: generated bad values for each flag (numbers
out of range, NaN and inf, empty and malformed specs and shapes, wrong types, contradictory pairs) must
each end the run with status 2 and one line on stderr, no traceback, before any model loads; generated
valid settings must pass. Then one case for each refusal that once came late or unnamed.

``experiments.generate.check`` parses the flags and runs every check ``main`` makes before loading, as
the CLI does (``tests/test_cli.py`` runs the same refusals as real processes). The absl flags of one
script would collide with another's in a shared test process, so ``tests/test_cli.py`` runs this file in
a child process (``conftest.CLI_FLAGS_ENV``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os

import hypothesis
from hypothesis import strategies as st
import pytest

import bass_jax
from bass_jax import loading, profiles, sharding
from bass_jax.models import eagle
from bass_jax.sampling import config as config_lib
from bass_jax.sampling import draft_len as draft_len_lib
from bass_jax.sampling import tree as tree_lib
from experiments import _decode_flags
from experiments import generate

MAX_SEED = 2**63 - 1
DRAFT = "smollm2-135m-draft"  # 2 layers; the default target is SmolLM2-135M (GGUF, context 8192)


@pytest.fixture(scope="module", autouse=True)
def no_model_loads():
  """Any weight load fails the test: every refusal (and every check of a valid run) comes first."""

  def refuse(*args, **kwargs):
    raise AssertionError(f"a model loaded: {args} {kwargs}")

  saved = loading.load_model, bass_jax.load_model, bass_jax.load_draft_spec
  loading.load_model = bass_jax.load_model = bass_jax.load_draft_spec = refuse
  yield
  loading.load_model, bass_jax.load_model, bass_jax.load_draft_spec = saved


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
  """Paths the bad values name: prompt files broken in each way, a directory, a file, models whose
  configs do not fit the default target."""
  root = tmp_path_factory.mktemp("flags")
  paths = {"dir": root, "file": root / "a_file"}
  paths["file"].write_text("")
  lines = {"surrogate": '{"prompt": "ok"}\n{"prompt": "bad \\ud800 text"}\n',
           "broken": '{"prompt": "def f():"\n', "empty": '{"prompt": ""}\n', "no_prompt": '{"p": 1}\n',
           "blank": "\n\n"}
  for name, text in lines.items():
    paths[name] = root / f"{name}.jsonl"
    paths[name].write_text(text)
  paths["latin1"] = root / "latin1.jsonl"
  paths["latin1"].write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
  draft_config = json.loads((loading.resolve_alias(DRAFT) / "config.json").read_text())
  for name, change in (("other_vocab", {"vocab_size": 50000}), ("other_eos", {"eos_token_id": 7})):
    paths[name] = root / name
    paths[name].mkdir()
    (paths[name] / "config.json").write_text(json.dumps({**draft_config, **change}))
  layer = bass_jax.LlamaConfig(vocab_size=49152, hidden_size=48, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                               max_position_embeddings=8192, bos_token_id=1, eos_token_id=2)
  paths["eagle_narrow"] = root / "eagle_narrow"
  paths["eagle_narrow"].mkdir()
  (paths["eagle_narrow"] / "config.json").write_text(
      json.dumps(eagle.EagleConfig(layer, 64).to_json()))
  return {k: str(v) for k, v in paths.items()}


def run(argv: list[str]) -> tuple[int | None, str]:
  """``(exit status or None when every check passed, stderr)`` of the checks for ``argv``."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      generate.check(["generate", *argv])
      return None, err.getvalue()
    except SystemExit as e:
      return e.code, err.getvalue()


def assert_refused(argv: list[str], match: str | None = None) -> str:
  code, err = run(argv)
  assert code == 2, (argv, code, err)
  assert len(err.strip().splitlines()) == 1 and err.startswith("generate: error: "), (argv, err)
  assert "Traceback" not in err, (argv, err)
  if match is not None:
    assert match in err, (argv, err)
  return err


# -- generated values ------------------------------------------------------------------------------

NOT_NUMBERS = st.sampled_from(["", " ", "x", "1.5", "1e3", "nan", "inf", "-inf", "--", "4 4",
                               "True", "None", "[1]"])
NOT_FLOATS = st.sampled_from(["", "x", "1,5", "--", "None", "0.5.1", "[]"])
# flag: (lowest valid, highest valid or None); 0 counts for --num_prompts (all prompts)
INT_FLAGS = {"num_prompts": (0, 164), "batch_size": (1, 4096), "max_new_tokens": (1, 8191),
             "draft_num_layers": (0, 2), "samples_per_prompt": (1, 10_000), "verify_chunk": (1, 33),
             "summary_every": (1, None), "seed": (0, MAX_SEED), "num_processes": (1, None),
             "process_id": (0, None)}
ENUM_FLAGS = {"method": ("bass", "regular"), "sample_order": ("grouped", "interleaved"),
              "acceptance": bass_jax.acceptance_rules(), "dtype": ("auto", "float32", "bfloat16"),
              "profile": ("cpu", "gpu"), "draft_sharding": ("replicated", "tensor_parallel")}
BOOL_FLAGS = ("continuous", "distinct_prompts", "scan_layers", "resume", "overwrite")
WORD = st.text(st.characters(codec="utf-8", exclude_characters="\n\r\x00"), min_size=0, max_size=12)


@st.composite
def bad_int(draw):
  name = draw(st.sampled_from(sorted(INT_FLAGS)))
  low, high = INT_FLAGS[name]
  choices = [st.integers(max_value=low - 1).map(str), NOT_NUMBERS]
  if high is not None:
    choices.append(st.integers(min_value=high + 1, max_value=2**70).map(str))
  return [f"--{name}={draw(st.one_of(choices))}"]


@st.composite
def bad_float(draw):
  name = draw(st.sampled_from(["temperature", "top_p"]))
  if name == "temperature":
    value = st.one_of(st.floats(max_value=-1e-9, allow_nan=False).map(repr), NOT_FLOATS,
                      st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity"]))
  else:
    value = st.one_of(st.floats(max_value=0.0, allow_nan=False).map(repr),
                      st.floats(min_value=1.0000001, allow_nan=False).map(repr), NOT_FLOATS,
                      st.sampled_from(["nan", "inf", "-inf", "-0.0"]))
  return [f"--{name}={draw(value)}"]


@st.composite
def bad_enum_or_bool(draw):
  if draw(st.booleans()):
    name = draw(st.sampled_from(sorted(ENUM_FLAGS)))
    value = draw(WORD.filter(lambda v, n=name: v not in ENUM_FLAGS[n]))
    return [f"--{name}={value}"]
  name = draw(st.sampled_from(BOOL_FLAGS))
  value = draw(WORD.filter(lambda v: v.lower() not in ("true", "false", "t", "f", "1", "0")))
  return [f"--{name}={value}"]


TREE_TEXT = st.one_of(
    st.just(""), st.just(" "), WORD,
    st.lists(st.sampled_from(["top_k", "depth", "nodes", "width", "", " top_k "]), min_size=1,
             max_size=4).flatmap(lambda keys: st.tuples(*[st.one_of(
                 st.integers(-5, 2**40).map(str), NOT_NUMBERS) for _ in keys]).map(
                     lambda values, keys=keys: ",".join(f"{k}={v}" for k, v in zip(keys, values)))),
    st.tuples(st.integers(tree_lib.MAX_TOP_K + 1, 10**6), st.integers(1, 10**6),
              st.integers(1, 10**7)).map(lambda t: f"top_k={t[0]},depth={t[1]},nodes={t[2]}"))


def _is_valid_tree(text: str) -> bool:
  try:
    tree_lib.tree_shapes(text)
    return True
  except ValueError:
    return False


@st.composite
def bad_speculation(draw):
  kind = draw(st.sampled_from(["draft_len", "tree", "tree+regular", "tree+fixed", "two trees"]))
  if kind == "draft_len":
    value = draw(st.one_of(WORD.filter(lambda v: v not in ("dynamic", "goodput") and not (
        v.isascii() and v.isdigit() and 1 <= int(v) <= 32)), st.integers(33, 10**9).map(str)))
    return [f"--draft_len={value}"]
  if kind == "tree":
    return [f"--draft_tree={draw(TREE_TEXT.filter(lambda t: not _is_valid_tree(t)))}"]
  shape = draw(valid_shape())
  if kind == "tree+regular":
    return [f"--draft_tree={shape}", "--method=regular"]
  if kind == "tree+fixed":
    return [f"--draft_tree={shape}", f"--draft_len={draw(st.integers(1, 32))}"]
  other = draw(valid_shape().filter(lambda s: s != shape))
  return [f"--draft_tree={shape}", f"--draft_tree={other}"]


@st.composite
def bad_spec(draw, files):
  name = draw(st.sampled_from(["target", "draft", "prompts", "attention_impl", "output",
                               "summary_json", "mesh", "pair"]))
  if name == "target":
    return [f"--target={draw(st.sampled_from([files['dir'] + '/missing', files['file'], '', '.', files['dir'], files['other_vocab'] + '/config.json']))}"]
  if name == "draft":
    return [f"--draft={draw(st.sampled_from(['', 'hybrid:', 'hybrid+siblings:', 'ngram:max_n=x', 'ngram:foo=1', 'ngram:max_n=1,min_n=3', 'siblings:min_agreement=abc', 'siblings:pool=-1', 'hybrid:siblings', files['dir'] + '/missing', files['file'], files['other_vocab'], files['other_eos'], files['eagle_narrow'], 'hybrid:' + files['eagle_narrow']]))}"]
  if name == "prompts":
    return [f"--prompts={files[draw(st.sampled_from(['surrogate', 'broken', 'empty', 'no_prompt', 'blank', 'latin1', 'dir', 'file']))]}"]
  if name == "attention_impl":
    return [f"--attention_impl={draw(WORD.filter(lambda v: v not in bass_jax.attention_implementations()))}"]
  if name in ("output", "summary_json"):
    return [f"--{name}={draw(st.sampled_from([files['dir'], files['dir'] + '/', files['file'] + '/x.json']))}"]
  if name == "mesh":
    return [f"--mesh={draw(st.sampled_from(['x', '1,', ',2', '0,1', '1,0', '-1,2', '1,2,3', 'data:2,foo:4', '1.5,2']))}"]
  pair = draw(st.sampled_from([
      ["--resume", "--overwrite"], ["--samples_per_prompt=2", "--distinct_prompts"],
      ["--sample_order=interleaved"], ["--coordinator_address=localhost:1"],
      ["--num_processes=2", "--process_id=2", "--coordinator_address=localhost:1"],
      [f"--output={files['dir']}/same.json", f"--summary_json={files['dir']}/same.json"],
      ["--num_prompts=3", "--batch_size=4", "--temperature=0"],
      ["--draft_num_layers=3"], ["--max_new_tokens=8192"]]))
  return pair


@st.composite
def valid_shape(draw):
  top_k = draw(st.integers(1, 6))
  depth = draw(st.integers(1, 6))
  candidates = top_k + (depth - 1) * top_k**2
  nodes = draw(st.integers(depth + 1, min(candidates + 1, 64)))
  return str(tree_lib.TreeShape(top_k, depth, nodes))


@st.composite
def valid_run(draw, files):
  """A run every check must accept (on the default target, HumanEval prompts)."""
  method = draw(st.sampled_from(["bass", "regular"]))
  temperature = draw(st.one_of(st.just(0.0), st.floats(0.0, 5.0)))
  num_prompts = draw(st.integers(1, 20))
  argv = [f"--method={method}", f"--temperature={temperature!r}", f"--num_prompts={num_prompts}",
          f"--batch_size={draw(st.integers(1, num_prompts))}",
          f"--max_new_tokens={draw(st.integers(1, 512))}",
          f"--top_p={draw(st.floats(0.0, 1.0, exclude_min=True))!r}",
          f"--acceptance={draw(st.sampled_from(bass_jax.acceptance_rules()))}",
          f"--dtype={draw(st.sampled_from(['auto', 'float32', 'bfloat16']))}",
          f"--summary_every={draw(st.integers(1, 100))}",
          f"--output={files['dir']}/valid/records.jsonl", f"--summary_json={files['dir']}/valid/s.json"]
  continuous = draw(st.booleans())
  argv.append("--continuous" if continuous else "--nocontinuous")
  argv.append(f"--seed={draw(st.integers(0, MAX_SEED if continuous else MAX_SEED - 200))}")
  if draw(st.booleans()):
    argv.append(f"--verify_chunk={draw(st.integers(1, 33))}")
  draft = draw(st.sampled_from([DRAFT, "ngram", "ngram:max_n=3,min_n=1", "siblings",
                                "smollm2-135m-eagle", "hybrid:smollm2-135m-eagle",
                                f"hybrid+siblings:{DRAFT}:max_n=5,min_n=2"]))
  argv.append(f"--draft={draft}")
  if method == "bass":
    if draw(st.booleans()):
      shapes = draw(st.lists(valid_shape(), min_size=1, max_size=3, unique=True))
      argv += [f"--draft_tree={s}" for s in shapes]
      if len(shapes) > 1 or draw(st.booleans()):
        argv.append("--draft_len=goodput")
    else:
      argv.append(f"--draft_len={draw(st.sampled_from(['dynamic', 'goodput', *map(str, range(1, 33))]))}")
  return argv


# Examples per run (random each run: a refusal found once is a finding); BASS_JAX_CLI_EXAMPLES=3000
# searches longer (about 10 s).
SETTINGS = hypothesis.settings(max_examples=int(os.environ.get("BASS_JAX_CLI_EXAMPLES", "220")), deadline=None, database=None,
                               suppress_health_check=list(hypothesis.HealthCheck))


def test_generated_bad_values_are_each_refused_in_one_line(files):
  code, err = run(["--num_prompts=4", "--batch_size=2"])
  assert code is None, err  # the base every bad value is added to passes alone
  strategy = st.one_of(bad_int(), bad_float(), bad_enum_or_bool(), bad_speculation(),
                       bad_spec(files))
  seen = []

  @SETTINGS
  @hypothesis.given(strategy)
  def check(argv):
    seen.append(argv)
    assert_refused(["--num_prompts=4", "--batch_size=2", *argv])

  check()
  assert len(seen) >= 200


def test_generated_valid_settings_pass_every_check(files):
  seen = []

  @hypothesis.settings(SETTINGS, max_examples=40)
  @hypothesis.given(valid_run(files))
  def check(argv):
    seen.append(argv)
    code, err = run(argv)
    assert code is None, (argv, err)

  check()
  assert len(seen) >= 40


# -- each refusal that came late or unnamed ---------------------------------------------------------

@pytest.mark.parametrize("argv,match", [
    (["--draft_tree="], "draft_tree is empty"),
    (["--draft_tree=garbage"], "expected the fields top_k=, depth=, nodes="),
    (["--draft_tree=top_k=0"], "top_k must be >= 1"),
    (["--draft_tree=depth=-1"], "depth must be a positive integer"),
    (["--draft_tree=top_k=2,depth=3,nodes=3"], "nodes=3 must be at least depth + 1"),
    (["--draft_tree=top_k=2,width=3"], "got 'width=3'"),
    (["--draft_tree=top_k=2,top_k=3"], "top_k is given twice"),
    (["--draft_tree=top_k=1000,depth=1000,nodes=100000"], "top_k must be <= 16"),
    (["--draft_tree=top_k=2,depth=3,nodes=6", "--draft_len=4"], "chooses chain lengths"),
    (["--draft_tree=top_k=2,depth=3,nodes=6", "--draft_tree=top_k=3,depth=3,nodes=6"],
     "needs draft_len='goodput'"),
    (["--draft_tree=top_k=2,depth=3,nodes=6", "--draft_tree=depth=3,nodes=6,top_k=2",
      "--draft_len=goodput"], "repeats a shape"),
    (["--draft_tree=top_k=2,depth=3,nodes=6", "--method=regular"], "needs method='bass'"),
    (["--draft_len=33"], "an int in [1, 32]"),
    (["--seed=18446744073709551616"], "not an integer in the range [0, 9223372036854775807]"),
    (["--seed=9223372036854775807", "--nocontinuous"], "seed (with 2 batches, seed + 1) must be <="),
    (["--resume", "--overwrite"], "give one of them"),
    (["--draft={other_vocab}"], "different vocabulary sizes (50000 vs 49152)"),
    (["--draft={other_eos}"], "different eos_token_id (7 vs 2)"),
    (["--draft={eagle_narrow}"], "reads features of width hidden_size=48, and the target's are 576"),
    (["--draft=hybrid:{eagle_narrow}"], "reads features of width hidden_size=48"),
    (["--prompts={surrogate}"], "surrogate.jsonl:2: prompt holds a lone surrogate"),
    (["--prompts={latin1}"], "latin1.jsonl:2: not UTF-8 (byte 0xe9"),
    (["--draft_num_layers=3"], "the draft has 2 layers"),
    (["--draft=smollm2-135m-eagle", "--draft_num_layers=1"], "has none to cut"),
    (["--draft=ngram", "--draft_num_layers=1"], "has none to cut"),
    (["--draft_tree=top_k=2,depth=3,nodes=6,"], "an empty part (a stray comma?)"),
    (["--batch_size=5000"], "--batch_size=5000"),
    (["--verify_chunk=34"], "--verify_chunk=34"),
    (["--acceptance=py:no_such_module.Rule"], "--acceptance: acceptance 'py:no_such_module.Rule': "
     "cannot import 'no_such_module.Rule'"),
    (["--acceptance=py:json.JSONDecoder"], "is not a sampled AcceptanceRule"),
    (["--acceptance=py:bass_jax.MatchingRule"], "MatchingRule is abstract (it lacks choose)"),
])
def test_each_late_or_unnamed_refusal_is_one_line_before_loading(files, argv, match):
  assert_refused(["--num_prompts=4", "--batch_size=2", *(a.format(**files) for a in argv)],
                 match.format(**files))


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory) -> dict[str, str]:
  """tests/test_cli.py's setting without weights: a target and draft ``tiny`` (the shipped draft's
  config at a context of 2048, with SmolLM2's tokenizer), its 40 prompts, and the files its bad flags
  name."""
  root = tmp_path_factory.mktemp("cli")
  shipped = loading.resolve_alias(DRAFT)
  tiny = root / "tiny"
  tiny.mkdir()
  config = json.loads((shipped / "config.json").read_text())
  (tiny / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
  for name in ("tokenizer.json", "tokenizer_config.json"):
    (tiny / name).write_bytes((shipped / name).read_bytes())
  (root / "prompts.jsonl").write_text("".join(
      json.dumps({"task_id": f"t{i}", "prompt": f"def f{i}(x):\n    return"}) + "\n" for i in range(40)))
  (root / "a_file").write_text("")
  (root / "empty.jsonl").write_text('{"prompt": "def f():"}\n{"prompt": ""}\n')
  (root / "broken.jsonl").write_text('{"prompt": "def f():"\n')
  (root / "long.jsonl").write_text(json.dumps({"task_id": "long", "prompt": "x = 1\n" * 600}) + "\n")
  (root / "no_tokenizer").mkdir()
  (root / "no_tokenizer" / "config.json").write_text((tiny / "config.json").read_text())
  return {"dir": str(root), "file": str(root / "a_file"), "tiny": str(tiny),
          "prompts": str(root / "prompts.jsonl")}


# tests/test_cli.py's list of bad flags, once run each as a process: it keeps one process per stage
# of the checks (flag parsing, outputs, prompts, models, context, imports, and --mesh, which only
# init_script checks); the rest are here. (--resume --overwrite, --draft_tree with --method=regular,
# a lone surrogate and a seed past 2**64 are in the list above.)
@pytest.mark.parametrize("flag,message", [
    ("--output={file}/out.jsonl", "is a file, not a directory"),
    ("--output={dir}", "is a directory"),
    ("--summary_json={dir}/", "is a directory"),
    ("--output={dir}/same.json --summary_json={dir}/same.json", "are the same file"),
    ("--batch_size=0", "batch_size"),
    ("--top_p=0", "top_p"),
    ("--top_p=nan", "top_p"),
    ("--temperature=-1", "temperature"),
    ("--temperature=nan", "--temperature must be a finite number"),
    ("--draft_len=often", "draft_len"),
    ("--attention_impl=foo", "--attention_impl='foo' is not one of"),
    ("--max_new_tokens=100000", "--max_new_tokens=100000 does not fit the models' context of 2048"),
    ("--draft={dir}/missing", "no model at"),
    ("--draft=hybrid:{dir}/missing", "draft spec 'hybrid:"),
    ("--draft=ngram:max_n=x", "draft spec 'ngram:max_n=x': ngram's max_n is <int>, got 'x'"),
    ("--draft=py:no_such_module.Lookup", "cannot import 'no_such_module.Lookup'"),
    ("--target={dir}/no_tokenizer", "ships no tokenizer"),
    ("--prompts={dir}/empty.jsonl", "empty.jsonl:2: the prompt is empty"),
    ("--prompts={dir}/broken.jsonl", "broken.jsonl:1: not valid JSON"),
    ("--prompts={dir}/long.jsonl --num_prompts=1 --batch_size=1", "prompt 'long' has"),
    ("--num_prompts=40 --batch_size=50", "distinct_prompts needs at least batch_size=50"),
    ("--sample_order=interleaved", "--sample_order=interleaved orders several samples"),
    ("--samples_per_prompt=2 --distinct_prompts", "--samples_per_prompt replaces --distinct_prompts"),
])
def test_the_bad_flags_of_the_cli_tests_are_each_refused_in_one_line(cli_files, flag, message):
  """Against test_cli.py's tiny target and draft (context 2048) and its prompts, as there."""
  base = [f"--target={cli_files['tiny']}", f"--draft={cli_files['tiny']}",
          f"--prompts={cli_files['prompts']}", "--num_prompts=4", "--batch_size=2"]
  code, err = run(base)
  assert code is None, err  # the base each bad flag is added to passes alone
  assert_refused([*base, *flag.format(**cli_files).split()], message)


def test_an_acceptance_rule_named_by_its_import_path_passes_the_checks():
  code, err = run(["--num_prompts=4", "--batch_size=2", "--temperature=0.8",
                   "--acceptance=py:bass_jax.sampling.acceptance.Gumbel"])
  assert code is None, err


def test_the_same_tree_written_otherwise_is_the_same_setting_for_resume(files, tmp_path):
  """A resumed run compares the canonical shape, not its text."""
  out = [f"--output={tmp_path}/r.jsonl", f"--summary_json={tmp_path}/s.json", "--draft=ngram",
         "--num_prompts=4", "--batch_size=2"]
  checked = generate.check(["generate", *out, "--draft_tree=top_k=2,depth=3,nodes=6"])
  (tmp_path / "s.json").write_text(json.dumps({"complete": False, "settings": checked.settings}))
  (tmp_path / "r.jsonl").write_text("")
  code, err = run([*out, "--resume", "--draft_tree=nodes=6, depth=3,top_k=2"])
  assert code is None, err
  assert_refused([*out, "--resume", "--draft_tree=nodes=7,depth=3,top_k=2"], "--draft_tree:")


def test_a_run_written_before_a_flag_existed_resumes_at_its_default(files, tmp_path):
  """The settings on disk lack a flag added since (written before --draft_sharding and --profile were
  generate's): at the flag's default it is the same setting; given otherwise, it is named."""
  out = [f"--output={tmp_path}/r.jsonl", f"--summary_json={tmp_path}/s.json", "--draft=ngram",
         "--num_prompts=4", "--batch_size=2"]
  settings = generate.check(["generate", *out]).settings
  assert {"seed", "draft_sharding", "profile", "max_new_tokens"} <= set(settings)  # decode flags too
  old = {k: v for k, v in settings.items() if k not in ("draft_sharding", "profile")}
  (tmp_path / "s.json").write_text(json.dumps({"complete": False, "settings": old}))
  (tmp_path / "r.jsonl").write_text("")
  code, err = run([*out, "--resume"])
  assert code is None, err
  assert_refused([*out, "--resume", "--draft_sharding=tensor_parallel"],
                 "--draft_sharding: None on disk, 'tensor_parallel' now")


# -- the decode flags are DecodeConfig's fields --------------------------------------------------------

def test_the_decode_flags_are_decode_configs_fields_with_its_defaults_and_limits():
  """experiments._decode_flags is written out (the flags exist before bass_jax loads); here it is
  checked against DecodeConfig: one row per field but the ones NOT_FLAGS explains, each row's default
  DecodeConfig's, its limits the library's."""
  fields = {f.name: f.default for f in dataclasses.fields(bass_jax.DecodeConfig)}
  assert set(_decode_flags.ROWS).isdisjoint(_decode_flags.NOT_FLAGS)
  assert set(_decode_flags.ROWS) | set(_decode_flags.NOT_FLAGS) == set(fields)
  assert list(_decode_flags.FIELDS) == [f for f in fields if f in _decode_flags.ROWS]  # field order
  for name, row in _decode_flags.ROWS.items():
    assert row.value(row.default) == fields[name], name
  assert _decode_flags.MAX_SEED == config_lib.MAX_SEED
  assert _decode_flags.MAX_VERIFY_CHUNK == draft_len_lib.MAX_DRAFT_LEN + 1
  assert set(_decode_flags.PROFILES) == set(profiles.PROFILES)
  assert set(_decode_flags.ROWS["draft_sharding"].keywords["enum_values"]) == set(sharding.RULES)
  with pytest.raises(ValueError, match="no decode flag for 'mesh': --mesh sets"):
    _decode_flags.define("mesh")
  with pytest.raises(ValueError, match="no decode flag for 'max_len'"):
    _decode_flags.define(max_len=3)


def test_generate_reads_its_decode_flags_into_one_decode_config(files):
  """What the script passes to run_problems is one DecodeConfig of its flags: the values given, the
  script's own default batch size, DecodeConfig's defaults elsewhere (flags reset after)."""
  argv = ["--num_prompts=4", "--batch_size=2", "--max_new_tokens=9", "--temperature=0.5",
          "--top_p=0.9", "--seed=7", "--acceptance=gumbel", "--draft_len=3", "--verify_chunk=2",
          "--profile=cpu", "--draft_sharding=tensor_parallel", "--attention_impl=reference"]
  code, err = run(argv)
  assert code is None, err
  try:
    assert generate._DECODE.config() == bass_jax.DecodeConfig(
        max_new_tokens=9, temperature=0.5, top_p=0.9, seed=7, acceptance="gumbel", draft_len=3,
        verify_chunk=2, batch_size=2, profile="cpu", draft_sharding="tensor_parallel",
        attention_impl="reference")
    assert generate._DECODE.config(seed=1).seed == 1
  finally:
    code, err = run(["--num_prompts=4", "--batch_size=2"])
  assert code is None, err
  config = generate._DECODE.config()
  assert config == bass_jax.DecodeConfig(batch_size=2, draft_len="dynamic")
  assert "max_prompt_len" not in generate._DECODE.holders  # run_problems decides it (see generate.py)
