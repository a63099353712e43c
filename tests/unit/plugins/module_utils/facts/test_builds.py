"""facts/builds.py: stamps and group-build archive names, one writer and one parser."""

from __future__ import annotations

import fnmatch

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
