r"""The decode step at 135M, 1B and 8B scale on a GPU, in one command that needs nothing beyond the
repository: random weights of published shapes, each with a one-layer EAGLE-shaped draft.

    python -m experiments.benchmarks.bench_scale --results_dir=gpu_scale   # a GPU, <= 8 minutes
    python -m experiments.benchmarks.bench_scale --quick                   # CPU smoke run (the suite's)
    python -m experiments.benchmarks.bench_scale --census --results_dir=R  # CPU: deviceless census

What it measures, in this order, each figure written the moment it exists (``bench_scale.jsonl``, one
record a line; ``bench_scale.json`` and ``bench_scale.md`` rendered after every part), so a run cut
short keeps what it finished and ``--resume`` measures only the rest:

1. **Bandwidth**: the device's copy bandwidth (a jitted ``x * 2`` over ``--bandwidth_mib``, median of
   10: bytes read and written over time), the roofline's denominator.
2. **Forward table**, per shape: the target's forward (the backend profile's attention and XLA
   options, logits at every position) at B x T over a cache holding ``--context`` entries per row, the
   median of ``--repeats`` calls, and its fraction of the HBM roofline: (weight bytes + the KV bytes the
   rows hold) / bandwidth over the measured time; the draft's own step (one position) at each B.
3. **End to end**, per shape and B: regular decoding, then BASS chains through ``bass_jax.generate``
   with a :class:`bass_jax.Replay` proposer over the EAGLE draft: its forwards run every draft step
   (their cost counts), and it proposes the target's own continuation recorded by the regular decode,
   each token replaced at the real SmolLM2 pair's per-position rates (``--acceptance``; the replay's
   module docstring says where they come from), so the figures are **cost at scale with a realistic
   acceptance**, labelled so. Greedy, distinct random prompts, no stop ids. tokens/s, ms/token (All),
   the steady step, the accepted length, and whether BASS emitted regular decoding's tokens.
4. **Command buffers** (a second process, ``XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,
   +CONDITIONAL``: the whole decode one CUDA graph): end to end at ``--while_batch_sizes``, tokens
   checked equal to the first process's.
5. **XLA's defaults** (a third process): the forward's goal cells compiled without the profile's
   ``compiler_options`` (with XLA's ``dot-strength-reduction``), for the comparison.

The first process works in phases across the shapes, the goals first: every shape's goal cells of
the forward table (B = 1, 16; T = 1, 5, 9), then end to end for every shape, then the rest of the
table; a failure (an out-of-memory cell, say) is recorded and the next shape or cell runs.
Programs of a shape are compiled in parallel threads (XLA compiles without the GIL; a GPU machine has
16 cores) before any is timed, and JAX's persistent cache (``--compilation_cache_dir``) keeps them for
a second call. Each process gets a share of ``--budget_s`` (it stops starting work past it, and is
ended at its deadline); the default fits one 8-minute command.

``--census`` (no GPU): compiles the forward of each shape (3 layers: a layer's kernels do not depend
on the depth) for an H100 on this machine (``make aot-plugin``; ``bass_jax.tooling.thunk_census``) at
B = 1, 16 and T = 1, 9, with the profile's XLA options and with XLA's defaults, and counts kernels per
decoder layer, GEMMs among them, and launches per forward (docs/gpu.md).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from experiments import _decode_flags
from experiments import _deviceless
from experiments import _io

_RESULTS = flags.DEFINE_string("results_dir", None, "Directory for bench_scale.{jsonl,json,md}; "
                               "default a fresh outputs/bench_scale-<time>/.")
_QUICK = flags.DEFINE_bool("quick", False, "CPU smoke run: SmolLM2's shape with 1 layer and a "
                           "4,096-token vocabulary, float32, B = 2, T = 1, 3 (the goal cell T = 1), "
                           "8 new tokens, a draft head of 2,048 tokens.")
_CENSUS = flags.DEFINE_bool("census", False, "Count kernels per layer from XLA's deviceless H100 "
                            "compile instead of timing (no GPU; needs `make aot-plugin`).")
_SHAPES = flags.DEFINE_list("shapes", ["llama-3.1-8b", "llama-3.2-1b", "smollm2-135m"],
                            "Shapes (experiments._shapes.SHAPES), in the order they run.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Weights and compute.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "4", "16", "64"], "Batch sizes.")
_NUM_NEW = flags.DEFINE_list("num_new", ["1", "2", "5", "9", "17", "33", "65"],
                             "Positions per row of the forward table (T).")
_CONTEXT = flags.DEFINE_integer("context", 512, "Cache entries per row before a forward.",
                                lower_bound=1)
_CACHE_LEN = flags.DEFINE_integer("cache_len", 2048, "Cache slots per row of the forward table.",
                                  lower_bound=64)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls per forward cell.", lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "Tokens per prompt (end to end).", lower_bound=1)
_MAX_NEW = _decode_flags.define(max_new_tokens=128)["max_new_tokens"]  # per row, end to end
flags.register_validator("max_new_tokens", lambda v: v >= 2, message="--max_new_tokens must be at "
                         "least 2: the steady step time leaves the first step out")
_E2E_REPEATS = flags.DEFINE_integer("e2e_repeats", 2, "Timed decodes per setting, after one untimed.",
                                    lower_bound=1)
_DRAFT_LEN = flags.DEFINE_string("draft_len", "3", "BASS's draft length: an int, or 'goodput'.")
_ACCEPTANCE = flags.DEFINE_list("acceptance", None, "Per-position acceptance of the replay; default "
                                "the real SmolLM2 pair's (bass_jax.sampling.proposers.replay).")
_DRAFT_VOCAB = flags.DEFINE_integer("draft_vocab", 32768, "The EAGLE draft's vocabulary V' (its "
                                    "head's rows; EAGLE-3's published drafts use 32,000).",
                                    lower_bound=1)
_ISOLATED = flags.DEFINE_bool("isolated_costs", False, "Also measure the step costs the cost-aware "
                               "draft length weighs (each piece a program of its own) beside the "
                               "in-loop step, per B (a few compiles more per shape).")
_WHILE_BATCHES = flags.DEFINE_list("while_batch_sizes", ["1", "16"], "Batch sizes of part 4.")
_PARTS = flags.DEFINE_list("parts", ["forward", "e2e", "command_buffers", "xla_defaults"],
                           "Parts to run (the bandwidth always runs with 'forward').")
_BUDGET = flags.DEFINE_float("budget_s", 450.0, "Wall seconds for the whole run, compiles included.",
                             lower_bound=10.0)
_RESUME = flags.DEFINE_bool("resume", False, "Keep the records of an earlier call in --results_dir "
                            "and measure only what they lack.")
_CHILD = flags.DEFINE_string("child", None, "Internal: the process variant to run.")
_DEADLINE = flags.DEFINE_float("deadline", None, "Internal: the child's deadline (epoch seconds).")

WHILE_FLAGS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
# The parts' processes: (variant, part it serves, XLA_FLAGS added, share of the budget it may end at).
VARIANTS = (("default", ("forward", "e2e"), "", 0.62),
            ("while", ("command_buffers",), WHILE_FLAGS, 0.87),
            ("xla_defaults", ("xla_defaults",), "", 1.0))
GOAL_CELLS = [(1, 1), (1, 5), (1, 9), (16, 1), (16, 5), (16, 9)]  # (B, T): the goal cells
MARGIN_S = 8.0  # stop starting work this long before a deadline


def _settings():
  """The run's sizes (``--quick`` shrinks them)."""
  if _QUICK.value:
    return dict(shapes=["smollm2-135m:layers=1:vocab=4096"], dtype="float32", batches=[2],
                num_new=[1, 3], context=16, cache_len=64, repeats=2, prompt_len=6, max_new=8,
                e2e_repeats=1, while_batches=[2], bandwidth_mib=4, goal_cells=[(2, 1)],
                draft_vocab=2048)
  return dict(shapes=_SHAPES.value, dtype=_DTYPE.value, batches=[int(b) for b in _BATCHES.value],
              num_new=[int(t) for t in _NUM_NEW.value], context=_CONTEXT.value,
              cache_len=_CACHE_LEN.value, repeats=_REPEATS.value, prompt_len=_PROMPT_LEN.value,
              max_new=_MAX_NEW.value, e2e_repeats=_E2E_REPEATS.value,
              while_batches=[int(b) for b in _WHILE_BATCHES.value], bandwidth_mib=1024,
              goal_cells=GOAL_CELLS, draft_vocab=_DRAFT_VOCAB.value)


class Records:
  """``bench_scale.jsonl``: one JSON record a line, appended and flushed as each is measured."""

  def __init__(self, path: pathlib.Path):
    self.path = path

  def read(self) -> list[dict]:
    """Every record; a line cut short (a process ended at its deadline mid-write) is skipped."""
    if not self.path.exists():
      return []
    records = []
    for line in self.path.read_text().splitlines():
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
    return records

  def keys(self) -> set:
    """The keys measured (a record with an error is not: ``--resume`` tries it again)."""
    return {r["key"] for r in self.read() if "key" in r and "error" not in r}

  def add(self, record: dict) -> None:
    """Appends ``record`` as one line, flushed to disk."""
    with open(self.path, "a") as f:
      f.write(json.dumps(record, default=float) + "\n")
      f.flush()
      os.fsync(f.fileno())


# -- the child processes: measurements -------------------------------------------------------------


def _child(variant: str, run_dir: pathlib.Path, deadline: float) -> None:
  """Runs one variant's parts, appending records until the deadline."""
  import jax  # pylint: disable=g-import-not-at-top

  from bass_jax.sampling import programs  # pylint: disable=g-import-not-at-top

  s = _settings()
  records = Records(run_dir / "bench_scale.jsonl")
  done = records.keys()
  device = jax.devices()[0]
  base = {"variant": variant, "device": f"{device.platform}:{device.device_kind}",
          "jax_version": jax.__version__, "date": datetime.date.today().isoformat(),
          "dtype": s["dtype"]}
  programs.set_compile_cache_size(256)  # every setting of a shape stays compiled

  def left() -> float:
    return deadline - time.time() - MARGIN_S

  def add(key: str, **fields) -> None:
    record = {**base, "key": f"{variant}/{key}", **fields}
    records.add(record)
    if "error" not in fields:  # measured: a later phase (the rest of the table) skips it
      done.add(record["key"])
    print(json.dumps({k: v for k, v in record.items() if k not in ("device", "jax_version", "date")},
                     default=float), flush=True)

  if variant == "default" and "forward" in _PARTS.value and f"{variant}/bandwidth" not in done:
    add("bandwidth", kind="bandwidth", gbps=_bandwidth(s["bandwidth_mib"]))
  bandwidth = next((r["gbps"] for r in records.read() if r.get("kind") == "bandwidth"), None)
  models = {}

  def pair(shape):  # each shape's target and draft, made once and kept (the largest is 16 GB)
    if shape not in models:
      from experiments import _shapes  # pylint: disable=g-import-not-at-top

      target = _shapes.random_model(f"random:{shape}", s["dtype"])
      models[shape] = (target, _shapes.random_eagle_draft(target, s["draft_vocab"]))
    return models[shape]

  # The goals first, across shapes: the forward's goal cells, then end to end, then the rest.
  phases = {"default": [("forward_goals", "forward"), ("e2e", "e2e"), ("forward_rest", "forward")],
            "while": [("e2e_while", "command_buffers")],
            "xla_defaults": [("forward_defaults", "xla_defaults")]}[variant]
  for phase, part in phases:
    if part not in _PARTS.value:
      continue
    for shape in s["shapes"]:
      if left() <= 0:
        return
      try:
        target, draft = pair(shape)
        if phase == "forward_goals":
          _forward_part(variant, shape, target, draft, s, bandwidth, done, add, left,
                        cells=s["goal_cells"], options=None)
        elif phase == "forward_rest":
          _forward_part(variant, shape, target, draft, s, bandwidth, done, add, left,
                        cells=None, options=None)
        elif phase == "forward_defaults":
          _forward_part(variant, shape, target, draft, s, bandwidth, done, add, left,
                        cells=s["goal_cells"], options=())
        else:
          batches = s["while_batches"] if variant == "while" else s["batches"]
          _e2e_part(shape, target, draft, batches, s, done, add, left, variant)
      except Exception as e:  # pylint: disable=broad-except
        # Recorded, and the next shape runs (an out-of-memory 8B cell must not cost the 1B table).
        add(f"{phase}/{shape}/error", kind="error", shape=shape,
            error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
      finally:
        programs.clear_compile_cache()


def _bandwidth(mib: int) -> float:
  """GB/s of a jitted ``x * 2`` over ``mib`` MiB of bf16 (read once, written once), median of 10."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  x = jnp.ones((mib * 2**20 // 2,), jnp.bfloat16)
  double = jax.jit(lambda x: x * 2)
  jax.block_until_ready(double(x))
  times = []
  for _ in range(10):
    start = time.perf_counter()
    jax.block_until_ready(double(x))
    times.append(time.perf_counter() - start)
  return 2 * x.nbytes / statistics.median(times) / 1e9


def _nbytes(tree) -> int:
  """Bytes of every array of ``tree``."""
  import jax  # pylint: disable=g-import-not-at-top

  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _compile_all(jobs: dict, workers: int = 8) -> dict:
  """``{key: thunk() -> compiled}`` compiled in parallel threads; ``{key: compiled or exception}``."""
  out = {}
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    futures = {pool.submit(job): key for key, job in jobs.items()}
    for future in concurrent.futures.as_completed(futures):
      try:
        out[futures[future]] = future.result()
      except Exception as e:  # pylint: disable=broad-except
        out[futures[future]] = e
  return out


def _forward_part(variant, shape, target, draft, s, bandwidth, done, add, left, *, cells, options):
  """The forward table of ``shape`` (or ``cells`` of it), with the profile's XLA options (``options``
  None) or with ``options``; the draft's one-position step at each B."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from bass_jax.models import common  # pylint: disable=g-import-not-at-top
  from bass_jax import profiles  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import costs  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling.drafts import resolve_draft  # pylint: disable=g-import-not-at-top

  profile = profiles.backend_profile()
  impl = profile.attention_impl
  options = dict(profile.compiler_options if options is None else options) or None
  cfg, dtype = target.config, s["dtype"]
  grid = cells or [(b, t) for b in s["batches"] for t in s["num_new"]]
  grid = [(b, t) for b, t in dict.fromkeys(grid) if f"{variant}/forward/{shape}/{b}x{t}" not in done
          and s["context"] + t <= s["cache_len"]]
  weights = _nbytes(target.params) - (0 if cfg.tie_word_embeddings else
                                      _nbytes(target.params["embed_tokens"]))
  kv_token = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
              * jnp.dtype(dtype).itemsize)  # bytes of one position's K and V, every layer
  caches = {}

  def cache_for(batch):  # a real cache, made when a cell of this B is timed (main thread)
    if batch not in caches:
      cache = cfg.init_cache(batch, s["cache_len"], jnp.dtype(dtype))
      caches[batch] = cache.with_lengths(jnp.full((batch,), s["context"], jnp.int32))
    return caches[batch]

  def program(batch, num_new):
    def run(params, tokens, cache):
      logits, cache = common.forward(cfg, params, tokens, cache, dtype=dtype, attention_impl=impl)
      return logits, cache.with_lengths(cache.lengths - num_new)
    tokens = jax.ShapeDtypeStruct((batch, num_new), jnp.int32)
    shapes = jax.eval_shape(lambda: cfg.init_cache(batch, s["cache_len"], jnp.dtype(dtype)))
    return lambda: jax.jit(run, donate_argnums=2, compiler_options=options).lower(
        target.params, tokens, shapes).compile()

  if not grid or left() <= 0:
    return
  start = time.perf_counter()
  compiled = _compile_all({cell: program(*cell) for cell in grid})
  compile_s = time.perf_counter() - start
  for batch, num_new in grid:
    key, prog = f"forward/{shape}/{batch}x{num_new}", compiled[(batch, num_new)]
    if left() <= 0:
      break
    try:
      if isinstance(prog, Exception):
        raise prog
      tokens = jnp.ones((batch, num_new), jnp.int32)
      state = {"cache": cache_for(batch)}

      def call(prog=prog, tokens=tokens, state=state):
        logits, state["cache"] = prog(target.params, tokens, state["cache"])
        return logits

      ms = costs.median_seconds(call, s["repeats"]) * 1e3
      caches[batch] = state["cache"]
    except Exception as e:  # pylint: disable=broad-except
      caches.pop(batch, None)  # a failed call may have consumed the donated cache
      add(key, kind="forward", shape=shape, batch=batch, num_new=num_new,
          error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
      continue
    moved = weights + batch * (s["context"] + num_new) * kv_token
    roofline_ms = None if not bandwidth else moved / (bandwidth * 1e9) * 1e3
    add(key, kind="forward", shape=shape, batch=batch, num_new=num_new, ms=ms, bytes=moved,
        roofline_ms=roofline_ms, hbm_fraction=None if roofline_ms is None else roofline_ms / ms,
        attention_impl=impl, compiler_options=options or {}, compile_s_all_cells=compile_s)
  if cells is not None:
    return
  proposer, params, _ = resolve_draft(draft, target, impl)
  for batch in s["batches"]:
    key = f"draft_forward/{shape}/{batch}"
    if f"{variant}/{key}" in done or left() <= 0:
      continue
    with costs.compiled_with(options):  # the profile's options, as the target's table
      first, nxt = proposer.forward_costs(params, batch, s["cache_len"], 4)
    add(key, kind="draft_forward", shape=shape, batch=batch, first_ms=first * 1e3, next_ms=nxt * 1e3,
        compiler_options=options or {})


def _e2e_part(shape, target, draft, batches, s, done, add, left, variant):
  """Regular decoding, then BASS with the replay over the EAGLE draft, at each B."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import metrics  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import costs, programs  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling.proposers import replay_text  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling.proposers import replay  # pylint: disable=g-import-not-at-top

  vocab = target.config.vocab_size
  # Distinct random prompts, the same for a batch size in every process (seeded by B).
  prompts = {b: np.random.default_rng(b).integers(0, vocab, (b, s["prompt_len"])).tolist()
             for b in batches}
  draft_len = _DRAFT_LEN.value if _DRAFT_LEN.value == "goodput" else int(_DRAFT_LEN.value)
  acceptance = (tuple(float(a) for a in _ACCEPTANCE.value) if _ACCEPTANCE.value
                else replay.SMOLLM2_POSITION_ACCEPTANCE)
  todo = [b for b in batches if f"{variant}/e2e/{shape}/{b}/bass" not in done]

  def config(method):
    return bass_jax.DecodeConfig(method=method, max_new_tokens=s["max_new"], temperature=0.0,
                                 eos_token_id=(),
                                 draft_len=draft_len if method == "bass" else "dynamic")

  def precompile(plans):
    jobs = {b: (lambda p=p: programs.compiled(p.spec, p.args_prefill,
                                              (*p.args_tail, p.place(np.bool_(True)))))
            for b, p in plans.items()}
    start = time.perf_counter()
    out = _compile_all(jobs)
    return out, time.perf_counter() - start

  def timed(plan):
    bass_jax.run(plan)  # untimed: the first call's one-off costs
    outs = [bass_jax.run(plan) for _ in range(s["e2e_repeats"])]
    walls = [o.stats.wall_seconds for o in outs]
    out = outs[int(np.argsort(walls)[len(walls) // 2])]  # the median call
    st = out.stats
    first = float(np.median(st.first_token_seconds))
    tokens = int(out.lengths.sum())
    return out, dict(
        wall_s=st.wall_seconds, tokens=tokens, tokens_per_s=tokens / st.wall_seconds,
        ms_per_token_all=metrics.per_token_latency(st.finish_seconds, out.lengths).all,
        steps=st.steps, ms_per_step=(st.wall_seconds - first) / max(st.steps - 1, 1) * 1e3,
        first_token_ms=first * 1e3,
        tokens_sha1=hashlib.sha1(np.ascontiguousarray(out.tokens).tobytes()).hexdigest())

  if not todo or left() <= 0:
    return
  plans = {b: bass_jax.prepare(target, None, prompts[b], config("regular")) for b in todo}
  compiled, compile_s = precompile(plans)
  regular = {}
  for b in todo:
    if left() <= 0:
      return
    if isinstance(compiled[b], Exception):
      add(f"e2e/{shape}/{b}/regular", kind="e2e", shape=shape, batch=b, method="regular",
          error=f"{type(compiled[b]).__name__}: {str(compiled[b])[:300]}")
      continue
    regular[b], fields = timed(plans[b])  # also the recording the BASS run replays
    if f"{variant}/e2e/{shape}/{b}/regular" not in done:
      add(f"e2e/{shape}/{b}/regular", kind="e2e", shape=shape, batch=b, method="regular",
          compile_s_all_batches=compile_s, **fields)
  plans = {}
  for b, out in regular.items():
    text = replay_text(prompts[b], out.tokens, out.lengths)
    plans[b] = bass_jax.prepare(target, bass_jax.Replay(draft, text, acceptance=acceptance),
                                prompts[b], config("bass"))
  if not plans or left() <= 0:
    return
  compiled, compile_s = precompile(plans)
  for b, plan in plans.items():
    if left() <= 0:
      return
    key = f"e2e/{shape}/{b}/bass"
    if isinstance(compiled[b], Exception):
      add(key, kind="e2e", shape=shape, batch=b, method="bass",
          error=f"{type(compiled[b]).__name__}: {str(compiled[b])[:300]}")
      continue
    out, fields = timed(plan)
    st = out.stats
    got = metrics.acceptance(st.draft_lens, st.accepted, st.drafted)
    step_costs = None
    if _ISOLATED.value and variant == "default":  # what the cost-aware policy would weigh
      c = costs.measure_step_costs(plan.spec, plan.args_tail[0], plan.args_tail[1], plan.rows)
      step_costs = {"plain_ms": c.plain * 1e3, "verify_pass_ms": c.verify_pass * 1e3,
                    "propose_first_ms": c.propose_first * 1e3,
                    "propose_next_ms": c.propose_next * 1e3}
    reg = regular[b]
    policy = {}
    if st.step_costs is not None:  # the cost-aware draft length: what it weighed and chose
      policy = {"policy_step_costs": dataclasses.asdict(st.step_costs),
                "plain_step_share": float(np.mean(st.draft_lens == 0)),
                "mean_draft_len": float(np.mean(st.draft_lens))}
    add(key, kind="e2e", shape=shape, batch=b, method="bass", compile_s_all_batches=compile_s,
        **policy,
        draft_len=str(draft_len), acceptance=list(acceptance),
        mean_accepted_length=got.mean_accepted_length,
        position_acceptance=list(got.position_acceptance),
        tokens_equal_regular=bool(np.array_equal(out.tokens, reg.tokens)),
        rows_equal_regular=float(np.mean([np.array_equal(a, r)
                                          for a, r in zip(out.tokens, reg.tokens)])),
        isolated_step_costs=step_costs, **fields)


# -- the census (no GPU) ---------------------------------------------------------------------------


def _census_child(run_dir: pathlib.Path) -> None:
  """Kernels per layer of each shape's forward, compiled for an H100 without one."""
  dump_dir = pathlib.Path(tempfile.mkdtemp(prefix="bench_scale_census_"))
  _deviceless.prepare(_deviceless.DEFAULT_PLUGIN, dump_dir, ".*census_.*")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax import platforms  # pylint: disable=g-import-not-at-top
  from bass_jax.models import common  # pylint: disable=g-import-not-at-top
  from bass_jax import profiles  # pylint: disable=g-import-not-at-top
  from bass_jax.tooling import thunk_census  # pylint: disable=g-import-not-at-top
  from experiments import _shapes  # pylint: disable=g-import-not-at-top

  records = Records(run_dir / "bench_scale.jsonl")
  done = records.keys()
  target_config = (_deviceless.TARGET_CONFIGS / "h100_sxm.txtpb").read_text()
  profile = profiles.PROFILES["gpu"]
  shapes = ["smollm2-135m"] if _QUICK.value else _SHAPES.value + ["phi-3-mini"]
  cells = [(1, 1)] if _QUICK.value else [(1, 1), (1, 9), (16, 1), (16, 9)]
  for shape in dict.fromkeys(shapes):
    cfg = _shapes.shape_config(f"{shape}:layers=3")
    params = jax.eval_shape(lambda: bass_jax.init_params(cfg, jax.random.key(0), jnp.bfloat16))
    for (batch, num_new) in cells:
      for label, options in (("profile", dict(profile.compiler_options)), ("xla_defaults", {})):
        key = f"census/{shape}/{batch}x{num_new}/{label}"
        if key in done:
          continue
        name = f"census_{shape.replace('-', '_').replace('.', '_')}_{batch}x{num_new}_{label}"
        cache = jax.eval_shape(lambda b=batch: cfg.init_cache(b, 2048, jnp.bfloat16))

        def run(params, tokens, cache, num_new=num_new):
          with platforms.compiling_for("cuda"):
            logits, cache = common.forward(cfg, params, tokens, cache, dtype="bfloat16",
                                           attention_impl=profile.attention_impl)
          return logits, cache.with_lengths(cache.lengths - num_new)
        run.__name__ = name
        tokens = jax.ShapeDtypeStruct((batch, num_new), jnp.int32)
        thunk_census.compile_deviceless(run, (params, tokens, cache), {}, target_config,
                                        compiler_options=options or None, donate_argnums=(2,))
        dump = thunk_census.read_dump(dump_dir, name)
        thunks = dump.thunks()
        per_layer = thunk_census.kernels_per_layer(thunks)
        names = per_layer["example"]
        record = {"key": key, "kind": "census", "variant": label, "shape": shape, "batch": batch,
                  "num_new": num_new, "compile_for": "h100", "jax_version": jax.__version__,
                  "device": f"{platform.machine()} CPU, deviceless compile for an H100",
                  "date": datetime.date.today().isoformat(), "dtype": "bfloat16",
                  "command": "python -m experiments.benchmarks.bench_scale --census",
                  "compiler_options": options,
                  "launches_per_forward": thunk_census.count(thunks, dump.trips()).launches,
                  "kernels_per_layer": per_layer["median"],
                  "gemms_per_layer": sum("gemm" in n or "cublas" in n for n in names),
                  "multiply_reduce_per_layer": sum("multiply" in n for n in names),
                  "layer_kernels": names}
        records.add(record)
        print(json.dumps({k: record[k] for k in ("shape", "batch", "num_new", "variant",
                                                 "kernels_per_layer", "gemms_per_layer",
                                                 "launches_per_forward")}), flush=True)


# -- the parent: processes and the report ----------------------------------------------------------


def _run_children(run_dir: pathlib.Path, argv: list[str]) -> None:
  """Runs each variant's process (:data:`VARIANTS`) with its XLA flags and its share of the budget,
  rendering the report after each; a process that fails or runs out of time leaves its records."""
  start = time.time()
  for variant, parts, xla_flags, share in VARIANTS:
    if not set(parts) & set(_PARTS.value):
      continue
    deadline = start + _BUDGET.value * share
    if deadline - time.time() < 2 * MARGIN_S:
      print(f"bench_scale: no time left for the {variant} process", flush=True)
      continue
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    command = [sys.executable, "-m", "experiments.benchmarks.bench_scale", *argv,
               f"--child={variant}", f"--deadline={deadline}", f"--results_dir={run_dir}",
               "--resume"]
    print(f"bench_scale: the {variant} process ({xla_flags or 'XLA flags as given'}), "
          f"{deadline - time.time():.0f} s", flush=True)
    try:
      done = subprocess.run(command, env=env, timeout=max(deadline - time.time(), 1) + 5,
                            check=False)
      if done.returncode:
        print(f"bench_scale: the {variant} process failed (exit {done.returncode}; its error is "
              "above); what it measured is kept", flush=True)
    except subprocess.TimeoutExpired:
      print(f"bench_scale: the {variant} process reached its deadline", flush=True)
    _report(run_dir)


def _report(run_dir: pathlib.Path) -> None:
  """Renders bench_scale.json (every record) and bench_scale.md (the tables and the goals)."""
  records = Records(run_dir / "bench_scale.jsonl").read()
  _io.write_json_atomic(run_dir / "bench_scale.json", {"experiment": "bench_scale",
                                                       "records": records})
  _io.write_text_atomic(run_dir / "bench_scale.md", render(records))


def render(records: list[dict]) -> str:
  """The Markdown report of ``records`` (bench_scale.jsonl's; of records with one key, the last)."""
  records = list({r.get("key", i): r for i, r in enumerate(records)}.values())
  lines = []
  first = next((r for r in records if "device" in r), None)
  if first and first.get("kind") == "census":
    lines.append(f"{first['device']}, JAX {first['jax_version']}, {first['date']} "
                 f"(`{first['command']}`).\n")
  elif first:
    lines.append(f"Device {first['device']}, JAX {first['jax_version']}, {first['date']}, "
                 f"{first.get('dtype')}; random weights (cost only), the replay's acceptance "
                 "(cost at scale with a realistic acceptance).\n")
  bw = next((r["gbps"] for r in records if r.get("kind") == "bandwidth"), None)
  if bw:
    lines.append(f"Measured copy bandwidth: {bw:,.0f} GB/s.\n")
  fwd = [r for r in records if r.get("kind") == "forward" and "ms" in r]
  widths = sorted({r["num_new"] for r in fwd})
  for variant in dict.fromkeys(r["variant"] for r in fwd):
    mine = [r for r in fwd if r["variant"] == variant]
    lines.append(f"Forward ms (fraction of the HBM roofline), {variant}:\n")
    lines.append("| shape | B | " + " | ".join(f"T = {t}" for t in widths) + " |")
    lines.append("|---|---|" + "---|" * len(widths))
    for shape in dict.fromkeys(r["shape"] for r in mine):
      for b in sorted({r["batch"] for r in mine if r["shape"] == shape}):
        cells = {r["num_new"]: r for r in mine if (r["shape"], r["batch"]) == (shape, b)}
        row = []
        for t in widths:
          cell = cells.get(t)
          fraction = cell and cell.get("hbm_fraction")
          row.append("" if cell is None else f"{cell['ms']:.2f}"
                     + (f" ({fraction:.0%})" if fraction else ""))
        lines.append(f"| {shape} | {b} | " + " | ".join(row) + " |")
    lines.append("")
  e2e = [r for r in records if r.get("kind") == "e2e" and "wall_s" in r]
  if e2e:
    lines.append("End to end (regular decoding, then BASS chains with the replay):\n")
    lines.append("| process | shape | B | regular tok/s | BASS tok/s | ratio | regular ms/token | "
                 "BASS ms/token | ratio | accepted length | BASS tokens = regular |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in (r for r in e2e if r["method"] == "bass"):
      reg = next((x for x in e2e if x["method"] == "regular"
                  and (x["variant"], x["shape"], x["batch"]) == (r["variant"], r["shape"], r["batch"])),
                 None)
      if reg is None:
        continue
      lines.append(f"| {r['variant']} | {r['shape']} | {r['batch']} | {reg['tokens_per_s']:,.0f} | "
                   f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / reg['tokens_per_s']:.2f}x | "
                   f"{reg['ms_per_token_all']:.2f} | {r['ms_per_token_all']:.2f} | "
                   f"{reg['ms_per_token_all'] / r['ms_per_token_all']:.2f}x | "
                   f"{r['mean_accepted_length']:.2f} | {r['rows_equal_regular']:.0%} |")
    lines.append("")
    same = []
    for r in (r for r in e2e if r["variant"] == "while"):
      base = next((x for x in e2e if x["variant"] == "default"
                   and (x["shape"], x["batch"], x["method"]) == (r["shape"], r["batch"], r["method"])),
                  None)
      if base is not None:
        same.append(f"| {r['shape']} | {r['batch']} | {r['method']} | {base['ms_per_step']:.2f} | "
                    f"{r['ms_per_step']:.2f} | {base['tokens_sha1'] == r['tokens_sha1']} |")
    if same:
      lines += ["Command buffers over loops and branches (`+WHILE,+CONDITIONAL`) against XLA's "
                "default:\n",
                "| shape | B | method | ms/step default | ms/step while | tokens equal |",
                "|---|---|---|---|---|---|", *same, ""]
  census = [r for r in records if r.get("kind") == "census"]
  if census:
    lines += ["Deviceless H100 census of the forward (3 layers, bf16):\n",
              "| shape | B | T | XLA options | kernels per layer | GEMMs per layer | multiply "
              "fusions per layer | launches per forward |", "|---|---|---|---|---|---|---|---|"]
    for r in census:
      lines.append(f"| {r['shape']} | {r['batch']} | {r['num_new']} | {r['variant']} | "
                   f"{r['kernels_per_layer']} | {r['gemms_per_layer']} | "
                   f"{r['multiply_reduce_per_layer']} | {r['launches_per_forward']} |")
    lines.append("")
  errors = [r for r in records if "error" in r]
  for r in errors:
    lines.append(f"- {r['key']}: {r['error']}")
  return "\n".join(lines) + "\n"


def main(argv):
  if _CHILD.value == "census":  # before JAX starts: the deviceless set-up must come first
    _census_child(pathlib.Path(_RESULTS.value))
    return
  _io.init_script()
  draft_len = _DRAFT_LEN.value
  if draft_len != "goodput" and not (draft_len.isdigit() and int(draft_len) >= 1):
    raise _io.Refusal(f"--draft_len must be an int >= 1 or 'goodput', got {_DRAFT_LEN.value!r}")
  if _ACCEPTANCE.value:
    try:
      rates = [float(a) for a in _ACCEPTANCE.value]
    except ValueError:
      rates = [-1.0]
    if not all(0 <= a <= 1 for a in rates):
      raise _io.Refusal(f"--acceptance must be rates in [0, 1], got {','.join(_ACCEPTANCE.value)}")
  unknown = set(_PARTS.value) - {"forward", "e2e", "command_buffers", "xla_defaults"}
  if unknown:
    raise _io.Refusal(f"--parts: unknown {sorted(unknown)}; choose from forward, e2e, "
                      "command_buffers, xla_defaults")
  from experiments import _shapes  # pylint: disable=g-import-not-at-top

  for shape in _SHAPES.value:
    try:
      _shapes.shape_config(shape)
    except ValueError as e:
      raise _io.Refusal(f"--shapes: {e}") from e
  run_dir = _io.run_directory(_RESULTS.value, "bench_scale")
  run_dir.mkdir(parents=True, exist_ok=True)
  jsonl = run_dir / "bench_scale.jsonl"
  if _CHILD.value:
    _child(_CHILD.value, run_dir, _DEADLINE.value or time.time() + _BUDGET.value)
    return
  if jsonl.exists() and not _RESUME.value:
    raise _io.Refusal(f"{jsonl} exists; pass --resume to add to it, or another --results_dir")
  del argv  # absl's leftovers; the children get this command line's own flags
  passed = [a for a in sys.argv[1:] if not a.startswith(("--results_dir", "--resume", "--child",
                                                         "--deadline", "--census"))]
  if _CENSUS.value:
    if not (_deviceless.DEFAULT_PLUGIN / "jax_plugins").is_dir():
      raise _io.Refusal(f"--census needs JAX's CUDA plugin in {_deviceless.DEFAULT_PLUGIN}: run "
                        "`make aot-plugin` first")
    done = subprocess.run([sys.executable, "-m", "experiments.benchmarks.bench_scale", *passed,
                           "--child=census", f"--results_dir={run_dir}"], check=False)
    if done.returncode:
      print(f"bench_scale: the census process failed (exit {done.returncode}; its error is above)",
            file=sys.stderr)
  else:
    _run_children(run_dir, passed)
  _report(run_dir)
  print((run_dir / "bench_scale.md").read_text())
  print(f"bench_scale: results in {run_dir}")


_io.require_positive_ints("batch_sizes")
_io.require_positive_ints("num_new")
_io.require_positive_ints("while_batch_sizes")

if __name__ == "__main__":
  _io.run(main)
