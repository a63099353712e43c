"""Shared by the lab tests: the offline artifacts site.yml needs on a lab host (a cached step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "artifacts"))
import pack  # noqa: E402

PINS = yaml.safe_load((ROOT / "inventory/lab/group_vars/x99_3080.yml").read_text())["rigbook_pins"]
WHEEL_DIR = Path(PINS["cuda_toolchain"]["wheel_dir"])


@pytest.fixture(scope="session")
def lab_artifacts():
    """The driver stand-ins packed (their sha256 must be the pinned ones) and the CUDA wheels downloaded once.

    Everything lands in /var/cache/rigbook/artifacts, which the lab mounts read-only on each host; only the
    first run on a machine downloads the wheels.
    """
    digests = pack.pack()
    assert digests[pack.TARBALL] == PINS["nvidia_driver"]["source"]["sha256"]
    assert digests[pack.INSTALLER] == PINS["nvidia_driver"]["userspace_installer"]["sha256"]
    version = PINS["cuda_toolchain"]["version"]
    names = PINS["cuda_toolchain"]["packages"] + ["nvidia-cuda-runtime"]
    if len(list(WHEEL_DIR.glob("*.whl"))) < len(names):
        WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d",
                               str(WHEEL_DIR)] + [f"{n}=={version}" for n in names],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr
    return digests
