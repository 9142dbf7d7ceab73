r"""Bytes per device of a sharded target's weights and KV cache, on meshes of 1, 2, 4 and 8 devices.

    python -m experiments.benchmarks.memory    # Llama-2-7B's shape, bf16, B = 16, S = 2048

``--shape`` is a shape of ``experiments._shapes.SHAPES`` as ``_shapes.shape_config`` reads it
(``:layers=N``, ``:vocab=V``); the computed table has its layers, or ``--num_layers``.

For each (data, model) mesh: the parameters laid out by the Llama rule table
(``bass_jax.sharding.TENSOR_PARALLEL``) and the ragged cache (rows over data, KV heads over model), from
the shard shapes the shardings give (``ShardingPlan``; nothing of that size is allocated). To show that
those shapes are what JAX really allocates, the first ``--instantiate_layers`` layers are then built
for real with random weights on every mesh whose data axis is 1 (initialized directly into their shards
by a jitted init with output shardings), and their per-device bytes, read from every array's
``addressable_shards``, are compared with the computed ones. On a CPU the devices are XLA's host
devices (``--host_devices``), so this measures layout, not a GPU's memory.

Writes ``memory.json`` (``--output``) and prints the table as Markdown.
"""

import dataclasses

from absl import app
from absl import flags

from experiments import _io
from experiments import _shapes

_HOST_DEVICES = flags.DEFINE_integer(
    "host_devices", 8, "CPU devices to create (XLA_FLAGS --xla_force_host_platform_device_count); "
    "ignored on a GPU.", lower_bound=1)
_SHAPE = flags.DEFINE_string("shape", "llama-2-7b", "Model shape: <name>[:layers=N][:vocab=V], a "
                             "name of experiments._shapes.SHAPES.")
_LAYERS = flags.DEFINE_integer("num_layers", None, "Decoder layers of the computed table (default: "
                               "the shape's).", lower_bound=1)
_INSTANTIATE = flags.DEFINE_integer("instantiate_layers", 1, "Layers built for real to check the "
                                    "computed bytes (0 = none).", lower_bound=0)
_BATCH = flags.DEFINE_integer("batch_size", 16, "Rows of the cache.", lower_bound=1)
_CACHE_LEN = flags.DEFINE_integer("cache_len", 2048, "Cache slots per row.", lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Weights and cache dtype.")
_MESHES = flags.DEFINE_list("meshes", ["1x1", "1x2", "2x1", "1x4", "2x2", "4x1", "1x8", "2x4", "8x1"],
                            "Meshes as DATAxMODEL.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON file (default: a fresh outputs/memory-<time>/).")

GIB = 2**30


def main(argv):
  del argv  # _io.run refuses arguments that are not flags
  requested = _io.init_mesh_script(_HOST_DEVICES.value, _MESHES.value)
  try:
    output = _io.check_output_file(
        _OUTPUT.value or _io.run_directory(None, "memory") / "memory.json", flag="output")
  except _io.OutputError as e:
    raise app.UsageError(str(e)) from e

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import bass_jax as bj  # pylint: disable=g-import-not-at-top
  from bass_jax import sharding  # pylint: disable=g-import-not-at-top
  from bass_jax.evaluation import reproduce  # pylint: disable=g-import-not-at-top

  try:
    shape = _shapes.shape_config(_SHAPE.value)
  except ValueError as e:
    raise app.UsageError(f"--shape: {e}") from None
  num_layers = _LAYERS.value or shape.num_hidden_layers
  configs = {layers: dataclasses.replace(shape, num_hidden_layers=layers)
             for layers in (num_layers, _INSTANTIATE.value) if layers}
  dtype = jnp.dtype(_DTYPE.value)
  meshes = [m for m in requested if m[0] * m[1] <= jax.device_count()]
  rows = []
  for data, model in meshes:
    mesh = sharding.make_mesh(data, model)
    row = {"data": data, "model": model, "devices": data * model}
    for name, layers in (("computed", num_layers), ("built", _INSTANTIATE.value)):
      if not layers or (name == "built" and data != 1):
        continue
      config = configs[layers]
      plan = sharding.plan(config, mesh)
      abstract = bj.abstract_params(config, dtype)
      param_shardings = plan.param_shardings(abstract)
      cache_shape = jax.eval_shape(lambda c=config: c.init_cache(_BATCH.value, _CACHE_LEN.value, dtype))
      cache_shardings = sharding.state_shardings(cache_shape, plan, _BATCH.value)
      if name == "computed":
        row["params_gib"] = sharding.bytes_per_device(abstract, param_shardings) / GIB
        row["cache_gib"] = sharding.bytes_per_device(cache_shape, cache_shardings) / GIB
        row["replicated"] = list(plan.replicated)
        continue
      params = jax.jit(lambda key, c=config: bj.init_params(c, key, dtype),
                       out_shardings=param_shardings)(jax.random.key(0))
      cache = jax.jit(lambda c=config: c.init_cache(_BATCH.value, _CACHE_LEN.value, dtype),
                      out_shardings=cache_shardings)()
      device = mesh.devices.flat[0]
      held = lambda tree: sum(s.data.nbytes for x in jax.tree_util.tree_leaves(tree)
                              for s in x.addressable_shards if s.device == device)
      row["built_layers"] = layers
      row["built_params_gib"] = held(params) / GIB
      row["built_cache_gib"] = held(cache) / GIB
      row["computed_params_gib_at_built_layers"] = sharding.bytes_per_device(
          abstract, param_shardings) / GIB
      row["computed_cache_gib_at_built_layers"] = sharding.bytes_per_device(
          cache_shape, cache_shardings) / GIB
      del params, cache
    rows.append(row)

  lines = [f"{_SHAPE.value}, {num_layers} layers, {_DTYPE.value}; cache B = {_BATCH.value}, "
           f"S = {_CACHE_LEN.value}; GiB per device:", "",
           "| mesh (data, model) | devices | weights | KV cache | weights + cache | replicated |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| ({r['data']}, {r['model']}) | {r['devices']} | {r['params_gib']:.2f} | "
                 f"{r['cache_gib']:.2f} | {r['params_gib'] + r['cache_gib']:.2f} | "
                 f"{', '.join(r['replicated']) or '-'} |")
  built = [r for r in rows if "built_layers" in r]
  if built:
    lines += ["", f"Built for real ({built[0]['built_layers']} layer(s), random weights), bytes on the "
              "first device vs computed:", "",
              "| mesh | weights built | weights computed | cache built | cache computed |",
              "|---|---|---|---|---|"]
    for r in built:
      lines.append(f"| ({r['data']}, {r['model']}) | {r['built_params_gib']:.4f} | "
                   f"{r['computed_params_gib_at_built_layers']:.4f} | {r['built_cache_gib']:.4f} | "
                   f"{r['computed_cache_gib_at_built_layers']:.4f} |")
  table = "\n".join(lines)
  print(table, flush=True)
  _io.write_json_atomic(output, {"experiment": "memory", **reproduce.machine(), "rows": rows,
                                 "table": table})
  print(f"wrote {output}", flush=True)


if __name__ == "__main__":
  _io.run(main)
