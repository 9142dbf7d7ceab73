"""Setting up a process to compile for a GPU it does not have (XLA's deviceless compile), shared by
``experiments.benchmarks.lower_decode`` and ``experiments.benchmarks.bench_scale``.

It must run before JAX is imported, so it lives outside ``bass_jax`` (whose package imports JAX).
"""

import os
import pathlib
import sys

# XLA GpuTargetConfig descriptions of the GPUs a decode can be compiled for here (configs/gpu/).
TARGET_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs" / "gpu"
# Where `make aot-plugin` installs JAX's CUDA plugin.
DEFAULT_PLUGIN = pathlib.Path(__file__).resolve().parents[1] / ".aot_plugin"


def prepare(plugin_dir: str | os.PathLike | None, dump_dir: str | os.PathLike,
            module_re: str = ".*") -> None:
  """Sets up this process, before JAX is imported, for ``thunk_census.compile_deviceless``: JAX on the
  CPU (the CUDA plugin fails at ``cuInit`` without a GPU otherwise), the plugin's folder on the path,
  and XLA's dump of ``module_re``'s modules into ``dump_dir``.

  Raises:
    RuntimeError: JAX was imported already (its platforms and XLA's flags are fixed by then).
    FileNotFoundError: ``plugin_dir`` does not hold ``jax_plugins`` (``make aot-plugin`` installs it).
  """
  if "jax" in sys.modules:
    raise RuntimeError("experiments._deviceless.prepare must run before jax (or bass_jax) is imported")
  if plugin_dir is not None:
    plugin_dir = pathlib.Path(plugin_dir).absolute()
    if not (plugin_dir / "jax_plugins").is_dir():
      raise FileNotFoundError(f"{plugin_dir} holds no JAX CUDA plugin; run `make aot-plugin` (it "
                              "installs jax-cuda12-plugin of the installed jaxlib's version there)")
    sys.path.insert(0, str(plugin_dir))
  os.environ["JAX_PLATFORMS"] = "cpu"
  flags = os.environ.get("XLA_FLAGS", "")
  os.environ["XLA_FLAGS"] = (f"{flags} --xla_dump_to={pathlib.Path(dump_dir).absolute()} "
                             f"--xla_dump_hlo_module_re={module_re}").strip()
