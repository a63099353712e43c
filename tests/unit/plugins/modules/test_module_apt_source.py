"""apt_source in-process: the key checked by sha256, the deb822 source, the preferences, apt-get update only when
the source or key changed, a failed update rolled back; the exact commands, check and diff mode."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import apt_source
from helpers.modules import fail, ok, run_module

ARMORED = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEtest\n-----END PGP PUBLIC KEY BLOCK-----\n"
UPDATE = ["apt-get", "-q", "update"]
PREFS = [{"package": "rocm-core rocminfo", "pin": "version *.70100-*", "priority": 1001},
         {"package": "amdgpu-dkms", "pin": "version *", "priority": -1}]


@pytest.fixture
def etc(tmp_path, monkeypatch):
    for name in ("SOURCES_DIR", "KEYRINGS_DIR", "PREFERENCES_DIR"):
        monkeypatch.setattr(apt_source, name, str(tmp_path / name.lower()))
    key = tmp_path / "repo" / "rocm.gpg.key"
    key.parent.mkdir()
    key.write_bytes(ARMORED)
    return tmp_path


def args(etc, **kw):
    return {"name": "rocm", "uris": "file:///srv/rocm-repo", "suites": ["noble"], "components": ["main"],
            "key_url": f"file://{etc / 'repo' / 'rocm.gpg.key'}", "key_sha256": hashlib.sha256(ARMORED).hexdigest(),
            "preferences": PREFS, **kw}


def test_first_run_writes_key_source_preferences_then_updates_once(etc):
    run = run_module(apt_source, args(etc), [(UPDATE, ok("Hit:1 file:/srv/rocm-repo noble InRelease\n"))])
    assert not run.failed, run.msg
    keyring = str(etc / "keyrings_dir" / "rigbook-rocm.asc")
    assert run.result["changed"] is True and run.result["updated"] is True and run.result["keyring"] == keyring
    source = (etc / "sources_dir" / "rigbook-rocm.sources").read_text()
    assert source.splitlines()[1:] == ["Types: deb", "URIs: file:///srv/rocm-repo", "Suites: noble", "Components: main",
                                       f"Signed-By: {keyring}"]
    assert Path(keyring).read_bytes() == ARMORED
    prefs = (etc / "preferences_dir" / "rigbook-rocm").read_text()
    assert "Package: rocm-core rocminfo\nPin: version *.70100-*\nPin-Priority: 1001\n" in prefs
    assert "Package: amdgpu-dkms\nPin: version *\nPin-Priority: -1\n" in prefs
    # converged: no command at all
    again = run_module(apt_source, args(etc))
    assert again.result["changed"] is False and again.commands == [] and again.result["updated"] is False


def test_a_binary_key_is_a_gpg_keyring(etc):
    (etc / "repo" / "rocm.gpg.key").write_bytes(b"\x99\x01binary")
    run = run_module(apt_source, args(etc, key_sha256=hashlib.sha256(b"\x99\x01binary").hexdigest()), [(UPDATE, ok())])
    assert run.result["keyring"].endswith("rigbook-rocm.gpg")


def test_a_wrong_key_sha256_is_refused_in_check_mode_too_and_nothing_is_written(etc):
    for check in (False, True):
        run = run_module(apt_source, args(etc, key_sha256="0" * 64), check_mode=check)
        assert run.failed and "refused signing key" in run.msg and "pinned " + "0" * 64 in run.msg
    assert not (etc / "sources_dir").exists() and not (etc / "keyrings_dir").exists()


def test_only_a_preferences_change_runs_no_update(etc):
    run_module(apt_source, args(etc), [(UPDATE, ok())])
    run = run_module(apt_source, args(etc, preferences=PREFS[:1]))
    assert run.result["changed"] is True and run.commands == [] and run.result["files"] == [
        str(etc / "preferences_dir" / "rigbook-rocm")]


def test_a_failed_update_removes_the_new_source(etc):
    run = run_module(apt_source, args(etc), [(UPDATE, fail(100, "E: The repository 'file:/srv/rocm-repo noble "
                                                                 "Release' is not signed."))])
    assert run.failed and "apt-get update failed for the rocm repository" in run.msg and "is not signed" in run.msg
    assert not (etc / "sources_dir" / "rigbook-rocm.sources").exists()


def test_check_mode_writes_nothing_and_diff_shows_each_file(etc):
    run = run_module(apt_source, args(etc), check_mode=True, diff=True)
    assert run.result["changed"] is True and run.commands == []
    assert not (etc / "sources_dir").exists()
    headers = [d["after_header"] for d in run.result["diff"]]
    assert headers == [str(etc / "keyrings_dir" / "rigbook-rocm.asc"),
                       str(etc / "sources_dir" / "rigbook-rocm.sources"), str(etc / "preferences_dir" / "rigbook-rocm")]
    assert "Signed-By:" in run.result["diff"][1]["after"]


def test_preferences_alone_without_a_repository(etc):
    run = run_module(apt_source, {"name": "rocm", "preferences": PREFS})
    assert run.result["changed"] is True and run.commands == [] and run.result["keyring"] is None
    assert not (etc / "sources_dir").exists()


def test_a_changed_key_is_rewritten_and_diffed_by_its_sha256(etc):
    run_module(apt_source, args(etc), [(UPDATE, ok())])
    other = ARMORED.replace(b"mDMEtest", b"mDMEnext")
    (etc / "repo" / "rocm.gpg.key").write_bytes(other)
    run = run_module(apt_source, args(etc, key_sha256=hashlib.sha256(other).hexdigest()), [(UPDATE, ok())], diff=True)
    keyring = etc / "keyrings_dir" / "rigbook-rocm.asc"
    assert run.result["files"] == [str(keyring)] and keyring.read_bytes() == other
    assert run.result["diff"][0]["before"] == f"(key of sha256 {hashlib.sha256(ARMORED).hexdigest()})\n"
    assert run.result["diff"][0]["after"] == f"({len(other)} bytes of key)\n"
