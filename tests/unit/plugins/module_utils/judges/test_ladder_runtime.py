"""Pure judges of peer_access and p2p_bandwidth, driven by probe dicts; and a replay of the real H200 probe.

Seed cases are reconstructions from the write-ups' figures (not captures): seed 000 (X99 TF + 2x RTX 3080:
can-access yes, enable CUDA_ERROR_MAP_FAILED, peer 6.0 GB/s == host-staged 6.0) and seed 004 (X99 + 2x R9700:
10.29 GB/s each way, 19.7 both ways at once, HIP IPC open both ways).
"""

from __future__ import annotations

import json
import shutil

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import runtime_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import peer_layers as R
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import message
from helpers.modules import local_playbook


def probe(n=2, api="cuda", can=True, enable="ok", peer=(10.29, 10.29), staged=5.6, bidir=19.7, pattern=True,
          staged_pattern=True, ipc=None, h2d=12.1, d2h=13.0, errors=None):
    """A probe result shaped like cuda_probe.probe() / hip_probe.probe()."""
    devices = [{"index": k, "ordinal": k, "name": f"GPU {k}", "pci_bus_id": f"0000:{3 + k:02x}:00.0",
                "h2d_gbs": h2d, "d2h_gbs": d2h, "errors": []} for k in range(n)]
    pairs = []
    for k, (i, j) in enumerate([(i, j) for i in range(n) for j in range(n) if i != j]):
        pair = {"src": i, "dst": j, "can_access_peer": can, "enable_peer": enable, "pattern_ok": pattern,
                "peer_gbs": peer[k % len(peer)] if peer else None, "host_staged_gbs": staged,
                "staged_pattern_ok": staged_pattern, "errors": []}
        if ipc is not None:
            pair["ipc"] = dict(ipc)
        pairs.append(pair)
    return {"available": True, "api": api, "driver": "13.0", "devices": devices, "pairs": pairs,
            "bidir": [{"a": 0, "b": 1, "gbs": bidir, "errors": []}] if n == 2 else [],
            "errors": errors or [], "size_bytes": 256 << 20, "reps": 10}


X3080 = {"gpu": {"vendor": "nvidia", "count": 2, "vram_gib": 20, "pcie": {"gen": 3, "width": 16}},
         "p2p": {"expected": False, "reason": "BAR1 is 256 MiB: the X99 TF BIOS has no Above 4G / ReBAR"}}
X3080_EXPECTING = {**X3080, "p2p": {"expected": True}}
R9700 = {"gpu": {"vendor": "amd", "count": 2, "vram_gib": 32, "pcie": {"gen": 3, "width": 16}},
         "p2p": {"expected": True, "nccl_p2p_level": "PHB"}}
H200 = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141, "pcie": {"gen": 5, "width": 16}}}


def seed000():
    return probe(enable="CUDA_ERROR_MAP_FAILED", peer=(6.0,), staged=6.0, bidir=6.1)


def seed004(**kw):
    args = {"api": "hip", "peer": (10.29,), "bidir": 19.7, "ipc": {"ok": True, "error": None, "mode": "dma-buf"}}
    args.update(kw)
    return probe(**args)


SEED004_BASELINE = {"peer_gbs_0_1": 10.29, "peer_gbs_1_0": 10.29, "bidir_gbs_0_1": 19.7,
                    "host_staged_gbs_0_1": 5.6, "host_staged_gbs_1_0": 5.6}


def test_link_limits():
    assert R.link_gbs(3, 16) == 15.75
    assert R.link_gbs(4, 16) == 31.51
    assert R.link_gbs(5, 16) == 63.02
    assert R.link_gbs(3, 8) == 7.88
    assert R.link_gbs(None, 16) is None and R.link_gbs(9, 16) is None


def test_metrics_are_named_by_pair_and_skip_self_pairs():
    m = R.runtime_metrics(seed000())
    assert m == {"h2d_gbs_0": 12.1, "d2h_gbs_0": 13.0, "h2d_gbs_1": 12.1, "d2h_gbs_1": 13.0,
                 "peer_gbs_0_1": 6.0, "peer_gbs_1_0": 6.0, "host_staged_gbs_0_1": 6.0, "host_staged_gbs_1_0": 6.0,
                 "bidir_gbs_0_1": 6.1}
    self_pair = probe(n=1)
    self_pair["pairs"] = [{"src": 0, "dst": 0, "peer_gbs": 2000.0, "host_staged_gbs": 27.0}]
    self_pair["bidir"] = [{"a": 0, "b": 0, "gbs": 2100.0}]
    assert set(R.runtime_metrics(self_pair)) == {"h2d_gbs_0", "d2h_gbs_0"}


# ------------------------------------------------------------------ seed 000: the X99 TF + 2x RTX 3080 box


def test_seed000_peer_access_fails_when_p2p_is_expected():
    v = R.judge_peer_access(seed000(), X3080_EXPECTING)
    assert v["status"] == "fail"
    assert "GPU0->GPU1: enabling peer access failed with CUDA_ERROR_MAP_FAILED (mapping of buffer object failed)" \
        in v["why"]
    assert "GPU1->GPU0" in v["why"]
    assert "BAR1" in v["remedy"] and "Resizable BAR" in v["remedy"]
    assert v["measured"]["GPU0->GPU1"].startswith("can-access yes; enable CUDA_ERROR_MAP_FAILED")
    assert v["code"] == "RB-P2P-MAP-FAILED" and "codes" not in v  # one finding, whichever pair


def test_seed000_bandwidth_fails_when_p2p_is_expected():
    v = R.judge_p2p_bandwidth(seed000(), X3080_EXPECTING)
    assert v["status"] == "fail"
    assert "6.00 GB/s is not a P2P copy: peer access could not be enabled (CUDA_ERROR_MAP_FAILED)" in v["why"]
    assert "38% of the Gen3 x16 limit (15.75 GB/s)" in v["why"]
    assert v["metrics"]["peer_gbs_0_1"] == 6.0 and v["metrics"]["host_staged_gbs_0_1"] == 6.0
    # each finding's code, the fail class first
    assert v["codes"] == ["RB-P2P-NOT-PEER-COPY", "RB-P2P-LINK-SHARE-LOW", "RB-P2P-BIDIR-HALF-DUPLEX"]
    assert v["code"] == "RB-P2P-NOT-PEER-COPY"


def test_peer_no_faster_than_host_staged_is_no_real_p2p_even_if_enable_said_ok():
    v = R.judge_p2p_bandwidth(probe(peer=(6.0,), staged=6.0, bidir=6.1), X3080_EXPECTING)
    assert v["status"] == "fail"
    assert "the peer copy (6.00 GB/s) is no faster than the host-staged copy (6.00 GB/s): no real P2P" in v["why"]
    assert v["code"] == "RB-P2P-NO-REAL-P2P"


def test_seed000_passes_when_p2p_is_declared_unavailable():
    v = R.judge_peer_access(seed000(), X3080)
    assert v["status"] == "pass", v
    assert "declared unavailable" in v["why"] and "CUDA_ERROR_MAP_FAILED, as expected" in v["why"]
    assert "code" not in v and "codes" not in v  # a pass carries no code
    b = R.judge_p2p_bandwidth(seed000(), X3080)
    assert b["status"] == "pass" and "no baseline recorded yet" in b["why"]
    assert b["metrics"]["host_staged_gbs_1_0"] == 6.0


def test_seed000_declared_unavailable_holds_host_staged_to_its_baseline():
    baseline = {"host_staged_gbs_0_1": 6.0, "host_staged_gbs_1_0": 6.0, "peer_gbs_0_1": 6.0, "peer_gbs_1_0": 6.0}
    ok = R.judge_p2p_bandwidth(seed000(), X3080, baseline)
    assert ok["status"] == "pass" and "host_staged_gbs_0_1 6.00 vs baseline 6.00 (1.00x)" in ok["why"]
    halved = seed000()
    for pair in halved["pairs"]:
        pair["host_staged_gbs"] = 3.0
        pair["peer_gbs"] = 3.0
    v = R.judge_p2p_bandwidth(halved, X3080, baseline)
    assert v["status"] == "fail"
    assert "fell against the baseline: host_staged_gbs_0_1 3.00 vs baseline 6.00 (0.50x), below 0.80x" in v["why"]
    assert "no real P2P" not in v["why"]  # declared unavailable: only the baseline is held
    assert v["code"] == "RB-P2P-BANDWIDTH-BASELINE" and "codes" not in v


def test_declared_unavailable_but_peer_access_works_is_a_warning():
    v = R.judge_peer_access(probe(), X3080)
    assert v["status"] == "warn" and "although P2P is declared unavailable" in v["why"]
    assert "rigbook_p2p.expected true" in v["remedy"]
    assert v["code"] == "RB-P2P-WORKS-DECLARED-UNAVAILABLE"


# ------------------------------------------------------------------ seed 004: the X99 + 2x R9700 box


def test_seed004_passes_peer_access_with_ipc_both_ways():
    v = R.judge_peer_access(seed004(), R9700)
    assert v["status"] == "pass", v
    assert v["measured"]["GPU1->GPU0"].endswith("IPC (dma-buf) ok")
    assert "IPC ok" in v["expected"]["every ordered pair"]


def test_seed004_figures_pass_against_gen3_x16_and_the_baseline():
    v = R.judge_p2p_bandwidth(seed004(), R9700, SEED004_BASELINE)
    assert v["status"] == "pass", v
    assert "real P2P on every pair" in v["why"] and "peer_gbs_0_1 10.29 vs baseline 10.29 (1.00x)" in v["why"]
    assert v["measured"]["GPU0->GPU1"] == "peer 10.29 GB/s, host-staged 5.60 GB/s (1.84x), 65% of Gen3 x16"
    assert v["measured"]["GPU0<->GPU1"] == "19.70 GB/s both ways at once"
    assert v["metrics"]["bidir_gbs_0_1"] == 19.7


def test_seed004_at_half_the_baseline_fails_with_measured_vs_baseline():
    half = seed004(peer=None)
    for pair in half["pairs"]:
        pair["peer_gbs"] = 5.15
    half["bidir"][0]["gbs"] = 9.85
    v = R.judge_p2p_bandwidth(half, R9700, SEED004_BASELINE)
    assert v["status"] == "fail"
    assert "peer_gbs_0_1 5.15 vs baseline 10.29 (0.50x), below 0.80x" in v["why"]
    assert "bidir_gbs_0_1 9.85 vs baseline 19.70 (0.50x)" in v["why"]
    assert "known-good run" in v["remedy"]
    assert v["codes"] == ["RB-P2P-NO-REAL-P2P", "RB-P2P-BANDWIDTH-BASELINE", "RB-P2P-LINK-SHARE-LOW"]  # fail first
    assert "fail" in message(v) and "5.15" in message(v)


def test_slightly_below_baseline_warns():
    slow = seed004(peer=None)
    for pair in slow["pairs"]:
        pair["peer_gbs"] = 9.5  # 0.92x
    v = R.judge_p2p_bandwidth(slow, R9700, SEED004_BASELINE)
    assert v["status"] == "warn" and "below 0.95x" in v["why"]
    assert v["code"] == "RB-P2P-BANDWIDTH-BASELINE-DIP"


def test_tolerance_is_data():
    v = R.judge_p2p_bandwidth(seed000(), X3080_EXPECTING, tolerance={"link_warn_below": 0.3})
    assert "% of the Gen3 x16 limit" not in v["why"]
    loose = R.judge_p2p_bandwidth(probe(peer=(6.2,), staged=6.0, bidir=11.0), X3080_EXPECTING,
                                  tolerance={"over_staged": 1.0, "link_warn_below": 0.3})
    assert loose["status"] == "pass"


def test_a_peer_copy_of_2_to_3_gbs_on_gen3_x16_fails_where_seed_004_would_stop():
    """seed 004: "if TransferBench Push / DMA gives only 2-3 GB/s, do not go on tuning RCCL". Faster than the
    host-staged copy here (1.5 GB/s), so only the link share can catch it."""
    slow = seed004(peer=(2.8,), staged=1.5, bidir=5.0)
    v = R.judge_p2p_bandwidth(slow, R9700)
    assert v["status"] == "fail", v
    assert "GPU0->GPU1: 2.80 GB/s is 18% of the Gen3 x16 limit (15.75 GB/s), below 25%" in v["why"]
    assert "2-3 GB/s" in v["why"] and "TransferBench" in v["remedy"]
    assert "fails below 25%" in v["expected"]["peer"]
    assert v["code"] == "RB-P2P-BELOW-LINK"
    # a third of the link (the lab's p2p-bandwidth-half figure) is slow, not broken: a warning without a baseline
    third = R.judge_p2p_bandwidth(seed004(peer=(5.15,), staged=1.5, bidir=9.85), R9700)
    assert third["status"] == "warn" and "33% of the Gen3 x16 limit" in third["why"]
    assert third["code"] == "RB-P2P-LINK-SHARE-LOW"
    # the line is tolerance data
    assert R.judge_p2p_bandwidth(slow, R9700, tolerance={"link_fail_below": 0.1})["status"] == "warn"
    # a box declared without P2P is held to its host-staged baseline only
    assert R.judge_p2p_bandwidth(slow, {**R9700, "p2p": {"expected": False}})["status"] == "pass"


def test_ipc_failure_fails_peer_access_with_the_ipc_remedy():
    bad = seed004()
    bad["pairs"][1]["ipc"] = {"ok": False, "error": "hipIpcOpenMemHandle: hipErrorInvalidDevicePointer",
                              "mode": "legacy"}
    v = R.judge_peer_access(bad, R9700)
    assert v["status"] == "fail"
    assert "GPU1->GPU0: HIP IPC (legacy) failed: hipIpcOpenMemHandle: hipErrorInvalidDevicePointer" in v["why"]
    assert "HSA_ENABLE_IPC_MODE_LEGACY" in v["remedy"]
    assert v["code"] == "RB-P2P-IPC-FAILED"


def test_a_programs_own_failure_line_names_the_peer_access_code():
    """A pasted NCCL log's "Cuda failure 205 'mapping of buffer object failed'" (parse/nccl.failure_of) is evidence."""
    failed = {"available": False, "failures": [{"code": "CUDA_ERROR_MAP_FAILED",
                                                "text": "Cuda failure 205 'mapping of buffer object failed'"}]}
    v = R.judge_peer_access(failed, X3080_EXPECTING)
    assert v["status"] == "fail" and v["code"] == "RB-P2P-MAP-FAILED"


def test_amd_peer_access_unsupported_names_the_layers_below():
    v = R.judge_peer_access(probe(api="hip", can=False, enable="hipErrorPeerAccessUnsupported"), R9700)
    assert v["status"] == "fail" and "hipErrorPeerAccessUnsupported" in v["why"]
    assert "P2PDMA" in v["remedy"]
    assert v["codes"] == ["RB-P2P-PEER-ACCESS-DENIED", "RB-P2P-ENABLE-UNSUPPORTED"]


def test_half_duplex_bidir_warns():
    v = R.judge_p2p_bandwidth(seed004(bidir=10.5), R9700)
    assert v["status"] == "warn" and "barely more than one way" in v["why"]
    assert v["code"] == "RB-P2P-BIDIR-HALF-DUPLEX"


def test_nvlink_faster_than_pcie_is_not_a_problem():
    v = R.judge_p2p_bandwidth(probe(peer=(300.0,), staged=25.0, bidir=590.0),
                              {"gpu": {"count": 2, "pcie": {"gen": 5, "width": 16}}, "p2p": {"expected": True}})
    assert v["status"] == "pass" and "above the PCIe limit" in v["measured"]["GPU0->GPU1"]


# ------------------------------------------------------------------ integrity, gaps, one GPU, no probe


def test_a_wrong_pattern_fails_even_when_p2p_is_declared_unavailable():
    for case, code in ((probe(pattern=False), "RB-P2P-CORRUPTION"),
                       (probe(staged_pattern=False, enable="CUDA_ERROR_MAP_FAILED"), "RB-P2P-STAGED-CORRUPTION")):
        v = R.judge_peer_access(case, X3080)
        assert v["status"] == "fail" and "came back wrong" in v["why"] and "corruption" in v["remedy"]
        assert v["code"] == code


def test_unverified_pattern_is_unknown_not_pass():
    v = R.judge_peer_access(probe(pattern=None, staged_pattern=None), X3080)
    assert v["status"] == "unknown" and "not verified" in v["why"]


def test_deadline_skipped_figures_are_unknown():
    p = probe(peer=None, staged=None, bidir=None)
    for pair in p["pairs"]:
        pair["errors"] = ["skipped: deadline"]
    v = R.judge_p2p_bandwidth(p, R9700)
    assert v["status"] == "unknown" and "skipped: deadline" in v["why"]


def test_a_missing_direction_is_unknown():
    p = seed004()
    p["pairs"] = p["pairs"][:1]
    assert R.judge_peer_access(p, R9700)["status"] == "unknown"
    assert "GPU1->GPU0: not probed" in R.judge_p2p_bandwidth(p, R9700)["why"]


def test_baseline_figure_not_measured_is_unknown():
    p = seed004()
    p["bidir"] = []
    v = R.judge_p2p_bandwidth(p, R9700, SEED004_BASELINE)
    assert v["status"] == "unknown" and "bidir_gbs_0_1: not measured" in v["why"]


def test_one_gpu_skips():
    one = probe(n=1)
    v = R.judge_peer_access(one, H200)
    assert v["status"] == "skip" and "one GPU" in v["why"]
    b = R.judge_p2p_bandwidth(one, H200)
    assert b["status"] == "skip" and b["metrics"] == {"h2d_gbs_0": 12.1, "d2h_gbs_0": 13.0}


def test_one_gpu_when_rigbook_gpu_count_is_two_fails():
    for judge, code in ((R.judge_peer_access, "RB-P2P-ACCESS-GPU-MISSING"),
                        (R.judge_p2p_bandwidth, "RB-P2P-BANDWIDTH-GPU-MISSING")):
        v = judge(probe(n=1), R9700)
        assert v["status"] == "fail" and "the driver sees 1 GPU(s), rigbook_gpu.count is 2" in v["why"]
        assert v["code"] == code


@pytest.mark.parametrize("ladder_view", [X3080, R9700, H200, {}])
def test_probe_unavailable_is_unknown(ladder_view):
    gone = {"available": False, "api": "cuda", "error": "cannot load libcuda.so.1: no such file"}
    for judge in (R.judge_peer_access, R.judge_p2p_bandwidth):
        v = judge(gone, ladder_view)
        assert v["status"] == "unknown" and "cannot load libcuda.so.1" in v["why"]
        assert "driver_state" in v["remedy"]
    assert R.judge_peer_access({}, {})["status"] == "unknown"


def test_a_hung_probe_fails_where_p2p_is_expected():
    hung = {"available": False, "timed_out": True, "error": "the probe did not finish within 40 s and was killed"}
    assert R.judge_peer_access(hung, R9700)["status"] == "fail"
    assert R.judge_p2p_bandwidth(hung, R9700)["status"] == "fail"
    assert R.judge_peer_access(hung, R9700)["code"] == "RB-P2P-ACCESS-PROBE-HUNG"
    assert R.judge_p2p_bandwidth(hung, R9700)["code"] == "RB-P2P-BANDWIDTH-PROBE-HUNG"
    assert R.judge_peer_access(hung, X3080)["status"] == "unknown"


# ------------------------------------------------------------------ the evidence boundary and a real replay


def test_probe_output_reads_a_recording_and_never_calls_the_probe(tmp_path, fixtures):
    commands = tmp_path.joinpath("var", "lib", "rigbook", "commands")
    commands.mkdir(parents=True)
    shutil.copy(fixtures / "probe" / "h200-cuda-probe.json", commands / "cuda-probe.json")

    def live():
        raise AssertionError("a recorded root must not be probed")

    data, source = evidence.probe_output(str(tmp_path), "cuda-probe", live)
    assert data["available"] is True and source == "recorded var/lib/rigbook/commands/cuda-probe.json"
    missing, source = evidence.probe_output(str(tmp_path), "hip-probe", live)
    assert missing["available"] is False and "no recording" in missing["error"]
    (commands / "hip-probe.json").write_text("[1, 2")
    garbled, _ = evidence.probe_output(str(tmp_path), "hip-probe", live)
    assert garbled["available"] is False and "garbled" in garbled["error"]


def test_probe_output_calls_the_probe_on_a_live_root():
    data, source = evidence.probe_output("/", "cuda-probe", lambda: {"available": True, "devices": []})
    assert data == {"available": True, "devices": []} and source == "live cuda-probe"
    boom, _ = evidence.probe_output("/", "cuda-probe", lambda: 1 / 0)
    assert boom["available"] is False and "ZeroDivisionError" in boom["error"]


def test_collect_probe_picks_the_vendor_recording(tmp_path, fixtures):
    commands = tmp_path.joinpath("var", "lib", "rigbook", "commands")
    commands.mkdir(parents=True)
    shutil.copy(fixtures / "probe" / "h200-cuda-probe.json", commands / "cuda-probe.json")
    data = runtime_evidence.collect_probe(str(tmp_path), H200)
    assert data["api"] == "cuda" and data["source"].startswith("recorded")
    unknown_vendor = runtime_evidence.collect_probe(str(tmp_path), {})
    assert unknown_vendor["api"] == "cuda"
    amd = runtime_evidence.collect_probe(str(tmp_path), R9700)
    assert amd["available"] is False and "hip-probe.json" in amd["error"]


def test_ipc_legacy_follows_the_rocm_pin():
    assert runtime_evidence.ipc_legacy_of({"pins": {"rocm": {"hsa_env": {"HSA_ENABLE_IPC_MODE_LEGACY": "0"}}}}) is False
    assert runtime_evidence.ipc_legacy_of({"pins": {"rocm": {"hsa_env": {"HSA_ENABLE_IPC_MODE_LEGACY": "1"}}}}) is True
    assert runtime_evidence.ipc_legacy_of({}) is None


def test_replay_of_the_real_h200_probe(fixtures):
    """The probe's JSON captured on a real H200 (tests/fixtures/probe/README.md), through both judges."""
    real = json.loads((fixtures / "probe" / "h200-cuda-probe.json").read_text())
    assert real["available"] and real["devices"][0]["name"] == "NVIDIA H200"
    access = R.judge_peer_access(real, H200)
    assert access["status"] == "skip" and "one GPU" in access["why"]
    bandwidth = R.judge_p2p_bandwidth(real, H200)
    assert bandwidth["status"] == "skip"
    assert bandwidth["metrics"] == {"h2d_gbs_0": 55.3, "d2h_gbs_0": 55.35}
    assert "H2D 55.30 GB/s, D2H 55.35 GB/s" in bandwidth["why"]
    # the same host against its own figures as baseline, then against a baseline twice as fast
    assert R.judge_p2p_bandwidth(real, H200, dict(bandwidth["metrics"]))["status"] == "skip"
    doubled = {k: 2 * v for k, v in bandwidth["metrics"].items()}
    v = R.judge_p2p_bandwidth(real, H200, doubled)
    assert v["status"] == "fail" and "h2d_gbs_0 55.30 vs baseline 110.60 (0.50x)" in v["why"]
    # host variables that expect two GPUs where the driver saw one
    assert R.judge_peer_access(real, {"gpu": {"count": 2}})["status"] == "fail"


def test_replay_of_the_real_self_pair_probe(fixtures):
    """The (0, 0) run exercised the peer code path on one GPU: the judges still see one GPU, and its shape."""
    real = json.loads((fixtures / "probe" / "h200-cuda-probe-selfpair.json").read_text())
    (pair,) = real["pairs"]
    assert pair["pattern_ok"] is True and pair["staged_pattern_ok"] is True and pair["enable_peer"]
    assert pair["peer_gbs"] > pair["host_staged_gbs"] > 0 and real["bidir"][0]["gbs"] > 0
    assert R.judge_peer_access(real, H200)["status"] == "skip"
    assert set(R.judge_p2p_bandwidth(real, H200)["metrics"]) == {"h2d_gbs_0", "d2h_gbs_0"}


# ------------------------------------------------------------------ the modules, through real Ansible


def test_the_ladder_module_judges_a_recorded_probe_through_ansible(tmp_path):
    """peer_access fails on seed 000's recording when P2P is expected; p2p_bandwidth judges a registered probe
    result (probe_result) without probing again; an unknown layer fails the task by name."""


    root = tmp_path / "x99-3080"
    commands = root / "var" / "lib" / "rigbook" / "commands"
    commands.mkdir(parents=True)
    (commands / "cuda-probe.json").write_text(json.dumps(seed000()))
    declared = {"gpu": {"vendor": "nvidia", "count": 2, "pcie": {"gen": 3, "width": 16}}, "p2p": {"expected": False}}
    expecting = {**declared, "p2p": {"expected": True}}
    declared = host_model.build({"rigbook_gpu": declared["gpu"], "rigbook_p2p": declared["p2p"]})
    expecting = host_model.build({"rigbook_gpu": expecting["gpu"], "rigbook_p2p": expecting["p2p"]})
    ladder = "rigbook.homelab.ladder"
    tasks = [
        {ladder: {"phase": "runtime", "layers": ["peer_access"], "root": str(root), "host": declared},
         "register": "declared"},
        {ladder: {"phase": "runtime", "layers": ["p2p_bandwidth"], "probe_result": "{{ declared.evidence.probe }}",
                  "host": declared, "baseline": {"host_staged_gbs_0_1": 6.0}}, "register": "bw"},
        {"debug": {"msg": "RESULT {{ declared.ladder[0].status }} {{ bw.ladder[0].status }} "
                          "{{ bw.ladder[0].metrics.peer_gbs_0_1 }}"}},
        {ladder: {"phase": "static", "layers": ["peer_access"]}, "register": "other_phase"},
        {ladder: {"phase": "static", "layers": ["pcie_link", "bogus"]}, "register": "wrong", "ignore_errors": True},
        {"debug": {"msg": "OTHER {{ other_phase.ladder | length }}; WRONG {{ wrong.msg }}"}},
        {ladder: {"phase": "runtime", "layers": ["peer_access"], "root": str(root), "host": expecting}},
    ]
    proc = local_playbook(tmp_path, tasks)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "RESULT pass pass 6.0" in out
    assert ("OTHER 0; WRONG layers: unknown layer(s) bogus; the layers are firmware, pcie_link, dma_window, "
            "kernel_state, driver_state, peer_access, p2p_bandwidth, collectives, nccl_transport, serving") in out
    assert "enabling peer access failed with CUDA_ERROR_MAP_FAILED (mapping of buffer object failed)" in out
    assert "failed=1" in out


def test_module_documentation_parses():
    import ast
    from pathlib import Path

    import yaml

    for name in ("ladder",):
        source = Path(__file__).resolve().parents[5] / "plugins" / "modules" / (name + ".py")
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.Assign) and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                assert yaml.safe_load(node.value.value), (name, node.targets[0].id)
