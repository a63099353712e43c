"""facts/kernel.py: the running release, the command line, and the words every boot has (never a pin)."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import kernel

# seed 000's 3080 box (Ubuntu, HWE kernel 7.0.0-31, IOMMU in passthrough): the shape of its /proc/cmdline,
# reconstructed from the write-up's GRUB line.
SEED_CMDLINE = ("BOOT_IMAGE=/boot/vmlinuz-7.0.0-31-generic root=UUID=0c4e2f6a-1b7d-4f55-9d1e-2b8f3f0c9a11 ro quiet "
                "splash intel_iommu=on iommu=pt vt.handoff=7")


def _tree(tmp_path, release, cmdline):
    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "kernel" / "osrelease").write_text(release + "\n")
    (tmp_path / "proc" / "cmdline").write_text(cmdline + "\n")
    return str(tmp_path)


def test_release_and_cmdline_under_a_recorded_root(tmp_path):
    root = _tree(tmp_path, "7.0.0-31-generic", SEED_CMDLINE)
    assert kernel.release(root) == "7.0.0-31-generic"
    assert kernel.cmdline(root)[0] == "BOOT_IMAGE=/boot/vmlinuz-7.0.0-31-generic"
    assert kernel.release(str(tmp_path / "nothing")) is None and kernel.cmdline(str(tmp_path / "nothing")) is None


def test_a_release_of_another_shape_is_none():
    assert kernel.parse_release("6.8.0-90-generic") == "6.8.0-90-generic"
    assert kernel.parse_release("6.8.0 {{ lookup('pipe','id') }}") is None
    assert kernel.parse_release("") is None


def test_own_words_leave_out_every_boot_only_word_and_stop_at_the_init_arguments():
    assert kernel.own_words(SEED_CMDLINE) == ["intel_iommu=on", "iommu=pt"]
    assert kernel.own_words(["amd_iommu=on", "--", "single"]) == ["amd_iommu=on"]
    assert kernel.own_words(None) == []


def test_host_words_are_this_hosts_own_disks():
    words = kernel.parse_cmdline(SEED_CMDLINE + " resume=UUID=abc")
    assert kernel.host_words(words) == ["root=UUID=0c4e2f6a-1b7d-4f55-9d1e-2b8f3f0c9a11", "resume=UUID=abc"]


def test_parse_cmdline_is_bounded():
    words = kernel.parse_cmdline("x" * 5000 + " " + "y " * 1000)
    assert len(words) == kernel.MAX_WORDS and len(words[0]) == kernel.MAX_WORD
    assert kernel.parse_cmdline(None) is None
