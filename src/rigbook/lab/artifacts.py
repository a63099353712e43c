"""The lab's offline artifacts: what inventory/lab pins for site.yml, made ready on this machine by `lab up`.

The lab mounts this machine's artifact directory read-only on every host at /var/cache/rigbook/artifacts, so
site.yml finds there, offline:
- the driver stand-ins (TEST ARTIFACTS from tests/artifacts/, not a driver), packed byte for byte so their
  sha256 equal the lab pins;
- the pinned CUDA wheels, downloaded once with pip into the pinned wheel directory (a cached step: later
  runs find them and download nothing).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import yaml

from rigbook import paths
from rigbook.lab.machine import ARTIFACTS_DIR, shared_dirs
from rigbook.lab.system import LabFailure, progress

PINNED_GROUP = "inventory/lab/group_vars/x99_3080.yml"
EXTRA_WHEELS = ["nvidia-cuda-runtime"]  # the runtime the compile-and-link check links against


def lab_pins() -> dict:
    return yaml.safe_load((paths.collection_root() / PINNED_GROUP).read_text())["rigbook_pins"]


def _packer():
    """tests/artifacts/pack.py of the collection root: the checkout, or the copy a wheel carries (setup.py ships
    tests/artifacts/ for this; the stand-ins live with the tests that use them)."""
    return paths.load_collection_file("tests/artifacts/pack.py", "rigbook_lab_pack")


def source_dir() -> Path:
    """The artifact directory on this machine (RIGBOOK_LAB_ARTIFACTS moves it)."""
    return next(src for src, target, _ in shared_dirs() if target == str(ARTIFACTS_DIR))


def _on_this_machine(host_path: str) -> Path:
    """A pinned path inside the hosts' artifact mount, as a path of this machine."""
    return source_dir() / Path(host_path).relative_to(ARTIFACTS_DIR)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pack_standins(pins: dict) -> None:
    """Pack the stand-ins and check them against the pins (a stale pin is a bug here, said plainly)."""
    driver = pins["nvidia_driver"]
    wanted = {driver["source"]["path"]: driver["source"]["sha256"],
              driver["userspace_installer"]["path"]: driver["userspace_installer"]["sha256"]}
    if all(_on_this_machine(p).is_file() and _sha256(_on_this_machine(p)) == s for p, s in wanted.items()):
        progress("artifacts: driver stand-ins present, sha256 as pinned")
        return
    _packer().pack(source_dir())
    for host_path, digest in wanted.items():
        got = _sha256(_on_this_machine(host_path))
        if got != digest:
            raise LabFailure(f"artifacts: {host_path} packed with sha256 {got}, but {PINNED_GROUP} pins {digest}")
    progress(f"artifacts: packed the driver stand-ins into {source_dir()}")


def download_wheels(pins: dict) -> None:
    toolchain = pins["cuda_toolchain"]
    names = list(toolchain["packages"]) + EXTRA_WHEELS
    wheel_dir = _on_this_machine(toolchain["wheel_dir"])
    have = {p.name.split("-")[0].replace("_", "-") for p in wheel_dir.glob("*.whl")}
    missing = [n for n in names if n not in have]
    if not missing:
        progress(f"artifacts: CUDA {toolchain['version']} wheels present in {wheel_dir}")
        return
    wheel_dir.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}=={toolchain['version']}" for name in missing]
    progress(f"artifacts: downloading {', '.join(specs)} into {wheel_dir} (once per machine) ...")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
                           "--only-binary=:all:", "-d", str(wheel_dir), *specs],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise LabFailure(f"artifacts: pip download failed: {tail[0]}")
    progress(f"artifacts: {len(specs)} wheels downloaded")


def prepare() -> None:
    """Everything site.yml needs offline on the lab hosts; idempotent."""
    pins = lab_pins()
    pack_standins(pins)
    download_wheels(pins)
