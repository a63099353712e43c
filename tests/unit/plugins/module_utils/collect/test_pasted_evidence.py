"""collect/pasted_evidence.py: real pasted outputs (tests/fixtures/parse, SOURCES.md) made into the evidence parts the
judges read, in the collectors' own shapes."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pasted_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import (
    collective_layers,
    peer_layers,
    static_layers,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import paste
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text
from helpers.parse_fixtures import FIXTURES

GIB = 1 << 30


def parts_of(*names):
    text = "\n".join((FIXTURES / kind / (name + ".txt")).read_text() for kind, name in (n.split("/") for n in names))
    return paste.split(list(parse_text.lines(text)))


def test_lspci_gives_the_static_collectors_gpu_shape():
    evidence, facts, used = pasted_evidence.evidence_of(parts_of("lspci/rtx4090_v_32g_tinygrad28"))
    (gpu,) = evidence["gpus"]
    assert gpu["vendor"] == "nvidia" and gpu["slot"] == "0000:01:00.0"
    vram = max((b for b in gpu["bars"] if b["prefetchable"]), key=lambda b: b["size"])
    assert vram["size"] == 32 * GIB and vram["end"] == vram["start"] + 32 * GIB - 1 and vram["start"] >= 4 * GIB
    assert evidence["uefi"] is None  # not in lspci: the firmware judge names it as not read
    assert facts == {"vendor": "nvidia", "gpus": 1, "vram_gib": None} and [p["kind"] for p in used["gpus"]] == ["lspci"]
    verdict = static_layers.judge_firmware(evidence, {"gpu": {"vram_gib": 24}})
    assert verdict["status"] == "pass" and verdict["measured"]["uefi"] == "not read"
    assert "boot mode not read" in verdict["why"]


def test_a_collected_legacy_boot_still_says_csm():
    evidence, _, _ = pasted_evidence.evidence_of(parts_of("lspci/rtx4090_v_32g_tinygrad28"))
    view = {"gpu": {"vram_gib": 24}, "p2p": {"expected": True}}
    verdict = static_layers.judge_firmware(dict(evidence, uefi=False), view)
    assert verdict["status"] == "fail" and "CSM is on" in verdict["why"]


def test_lspci_without_numeric_ids_is_read_by_its_vendor_words():
    evidence, facts, _ = pasted_evidence.evidence_of(parts_of("lspci/quadro_rtx8000_vv_pi_cm4"))
    assert facts["vendor"] == "nvidia" and evidence["gpus"][0]["device_id"] is None


def test_p2p_bandwidth_test_gives_a_probe_with_peer_and_staged_copies():
    evidence, facts, _ = pasted_evidence.evidence_of(parts_of("p2p-bandwidth/nccl814_writes_and_reads"))
    probe = evidence["probe"]
    assert probe["available"] and facts["gpus"] == len(probe["devices"]) >= 2
    pair = next(p for p in probe["pairs"] if (p["src"], p["dst"]) == (0, 1))
    assert pair["peer_gbs"] is not None and pair["host_staged_gbs"] is not None
    assert pair["pattern_ok"] is None and pasted_evidence.NO_DATA_CHECK in pair["errors"]
    verdict = peer_layers.judge_p2p_bandwidth(probe, {"gpu": {"count": facts["gpus"]}})
    assert verdict["status"] == "fail" and "no real P2P" in verdict["why"]


def test_topo_p2p_table_gives_can_access_only():
    evidence, _, _ = pasted_evidence.evidence_of(parts_of("nvidia-smi-topo/club3090_1125_indented_node_ns"))
    pairs = evidence["probe"]["pairs"]
    assert pairs and all(p["can_access_peer"] is False and p["peer_gbs"] is None for p in pairs)
    ok, _, _ = pasted_evidence.evidence_of(parts_of("nvidia-smi-topo/aikitoria13_node_then_p2p_prop_ok"))
    assert all(p["can_access_peer"] is True for p in ok["probe"]["pairs"])
    # a topo -m matrix alone shows GPUs, not peer access
    matrix, facts, _ = pasted_evidence.evidence_of(parts_of("nvidia-smi-topo/cuda_samples284_l4_sys"))
    assert "probe" not in matrix and facts["gpus"] == 2


def test_a_measured_probe_is_judged_over_a_topo_table():
    evidence, _, used = pasted_evidence.evidence_of(parts_of("nvidia-smi-topo/club3090_1125_indented_node_ns",
                                                             "p2p-bandwidth/nccl814_writes_and_reads"))
    assert [p["kind"] for p in used["probe"]] == ["p2p-bandwidth"]
    assert any(p["peer_gbs"] is not None for p in evidence["probe"]["pairs"])


def test_nccl_tests_results_and_the_gpus_the_log_shows():
    evidence, _, _ = pasted_evidence.evidence_of(parts_of("nccl-tests/nccl_tests167_max_min_redops"))
    (row,) = evidence["collectives"]["results"]
    assert row["busbw_gbs"] is not None and evidence["collectives"]["failures"] == []
    _, facts, _ = pasted_evidence.evidence_of(parts_of("nccl-log/nccl_tests307_shm_and_ring_listing"))
    assert facts["gpus"] == 8
    # a log whose channels reach other machines (NET) says nothing of how many GPUs this box has
    _, facts, _ = pasted_evidence.evidence_of(parts_of("nccl-log/nccl1453_cumem_and_net_ibext"))
    assert facts["gpus"] is None


def test_a_failed_run_is_evidence_for_peer_access_and_collectives():
    text = (FIXTURES.parent / "diagnose" / "aikitoria38_map_failed_mixed.txt").read_text()
    evidence, _, used = pasted_evidence.evidence_of(paste.split(list(parse_text.lines(text))))
    assert "probe_failures" in used and "probe" not in used  # nothing timed: p2p_bandwidth is not covered
    assert evidence["probe"]["failures"][0]["code"] == "CUDA_ERROR_MAP_FAILED"
    verdict = peer_layers.judge_peer_access(evidence["probe"], {})
    assert verdict["status"] == "fail" and verdict["remedy"] == peer_layers.BAR_REMEDY
    collectives = evidence["collectives"]
    assert not collectives["available"] and any(f["by"] == "test" for f in collectives["failures"])
    verdict = collective_layers.judge_collectives(collectives, {"gpu": {"count": 2}})
    assert verdict["status"] == "fail" and "unhandled cuda error" in verdict["why"]


def test_kernel_log_lines_become_the_error_judges_input():
    evidence, _, _ = pasted_evidence.evidence_of(parts_of("kernel-log/aer_nonfatal_ms02_10"))
    delta = evidence["kernel_log"]
    assert delta["since_boot"] is False and delta["aer"]["the pasted kernel log"]["nonfatal"] >= 1


def test_nvidia_smi_q_gives_bar1_size_link_and_vram_but_no_placement():
    evidence, facts, _ = pasted_evidence.evidence_of(parts_of("nvidia-smi-q/rtx4070_laptop_566_device_host_max"))
    (gpu,) = evidence["gpus"]
    (bar,) = gpu["bars"]
    assert bar["start"] is None and bar["size"] >= 256 << 20 and gpu["link"]["max_width"]
    assert facts["vram_gib"] and facts["vendor"] == "nvidia"
    verdict = static_layers.judge_dma_window(dict(evidence, gpus=[gpu, dict(gpu, slot="0000:02:00.0")]), {})
    assert verdict["status"] == "unknown" and "placed was not read" in verdict["why"]
