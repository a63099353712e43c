"""facts/builds.py: stamps and group-build archive names, one writer and one parser."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import tarfile

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds

SHA = "3f" * 32
IDENTITY = "0123456789abcdef"


def test_archive_name_round_trips_through_its_parser_also_with_dashes_in_the_name():
    for name in ("rccl", "nccl-tests", "nvidia", "open-gpu-kernel-modules"):
        written = builds.archive_name(name, IDENTITY, SHA)
        assert builds.parse_archive_name(written) == {"name": name, "identity_id": IDENTITY, "sha256": SHA}
        assert builds.parse_archive_name("/var/lib/rigbook/builds/" + written)["name"] == name
        assert fnmatch.fnmatch(written, builds.archive_glob(name, IDENTITY))


def test_archive_name_refuses_parts_of_another_shape():
    for name, identity, sha in (("../x", IDENTITY, SHA), ("rccl", "short", SHA), ("rccl", IDENTITY, "A" * 64),
                                ("", IDENTITY, SHA), ("r cl", IDENTITY, SHA)):
        with pytest.raises(ValueError):
            builds.archive_name(name, identity, sha)


def test_parse_archive_name_refuses_what_is_not_an_archive_name():
    for bad in ("rccl.tar.gz", f"rccl-{SHA}.tar.gz", f"rccl-{IDENTITY}-{SHA}.tar",
                f"rccl-{IDENTITY}-{SHA}.tar.gz.part", f"-{IDENTITY}-{SHA}.tar.gz", None):
        assert builds.parse_archive_name(bad) is None


def test_read_stamp_tells_missing_from_garbled(tmp_path):
    assert builds.read_stamp(str(tmp_path / builds.BUILD_STAMP)) == (None, None)
    assert builds.write_stamp(str(tmp_path / builds.BUILD_STAMP), {"name": "rccl", "files": {}}) is None
    assert builds.read_stamp(str(tmp_path / builds.BUILD_STAMP)) == ({"files": {}, "name": "rccl"}, None)
    (tmp_path / "list.json").write_text("[1, 2]")
    stamp, why = builds.read_stamp(str(tmp_path / "list.json"))
    assert stamp is None and "not a JSON object" in why
    (tmp_path / "big.json").write_text('{"x": "%s"}' % ("y" * builds.MAX_STAMP))
    stamp, why = builds.read_stamp(str(tmp_path / "big.json"))
    assert stamp is None and "larger than" in why


# --- provenance record names -----------------------------------------------------------------------------------


def test_provenance_name_round_trips_through_its_parser_with_the_key_of_its_inventory_and_group():
    key = builds.provenance_key("inventories/lab.yml", "r9700_twins")
    assert len(key) == 16 and all(c in "0123456789abcdef" for c in key)
    assert key != builds.provenance_key("inventories/lab.yml", "r9700") != builds.provenance_key("other.yml",
                                                                                                  "r9700_twins")
    assert builds.provenance_key("inventories/lab.yml", "r9700_twins") == key  # the same boxes, the same key
    for name in ("rccl", "nccl-tests", "open-gpu-kernel-modules"):
        archive = builds.archive_name(name, IDENTITY, SHA)
        record = builds.provenance_name("/srv/builds/" + archive, key)
        assert record == f"{name}-{IDENTITY}-{SHA}.provenance-{key}.json"
        assert builds.parse_provenance_name(record) == {"archive": archive, "name": name, "identity_id": IDENTITY,
                                                        "sha256": SHA, "key": key}
        assert builds.parse_provenance_name("/srv/builds/" + record)["archive"] == archive
        assert fnmatch.fnmatch(record, builds.provenance_glob(name))
        assert not fnmatch.fnmatch(archive, builds.provenance_glob(name))


def test_a_provenance_glob_of_a_shorter_name_is_told_apart_by_the_parser():
    key = builds.provenance_key("inv", "g")
    record = builds.provenance_name(builds.archive_name("nccl-tests", IDENTITY, SHA), key)
    assert fnmatch.fnmatch(record, builds.provenance_glob("nccl"))  # the glob of "nccl" matches it too
    assert builds.parse_provenance_name(record)["name"] == "nccl-tests"


def test_provenance_name_refuses_what_is_not_an_archive_or_a_key():
    archive = builds.archive_name("rccl", IDENTITY, SHA)
    for bad_archive, key in (("rccl.tar.gz", IDENTITY), (archive, "short"), (archive, "A" * 16), (archive, None),
                             (archive, IDENTITY + "/.."), (f"../{archive}.part", IDENTITY)):
        with pytest.raises(ValueError):
            builds.provenance_name(bad_archive, key)


def test_parse_provenance_name_refuses_what_is_not_a_provenance_record():
    stem = f"rccl-{IDENTITY}-{SHA}"
    for bad in (f"{stem}.tar.gz", f"{stem}.provenance-{IDENTITY}.json.tmp", f"{stem}.provenance-short.json",
                f"{stem}.provenance-{IDENTITY.upper()}.json", f"rccl-{SHA}.provenance-{IDENTITY}.json",
                f"{stem}.tar.gz.provenance-{IDENTITY}.json", "", None):
        assert builds.parse_provenance_name(bad) is None


# --- pack: the same bytes for the same files -------------------------------------------------------------------


def _tree(folder, mtime, owner):
    """A build's files under FOLDER: a library (0640), a tool (0750, setuid), a header (0600), all with MTIME and
    OWNER (uid and gid)."""
    (folder / "lib").mkdir(parents=True)
    (folder / "bin").mkdir()
    for rel, data, mode in (("lib/librccl.so.1.0", b"\x7fELF library", 0o640), ("bin/all_reduce_perf", b"tool", 0o4750),
                            ("include/rccl.h", b"#define RCCL 1\n", 0o600)):
        path = folder / rel
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        os.chown(path, owner, owner)
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))
    return [("rccl/lib/librccl.so.1.0", "file", str(folder / "lib/librccl.so.1.0")),
            ("rccl/bin/all_reduce_perf", "file", str(folder / "bin/all_reduce_perf")),
            ("rccl/include/rccl.h", "file", str(folder / "include/rccl.h")),
            ("rccl/lib/librccl.so.1", "symlink", "librccl.so.1.0"),
            ("rccl", "folder", None),
            ("rccl/.rigbook-build.json", "bytes", b'{"name": "rccl"}\n')]


def test_pack_gives_the_same_bytes_whenever_wherever_and_whoever_owns_the_files(tmp_path):
    first = builds.pack(_tree(tmp_path / "a", 1_700_000_000, 0))
    assert builds.pack(_tree(tmp_path / "a2", 1_700_000_000, 0)) == first  # a second call, another folder
    later = _tree(tmp_path / "b", 1_800_000_123, 4242)  # other times, another owner
    assert builds.pack(later) == first
    assert builds.pack(list(reversed(later))) == first  # in whatever order the entries come
    (tmp_path / "b/include/rccl.h").write_bytes(b"#define RCCL 2\n")
    assert builds.pack(later) != first  # the bytes do follow the files' content


def test_pack_sorts_members_and_normalises_times_owners_and_modes(tmp_path):
    data = builds.pack(_tree(tmp_path / "a", 1_700_000_000, 4242))
    assert data[4:8] == bytes(4) and not data[3] & 0x08  # gzip: no time (MTIME 0), no file name (FNAME unset)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names) == ["rccl", "rccl/.rigbook-build.json", "rccl/bin/all_reduce_perf",
                                          "rccl/include/rccl.h", "rccl/lib/librccl.so.1", "rccl/lib/librccl.so.1.0"]
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "root", "root")}
        modes = {m.name: m.mode for m in members}
        assert modes == {"rccl": 0o755, "rccl/.rigbook-build.json": 0o644,
                         "rccl/bin/all_reduce_perf": 0o755,  # an execute bit: 0755, the setuid bit gone
                         "rccl/include/rccl.h": 0o644, "rccl/lib/librccl.so.1": 0o777,
                         "rccl/lib/librccl.so.1.0": 0o644}  # 0640 and 0600: 0644
        kinds = {m.name: (m.isdir(), m.issym(), m.isreg()) for m in members}
        assert kinds["rccl"] == (True, False, False) and kinds["rccl/lib/librccl.so.1"] == (False, True, False)
        assert tar.getmember("rccl/lib/librccl.so.1").linkname == "librccl.so.1.0"
        assert tar.extractfile("rccl/lib/librccl.so.1.0").read() == b"\x7fELF library"
        assert tar.extractfile("rccl/.rigbook-build.json").read() == b'{"name": "rccl"}\n'


# --- stamps read without following a link ----------------------------------------------------------------------


def test_read_stamp_nofollow_is_read_stamp_with_no_link_followed(tmp_path):
    system = tmp_path / "system"
    venv = system / "opt/v"
    venv.mkdir(parents=True)
    rel = "/opt/v/" + builds.VENV_STAMP
    assert builds.read_stamp_nofollow(str(system), rel, 0) == (None, None)
    (venv / builds.VENV_STAMP).write_text('{"patches": []}')
    assert builds.read_stamp_nofollow(str(system), rel, 0) == ({"patches": []}, None)
    for shape in ("[1, 2]", '"a string"', "3"):
        (venv / builds.VENV_STAMP).write_text(shape)
        assert builds.read_stamp_nofollow(str(system), rel, 0) == (None, rel + " is not a JSON object"), shape
        assert builds.read_stamp(str(venv / builds.VENV_STAMP))[1].endswith(" is not a JSON object"), shape
    (venv / builds.VENV_STAMP).write_text("{garbled")
    assert "is not JSON" in builds.read_stamp_nofollow(str(system), rel, 0)[1]
    (venv / builds.VENV_STAMP).write_text('{"x": "%s"}' % ("y" * builds.MAX_STAMP))
    assert "larger than" in builds.read_stamp_nofollow(str(system), rel, 0)[1]


def test_read_stamp_nofollow_refuses_a_link_and_a_file_its_owner_could_not_read(tmp_path):
    system = tmp_path / "system"
    (system / "opt/v").mkdir(parents=True)
    (system / "root").mkdir()
    secret = system / "root/secret.json"
    secret.write_text('{"secret": "hunter2"}')
    os.chmod(secret, 0o600)
    rel = "/opt/v/" + builds.VENV_STAMP
    (system / "opt/v" / builds.VENV_STAMP).symlink_to(secret)
    assert builds.read_stamp_nofollow(str(system), rel, 990) == (None, rel + ": a symbolic link on the way (not read)")
    (system / "opt/v" / builds.VENV_STAMP).unlink()
    os.link(secret, system / "opt/v" / builds.VENV_STAMP)  # a hard link to root's file, read as uid 990
    stamp, why = builds.read_stamp_nofollow(str(system), rel, 990)
    assert stamp is None and "cannot read" in why
    assert builds.read_stamp_nofollow(str(system), rel, 0) == ({"secret": "hunter2"}, None)  # root's own view
    (system / "opt/v" / builds.VENV_STAMP).unlink()
    os.rename(system / "opt/v", system / "opt/real")
    (system / "opt/real" / builds.VENV_STAMP).write_text("{}")
    (system / "opt/v").symlink_to("real")  # a link on the way
    assert builds.read_stamp_nofollow(str(system), rel, 0) == (None, rel + ": a symbolic link on the way (not read)")


def test_manifest_problem_names_an_extra_a_missing_and_a_changed_file(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib/a.so").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in (("lib/a.so", b"a"), ("b", b"b"))}
    assert builds.manifest_problem(str(tmp_path), ["lib/a.so", "b"], sha) is None
    assert builds.manifest_problem(str(tmp_path), ["lib/a.so", "b"], {"lib/a.so": sha["lib/a.so"]}) == (
        "b is in it but not in the controller's manifest of it")
    assert builds.manifest_problem(str(tmp_path), ["b"], sha) == "lib/a.so of the controller's manifest is not in it"
    (tmp_path / "b").write_bytes(b"not b")
    assert builds.manifest_problem(str(tmp_path), ["lib/a.so", "b"], sha) == (
        "b is not the file the controller's manifest names (its sha256 differs)")
