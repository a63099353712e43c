"""boot_state: the booted kernel and command line read under an evidence root (a tree written here), what a reboot
would change, and which of the files a role is about to write were there before."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import display_state
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner
from ansible_collections.rigbook.homelab.plugins.modules import boot_state
from helpers.modules import fail, ok, run_module

UBUNTU = Path(__file__).resolve().parents[3] / "fixtures" / "ubuntu"
GET_DEFAULT = ["systemctl", "get-default"]
SHOW = ["systemctl", "show", "display-manager.service", "-p", "Id,LoadState,ActiveState,SubState"]


def _root(tmp_path, release="6.1.0-47-amd64", cmdline="BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt"):
    root = tmp_path / "evidence"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")
    (root / "proc/cmdline").write_text(cmdline + "\n")
    return root


def test_the_pinned_kernel_with_its_flags_needs_no_reboot_and_the_files_before_a_write_are_named(tmp_path):
    there = tmp_path / "rigbook.cfg"
    there.write_text("GRUB_DEFAULT=0\n")
    run = run_module(boot_state, {"root": str(_root(tmp_path)), "release": "6.1.0-47-amd64",
                                  "cmdline": ["iommu=pt"], "paths": [str(there), str(tmp_path / "absent.state")]})
    assert not run.failed, run.msg
    assert run.result["running"] == "6.1.0-47-amd64" and run.result["changed"] is False
    assert run.result["reboot_reasons"] == []  # whatever /run/reboot-required says on this machine
    assert run.result["exists"] == {str(there): True, str(tmp_path / "absent.state"): False}


def test_another_kernel_or_a_missing_flag_is_a_reboot_reason(tmp_path):
    run = run_module(boot_state, {"root": str(_root(tmp_path, release="6.1.0-40-amd64")),
                                  "release": "6.1.0-47-amd64", "cmdline": ["iommu=pt"]})
    assert "running kernel 6.1.0-40-amd64, pinned 6.1.0-47-amd64" in run.result["reboot_reasons"]
    assert run.result["exists"] == {}
    flags = run_module(boot_state, {"root": str(_root(tmp_path / "b", cmdline="ro quiet")),
                                    "release": "6.1.0-47-amd64", "cmdline": ["intel_iommu=on", "iommu=pt"]})
    assert "kernel command line lacks intel_iommu=on iommu=pt" in flags.result["reboot_reasons"]


def test_someone_elses_reboot_required_is_reported_and_never_a_reboot_reason(tmp_path, monkeypatch):
    flag = tmp_path / "reboot-required"
    flag.write_text("*** System restart required ***\n")
    (tmp_path / "reboot-required.pkgs").write_text("libc6\nlinux-base\nlibc6\n")
    monkeypatch.setattr(boot_state, "REBOOT_REQUIRED", str(flag))
    run = run_module(boot_state, {"root": str(_root(tmp_path)), "release": "6.1.0-47-amd64", "cmdline": ["iommu=pt"]})
    assert not run.failed, run.msg
    assert run.result["reboot_reasons"] == [] and run.result["reboot_required_by"] == ["libc6", "linux-base"]
    monkeypatch.setattr(boot_state, "REBOOT_REQUIRED", str(tmp_path / "absent"))
    run = run_module(boot_state, {"root": str(_root(tmp_path / "b"))})
    assert run.result["reboot_required_by"] is None and run.result["default_target"] is None


def test_gdm_running_on_an_ubuntu_desktop_holds_the_gpu():
    run = run_module(boot_state, {"display": True}, [
        (GET_DEFAULT, ok("graphical.target\n")),
        (SHOW, ok((UBUNTU / "systemctl-show-display-manager-gdm.txt").read_text())),
    ])
    assert not run.failed, run.msg
    assert run.result["default_target"] == "graphical.target"
    assert run.result["display_manager"] == {"id": "gdm.service", "load_state": "loaded", "active_state": "active",
                                             "sub_state": "running"}
    assert run.result["display_holds_gpu"].startswith("display manager gdm.service is active")


def test_a_server_without_a_display_manager_holds_nothing_though_its_default_is_graphical():
    run = run_module(boot_state, {"display": True}, [
        (GET_DEFAULT, ok("graphical.target\n")),
        (SHOW, ok((UBUNTU / "systemctl-show-display-manager-none.txt").read_text())),
    ])
    assert not run.failed and run.result["display_holds_gpu"] is None
    assert run.result["display_manager"]["load_state"] == "not-found"


def test_an_unreadable_systemd_fails_instead_of_saying_nothing_holds_the_gpu():
    run = run_module(boot_state, {"display": True}, [(GET_DEFAULT, fail(1, "System has not been booted with systemd"))])
    assert run.failed and "systemctl get-default failed" in run.msg


def test_a_failed_show_of_the_display_manager_fails_too():
    run = run_module(boot_state, {"display": True}, [
        (GET_DEFAULT, ok("multi-user.target\n")), (SHOW, fail(1, "Failed to connect to bus"))])
    assert run.failed and run.msg == ("systemctl show display-manager.service failed: " + " ".join(SHOW)
                                      + " exited 1: Failed to connect to bus")


def _answers(*results):
    """A RUN (facts/runner.run's shape) answering each call with the next (rc, stdout) of RESULTS."""
    calls, queue = [], list(results)

    def run(argv, timeout=None):
        calls.append(argv)
        rc, out = queue.pop(0)
        return runner.Result(argv, rc, out, "", None if rc == 0 else f"{argv[0]}: cannot start", False)
    return run, calls


def test_the_display_facts_are_read_through_the_one_systemd_reader():
    gdm = (UBUNTU / "systemctl-show-display-manager-gdm.txt").read_text()
    run, calls = _answers((0, "graphical.target\n"), (0, gdm))
    assert display_state.read(run) == ("graphical.target", {"id": "gdm.service", "load_state": "loaded",
                                                            "active_state": "active", "sub_state": "running"}, None)
    assert calls == [GET_DEFAULT, SHOW]
    run, calls = _answers((None, ""))  # no systemctl at all: said, never "nothing holds the GPU"
    assert display_state.read(run) == (None, None, "systemctl get-default failed: systemctl: cannot start")
    assert calls == [GET_DEFAULT]


@pytest.mark.parametrize("default, active, holds", [
    ("graphical.target", "active", "is active"),
    ("multi-user.target", "active", "is active"),          # still running until the reboot
    ("graphical.target", "inactive", "starts display manager"),  # stopped by hand: it comes back at boot
    ("multi-user.target", "inactive", None),               # after set-default and the reboot
    ("multi-user.target", "failed", None),
])
def test_the_display_rule(default, active, holds):
    manager = {"id": "gdm.service", "load_state": "loaded", "active_state": active}
    found = display_state.holds_gpu(default, manager)
    assert (found is None) if holds is None else (holds in found)
    assert display_state.holds_gpu(default, dict(manager, load_state="not-found")) is None


def test_secure_boot_is_read_only_when_asked(tmp_path):
    """With secure_boot, the reader of facts/secure_boot.py under the root (a tree: the variables are its files,
    mokutil its recording); without it, nothing of Secure Boot is read."""
    root = _root(tmp_path)
    efivars = root / "sys/firmware/efi/efivars"
    efivars.mkdir(parents=True)
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\0\0\0\x01")
    (efivars / "SetupMode-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\0\0\0\0")
    (root / "var/lib/shim-signed/mok").mkdir(parents=True)
    (root / "var/lib/shim-signed/mok/MOK.der").write_bytes(b"certificate")
    recording = Path(runner.recording_path(str(root), "mokutil-test-key"))
    recording.parent.mkdir(parents=True)
    recording.write_text("/var/lib/shim-signed/mok/MOK.der is already enrolled\n")
    run = run_module(boot_state, {"root": str(root), "secure_boot": True, "os_id": "ubuntu"})
    assert not run.failed, run.msg
    assert run.result["secure_boot"] == {
        "state": "on", "why": "EFI variables: SecureBoot is 1, SetupMode 0",
        "dkms_key": {"path": "/var/lib/shim-signed/mok/MOK.der", "state": "enrolled",
                     "why": "mokutil --test-key: /var/lib/shim-signed/mok/MOK.der is already enrolled"}}
    assert run.result["running"] == "6.1.0-47-amd64" and run.result["changed"] is False
    assert run_module(boot_state, {"root": str(root)}).result["secure_boot"] is None
