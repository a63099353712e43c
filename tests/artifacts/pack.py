"""Pack the test stand-ins into an offline artifact directory, byte for byte reproducibly.

TEST ARTIFACTS: tests/artifacts/nvidia-fork-standin/ (a tiny real kernel module with the P2P fork's
DKMS layout) and nvidia-installer-standin.run (a stand-in for the userspace .run installer). The lab
inventory pins their sha256 (inventory/lab/group_vars/x99_3080.yml); tests/unit/rigbook/test_nvidia_roles.py
(test_standin_artifacts_are_reproducible_and_pinned) checks the pins match. Run as root to fill the lab's artifact
directory:

    .venv/bin/python tests/artifacts/pack.py            # -> /var/cache/rigbook/artifacts
"""

from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSION = "615.71.09"
DEFAULT_DIR = Path("/var/cache/rigbook/artifacts")
TARBALL = f"nvidia-fork-standin-{VERSION}.tar.gz"
INSTALLER = f"nvidia-installer-standin-{VERSION}.run"


def tarball_bytes() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        top = f"nvidia-fork-standin-{VERSION}"
        for path in sorted((HERE / "nvidia-fork-standin").iterdir()):
            info = tarfile.TarInfo(f"{top}/{path.name}")
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def pack(dest: Path = DEFAULT_DIR) -> dict:
    """Write both artifacts into DEST; return {file name: sha256}."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / TARBALL).write_bytes(tarball_bytes())
    shutil.copyfile(HERE / "nvidia-installer-standin.run", dest / INSTALLER)
    return {name: hashlib.sha256((dest / name).read_bytes()).hexdigest() for name in (TARBALL, INSTALLER)}


if __name__ == "__main__":
    for name, digest in pack(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR).items():
        print(f"{digest}  {name}")
