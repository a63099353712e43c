"""Pack the RCCL and rccl-tests TEST STAND-INS into an offline artifact directory, byte for byte reproducibly.

TEST STAND-INS (not RCCL, not rccl-tests): rccl-standin/ is a small C++ tree laid out like RCCL (CMake at the top,
src/graph/paths.cc with an ncclTopoCheckP2p of RCCL 2.27's shape and the same lines where the collection's
p2p-level-user-last.patch applies) that builds a real librccl.so; rccl-tests-standin/ builds sendrecv_perf,
all_reduce_perf, all_gather_perf and reduce_scatter_perf against an installed prefix and prints rccl-tests' output
with figures from the host's recorded evidence, chosen by the transport the installed librccl picks. Three tarballs:

- rccl-standin-2.27.7.tar.gz: the pinned source (inventory/lab/group_vars/x99_r9700.yml pins its sha256);
- rccl-standin-2.27.8-bumped.tar.gz: the same tree "bumped" so that the patch no longer applies (the user
  override in ncclTopoCheckP2p reworded, as an upstream change would) - for the test of a version bump;
- rccl-tests-standin-2.27.7.tar.gz.

    .venv/bin/python tests/artifacts/rccl_standin.py [DEST]     # -> DEST (default /var/cache/rigbook/artifacts)
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSION = "2.27.7"
BUMPED = "2.27.8"
DEFAULT_DIR = Path("/var/cache/rigbook/artifacts")
SOURCE = f"rccl-standin-{VERSION}.tar.gz"
BUMPED_SOURCE = f"rccl-standin-{BUMPED}-bumped.tar.gz"
TESTS = f"rccl-tests-standin-{VERSION}.tar.gz"
# What the bump changes: the lines the patch's first hunk needs as context.
BUMP_FROM = "  // User override\n  NCCLCHECK(ncclGetUserP2pLevel(&p2pLevel));\n"
BUMP_TO = ("  // User override (NCCL_P2P_LEVEL / NCCL_P2P_DISABLE), cached per process\n"
           "  NCCLCHECK(ncclGetUserP2pLevel(&p2pLevel));\n")


def _packing():
    """pack.py beside this file (the one tarball writer of the stand-ins), loaded by path: the lab loads this file
    by path too."""
    spec = importlib.util.spec_from_file_location("rigbook_standin_pack", HERE / "pack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_files = _packing().tree_files
tarball_bytes = _packing().tarball_bytes


def bumped_files() -> dict:
    files = _files(HERE / "rccl-standin")
    paths = files["src/graph/paths.cc"].decode()
    assert paths.count(BUMP_FROM) == 1, "the stand-in's paths.cc no longer holds the lines the bump rewords"
    files["src/graph/paths.cc"] = paths.replace(BUMP_FROM, BUMP_TO).encode()
    cmake = files["CMakeLists.txt"]
    files["CMakeLists.txt"] = cmake.replace(f"VERSION {VERSION}".encode(), f"VERSION {BUMPED}".encode())
    return files


def artifacts() -> dict:
    """{file name: bytes} of the three tarballs."""
    return {
        SOURCE: tarball_bytes(f"rccl-{VERSION}", _files(HERE / "rccl-standin")),
        BUMPED_SOURCE: tarball_bytes(f"rccl-{BUMPED}", bumped_files()),
        TESTS: tarball_bytes(f"rccl-tests-{VERSION}", _packing().perf_standin_files(HERE / "rccl-tests-standin")),
    }


def pack(dest: Path = DEFAULT_DIR) -> dict:
    """Write the tarballs into DEST; return {file name: sha256}."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, data in artifacts().items():
        (dest / name).write_bytes(data)
        out[name] = hashlib.sha256(data).hexdigest()
    return out


if __name__ == "__main__":
    for name, digest in pack(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR).items():
        print(f"{digest}  {name}")
