"""Worker-seconds per test file from `make test` runs' JUnit XML, as a markdown table.

    PYTEST_ADDOPTS=--junitxml=/tmp/a.xml make test
    python tests/suite_times.py "run a=/tmp/a.xml" "run b=/tmp/b.xml" [--alone=test_x,test_y]

Each cell is the sum of pytest's per-test times (setup, call and teardown) of one file; files under
10 s in every run are pooled in one row. ``--alone`` names files left unchanged between the runs: their
sum per run, and the other files' sum over it, say how much of a difference is the machine's speed
(results/suite_2026-11-30/per_file_54df36b.md).
"""

import collections
import sys
import xml.etree.ElementTree as ET


def per_file(path: str) -> collections.Counter:
  """``{file stem: seconds}`` of one JUnit XML."""
  seconds = collections.Counter()
  for case in ET.parse(path).getroot().iter("testcase"):
    seconds[case.get("classname").split(".")[-1]] += float(case.get("time", 0))
  return seconds


def main(argv: list[str]) -> None:
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
