r"""Lowers the whole jitted decode for a GPU on this machine and prints its census: the control flow of
one BASS step, host callbacks, kernels and the largest arrays. No GPU needed.

    python -m experiments.lower_decode --platform=cuda --batch_size=4 --json=outputs/census.json

The decode is the one ``bass_jax.generate`` would run for these flags (target, draft, batch,
sampling and draft length as in ``experiments.generate``), under the backend profile of
``--platform`` unless ``--profile`` says otherwise (``bass_jax.sampling.profiles``): it is traced as
for that platform (the Pallas kernels lowered natively, their cache splits sized for ``--sm_count``
SMs) and exported with ``jax.export`` (``bass_jax.sampling.generate.lower``). The prompts are
``--batch_size`` distinct random token sequences of ``--prompt_len`` tokens: only shapes matter.

What it prints (``bass_jax.hlo_census``): the nesting of every ``while`` and conditional, each marked
data-dependent (the host must read a value from the device to go on: on XLA:GPU a round trip and
the launch gap of the next body) or with its static trip count; per kind of step, the data-dependent
evaluations one step makes; host callbacks; custom calls (the Triton kernels); the largest arrays.
With ``--cache_copies`` (default) the same settings are also compiled for this machine, where XLA's
copy insertion runs, and every copy of a KV cache array is counted (with the jnp reference attention
in place of a Pallas kernel: a kernel is a custom call that reads the cache as the reference's ops
do, where the Pallas interpreter would copy its operands). The StableHLO goes to ``--hlo``; with
``--json`` the census is written as JSON, ``data_dependent_control_flow_per_step`` and
``cache_copies`` among its keys.
"""

import pathlib

from absl import flags

from experiments import _io

_TARGET = flags.DEFINE_string("target", "smollm2-135m-instruct", "Target: alias, .gguf, or HF dir.")
_DRAFT = flags.DEFINE_string("draft", "hybrid:smollm2-135m-eagle",
                             "The draft side, as experiments.generate's --draft.")
_METHOD = flags.DEFINE_enum("method", "bass", ["bass", "regular"], "Decoding method.")
_BATCH = flags.DEFINE_integer("batch_size", 4, "Rows (distinct random prompts).", lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 100, "Tokens per prompt.", lower_bound=1)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Output tokens per row.", lower_bound=1)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.2, "Sampling temperature; 0 is greedy.",
                                  lower_bound=0.0)
_TOP_P = flags.DEFINE_float("top_p", 0.95, "Nucleus mass in (0, 1]; 1 disables it.")
_DRAFT_LEN = flags.DEFINE_string("draft_len", "goodput", "'dynamic', 'goodput' or a fixed int.")
_io.require_draft_len()
_DRAFT_TREE = flags.DEFINE_multi_string("draft_tree", None, "Token-tree shapes, as in "
                                        "experiments.generate.")
_PLATFORM = flags.DEFINE_enum("platform", "cuda", ["cuda", "rocm", "cpu"], "Platform to lower for.")
_PROFILE = flags.DEFINE_enum("profile", None, ["cpu", "gpu"],
                             "Backend profile; default: the platform's.")
_SM_COUNT = flags.DEFINE_integer("sm_count", 132, "SMs the kernels' cache splits assume (H100: "
                                 "132).", lower_bound=1)
_CACHE_COPIES = flags.DEFINE_bool("cache_copies", True, "Also compile for this machine and count "
                                  "copies of the KV caches.")
_HLO = flags.DEFINE_string("hlo", None, "Where to write the decode's StableHLO; default "
                           "outputs/lower_decode/decode_<platform>_<profile>.mlir.")
_JSON = flags.DEFINE_string("json", None, "Write the census as JSON here.")
flags.register_validator("top_p", lambda v: 0.0 < v <= 1.0, message="--top_p must be in (0, 1]")
_io.require_tree_shapes()


def _tree_lines(nodes, depth=0):
  for node in nodes:
    kind = node["kind"] + (" (data-dependent)" if node["data_dependent"]
                           else f" x{node['trip_count']}")
    step = f"  <- loop of {node['step_loop_of']}" if "step_loop_of" in node else ""
    yield f"{'  ' * depth}{kind}  {node['where']}{step}"
    yield from _tree_lines(node.get("children", []), depth + 1)


def main(argv):
  del argv
  _io.init_script()
  hlo_path = _io.check_output_file(_HLO.value, flag="hlo")
  json_path = _io.check_output_file(_JSON.value, flag="json")
  _io.inspect_models(_TARGET.value, _DRAFT.value if _METHOD.value == "bass" else None)

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  import bass_jax  # pylint: disable=g-import-not-at-top
  from bass_jax import hlo_census  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import generate as generate_lib  # pylint: disable=g-import-not-at-top
  from bass_jax.sampling import profiles  # pylint: disable=g-import-not-at-top

  profile = _PROFILE.value or profiles.platform_profile(_PLATFORM.value)
  # The layer layout the platform's machine would load (scanned on a GPU); the draft follows it.
  target = bass_jax.load_model(_TARGET.value,
                               scan_layers=profiles.backend_profile(profile).scan_layers)
  draft = bass_jax.load_draft_spec(_DRAFT.value, target) if _METHOD.value == "bass" else None
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, target.config.vocab_size, (_BATCH.value, _PROMPT_LEN.value))
  lowered = generate_lib.lower(
      target, draft, prompts, platform=_PLATFORM.value, sm_count=_SM_COUNT.value,
      compile_on_host=_CACHE_COPIES.value, method=_METHOD.value, max_new_tokens=_MAX_NEW.value,
      temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
      draft_len=_io.draft_len_value(_DRAFT_LEN.value), draft_tree=_DRAFT_TREE.value,
      profile=profile)
  text = lowered.decode.mlir_module()
  result = hlo_census.census(text)
  spec = lowered.spec
  result["settings"] = {
      "target": target.name, "draft": _DRAFT.value if draft is not None else None,
      "method": _METHOD.value, "batch_size": _BATCH.value, "prompt_len": _PROMPT_LEN.value,
      "max_new_tokens": _MAX_NEW.value, "temperature": _TEMPERATURE.value, "top_p": _TOP_P.value,
      "draft_len": _DRAFT_LEN.value, "draft_tree": _DRAFT_TREE.value, "platform": _PLATFORM.value,
      "profile": profile, "sm_count": _SM_COUNT.value, "attention_impl": spec.attention_impl,
      "verify_chunk": spec.verify_chunk, "branch_free": spec.branch_free,
      "jax_version": jax.__version__}
  result["cache_arrays"] = list(lowered.cache_arrays)
  copies = None
  if lowered.host_decode_hlo is not None:
    copies = hlo_census.cache_copies(lowered.host_decode_hlo, list(lowered.cache_arrays))
  result["cache_copies"] = None if copies is None else len(copies)

  if hlo_path is None:
    hlo_path = pathlib.Path("outputs/lower_decode") / f"decode_{_PLATFORM.value}_{profile}.mlir"
    hlo_path.parent.mkdir(parents=True, exist_ok=True)
  _io.write_text_atomic(hlo_path, text)
  if json_path is not None:
    _io.write_json_atomic(json_path, result)

  print(f"decode of {target.name} + {result['settings']['draft']}, B = {_BATCH.value}, lowered for "
        f"{_PLATFORM.value} with the {profile} profile (attention {spec.attention_impl}, verify "
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
  print("largest arrays:")
  for array in result["largest_arrays"]:
    print(f"  {array['array']:>28}  {array['bytes'] / 2**20:8.2f} MiB  {array['op']}  "
          f"{array['where']}")


if __name__ == "__main__":
  _io.run(main)
