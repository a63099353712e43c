"""`provision verify --replay` on hostile input: crafted tarballs and folders that lead out of the replay.

Each must exit 2 with one clear line (no traceback), judge nothing, and leave tmp_path as it was: nothing written
outside the replay's temporary folder (TMPDIR points into tmp_path, so the temporary folder is seen too, and must
be gone). The patterns themselves are module_utils/safe_untar.py's suite
(tests/unit/plugins/module_utils/test_safe_untar.py); these are the command's use of it."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers.cli import tree_listing

from rigbook.snapshots import EVIDENCE_MAX_BYTES

VIEW = json.dumps({"gpu": {"vendor": "nvidia", "count": 1}}).encode()


def replay(path: Path, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigbook", "verify", "--replay", str(path), "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp)})


@pytest.fixture
def scene(tmp_path):
    """tmp_path/tmp (the replay's TMPDIR, empty) and tmp_path/outside/keep."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("keep\n")
    return tmp_path


def refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --replay "), proc.stderr
    for word in words:
        assert word in lines[0], proc.stderr


# --- crafted tarballs --------------------------------------------------------------------------------------------


def _info(name, kind=tarfile.REGTYPE, target=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _host(*members):
    """A snapshot's host h200: its ladder view, then MEMBERS [(TarInfo, data or None)]."""
    view = _info("h200/ladder_view.json")
    view.size = len(VIEW)
    return [(_info("h200", tarfile.DIRTYPE), None), (view, VIEW), *members]


def _file(name, data=b"x\n"):
    info = _info(name)
    info.size = len(data)
    return info, data


def _cve_2025_4517(scene):
    """The CVE-2025-4517 pattern (see test_safe_untar.cve_2025_4517), sized for the replay's temporary folder."""
    room = len(str(scene / "tmp" / "rigbook-replay-xxxxxxxx"))
    comp = "d" * min(254, (4096 - room - 2) // 16 - 1)
    steps = "abcdefghijklmnop"
    members, deep = [], ""
    for step in steps:
        members += [(_info(os.path.join(deep, comp), tarfile.DIRTYPE), None),
                    (_info(os.path.join(deep, step), tarfile.SYMTYPE, comp), None)]
        deep = os.path.join(deep, comp)
    link = "/".join(steps) + "/" + "l" * 254
    escape = "/".join([".."] * 3) + "/outside"  # from tmp/rigbook-replay-*: up to tmp_path
    members += [(_info(link, tarfile.SYMTYPE, "/".join([".."] * len(steps))), None),
                (_info("escape", tarfile.SYMTYPE, link + "/" + escape), None), _file("escape/pwned")]
    return members


CRAFTED = {
    "absolute-name": (lambda scene: _host(_file(str(scene / "outside" / "abs"))), "is an absolute path"),
    "dotdot": (lambda scene: _host(_file("h200/../../outside/up")), "has a '..' component"),
    "tree-links-to-root": (lambda scene: _host((_info("h200/tree", tarfile.SYMTYPE, "/"), None)),
                           "member 'h200/tree' is a symlink to '/', an absolute path"),
    "tree-climbs-out": (lambda scene: _host((_info("h200/tree", tarfile.SYMTYPE, "../../.."), None)),
                        "member 'h200/tree' is a symlink to '../../..', which leads out of the folder"),
    "chain-x-dot": (lambda scene: _host((_info("h200/x", tarfile.SYMTYPE, "."), None),
                                        (_info("h200/x/y", tarfile.SYMTYPE, "../../../outside"), None),
                                        _file("h200/x/y/pwned")),
                    "member 'h200/x/y' lies under the symlink 'h200/x'"),
    "cve-2025-4517": (lambda scene: _host(*_cve_2025_4517(scene)), "lies under the symlink 'a'"),
    "under-a-symlinked-folder": (lambda scene: _host((_info("h200/real", tarfile.DIRTYPE), None),
                                                     (_info("h200/tree", tarfile.SYMTYPE, "real"), None),
                                                     _file("h200/tree/etc/os-release")),
                                 "member 'h200/tree/etc/os-release' lies under the symlink 'h200/tree'"),
    "hard-link-out": (lambda scene: _host((_info("h200/tree/keep", tarfile.LNKTYPE, str(scene / "outside" / "keep")),
                                           None)), "is a hard link to"),
    "hard-link-to-a-non-member": (lambda scene: _host((_info("h200/tree/keep", tarfile.LNKTYPE, "h200/nothing"),
                                                       None)), "which is not an earlier file of the archive"),
    "device": (lambda scene: _host((_info("h200/tree/dev/mem", tarfile.CHRTYPE), None)), "is a device node"),
    "fifo": (lambda scene: _host((_info("h200/tree/fifo", tarfile.FIFOTYPE), None)), "is a FIFO"),
    "ladder-view-links-out": (lambda scene: [(_info("h200/ladder_view.json", tarfile.SYMTYPE, "/etc/passwd"), None),
                                             (_info("h200/tree", tarfile.DIRTYPE), None)], "an absolute path"),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_a_crafted_tarball_exits_2_and_writes_nothing_outside(scene, kind):
    build, words = CRAFTED[kind]
    archive = scene / f"{kind}.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in build(scene):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    before = tree_listing(scene)
    proc = replay(archive, scene / "tmp")
    refused(proc, f"error: --replay {archive}: refused: ", words)
    assert tree_listing(scene) == before  # tmp/ is empty again: no rigbook-replay-* left


def test_a_tarball_that_declares_3_gib_in_a_few_bytes_exits_2(scene):
    info = _info("h200/tree/huge")
    info.size = 3 << 30  # the header of a 3 MB gzip that unpacks to 3 GiB; here the stream ends after it
    archive = scene / "bomb.tar"
    archive.write_bytes(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + bytes(4096))
    before = tree_listing(scene)
    refused(replay(archive, scene / "tmp"), "member 'h200/tree/huge' brings the archive's files over the cap of")
    assert tree_listing(scene) == before


def test_a_gzip_that_expands_past_the_cap_exits_2(scene):
    # one member of 1 MiB of zeros over the cap, as concatenated gzip members (one compressed MiB of zeros used
    # again and again): a few hundred kilobytes on disk
    members = EVIDENCE_MAX_BYTES // (1 << 20) + 1
    zeros = gzip.compress(bytes(1 << 20))
    with open(scene / "zeros.tar.gz", "wb") as out:
        for n in range(members):
            info = _info(f"h200/tree/z{n}")
            info.size = 1 << 20
            out.write(gzip.compress(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")) + zeros)
        out.write(gzip.compress(bytes(1024)))
    assert (scene / "zeros.tar.gz").stat().st_size < 1 << 20
    before = tree_listing(scene)
    refused(replay(scene / "zeros.tar.gz", scene / "tmp"),
            f"member 'h200/tree/z{members - 1}' brings the archive's files over the cap of {EVIDENCE_MAX_BYTES} bytes")
    assert tree_listing(scene) == before


# --- crafted folders ---------------------------------------------------------------------------------------------


def _folder(scene):
    host = scene / "snap" / "h200"
    host.mkdir(parents=True)
    (host / "ladder_view.json").write_bytes(VIEW)
    return host


def test_a_folder_whose_tree_links_to_root_exits_2_before_any_judge(scene):
    host = _folder(scene)
    (host / "tree").symlink_to("/")
    before = tree_listing(scene)
    refused(replay(scene / "snap", scene / "tmp"), "h200/tree leads out of the replay folder (to /)",
            "nothing was judged")
    assert tree_listing(scene) == before


def test_a_folder_whose_tree_climbs_out_exits_2(scene):
    host = _folder(scene)
    (scene / "outside" / "tree").mkdir()
    (host / "tree").symlink_to("../../outside/tree")
    refused(replay(scene / "snap", scene / "tmp"), "h200/tree leads out of the replay folder")


def test_a_folder_whose_ladder_view_links_out_exits_2(scene):
    host = _folder(scene)
    (host / "tree").mkdir()
    (host / "ladder_view.json").unlink()
    (scene / "outside" / "view.json").write_bytes(VIEW)
    (host / "ladder_view.json").symlink_to(scene / "outside" / "view.json")
    refused(replay(scene / "snap", scene / "tmp"), "h200/ladder_view.json leads out of the replay folder")


def test_a_folder_with_a_link_in_its_tree_to_the_live_host_exits_2(scene):
    host = _folder(scene)
    (host / "tree" / "etc").mkdir(parents=True)
    (host / "tree" / "etc" / "os-release").symlink_to("/etc/os-release")
    refused(replay(scene / "snap", scene / "tmp"), "h200/tree/etc/os-release leads out of the replay folder")


def test_a_single_host_folder_whose_tree_links_to_root_exits_2(scene):
    (scene / "snap").mkdir()
    (scene / "snap" / "tree").symlink_to("/")
    refused(replay(scene / "snap", scene / "tmp"), "tree leads out of the replay folder (to /)")


def test_a_ladder_view_that_is_not_json_exits_2(scene):
    host = _folder(scene)
    (host / "tree").mkdir()
    (host / "ladder_view.json").write_text("{not json")
    refused(replay(scene / "snap", scene / "tmp"), "ladder_view.json: not a ladder view")
