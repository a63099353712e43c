# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judges of the five static P2P layers: (evidence, ladder_view) -> verdict. No I/O here.

evidence is evidence.collect_static(root); ladder_view is {"gpu": rigbook_gpu, "p2p": rigbook_p2p,
"pins": rigbook_pins} from the inventory. Missing evidence gives "unknown", never "pass".
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import expectations
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import Findings, make
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import code_entry as _code

GIB = 1 << 30
MIB = 1 << 20
FOUR_GIB = 4 * GIB
GEN_SPEED_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
# Peer DMA reach with the IOMMU in passthrough/off: amdgpu gmc v10-v12 use a 44-bit mask,
# NVIDIA GPUs 47 bits (Linux drivers/gpu/drm/amd/amdgpu/gmc_v1{0,1,2}_0.c: DMA_BIT_MASK(44); for NVIDIA the public
# P2P-driver runbook WU-CVGL/cluster-setup docs/05_GPU_P2P_RTX4090.md: every BAR1 must end below 2^47).
DMA_REACH_BITS = {"nvidia": 47, "amd": 44}
# Host bridges the upstream kernel allows for P2PDMA across root ports (drivers/pci/p2pdma.c);
# any AMD Zen (family >= 0x17) CPU is allowed too. 8086:6f00 (Broadwell-EP, X99) is not.
P2PDMA_HOST_BRIDGES = frozenset(
    [
        "8086:3c00",
        "8086:3c01",
        "8086:2f00",
        "8086:2f01",
        "8086:2030",
        "8086:2031",
        "8086:2032",
        "8086:2033",
        "8086:2020",
        "8086:09a2",
    ]
)
# What a GPU's root port is on the X99 boards of the seeds, by vendor:device id ranges (inclusive). CPU root ports of
# Haswell-EP / Broadwell-EP (Xeon E5 v3 / v4): 8086:2f02-2f0b and 8086:6f02-6f0b (PCIe root ports 1a-3d; the
# recorded trees: seed 000's GPUs on 00:02.0 / 00:03.0, 8086:2f04 / 2f08, seed 004's 8086:6f04 / 6f08). The Intel
# C610/X99 chipset (PCH) root ports: 8086:8d10-8d1e, behind the CPU's DMI 2.0 x4 link.
CPU_ROOT_PORTS = (("8086", 0x2F02, 0x2F0B), ("8086", 0x6F02, 0x6F0B))
PCH_ROOT_PORTS = (("8086", 0x8D10, 0x8D1E),)
# An Intel root port not in the tables above: the chipset's PCIe root ports sit at device 1c of bus 00 (D28) on
# every Intel PCH, the CPU's at devices 01-03.
INTEL_PCH_ROOT_PORT_DEVICE = 0x1C
PCH_REASON = (
    "seeds 000 and 004 rely on both GPUs on CPU root ports (seed 000: GPU0 on 00:02.0, GPU1 on 00:03.0, "
    "\"not through the chipset\", nvidia-smi topo PHB; seed 004: two root ports of one CPU, NCCL_P2P_LEVEL=PHB); "
    "behind the chipset the peer path crosses the DMI uplink of the PCH (x4) and its slower ports, far below "
    "seed 004's 10.29 GB/s peer copy"
)
PCH_REMEDY = (
    "Move the card to a slot wired to the CPU (the board manual's slot map; in `lspci -tv` a CPU slot hangs off "
    "00:01.0-00:03.0, a chipset slot off 00:1c.x), or declare P2P unavailable with rigbook_p2p.expected false."
)
# What to do, per firmware finding: each names only the setting its finding needs.
CSM_REMEDY = "In the BIOS: CSM OFF (boot UEFI); Above 4G Decoding and Resizable BAR need it on most boards."
ABOVE_4G_REMEDY = "In the BIOS: Above 4G Decoding ON (with CSM OFF)."
REBAR_REMEDY = "In the BIOS: Resizable BAR ON (with Above 4G Decoding ON and CSM OFF)."
LARGE_BAR_REMEDY = "In the BIOS: Above 4G Decoding ON and Resizable BAR ON (with CSM OFF)."
# Only where P2P is expected (a fail): a box that already declares it unavailable is not told to declare it.
NO_BIOS_OPTION_REMEDY = (
    "If the BIOS has no such options (the X99 TF board), GPU P2P is not possible on this board: set "
    "rigbook_p2p.expected false with the reason, and rigbook holds the SHM path to its baseline instead."
)
# In a virtual machine the hypervisor, not a BIOS, places and sizes the GPU's BARs.
VM_BAR_REMEDY = (
    "This is a virtual machine: its hypervisor places and sizes the passed-through GPU's BARs, not a BIOS. Ask the "
    "provider for a VM type with a large 64-bit MMIO window, or give the VMM one (e.g. QEMU's "
    "pci-hole64-size / OVMF's X-PciMmio64Mb)."
)


_SLOT_LINK = "the slot link of a card with its own PCIe switch (its switch's upstream port to the root port)"
# The stable failure code of each finding these judges make (ladder/codes.py gathers them; docs/codes.md lists them).
CODES = {
    "RB-FIRMWARE-CSM-ON": _code(
        "firmware", "Legacy (CSM) boot on bare metal",
        "The box booted through the BIOS's Compatibility Support Module, not UEFI. On most boards Above 4G Decoding "
        "and Resizable BAR need CSM off, so the GPUs' VRAM BARs stay small or below 4 GiB and peers cannot map each "
        "other's memory.",
        "No /sys/firmware/efi, on a box that is not a virtual machine (no hypervisor CPU flag, DMI platform name, "
        "/sys/hypervisor/type or NVIDIA Virtualization Mode).",
        "In the BIOS: CSM off (boot UEFI); the verdict's remedy names the settings that need it."),
    "RB-FIRMWARE-BAR-BELOW-4G": _code(
        "firmware", "A GPU's VRAM BAR is mapped below 4 GiB",
        "The VRAM window sits in the 32-bit MMIO hole: Above 4G Decoding is off (in a virtual machine, the "
        "hypervisor maps it in its 32-bit window), which leaves no room for a BAR as large as VRAM.",
        "The start of the VRAM BAR (the largest prefetchable memory BAR) in /sys/bus/pci/devices/<slot>/resource, or "
        "a pasted lspci -vv's Region line.",
        "In the BIOS: Above 4G Decoding ON (with CSM off); in a virtual machine, a VM type or VMM setting with a "
        "64-bit MMIO window (the verdict's remedy)."),
    "RB-FIRMWARE-REBAR-OFF": _code(
        "firmware", "Resizable BAR is off: the VRAM BAR is smaller than the card supports",
        "The card offers a larger VRAM BAR than the one it was given, so Resizable BAR is off in the firmware (or "
        "not offered by the hypervisor): peers see only part of its memory.",
        "The VRAM BAR's size in /sys/bus/pci/devices/<slot>/resource against the largest size in the card's "
        "Resizable BAR capability (resource<N>_resize; a paste's Resizable BAR lines).",
        "In the BIOS: Resizable BAR ON (with Above 4G Decoding ON and CSM off)."),
    "RB-FIRMWARE-SMALL-BAR": _code(
        "firmware", "The VRAM BAR is smaller than VRAM and no larger size is offered",
        "The VRAM BAR is smaller than the card's VRAM (an NVIDIA card's 256 MiB where VRAM is not declared) and the "
        "card offers no larger size: peers cannot map this card's memory.",
        "The VRAM BAR's size (sysfs resource; nvidia-smi -q's BAR1 Total in a paste) against rigbook_gpu.vram_gib.",
        "In the BIOS: Above 4G Decoding ON and Resizable BAR ON; where the board has neither, declare P2P "
        "unavailable with rigbook_p2p.expected false (the verdict's remedy)."),
    "RB-FIRMWARE-BAR-UNASSIGNED": _code(
        "firmware", "A GPU has no VRAM BAR assigned",
        "The GPU's resource file lists no memory BAR: the firmware or the kernel found no MMIO space for its VRAM "
        "window, so its size and place cannot be judged.",
        "No memory BAR in /sys/bus/pci/devices/<slot>/resource (a paste: no memory Region line).",
        "Look in dmesg for the BAR's 'no space' / 'failed to assign' lines; turn Above 4G Decoding on (in a virtual "
        "machine, give it a larger 64-bit MMIO window)."),
    "RB-PCIE-BEHIND-PCH": _code(
        "pcie_link", "A GPU sits behind the chipset (PCH), not a CPU root port",
        "Where P2P is expected, the GPU's root port is the chipset's: the peer path crosses the PCH's DMI uplink (x4) "
        "and its slower ports, far below a peer copy between CPU root ports.",
        "The root port at the top of the GPU's upstream chain in sysfs, by its vendor:device id (Intel C610/X99 "
        "8086:8d10-8d1e, or device 1c of bus 00 on an Intel PCH).",
        "Move the card to a slot wired to the CPU, or declare P2P unavailable (the verdict's remedy)."),
    "RB-PCIE-LINK-SPEED": _code(
        "pcie_link", "A GPU link is capable of a lower PCIe generation than expected",
        "The GPU's link (the lower of the GPU's and its port's top speed) cannot reach the generation "
        "rigbook_gpu.pcie expects: the slot, a riser or the BIOS's PCIe speed setting holds it down.",
        "max_link_speed of the GPU and of its upstream port in sysfs (a paste's LnkCap) against rigbook_gpu.pcie "
        "gen.",
        "Reseat the card, check the riser and set the slot's speed to Auto or the card's generation in the BIOS."),
    "RB-PCIE-LINK-WIDTH-CAPABILITY": _code(
        "pcie_link", "A GPU link is capable of fewer lanes than expected",
        "The GPU or its slot's port supports fewer lanes than rigbook_gpu.pcie expects: an electrically narrower "
        "slot, or one the BIOS bifurcates.",
        "max_link_width of the GPU and of its upstream port in sysfs (a paste's LnkCap) against rigbook_gpu.pcie "
        "width.",
        "Use a slot wired for the full width, or check the BIOS's bifurcation setting for the slot."),
    "RB-PCIE-LINK-WIDTH": _code(
        "pcie_link", "A GPU link trained at fewer lanes than it is capable of",
        "Both ends support more lanes than the link trained at: a badly seated card, a damaged riser or dirty "
        "contacts.",
        "current_link_width against max_link_width of the GPU and its port in sysfs (a paste's LnkSta against "
        "LnkCap).",
        "Reseat the card and check or replace the riser/cable (the verdict's remedy)."),
    "RB-PCIE-SLOT-LINK-SPEED": _code(
        "pcie_link", "A card's slot link is capable of a lower PCIe generation than expected",
        "On %s, the link is capable of a lower generation than rigbook_gpu.pcie expects, hidden from the GPU's "
        "own link by the switch." % _SLOT_LINK,
        "max_link_speed of the switch's upstream port and of the root port in sysfs against rigbook_gpu.pcie gen.",
        "Reseat the card, check the riser and set the slot's speed to Auto or the card's generation in the BIOS."),
    "RB-PCIE-SLOT-LINK-WIDTH-CAPABILITY": _code(
        "pcie_link", "A card's slot link is capable of fewer lanes than expected",
        "On %s, the link supports fewer lanes than rigbook_gpu.pcie expects: an electrically narrower or "
        "bifurcated slot." % _SLOT_LINK,
        "max_link_width of the switch's upstream port and of the root port in sysfs against rigbook_gpu.pcie width.",
        "Use a slot wired for the full width, or check the BIOS's bifurcation setting for the slot."),
    "RB-PCIE-SLOT-LINK-WIDTH": _code(
        "pcie_link", "A card's slot link trained at fewer lanes than it is capable of",
        "On %s, the link trained narrower than both ends support: a badly seated card or a damaged riser, hidden "
        "from the GPU's own link by the switch." % _SLOT_LINK,
        "current_link_width against max_link_width of the switch's upstream port and the root port in sysfs.",
        "Reseat the card and check or replace the riser/cable (the verdict's remedy)."),
    "RB-DMA-WINDOW-BEYOND-REACH": _code(
        "dma_window", "A GPU's BAR ends beyond a peer's DMA reach",
        "With the IOMMU in passthrough or off, a peer GPU writes to this GPU's BAR at its bus address; the BAR ends "
        "above the peer's DMA mask (amdgpu 44 bits, NVIDIA 47), so the peer cannot reach it.",
        "The end of the GPU's highest memory BAR (sysfs resource) against each peer's DMA reach, the IOMMU mode "
        "from /proc/cmdline.",
        "Make the BIOS place 64-bit MMIO lower, or boot a kernel that copes with the peer's DMA limit; keep iommu=pt "
        "(the verdict's remedy)."),
    "RB-KERNEL-NOT-PINNED": _code(
        "kernel_state", "The running kernel is not the pinned one",
        "The box booted another kernel than rigbook_pins.kernel.release (an upgrade, a changed GRUB default): the "
        "pinned P2P-patched kernel (AMD) is not running, or the P2P driver fork may not be built for this one "
        "(NVIDIA; the verdict says whether an nvidia module is installed for it).",
        "The running release (/proc/sys/kernel/osrelease) against rigbook_pins.kernel.release; for NVIDIA, nvidia "
        "modules under /lib/modules/<release>.",
        "Boot the pinned kernel, or re-run provision so the kernel role and the driver build follow the new kernel, "
        "then update the pin."),
    "RB-KERNEL-CMDLINE-FLAGS": _code(
        "kernel_state", "The kernel command line lacks pinned flags",
        "Flags pinned in rigbook_pins.kernel.cmdline (e.g. iommu=pt) are not on the running kernel's command line: "
        "GRUB's configuration was not updated, or the box was not rebooted since.",
        "/proc/cmdline against rigbook_pins.kernel.cmdline.",
        "Re-run provision (the kernel role writes /etc/default/grub.d/rigbook.cfg and runs update-grub), then "
        "reboot."),
    "RB-KERNEL-NO-PCI-P2PDMA": _code(
        "kernel_state", "The running kernel is built without CONFIG_PCI_P2PDMA",
        "The kernel has no PCI peer-to-peer DMA support: amdgpu cannot do P2P between the GPUs.",
        "CONFIG_PCI_P2PDMA in /boot/config-<release> or /proc/config.gz, on an AMD box where P2P is expected.",
        "Use a kernel built with CONFIG_PCI_P2PDMA=y and CONFIG_HSA_AMD_P2P=y."),
    "RB-KERNEL-NO-HSA-AMD-P2P": _code(
        "kernel_state", "The running kernel is built without CONFIG_HSA_AMD_P2P",
        "amdkfd's peer-to-peer support is not built: ROCm sees no P2P links between the GPUs.",
        "CONFIG_HSA_AMD_P2P in /boot/config-<release> or /proc/config.gz, on an AMD box where P2P is expected.",
        "Use a kernel built with CONFIG_PCI_P2PDMA=y and CONFIG_HSA_AMD_P2P=y."),
    "RB-KERNEL-P2PDMA-BRIDGE": _code(
        "kernel_state", "The host bridge is not on the kernel's P2PDMA allow list",
        "The GPUs sit on different root ports, and the kernel allows P2PDMA across root ports only through the host "
        "bridges it lists (drivers/pci/p2pdma.c) and on AMD Zen CPUs; this one (e.g. X99's 8086:6f00) is not "
        "listed, so the kernel refuses peer DMA.",
        "The host bridge's vendor:device id in sysfs against the kernel's list and rigbook_pins.kernel.p2pdma_allow.",
        "Boot a kernel that allows this host bridge for P2PDMA and list it in rigbook_pins.kernel.p2pdma_allow."),
    "RB-KERNEL-UVM-HMM-ON": _code(
        "kernel_state", "nvidia_uvm runs with HMM on under iommu=pt",
        "With NVIDIA's open driver, HMM on and iommu=pt, on a CPU whose physical addresses reach beyond the GPUs' DMA "
        "mask (or whose address width is not known), the driver takes cuMem host allocations from the ~2 GiB "
        "ZONE_DMA32 and NCCL's SHM transport crashes (NVIDIA/nccl#2190).",
        "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm with iommu=pt in /proc/cmdline, the CPU's address sizes "
        "(/proc/cpuinfo), the GPUs' dma_mask_bits and /proc/driver/nvidia/version (open or proprietary).",
        "Add `options nvidia-uvm uvm_disable_hmm=1` in /etc/modprobe.d (the driver role writes it) and reboot."),
    "RB-KERNEL-UVM-HMM-UNSET": _code(
        "kernel_state", "nvidia_uvm is not loaded and nothing disables its HMM",
        "nvidia_uvm is not loaded, so its HMM setting cannot be read, and no modprobe.d option disables HMM: once it "
        "loads under iommu=pt it may confine host allocations to ZONE_DMA32 (RB-KERNEL-UVM-HMM-ON).",
        "No /sys/module/nvidia_uvm/parameters/uvm_disable_hmm and no uvm_disable_hmm option in /etc/modprobe.d, with "
        "iommu=pt in /proc/cmdline.",
        "Add `options nvidia-uvm uvm_disable_hmm=1` in /etc/modprobe.d (the driver role writes it) and reboot."),
    "RB-DRIVER-NO-MODULE": _code(
        "driver_state", "No nvidia module is installed for the running kernel",
        "No nvidia module is loaded and none is installed for the running kernel, typically after a kernel upgrade "
        "the driver build did not follow: the GPUs have no driver.",
        "No /sys/module/nvidia, no version in /proc/driver/nvidia/version, no nvidia module under "
        "/lib/modules/<release>.",
        "Re-run provision: the driver role builds the pinned driver through DKMS for every installed kernel."),
    "RB-DRIVER-NOT-LOADED": _code(
        "driver_state", "The nvidia module is installed but not loaded",
        "An nvidia module exists for the running kernel but is not loaded: it failed to load, or is blacklisted.",
        "No /sys/module/nvidia while an nvidia module sits under /lib/modules/<release>.",
        "Load it (modprobe nvidia) or reboot; dmesg says why it did not load."),
    "RB-DRIVER-VERSION-NOT-PINNED": _code(
        "driver_state", "The loaded nvidia module is not the pinned version",
        "The kernel runs another nvidia driver version than rigbook_pins.nvidia_driver.version: a distribution "
        "update, another installer, or the module from before an upgrade still loaded.",
        "/sys/module/nvidia/version (or /proc/driver/nvidia/version) against rigbook_pins.nvidia_driver.version.",
        "Re-run provision (the driver role builds the pinned version through DKMS) and reboot."),
    "RB-DRIVER-MODULE-KIND": _code(
        "driver_state", "The loaded nvidia module is not the kind pinned (open or proprietary)",
        "The loaded module is NVIDIA's proprietary one where the pin asks for the open kernel modules (the P2P fork "
        "is a patched build of them), or the reverse.",
        "/proc/driver/nvidia/version (an Open Kernel Module line or not) against the pin's open, or its fork "
        "source.",
        "Re-run provision (the driver role builds the pinned kind) and reboot."),
    "RB-DRIVER-NOT-PINNED-BUILD": _code(
        "driver_state", "The loaded nvidia module is not rigbook's DKMS build",
        "The loaded module has the pinned version but not the srcversion of the DKMS build rigbook made for the "
        "running kernel: another copy of that version (installed by hand, or still in memory from before the "
        "build) is loaded.",
        "/sys/module/nvidia/srcversion against rigbook's build stamp of that version in DKMS's tree.",
        "Reboot (or unload and reload the nvidia modules); if it still differs, `modinfo -n nvidia` names the copy "
        "that wins."),
    "RB-DRIVER-NOT-DKMS": _code(
        "driver_state", "The pinned nvidia module is not a DKMS build",
        "nvidia.ko for the running kernel was installed by hand (make modules_install, NVIDIA's .run installer) or "
        "by a distribution package: it runs, but a kernel upgrade does not rebuild it.",
        "Where the nvidia module sits under /lib/modules/<release> (DKMS installs to updates/dkms).",
        "Converge: the driver role builds the pinned fork with DKMS for every kernel and moves the hand-installed "
        "files aside (`provision ... --check --diff` shows it first)."),
    "RB-DRIVER-USERSPACE-MISMATCH": _code(
        "driver_state", "The userspace driver and the kernel module differ",
        "The NVIDIA userspace libraries are another version than the loaded kernel module: CUDA and nvidia-smi fail "
        "with 'Driver/library version mismatch'.",
        "nvidia-smi's driver version (recorded or live) against the loaded module's version.",
        "Install the pinned userspace with --no-kernel-modules and hold its packages."),
    "RB-DRIVER-USERSPACE-NOT-PINNED": _code(
        "driver_state", "The userspace driver is not the pinned version",
        "The NVIDIA userspace matches no pin: rigbook_pins.nvidia_driver.userspace_version (or its version) names "
        "another release.",
        "nvidia-smi's driver version against the pin.",
        "Install the pinned userspace with --no-kernel-modules."),
    "RB-DRIVER-FORK-UNTELLABLE": _code(
        "driver_state", "Nothing tells the pinned P2P fork from NVIDIA's stock driver",
        "The pin names the P2P driver fork and the loaded module has its version, but no module file exists for the "
        "running kernel and rigbook stamped no build of it: a driver the platform injects (a cloud VM) looks the "
        "same, so whether the fork runs is not known.",
        "No nvidia module under /lib/modules/<release> and no rigbook DKMS build stamp of the loaded version.",
        "Build the fork with provision (DKMS, stamped), or drop the fork's source from the pin where NVIDIA's stock "
        "driver is meant."),
    "RB-DRIVER-AMDGPU-NOT-LOADED": _code(
        "driver_state", "amdgpu is not loaded",
        "The AMD GPUs have no kernel driver: amdgpu failed to load, or amdgpu-dkms was not rebuilt after a kernel "
        "upgrade.",
        "No /sys/module/amdgpu.",
        "Check dmesg; after a kernel upgrade rebuild amdgpu-dkms or boot the pinned kernel."),
    "RB-DRIVER-ROCM-NOT-PINNED": _code(
        "driver_state", "ROCm is not the pinned version",
        "The installed ROCm is another release than rigbook_pins.rocm.version.",
        "/opt/rocm/.info/version against rigbook_pins.rocm.version.",
        "Install the pinned ROCm."),
    "RB-DRIVER-KFD-NO-P2P-LINK": _code(
        "driver_state", "A KFD GPU node has no P2P link",
        "Where P2P is expected, amdgpu refused peer access for this GPU: a kernel without CONFIG_HSA_AMD_P2P, a "
        "small BAR, a peer BAR beyond its DMA reach or a path P2PDMA does not allow.",
        "p2p_links_count in /sys/class/kfd/kfd/topology/nodes/<node>/properties.",
        "See the layers below it (firmware, dma_window, kernel_state) for which."),
}


def human_bytes(n):
    if n is None:
        return "?"
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            value = float(n) / size
            return ("%d %s" % (value, unit)) if value == int(value) else ("%.1f %s" % (value, unit))
    return "%d B" % n


def _vendor(evidence, ladder_view):
    gpu = ladder_view.get("gpu") or {}
    if gpu.get("vendor"):
        return gpu["vendor"]
    vendors = {g["vendor"] for g in evidence.get("gpus") or []}
    return vendors.pop() if len(vendors) == 1 else None


def p2p_expected(evidence, ladder_view):
    """The one rule (judges/expectations.py), counting the GPUs found in sysfs."""
    return expectations.p2p_expected(ladder_view, len(evidence.get("gpus") or []))


def _no_gpus(layer, evidence):
    why = evidence.get("error") or "no NVIDIA or AMD GPU found in sysfs under %s" % evidence.get("root")
    return make(
        layer,
        "unknown",
        measured={"gpus": 0},
        expected=None,
        why=why,
        remedy="Check rigbook_evidence_root, and that the GPUs are seated and enumerated (lspci).",
    )


def _vram_bar(gpu, vendor=None):
    """The VRAM window: the largest prefetchable memory BAR (NVIDIA calls it BAR1, AMD maps it at BAR0).

    Not a fixed index: a GPU whose BAR0 is 64-bit (the H200) has its VRAM window at register 2.
    """
    candidates = [b for b in gpu.get("bars") or [] if b["kind"] == "memory" and b["prefetchable"]]
    if not candidates:
        candidates = [b for b in gpu.get("bars") or [] if b["kind"] == "memory"]
    return max(candidates, key=lambda b: b["size"]) if candidates else None


def judge_firmware(evidence, ladder_view):
    """UEFI boot, VRAM BAR above 4 GiB, VRAM BAR >= VRAM (or ReBAR at its maximum)."""
    layer = "firmware"
    gpus = evidence.get("gpus") or []
    if not gpus:
        return _no_gpus(layer, evidence)
    vendor = _vendor(evidence, ladder_view)
    vram_gib = (ladder_view.get("gpu") or {}).get("vram_gib")
    vram = int(vram_gib * GIB) if vram_gib else None
    expected_p2p = p2p_expected(evidence, ladder_view)
    found = Findings()
    bars = {}
    virtual = evidence.get("virtual") or {}
    vm = virtual.get("vm") is True

    def bios(remedy):
        return VM_BAR_REMEDY if vm else remedy

    # evidence that never read the boot mode (a pasted lspci: provision diagnose) says uefi None: the BARs are judged,
    # the boot mode is named as not read; a collector always reads it (true or false)
    boot_read = not ("uefi" in evidence and evidence["uefi"] is None)
    if boot_read and not evidence.get("uefi") and not vm:
        found.problem("legacy boot (no /sys/firmware/efi): CSM is on", CSM_REMEDY, code="RB-FIRMWARE-CSM-ON")
    for gpu in gpus:
        slot = gpu["slot"]
        if gpu.get("bars") is None:
            found.gap("%s: no BARs read (no sysfs resource file; in a paste, no Region lines)" % slot)
            continue
        bar = _vram_bar(gpu, vendor)
        if bar is None:
            found.gap("%s: VRAM BAR not assigned" % slot, code="RB-FIRMWARE-BAR-UNASSIGNED")
            continue
        name = "BAR%d" % bar["index"]
        if bar["start"] is None:  # a size without a place (nvidia-smi -q's BAR1 Total, provision diagnose)
            bars[slot] = "%s %s (placement not read)" % (name, human_bytes(bar["size"]))
        else:
            bars[slot] = "%s %s at 0x%x" % (name, human_bytes(bar["size"]), bar["start"])
        if bar["start"] is not None and bar["start"] < FOUR_GIB:
            found.problem(
                "%s %s %s is mapped below 4 GiB: %s" % (slot, name, human_bytes(bar["size"]), (
                    "the hypervisor maps it in the 32-bit window" if vm else "Above 4G Decoding is off")),
                bios(ABOVE_4G_REMEDY),
                code="RB-FIRMWARE-BAR-BELOW-4G",
            )
        sizes = (gpu.get("resize") or {}).get(bar["index"]) or []
        largest = max(sizes) if sizes else None
        big_enough = (vram is not None and bar["size"] >= vram) or (largest is not None and bar["size"] >= largest)
        if vram is None and largest is None:
            big_enough = not (gpu["vendor"] == "nvidia" and bar["size"] <= 256 * MIB)
        if big_enough:
            continue
        if largest is not None and largest > bar["size"]:
            found.problem(
                "%s %s is %s but the card supports %s: Resizable BAR is off"
                % (slot, name, human_bytes(bar["size"]), human_bytes(largest)),
                bios(REBAR_REMEDY),
                code="RB-FIRMWARE-REBAR-OFF",
            )
        else:
            found.problem(
                "%s %s is only %s (VRAM %s): no large BAR, so peers cannot map this card's memory"
                % (slot, name, human_bytes(bar["size"]), human_bytes(vram)),
                bios(LARGE_BAR_REMEDY),
                code="RB-FIRMWARE-SMALL-BAR",
            )
    measured = {"uefi": bool(evidence.get("uefi")) if boot_read else "not read", "vram_bar": bars}
    expected = {"uefi": True, "vram_bar": ">= %s, above 4 GiB" % (human_bytes(vram) if vram else "VRAM")}
    if vm:
        measured["virtual_machine"] = virtual.get("seen")
        expected["uefi"] = "UEFI, or a virtual machine its hypervisor boots (no BIOS, no CSM)"
    if expected_p2p and found.problems and not vm:
        found.remedies.append(NO_BIOS_OPTION_REMEDY)
    if not expected_p2p and found.problems:
        p2p = ladder_view.get("p2p") or {}
        if "expected" in p2p:
            found.notes.append("P2P is declared unavailable on this host (%s)" % (p2p.get("reason") or "no reason"))
        else:
            found.notes.append("P2P is not expected (fewer than 2 GPUs and no rigbook_p2p)")
    return found.verdict(
        layer,
        measured,
        expected,
        fail_is_warn=not expected_p2p,
        ok_text=("%s; every VRAM BAR is large and %s" % (
            "UEFI boot" if evidence.get("uefi") else "boot mode not read" if not boot_read else
            "a virtual machine (%s), booted by its hypervisor: no BIOS or CSM to set" % virtual.get("seen"),
            "above 4 GiB" if all("placement not read" not in text for text in bars.values())
            else "above 4 GiB where its placement was read")),
    )


def _expected_link(ladder_view, slot):
    gpu = ladder_view.get("gpu") or {}
    link = dict(gpu.get("pcie") or {})
    for entry in gpu.get("per_gpu") or []:
        if entry.get("slot") == slot:
            link.update({k: v for k, v in entry.items() if k in ("gen", "width")})
    return link.get("gen"), link.get("width")


def _gen_of(speed):
    for gen, gts in GEN_SPEED_GTS.items():
        if speed is not None and abs(gts - speed) < 0.01:
            return gen
    return None


def _in_ranges(ids, ranges):
    vendor, _, device = (ids or "").partition(":")
    try:
        number = int(device, 16)
    except ValueError:
        return False
    return any(vendor == v and low <= number <= high for v, low, high in ranges)


def root_port_placement(gpu):
    """("cpu" | "pch" | None, words) for the root port at the top of GPU's upstream chain: a CPU root port, a
    chipset (PCH) one, or not known to rigbook (None)."""
    chain = gpu.get("chain") or []
    if not chain:
        return None, "no root port found above it"
    port = chain[-1]
    ids, slot = port.get("ids"), port.get("slot") or "?"
    where = "root port %s (%s)" % (slot, ids)
    if _in_ranges(ids, CPU_ROOT_PORTS):
        return "cpu", "CPU " + where
    if _in_ranges(ids, PCH_ROOT_PORTS):
        return "pch", "chipset (PCH) " + where
    bus_device = slot.split(":")[-2:] if slot.count(":") == 2 else []
    if (ids or "").startswith("8086:") and len(bus_device) == 2 and bus_device[0] == "00" and \
            bus_device[1].split(".")[0] == "%02x" % INTEL_PCH_ROOT_PORT_DEVICE:
        return "pch", "chipset (PCH) " + where + ", device 1c of bus 00"
    return None, where + ", not known to rigbook as a CPU or chipset port"


def _judge_placement(gpu, expected_p2p, found, measured):
    if not gpu.get("chain"):
        return  # on the root bus itself (a VM's passthrough GPU): no root port to place
    kind, words = root_port_placement(gpu)
    measured["placement %s" % gpu["slot"]] = words
    if kind == "pch" and expected_p2p:
        found.problem("%s sits behind the %s, not a CPU root port: %s" % (gpu["slot"], words, PCH_REASON),
                      PCH_REMEDY, code="RB-PCIE-BEHIND-PCH")


def _judge_slot_link(gpu, gen, width, found, measured, remedy):
    """On a card with its own PCIe switch (GPU -> downstream port -> upstream port -> root port), the slot link:
    between the device right below the root port (the card's switch upstream port) and the root port."""
    chain = gpu.get("chain") or []
    if len(chain) < 2:
        return  # no switch: the GPU's own link is the slot link
    slot, top, port = gpu["slot"], chain[-2], chain[-1]
    up, down = top.get("link") or {}, port.get("link") or {}
    speeds = [v for v in (up.get("max_speed_gts"), down.get("max_speed_gts")) if v is not None]
    widths = [v for v in (up.get("max_width"), down.get("max_width")) if v is not None]
    trained = [v for v in (up.get("current_width"), down.get("current_width")) if v is not None]
    current_width = min(trained) if trained else None  # one link, seen from both ends
    what = "%s slot link (switch upstream port %s -> root port %s)" % (slot, top.get("slot"), port.get("slot"))
    why = "the link that crosses the slot, behind which the card's own switch hides it from the GPU's link (seed 004 " \
          "checks Gen3 x16 on both cards)"
    if not speeds or not widths or current_width is None:
        found.gap("%s: speed/width not readable in sysfs" % what)
        return
    cap_speed, cap_width = min(speeds), min(widths)
    current = up.get("current_speed_gts")
    measured["slot link %s" % slot] = "%s -> %s: Gen%s x%d (now %s GT/s x%d)" % (
        top.get("slot"), port.get("slot"), _gen_of(cap_speed) or cap_speed, cap_width,
        current if current is not None else "?", current_width)
    if gen and cap_speed < GEN_SPEED_GTS[gen] - 0.01:
        found.problem("%s is capable of %s GT/s (Gen%s), rigbook_gpu.pcie expects Gen%d: %s"
                      % (what, cap_speed, _gen_of(cap_speed), gen, why), remedy, code="RB-PCIE-SLOT-LINK-SPEED")
    if width and cap_width < width:
        found.problem("%s is x%d capable, rigbook_gpu.pcie expects x%d: %s" % (what, cap_width, width, why), remedy,
                      code="RB-PCIE-SLOT-LINK-WIDTH-CAPABILITY")
    if current_width < cap_width:
        found.problem("%s trained at x%d of x%d: %s" % (what, current_width, cap_width, why), remedy,
                      code="RB-PCIE-SLOT-LINK-WIDTH")


def judge_pcie_link(evidence, ladder_view):
    """Per GPU: link capability (device and its port) vs rigbook_gpu.pcie; trained width vs capability; on a card
    with its own PCIe switch the slot link too (switch upstream port to root port); the root port a CPU one, not the
    chipset's, where P2P is expected."""
    layer = "pcie_link"
    gpus = evidence.get("gpus") or []
    if not gpus:
        return _no_gpus(layer, evidence)
    found = Findings()
    measured, expected = {}, {}
    expected_p2p = p2p_expected(evidence, ladder_view)
    remedy_slot = (
        "Reseat the card, check the riser/cable and the slot's electrical width and the BIOS "
        "PCIe bifurcation/speed settings (set the slot to Auto or the card's generation)."
    )
    if expected_p2p:
        expected["placement"] = "every GPU on a CPU root port (PHB), not behind the chipset (PCH)"
    for gpu in gpus:
        _judge_placement(gpu, expected_p2p, found, measured)
        _judge_slot_link(gpu, *_expected_link(ladder_view, gpu["slot"]), found=found, measured=measured,
                         remedy=remedy_slot)
        slot, link = gpu["slot"], gpu.get("link") or {}
        gen, width = _expected_link(ladder_view, slot)
        expected[slot] = "Gen%s x%s" % (gen or "?", width or "?")
        if link.get("max_speed_gts") is None or link.get("max_width") is None or link.get("current_width") is None:
            found.gap("%s: link speed/width not read (not in sysfs; in a paste, no LnkCap/LnkSta lines)" % slot)
            continue
        port = (gpu.get("chain") or [{}])[0].get("link") or {}
        cap_speed = min(s for s in (link["max_speed_gts"], port.get("max_speed_gts")) if s is not None)
        cap_width = min(w for w in (link["max_width"], port.get("max_width")) if w is not None)
        current = link.get("current_speed_gts")
        measured[slot] = "Gen%s x%d (now %s GT/s x%d)" % (
            _gen_of(cap_speed) or cap_speed,
            cap_width,
            current if current is not None else "?",
            link["current_width"],
        )
        if gen and cap_speed < GEN_SPEED_GTS[gen] - 0.01:
            found.problem(
                "%s link capability is %s GT/s (Gen%s), rigbook_gpu.pcie expects Gen%d (%s GT/s)"
                % (slot, cap_speed, _gen_of(cap_speed), gen, GEN_SPEED_GTS[gen]),
                remedy_slot,
                code="RB-PCIE-LINK-SPEED",
            )
        if width and cap_width < width:
            found.problem("%s link is x%d capable, rigbook_gpu.pcie expects x%d" % (slot, cap_width, width),
                          remedy_slot, code="RB-PCIE-LINK-WIDTH-CAPABILITY")
        if link["current_width"] < cap_width:
            found.problem("%s trained at x%d of x%d" % (slot, link["current_width"], cap_width), remedy_slot,
                          code="RB-PCIE-LINK-WIDTH")
        if current is not None and current < cap_speed - 0.01 and not found.problems:
            measured[slot] += ", idle down-clock (not a fault)"
    declared = [slot for slot in expected if slot != "placement" and expected[slot] != "Gen? x?"]
    if len(declared) == len(gpus):
        ok_text = "every GPU link at its expected generation and width"
    elif declared:
        ok_text = "the links with an expected generation and width (%s) at it; the others read, none expected " \
                  "(no rigbook_gpu.pcie gen/width for them), each trained at its full width" % ", ".join(declared)
    else:
        ok_text = "every GPU link read, each trained at its full width; no generation or width expected (no " \
                  "rigbook_gpu.pcie gen/width)"
    behind_pch = [g["slot"] for g in gpus if root_port_placement(g)[0] == "pch"]
    if behind_pch:  # only here when P2P is not expected: reported, not failed
        ok_text += "; %s behind the chipset (PCH), not a CPU root port (%s)" % (
            ", ".join(behind_pch), expectations.declared(ladder_view))
    return found.verdict(layer, measured, expected, ok_text=ok_text)


def iommu_mode(cmdline):
    """'passthrough', 'translated', 'off' or None (unknown) from the kernel command line."""
    if cmdline is None:
        return None
    tokens = set(cmdline)
    if "iommu=pt" in tokens:
        return "passthrough"
    if {"intel_iommu=off", "amd_iommu=off", "iommu=off"} & tokens:
        return "off"
    if {"intel_iommu=on", "amd_iommu=on", "amd_iommu=force_isolation"} & tokens:
        return "translated"
    return None


def judge_dma_window(evidence, ladder_view):
    """Every BAR of each GPU ends below the DMA reach of its peers (unless the IOMMU translates)."""
    layer = "dma_window"
    gpus = evidence.get("gpus") or []
    if not gpus:
        return _no_gpus(layer, evidence)
    if len(gpus) < 2:
        return make(layer, "skip", measured={"gpus": len(gpus)}, expected=None, why="one GPU: no peer to reach it")
    mode = iommu_mode((evidence.get("kernel") or {}).get("cmdline"))
    found = Findings()
    measured = {"iommu": mode}
    reach_of = {g["slot"]: DMA_REACH_BITS.get(g["vendor"], 44) for g in gpus}
    remedy = (
        "Make the BIOS place 64-bit MMIO lower (MMIO High Base / Above 4G MMIO size, e.g. below 16 TiB "
        "for amdgpu), or boot a kernel that copes with the peer's DMA limit (the X99/R9700 box runs "
        "6.8.12-r9700-p2p-dma44); keep iommu=pt for P2P."
    )
    for gpu in gpus:
        if gpu.get("bars") is None:
            found.gap("%s: no BARs read (no sysfs resource file; in a paste, no Region lines)" % gpu["slot"])
            continue
        memory = [b for b in gpu["bars"] if b["kind"] == "memory"]
        if any(b.get("end") is None for b in memory):
            found.gap("%s: where its BARs are placed was not read" % gpu["slot"])
            continue
        top = max(memory, key=lambda b: b["end"]) if memory else None
        if top is None:
            found.gap("%s: no memory BAR assigned" % gpu["slot"])
            continue
        measured[gpu["slot"]] = "highest BAR%d ends at 0x%x (%s)" % (
            top["index"],
            top["end"],
            human_bytes(top["end"] + 1),
        )
        for peer in gpus:
            if peer["slot"] == gpu["slot"]:
                continue
            bits = reach_of[peer["slot"]]
            if top["end"] >= (1 << bits) and mode != "translated":
                found.problem(
                    "%s BAR%d ends at 0x%x (%s), beyond the %d-bit (%s) DMA reach of %s %s"
                    % (
                        gpu["slot"],
                        top["index"],
                        top["end"],
                        human_bytes(top["end"] + 1),
                        bits,
                        human_bytes(1 << bits),
                        peer["vendor"],
                        peer["slot"],
                    ),
                    remedy,
                    code="RB-DMA-WINDOW-BEYOND-REACH",
                )
    if mode == "translated" and not found.problems:
        measured["note"] = "the IOMMU translates peer DMA; BAR addresses are not limited by the DMA mask"
    expected = {s: "below 2^%d" % b for s, b in reach_of.items()}
    return found.verdict(layer, measured, expected, ok_text="every GPU BAR is within its peers' DMA reach")


def _fork_for(evidence, vendor, release):
    """What an unpinned running kernel means for P2P: AMD's P2P path is the patched kernel itself; for NVIDIA,
    whether the P2P driver fork is built for it."""
    if vendor == "amd":
        return "; the running kernel is not the pinned P2P-patched one, so its P2PDMA path is not the one pinned"
    nvidia = evidence.get("nvidia") or {}
    if vendor != "nvidia" or "module_files" not in nvidia:
        return ""
    if not nvidia.get("module_files"):
        return ("; the P2P driver fork is not built for the running kernel (no nvidia module under "
                "lib/modules/%s): P2P is gone until the fork is built for it or the pinned kernel boots" % release)
    return "; an nvidia module is installed for it (%s)" % ", ".join(nvidia["module_files"])


def judge_kernel_state(evidence, ladder_view):
    """Running kernel and cmdline as pinned; P2PDMA built and allowed (AMD); nvidia_uvm's HMM off with iommu=pt where
    the open driver would then confine its host allocations to ZONE_DMA32 (hmm_confines_host_memory)."""
    layer = "kernel_state"
    kernel = evidence.get("kernel") or {}
    pins = ladder_view.get("pins") or {}
    pin = pins.get("kernel") or {}
    vendor = _vendor(evidence, ladder_view)
    found = Findings()
    release, cmdline = kernel.get("release"), kernel.get("cmdline")
    measured = {"release": release, "cmdline": " ".join(cmdline) if cmdline is not None else None}
    expected = {}
    if release is None:
        found.gap("running kernel release not readable")
    if pin.get("release"):
        expected["release"] = pin["release"]
        if release is not None and release != pin["release"]:
            found.problem(
                "running kernel %s, pinned %s%s" % (release, pin["release"], _fork_for(evidence, vendor, release)),
                "Boot the pinned kernel (GRUB default entry) or re-run provision so the kernel role "
                "and the driver build follow the new kernel, then update the pin.",
                code="RB-KERNEL-NOT-PINNED",
            )
    wanted = pin.get("cmdline") or []
    if wanted:
        expected["cmdline"] = " ".join(wanted)
        if cmdline is None:
            found.gap("kernel command line not readable")
        else:
            missing = [flag for flag in wanted if flag not in cmdline]
            if missing:
                found.problem(
                    "kernel command line lacks %s" % " ".join(missing),
                    "Re-run provision (the kernel role writes /etc/default/grub.d/rigbook.cfg and runs "
                    "update-grub), then reboot.",
                    code="RB-KERNEL-CMDLINE-FLAGS",
                )
    if vendor == "amd" and p2p_expected(evidence, ladder_view):
        _judge_p2pdma(evidence, pin, found, measured, expected)
    if vendor == "nvidia" and cmdline is not None and "iommu=pt" in cmdline:
        _judge_uvm_hmm(evidence, found, measured, expected)
    return found.verdict(layer, measured, expected, ok_text=_kernel_ok_text(release, expected))


def _kernel_ok_text(release, expected):
    """What a passing kernel_state checked: the pins it held the box to, or that nothing was pinned."""
    held = [words for key, words in (("release", "kernel %s as pinned" % release),
                                     ("cmdline", "the pinned command line flags present")) if key in expected]
    checks = [words for key, words in (("config", "P2PDMA built in"), ("p2pdma_host_bridge", "P2PDMA allowed"),
                                       ("uvm_disable_hmm", "nvidia_uvm's HMM as iommu=pt needs it")) if key in expected]
    if not held:
        held = ["nothing pinned (rigbook_pins.kernel): running kernel %s read, no release or command line to hold "
                "it to" % release]
    return "; ".join(held + checks)


CONFIG_CODES = {"CONFIG_PCI_P2PDMA": "RB-KERNEL-NO-PCI-P2PDMA", "CONFIG_HSA_AMD_P2P": "RB-KERNEL-NO-HSA-AMD-P2P"}


def _judge_p2pdma(evidence, pin, found, measured, expected):
    config = (evidence.get("kernel") or {}).get("config")
    expected["config"] = "CONFIG_PCI_P2PDMA=y CONFIG_HSA_AMD_P2P=y"
    if config is None:
        found.gap("kernel config not found (boot/config-<release> or /proc/config.gz)")
    else:
        measured["config"] = " ".join(
            "%s=%s" % (k, config.get(k, "missing")) for k in ("CONFIG_PCI_P2PDMA", "CONFIG_HSA_AMD_P2P")
        )
        for key in ("CONFIG_PCI_P2PDMA", "CONFIG_HSA_AMD_P2P"):
            if config.get(key) != "y":
                found.problem(
                    "%s is %s in the running kernel" % (key, config.get(key, "not set")),
                    "Use a kernel built with CONFIG_PCI_P2PDMA=y and CONFIG_HSA_AMD_P2P=y.",
                    code=CONFIG_CODES[key],
                )
    bridges = p2pdma_host_bridges(evidence)
    if bridges is None:
        return  # same root port (or one GPU): the bridge allow list does not apply
    if bridges == "zen":
        measured["p2pdma_host_bridge"] = "AMD Zen CPU (allowed by the kernel)"
        return
    allowed = P2PDMA_HOST_BRIDGES | {str(i).lower() for i in pin.get("p2pdma_allow") or []}
    measured["p2pdma_host_bridge"] = ", ".join(bridges)
    expected["p2pdma_host_bridge"] = "on the kernel's P2PDMA allow list"
    for ids in bridges:
        if ids == "unknown":
            found.gap("host bridge ids not readable (needed for P2PDMA across root ports)")
        elif ids not in allowed:
            found.problem(
                "the GPUs sit on different root ports and host bridge %s is not on the kernel's "
                "P2PDMA allow list" % ids,
                "Boot a kernel that allows this host bridge for P2PDMA (the X99/R9700 box patches "
                "8086:6f00 into drivers/pci/p2pdma.c) and list it in rigbook_pins.kernel.p2pdma_allow.",
                code="RB-KERNEL-P2PDMA-BRIDGE",
            )


def p2pdma_host_bridges(evidence):
    """The host bridge ids ("unknown" where unreadable) P2PDMA between EVIDENCE's GPUs crosses, sorted: None when the
    GPUs share a root port (or there is one GPU: no allow list applies), "zen" on an AMD Zen CPU (always allowed)."""
    gpus = evidence.get("gpus") or []
    ports = {(g.get("chain") or [{}])[-1].get("slot") for g in gpus}
    if len(gpus) < 2 or len(ports) < 2:
        return None
    cpu = evidence.get("cpu") or {}
    if cpu.get("vendor") == "AuthenticAMD" and (cpu.get("family") or 0) >= 0x17:
        return "zen"
    return sorted({(g.get("host_bridge") or {}).get("ids") or "unknown" for g in gpus})


# The public source for HMM off with iommu=pt: a bug of NVIDIA's open driver (not of the P2P patches). With HMM on,
# nvidia_uvm registers each GPU's memory as device-private memory at the top of the physical address space; the
# driver's largest system address (nv_get_max_sysmem_address, kernel-open/nvidia/nv-vm.c) then exceeds the GPU's DMA
# mask, and under iommu=pt (direct DMA) nv_compute_gfp_mask adds GFP_DMA32: every cuMem host allocation comes from
# the ~2 GiB ZONE_DMA32 and NCCL >= 2.26.3's SHM transport crashes ("Error while attaching to shared memory segment
# /dev/shm/nccl-..."). It needs all of: the open driver, HMM on (its default), iommu=pt, and a physical address space
# that reaches beyond the GPU's DMA mask (the source's EPYC: 52 bits; an X99 Xeon E5 v3/v4 has 46, within an NVIDIA
# GPU's 47: seed 000's box runs HMM at its default and works).
HMM_SOURCE = ("WU-CVGL/cluster-setup docs/05_GPU_P2P_RTX4090.md, \"HMM breaks host cuMem allocations under IOMMU "
              "passthrough\" (NVIDIA/nccl#2190)")
HMM_REMEDY = ("Add `options nvidia-uvm uvm_disable_hmm=1` in /etc/modprobe.d (the driver role writes it while "
              "rigbook_pins.nvidia_driver.uvm_disable_hmm is true, its default with iommu=pt) and reboot: with HMM on "
              "and iommu=pt the open driver takes every cuMem host allocation from the ~2 GiB ZONE_DMA32 on this CPU, "
              "and NCCL's SHM transport crashes (%s)." % HMM_SOURCE)


def gpu_dma_mask_bits(evidence):
    """The narrowest DMA mask the NVIDIA driver set on the GPUs (sysfs dma_mask_bits; a mask of 32 bits or none is the
    PCI core's default before a driver binds), else NVIDIA's 47 bits."""
    masks = [g.get("dma_mask_bits") for g in evidence.get("gpus") or [] if g.get("vendor") == "nvidia"]
    masks = [bits for bits in masks if isinstance(bits, int) and 32 < bits <= 64]
    return min(masks) if masks else DMA_REACH_BITS["nvidia"]


def hmm_confines_host_memory(open_module, cpu_address_bits, gpu_dma_bits=DMA_REACH_BITS["nvidia"]):
    """Whether nvidia_uvm with HMM on would, under iommu=pt, confine the driver's host allocations to ZONE_DMA32 (the
    cited failure, HMM_SOURCE): False with NVIDIA's proprietary module (the cited bug is the open driver's) or
    where the CPU's physical addresses (CPU_ADDRESS_BITS, /proc/cpuinfo "address sizes") end within the GPU's DMA mask
    (GPU_DMA_BITS: the device-private regions HMM registers lie below the top of the physical address space); True
    where they reach beyond it; None when the CPU's address width is not known."""
    if open_module is False:
        return False
    if not cpu_address_bits:
        return None
    return cpu_address_bits > gpu_dma_bits


def _judge_uvm_hmm(evidence, found, measured, expected):
    nvidia = evidence.get("nvidia") or {}
    value = nvidia.get("uvm_disable_hmm")
    bits = (evidence.get("cpu") or {}).get("address_bits")
    dma_bits = gpu_dma_mask_bits(evidence)
    confines = hmm_confines_host_memory(nvidia.get("open_kernel_module"), bits, dma_bits)
    if confines is False and nvidia.get("open_kernel_module") is False:
        why_not = "the loaded module is NVIDIA's proprietary one and the cited bug is the open driver's"
    elif confines is False:
        why_not = ("this CPU's %d-bit physical addresses end within the GPUs' %d-bit DMA mask, so the driver does "
                   "not confine host allocations to ZONE_DMA32" % (bits, dma_bits))
    elif confines:
        why = ("this CPU's %d-bit physical addresses reach beyond the GPUs' %d-bit DMA mask: the open driver takes "
               "cuMem host allocations from ZONE_DMA32" % (bits, dma_bits))
    else:
        why = "this CPU's physical address width is not known (no \"address sizes\" in /proc/cpuinfo)"
    measured["uvm_disable_hmm"] = value
    expected["uvm_disable_hmm"] = "Y with iommu=pt, unless the CPU's physical addresses fit the GPUs' DMA mask"
    if value is None:
        if nvidia.get("modprobe_uvm_disable_hmm"):
            measured["uvm_disable_hmm"] = "set in modprobe.d (nvidia_uvm not loaded)"
        elif confines is False:
            measured["uvm_disable_hmm"] = "nvidia_uvm not loaded; HMM need not be off here: %s" % why_not
        else:
            found.note("nvidia_uvm is not loaded and no modprobe.d option disables HMM (%s)" % why, HMM_REMEDY,
                       code="RB-KERNEL-UVM-HMM-UNSET")
    elif value.upper() not in ("Y", "1"):
        if confines is False:
            measured["uvm_disable_hmm"] = "%s: HMM on (the driver's default), not the cited failure here: %s (%s)" % (
                value, why_not, HMM_SOURCE)
        else:
            found.problem("nvidia_uvm runs with HMM enabled (uvm_disable_hmm=%s) while iommu=pt: %s" % (value, why),
                          HMM_REMEDY, code="RB-KERNEL-UVM-HMM-ON")


def judge_driver_state(evidence, ladder_view):
    layer = "driver_state"
    vendor = _vendor(evidence, ladder_view)
    if vendor == "nvidia":
        return _judge_nvidia_driver(evidence, ladder_view)
    if vendor == "amd":
        return _judge_amd_driver(evidence, ladder_view)
    return make(
        layer, "unknown", measured=None, expected=None, why="GPU vendor unknown (no rigbook_gpu.vendor, no GPU)"
    )


# Where an nvidia.ko under lib/modules/<release> came from, by its folder: DKMS installs the fork to updates/dkms (its
# dkms.conf DEST_MODULE_LOCATION); the fork's own `make modules_install` and NVIDIA's .run installer to
# kernel/drivers/video (NVIDIA/open-gpu-kernel-modules kernel-open/Makefile: INSTALL_MOD_DIR ?= kernel/drivers/video;
# seed 000's way: built, installed, "the old DKMS module cleared, then depmod"); Ubuntu's prebuilt
# linux-modules-nvidia-* packages to kernel/nvidia-<branch>.
MODULE_ORIGINS = (
    ("updates/dkms/", "a DKMS build"),
    ("kernel/drivers/video/", "installed by hand (the fork's make modules_install, or NVIDIA's .run installer)"),
    ("kernel/nvidia-", "a distribution package's prebuilt module"),
)


def module_origin(rel):
    """What installed the module file REL (relative to lib/modules/<release>), in words (MODULE_ORIGINS)."""
    for prefix, words in MODULE_ORIGINS:
        if rel.startswith(prefix):
            return words
    return "installed outside DKMS"


def pinned_open(pin):
    """Whether the driver pin asks for NVIDIA's open kernel modules: its `open` when the pin says it; True when it
    names the P2P fork's source (`source` or `fork_repo`: the fork is a patched build of the open kernel modules);
    None when it says neither (the module kind is then not judged)."""
    if isinstance(pin.get("open"), bool):
        return pin["open"]
    if pins_fork(pin):
        return True
    return None


def pins_fork(pin):
    """Whether the driver pin names the P2P fork's source (`source` or `fork_repo`), not NVIDIA's stock driver."""
    return bool(pin.get("source") or pin.get("fork_repo"))


def _stamp_of(nv, version):
    """rigbook's build stamp of VERSION for the running kernel (static_evidence.nvidia_build_stamps), or None."""
    for stamp in nv.get("build_stamps") or []:
        if stamp.get("version") == version:
            return stamp
    return None


def _judge_nvidia_driver(evidence, ladder_view):
    """The LOADED module against the pin: loaded at all, its version, open or proprietary (where the pin says), the
    srcversion of the DKMS build rigbook made and stamped for the running kernel; userspace equal. Where its file sits
    (DKMS, or installed by hand as seed 000 did) is a note: the hand-installed fork works until the next kernel."""
    layer = "driver_state"
    nv = evidence.get("nvidia") or {}
    pin = (ladder_view.get("pins") or {}).get("nvidia_driver") or {}
    release = (evidence.get("kernel") or {}).get("release")
    found = Findings()
    loaded = nv.get("module_version") or nv.get("proc_module_version")
    files = nv.get("module_files") or []
    measured = {
        "module": loaded,
        "open": nv.get("open_kernel_module"),
        "srcversion": nv.get("srcversion"),
        "files": ["%s (%s)" % (f, module_origin(f)) for f in files] if files else nv.get("module_files"),
        "userspace": nv.get("userspace_version"),
    }
    expected = {"module": pin.get("version"), "userspace": pin.get("userspace_version") or pin.get("version")}
    rebuild = (
        "Re-run provision: the driver role builds the pinned fork through DKMS for every installed kernel "
        "(dkms autoinstall -k %s), moves copies installed by hand aside, and asks for a reboot."
        % (release or "<kernel>")
    )
    if not nv.get("loaded") and not loaded:
        if not files:
            found.problem("no nvidia module is installed for the running kernel %s" % release, rebuild,
                          code="RB-DRIVER-NO-MODULE")
        else:
            found.problem(
                "the nvidia module is installed for %s but not loaded" % release,
                "Load it (modprobe nvidia) or reboot; check dmesg for why it did not load.",
                code="RB-DRIVER-NOT-LOADED",
            )
    elif loaded is None:
        found.gap("the nvidia module is loaded but its version is not readable")
    elif pin.get("version") and loaded != pin["version"]:
        found.problem("the loaded nvidia module is %s, pinned %s" % (loaded, pin["version"]), rebuild,
                      code="RB-DRIVER-VERSION-NOT-PINNED")
    want_open = pinned_open(pin)
    if want_open is not None and loaded:
        expected["open"] = want_open
        kind = {True: "NVIDIA's open kernel module", False: "NVIDIA's proprietary kernel module"}
        if nv.get("open_kernel_module") is None:
            found.gap("whether the loaded module is the open or the proprietary one is not readable "
                      "(/proc/driver/nvidia/version)")
        elif nv["open_kernel_module"] != want_open:
            found.problem("the loaded nvidia module is %s, the pin is %s%s" % (
                kind[nv["open_kernel_module"]], kind[want_open],
                " (the P2P fork is a patched build of the open modules)" if want_open else ""), rebuild,
                code="RB-DRIVER-MODULE-KIND")
    _judge_srcversion(nv, loaded, release, found, measured, expected)
    _judge_fork_or_stock(nv, pin, loaded, release, files, found)
    if files and pin.get("version") and not [f for f in files if f.startswith("updates/dkms/")]:
        found.note(
            "nvidia.ko for %s is %s (%s), not a DKMS build: it runs, but a kernel upgrade does not rebuild it"
            % (release, module_origin(files[0]), ", ".join(files)),
            "The converge (nvidia_p2p_driver role) builds the pinned fork with DKMS for every installed kernel, so a "
            "kernel upgrade rebuilds it, and moves the hand-installed files aside (under /var/lib/rigbook); "
            "`provision -i INVENTORY site.yml --check --diff` says so before anything changes.",
            code="RB-DRIVER-NOT-DKMS",
        )
    userspace = nv.get("userspace_version")
    want_user = pin.get("userspace_version") or pin.get("version")
    if userspace is None and loaded:
        found.gap("userspace driver version not readable (%s)" % nv.get("userspace_source"))
    elif userspace and loaded and userspace != loaded:
        found.problem(
            "userspace %s and kernel module %s differ (Driver/library version mismatch)" % (userspace, loaded),
            "Run the %s userspace installer with --no-kernel-modules and hold the packages." % want_user,
            code="RB-DRIVER-USERSPACE-MISMATCH",
        )
    elif userspace and want_user and userspace != want_user:
        found.problem(
            "userspace driver %s, pinned %s" % (userspace, want_user),
            "Install the pinned userspace with --no-kernel-modules.",
            code="RB-DRIVER-USERSPACE-NOT-PINNED",
        )
    return found.verdict(layer, measured, expected, ok_text=_driver_ok_text(nv, pin, loaded, files, expected))


def _judge_fork_or_stock(nv, pin, loaded, release, files, found):
    """A pin of the P2P fork, the loaded module of its version: what tells it from NVIDIA's stock build of that
    version is rigbook's build stamp (its srcversion, _judge_srcversion) or the module file DKMS installed. With
    neither (no module file for the running kernel at all: a driver the platform injects, as on a cloud VM with no
    lib/modules) nothing tells them apart: unknown, never a pass."""
    if not (pins_fork(pin) and loaded) or files or _stamp_of(nv, loaded) is not None:
        return
    found.gap("the pin names the P2P driver fork (%s) but no nvidia module file exists for the running kernel %s "
              "(nothing under lib/modules/%s) and rigbook stamped no DKMS build of %s: nothing here tells the loaded "
              "module from NVIDIA's stock %s" % (pin.get("fork_repo") or "its source", release, release, loaded,
                                                 loaded),
              code="RB-DRIVER-FORK-UNTELLABLE")


def _driver_ok_text(nv, pin, loaded, files, expected):
    """What a passing driver_state checked: the pinned version and which build of it, or that nothing was pinned."""
    userspace = nv.get("userspace_version")
    if not pin.get("version") and not pins_fork(pin):
        return ("nothing pinned (rigbook_pins.nvidia_driver): nvidia %s loaded, userspace %s matches it"
                % (loaded, userspace))
    if "srcversion" in expected:
        build = "rigbook's DKMS build of it (its srcversion)"
    elif [f for f in files if f.startswith("updates/dkms/")]:
        build = "a DKMS build of it (lib/modules/.../updates/dkms)"
    else:
        build = None
    what = "the pinned %s%s" % ("P2P fork " if pins_fork(pin) else "driver ", pin.get("version") or loaded)
    return "%s is loaded%s, userspace matches" % (what, (" as " + build) if build else "")


def _judge_srcversion(nv, loaded, release, found, measured, expected):
    """The loaded nvidia module's srcversion (/sys/module/nvidia/srcversion) against the DKMS build rigbook made for
    the running kernel, when it made one of the loaded version (its build stamp in DKMS's tree): another copy of the
    same version loaded instead (one installed by hand, or the module from before the build, still in memory) is the
    build's srcversion no more. nvidia.ko's srcversion covers its kernel interface layer (WU-CVGL/cluster-setup
    docs/05_GPU_P2P_RTX4090.md), so this tells builds apart, not every patch of the core."""
    if nv.get("build_stamp_error"):
        measured["build_stamp"] = "unreadable: %s" % nv["build_stamp_error"]
    stamp = _stamp_of(nv, loaded) if loaded else None
    if stamp is None:
        return
    want = ((stamp.get("modules") or {}).get("nvidia") or {}).get("srcversion")
    measured["build_stamp"] = stamp.get("path")
    if not want:
        return
    expected["srcversion"] = "%s (rigbook's DKMS build for %s)" % (want, release)
    have = nv.get("srcversion")
    if have is None:
        found.gap("the loaded nvidia module's srcversion is not readable (/sys/module/nvidia/srcversion)")
    elif have != want:
        found.problem(
            "the loaded nvidia module %s (srcversion %s) is not the DKMS build rigbook made for %s (srcversion %s): "
            "another copy of that version is loaded" % (loaded, have, release, want),
            "Reboot so the DKMS build loads (or modprobe -r nvidia_uvm nvidia_drm nvidia_modeset nvidia, then "
            "modprobe nvidia); if it still differs, find the copy that wins: modinfo -n nvidia.",
            code="RB-DRIVER-NOT-PINNED-BUILD",
        )


def _judge_amd_driver(evidence, ladder_view):
    layer = "driver_state"
    amd = evidence.get("amd") or {}
    pin = (ladder_view.get("pins") or {}).get("rocm") or {}
    found = Findings()
    nodes = [n for n in amd.get("kfd_nodes") or [] if n.get("gpu")]
    measured = {
        "amdgpu": amd.get("loaded"),
        "rocm": amd.get("rocm_version"),
        "kfd_p2p_links": [n.get("p2p_links_count") for n in nodes],
    }
    expected = {"amdgpu": True, "rocm": pin.get("version")}
    if not amd.get("loaded"):
        found.problem(
            "amdgpu is not loaded",
            "Check dmesg; after a kernel upgrade rebuild amdgpu-dkms or reboot into the pinned kernel.",
            code="RB-DRIVER-AMDGPU-NOT-LOADED",
        )
    if pin.get("version"):
        if amd.get("rocm_version") is None:
            found.gap("ROCm version not readable (/opt/rocm/.info/version)")
        elif not str(amd["rocm_version"]).startswith(str(pin["version"])):
            found.problem("ROCm %s, pinned %s" % (amd["rocm_version"], pin["version"]), "Install the pinned ROCm.",
                          code="RB-DRIVER-ROCM-NOT-PINNED")
    if p2p_expected(evidence, ladder_view) and amd.get("loaded"):
        expected["kfd_p2p_links"] = ">= 1 on every GPU node"
        if not nodes:
            found.gap("no KFD GPU nodes in /sys/class/kfd/kfd/topology")
        for node in nodes:
            if node.get("p2p_links_count") is None:
                found.gap("KFD node %s has no p2p_links_count" % node["node"])
            elif node["p2p_links_count"] < 1:
                found.problem(
                    "KFD node %s has no P2P link: amdgpu refused peer access" % node["node"],
                    "amdgpu needs CONFIG_HSA_AMD_P2P, a large BAR, the peer BAR within its DMA "
                    "reach and a P2PDMA-allowed path: see the layers below.",
                    code="RB-DRIVER-KFD-NO-P2P-LINK",
                )
    return found.verdict(layer, measured, expected, ok_text="amdgpu loaded, ROCm as pinned, KFD P2P links present")
