"""facts/libraries.py: which mapped library is NCCL or RCCL (decided here alone), and a deleted mapping's digest."""

from __future__ import annotations

import hashlib

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import libraries

# Lines of /proc/PID/maps of an SGLang engine (the layout of a real maps file; paths from the lab's venv). The
# RCCL line is the relinked library replaced under the engine: the kernel marks it (deleted).
MAPS = """55d4c9a00000-55d4c9a01000 r--p 00000000 08:02 131 /opt/rigbook/sglang/v/bin/python3.12
7f1c20000000-7f1c24000000 r-xp 00000000 08:02 901 /opt/rigbook/rccl/current/lib/librccl.so.1 (deleted)
7f1c24000000-7f1c24100000 r--p 04000000 08:02 901 /opt/rigbook/rccl/current/lib/librccl.so.1 (deleted)
7f1c30000000-7f1c30001000 r-xp 00000000 08:02 77 /opt/rigbook/sglang/v/lib/site-packages/torch/lib/libamdhip64.so
7f1c31000000-7f1c31001000 rw-p 00000000 00:00 0 [heap]
7f1c32000000-7f1c32001000 r-xp 00000000 00:00 0
"""


def test_collective_kind_names_nccl_and_rccl_also_a_kept_bundled_copy():
    assert libraries.collective_kind("/x/nvidia/nccl/lib/libnccl.so.2") == "nccl"
    assert libraries.collective_kind("/opt/rocm/lib/librccl.so.1.0") == "rccl"
    assert libraries.collective_kind("/v/torch/lib/librccl.so.1.rigbook-bundled") == "rccl"
    assert libraries.collective_kind("/v/torch/lib/librccl.so.1 (deleted)") == "rccl"
    for other in ("/v/torch/lib/libamdhip64.so", "/x/libnccl-net.so", None, ""):
        assert libraries.collective_kind(other) is None
    assert libraries.is_collectives("libnccl.so") and not libraries.is_collectives("libcudart.so.12")


def test_parse_maps_lists_each_file_once_and_marks_the_deleted():
    mapped = libraries.parse_maps(MAPS)
    assert [m["path"] for m in mapped] == ["/opt/rigbook/sglang/v/bin/python3.12",
                                           "/opt/rigbook/rccl/current/lib/librccl.so.1",
                                           "/opt/rigbook/sglang/v/lib/site-packages/torch/lib/libamdhip64.so"]
    assert mapped[1] == {"path": "/opt/rigbook/rccl/current/lib/librccl.so.1", "range": "7f1c20000000-7f1c24000000",
                         "deleted": True}
    assert not mapped[0]["deleted"]


def test_a_deleted_mapping_is_read_through_map_files_never_its_old_name(tmp_path):
    old_name = tmp_path / "opt" / "rigbook" / "rccl" / "current" / "lib"
    old_name.mkdir(parents=True)
    (old_name / "librccl.so.1").write_bytes(b"the new build now under the old name")
    mapping = libraries.parse_maps(MAPS)[1]
    sha, why = libraries.mapping_digest(str(tmp_path), 4242, mapping)
    assert sha is None and "deleted after it was mapped" in why  # no map_files here: unknown, not the new file
    map_files = tmp_path / "proc" / "4242" / "map_files"
    map_files.mkdir(parents=True)
    (map_files / "7f1c20000000-7f1c24000000").write_bytes(b"the library the engine really runs")
    sha, why = libraries.mapping_digest(str(tmp_path), 4242, mapping)
    assert why is None and sha == hashlib.sha256(b"the library the engine really runs").hexdigest()


def test_a_live_mapping_is_hashed_by_its_path_under_the_root(tmp_path):
    lib = tmp_path / "opt" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"nccl")
    sha, why = libraries.mapping_digest(str(tmp_path), 1, {"path": "/opt/lib/libnccl.so.2", "deleted": False})
    assert why is None and sha == hashlib.sha256(b"nccl").hexdigest()


def test_read_maps_under_a_recorded_root(tmp_path):
    (tmp_path / "proc" / "7").mkdir(parents=True)
    (tmp_path / "proc" / "7" / "maps").write_text(MAPS)
    assert libraries.read_maps(str(tmp_path), 7) == MAPS
    assert libraries.read_maps(str(tmp_path), 8) is None
