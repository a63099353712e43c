"""apt_source in-process: the key checked by sha256, the deb822 source, the preferences, apt-get update only when
the source or key changed, a failed update rolled back; the exact commands, check and diff mode. Every file is under
a fake root (apt_source.ROOT)."""

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
KEYRING = "/etc/apt/keyrings/rigbook-rocm.asc"
SOURCE = "/etc/apt/sources.list.d/rigbook-rocm.sources"
PREFERENCES = "/etc/apt/preferences.d/rigbook-rocm"


@pytest.fixture
def etc(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setattr(apt_source, "ROOT", str(root))
    key = tmp_path / "repo" / "rocm.gpg.key"
    key.parent.mkdir()
    key.write_bytes(ARMORED)
    return tmp_path


def on_root(etc, box_path: str) -> Path:
    return etc / "root" / box_path.lstrip("/")


def args(etc, **kw):
    return {"name": "rocm", "uris": "file:///srv/rocm-repo", "suites": ["noble"], "components": ["main"],
            "key_url": f"file://{etc / 'repo' / 'rocm.gpg.key'}", "key_sha256": hashlib.sha256(ARMORED).hexdigest(),
            "preferences": PREFS, **kw}


def test_first_run_writes_key_source_preferences_then_updates_once(etc):
    run = run_module(apt_source, args(etc), [(UPDATE, ok("Hit:1 file:/srv/rocm-repo noble InRelease\n"))])
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["updated"] is True and run.result["keyring"] == KEYRING
    assert run.result["disabled"] == []
    source = on_root(etc, SOURCE).read_text()
    assert source.splitlines()[1:] == ["Types: deb", "URIs: file:///srv/rocm-repo", "Suites: noble", "Components: main",
                                       f"Signed-By: {KEYRING}"]
    assert on_root(etc, KEYRING).read_bytes() == ARMORED
    prefs = on_root(etc, PREFERENCES).read_text()
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
    assert not (etc / "root" / "etc").exists()


def test_only_a_preferences_change_runs_no_update(etc):
    run_module(apt_source, args(etc), [(UPDATE, ok())])
    run = run_module(apt_source, args(etc, preferences=PREFS[:1]))
    assert run.result["changed"] is True and run.commands == [] and run.result["files"] == [PREFERENCES]


def test_a_failed_update_removes_the_new_source(etc):
    run = run_module(apt_source, args(etc), [(UPDATE, fail(100, "E: The repository 'file:/srv/rocm-repo noble "
                                                                 "Release' is not signed."))])
    assert run.failed and "apt-get update failed for the rocm repository" in run.msg and "is not signed" in run.msg
    assert not on_root(etc, SOURCE).exists()


def test_check_mode_writes_nothing_and_diff_shows_each_file(etc):
    run = run_module(apt_source, args(etc), check_mode=True, diff=True)
    assert run.result["changed"] is True and run.commands == []
    assert not (etc / "root" / "etc").exists()
    headers = [d["after_header"] for d in run.result["diff"]]
    assert headers == [KEYRING, SOURCE, PREFERENCES]
    assert "Signed-By:" in run.result["diff"][1]["after"]


def test_preferences_alone_without_a_repository(etc):
    run = run_module(apt_source, {"name": "rocm", "preferences": PREFS})
    assert run.result["changed"] is True and run.commands == [] and run.result["keyring"] is None
    assert not on_root(etc, SOURCE).parent.exists()


def test_a_changed_key_is_rewritten_and_diffed_by_its_sha256(etc):
    run_module(apt_source, args(etc), [(UPDATE, ok())])
    other = ARMORED.replace(b"mDMEtest", b"mDMEnext")
    (etc / "repo" / "rocm.gpg.key").write_bytes(other)
    run = run_module(apt_source, args(etc, key_sha256=hashlib.sha256(other).hexdigest()), [(UPDATE, ok())], diff=True)
    assert run.result["files"] == [KEYRING] and on_root(etc, KEYRING).read_bytes() == other
    assert run.result["diff"][0]["before"] == f"(key of sha256 {hashlib.sha256(ARMORED).hexdigest()})\n"
    assert run.result["diff"][0]["after"] == f"({len(other)} bytes of key)\n"


# --- another source of the same repository (seed 004: amdgpu-install's rocm.list and amdgpu.list) -----------------

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "apt"
ROCM_URI = "https://repo.radeon.com/rocm/apt/7.1"
AMDGPU_URI = "https://repo.radeon.com/amdgpu/7.1/ubuntu"
LISTS = "/etc/apt/sources.list.d"


def amd(etc, uri=ROCM_URI, name="rocm", **kw):
    return args(etc, name=name, uris=uri, preferences=[], **kw)


def amdgpu_install(etc, *names):
    """amdgpu-install's sources (tests/fixtures/apt/SOURCES.md: reconstructed from AMD's Ubuntu instructions)."""
    for name in names:
        target = on_root(etc, f"{LISTS}/{name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((FIXTURES / name).read_text())


def test_amdgpu_installs_rocm_list_is_moved_aside_and_its_other_repository_left_alone(etc):
    amdgpu_install(etc, "rocm.list", "amdgpu.list")
    run = run_module(apt_source, amd(etc), [(UPDATE, ok())])
    assert not run.failed, run.msg
    (said,) = run.result["disabled"]
    assert said.startswith(f"disabled {LISTS}/rocm.list: same URI as rigbook's source, another Signed-By: apt refuses "
                           f"two ({ROCM_URI} noble, Signed-By /etc/apt/keyrings/rocm.gpg)")
    assert f"the file is kept as {LISTS}/rocm.list.rigbook.disabled" in said
    assert not on_root(etc, f"{LISTS}/rocm.list").exists()
    assert on_root(etc, f"{LISTS}/rocm.list.rigbook.disabled").read_text() == (FIXTURES / "rocm.list").read_text()
    assert on_root(etc, f"{LISTS}/amdgpu.list").read_text() == (FIXTURES / "amdgpu.list").read_text()
    assert run.result["files"] == [KEYRING, SOURCE, f"{LISTS}/rocm.list"] and run.commands == [UPDATE]
    # converged: nothing left to disable, no command
    again = run_module(apt_source, amd(etc))
    assert again.result["changed"] is False and again.result["disabled"] == [] and again.commands == []


def test_check_mode_says_what_it_would_disable_and_touches_nothing(etc):
    amdgpu_install(etc, "rocm.list")
    run = run_module(apt_source, amd(etc), check_mode=True, diff=True)
    assert run.result["changed"] is True and run.commands == []
    assert run.result["disabled"][0].startswith(f"would disable {LISTS}/rocm.list: same URI as rigbook's source, "
                                                "another Signed-By: apt refuses two")
    assert on_root(etc, f"{LISTS}/rocm.list").read_text() == (FIXTURES / "rocm.list").read_text()
    assert not on_root(etc, f"{LISTS}/rocm.list.rigbook.disabled").exists() and not on_root(etc, SOURCE).exists()
    moved = run.result["diff"][-1]
    assert (moved["before_header"], moved["after_header"]) == (f"{LISTS}/rocm.list",
                                                               f"{LISTS}/rocm.list.rigbook.disabled")


def test_the_graphics_source_disables_amdgpu_list(etc):
    amdgpu_install(etc, "rocm.list", "amdgpu.list")
    run = run_module(apt_source, amd(etc, uri=AMDGPU_URI, name="amdgpu"), [(UPDATE, ok())])
    assert [line.split(":")[0] for line in run.result["disabled"]] == [f"disabled {LISTS}/amdgpu.list"]
    assert on_root(etc, f"{LISTS}/rocm.list").exists()  # another repository


def test_in_a_file_with_other_entries_only_those_lines_are_commented_out_after_a_backup(etc):
    both = on_root(etc, f"{LISTS}/rocm.list")
    both.parent.mkdir(parents=True)
    original = ((FIXTURES / "rocm.list").read_text()
                + "deb [arch=amd64 signed-by=/etc/apt/keyrings/rocm.gpg] https://repo.radeon.com/graphics/7.1/ubuntu "
                  "noble main\n")
    both.write_text(original)
    run = run_module(apt_source, amd(etc), [(UPDATE, ok())])
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import apt_sources

    entries = apt_sources.parse_one_line(both.read_text())
    assert [(e["uris"][0], e["enabled"]) for e in entries] == [
        (ROCM_URI, False), ("https://repo.radeon.com/graphics/7.1/ubuntu", True)]
    assert "# Disabled by rigbook (rigbook.homelab.apt_source rocm): same URI as rigbook's source" in both.read_text()
    digest = hashlib.sha256(original.encode()).hexdigest()[:12]
    backup = f"/var/lib/rigbook/apt/backup/etc_apt_sources.list.d_rocm.list.{digest}"
    assert on_root(etc, backup).read_text() == original
    assert f"its entry commented out, the file first copied to {backup}" in run.result["disabled"][0]
    assert run_module(apt_source, amd(etc)).result["changed"] is False


def test_a_deb822_stanza_gets_enabled_no_and_the_others_stay(etc):
    deb822 = on_root(etc, f"{LISTS}/amd.sources")
    deb822.parent.mkdir(parents=True)
    deb822.write_text(f"Types: deb\nURIs: {ROCM_URI}/\nSuites: noble\nComponents: main\nEnabled: yes\n"
                      "Signed-By: /etc/apt/keyrings/rocm.gpg\n\n"
                      "Types: deb\nURIs: https://repo.radeon.com/graphics/7.1/ubuntu\nSuites: noble\nComponents: main\n"
                      "Signed-By: /etc/apt/keyrings/rocm.gpg\n")
    run_module(apt_source, amd(etc), [(UPDATE, ok())])
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import apt_sources

    assert [(e["uris"][0], e["enabled"]) for e in apt_sources.parse_deb822(deb822.read_text())] == [
        (f"{ROCM_URI}/", False), ("https://repo.radeon.com/graphics/7.1/ubuntu", True)]  # the trailing slash is one URI
    assert "Enabled: yes" not in deb822.read_text()


def test_the_main_sources_list_is_edited_never_moved(etc):
    main = on_root(etc, "/etc/apt/sources.list")
    main.parent.mkdir(parents=True)
    main.write_text("deb http://archive.ubuntu.com/ubuntu noble main\n" + (FIXTURES / "rocm.list").read_text())
    run = run_module(apt_source, amd(etc), [(UPDATE, ok())])
    assert main.exists() and run.result["disabled"][0].startswith("disabled /etc/apt/sources.list: ")
    assert main.read_text().splitlines()[0] == "deb http://archive.ubuntu.com/ubuntu noble main"


def test_another_suite_a_commented_entry_and_a_file_apt_ignores_are_left_alone(etc):
    lists = on_root(etc, LISTS)
    lists.mkdir(parents=True)
    (lists / "jammy.list").write_text(f"deb [signed-by=/etc/apt/keyrings/rocm.gpg] {ROCM_URI} jammy main\n")
    (lists / "old.list").write_text(f"# deb [signed-by=/etc/apt/keyrings/rocm.gpg] {ROCM_URI} noble main\n")
    (lists / "rocm.list.save").write_text((FIXTURES / "rocm.list").read_text())
    before = {p.name: p.read_text() for p in lists.iterdir()}
    run = run_module(apt_source, amd(etc), [(UPDATE, ok())])
    assert run.result["disabled"] == []
    assert {p.name: p.read_text() for p in lists.iterdir() if p.name != "rigbook-rocm.sources"} == before


def test_a_backup_name_in_use_is_never_overwritten(etc):
    amdgpu_install(etc, "rocm.list")
    on_root(etc, f"{LISTS}/rocm.list.rigbook.disabled").write_text("the owner's own\n")
    run = run_module(apt_source, amd(etc), [(UPDATE, ok())])
    assert f"kept as {LISTS}/rocm.list.rigbook-2.disabled" in run.result["disabled"][0]
    assert on_root(etc, f"{LISTS}/rocm.list.rigbook.disabled").read_text() == "the owner's own\n"


def test_a_failed_update_puts_every_disabled_source_back_and_names_apts_refusal(etc):
    """apt's Signed-By refusal (tests/fixtures/apt/SOURCES.md: reconstructed from apt's message) for an entry this
    module does not read: nothing half-configured stays, the refusal is named."""
    amdgpu_install(etc, "rocm.list")
    refusal = (FIXTURES / "apt-get-update-signed-by-conflict.txt").read_text()
    run = run_module(apt_source, amd(etc), [(UPDATE, fail(100, refusal))])
    assert run.failed and "Conflicting values set for option Signed-By regarding source" in run.msg
    assert f"apt refuses two entries of {ROCM_URI}/ noble with different Signed-By" in run.msg
    assert "the sources it disabled put back" in run.msg
    assert on_root(etc, f"{LISTS}/rocm.list").read_text() == (FIXTURES / "rocm.list").read_text()
    assert not on_root(etc, f"{LISTS}/rocm.list.rigbook.disabled").exists() and not on_root(etc, SOURCE).exists()


def test_a_source_file_that_is_a_link_is_not_written_through_and_nothing_stays_half_done(etc):
    real = etc / "elsewhere.list"
    real.write_text("deb http://archive.ubuntu.com/ubuntu noble main\n" + (FIXTURES / "rocm.list").read_text())
    main = on_root(etc, "/etc/apt/sources.list")
    main.parent.mkdir(parents=True)
    main.symlink_to(real)
    run = run_module(apt_source, amd(etc))  # no apt-get update: it fails before
    assert run.failed and "could not write the rocm repository's files (what was written is put back)" in run.msg
    assert "symbolic link" in run.msg
    assert main.is_symlink() and real.read_text().endswith((FIXTURES / "rocm.list").read_text())
    assert not on_root(etc, SOURCE).exists()
