r"""A published model shape, end to end: a random checkpoint written once, loaded, decoded regular and BASS.

    python -m experiments.benchmarks.bench_model_size --shape=llama-3.2-1b --dtype=float32
    python -m experiments.benchmarks.bench_model_size --shape=llama-3.2-1b --dtype=bfloat16   # the GPU's

``--shape`` names a ``config.json`` of :data:`SHAPES` (Llama-3.2-1B's as published: 16 layers, GQA
32/8, head 64, 128256 tokens, tied embeddings, ``llama3`` rotary scaling). The first run writes a
checkpoint of that shape with random weights into ``--checkpoint_dir/<shape>/`` (sharded safetensors
with an index, as a real checkpoint) and a one-layer draft of the same shape beside it
(``<shape>-draft/``); later runs reuse both (a ``bench_model_size.json`` marker in each says what
wrote it; a directory with another or no marker is refused, never overwritten). Both are loaded with
``bass_jax.load_model(dir, dtype=--dtype)``, and ``bass_jax.generate`` decodes ``--batch_sizes`` rows
of distinct random prompts of ``--prompt_len`` tokens, greedy, with no stop ids (every row runs
``--max_new_tokens``), regular decoding and BASS (``--draft_len`` drafts a step). Each setting is
called once to compile, then ``--repeats`` more times, timed.

Printed (a Markdown table) and written to ``bench_model_size_<shape>_<dtype>.json`` in a fresh
``outputs/bench_model_size-<time>/`` (or ``--results_dir``): parameters and their bytes (target, draft),
load time, the KV-cache bytes each decode allocates (target and draft caches, every row of the batch
bucket, every slot), the process's peak resident memory (``getrusage`` maxrss: after the loads and at
the end), the first call's compile time, time to first token (prefill and first step), and the steady
step: ms per decode step (the prefill and the first step excluded: ``(wall - first token) / (steps -
1)``; the median and the fastest of the timed calls, the fastest being the least disturbed on a shared
machine), target forwards per step, tokens per step per row, ms per generated token, and for BASS the
accepted drafts per step; on a GPU also the allocator's peak (``Device.memory_stats``). The draft is
random, so its acceptance means nothing: the point is memory and step cost. The machine's load
average at the start and the end is recorded.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

from experiments import _decode_flags
from experiments import _io

# config.json of each shape (transformers' field names), as LlamaConfig.from_hf_config and
# transformers' LlamaConfig read it.
SHAPES = {
    # Llama-3.2-1B's published config.json (meta-llama/Llama-3.2-1B). The base model's names one stop
    # id, 128001 (<|end_of_text|>); the Instruct model's lists [128001, 128008, 128009] (<|eom_id|>,
    # <|eot_id|> too), taken here. The decode passes eos_token_id=() whatever they are.
    "llama-3.2-1b": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, initializer_range=0.02,
        bos_token_id=128000, eos_token_id=[128001, 128008, 128009]),
    # The test suite's: the same structure (GQA, tied, llama3 rotary), small enough for seconds.
    "tiny": dict(
        model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, initializer_range=0.02,
        bos_token_id=1, eos_token_id=[2, 3]),
}
METHODS = ("regular", "bass")
MARKER = "bench_model_size.json"  # what wrote a checkpoint directory (shape, layers, seed, std)

_SHAPE = flags.DEFINE_enum("shape", "llama-3.2-1b", list(SHAPES), "Model shape (SHAPES).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter and compute "
                           "dtype of both models (f32 is the fast one on a CPU; the GPU runs bf16).")
_CHECKPOINT_DIR = flags.DEFINE_string(
    "checkpoint_dir", "outputs/bench_model_size_checkpoints", "Where the random checkpoints "
    "<shape>/ and <shape>-draft/ are written once and then reused.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "4"], "Batch sizes (distinct random prompts).")
_METHODS = flags.DEFINE_list("methods", list(METHODS), "Decodes: regular, bass.")
_MAX_NEW = _decode_flags.define(max_new_tokens=16)["max_new_tokens"]  # per row, end to end
flags.register_validator("max_new_tokens", lambda v: v >= 2, message="--max_new_tokens must be at "
                         "least 2: the steady step time leaves the first step out")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Tokens per random prompt.", lower_bound=1)
_DRAFT_LEN = flags.DEFINE_integer("draft_len", 4, "BASS's fixed draft length.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls after the compiling one (median).",
                                lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random weights (torch) and prompts (numpy).",
                             lower_bound=0)
_INIT_STD = flags.DEFINE_float("init_std", 0.02, "Std of the random weights (transformers' "
                               "initializer_range; norms stay 1): small, so logits are not degenerate.",
                               lower_bound=0.0)
_SHARD = flags.DEFINE_string("max_shard_size", "1GB", "save_pretrained's shard size (the 1B target "
                             "in bf16, 2.5 GB, becomes 3 shards and an index).")
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_model_size_<shape>_"
                                   "<dtype>.json (default: a fresh outputs/bench_model_size-<time>/).")
_io.require_positive_ints("batch_sizes")
flags.register_validator("methods", lambda v: bool(v) and set(v) <= set(METHODS),
                         message=f"--methods must list some of {', '.join(METHODS)}")

NOTE = ("The draft is random, so its acceptance means nothing: the point is memory and step cost.")


# -- the checkpoints ----------------------------------------------------------------------------------


def shape_fields(shape: str, num_layers: int | None = None) -> dict:
  """``config.json``'s fields of ``shape``, with ``num_layers`` decoder layers if given."""
  fields = json.loads(json.dumps(SHAPES[shape]))
  if num_layers is not None:
    fields["num_hidden_layers"] = num_layers
  return fields


def write_checkpoint(fields: dict, path: str, seed: int, std: float, max_shard_size: str) -> None:
  """Writes a random ``LlamaForCausalLM`` of ``fields`` to ``path`` with ``save_pretrained``.

  Why transformers and not ``bass_jax.init_params`` + ``bass_jax.save_model``: peak memory. The model
  is built in bfloat16, as the published checkpoint is stored (2.3 GiB for Llama-3.2-1B), and
  ``save_pretrained`` writes it shard by shard. ``save_model`` writes a family's safetensors file in
  f32 (its numpy writer has no bfloat16) from a converted copy of every tensor, serialized whole into
  one file, after a JAX init that draws in f32. Measured on this shape cut to 4 layers (0.94 GiB of
  bf16 weights; 2-core CPU, 2026-11-27): 1.8 GiB peak for this writer against 5.0 GiB for
  ``init_params(bfloat16)`` + ``save_model``, so about 4 GiB against 11 GiB for the whole 1B model.
  The benchmark process loads either to ``--dtype`` (bf16 to f32 is exact). Run in a child process
  (:func:`ensure_checkpoints`), so that this peak is not the benchmark's.

  The directory is written under a temporary sibling and renamed when complete, so a killed write is
  never reused.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  transformers.utils.logging.disable_progress_bar()
  path = pathlib.Path(path)
  # A copy: transformers writes rope_theta into the rope_scaling dict it is given.
  config = transformers.LlamaConfig(**json.loads(json.dumps(dict(fields, initializer_range=std))))
  torch.manual_seed(seed)
  with torch.no_grad():
    model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)  # pylint: disable=protected-access
  partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
  shutil.rmtree(partial, ignore_errors=True)
  model.save_pretrained(str(partial), max_shard_size=max_shard_size)
  (partial / MARKER).write_text(json.dumps(marker(fields, seed, std), indent=2) + "\n")
  partial.rename(path)


def marker(fields: dict, seed: int, std: float) -> dict:
  """What a checkpoint directory written by :func:`write_checkpoint` records about itself."""
  return {"written_by": "experiments.benchmarks.bench_model_size", "config": fields, "seed": seed,
          "init_std": std, "stored_dtype": "bfloat16"}


def reusable(path: pathlib.Path, fields: dict, seed: int, std: float) -> bool:
  """Whether ``path`` holds the checkpoint :func:`write_checkpoint` writes for these settings (False:
  it does not exist).

  Raises:
    _io.Refusal: ``path`` exists with another marker or none: it is never overwritten.
  """
  if not path.exists():
    return False
  try:
    have = json.loads((path / MARKER).read_text())
  except (OSError, ValueError):
    have = None
  if have != marker(fields, seed, std):
    raise _io.Refusal(f"{path} exists but was not written by this script with these settings "
                      f"({MARKER} {'differs' if have else 'missing'}); remove it or give another "
                      "--checkpoint_dir")
  return True


def write_checkpoints(jobs: list[list], max_shard_size: str) -> None:
  """The child process's work: :func:`write_checkpoint` for each ``[fields, path, seed, std]``, then
  its own peak resident memory as one JSON line on stdout."""
  for fields, path, seed, std in jobs:
    write_checkpoint(fields, path, seed, std, max_shard_size)
  print(json.dumps({"peak_rss_bytes": peak_rss_bytes()}))


def ensure_checkpoints(wanted: dict[str, tuple[pathlib.Path, dict, int, float]]) -> dict:
  """Reuses each checkpoint ``name -> (path, fields, seed, std)`` that :func:`reusable` accepts and
  writes the others in one child process.

  Returns:
    ``{name: {"path", "written"}, "writer": {"seconds", "peak_rss_bytes"} or None}``.

  Raises:
    _io.Refusal: as :func:`reusable`, or the writer failed (its last line of stderr).
  """
  out = {name: {"path": str(path), "written": not reusable(path, fields, seed, std)}
         for name, (path, fields, seed, std) in wanted.items()}
  jobs = [[fields, str(path), seed, std] for name, (path, fields, seed, std) in wanted.items()
          if out[name]["written"]]
  out["writer"] = None
  if not jobs:
    return out
  for _, path, _, _ in jobs:
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  repo = pathlib.Path(__file__).resolve().parents[2]
  code = ("import json, sys; from experiments.benchmarks import bench_model_size as b; "
          "b.write_checkpoints(json.loads(sys.argv[1]), sys.argv[2])")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo),
                                                                   os.environ.get("PYTHONPATH")])))
  print(f"[bench_model_size] writing random checkpoint(s) {', '.join(j[1] for j in jobs)}", flush=True)
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-c", code, json.dumps(jobs), _SHARD.value], env=env,
                        capture_output=True, text=True, check=False)
  if done.returncode:
    last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    raise _io.Refusal(f"writing the random checkpoint(s) failed: {last}")
  out["writer"] = {"seconds": round(time.perf_counter() - start, 1),
                   **json.loads(done.stdout.strip().splitlines()[-1])}
  return out


# -- memory -------------------------------------------------------------------------------------------


def peak_rss_bytes() -> int:
  """The process's peak resident memory so far (``getrusage`` maxrss, KiB on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int | None:
  """The process's resident memory now (Linux ``/proc/self/statm``; None elsewhere)."""
  try:
    pages = int(pathlib.Path("/proc/self/statm").read_text().split()[1])
  except (OSError, ValueError, IndexError):
    return None
  return pages * os.sysconf("SC_PAGE_SIZE")


def device_memory() -> dict | None:
  """The accelerator's ``bytes_in_use`` and ``peak_bytes_in_use`` (``Device.memory_stats``: a GPU's
  allocator); None on a CPU, which keeps no such statistics (its memory is the process's RSS)."""
  import jax  # pylint: disable=g-import-not-at-top

  stats = jax.devices()[0].memory_stats()
  if not stats:
    return None
  return {k: stats[k] for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}


def tree_bytes(tree) -> int:
  import jax  # pylint: disable=g-import-not-at-top

  return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def cache_bytes(config, rows: int, slots: int, dtype) -> int:
  """Bytes of the KV cache ``config.init_cache(rows, slots, dtype)`` (shapes only, nothing allocated)."""
  import jax  # pylint: disable=g-import-not-at-top

  return tree_bytes(jax.eval_shape(lambda: config.init_cache(rows, slots, dtype)))


GIB, MIB = 2**30, 2**20


# -- the benchmark ------------------------------------------------------------------------------------


def steady(stats) -> dict:
  """One timed call's steady step: the prefill and the first step (time to first token) excluded."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  first = float(np.nanmax(stats.first_token_seconds))
  step_ms = 1e3 * (stats.wall_seconds - first) / (stats.steps - 1)
  return {"wall_s": stats.wall_seconds, "first_token_ms": 1e3 * first, "ms_per_step": step_ms}


def run_setting(target, draft, prompts, method: str, *, max_new_tokens: int, draft_len: int,
                repeats: int) -> dict:
  """Compiles (first call) and times (``repeats`` calls) one decode; its row of the table."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top

  kwargs = dict(method=method, max_new_tokens=max_new_tokens, temperature=0.0, eos_token_id=())
  if method == "bass":
    kwargs["draft_len"] = draft_len
  side = draft if method == "bass" else None
  # The plan generate makes, for the cache's shape (rows of the batch bucket, slots per row).
  plan = bass_jax.prepare(target, side, prompts, bass_jax.DecodeConfig(**kwargs))
  rows, slots = plan.rows, plan.spec.cache_len
  del plan
  start = time.perf_counter()
  first = bass_jax.generate(target, side, prompts, **kwargs)
  first_call_s = time.perf_counter() - start
  timed = []
  for _ in range(repeats):
    out = bass_jax.generate(target, side, prompts, **kwargs)
    if out.stats.compiled:
      raise RuntimeError(f"{method} B={len(prompts)}: a repeated call compiled again")
    timed.append((out, steady(out.stats)))
  out, _ = timed[-1]
  s = out.stats
  if not (out.lengths == max_new_tokens).all():
    raise RuntimeError(f"{method} B={len(prompts)}: rows emitted {out.lengths.tolist()} tokens, not "
                       f"{max_new_tokens} each (no stop ids were given)")
  ms_per_step = statistics.median(t["ms_per_step"] for _, t in timed)
  fastest = min(t["ms_per_step"] for _, t in timed)  # the least disturbed call on a shared machine
  target_kv = cache_bytes(target.config, rows, slots, target.dtype)
  draft_kv = cache_bytes(draft.config, rows, slots, draft.dtype) if method == "bass" else 0
  if method == "bass":
    live = s.accepted >= 0
    accepted = float(s.accepted[live].mean())
    tokens_per_step = float(np.mean(out.lengths / s.prompt_steps))
    forwards = float(np.mean(s.verified)) / s.verify_chunk
    drafts = float(np.mean(s.draft_lens))
  else:
    accepted, tokens_per_step, forwards, drafts = None, 1.0, 1.0, 0.0
  return {
      "method": method, "batch_size": len(prompts), "batch_bucket": s.batch_bucket,
      "prompt_bucket": s.prompt_bucket, "cache_slots": slots, "target_kv_bytes": target_kv,
      "draft_kv_bytes": draft_kv, "kv_bytes": target_kv + draft_kv,
      "compile_s": first.stats.compile_seconds, "first_call_s": first_call_s,
      "steps": s.steps, "first_token_ms": statistics.median(t["first_token_ms"] for _, t in timed),
      "ms_per_step": ms_per_step, "ms_per_step_fastest": fastest,
      "ms_per_step_each": [t["ms_per_step"] for _, t in timed], "target_forwards_per_step": forwards,
      "drafts_per_step": drafts, "verify_chunk": s.verify_chunk,
      "tokens_per_step": tokens_per_step, "ms_per_token": ms_per_step / tokens_per_step,
      "ms_per_token_fastest": fastest / tokens_per_step,
      "accepted_per_step": accepted, "wall_s": [t["wall_s"] for _, t in timed],
      "attention_impl": s.attention_impl, "peak_rss_bytes": peak_rss_bytes(),
      # Greedy, the same program: the same tokens (up to a GPU's float non-determinism).
      "repeat_tokens_equal": all(np.array_equal(o.tokens, first.tokens) for o, _ in timed),
      "device_memory": device_memory(),
  }


def _load_average() -> list[float] | None:
  """The host's 1, 5 and 15 minute load averages (a shared machine's other work shows here)."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return None


def _fmt_load(load: list[float] | None) -> str:
  return "unknown" if load is None else " / ".join(f"{x:.2f}" for x in load)


def _ms(value: float) -> str:
  """Milliseconds to three significant figures (a tiny model's steps take microseconds)."""
  return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(result: dict) -> str:
  """The result as Markdown: the models, memory, then one row per decode."""
  t, d = result["target"], result["draft"]
  w, m = result["checkpoints"]["writer"], result["device_memory"]
  device = ("" if not m or "peak_bytes_in_use" not in m else
            f" Device memory (the allocator's peak): {m['peak_bytes_in_use'] / GIB:.2f} GiB.")
  writer = ("" if w is None else f" The checkpoints were written by a child process this run "
            f"({w['seconds']:.0f} s, peak {w['peak_rss_bytes'] / GIB:.2f} GiB, not counted above).")
  lines = [
      f"{result['shape']} (random weights), {result['dtype']}; {result['prompt_len']}-token random "
      f"prompts, {result['max_new_tokens']} new tokens a row, greedy, no stop ids; BASS draft_len "
      f"{result['draft_len']}; the median (and the fastest) of {result['repeats']} timed calls after "
      "the compiling one. "
      f"{result['device']}, JAX {result['jax_version']}, {result['date']}; load average "
      f"{_fmt_load(result['load_average_at_start'])} at the start, "
      f"{_fmt_load(result['load_average_at_end'])} at the end.", "",
      "| model | layers | parameters | bytes | load s |", "|---|---|---|---|---|",
      f"| target | {t['layers']} | {t['num_params']:,} | {t['param_bytes'] / GIB:.2f} GiB | "
      f"{t['load_s']:.1f} |",
      f"| draft | {d['layers']} | {d['num_params']:,} | {d['param_bytes'] / GIB:.2f} GiB | "
      f"{d['load_s']:.1f} |", "",
      f"Peak resident memory (maxrss): {result['peak_rss_after_load_bytes'] / GIB:.2f} GiB after "
      f"both loads (resident then {result['rss_after_load_bytes'] / GIB:.2f} GiB), "
      f"{result['peak_rss_bytes'] / GIB:.2f} GiB at the end." + writer + device, "",
      "| B | method | KV cache (rows x slots) | compile s | first token ms | ms / step (fastest) | "
      "target fwd / step | tokens / step / row | ms / token (fastest) | accepted / step |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["runs"]:
    acc = "-" if r["accepted_per_step"] is None else f"{r['accepted_per_step']:.2f}"
    lines.append(
        f"| {r['batch_size']} | {r['method']} | {r['kv_bytes'] / MIB:.1f} MiB ({r['batch_bucket']} x "
        f"{r['cache_slots']}) | {r['compile_s']:.1f} | {_ms(r['first_token_ms'])} | "
        f"{_ms(r['ms_per_step'])} ({_ms(r['ms_per_step_fastest'])}) | "
        f"{r['target_forwards_per_step']:.2f} | {r['tokens_per_step']:.2f} | "
        f"{_ms(r['ms_per_token'])} ({_ms(r['ms_per_token_fastest'])}) | {acc} |")
  lines += ["", NOTE + " Steady times exclude the prefill and the first step (time to first token); "
            "a BASS step is its drafts and its verification."]
  return "\n".join(lines)


def main(argv):
  del argv  # _io.run refuses arguments that are not flags
  _io.init_script()
  shape, dtype = _SHAPE.value, _DTYPE.value
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_model_size")
    path = _io.check_output_file(run_dir / f"bench_model_size_{shape}_{dtype}.json", flag="results_dir")
    _io.check_output_dir(_CHECKPOINT_DIR.value, flag="checkpoint_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  root = pathlib.Path(_CHECKPOINT_DIR.value)
  checkpoints = ensure_checkpoints({
      "target": (root / shape, shape_fields(shape), _SEED.value, _INIT_STD.value),
      "draft": (root / f"{shape}-draft", shape_fields(shape, 1), _SEED.value + 1, _INIT_STD.value)})

  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top

  result = {"experiment": "bench_model_size", **reproduce.machine(), "cpu_count": os.cpu_count(),
            "shape": shape, "dtype": dtype,
            "config": SHAPES[shape], "prompt_len": _PROMPT_LEN.value,
            "max_new_tokens": _MAX_NEW.value, "draft_len": _DRAFT_LEN.value,
            "repeats": _REPEATS.value, "seed": _SEED.value, "init_std": _INIT_STD.value,
            "checkpoints": checkpoints, "note": NOTE, "load_average_at_start": _load_average(),
            "runs": []}
  models = {}
  for name in ("target", "draft"):
    start = time.perf_counter()
    model = bass_jax.load_model(checkpoints[name]["path"], dtype=dtype, tokenizer=False)
    load_s = time.perf_counter() - start
    expected = bass_jax.LlamaConfig.from_hf_config(
        shape_fields(shape, None if name == "target" else 1))
    if model.config != expected:
      raise RuntimeError(f"{name}: the loaded config {model.config} is not the shape's {expected}")
    models[name] = model
    result[name] = {"layers": model.config.num_hidden_layers,
                    "num_params": model.config.num_params(),
                    "param_bytes": tree_bytes(model.params), "itemsize": model.dtype.itemsize,
                    "load_s": load_s, "rope_type": model.config.rotary.rope_type}
    print(f"[bench_model_size] {name}: {result[name]['num_params']:,} parameters, "
          f"{result[name]['param_bytes'] / GIB:.2f} GiB, loaded in {load_s:.1f} s", flush=True)
  target, draft = models["target"], models["draft"]
  result["rss_after_load_bytes"] = rss_bytes()
  result["peak_rss_after_load_bytes"] = peak_rss_bytes()
  result["device_memory_after_load"] = device_memory()
  rng = np.random.default_rng(_SEED.value)
  for batch in [int(b) for b in _BATCHES.value]:
    prompts = rng.integers(0, target.config.vocab_size, (batch, _PROMPT_LEN.value)).tolist()
    if len({tuple(p) for p in prompts}) < batch:  # greedy rows differ only where prompts do
      raise RuntimeError(f"B={batch}: two random prompts are equal; choose another --seed")
    for method in _METHODS.value:
      row = run_setting(target, draft, prompts, method, max_new_tokens=_MAX_NEW.value,
                        draft_len=_DRAFT_LEN.value, repeats=_REPEATS.value)
      result["runs"].append(row)
      result["peak_rss_bytes"] = peak_rss_bytes()
      _io.write_json_atomic(path, {**result, "complete": False})
      print(f"[bench_model_size] B={batch} {method}: compile {row['compile_s']:.1f} s, "
            f"{_ms(row['ms_per_step'])} ms/step, {_ms(row['ms_per_token'])} ms/token", flush=True)
  result["peak_rss_bytes"] = peak_rss_bytes()
  result["device_memory"] = device_memory()
  result["load_average_at_end"] = _load_average()
  result["table"] = table(result)
  print(result["table"], flush=True)
  _io.write_json_atomic(path, {**result, "complete": True})
  print(f"wrote {path}", flush=True)


if __name__ == "__main__":
  _io.run(main)
