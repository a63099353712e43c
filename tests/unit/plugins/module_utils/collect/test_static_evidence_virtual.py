"""Whether the box is a virtual machine (static_evidence.collect_virtual), read from a copy of the REAL H200 VM tree
(tests/fixtures/evidence/h200-vm) with one fact changed at a time, and the firmware layer's verdict on it."""

from __future__ import annotations

import shutil

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import evidence_tree
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers

CPUINFO = ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Processor\n"
           "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep %s sse sse2 ht syscall nx\n\n")
LADDER_VIEW = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141},
               "p2p": {"expected": False, "reason": "one GPU"}}


def tree(fixtures, tmp_path, flags=None):
    """A copy of the recorded VM tree; FLAGS: the extra flags of a cpuinfo with a flags line (None: as recorded,
    no flags line)."""
    root = tmp_path / "tree"
    shutil.copytree(fixtures / "evidence" / "h200-vm", root, symlinks=True)
    if flags is not None:
        (root / "proc" / "cpuinfo").write_text(CPUINFO % flags)
    return root


def firmware(root):
    return static_layers.judge_firmware(evidence.collect_static(str(root), ("gpus",)), LADDER_VIEW)


def test_the_cpus_hypervisor_flag_says_virtual_machine(fixtures, tmp_path):
    root = tree(fixtures, tmp_path, flags="hypervisor")
    ev = evidence.collect_static(str(root), ("gpus",))
    assert ev["virtual"] == {"vm": True, "seen": "the CPU's hypervisor flag (/proc/cpuinfo)"}
    verdict = firmware(root)
    assert verdict["status"] == "pass" and "CSM is on" not in verdict["why"]


def test_a_bare_metal_legacy_boot_still_gets_the_csm_finding(fixtures, tmp_path):
    """x86 flags without hypervisor decide bare metal: the GPU driver's own word is not asked, and a box with no
    /sys/firmware/efi booted through CSM."""
    root = tree(fixtures, tmp_path, flags="pni")
    ev = evidence.collect_static(str(root), ("gpus",))
    assert ev["virtual"] == {"vm": False, "seen": "no hypervisor flag in /proc/cpuinfo"}
    verdict = firmware(root)
    assert verdict["status"] == "warn" and verdict["why"].startswith("legacy boot (no /sys/firmware/efi): CSM is on")
    assert verdict["remedy"] == static_layers.CSM_REMEDY  # the measured BAR covers VRAM: no ReBAR advice
    assert "rigbook_p2p.expected false" not in verdict["remedy"]  # the inventory already declares it


def test_dmi_names_a_virtual_platform(fixtures, tmp_path):
    root = tree(fixtures, tmp_path)
    dmi = root / "sys" / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("QEMU\n")
    assert evidence.collect_static(str(root), ("gpus",))["virtual"] == {"vm": True, "seen": "DMI sys_vendor 'QEMU'"}
    (dmi / "sys_vendor").write_text("QEMU " + "x" * 10000 + "\n")  # box text: read bounded
    seen = evidence.collect_static(str(root), ("gpus",))["virtual"]["seen"]
    assert seen.startswith("DMI sys_vendor 'QEMU xx") and len(seen) <= len("DMI sys_vendor ''") + 64


def test_the_gpu_drivers_word_where_the_cpu_flags_are_not_recorded(fixtures, tmp_path):
    root = tree(fixtures, tmp_path)
    smi = root / "var" / "lib" / "rigbook" / "commands" / "nvidia-smi-q.txt"
    smi.write_text(smi.read_text().replace("Pass-Through", "None"))
    ev = evidence.collect_static(str(root), ("gpus",))
    assert ev["virtual"]["vm"] is False and ev["virtual"]["seen"].endswith("Virtualization Mode None")
    assert "CSM is on" in firmware(root)["why"]
    smi.unlink()
    ev = evidence.collect_static(str(root), ("gpus",))
    assert ev["virtual"]["vm"] is None  # nothing says either way: the legacy-boot finding stands
    assert "CSM is on" in firmware(root)["why"]


def test_the_snapshot_keeps_only_the_hypervisor_flag(fixtures, tmp_path):
    for flags, kept in (("hypervisor", "hypervisor"), ("pni", "")):
        text = evidence_tree._cpuinfo(CPUINFO % flags + CPUINFO % flags)
        assert text.splitlines()[-1] == "flags\t\t: " + kept and "fpu" not in text
        root = tree(fixtures, tmp_path / flags, flags=flags)
        copy = tmp_path / flags / "copy"
        evidence_tree.capture(str(root), str(copy), "flags", probe=False)
        assert evidence.collect_static(str(copy), ("gpus",))["virtual"] == \
            evidence.collect_static(str(root), ("gpus",))["virtual"]
