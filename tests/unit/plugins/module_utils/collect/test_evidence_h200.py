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
    assert verdicts["dma_window"]["status"] == "skip"
    assert verdicts["driver_state"]["status"] == "pass"
    # no EFI in the VM: a single GPU expects no P2P, so only a warning
    assert verdicts["firmware"]["status"] == "warn" and "CSM" in verdicts["firmware"]["why"]
    pinned_other = {**LADDER_VIEW, "pins": {"nvidia_driver": {"version": "615.71.09"}}}
    assert ladder_static.judge_driver_state(ev, pinned_other)["status"] == "fail"


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
