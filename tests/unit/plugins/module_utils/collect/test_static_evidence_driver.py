"""The NVIDIA driver's evidence read from a recorded tree, for each way the driver got onto the box, and judged.

The tree is the lab's x99-3080 rig (src/rigbook/lab/rigs/x99-3080.yml, reconstructed from seed 000's write-up), edited
to each install method: the fork built by rigbook with DKMS (updates/dkms, with rigbook's build stamp in DKMS's tree),
the fork's own `make modules_install` as seed 000 did it ("the old DKMS module cleared, then depmod": the modules in
kernel/drivers/video, where NVIDIA/open-gpu-kernel-modules kernel-open/Makefile installs them), and a distribution
package's prebuilt module (kernel/nvidia-<branch>). /proc/cpuinfo's "address sizes" line is the E5-2666 v3's
(Haswell-EP: 46 bits physical, 48 virtual), the format of /proc/cpuinfo on x86.
"""

from __future__ import annotations

import json
import shutil

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import evidence_tree
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry

from rigbook.lab import hardware_trees

RELEASE = "7.0.0-31-generic"
SRCVERSION = "9C1D5A3B7E2F04A6D8B1C3E"
CPUINFO = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 63\n"
           "model name\t: Intel(R) Xeon(R) CPU E5-2666 v3 @ 2.90GHz\n"
           "address sizes\t: 46 bits physical, 48 bits virtual\n"
           "\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n")
MODULES = ("nvidia", "nvidia-uvm", "nvidia-drm", "nvidia-modeset")
PLACES = {"dkms": "updates/dkms", "make modules_install": "kernel/drivers/video",
          "distribution package": "kernel/nvidia-615"}
VIEW = {"gpu": {"vendor": "nvidia", "count": 2, "vram_gib": 20, "pcie": {"gen": 3, "width": 16}},
        "p2p": {"expected": False, "reason": "BAR1 256 MiB"},
        "pins": {"kernel": {"release": RELEASE, "cmdline": ["intel_iommu=on", "iommu=pt"]},
                 "nvidia_driver": {"version": "615.71.09", "userspace_version": "615.71.09",
                                   "fork_repo": "https://github.com/aikitoria/open-gpu-kernel-modules"}}}


def tree_of(tmp_path, method, hmm="Y", stamp=True):
    root = hardware_trees.materialize("x99-3080", tmp_path / method.replace(" ", "-"))
    shutil.rmtree(root / "lib" / "modules" / RELEASE / "updates")
    for name in MODULES:
        ko = root / "lib" / "modules" / RELEASE / PLACES[method] / (name + ".ko")
        ko.parent.mkdir(parents=True, exist_ok=True)
        ko.write_text("")
    (root / "proc" / "cpuinfo").write_text(CPUINFO)
    (root / "sys" / "module" / "nvidia" / "srcversion").write_text(SRCVERSION + "\n")
    (root / "sys" / "module" / "nvidia_uvm" / "parameters" / "uvm_disable_hmm").write_text(hmm + "\n")
    for slot in ("0000:03:00.0", "0000:04:00.0"):
        (root / "sys" / "bus" / "pci" / "devices" / slot / "dma_mask_bits").write_text("47\n")
    (root / "var" / "lib" / "rigbook" / "commands" / "nvidia-smi-version.txt").write_text("615.71.09\n")
    if method == "dkms" and stamp:
        folder = root / "var" / "lib" / "dkms" / "nvidia" / "615.71.09" / RELEASE / "x86_64"
        folder.mkdir(parents=True)
        (folder / ".rigbook-build.json").write_text(json.dumps({
            "name": "nvidia", "version": "615.71.09", "kernel": RELEASE, "arch": "x86_64",
            "modules": {"nvidia": {"path": f"/lib/modules/{RELEASE}/updates/dkms/nvidia.ko",
                                   "srcversion": SRCVERSION}}}))
    return root


def static(root, layers=("kernel_state", "driver_state")):
    chosen = [registry.get(name) for name in layers]
    return {v["layer"]: v for v in climb.climb(chosen, climb.Context(str(root), VIEW), stop_at_fail=False)[0]}


def test_the_collector_reads_srcversion_stamp_address_width_and_dma_mask(tmp_path):
    root = tree_of(tmp_path, "dkms")
    found = evidence.collect_static(str(root), ("gpus", "kernel", "cpu", "nvidia"))
    nvidia = found["nvidia"]
    assert nvidia["srcversion"] == SRCVERSION
    assert nvidia["build_stamps"] == [{
        "path": f"var/lib/dkms/nvidia/615.71.09/{RELEASE}/x86_64/.rigbook-build.json", "version": "615.71.09",
        "modules": {"nvidia": {"path": f"/lib/modules/{RELEASE}/updates/dkms/nvidia.ko", "srcversion": SRCVERSION}}}]
    assert nvidia["build_stamp_error"] is None
    assert found["cpu"]["address_bits"] == 46 and found["cpu"]["model"].startswith("Intel(R) Xeon(R) CPU E5-2666 v3")
    assert [g["dma_mask_bits"] for g in found["gpus"]] == [47, 47]
    assert nvidia["module_files"] == ["updates/dkms/nvidia.ko"]


def test_garbled_box_values_are_refused_where_read(tmp_path):
    root = tree_of(tmp_path, "dkms")
    (root / "sys" / "module" / "nvidia" / "srcversion").write_text("\x1b[31m{{ lookup('pipe', 'id') }}\n")
    stamp = next((root / "var" / "lib" / "dkms").rglob(".rigbook-build.json"))
    stamp.write_text("[\"a list\"]")
    (root / "proc" / "cpuinfo").write_text("address sizes\t: 4096 bits physical\n")
    found = evidence.collect_static(str(root), ("cpu", "nvidia"))
    assert found["nvidia"]["srcversion"] is None and found["cpu"]["address_bits"] is None
    assert found["nvidia"]["build_stamps"] == [] and "not a JSON object" in found["nvidia"]["build_stamp_error"]


@pytest.mark.parametrize("method,status", [("dkms", "pass"), ("make modules_install", "warn"),
                                           ("distribution package", "warn")])
def test_each_install_method_of_the_pinned_fork_judged_from_its_tree(tmp_path, method, status):
    verdicts = static(tree_of(tmp_path, method))
    assert verdicts["driver_state"]["status"] == status, verdicts["driver_state"]
    assert verdicts["kernel_state"]["status"] == "pass", verdicts["kernel_state"]
    if method == "make modules_install":
        assert "installed by hand" in verdicts["driver_state"]["why"]
        assert "kernel/drivers/video/nvidia.ko" in verdicts["driver_state"]["why"]


def test_another_build_of_the_pinned_version_loaded_fails_on_its_srcversion(tmp_path):
    root = tree_of(tmp_path, "dkms")
    (root / "sys" / "module" / "nvidia" / "srcversion").write_text("0A1B2C3D4E5F60718293A4B\n")
    verdict = static(root)["driver_state"]
    assert verdict["status"] == "fail" and "srcversion 0A1B2C3D4E5F60718293A4B" in verdict["why"], verdict
    assert verdict["measured"]["build_stamp"].endswith(".rigbook-build.json")
    # a DKMS build rigbook did not make (no stamp: DKMS's own hook, or one built by hand) is not held to a srcversion
    assert static(tree_of(tmp_path / "unstamped", "dkms", stamp=False))["driver_state"]["status"] == "pass"


def test_seed_000s_hmm_at_the_drivers_default_passes_on_its_cpu(tmp_path):
    """seed 000 left HMM at the driver's default with iommu=pt on a 46-bit Xeon E5 v3 and its box works."""
    root = tree_of(tmp_path, "make modules_install", hmm="N")
    kernel = static(root)["kernel_state"]
    assert kernel["status"] == "pass", kernel
    assert "46-bit physical addresses end within the GPUs' 47-bit DMA mask" in kernel["measured"]["uvm_disable_hmm"]
    (root / "proc" / "cpuinfo").write_text(CPUINFO.replace("46 bits physical", "48 bits physical"))
    kernel = static(root)["kernel_state"]
    assert kernel["status"] == "fail" and static_layers.HMM_SOURCE in kernel["remedy"], kernel


def test_a_snapshot_keeps_what_these_judges_read(tmp_path):
    root = tree_of(tmp_path, "dkms", hmm="N")
    dest = tmp_path / "snapshot"
    manifest = evidence_tree.capture(str(root), str(dest), "test", probe=False)
    for rel in ("sys/module/nvidia/srcversion", "proc/cpuinfo",
                f"var/lib/dkms/nvidia/615.71.09/{RELEASE}/x86_64/.rigbook-build.json"):
        assert rel in manifest["files"], manifest["files"]
    assert "address sizes\t: 46 bits physical" in (dest / "proc" / "cpuinfo").read_text()
    assert static(dest) == static(root)
