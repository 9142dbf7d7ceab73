"""Worker-seconds per test file from `make test` runs' JUnit XML, as a markdown table; or, with
``--census``, JAX's tracing, lowering and compiling seconds per file.

    PYTEST_ADDOPTS=--junitxml=$PWD/outputs/junit_a.xml make test
    python tests/suite_times.py "a=outputs/junit_a.xml" "b=outputs/junit_b.xml" [--alone=test_x,...]
    BASS_JAX_COMPILE_CENSUS=$PWD/outputs/census_a make test
    python tests/suite_times.py --census=outputs/census_a

(``outputs/`` is the repository's ignored folder for run products; any fresh path will do.)

Each cell is the sum of pytest's per-test times (setup, call and teardown) of one file; files
under 10 s in every run are pooled in one row. ``--alone`` names files left unchanged between the
runs: their sum per run, and the other files' sum over it, say how much of a difference is the
machine's speed (results/suite_2026-11-30/per_file_54df36b.md). ``--census`` reads the
per-process files that tests/_compile_census.py writes and sums them per test file.
"""

import collections
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET


def per_file(path: str) -> collections.Counter:
  """``{file stem: seconds}`` of one JUnit XML."""
  seconds = collections.Counter()
  for case in ET.parse(path).getroot().iter("testcase"):
    seconds[case.get("classname").split(".")[-1]] += float(case.get("time", 0))
  return seconds


def census(directory: str) -> dict[str, collections.Counter]:
  """``{test file: Counter(trace=s, lower=s, compile=s, init=s)}`` summed over the processes'
  JSON files in ``directory`` (tests/_compile_census.py).

  Raises:
    SystemExit: no ``*.json`` file in ``directory`` (the message says how to make them).
  """
  files = sorted(glob.glob(os.path.join(directory, "*.json")))
  if not files:
    sys.exit(f"--census: no census files in {directory} (run BASS_JAX_COMPILE_CENSUS={directory} "
             "make test first)")
  sums = collections.defaultdict(collections.Counter)
  for path in files:
    with open(path) as f:
      for name, seconds in json.load(f).items():
        sums[name].update(seconds)
  return sums


def print_census(sums: dict[str, collections.Counter]) -> None:
  """The census as a markdown table, files by their total, those under 10 s pooled."""
  phases = ("trace", "lower", "compile", "init")
  total = lambda c: c["trace"] + c["lower"] + c["compile"]
  names = sorted(sums, key=lambda k: -total(sums[k]))
  big = [k for k in names if total(sums[k]) >= 10]
  print("| file | tracing | lowering | XLA compile | of these, init_params' programs | total |")
  print("|---|---:|---:|---:|---:|---:|")
  rest, overall = collections.Counter(), collections.Counter()
  for name in names:
    overall.update(sums[name])
    if name not in big:
      rest.update(sums[name])
  rows = [(k, sums[k]) for k in big] + [("files under 10 s", rest), ("**total**", overall)]
  for label, c in rows:
    print(f"| {label} | " + " | ".join(f"{c[p]:.0f}" for p in phases) + f" | {total(c):.0f} |")


def main(argv: list[str]) -> None:
  directory = next((a.split("=", 1)[1] for a in argv if a.startswith("--census=")), None)
  if directory:
    print_census(census(directory))
    return
  alone = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--alone=")), None)
  runs = [a.split("=", 1) for a in argv if not a.startswith("--")]
  if not runs or any(len(r) != 2 for r in runs):
    sys.exit("usage: suite_times.py LABEL=JUNIT.xml ... [--alone=test_a,test_b]")
  data = [per_file(path) for _, path in runs]
  big = sorted({k for d in data for k, v in d.items() if v >= 10}, key=lambda k: -data[0].get(k, 0))
  print("| file | " + " | ".join(label for label, _ in runs) + " |")
  print("|---|" + "---:|" * len(runs))
  for name in big:
    print(f"| {name} | " + " | ".join(f"{d.get(name, 0):.0f}" for d in data) + " |")
  rest = [sum(v for k, v in d.items() if k not in big) for d in data]
  print("| files under 10 s in every run | " + " | ".join(f"{r:.0f}" for r in rest) + " |")
  print("| **total** | " + " | ".join(f"**{sum(d.values()):,.0f}**" for d in data) + " |")
  if alone:
    kept = [sum(d.get(k, 0) for k in alone) for d in data]
    print("\nfiles left alone: " + ", ".join(f"{k:.0f}" for k in kept))
    print("the others over them: " + ", ".join(f"{(sum(d.values()) - k) / k:.2f}"
                                                for d, k in zip(data, kept)))


if __name__ == "__main__":
  main(sys.argv[1:])
