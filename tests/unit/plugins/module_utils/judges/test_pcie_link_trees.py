"""pcie_link on the lab's recorded trees (src/rigbook/lab/rigs, RECONSTRUCTED from seeds 000 and 004): which root port a
GPU hangs off (a CPU one, not the chipset's) and, on a card with its own PCIe switch (the R9700), the link that
crosses the slot (the switch upstream port to the root port), not only the GPU's link to its nearest port."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers as L

from rigbook.lab import faults, hardware_trees

R9700 = {"gpu": {"vendor": "amd", "count": 2, "vram_gib": 32, "pcie": {"gen": 3, "width": 16}},
         "p2p": {"expected": True, "nccl_p2p_level": "PHB"}}
X3080 = {"gpu": {"vendor": "nvidia", "count": 2, "vram_gib": 20, "pcie": {"gen": 3, "width": 16}},
         "p2p": {"expected": False, "reason": "BAR1 256 MiB, no ReBAR in this BIOS"}}
VIEWS = {"x99-r9700": R9700, "x99-3080": X3080}


def pcie_link(tree, view):
    return L.judge_pcie_link(static_evidence.collect_static(str(tree), parts=("gpus",)), view)


def faulted(tmp_path, rig_name, fault):
    tree = hardware_trees.materialize(rig_name, tmp_path / f"{rig_name}-{fault}")
    faults.apply(faults.plan(fault, tree, hardware_trees.load_rig(rig_name)))
    return tree


def on_pch_port(rig_name, port_index=1, device="0x8d10", bdf="0000:00:1c.0", link=None):
    """RIG_NAME with the card of its root port PORT_INDEX moved to a chipset (PCH) root port (a test variant of the
    recorded rig: the C610/X99 PCH's first root port is 8086:8d10 at 00:1c.0). The slot keeps its x16 Gen3 link unless
    LINK says otherwise, so only the placement differs."""
    rig = hardware_trees.load_rig(rig_name)
    port = rig["pci"]["ports"][port_index]
    port.update(bdf=bdf, device=device)
    if link:
        port["link"] = link
    return rig


@pytest.mark.parametrize("rig_name,ports", [("x99-r9700", ("8086:6f04", "8086:6f08")),
                                            ("x99-3080", ("8086:2f04", "8086:2f08"))])
def test_the_seed_boxes_have_both_gpus_on_cpu_root_ports(tmp_path, rig_name, ports):
    tree = hardware_trees.materialize(rig_name, tmp_path / rig_name)
    verdict = pcie_link(tree, VIEWS[rig_name])
    assert verdict["status"] == "pass", verdict
    placements = [v for k, v in sorted(verdict["measured"].items()) if k.startswith("placement")]
    assert placements == [f"CPU root port 0000:00:02.0 ({ports[0]})", f"CPU root port 0000:00:03.0 ({ports[1]})"]


def test_a_gpu_behind_the_chipset_fails_where_p2p_is_expected(tmp_path):
    tree = hardware_trees.materialize_rig(on_pch_port("x99-r9700"), tmp_path / "pch")
    verdict = pcie_link(tree, R9700)
    assert verdict["status"] == "fail", verdict
    assert "0000:06:00.0 sits behind the chipset (PCH) root port 0000:00:1c.0 (8086:8d10), not a CPU root port" \
        in verdict["why"]
    assert "seeds 000 and 004" in verdict["why"] and "PHB" in verdict["why"] and "00:1c.x" in verdict["remedy"]
    assert "0000:03:00.0 sits behind" not in verdict["why"]  # GPU0 stays on its CPU root port
    assert verdict["code"] == "RB-PCIE-BEHIND-PCH"


def test_a_gpu_behind_the_chipset_is_reported_where_p2p_is_declared_unavailable(tmp_path):
    tree = hardware_trees.materialize_rig(on_pch_port("x99-3080"), tmp_path / "pch")
    verdict = pcie_link(tree, X3080)
    assert verdict["status"] == "pass", verdict
    assert "0000:04:00.0 behind the chipset (PCH), not a CPU root port (P2P is declared unavailable" in verdict["why"]
    assert verdict["measured"]["placement 0000:04:00.0"] == "chipset (PCH) root port 0000:00:1c.0 (8086:8d10)"


def test_an_intel_port_at_device_1c_is_the_chipsets_and_an_unknown_port_is_only_named():
    def gpu(port, ids):
        return {"slot": "0000:05:00.0", "chain": [{"slot": port, "ids": ids}]}
    assert L.root_port_placement(gpu("0000:00:1c.4", "8086:a114"))[0] == "pch"
    assert L.root_port_placement(gpu("0000:00:01.0", "8086:a114")) == (
        None, "root port 0000:00:01.0 (8086:a114), not known to rigbook as a CPU or chipset port")
    assert L.root_port_placement(gpu("0000:00:03.1", "1022:1483"))[0] is None
    assert L.root_port_placement(gpu("0000:00:1c.0", "8086:8d1e"))[0] == "pch"
    assert L.root_port_placement(gpu("0000:00:03.0", "8086:6f0b"))[0] == "cpu"
    assert L.root_port_placement(gpu("0000:00:03.0", "8086:6f0c"))[0] is None  # past the root port range


def test_the_slot_link_of_a_card_with_its_own_switch_is_judged(tmp_path):
    healthy = pcie_link(hardware_trees.materialize("x99-r9700", tmp_path / "ok"), R9700)
    assert healthy["status"] == "pass", healthy
    assert healthy["measured"]["slot link 0000:06:00.0"] == "0000:04:00.0 -> 0000:00:03.0: Gen3 x16 (now 8.0 GT/s x16)"
    verdict = pcie_link(faulted(tmp_path, "x99-r9700", "slot-link-x8"), R9700)
    assert verdict["status"] == "fail", verdict
    for gpu, up, port in (("0000:03:00.0", "0000:01:00.0", "0000:00:02.0"),
                          ("0000:06:00.0", "0000:04:00.0", "0000:00:03.0")):
        assert f"{gpu} slot link (switch upstream port {up} -> root port {port}) trained at x8 of x16" \
            in verdict["why"]
        assert f"{gpu} trained at" not in verdict["why"]  # the GPU's own link on the card is still x16
    assert "seed 004 checks Gen3 x16 on both cards" in verdict["why"] and "Reseat the card" in verdict["remedy"]
    assert verdict["code"] == "RB-PCIE-SLOT-LINK-WIDTH" and "codes" not in verdict


def test_a_slot_capped_at_gen1_fails_through_the_switch(tmp_path):
    """The GPU's nearest port is the card's downstream port (Gen5-capable): only the slot link shows the cap."""
    verdict = pcie_link(faulted(tmp_path, "x99-r9700", "link-gen1"), R9700)
    assert verdict["status"] == "fail"
    assert "0000:03:00.0 slot link (switch upstream port 0000:01:00.0 -> root port 0000:00:02.0) is capable of " \
           "2.5 GT/s (Gen1), rigbook_gpu.pcie expects Gen3" in verdict["why"]
    assert verdict["code"] == "RB-PCIE-SLOT-LINK-SPEED"


def test_a_card_without_a_switch_has_no_separate_slot_link(tmp_path):
    verdict = pcie_link(hardware_trees.materialize("x99-3080", tmp_path / "t"), X3080)
    assert not [k for k in verdict["measured"] if k.startswith("slot link")]
    verdict = pcie_link(faulted(tmp_path, "x99-3080", "slot-link-x8"), X3080)
    assert verdict["status"] == "fail" and "0000:04:00.0 trained at x8 of x16" in verdict["why"]
    assert verdict["code"] == "RB-PCIE-LINK-WIDTH"
