r"""Reading a GGUF file's header (metadata and tensor table): ``gguf.GGUFReader`` as it is, against the
same reader over a plain view of its memory map (``bass_jax.checkpoints.gguf``'s reader), side by side.

    python -m experiments.benchmarks.bench_gguf_read --model=smollm2-135m-instruct --repeats=3

Each round reads the file with both readers, in alternating order; prints one markdown row per reader
(median seconds over the rounds, and the ratio to gguf's own) after checking that both read the same
fields and tensors. No tensor is dequantized: ``load_model`` adds that cost to both.
"""

import time

from absl import flags
import numpy as np

from experiments import _io

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "A .gguf file, or an alias of one "
                             "(bass_jax.checkpoints.sources).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Rounds; each reads the file once with each reader.",
                                lower_bound=1)


def _same(a, b) -> None:
  """Raises AssertionError unless readers ``a`` and ``b`` read the same fields and tensors."""
  assert list(a.fields) == list(b.fields), "the readers read different metadata keys"
  for key in a.fields:
    assert str(a.fields[key].contents()) == str(b.fields[key].contents()), key
  assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
  for x, y in zip(a.tensors, b.tensors):
    assert x.tensor_type == y.tensor_type and np.array_equal(x.data, y.data), x.name


def main(argv):
  del argv  # _io.run refuses arguments that are not flags
  import gguf  # pylint: disable=g-import-not-at-top

  from bass_jax.checkpoints import gguf as gguf_ckpt  # pylint: disable=g-import-not-at-top
  from bass_jax.checkpoints import sources  # pylint: disable=g-import-not-at-top

  try:
    path = sources.model_path(_MODEL.value)
  except FileNotFoundError as e:
    raise _io.Refusal(f"--model: {e}") from e
  if path.suffix != ".gguf" or not path.is_file():
    raise _io.Refusal(f"--model={_MODEL.value}: {path} is not a .gguf file")
  readers = {"gguf.GGUFReader": gguf.GGUFReader,
             "over a plain view (bass_jax)": gguf_ckpt.reader_class()}
  seconds = {name: [] for name in readers}
  read = {}
  for round_ in range(_REPEATS.value):
    for name in (list(readers) if round_ % 2 == 0 else list(readers)[::-1]):
      start = time.perf_counter()
      read[name] = readers[name](str(path))
      seconds[name].append(time.perf_counter() - start)
  _same(*read.values())
  first = next(iter(read.values()))
  base = float(np.median(seconds["gguf.GGUFReader"]))
  print(f"{path.name}: {len(first.fields)} metadata keys, {len(first.tensors)} tensors, "
        f"{_REPEATS.value} rounds")
  print("| reader | s (median) | speedup |")
  print("|---|---:|---:|")
  for name, times in seconds.items():
    median = float(np.median(times))
    print(f"| {name} | {median:.2f} | {base / median:.2f}x |")


if __name__ == "__main__":
  _io.run(main)
