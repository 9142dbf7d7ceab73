r"""Times one forward pass of the project's model against what its arithmetic and memory traffic cost.

    python -m experiments.benchmarks.bench_forward                  # SmolLM2 target and the shipped draft
    python -m experiments.benchmarks.bench_forward --quick          # a few shapes, a smoke run

For decode (T = 1) and verification (T = 5, 9, 17) shapes at every batch size B and cache length S, four
forwards of the *same weights* run interleaved in one process, each call timed apart and the median
taken over --repeats rounds:

* **project**: the model core exactly as `generate` runs it (`config.make_module().apply` under `jit`,
  the cache donated and returned);
* **scanned**: the same with the layers scanned (`load_model(scan_layers=True)`: weights stacked
  `[L, ...]`, one stacked cache, one layer compiled and run in a `lax.scan`; `--scanned`);
* **minimal**: a plain-jnp forward written here with no framework around it: layers unrolled, one
  weight array and one K/V cache array per layer, the new K/V scattered into the cache, the same
  end-aligned causal attention. It is the reference for "no overhead";
* **matmuls**: the weight matrix products alone (every projection, MLP and the LM head over B x T
  rows): the floor this machine sets for these weights;
* **torch**: transformers' PyTorch forward of the same model over a cache of the same length
  (`--torch`; f32 on a CPU, the run's dtype on a CUDA GPU).

**Random weights of published shapes** (``--models=random:llama-3.1-8b``, ``experiments._shapes.SHAPES``;
append ``:layers=1`` for a draft of EAGLE's shape, one decoder layer and the target's head) set costs, never
acceptance: the model-size sweep of the GPU campaign (``experiments.benchmarks.bench_gpu``, part 2) times them
with ``--project_only`` and prints, for each target and its one-layer draft, the accepted length per
step at which a BASS step of l drafts breaks even with regular decoding (cost only: combine it with an
accepted length measured on real weights).

Every row of the cache holds S - T valid entries before the call (the longest a verification of T
tokens can meet), so attention reads S slots per query. Ratios are the point: `project / minimal` is
the framework's overhead. The table goes to stdout and, with every time, to
`bench_forward_<setting>.json` in a fresh `outputs/bench_forward-<time>/` (or `--results_dir`),
rewritten after every shape.
"""

from __future__ import annotations

import datetime
import functools
import platform
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments import _io
from experiments._shapes import random_model

_MODELS = flags.DEFINE_list("models", ["smollm2-135m-instruct", "smollm2-135m-draft"],
                            "Model specs to time (Llama family).")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "4", "8", "16"], "Batch sizes B.")
_NUM_NEW = flags.DEFINE_list("num_new", ["1", "5", "9", "17"], "New tokens per row T (1 = decode).")
_CACHE = flags.DEFINE_list("cache_lens", ["256", "2048"], "Cache slots S.")
_REPEATS = flags.DEFINE_integer("repeats", 30, "Timed rounds per shape (median).", lower_bound=1)
_TORCH = flags.DEFINE_bool("torch", True, "Also time transformers' PyTorch forward.")
_SCANNED = flags.DEFINE_bool("scanned", True, "Also time the project's forward with scanned layers.")
_QUICK = flags.DEFINE_bool("quick", False, "B = 1, 4; T = 1, 5; S = 256; 5 rounds (smoke run).")
_DTYPES = flags.DEFINE_list("dtypes", ["float32"], "Parameter/compute dtypes, each a full table "
                            "(float32, bfloat16).")
_RESULTS_DIR = flags.DEFINE_string("results_dir", None, "Directory for bench_forward_<setting>.json "
                                   "(default: a fresh outputs/bench_forward-<time>/).")
_SETTING = flags.DEFINE_string("setting", "full", "Name of the shape set (the file suffix).")
_PROJECT_ONLY = flags.DEFINE_bool("project_only", False, "Time the project's forward alone (no "
                                  "minimal forward, no matmul floor): the size sweep.")


def _one_layer(model: str) -> str:
  """``random:<shape>[:options]`` with its ``layers=N`` option (if any) replaced by ``layers=1``, the
  other options (``vocab=V``) kept: the 1-layer draft of that shape."""
  parts = model.split(":")
  return ":".join(parts[:2] + ["layers=1"] + [p for p in parts[2:] if not p.startswith("layers=")])


def break_even(rows: list[dict]) -> list[dict]:
  """For each ``random:<shape>[:layers=N][:vocab=V]`` target timed with its 1-layer draft (the same
  spec with ``layers=1``): at each batch size, dtype and cache length, and each l with a
  verification of T = l + 1 measured, the tokens a BASS step must emit per row to cost what regular
  decoding does for them: ``(l * draft(T=1) + target(T=l+1)) / target(T=1)``. Costs of random
  weights, not acceptance."""
  ms = {(r["model"], r["dtype"], r["batch_size"], r["num_new"], r["cache_len"]): r["project_ms"]
        for r in rows}
  out = []
  for (model, dtype, batch, num_new, slots), verify in sorted(ms.items()):
    if not model.startswith("random:") or "layers=1" in model.split(":")[2:] or num_new < 2:
      continue
    plain = ms.get((model, dtype, batch, 1, slots))
    draft = ms.get((_one_layer(model), dtype, batch, 1, slots))
    if plain is None or draft is None:
      continue
    l = num_new - 1
    out.append({"model": model, "dtype": dtype, "batch_size": batch, "cache_len": slots,
                "draft_len": l, "plain_ms": plain, "verify_ms": verify, "draft_ms": draft,
                "break_even_tokens_per_step": (l * draft + verify) / plain})
  return out


# -- the minimal forward: plain jnp, unrolled, one array per layer --------------------------------------


def _split_layers(params):
  """Flax Llama parameters -> (embedding, final norm, LM head, list of per-layer dicts), as plain
  arrays (copies, so that the minimal forward shares no buffer with the project's)."""
  num_layers = sum(1 for k in params if k.startswith("layers_"))
  per_layer = [jax.tree_util.tree_map(jnp.array, params[f"layers_{i}"]) for i in range(num_layers)]
  embed = jnp.array(params["embed_tokens"]["embedding"])
  # The LM head in the project's own layout: a kernel [D, V], or the tied embedding [V, D] itself.
  head = jnp.array(params["lm_head"]) if "lm_head" in params else embed
  return embed, params["norm"]["scale"], head, per_layer


def _head(x, head, tied: bool):
  return jnp.einsum("btd,vd->btv" if tied else "btd,dv->btv", x, head,
                    preferred_element_type=jnp.float32)


def _rms(x, scale, eps):
  x32 = x.astype(jnp.float32)
  return scale * (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)).astype(x.dtype)


def _rotary(x, positions, theta):
  head_dim = x.shape[-1]
  inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  ang = positions.astype(jnp.float32)[..., None] * inv
  ang = jnp.concatenate([ang, ang], -1)[:, :, None, :]
  half = head_dim // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
  return x * jnp.cos(ang).astype(x.dtype) + rotated * jnp.sin(ang).astype(x.dtype)


def minimal_forward(cfg, weights, tokens, ks, vs, lengths):
  """Llama forward, ``tokens: i32[B, T]`` at positions ``lengths[b] + t``, caches ``[B, K, S, H]``
  per layer; returns ``(logits f32[B, T, V], ks, vs)``."""
  embed, norm, head, layers = weights
  batch, num_new = tokens.shape
  n, k_heads, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
  group = n // k_heads
  pos = lengths[:, None] + jnp.arange(num_new)
  rows = jnp.arange(batch)[:, None]
  slots = jnp.arange(ks[0].shape[2])
  visible = slots[None, None, :] <= pos[:, :, None]  # [B, T, S]
  x = embed[tokens]
  new_ks, new_vs = [], []
  for p, k_cache, v_cache in zip(layers, ks, vs):
    a = p["self_attn"]
    y = _rms(x, p["input_layernorm"]["scale"], cfg.rms_norm_eps)
    q = _rotary((y @ a["q_proj"]["kernel"]).reshape(batch, num_new, n, h), pos, cfg.rope_theta)
    k = _rotary((y @ a["k_proj"]["kernel"]).reshape(batch, num_new, k_heads, h), pos, cfg.rope_theta)
    v = (y @ a["v_proj"]["kernel"]).reshape(batch, num_new, k_heads, h)
    k_cache = k_cache.at[rows, :, pos].set(k)
    v_cache = v_cache.at[rows, :, pos].set(v)
    qg = q.reshape(batch, num_new, k_heads, group, h) * h**-0.5
    s = jnp.einsum("btkgh,bksh->bkgts", qg, k_cache)
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    o = jnp.einsum("bkgts,bksh->btkgh", jax.nn.softmax(s, -1), v_cache)
    x = x + o.reshape(batch, num_new, n * h) @ a["o_proj"]["kernel"]
    m = p["mlp"]
    y = _rms(x, p["post_attention_layernorm"]["scale"], cfg.rms_norm_eps)
    x = x + (jax.nn.silu(y @ m["gate_proj"]["kernel"]) * (y @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
    new_ks.append(k_cache)
    new_vs.append(v_cache)
  logits = _head(_rms(x, norm, cfg.rms_norm_eps), head, cfg.tie_word_embeddings)
  return logits, new_ks, new_vs


def matmuls_only(weights, x, tied: bool):
  """Every weight matrix product of a forward over ``x: [B * T, D]``, and nothing else."""
  _, _, head, layers = weights
  for p in layers:
    a, m = p["self_attn"], p["mlp"]
    q = x @ a["q_proj"]["kernel"]
    k, v = x @ a["k_proj"]["kernel"], x @ a["v_proj"]["kernel"]
    gate, up = x @ m["gate_proj"]["kernel"], x @ m["up_proj"]["kernel"]
    x = x + q @ a["o_proj"]["kernel"] + (gate * up) @ m["down_proj"]["kernel"] + 0 * (k + v).sum()
  return _head(x[None], head, tied)


# -- timing -------------------------------------------------------------------------------------------


def _torch_model(model, tmp):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top

  bass_jax.save_model(bass_jax.Model(model.config, model.params), tmp)
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=_torch_dtype(model.dtype))
  return hf.to(_torch_device()).eval()


def _torch_device() -> str:
  import torch  # pylint: disable=g-import-not-at-top

  return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(dtype):
  from bass_jax import dtypes  # pylint: disable=g-import-not-at-top

  return dtypes.torch_dtype(dtype)


def _bench_model(spec: str, dtype: str, shapes, repeats: int, use_torch: bool, scanned: bool,
                 log, project_only: bool = False) -> list[dict]:
  import bass_jax  # pylint: disable=g-import-not-at-top

  if spec.startswith("random:"):
    model = random_model(spec, dtype)
  else:
    model = bass_jax.load_model(spec, tokenizer=False, dtype=dtype, scan_layers=False)
  cfg = model.config
  weights = _split_layers(model.params)
  scanned_params = model.with_scanned_layers(True).params if scanned else None

  def forward(scan_layers):
    module = cfg.make_module(scan_layers=scan_layers)

    # The caches are donated and the returned ones fed back, so each forward updates its cache in
    # place as inside the decode loop (a non-donated cache would be copied whole every call).
    @functools.partial(jax.jit, donate_argnums=2)
    def run(params, tokens, cache):
      logits, new_cache = module.apply({"params": params}, tokens, cache)
      # Restore the lengths inside the program (no extra dispatch per call).
      return logits, new_cache.with_lengths(cache.lengths)

    return run

  project, project_scanned = forward(False), forward(True)

  minimal = jax.jit(lambda w, t, ks, vs, lengths: minimal_forward(cfg, w, t, ks, vs, lengths),
                    donate_argnums=(2, 3))
  matmuls = jax.jit(functools.partial(matmuls_only, tied=cfg.tie_word_embeddings))
  hf = None
  if use_torch:
    import torch  # pylint: disable=g-import-not-at-top

    hf = _torch_model(model, tempfile.mkdtemp(prefix="bench_forward_"))
  rows = []
  rng = np.random.default_rng(0)
  for batch, num_new, slots in shapes:
    filled = slots - num_new
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, num_new)), jnp.int32)
    lengths = jnp.full((batch,), filled, jnp.int32)
    cache = cfg.init_cache(batch, slots, model.dtype)
    kv = jnp.asarray(rng.normal(size=cache.k[0].shape), model.dtype)
    cache = cache.replace(k=tuple(k + kv for k in cache.k), v=tuple(v - kv for v in cache.v),
                          lengths=lengths + 0)
    ks = [jnp.array(k) for k in cache.k]
    vs = [jnp.array(v) for v in cache.v]
    x = jnp.asarray(rng.normal(size=(batch * num_new, cfg.hidden_size)), model.dtype)
    state = {"cache": cache, "ks": ks, "vs": vs}
    if scanned:
      state["stacked"] = cache.replace(k=jnp.stack(cache.k), v=jnp.stack(cache.v),
                                       lengths=lengths + 0)  # its own buffers: both are donated

    def project_call():
      logits, state["cache"] = project(model.params, tokens, state["cache"])
      return logits

    def scanned_call():
      logits, state["stacked"] = project_scanned(scanned_params, tokens, state["stacked"])
      return logits

    def minimal_call():
      logits, state["ks"], state["vs"] = minimal(weights, tokens, state["ks"], state["vs"], lengths)
      return logits

    calls = {"project": project_call}
    if not project_only:
      calls.update(minimal=minimal_call, matmuls=lambda: matmuls(weights, x))
    if scanned:
      calls["scanned"] = scanned_call
    if hf is not None:
      past = _torch_cache(hf, cfg, batch, filled, rng)
      ids = torch.from_numpy(np.asarray(tokens, np.int64)).to(_torch_device())

      def torch_call():
        with torch.no_grad():
          hf(ids, past_key_values=past, use_cache=True)
        past.crop(-num_new)  # drop the T entries the call appended
        if _torch_device() == "cuda":
          torch.cuda.synchronize()

      calls["torch"] = torch_call
    times = {name: [] for name in calls}
    for name, call in calls.items():  # compile and warm up
      jax.block_until_ready(call())
    for _ in range(repeats):
      for name, call in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(call())
        times[name].append(time.perf_counter() - start)
    row = {"model": spec, "dtype": dtype, "batch_size": batch, "num_new": num_new, "cache_len": slots,
           **{f"{name}_ms": 1000 * statistics.median(t) for name, t in times.items()}}
    rows.append(row)
    log(row)
  return rows


def _torch_cache(hf, cfg, batch, length, rng):
  """A transformers ``DynamicCache`` holding ``length`` random entries per layer."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  cache = transformers.DynamicCache(config=hf.config)
  shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
  for layer in range(cfg.num_layers):
    k = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
    k = k.to(device=_torch_device(), dtype=next(hf.parameters()).dtype)
    cache.update(k, -k, layer)
  return cache


_COLUMNS = ("project", "scanned", "minimal", "matmuls", "torch")


def _format_row(row) -> str:
  cells = [f"{row.get(f'{c}_ms', float('nan')):.2f}" for c in _COLUMNS]
  ratio = row["project_ms"] / row.get("minimal_ms", float("nan"))
  return (f"| {row['model']} | {row['dtype']} | {row['batch_size']} x {row['num_new']} | "
          f"{row['cache_len']} | "
          + " | ".join(cells) + f" | {ratio:.2f} |")


def _torch_usable(dtype: str) -> bool:
  """transformers' forward is timed in f32 on a CPU (its bf16 matmuls there are no reference) and in
  either dtype on a CUDA GPU."""
  import torch  # pylint: disable=g-import-not-at-top

  return dtype == "float32" or torch.cuda.is_available()


def main(argv):
  del argv
  _io.init_script()
  try:
    run_dir = _io.run_directory(_RESULTS_DIR.value, "bench_forward")
    path = _io.check_output_file(run_dir / f"bench_forward_{_SETTING.value}.json", flag="results_dir")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e
  batches = [1, 4] if _QUICK.value else [int(b) for b in _BATCHES.value]
  num_new = [1, 5] if _QUICK.value else [int(t) for t in _NUM_NEW.value]
  caches = [256] if _QUICK.value else [int(s) for s in _CACHE.value]
  repeats = 5 if _QUICK.value else _REPEATS.value
  shapes = [(b, t, s) for s in caches for t in num_new for b in batches]
  print("| model | dtype | B x T | cache slots | project ms | scanned ms | minimal ms | matmuls ms | "
        "torch ms | project / minimal |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  rows = []
  device = jax.devices()[0]

  def save(complete: bool, **extra):
    _io.write_json_atomic(path, {**extra,
        "experiment": "bench_forward", "setting": _SETTING.value,
        "date": datetime.date.today().isoformat(),
        "device": f"{device.platform}:{device.device_kind}", "host": platform.processor() or
        platform.machine(), "jax_version": jax.__version__, "repeats": repeats, "complete": complete,
        "rows": rows})

  def log(row):  # every finished shape is saved, so an interrupted run keeps what it measured
    rows.append(row)
    print(_format_row(row), flush=True)
    save(complete=False)

  for dtype in _DTYPES.value:
    for spec in _MODELS.value:
      _bench_model(spec, dtype, shapes, repeats, _TORCH.value and _torch_usable(dtype),
                   _SCANNED.value, log, _PROJECT_ONLY.value)
  even = break_even(rows)
  if even:
    print("\nbreak-even tokens per step (cost only, random weights): (l x draft + verify) / plain")
    print("| model | dtype | B | S | l | plain ms | verify ms | draft ms | break-even |")
    print("|---|---|---|---|---|---|---|---|---|")
    for e in even:
      print(f"| {e['model']} | {e['dtype']} | {e['batch_size']} | {e['cache_len']} | {e['draft_len']} "
            f"| {e['plain_ms']:.2f} | {e['verify_ms']:.2f} | {e['draft_ms']:.2f} | "
            f"{e['break_even_tokens_per_step']:.2f} |")
  save(complete=True, break_even=even)
  print(f"wrote {path}")


if __name__ == "__main__":
  _io.run(main)
