"""Pack the test stand-ins into an offline artifact directory, byte for byte reproducibly.

TEST ARTIFACTS: tests/artifacts/nvidia-fork-standin/ (a tiny real kernel module with the P2P fork's
DKMS layout), nvidia-installer-standin.run (a stand-in for the userspace .run installer) and
nccl-tests-standin/ (a stand-in for nccl-tests with its make interface: see its Makefile). The lab
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
NCCL_TESTS_VERSION = "2.19.6"
NCCL_TESTS = f"nccl-tests-standin-{NCCL_TESTS_VERSION}.tar.gz"


def tree_files(tree: Path) -> dict:
    """{relative path: bytes} of every file under TREE."""
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


def perf_standin_files(tree: Path) -> dict:
    """tree_files of an nccl-tests / rccl-tests stand-in with the part they share (perf_table.h) in its src/."""
    return dict(tree_files(tree), **{"src/perf_table.h": (HERE / "perf_table.h").read_bytes()})


def tarball_bytes(top: str, files: dict, dirs: bool = True) -> bytes:
    """A reproducible .tar.gz of FILES ({relative path: bytes}) under the directory TOP, with its directories unless
    DIRS is false."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        folders = sorted({"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)})
        for d in ([""] + folders) if dirs else []:
            info = tarfile.TarInfo(f"{top}/{d}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            info.uname = info.gname = "root"
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def driver_tarball_bytes() -> bytes:
    return tarball_bytes(f"nvidia-fork-standin-{VERSION}", tree_files(HERE / "nvidia-fork-standin"), dirs=False)


def pack(dest: Path = DEFAULT_DIR) -> dict:
    """Write the NVIDIA host's artifacts into DEST; return {file name: sha256}."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / TARBALL).write_bytes(driver_tarball_bytes())
    shutil.copyfile(HERE / "nvidia-installer-standin.run", dest / INSTALLER)
    (dest / NCCL_TESTS).write_bytes(tarball_bytes(f"nccl-tests-{NCCL_TESTS_VERSION}",
                                                  perf_standin_files(HERE / "nccl-tests-standin")))
    return {name: hashlib.sha256((dest / name).read_bytes()).hexdigest() for name in (TARBALL, INSTALLER, NCCL_TESTS)}


if __name__ == "__main__":
    for name, digest in pack(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR).items():
        print(f"{digest}  {name}")
