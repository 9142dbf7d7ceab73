"""bass_jax.tooling.thunk_census: XLA:GPU's thunk sequence read into a tree and priced in launches, loops by
their trip counts; and, where JAX's CUDA plugin is installed (``make aot-plugin``), a small program
compiled for an H100 on this CPU and counted."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bass_jax.tooling import thunk_census

REPO = pathlib.Path(__file__).resolve().parents[1]


def _sequence(trip: int, body_kernels: int, branch_kernels: tuple[int, int]):
  """A thunk sequence as XLA prints it (the quirks included: ``condition:`` at column 0, a wrapper's
  embedded copy one level down with no header), its metadata and an HLO line with the trip count."""
  lines, meta, n = [], [], iter(range(1, 1000))

  def thunk(depth, kind, name="", annotation=""):
    i = next(n)
    lines.append(f"{'    ' * depth}{i:03d}: {kind:<13} [source | sink] {name}")
    meta.append(f'thunk_metadata {{\n  thunk_info {{\n    profile_annotation: "{annotation or name}"\n'
                f'    thunk_id: {i}\n  }}\n  thunk_kind: "{kind}"\n}}')

  thunk(0, "kCopy", "kCopy")
  thunk(0, "kWhile", annotation="while.outer")  # unknown trip count: one iteration counted
  lines.append("condition:")
  thunk(1, "kCustomKernel", "outer_compare")
  lines.append("  body:")
  thunk(1, "kWhile", annotation="while.inner")
  lines.append("condition:")
  thunk(2, "kCustomKernel", "inner_compare")
  lines.append("      body:")
  for k in range(body_kernels):
    thunk(2, "kCustomKernel", f"fusion_{k}")
  thunk(2, "kDynamicSliceFusion", "")
  thunk(3, "kCopy", "kCopy")  # what the wrapper runs
  thunk(1, "kConditional", annotation="conditional.1")
  for b, kernels in enumerate(branch_kernels):
    lines.append(f"      branch_{b}:")
    for k in range(kernels):
      thunk(2, "kCustomKernel", f"branch_{b}_{k}")
  thunk(0, "kCustomKernel", "input_reduce_fusion")
  hlo = (f'  %while.inner = (s32[]) while(%t), condition=%c, body=%b, '
         f'backend_config={{"known_trip_count":{{"n":"{trip}"}}}}\n')
  return "\n".join(lines) + "\n", "\n".join(meta), hlo


def test_a_written_sequence_is_counted_loops_by_their_trip_counts():
  rng = np.random.default_rng(7)
  trip, body, branches = int(rng.integers(2, 40)), int(rng.integers(1, 9)), tuple(rng.integers(0, 6, 2))
  sequence, metadata, hlo = _sequence(trip, body, branches)
  thunks = thunk_census.parse_thunks(sequence, metadata)
  trips = thunk_census.trip_counts(hlo)
  assert trips == {"while.inner": trip}
  (_, outer), (_, inner) = thunk_census.loops(thunks)
  assert (outer.annotation, inner.annotation) == ("while.outer", "while.inner")
  # one outer iteration: its condition, the inner loop (trip bodies of body kernels and a wrapped
  # copy; a known trip count runs no condition), the costlier branch; host reads: the outer
  # predicate and the branch index
  want = thunk_census.Count(kernels=1 + trip * body + max(branches), copies=trip, host_reads=2)
  assert thunk_census.per_iteration(outer, trips) == want
  whole = thunk_census.count(thunks, trips)
  assert whole == want + thunk_census.Count(kernels=1, copies=1, unknown_loops=1)
  assert whole.launches == whole.kernels + whole.copies
  with pytest.raises(ValueError, match="line 2"):
    thunk_census.parse_thunks("001: kCopy [source | sink] kCopy\n        002: kCopy [a] b\n")
  with pytest.raises(ValueError, match="not a thunk"):
    thunk_census.parse_thunks("001: kCopy [source | sink] kCopy\nbody:\n")


_PROGRAM = """
import json, os, pathlib, sys, tempfile
dump = tempfile.mkdtemp()
sys.argv = ["lower_decode"]
from experiments.benchmarks import lower_decode
from experiments import _deviceless
_deviceless.prepare(sys.argv_plugin, dump, ".*small.*")
import jax, jax.numpy as jnp
from bass_jax.tooling import thunk_census
config = (lower_decode._TARGET_CONFIGS / "h100_sxm.txtpb").read_text()
out = {}
for n in (3, 7):
  def small(x, w, n=n):
    return jax.lax.fori_loop(0, n, lambda i, h: jnp.tanh(h @ w), x).sum()
  small.__name__ = f"small_{n}"
  spec = jax.ShapeDtypeStruct
  thunk_census.compile_deviceless(small, (spec((8, 64), jnp.float32), spec((64, 64), jnp.float32)),
                                  {}, config)
  d = thunk_census.read_dump(dump, f"small_{n}")
  c = thunk_census.count(d.thunks(), d.trips())
  out[n] = [c.kernels, c.copies, c.host_reads, c.unknown_loops]
print(json.dumps(out))
"""


@pytest.mark.skipif(not (REPO / ".aot_plugin" / "jax_plugins").is_dir(),
                    reason="JAX's CUDA plugin is not installed here (`make aot-plugin`, about 480 MB, "
                           "is not part of make test's install)")
def test_a_program_compiled_for_an_h100_here_counts_its_loop_by_trip_count():
  program = _PROGRAM.replace("sys.argv_plugin", repr(str(REPO / ".aot_plugin")))
  run = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  counts = json.loads(run.stdout.strip().splitlines()[-1])
  three, seven = counts["3"], counts["7"]
  assert three[3] == seven[3] == 0  # fori_loop's trip count is known to XLA
  assert seven[2] == three[2] == 0  # so the runtime reads no predicate
  per_iteration = [(b - a) / 4 for a, b in zip(three[:2], seven[:2])]
  assert all(p == int(p) for p in per_iteration)  # each iteration launches the same thunks
  assert per_iteration[0] >= 1  # the GEMM, at least
  assert three[0] - 3 * per_iteration[0] >= 1  # outside the loop: the final reduction


def test_command_buffers_are_one_launch_and_loops_inside_them_none():
  """A sequence after XLA's thunk passes: thunks grouped into a command buffer (id 000, its commands
  one level down) launch once; a loop inside one is a graph node; an empty section reads
  ``No thunks.``."""
  sequence = "\n".join([
      "000: kCommandBuffer [source | next=005 (1)] ",
      "    001: kCopy [source | sink] kCopy",
      "    002: kCustomKernel [source | sink] fusion_1",
      "005: kWhile         [prev=000 (1) | sink]   ",
      "condition:",
      "    006: kCustomKernel [source | sink] loop_compare_fusion",
      "  body:",
      "    000: kCommandBuffer [source | sink] ",
      "        007: kWhile [source | sink] ",
      "condition:",
      "            No thunks.",
      "          body:",
      "            008: kCustomKernel [source | sink] gemm_fusion",
      "            009: kCustomKernel [source | sink] fusion_2",
      "    010: kConditional [source | sink] ",
      "      branch_0:",
      "        No thunks.",
      "      branch_1:",
      "        011: kCustomKernel [source | sink] fusion_3",
  ]) + "\n"
  thunks = thunk_census.parse_thunks(sequence)
  (_, outer), (_, inner) = thunk_census.loops(thunks)
  assert not thunk_census.in_command_buffer(thunks, outer)
  assert thunk_census.in_command_buffer(thunks, inner)
  # one outer iteration: its compare, the graph holding the inner loop, the branch's kernel; host
  # reads: the outer predicate and the branch index
  assert thunk_census.per_iteration(outer, {}) == thunk_census.Count(kernels=2, graphs=1, host_reads=2)
  assert thunk_census.count(thunks[:1], {}) == thunk_census.Count(graphs=1)


def test_kernels_per_layer_is_the_period_between_attention_kernels():
  """Synthetic thunks: a layer's launches are those from one attention kernel to the next, nested
  loop bodies included (once each), containers not counted; fewer than two attention kernels give no
  period; a loop Thunk is counted by its body."""
  k = lambda name: thunk_census.Thunk(0, "kCustomKernel", name)
  copy = thunk_census.Thunk(0, "kCopy", "kCopy")
  layer = lambda i: [k("bass_ragged_attention_split"), k(f"gemm_{i}"), copy, k(f"fusion_{i}")]
  inner = thunk_census.Thunk(0, "kWhile", "kWhile", sections={"condition": [k("cond")],
                                                               "body": [k("inner")]})
  body = [k("embed")] + layer(0) + [inner] + layer(1) + layer(2) + layer(3) + [k("head")]
  got = thunk_census.kernels_per_layer(body)
  # Periods: layer 0 with the inner loop's condition and body (6), then 4 and 4: the median is 4.
  assert got["median"] == 4 and got["layers"] == 4
  assert got["example"] == ["bass_ragged_attention_split", "gemm_1", "kCopy", "fusion_1"]
  loop = thunk_census.Thunk(0, "kWhile", "kWhile", sections={"body": body})
  assert thunk_census.kernels_per_layer(loop) == got
  assert thunk_census.kernels_per_layer(layer(0))["median"] is None  # one attention kernel
  assert [t.name for t in thunk_census.leaves([inner])] == ["cond", "inner"]
