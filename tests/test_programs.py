"""The compiled-program cache (bass_jax.sampling.programs): evicting a program frees its memory.

Issue 24: a process that compiled about a hundred decode programs died ("LLVM compilation error: Cannot
allocate memory", the process out of memory maps), because JAX's own caches kept every program ever
compiled, whatever the LRU evicted. The test compiles many programs in one fresh process, so that the
pytest process's own maps and memory do not count.
"""

import json
import os
import subprocess

import pytest

import bass_jax as bj
from bass_jax.sampling import programs, runner
from conftest import PYTHON


PROGRAMS = 12  # distinct settings compiled one after another
WARM = 4  # programs compiled before the baseline is read (first-use allocations, the LRU filled)

# One process: a 1-layer tiny target decodes regular, 40 output buckets (max_new_tokens 32 k), so that
# every call compiles a new prefill and decode; the LRU keeps 2 settings. It prints, after each call,
# whether the call compiled, /proc/self/maps lines and VmRSS (MiB), then the same after
# clear_compile_cache(), as one JSON object.
_SCRIPT = """
import json, sys
sys.path.insert(0, "tests")
import bass_jax as bj
from conftest import tiny_model

def maps():
  with open("/proc/self/maps") as f:
    return sum(1 for _ in f)

def rss_mib():
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

bj.set_compile_cache_size(2)
target = tiny_model(seed=0, num_hidden_layers=1)
rows = []
for k in range(1, {programs} + 1):
  out = bj.generate(target, None, [[1, 2, 3]], method="regular", max_new_tokens=32 * k)
  assert out.tokens.shape == (1, 32 * k)
  rows.append((out.stats.compiled, maps(), rss_mib()))
before_clear = maps()
bj.clear_compile_cache()
print(json.dumps({{"rows": rows, "before_clear": before_clear, "after_clear": maps()}}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_evicted_programs_release_their_memory():
  """12 settings compiled in turn with the LRU bounded at 2: the memory maps and RSS stay flat after
  the first few, and clearing the cache unmaps the two programs it held. (The code before the fix kept
  every program: here about +190 maps and +9 MiB per program, so about +1,500 maps and +72 MiB over
  the 8 settings after the first 4, far past the bounds below, and clearing freed nothing.)"""
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every program compiles; none is loaded from disk
  env["BASS_JAX_COMPILATION_CACHE_DIR"] = "off"  # nor written to it (the writes' buffers add RSS)
  # Beside the suite's XLA flags (tests/conftest.py: older emitters, LLVM level 0), which the child
  # inherits, fewer LLVM passes: the programs compile faster and keep their memory the same way (what
  # is measured is whether JAX frees the executables, not what is inside them).
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_llvm_disable_expensive_passes=true").strip()
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run = subprocess.run([PYTHON, "-c", _SCRIPT.format(programs=PROGRAMS)], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(run.stdout.strip().splitlines()[-1])
  compiled, maps, rss = zip(*result["rows"])
  assert all(compiled), compiled  # every call compiled a new setting
  table = "\n".join(f"program {i + 1}: {m} maps, {r:.0f} MiB"
                    for i, (m, r) in enumerate(zip(maps, rss)))
  freed = result["before_clear"] - result["after_clear"]
  assert freed > 100, (f"clear_compile_cache() unmapped {freed} regions (the two programs it held)\n"
                       + table)
  grew = max(maps[WARM:]) - maps[WARM - 1]
  assert grew < 150, f"+{grew} maps after program {WARM}: evicted programs are kept\n" + table
  rss_grew = max(rss[WARM:]) - rss[WARM - 1]
  assert rss_grew < 64, f"RSS +{rss_grew:.0f} MiB after program {WARM}\n" + table


def test_the_cache_is_shared_with_generate_and_bounded():
  """generate uses programs' LRU and compile function; the public names are the same objects; the
  size is checked."""
  assert runner.compiled is programs.compiled
  assert bj.clear_compile_cache is programs.clear_compile_cache
  assert bj.set_compile_cache_size is programs.set_compile_cache_size
  assert bj.enable_persistent_compilation_cache is programs.enable_persistent_compilation_cache
  for bad in (0, -1, 1.5, "2", True):
    with pytest.raises(ValueError, match="max_programs"):
      bj.set_compile_cache_size(bad)
