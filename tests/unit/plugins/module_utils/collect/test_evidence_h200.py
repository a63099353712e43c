"""Collectors and judges on a REAL capture: one H200 in a VM (tests/fixtures/evidence/h200-vm)."""

from __future__ import annotations

import json

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import evidence_tree as snapshot
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers as ladder_static
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry

LADDER_VIEW = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141, "pcie": {"gen": 5, "width": 16}},
               "pins": {"nvidia_driver": {"version": "580.159.04"}}}


def test_collects_the_real_h200(fixtures):
    ev = evidence.collect_static(str(fixtures / "evidence" / "h200-vm"))
    (gpu,) = ev["gpus"]
    assert gpu["slot"] == "0000:00:06.0" and gpu["vendor"] == "nvidia" and gpu["device_id"] == "0x2335"
    assert gpu["chain"] == [] and gpu["host_bridge"] is None  # on the root bus of a VM
    vram = ladder_static._vram_bar(gpu)
    assert vram["index"] == 2 and vram["size"] == 256 << 30 and vram["start"] == 1 << 44
    assert gpu["link"] == {"current_speed_gts": 32.0, "max_speed_gts": 32.0, "current_width": 16, "max_width": 16}
    assert ev["uefi"] is False
    nv = ev["nvidia"]
    assert nv["module_version"] == "580.159.04" and nv["proc_module_version"] == "580.159.04"
    assert nv["open_kernel_module"] is True and nv["userspace_version"] == "580.159.04"
    assert ev["kernel"]["release"] == "6.18.44-fc-v973-gpu"


def test_judges_the_real_h200(fixtures):
    ctx = climb.Context(str(fixtures / "evidence" / "h200-vm"), LADDER_VIEW)
    climbed, ev = climb.climb(registry.of_phase(registry.STATIC), ctx, stop_at_fail=False)
    verdicts = {v["layer"]: v for v in climbed}
    assert verdicts["pcie_link"]["status"] == "pass"
    assert verdicts["dma_window"]["status"] == "skip" and verdicts["dma_window"]["code"] == "RB-DMA-WINDOW-SKIP"
    assert verdicts["driver_state"]["status"] == "pass"
    # no EFI in the VM, whose hypervisor boots it (its GPU driver says Pass-Through): no CSM, no BIOS advice
    firmware = verdicts["firmware"]
    assert firmware["status"] == "pass" and "CSM is on" not in firmware["why"] and firmware["remedy"] == ""
    assert ev["virtual"] == {"vm": True, "seen": "recorded var/lib/rigbook/commands/nvidia-smi-q.txt: "
                                                 "Virtualization Mode Pass-Through"}
    pinned_other = {**LADDER_VIEW, "pins": {"nvidia_driver": {"version": "615.71.09"}}}
    other = ladder_static.judge_driver_state(ev, pinned_other)
    assert other["status"] == "fail"
    assert other["codes"] == ["RB-DRIVER-VERSION-NOT-PINNED", "RB-DRIVER-USERSPACE-NOT-PINNED"]
    assert not [v for v in climbed if v["status"] == "pass" and "code" in v]


FORK_PIN = {"version": "580.159.04", "fork_repo": "aikitoria/open-gpu-kernel-modules", "commit": "0123" * 10,
            "userspace_version": "580.159.04"}


def test_the_real_h200_with_a_fork_pin_is_unknown_not_the_pinned_build(fixtures):
    """real-gpu-run.md defect 3: the stock 580.159.04 the VM injects (no lib/modules at all) against a P2P-fork pin of
    that version: nothing tells them apart, so unknown, never "the pinned driver build is loaded"."""
    ev = evidence.collect_static(str(fixtures / "evidence" / "h200-vm"))
    verdict = ladder_static.judge_driver_state(ev, {**LADDER_VIEW, "pins": {"nvidia_driver": FORK_PIN}})
    assert verdict["status"] == "unknown", verdict
    assert verdict["measured"]["files"] == [] and verdict["measured"]["module"] == "580.159.04"
    assert "no nvidia module file exists for the running kernel 6.18.44-fc-v973-gpu" in verdict["why"]
    assert "nothing here tells the loaded module from NVIDIA's stock 580.159.04" in verdict["why"]
    assert verdict["code"] == "RB-DRIVER-FORK-UNTELLABLE"


def test_the_real_h200_with_nothing_pinned_passes_claiming_no_pin(fixtures):
    """real-gpu-run.md defect 7: the README's first inventory (no rigbook_pins) and the shipped localhost one (no
    rigbook_* at all)."""
    inv = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141, "pcie": {"gen": 5, "width": 16}},
           "p2p": {"expected": False, "reason": "one GPU, no peer to reach"}, "pins": {}}
    for ladder_view in (inv, {}):
        ctx = climb.Context(str(fixtures / "evidence" / "h200-vm"), ladder_view)
        verdicts = {v["layer"]: v for v in climb.climb(registry.of_phase(registry.STATIC), ctx, stop_at_fail=False)[0]}
        assert verdicts["kernel_state"]["status"] == verdicts["driver_state"]["status"] == "pass"
        assert verdicts["kernel_state"]["why"].startswith("nothing pinned (rigbook_pins.kernel): running kernel "
                                                          "6.18.44-fc-v973-gpu read")
        assert verdicts["driver_state"]["why"] == ("nothing pinned (rigbook_pins.nvidia_driver): nvidia 580.159.04 "
                                                   "loaded, userspace 580.159.04 matches it")
        # the firmware layer: no CSM, no ReBAR advice (BAR2 256 GiB covers the 141 GiB), no "declare P2P unavailable"
        assert verdicts["firmware"]["status"] == "pass" and "CSM is on" not in verdicts["firmware"]["why"]
        assert all("as pinned" not in v["why"] for v in verdicts.values())
    pcie = verdicts["pcie_link"]
    assert pcie["expected"] == {"0000:00:06.0": "Gen? x?"} and "no generation or width expected" in pcie["why"]


def test_one_gpu_in_sysfs_skips_the_collectives_with_no_gpu_count(fixtures):
    """real-gpu-run.md defect 9: the shipped localhost inventory (no rigbook_gpu.count) on the one-GPU VM; the
    collectives and nccl_transport layers count the GPUs the box shows, as the static layers do."""
    ctx = climb.Context(str(fixtures / "evidence" / "h200-vm"), {})
    layers = [registry.get("collectives"), registry.get("nccl_transport")]
    verdicts = {v["layer"]: v for v in climb.climb(layers, ctx, stop_at_fail=False)[0]}
    assert verdicts["collectives"]["status"] == "skip", verdicts["collectives"]
    assert verdicts["collectives"]["why"].startswith("one GPU: no collective between GPUs")
    assert verdicts["nccl_transport"]["status"] == "skip", verdicts["nccl_transport"]
    assert verdicts["nccl_transport"]["why"] == "one GPU: NCCL opens no channel between GPUs"


def test_snapshot_of_a_recorded_tree_round_trips(fixtures, tmp_path):
    source = str(fixtures / "evidence" / "h200-vm")
    manifest = snapshot.capture(source, str(tmp_path / "copy"), "round trip")
    assert manifest["gpus"] == ["0000:00:06.0"]
    original = evidence.collect_static(source)
    copied = evidence.collect_static(str(tmp_path / "copy"))
    original.pop("root"), copied.pop("root")
    assert json.dumps(copied, sort_keys=True) == json.dumps(original, sort_keys=True)


def test_snapshot_scrubs_serials():
    text = (
        "    Serial Number                  : 1650923012345\n"
        "    GPU UUID      : GPU-12fe9e3a-6ced-917d-c8e7-e2f279bce664\n"
    )
    out = snapshot.scrub(text)
    assert "1650923012345" not in out and "12fe9e3a" not in out and out.count("[scrubbed]") == 2
