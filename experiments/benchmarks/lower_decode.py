r"""Lowers the whole jitted decode for a GPU on this machine and prints its census: the control flow of
one BASS step, host callbacks, kernels and the largest arrays. No GPU needed.

    python -m experiments.benchmarks.lower_decode --platform=cuda --batch_size=4 --json=outputs/census.json

The decode is the one ``bass_jax.generate`` would run for these flags (target, draft, batch,
sampling and draft length as in ``experiments.generate``), under the backend profile of
``--platform`` unless ``--profile`` says otherwise (``bass_jax.profiles``): it is traced as
for that platform (the Pallas kernels lowered natively, their cache splits sized for ``--sm_count``
SMs) and exported with ``jax.export`` (``bass_jax.sampling.generate.lower``). The prompts are
``--batch_size`` distinct random token sequences of ``--prompt_len`` tokens: only shapes matter.

What it prints (``bass_jax.tooling.hlo_census``): the nesting of every ``while`` and conditional, each marked
data-dependent (the host must read a value from the device to go on: on XLA:GPU a round trip and
the launch gap of the next body) or with its static trip count; per kind of step, the data-dependent
evaluations one step makes; host callbacks; custom calls (the Triton kernels); the largest arrays.
With ``--cache_copies`` (default) the same settings are also compiled for this machine, where XLA's
copy insertion runs, and every copy of a KV cache array is counted (with the jnp reference attention
in place of a Pallas kernel: a kernel is a custom call that reads the cache as the reference's ops
do, where the Pallas interpreter would copy its operands). The StableHLO goes to ``--hlo``; with
``--json`` the census is written as JSON, ``data_dependent_control_flow_per_step`` and
``cache_copies`` among its keys.

With ``--compile_for=h100`` (after ``make aot-plugin``) XLA also compiles regular decoding's and BASS's
decode for an H100 on this machine, without a GPU, and ``bass_jax.tooling.thunk_census`` prices one step of
each kind from the thunk sequence: the JSON's ``launch_census`` holds ``launches_per_plain_step``,
``launches_per_bass_step``, ``kernels_per_step``, ``copies_per_step`` and ``host_reads_per_step``
(every kernel), and ``graph_launches_per_*`` (after XLA groups thunks into command buffers, each one
launch; ``--command_buffers`` chooses which thunks they may hold)
(docs/gpu.md, "Launches per step", with what a deviceless compile cannot see).
"""

import dataclasses
import os
import pathlib

from absl import flags

from experiments import _decode_flags
from experiments import _deviceless
from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target: alias, .gguf, or HF dir.")
_DRAFT = _io.define_draft_flag("hybrid:smollm2-135m-eagle")
# The decode's settings (experiments._decode_flags), with this census's defaults.
_DECODE = _decode_flags.define("method", "draft_tree", "profile", batch_size=4, max_new_tokens=128,
                               temperature=0.2, top_p=0.95, draft_len="goodput")
_METHOD, _BATCH, _MAX_NEW, _TEMPERATURE, _TOP_P, _DRAFT_LEN, _DRAFT_TREE, _PROFILE = (
    _DECODE[name] for name in ("method", "batch_size", "max_new_tokens", "temperature", "top_p",
                               "draft_len", "draft_tree", "profile"))
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 100, "Tokens per prompt.", lower_bound=1)
_PLATFORM = flags.DEFINE_enum("platform", "cuda", ["cuda", "rocm", "cpu"], "Platform to lower for.")
_PROFILE_OPTIONS = flags.DEFINE_bool(
    "profile_compiler_options", True, "Compile with the profile's XLA options (the GPU profile's: "
    "without dot-strength-reduction); --noprofile_compiler_options compiles with XLA's defaults, the "
    "comparison of docs/gpu.md's census.")
_SM_COUNT = flags.DEFINE_integer("sm_count", 132, "SMs the kernels' cache splits assume (H100: "
                                 "132).", lower_bound=1)
_CACHE_COPIES = flags.DEFINE_bool("cache_copies", True, "Also compile for this machine and count "
                                  "copies of the KV caches.")
_HLO = flags.DEFINE_string("hlo", None, "Where to write the decode's StableHLO; default "
                           "outputs/lower_decode/decode_<platform>_<profile>.mlir.")
_JSON = flags.DEFINE_string("json", None, "Write the census as JSON here.")
_COMPILE_FOR = flags.DEFINE_enum(
    "compile_for", None, ["h100"], "Also compile the decode for this GPU on this machine, without one "
    "(XLA's deviceless compile, configs/gpu/<gpu>_sxm.txtpb), regular decoding and BASS, and count "
    "the launches of one step from XLA's thunk sequence (bass_jax.tooling.thunk_census).")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "The models' dtype; default: "
                           "load_model's for this machine (float32 on a CPU; a GPU loads bfloat16).")
_SCAN_LAYERS = flags.DEFINE_bool("scan_layers", None, "The target's layer layout: scanned or unrolled "
                                  "(--noscan_layers); absent: the profile's (unrolled).")
_COMMAND_BUFFERS = flags.DEFINE_string(
    "command_buffers", None, "With --compile_for: XLA's --xla_gpu_enable_command_buffer (which thunks "
    "CUDA graphs may hold; e.g. '+WHILE,+CONDITIONAL' adds loops and branches to XLA's default "
    "FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN; '' turns them off); default: XLA's.")
_AOT_PLUGIN = flags.DEFINE_string("aot_plugin", None, "Folder holding JAX's CUDA plugin, for "
                                  "--compile_for; default: the repository's .aot_plugin/ (`make "
                                  "aot-plugin`).")
flags.register_validator("top_p", lambda v: 0.0 < v <= 1.0, message="--top_p must be in (0, 1]")
_io.require_tree_shapes()

_TARGET_CONFIGS = _deviceless.TARGET_CONFIGS


def _draft_tree() -> list[str] | None:
  """The --draft_tree shapes as ``lower`` takes them: None for no tree (the flag's empty list)."""
  return _DRAFT_TREE.value or None


def _tree_lines(nodes, depth=0):
  for node in nodes:
    kind = node["kind"] + (" (data-dependent)" if node["data_dependent"]
                           else f" x{node['trip_count']}")
    step = f"  <- loop of {node['step_loop_of']}" if "step_loop_of" in node else ""
    yield f"{'  ' * depth}{kind}  {node['where']}{step}"
    yield from _tree_lines(node.get("children", []), depth + 1)


def _launch_census(target, draft, prompts, profile, dump_dir: pathlib.Path) -> dict:
  """Regular decoding's and BASS's decode compiled for ``--compile_for`` without a GPU; one step of
  each kind (an iteration of the loop that runs it, ``thunk_census.find_loop``: inner loops times
  their trip counts, a conditional's costliest branch) priced in launches and host reads. A plain
  step is regular decoding's; a BASS step the chain step's (a tree step's without chains)."""
  import jax  # pylint: disable=g-import-not-at-top

  from bass_jax.tooling import thunk_census  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import generate as generate_lib  # pylint: disable=g-import-not-at-top

  config = (_TARGET_CONFIGS / f"{_COMPILE_FOR.value}_sxm.txtpb").read_text()
  steps = {}
  for method in ("regular", "bass"):
    lowered = generate_lib.lower(
        target, draft if method == "bass" else None, prompts, platform="cuda",
        sm_count=_SM_COUNT.value, compile_on_host=False, method=method,
        max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
        draft_len=_io.draft_len_value(_DRAFT_LEN.value),
        draft_tree=_draft_tree() if method == "bass" else None, profile=profile)
    name = f"bass_jax_decode_{method}"
    exported = lowered.decode
    call = lambda *a, **k: exported.call(*a, **k)  # pylint: disable=cell-var-from-loop
    call.__name__ = name
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)
    thunk_census.compile_deviceless(call, args, kwargs, config,
                                    compiler_options=lowered.spec.xla_options)
    kinds = ("plain_step",) + (() if method == "regular"
                               else ("chain_step", *(f"tree_step_{i}" for i in range(8))))
    for after_passes in (False, True):  # every kernel; what the runtime launches (command buffers)
      dump = thunk_census.read_dump(dump_dir, name, after_passes=after_passes)
      thunks, trips = dump.thunks(), dump.trips()
      for kind in kinds:
        loop = thunk_census.find_loop(thunks, dump.optimized_hlo, kind)
        if loop is None:
          continue
        step = thunk_census.per_iteration(loop, trips)
        # Regular decoding's plain step is the BASS decode's plain step without its bookkeeping.
        label = "regular_step" if method == "regular" else kind
        if after_passes:
          if label not in steps:  # found only after the passes: nothing to add to
            continue
          if thunk_census.in_command_buffer(thunks, loop):  # the loop is a graph node: no launch
            step = thunk_census.Count()
          steps[label]["graph_launches"] = step.launches
          steps[label]["graph_host_reads"] = step.host_reads
          steps[label]["program_graph_launches"] = thunk_census.count(thunks, trips).launches
        else:
          steps[label] = {"kernels": step.kernels, "copies": step.copies, "launches": step.launches,
                         "host_reads": step.host_reads,
                         "loops_of_unknown_trip_count": step.unknown_loops,
                         "kernels_per_layer": thunk_census.kernels_per_layer(loop)}
    if ("regular_step" if method == "regular" else kinds[1]) not in steps and not any(
        k.startswith("tree_step") for k in steps):
      raise RuntimeError(f"{dump.module}: no loop of {kinds} found in its thunks")
  plain = steps["regular_step"]
  bass = steps.get("chain_step") or next(v for k, v in steps.items() if k.startswith("tree_step"))
  return {
      "compile_for": _COMPILE_FOR.value, "jax_version": jax.__version__,
      "launches_per_plain_step": plain["launches"], "launches_per_bass_step": bass["launches"],
      "bass_over_plain": round(bass["launches"] / plain["launches"], 3),
      # ``*_per_step``: of the BASS step (the plain step's are under ``steps``).
      "kernels_per_step": bass["kernels"], "copies_per_step": bass["copies"],
      # A typical decoder layer's kernels and copies in a plain step (thunk_census.kernels_per_layer).
      "kernels_per_layer_plain_step": plain["kernels_per_layer"]["median"],
      "layer_kernels_plain_step": plain["kernels_per_layer"]["example"],
      "host_reads_per_step": bass["host_reads"],
      "graph_launches_per_plain_step": plain.get("graph_launches"),
      "graph_launches_per_bass_step": bass.get("graph_launches"),
      "command_buffers": _COMMAND_BUFFERS.value, "steps": steps,
      "caveats": "deviceless compile: no autotuning (a sort is about 15 XLA kernels where a real "
                 "H100 runs one CUB sort; GEMM algorithms unchosen); a conditional counts its "
                 "costliest branch; a loop of unknown trip count counts one iteration"}


def main(argv):
  del argv
  _io.init_script()
  hlo_path = _io.check_output_file(_HLO.value, flag="hlo")
  json_path = _io.check_output_file(_JSON.value, flag="json")
  dump_dir = None
  if _COMPILE_FOR.value:
    import tempfile  # pylint: disable=g-import-not-at-top

    dump_dir = pathlib.Path(tempfile.mkdtemp(prefix="lower_decode_dump_"))
    try:
      plugin = _AOT_PLUGIN.value or _deviceless.DEFAULT_PLUGIN
      _deviceless.prepare(plugin, dump_dir, ".*bass_jax_decode.*")
      if _COMMAND_BUFFERS.value is not None:
        os.environ["XLA_FLAGS"] += f" --xla_gpu_enable_command_buffer={_COMMAND_BUFFERS.value}"
    except (RuntimeError, FileNotFoundError) as e:
      raise _io.Refusal(f"--compile_for: {e}") from e
  _io.inspect_models(_TARGET.value, _DRAFT.value if _METHOD.value == "bass" else None)

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax.tooling import hlo_census  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import generate as generate_lib  # pylint: disable=g-import-not-at-top
  from bass_jax import profiles  # pylint: disable=g-import-not-at-top

  profile = profiles.backend_profile(_PROFILE.value or profiles.platform_profile(_PLATFORM.value))
  if not _PROFILE_OPTIONS.value:
    profile = dataclasses.replace(profile, compiler_options=())
  # The layer layout the platform's machine would load; the draft follows it.
  scan = (profiles.backend_profile(profile).scan_layers if _SCAN_LAYERS.value is None
          else _SCAN_LAYERS.value)
  target = bass_jax.load_model(_TARGET.value, scan_layers=scan, dtype=_DTYPE.value)
  draft = (bass_jax.load_draft_spec(_DRAFT.value, target, dtype=_DTYPE.value)
           if _METHOD.value == "bass" or _COMPILE_FOR.value else None)  # the census compiles BASS too
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, target.config.vocab_size, (_BATCH.value, _PROMPT_LEN.value))
  lowered = generate_lib.lower(
      target, draft, prompts, platform=_PLATFORM.value, sm_count=_SM_COUNT.value,
      compile_on_host=_CACHE_COPIES.value, method=_METHOD.value, max_new_tokens=_MAX_NEW.value,
      temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
      draft_len=_io.draft_len_value(_DRAFT_LEN.value), draft_tree=_draft_tree(),
      profile=profile)
  text = lowered.decode.mlir_module()
  result = hlo_census.census(text)
  spec = lowered.spec
  result["settings"] = {
      "target": target.name, "draft": _DRAFT.value if draft is not None else None,
      "method": _METHOD.value, "batch_size": _BATCH.value, "prompt_len": _PROMPT_LEN.value,
      "max_new_tokens": _MAX_NEW.value, "temperature": _TEMPERATURE.value, "top_p": _TOP_P.value,
      "draft_len": _DRAFT_LEN.value, "draft_tree": _draft_tree(),
      "platform": _PLATFORM.value,
      "profile": profile.name, "sm_count": _SM_COUNT.value, "attention_impl": spec.attention_impl,
      "scan_layers": target.scanned_layers, "dtype": str(target.dtype),
      "command_buffers": _COMMAND_BUFFERS.value,
      "verify_chunk": spec.verify_chunk, "branch_free": spec.branch_free,
      "compiler_options": dict(spec.compiler_options),
      # XLA's flags as given (a disabled pass, say), without the dump settings this script adds.
      "xla_flags": " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                            if not f.startswith("--xla_dump")),
      "jax_version": jax.__version__}
  result["cache_arrays"] = list(lowered.cache_arrays)
  copies = None
  if lowered.host_decode_hlo is not None:
    copies = hlo_census.cache_copies(lowered.host_decode_hlo, list(lowered.cache_arrays))
  result["cache_copies"] = None if copies is None else len(copies)

  if dump_dir is not None:
    result["launch_census"] = _launch_census(target, draft, prompts, profile, dump_dir)
  if hlo_path is None:
    options = "" if _PROFILE_OPTIONS.value else "_xla_defaults"
    hlo_path = (pathlib.Path("outputs/lower_decode")
                / f"decode_{_PLATFORM.value}_{profile.name}{options}.mlir")
    hlo_path.parent.mkdir(parents=True, exist_ok=True)
  _io.write_text_atomic(hlo_path, text)
  if json_path is not None:
    _io.write_json_atomic(json_path, result)

  print(f"decode of {target.name} + {result['settings']['draft']}, B = {_BATCH.value}, lowered for "
        f"{_PLATFORM.value} with the {profile.name} profile (attention {spec.attention_impl}, verify "
        f"chunk {spec.verify_chunk}, branch-free {spec.branch_free}); StableHLO: {hlo_path}\n")
  print("control flow (x N: a static trip count; data-dependent: the host reads a device value):")
  for line in _tree_lines(result["control_flow"]):
    print("  " + line)
  print("\nper step (data-dependent evaluations, at least):")
  for name, step in result["steps"].items():
    print(f"  {name}: {step['data_dependent_control_flow']}")
    for item in step["evaluations"]:
      print(f"    {item['times']} x {item['where']}")
  print(f"\ndata_dependent_control_flow_per_step: {result['data_dependent_control_flow_per_step']}")
  print(f"host callbacks: {result['host_callbacks']}; custom calls: {result['custom_calls']}")
  print(f"cache copies (compiled for this machine): "
        f"{'not counted' if copies is None else len(copies)} over {result['cache_arrays']}")
  for line in (copies or [])[:3]:
    print(f"  {line[:160]}")
  if dump_dir is not None:
    launches = result["launch_census"]
    print(f"\ncompiled for {_COMPILE_FOR.value} without a GPU: a plain step "
          f"{launches['launches_per_plain_step']} launches, a BASS step "
          f"{launches['launches_per_bass_step']} ({launches['bass_over_plain']}x): "
          f"{launches['kernels_per_step']} kernels, {launches['copies_per_step']} copies, "
          f"{launches['host_reads_per_step']} host reads; {launches['kernels_per_layer_plain_step']} "
          f"kernels per decoder layer in a plain step; launched with XLA's command buffers "
          f"({launches['command_buffers'] or 'its default'}): {launches['graph_launches_per_plain_step']}"
          f" and {launches['graph_launches_per_bass_step']} ({launches['caveats']})")
  print("largest arrays:")
  for array in result["largest_arrays"]:
    print(f"  {array['array']:>28}  {array['bytes'] / 2**20:8.2f} MiB  {array['op']}  "
          f"{array['where']}")


if __name__ == "__main__":
  _io.run(main)
