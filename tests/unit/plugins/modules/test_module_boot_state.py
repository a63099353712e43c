"""boot_state: the booted kernel and command line read under an evidence root (a tree written here), what a reboot
would change, and which of the files a role is about to write were there before."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.modules import boot_state
from helpers.modules import run_module


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
    assert [r for r in run.result["reboot_reasons"] if "reboot-required" not in r] == []
    assert run.result["exists"] == {str(there): True, str(tmp_path / "absent.state"): False}


def test_another_kernel_or_a_missing_flag_is_a_reboot_reason(tmp_path):
    run = run_module(boot_state, {"root": str(_root(tmp_path, release="6.1.0-40-amd64")),
                                  "release": "6.1.0-47-amd64", "cmdline": ["iommu=pt"]})
    assert "running kernel 6.1.0-40-amd64, pinned 6.1.0-47-amd64" in run.result["reboot_reasons"]
    assert run.result["exists"] == {}
    flags = run_module(boot_state, {"root": str(_root(tmp_path / "b", cmdline="ro quiet")),
                                    "release": "6.1.0-47-amd64", "cmdline": ["intel_iommu=on", "iommu=pt"]})
    assert "kernel command line lacks intel_iommu=on iommu=pt" in flags.result["reboot_reasons"]
