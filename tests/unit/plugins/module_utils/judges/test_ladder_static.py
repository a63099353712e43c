"""Pure judges of the five static layers, driven by evidence dicts (no I/O)."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers as L
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry

GIB, MIB, TIB = 1 << 30, 1 << 20, 1 << 40


def bar(index, start, size, prefetchable=True, bits=64):
    return {"index": index, "start": start, "end": start + size - 1, "size": size, "kind": "memory",
            "prefetchable": prefetchable, "bits": bits}


def gpu(slot, vendor, vram_bar, port, bridge="8086:6f00", speed=8.0, width=16, cur_speed=8.0, cur_width=16,
        resize=None, extra_bars=()):
    return {
        "slot": slot, "vendor": vendor, "bars": [vram_bar, *extra_bars], "resize": resize or {},
        "link": {"current_speed_gts": cur_speed, "max_speed_gts": speed, "current_width": cur_width,
                 "max_width": width},
        "chain": [{"slot": port, "ids": "8086:6f08", "link": {"max_speed_gts": 8.0, "max_width": 16}}],
        "host_bridge": {"slot": "0000:00:00.0", "ids": bridge},
    }


def r9700_evidence():
    """Shaped like the X99 + 2x R9700 box of the write-up (reconstruction, not a capture)."""
    gpus = [gpu("0000:03:00.0", "amd", bar(0, 0x38_0000_0000, 32 * GIB), "0000:00:02.0",
                extra_bars=[bar(2, 0x38_8000_0000, 2 * MIB)]),
            gpu("0000:04:00.0", "amd", bar(0, 0x30_0000_0000, 32 * GIB), "0000:00:03.0")]
    return {
        "root": "/recorded", "error": None, "uefi": True, "gpus": gpus,
        "cpu": {"vendor": "GenuineIntel", "family": 6},
        "kernel": {"release": "6.8.12-r9700-p2p-dma44", "cmdline": ["ro", "iommu=pt"],
                   "config": {"CONFIG_PCI_P2PDMA": "y", "CONFIG_HSA_AMD_P2P": "y"}},
        "amd": {"loaded": True, "rocm_version": "7.2.0-100",
                "kfd_nodes": [{"node": "0", "gpu": False, "p2p_links_count": 0},
                              {"node": "1", "gpu": True, "p2p_links_count": 1},
                              {"node": "2", "gpu": True, "p2p_links_count": 1}]},
        "nvidia": {"loaded": False},
    }


R9700 = {"gpu": {"vendor": "amd", "count": 2, "vram_gib": 32, "pcie": {"gen": 3, "width": 16}},
         "p2p": {"expected": True, "nccl_p2p_level": "PHB"},
         "pins": {"kernel": {"release": "6.8.12-r9700-p2p-dma44", "cmdline": ["iommu=pt"],
                             "p2pdma_allow": ["8086:6f00"]}, "rocm": {"version": "7.2"}}}


def x3080_evidence():
    """Shaped like the X99 TF + 2x RTX 3080 20G box: BAR1 256 MiB below 4 GiB (reconstruction)."""
    gpus = [gpu("0000:03:00.0", "nvidia", bar(1, 0xC000_0000, 256 * MIB), "0000:00:02.0", bridge="8086:2f00",
                cur_speed=2.5, extra_bars=[bar(0, 0xF600_0000, 16 * MIB, prefetchable=False, bits=32)]),
            gpu("0000:04:00.0", "nvidia", bar(1, 0xB000_0000, 256 * MIB), "0000:00:03.0", bridge="8086:2f00",
                cur_speed=2.5)]
    return {
        "root": "/recorded", "error": None, "uefi": True, "gpus": gpus,
        "cpu": {"vendor": "GenuineIntel", "family": 6},
        "kernel": {"release": "7.0.0-31-generic", "cmdline": ["intel_iommu=on", "iommu=pt"], "config": {}},
        "nvidia": {"loaded": True, "module_version": "615.71.09", "proc_module_version": "615.71.09",
                   "open_kernel_module": True, "module_files": ["updates/dkms/nvidia.ko.zst"],
                   "userspace_version": "615.71.09", "uvm_disable_hmm": "Y"},
        "amd": {"loaded": False, "kfd_nodes": []},
    }


X3080 = {"gpu": {"vendor": "nvidia", "count": 2, "vram_gib": 20, "pcie": {"gen": 3, "width": 16}},
         "p2p": {"expected": False, "reason": "BAR1 256 MiB, no ReBAR in this BIOS"},
         "pins": {"kernel": {"release": "7.0.0-31-generic", "cmdline": ["intel_iommu=on", "iommu=pt"]},
                  "nvidia_driver": {"version": "615.71.09", "userspace_version": "615.71.09"}}}


def static_climb(evidence, ladder_view, layers=None, stop_at_fail=True):
    """The static layers of the registry judged on EVIDENCE, through the one climb."""
    chosen = registry.of_phase(registry.STATIC) if layers is None else layers
    return climb.climb(chosen, climb.Context("/x", ladder_view), stop_at_fail, evidence=evidence)[0]


def statuses(evidence, ladder_view):
    return {v["layer"]: v["status"] for v in static_climb(evidence, ladder_view, stop_at_fail=False)}


def test_healthy_r9700_passes_all_five():
    assert statuses(r9700_evidence(), R9700) == dict.fromkeys(
        ["firmware", "pcie_link", "dma_window", "kernel_state", "driver_state"], "pass")


def test_3080_without_p2p_warns_on_bar1_and_passes_the_rest():
    result = statuses(x3080_evidence(), X3080)
    assert result == {"firmware": "warn", "pcie_link": "pass", "dma_window": "pass", "kernel_state": "pass",
                      "driver_state": "pass"}
    firmware = L.judge_firmware(x3080_evidence(), X3080)
    assert "BAR1 256 MiB" in firmware["measured"]["vram_bar"]["0000:03:00.0"]
    assert "256 MiB" in firmware["why"] and "declared unavailable" in firmware["why"]


def test_3080_with_p2p_expected_fails_firmware_with_bios_remedy():
    ladder_view = copy.deepcopy(X3080)
    ladder_view["p2p"] = {"expected": True}
    verdict = L.judge_firmware(x3080_evidence(), ladder_view)
    assert verdict["status"] == "fail"
    assert "below 4 GiB" in verdict["why"] and "only 256 MiB" in verdict["why"]
    assert "Above 4G Decoding ON" in verdict["remedy"] and "not possible on this board" in verdict["remedy"]
    assert verdict["code"] == "RB-FIRMWARE-BAR-BELOW-4G"
    assert verdict["codes"] == ["RB-FIRMWARE-BAR-BELOW-4G", "RB-FIRMWARE-SMALL-BAR"]


def test_rebar_off_is_named_when_the_card_supports_more():
    ev = r9700_evidence()
    ev["gpus"][1]["bars"][0] = bar(0, 0x30_0000_0000, 256 * MIB)
    ev["gpus"][1]["resize"] = {0: [256 * MIB, 512 * MIB, GIB, 32 * GIB]}
    verdict = L.judge_firmware(ev, R9700)
    assert verdict["status"] == "fail" and "Resizable BAR is off" in verdict["why"]
    assert "supports 32 GiB" in verdict["why"]
    assert verdict["code"] == "RB-FIRMWARE-REBAR-OFF" and "codes" not in verdict


def test_legacy_boot_fails_firmware_when_p2p_expected():
    ev = r9700_evidence()
    ev["uefi"] = False
    verdict = L.judge_firmware(ev, R9700)
    assert verdict["status"] == "fail" and "CSM" in verdict["why"]
    assert verdict["code"] == "RB-FIRMWARE-CSM-ON"


@pytest.mark.parametrize("layer", ["firmware", "pcie_link", "dma_window"])
def test_no_gpu_evidence_is_unknown_never_pass(layer):
    ev = {"root": "/x", "error": None, "uefi": True, "gpus": [], "kernel": {}}
    assert registry.get(layer).judge(ev, climb.Context("/x", R9700))["status"] == "unknown"


def test_unreadable_resource_file_is_unknown():
    ev = r9700_evidence()
    ev["gpus"][0]["bars"] = None
    assert L.judge_firmware(ev, R9700)["status"] == "unknown"
    assert L.judge_firmware(ev, R9700)["code"] == "RB-FIRMWARE-UNKNOWN"  # not read: the generic code
    ev["gpus"][0]["bars"] = []
    assert L.judge_firmware(ev, R9700)["code"] == "RB-FIRMWARE-BAR-UNASSIGNED"


def test_idle_downclock_is_not_a_fault():
    verdict = L.judge_pcie_link(x3080_evidence(), X3080)
    assert verdict["status"] == "pass"
    assert "idle down-clock" in verdict["measured"]["0000:03:00.0"]


def test_link_trained_at_x8_fails():
    ev = r9700_evidence()
    ev["gpus"][1]["link"]["current_width"] = 8
    verdict = L.judge_pcie_link(ev, R9700)
    assert verdict["status"] == "fail" and "0000:04:00.0 trained at x8 of x16" in verdict["why"]
    assert verdict["code"] == "RB-PCIE-LINK-WIDTH" and "codes" not in verdict


def test_the_one_call_ladder_stops_at_the_first_failing_layer():
    ev = r9700_evidence()
    ev["gpus"][1]["link"]["current_width"] = 8
    climbed = static_climb(ev, R9700)
    assert [(v["layer"], v["status"]) for v in climbed] == [("firmware", "pass"), ("pcie_link", "fail")]
    assert climbed == static_climb(ev, R9700, stop_at_fail=False)[:2]


def test_the_one_call_ladder_judges_only_the_layers_asked_in_ladder_order():
    climbed = static_climb(r9700_evidence(), R9700, ["driver_state", "dma_window"])
    assert [v["layer"] for v in climbed] == ["dma_window", "driver_state"]
    assert static_climb(r9700_evidence(), R9700, []) == []


def test_port_limited_to_gen1_fails():
    ev = r9700_evidence()
    ev["gpus"][0]["chain"][0]["link"]["max_speed_gts"] = 2.5
    verdict = L.judge_pcie_link(ev, R9700)
    assert verdict["status"] == "fail" and "2.5 GT/s (Gen1)" in verdict["why"] and "Gen3" in verdict["why"]
    assert verdict["code"] == "RB-PCIE-LINK-SPEED"


def test_per_gpu_override_of_expected_link():
    ev = r9700_evidence()
    ev["gpus"][1]["link"].update(max_width=8, current_width=8)
    ev["gpus"][1]["chain"][0]["link"]["max_width"] = 8
    assert L.judge_pcie_link(ev, R9700)["status"] == "fail"
    assert L.judge_pcie_link(ev, R9700)["code"] == "RB-PCIE-LINK-WIDTH-CAPABILITY"
    ladder_view = copy.deepcopy(R9700)
    ladder_view["gpu"]["per_gpu"] = [{"slot": "0000:04:00.0", "width": 8}]
    assert L.judge_pcie_link(ev, ladder_view)["status"] == "pass"


def test_bar_at_56_tib_is_beyond_amdgpu_44_bit_reach():
    ev = r9700_evidence()
    ev["gpus"][1]["bars"][0] = bar(0, 0x3800_0000_0000, 32 * GIB)  # 56 TiB, the write-up's failure
    verdict = L.judge_dma_window(ev, R9700)
    assert verdict["status"] == "fail"
    assert "44-bit (16 TiB) DMA reach of amd 0000:03:00.0" in verdict["why"]
    assert verdict["code"] == "RB-DMA-WINDOW-BEYOND-REACH"
    assert "56" in verdict["why"]


def test_translating_iommu_lifts_the_dma_limit():
    ev = r9700_evidence()
    ev["gpus"][1]["bars"][0] = bar(0, 0x3800_0000_0000, 32 * GIB)
    ev["kernel"]["cmdline"] = ["intel_iommu=on"]
    verdict = L.judge_dma_window(ev, R9700)
    assert verdict["status"] == "pass" and "translates" in verdict["measured"]["note"]


def test_nvidia_reach_is_47_bits():
    ev = x3080_evidence()
    ev["gpus"][1]["bars"][0] = bar(1, 0x1000_0000_0000, 256 * GIB)  # 16 TiB, as the H200 VM maps it
    assert L.judge_dma_window(ev, X3080)["status"] == "pass"
    ev["gpus"][1]["bars"][0] = bar(1, 1 << 47, 256 * GIB)
    assert L.judge_dma_window(ev, X3080)["status"] == "fail"


def test_kernel_upgrade_and_lost_cmdline_flags_fail_kernel_state():
    ev = x3080_evidence()
    ev["kernel"]["release"] = "7.0.0-40-generic"
    ev["kernel"]["cmdline"] = ["ro", "quiet"]
    verdict = L.judge_kernel_state(ev, X3080)
    assert verdict["status"] == "fail"
    assert "running kernel 7.0.0-40-generic, pinned 7.0.0-31-generic" in verdict["why"]
    assert "lacks intel_iommu=on iommu=pt" in verdict["why"]
    assert verdict["codes"] == ["RB-KERNEL-NOT-PINNED", "RB-KERNEL-CMDLINE-FLAGS"]


def test_an_unpinned_running_kernel_says_whether_the_p2p_fork_is_built_for_it():
    ev = x3080_evidence()
    ev["kernel"]["release"] = "7.0.0-40-generic"
    ev["nvidia"] = {"module_files": []}
    why = L.judge_kernel_state(ev, X3080)["why"]
    assert ("running kernel 7.0.0-40-generic, pinned 7.0.0-31-generic; the P2P driver fork is not built for the "
            "running kernel (no nvidia module under lib/modules/7.0.0-40-generic)") in why, why
    ev["nvidia"] = {"module_files": ["updates/dkms/nvidia.ko"]}
    why = L.judge_kernel_state(ev, X3080)["why"]
    assert "an nvidia module is installed for it (updates/dkms/nvidia.ko)" in why and "not built" not in why
    ev.pop("nvidia")  # not read (a replayed tree without the part): nothing claimed either way
    assert "fork" not in L.judge_kernel_state(ev, X3080)["why"]


def test_broadwell_host_bridge_needs_the_patched_kernel_allowance():
    ladder_view = copy.deepcopy(R9700)
    del ladder_view["pins"]["kernel"]["p2pdma_allow"]
    verdict = L.judge_kernel_state(r9700_evidence(), ladder_view)
    assert verdict["status"] == "fail" and "host bridge 8086:6f00" in verdict["why"]
    assert verdict["code"] == "RB-KERNEL-P2PDMA-BRIDGE"


def test_same_root_port_or_zen_needs_no_allowance():
    ladder_view = copy.deepcopy(R9700)
    del ladder_view["pins"]["kernel"]["p2pdma_allow"]
    ev = r9700_evidence()
    ev["cpu"] = {"vendor": "AuthenticAMD", "family": 0x19}
    assert L.judge_kernel_state(ev, ladder_view)["status"] == "pass"


def test_p2pdma_config_missing_or_off():
    ev = r9700_evidence()
    ev["kernel"]["config"] = None
    assert L.judge_kernel_state(ev, R9700)["status"] == "unknown"
    ev["kernel"]["config"] = {"CONFIG_PCI_P2PDMA": "y", "CONFIG_HSA_AMD_P2P": "n"}
    verdict = L.judge_kernel_state(ev, R9700)
    assert verdict["status"] == "fail" and "CONFIG_HSA_AMD_P2P is n" in verdict["why"]
    assert verdict["code"] == "RB-KERNEL-NO-HSA-AMD-P2P" and "codes" not in verdict
    ev["kernel"]["config"] = {}
    assert L.judge_kernel_state(ev, R9700)["codes"] == ["RB-KERNEL-NO-PCI-P2PDMA", "RB-KERNEL-NO-HSA-AMD-P2P"]


def test_uvm_hmm_with_iommu_pt_fails():
    ev = x3080_evidence()
    ev["nvidia"]["uvm_disable_hmm"] = "N"
    verdict = L.judge_kernel_state(ev, X3080)
    assert verdict["status"] == "fail" and "uvm_disable_hmm" in verdict["remedy"]
    assert verdict["code"] == "RB-KERNEL-UVM-HMM-ON"


def test_module_missing_after_kernel_upgrade_fails_driver_state():
    ev = x3080_evidence()
    ev["kernel"]["release"] = "7.0.0-40-generic"
    ev["nvidia"].update(loaded=False, module_version=None, proc_module_version=None, module_files=[])
    verdict = L.judge_driver_state(ev, X3080)
    assert verdict["status"] == "fail"
    assert "no nvidia module is installed for the running kernel 7.0.0-40-generic" in verdict["why"]
    assert "dkms autoinstall -k 7.0.0-40-generic" in verdict["remedy"]
    assert verdict["code"] == "RB-DRIVER-NO-MODULE"


def test_a_wrong_version_fails_wherever_its_file_sits():
    ev = x3080_evidence()
    ev["nvidia"].update(module_version="580.95.05", module_files=["kernel/drivers/video/nvidia.ko"])
    verdict = L.judge_driver_state(ev, X3080)
    assert verdict["status"] == "fail"
    assert "loaded nvidia module is 580.95.05, pinned 615.71.09" in verdict["why"]
    assert "installed by hand" in verdict["why"]  # the file's place is said too, as a note
    assert verdict["codes"] == ["RB-DRIVER-VERSION-NOT-PINNED", "RB-DRIVER-USERSPACE-MISMATCH", "RB-DRIVER-NOT-DKMS"]


# --- driver_state: the loaded module against the pin, for each way the driver got onto the box ------------------
# seed 000 installed the fork the fork's way (make modules_install into kernel/drivers/video, the old DKMS module
# cleared, depmod); rigbook builds it with DKMS (updates/dkms); Ubuntu's prebuilt packages sit in
# kernel/nvidia-<branch>; the H200 cloud VM of shared/research/real-gpu-run.md has no /lib/modules at all.
INSTALLS = {
    "dkms": ["updates/dkms/nvidia.ko.zst"],
    "make modules_install": ["kernel/drivers/video/nvidia.ko"],
    "distribution package": ["kernel/nvidia-615/nvidia.ko"],
    "no /lib/modules": [],
}
FORK_PIN = {**X3080["pins"]["nvidia_driver"], "fork_repo": "https://github.com/aikitoria/open-gpu-kernel-modules",
            "commit": "0" * 40}
X3080_FORK = {**X3080, "pins": {**X3080["pins"], "nvidia_driver": FORK_PIN}}
SRCVERSION = "9C1D5A3B7E2F04A6D8B1C3E"


def installed_by(method):
    ev = x3080_evidence()
    ev["nvidia"]["module_files"] = list(INSTALLS[method])
    return ev


def test_a_fork_installed_by_hand_runs_and_is_a_note_not_a_failure():
    verdict = L.judge_driver_state(installed_by("make modules_install"), X3080_FORK)
    assert verdict["status"] == "warn", verdict
    assert "nvidia.ko for 7.0.0-31-generic is installed by hand (the fork's make modules_install" in verdict["why"]
    assert "a kernel upgrade does not rebuild it" in verdict["why"]
    assert verdict["code"] == "RB-DRIVER-NOT-DKMS"
    assert "moves the hand-installed files aside" in verdict["remedy"] and "--check --diff" in verdict["remedy"]
    assert verdict["measured"]["files"] == ["kernel/drivers/video/nvidia.ko (installed by hand (the fork's make "
                                            "modules_install, or NVIDIA's .run installer))"]


# "no /lib/modules": with no module file (and no build stamp) nothing tells the fork from NVIDIA's stock build of the
# pinned version: unknown, not a pass (shared/research/real-gpu-run.md defect 3)
@pytest.mark.parametrize("method,status", [("dkms", "pass"), ("make modules_install", "warn"),
                                           ("distribution package", "warn"), ("no /lib/modules", "unknown")])
def test_each_install_method_of_the_pinned_version_loaded_is_never_a_failure(method, status):
    verdict = L.judge_driver_state(installed_by(method), X3080_FORK)
    assert verdict["status"] == status, verdict
    if method == "distribution package":
        assert "a distribution package's prebuilt module" in verdict["why"]


@pytest.mark.parametrize("method", list(INSTALLS))
def test_the_real_failures_stay_failures_for_each_install_method(method):
    wrong = installed_by(method)
    wrong["nvidia"].update(module_version="610.43.03", proc_module_version="610.43.03")
    assert "loaded nvidia module is 610.43.03, pinned 615.71.09" in L.judge_driver_state(wrong, X3080_FORK)["why"]
    mismatch = installed_by(method)
    mismatch["nvidia"]["userspace_version"] = "615.80.01"
    assert "Driver/library version mismatch" in L.judge_driver_state(mismatch, X3080_FORK)["why"]
    unloaded = installed_by(method)
    unloaded["nvidia"].update(loaded=False, module_version=None, proc_module_version=None)
    verdict = L.judge_driver_state(unloaded, X3080_FORK)
    assert verdict["status"] == "fail"
    assert ("installed for 7.0.0-31-generic but not loaded" if INSTALLS[method] else
            "no nvidia module is installed for the running kernel 7.0.0-31-generic") in verdict["why"]
    assert verdict["code"] == ("RB-DRIVER-NOT-LOADED" if INSTALLS[method] else "RB-DRIVER-NO-MODULE")
    for broken, code in ((wrong, "RB-DRIVER-VERSION-NOT-PINNED"), (mismatch, "RB-DRIVER-USERSPACE-MISMATCH"),
                         (unloaded, None)):
        assert L.judge_driver_state(broken, X3080_FORK)["status"] == "fail"
        assert code is None or L.judge_driver_state(broken, X3080_FORK)["code"] == code


def test_open_or_proprietary_is_judged_where_the_pin_says():
    proprietary = installed_by("dkms")
    proprietary["nvidia"]["open_kernel_module"] = False
    verdict = L.judge_driver_state(proprietary, X3080_FORK)  # the pin names the P2P fork: the open modules
    assert verdict["status"] == "fail", verdict
    assert "NVIDIA's proprietary kernel module, the pin is NVIDIA's open kernel module" in verdict["why"]
    assert verdict["expected"]["open"] is True
    assert verdict["code"] == "RB-DRIVER-MODULE-KIND"
    assert L.judge_driver_state(proprietary, X3080)["status"] == "pass"  # a pin without a source says nothing
    said = {**X3080, "pins": {**X3080["pins"], "nvidia_driver": {**X3080["pins"]["nvidia_driver"], "open": False}}}
    assert L.judge_driver_state(proprietary, said)["status"] == "pass"
    assert L.judge_driver_state(installed_by("dkms"), said)["status"] == "fail"
    unreadable = installed_by("dkms")
    unreadable["nvidia"]["open_kernel_module"] = None
    assert L.judge_driver_state(unreadable, X3080_FORK)["status"] == "unknown"


def stamped(srcversion=SRCVERSION, version="615.71.09", loaded=SRCVERSION):
    ev = installed_by("dkms")
    ev["nvidia"]["srcversion"] = loaded
    ev["nvidia"]["build_stamps"] = [{
        "path": f"var/lib/dkms/nvidia/{version}/7.0.0-31-generic/x86_64/.rigbook-build.json", "version": version,
        "modules": {"nvidia": {"path": "/lib/modules/7.0.0-31-generic/updates/dkms/nvidia.ko.zst",
                               "srcversion": srcversion}}}]
    return ev


def test_the_srcversion_of_rigbooks_build_is_the_loaded_ones():
    ok = L.judge_driver_state(stamped(), X3080_FORK)
    assert ok["status"] == "pass", ok
    assert ok["expected"]["srcversion"] == SRCVERSION + " (rigbook's DKMS build for 7.0.0-31-generic)"
    other = L.judge_driver_state(stamped(loaded="0A1B2C3D4E5F60718293A4B"), X3080_FORK)
    assert other["status"] == "fail", other
    assert ("the loaded nvidia module 615.71.09 (srcversion 0A1B2C3D4E5F60718293A4B) is not the DKMS build rigbook "
            f"made for 7.0.0-31-generic (srcversion {SRCVERSION})") in other["why"]
    assert "Reboot" in other["remedy"]
    assert other["code"] == "RB-DRIVER-NOT-PINNED-BUILD"
    assert L.judge_driver_state(stamped(loaded=None), X3080_FORK)["status"] == "unknown"
    # a stamp of another version (an older build DKMS still holds) says nothing of the loaded module
    assert L.judge_driver_state(stamped(version="610.43.03", loaded="0A1B2C3D4E5F60718293A4B"),
                                X3080_FORK)["status"] == "pass"


# --- kernel_state: nvidia_uvm's HMM with iommu=pt ---------------------------------------------------------------


def with_hmm(value="N", address_bits=None, open_module=True, dma_mask_bits=None):
    ev = x3080_evidence()
    ev["nvidia"].update(uvm_disable_hmm=value, open_kernel_module=open_module)
    ev["cpu"]["address_bits"] = address_bits
    for g in ev["gpus"]:
        g["dma_mask_bits"] = dma_mask_bits
    return ev


def test_hmm_on_is_harmless_where_the_cpus_addresses_fit_the_gpus_dma_mask():
    """seed 000: Xeon E5-2666 v3 (46-bit physical addresses), HMM left at the driver's default, iommu=pt: works."""
    verdict = L.judge_kernel_state(with_hmm(address_bits=46), X3080)
    assert verdict["status"] == "pass", verdict
    assert "46-bit physical addresses end within the GPUs' 47-bit DMA mask" in verdict["measured"]["uvm_disable_hmm"]
    assert "WU-CVGL/cluster-setup" in verdict["measured"]["uvm_disable_hmm"]


def test_hmm_on_fails_where_the_cited_failure_applies_and_names_the_source():
    verdict = L.judge_kernel_state(with_hmm(address_bits=48), X3080)
    assert verdict["status"] == "fail", verdict
    assert "48-bit physical addresses reach beyond the GPUs' 47-bit DMA mask" in verdict["why"]
    assert "WU-CVGL/cluster-setup docs/05_GPU_P2P_RTX4090.md" in verdict["remedy"]
    assert "NVIDIA/nccl#2190" in verdict["remedy"] and "uvm_disable_hmm=1" in verdict["remedy"]
    unknown = L.judge_kernel_state(with_hmm(address_bits=None), X3080)
    assert unknown["status"] == "fail" and "physical address width is not known" in unknown["why"]


def test_hmm_rule_reads_the_gpus_own_dma_mask_and_the_driver_kind():
    # a GPU whose driver set a 52-bit mask (sysfs dma_mask_bits) reaches all of a 48-bit address space
    assert L.judge_kernel_state(with_hmm(address_bits=48, dma_mask_bits=52), X3080)["status"] == "pass"
    # 32 bits is the PCI core's default before a driver binds: NVIDIA's 47 bits are assumed then
    assert L.judge_kernel_state(with_hmm(address_bits=48, dma_mask_bits=32), X3080)["status"] == "fail"
    assert L.judge_kernel_state(with_hmm(address_bits=48, open_module=False), X3080)["status"] == "pass"
    off = L.judge_kernel_state(with_hmm(value="Y", address_bits=52), X3080)
    assert off["status"] == "pass" and off["measured"]["uvm_disable_hmm"] == "Y"
    no_pt = with_hmm(address_bits=52)
    no_pt["kernel"]["cmdline"] = ["ro", "quiet"]
    assert "uvm_disable_hmm" not in L.judge_kernel_state(no_pt, {**X3080, "pins": {}})["measured"]


def test_hmm_confines_host_memory_is_the_one_rule():
    assert L.hmm_confines_host_memory(True, 46) is False
    assert L.hmm_confines_host_memory(True, 48) is True
    assert L.hmm_confines_host_memory(None, 52) is True
    assert L.hmm_confines_host_memory(True, None) is None
    assert L.hmm_confines_host_memory(False, None) is False
    assert L.hmm_confines_host_memory(True, 48, 52) is False


def test_nvidia_uvm_not_loaded_is_a_note_only_where_hmm_would_matter():
    ev = with_hmm(value=None, address_bits=48)
    ev["nvidia"]["modprobe_uvm_disable_hmm"] = False
    verdict = L.judge_kernel_state(ev, X3080)
    assert verdict["status"] == "warn" and "no modprobe.d option disables HMM" in verdict["why"]
    assert verdict["code"] == "RB-KERNEL-UVM-HMM-UNSET"
    ev["cpu"]["address_bits"] = 46
    assert L.judge_kernel_state(ev, X3080)["status"] == "pass"


def test_userspace_kernel_mismatch():
    ev = x3080_evidence()
    ev["nvidia"]["userspace_version"] = "615.80.01"
    verdict = L.judge_driver_state(ev, X3080)
    assert verdict["status"] == "fail" and "Driver/library version mismatch" in verdict["why"]
    assert verdict["code"] == "RB-DRIVER-USERSPACE-MISMATCH"


def test_amd_without_kfd_p2p_links_fails():
    ev = r9700_evidence()
    ev["amd"]["kfd_nodes"][2]["p2p_links_count"] = 0
    verdict = L.judge_driver_state(ev, R9700)
    assert verdict["status"] == "fail" and "KFD node 2 has no P2P link" in verdict["why"]
    assert verdict["code"] == "RB-DRIVER-KFD-NO-P2P-LINK"


def test_amd_rocm_pin_and_unloaded_driver():
    ev = r9700_evidence()
    ev["amd"].update(loaded=False, rocm_version="6.4.1")
    verdict = L.judge_driver_state(ev, R9700)
    assert verdict["status"] == "fail"
    assert "amdgpu is not loaded" in verdict["why"] and "ROCm 6.4.1, pinned 7.2" in verdict["why"]
    assert verdict["codes"] == ["RB-DRIVER-AMDGPU-NOT-LOADED", "RB-DRIVER-ROCM-NOT-PINNED"]


def test_human_bytes():
    assert L.human_bytes(256 * MIB) == "256 MiB"
    assert L.human_bytes(56 * TIB) == "56 TiB"
    assert L.human_bytes(int(1.5 * GIB)) == "1.5 GiB"


# --- what a verdict claims: a pin only where one was held, a fork only where something tells it from stock ------


def test_a_fork_pin_on_a_module_with_no_file_is_unknown_naming_why():
    verdict = L.judge_driver_state(installed_by("no /lib/modules"), X3080_FORK)
    assert verdict["status"] == "unknown", verdict
    assert "the pin names the P2P driver fork (https://github.com/aikitoria/open-gpu-kernel-modules)" in verdict["why"]
    assert "no nvidia module file exists for the running kernel 7.0.0-31-generic" in verdict["why"]
    assert "nothing here tells the loaded module from NVIDIA's stock 615.71.09" in verdict["why"]
    assert verdict["code"] == "RB-DRIVER-FORK-UNTELLABLE"
    # the same box with a stock pin (a version, no fork): nothing to tell apart, the pinned version passes
    stock = L.judge_driver_state(installed_by("no /lib/modules"), X3080)
    assert stock["status"] == "pass" and stock["why"] == "the pinned driver 615.71.09 is loaded, userspace matches"


def test_a_fork_with_no_module_file_passes_where_rigbooks_build_stamp_tells_it():
    ev = stamped()
    ev["nvidia"]["module_files"] = []
    verdict = L.judge_driver_state(ev, X3080_FORK)
    assert verdict["status"] == "pass", verdict
    assert verdict["why"] == ("the pinned P2P fork 615.71.09 is loaded as rigbook's DKMS build of it (its srcversion), "
                              "userspace matches")


def test_driver_state_says_which_build_it_checked():
    dkms = L.judge_driver_state(installed_by("dkms"), X3080_FORK)
    assert dkms["why"] == ("the pinned P2P fork 615.71.09 is loaded as a DKMS build of it "
                           "(lib/modules/.../updates/dkms), userspace matches")


def test_nothing_pinned_passes_saying_so_not_as_pinned():
    unpinned = {**X3080, "pins": {}}
    driver = L.judge_driver_state(installed_by("no /lib/modules"), unpinned)
    assert driver["status"] == "pass" and driver["expected"] == {"module": None, "userspace": None}
    assert driver["why"] == ("nothing pinned (rigbook_pins.nvidia_driver): nvidia 615.71.09 loaded, userspace "
                             "615.71.09 matches it")
    ev = x3080_evidence()
    ev["kernel"]["cmdline"] = ["ro", "quiet"]
    kernel = L.judge_kernel_state(ev, unpinned)
    assert kernel["status"] == "pass" and kernel["expected"] == {}
    assert kernel["why"] == ("nothing pinned (rigbook_pins.kernel): running kernel 7.0.0-31-generic read, no release "
                             "or command line to hold it to")
    assert "as pinned" not in kernel["why"] + driver["why"]


def test_kernel_state_names_the_pins_it_held():
    verdict = L.judge_kernel_state(x3080_evidence(), X3080)
    assert verdict["status"] == "pass"
    assert verdict["why"] == ("kernel 7.0.0-31-generic as pinned; the pinned command line flags present; nvidia_uvm's "
                              "HMM as iommu=pt needs it")


def test_pcie_link_with_no_expected_link_says_it_was_read():
    ladder_view = {**X3080, "gpu": {"vendor": "nvidia", "count": 2}}
    verdict = L.judge_pcie_link(x3080_evidence(), ladder_view)
    assert verdict["status"] == "pass" and set(verdict["expected"].values()) == {"Gen? x?"}
    assert verdict["why"] == ("every GPU link read, each trained at its full width; no generation or width expected "
                              "(no rigbook_gpu.pcie gen/width)")
    assert L.judge_pcie_link(x3080_evidence(), X3080)["why"] == "every GPU link at its expected generation and width"


# --- firmware: a virtual machine has no BIOS; each finding its own remedy ------------------------------------------


def one_large_bar_without_efi(virtual):
    """The 3080 box's evidence cut to one GPU with a 32 GiB BAR1 above 4 GiB, booted without EFI, VIRTUAL as the
    collector read it."""
    ev = x3080_evidence()
    ev["uefi"] = False
    ev["virtual"] = virtual
    ev["gpus"] = [ev["gpus"][0]]
    ev["gpus"][0]["bars"][0] = bar(1, 0x38_0000_0000, 32 * GIB)
    return ev


def test_a_bare_metal_legacy_boot_still_gets_the_csm_finding():
    ev = one_large_bar_without_efi({"vm": False, "seen": "no hypervisor flag in /proc/cpuinfo"})
    verdict = L.judge_firmware(ev, X3080)
    assert verdict["status"] == "warn" and verdict["why"].startswith("legacy boot (no /sys/firmware/efi): CSM is on")
    # the CSM finding alone: CSM advice, not ReBAR nor Above 4G, and no "declare it" on a box that declared it
    assert verdict["remedy"] == L.CSM_REMEDY
    assert verdict["code"] == "RB-FIRMWARE-CSM-ON" and "codes" not in verdict
    assert "expected false" not in verdict["remedy"]


def test_a_virtual_machine_without_efi_is_no_csm_box():
    ev = one_large_bar_without_efi({"vm": True, "seen": "the CPU's hypervisor flag (/proc/cpuinfo)"})
    verdict = L.judge_firmware(ev, X3080)
    assert verdict["status"] == "pass", verdict
    assert "CSM is on" not in verdict["why"] and "BIOS" not in verdict["remedy"]
    assert verdict["why"].startswith("a virtual machine (the CPU's hypervisor flag (/proc/cpuinfo)), booted by its "
                                     "hypervisor: no BIOS or CSM to set")
    assert verdict["measured"]["virtual_machine"] == "the CPU's hypervisor flag (/proc/cpuinfo)"


def test_a_virtual_machines_small_bar_is_the_hypervisors_not_a_bios_setting():
    ev = x3080_evidence()
    ev["uefi"] = False
    ev["virtual"] = {"vm": True, "seen": "DMI sys_vendor 'QEMU'"}
    ladder_view = {**X3080, "p2p": {"expected": True}}
    verdict = L.judge_firmware(ev, ladder_view)
    assert verdict["status"] == "fail" and "CSM" not in verdict["why"]
    assert "the hypervisor maps it in the 32-bit window" in verdict["why"]
    assert verdict["remedy"] == L.VM_BAR_REMEDY
    assert verdict["codes"] == ["RB-FIRMWARE-BAR-BELOW-4G", "RB-FIRMWARE-SMALL-BAR"]


def test_each_firmware_finding_gets_its_own_remedy():
    ev = r9700_evidence()  # UEFI, large BARs above 4 GiB
    ev["gpus"][1]["bars"][0] = bar(0, 0x30_0000_0000, 256 * MIB)
    ev["gpus"][1]["resize"] = {0: [256 * MIB, 512 * MIB, GIB, 32 * GIB]}
    verdict = L.judge_firmware(ev, R9700)
    assert verdict["remedy"] == L.REBAR_REMEDY + " " + L.NO_BIOS_OPTION_REMEDY
    declared = {**R9700, "p2p": {"expected": False, "reason": "no ReBAR in this BIOS"}}
    assert L.judge_firmware(ev, declared)["remedy"] == L.REBAR_REMEDY
