"""Judges of the collectives and nccl_transport layers, on real NCCL logs (tests/fixtures/parse) and seed figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench as collectives
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import baseline_compare as baseline
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.collective_layers import (
    judge_collectives,
    judge_nccl_transport,
)

LOGS = Path(__file__).resolve().parents[4] / "fixtures" / "parse" / "nccl-log"
P2P = {"gpu": {"count": 2}, "p2p": {"expected": True, "nccl_p2p_level": "PHB"}}
NO_P2P = {"gpu": {"count": 2}, "p2p": {"expected": False, "reason": "BAR1 256 MiB"}}
# The X99 + 2x R9700 write-up: RCCL SendRecv 1 GB 9.75 GB/s, AllReduce busbw 9.51 GB/s.
SEED_004 = {"available": True, "source": "write-up figures",
            "results": [{"op": "sendrecv", "size_bytes": 1 << 30, "busbw_gbs": 9.75, "wrong": 0},
                        {"op": "all_reduce", "size_bytes": 1 << 30, "busbw_gbs": 9.51, "wrong": 0}]}
SEED_004_BASELINE = {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}


def transport(name):
    text = (LOGS / f"{name}.txt").read_text()
    return collectives.transport_evidence(text, name)


def with_busbw(data, factor):
    out = {**data, "results": [dict(r, busbw_gbs=r["busbw_gbs"] * factor) for r in data["results"]]}
    return out


def test_seed_004_passes_against_its_baseline():
    verdict = judge_collectives(SEED_004, P2P, SEED_004_BASELINE)
    assert verdict["status"] == "pass"
    assert verdict["metrics"] == {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}
    assert "code" not in verdict


def test_half_the_busbw_fails_with_measured_vs_baseline():
    verdict = judge_collectives(with_busbw(SEED_004, 0.5), P2P, SEED_004_BASELINE)
    assert verdict["status"] == "fail"
    assert "all_reduce_busbw_gbs 4.75 vs baseline 9.51 (0.50x), below 0.80x" in verdict["why"]
    assert "SHM fallback" in verdict["remedy"]
    assert verdict["code"] == "RB-COLLECTIVES-BASELINE" and "codes" not in verdict


def test_warn_band_between_095_and_08():
    assert judge_collectives(with_busbw(SEED_004, 0.9), P2P, SEED_004_BASELINE)["status"] == "warn"
    assert judge_collectives(with_busbw(SEED_004, 0.9), P2P, SEED_004_BASELINE)["code"] == "RB-COLLECTIVES-BASELINE-DIP"
    tight = judge_collectives(with_busbw(SEED_004, 0.9), P2P, SEED_004_BASELINE, {"fail_below": 0.92,
                                                                                  "warn_below": 0.97})
    assert tight["status"] == "fail"


def test_wrong_results_fail_whatever_the_bandwidth():
    data = {**SEED_004, "results": [dict(SEED_004["results"][0], wrong=3), SEED_004["results"][1]]}
    verdict = judge_collectives(data, P2P, SEED_004_BASELINE)
    assert verdict["status"] == "fail" and "sendrecv #wrong 3" in verdict["why"]
    assert verdict["code"] == "RB-COLLECTIVES-WRONG-RESULTS"


def test_out_of_bounds_fails():
    data = {**SEED_004, "results": [dict(SEED_004["results"][1], out_of_bounds=12)]}
    assert judge_collectives(data, P2P)["status"] == "fail"


def test_no_baseline_is_a_pass_that_says_so():
    verdict = judge_collectives(SEED_004, P2P, {})
    assert verdict["status"] == "pass" and "no baseline recorded" in verdict["why"]


def test_no_results_is_unknown():
    verdict = judge_collectives({"available": False, "error": "no nccl-tests"}, P2P)
    assert verdict["status"] == "unknown" and "no nccl-tests" in verdict["why"]


def test_shm_path_box_is_held_to_its_shm_baseline():
    shm = {"available": True, "results": [{"op": "sendrecv", "busbw_gbs": 6.0, "wrong": 0},
                                          {"op": "all_reduce", "busbw_gbs": 5.8, "wrong": 0}]}
    base = {"sendrecv_busbw_gbs": 6.0, "all_reduce_busbw_gbs": 5.8}
    assert judge_collectives(shm, NO_P2P, base)["status"] == "pass"
    verdict = judge_collectives(with_busbw(shm, 0.5), NO_P2P, base)
    assert verdict["status"] == "fail" and "SHM path" in verdict["remedy"]


@pytest.mark.parametrize(
    "fixture,status,words",
    [
        ("nccl_tests29_old_ring_ipc", "pass", "P2P/IPC"),
        ("tinygrad17_direct_pointer_blank_lines", "pass", "P2P/direct pointer"),
        ("nccl1817_shm_8gpu", "fail", "channels go through SHM/direct/direct, not P2P"),
        ("nccl_tests307_shm_and_ring_listing", "fail", "9 of 9 channels"),
        ("nccl1453_cumem_and_net_ibext", "fail", "NET/IBext"),
        ("nccl952_ipc_read_and_socket", "fail", "NET/Socket/3"),
        ("tinygrad45_truncated_before_channels", "unknown", "no NCCL channel lines"),
    ],
)
def test_transport_on_real_logs_with_p2p_expected(fixture, status, words):
    verdict = judge_nccl_transport(transport(fixture), P2P)
    assert verdict["status"] == status, verdict
    assert words in verdict["why"]
    assert verdict.get("code") == {"pass": None, "fail": "RB-P2P-SHM-FALLBACK",
                                   "unknown": "RB-NCCL-TRANSPORT-UNKNOWN"}[status]


def test_transport_shm_is_right_when_p2p_is_declared_unavailable():
    assert judge_nccl_transport(transport("nccl1817_shm_8gpu"), NO_P2P)["status"] == "pass"
    assert judge_nccl_transport(transport("nccl1814_net_send_receive"), NO_P2P)["status"] == "fail"
    assert judge_nccl_transport(transport("nccl_tests29_old_ring_ipc"), NO_P2P)["status"] == "warn"
    assert judge_nccl_transport(transport("nccl1814_net_send_receive"), NO_P2P)["code"] == "RB-NCCL-NET-TRANSPORT"
    assert judge_nccl_transport(transport("nccl_tests29_old_ring_ipc"), NO_P2P)["code"] == \
        "RB-NCCL-P2P-DECLARED-UNAVAILABLE"


def test_transport_level_and_direct_flag():
    text = (LOGS / "nccl_tests29_old_ring_ipc.txt").read_text()
    text += "\nhost:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS\n"
    text += "host:1:1 [0] NCCL INFO isAllDirectP2p 1\n"
    parsed = collectives.transport_evidence(text, "test")
    assert parsed["p2p_level"] == "SYS" and parsed["all_direct_p2p"] is True
    verdict = judge_nccl_transport(parsed, P2P)
    assert verdict["status"] == "warn" and "NCCL_P2P_LEVEL is SYS, rigbook_p2p pins PHB" in verdict["why"]
    assert verdict["code"] == "RB-NCCL-P2P-LEVEL-MISMATCH"


def test_baseline_compare_edges():
    assert baseline.compare("x", None, 5.0)[0] == "unknown"
    assert baseline.compare("x", 5.0, None)[0] == "skip"
    assert baseline.compare("x", 5.0, 5.0)[0] == "pass"
    assert baseline.compare("x", 4.0, 5.0)[0] == "warn"  # 0.8x is the fail line, not below it
    assert baseline.compare("x", 3.9, 5.0)[0] == "fail"


def test_recorded_collectives_json_and_nccl_tests_text(tmp_path, fixtures):
    commands = tmp_path / "var" / "lib" / "rigbook" / "commands"
    commands.mkdir(parents=True)
    real = (fixtures / "parse" / "nccl-tests" / "nccl340_old_error_column.txt").read_text()
    (commands / "nccl-tests-all_reduce.txt").write_text(real)
    data = collectives.collect_collectives(str(tmp_path))
    assert data["available"] and data["results"][0]["op"] == "all_reduce"
    assert data["results"][0]["busbw_gbs"] is not None
    (commands / "nccl-log.txt").write_text((LOGS / "nccl1817_shm_8gpu.txt").read_text())
    text, source = collectives.collect_nccl_log(str(tmp_path))
    assert "SHM" in text and source == "recorded nccl-log.txt"


# seed 004: TransferBench GFX push 10.29 GB/s each way, the peer copy the p2p_bandwidth layer measures.
SEED_004_PROBE = {"available": True, "api": "hip",
                  "pairs": [{"src": 0, "dst": 1, "peer_gbs": 10.29}, {"src": 1, "dst": 0, "peer_gbs": 10.29}]}
SEED_004_ALL = {**SEED_004, "results": SEED_004["results"] + [
    {"op": "all_gather", "size_bytes": 1 << 30, "algbw_gbs": 18.31, "busbw_gbs": 9.16, "wrong": 0},
    {"op": "reduce_scatter", "size_bytes": 1 << 30, "algbw_gbs": 17.83, "busbw_gbs": 8.92, "wrong": 0}]}
SEED_004_ALL_BASELINE = {**SEED_004_BASELINE, "all_gather_busbw_gbs": 9.16, "reduce_scatter_busbw_gbs": 8.92}


def with_sendrecv(data, busbw):
    return {**data, "results": [dict(r, busbw_gbs=busbw) if r["op"] == "sendrecv" else r for r in data["results"]]}


def test_seed_004_sendrecv_at_095_of_its_peer_copy_passes():
    verdict = judge_collectives(SEED_004, P2P, SEED_004_BASELINE, probe=SEED_004_PROBE)
    assert verdict["status"] == "pass", verdict
    assert "sendrecv busbw 9.75 GB/s is 0.95x the peer copy GPU0->GPU1 10.29 GB/s" in \
        verdict["measured"]["sendrecv_of_peer"]


def test_sendrecv_of_stock_rccl_over_shm_fails_against_the_peer_copy_without_a_baseline():
    """seed 004's stock RCCL: SendRecv 6.90 GB/s while the GPUs copy 10.29 GB/s peer to peer (0.67x)."""
    verdict = judge_collectives(with_sendrecv(SEED_004, 6.90), P2P, None, probe=SEED_004_PROBE)
    assert verdict["status"] == "fail", verdict
    assert "0.67x the peer copy" in verdict["why"] and "below 0.75x" in verdict["why"]
    assert "seed 004" in verdict["why"] and "NCCL_P2P_LEVEL=PHB" in verdict["remedy"]
    assert verdict["code"] == "RB-COLLECTIVES-SENDRECV-BELOW-PEER"


def test_sendrecv_between_the_lines_warns_and_the_tolerance_moves_them():
    data = with_sendrecv(SEED_004, 8.5)  # 0.83x of 10.29
    verdict = judge_collectives(data, P2P, None, probe=SEED_004_PROBE)
    assert verdict["status"] == "warn" and "below 0.90x" in verdict["why"] and "seed 004: 9.75 vs 10.29" in \
        verdict["why"]
    assert verdict["code"] == "RB-COLLECTIVES-SENDRECV-PEER-DIP"
    assert judge_collectives(data, P2P, None, {"sendrecv_of_peer_fail_below": 0.85},
                             probe=SEED_004_PROBE)["status"] == "fail"
    assert judge_collectives(data, P2P, None, {"sendrecv_of_peer_warn_below": 0.8},
                             probe=SEED_004_PROBE)["status"] == "pass"


def test_the_slower_direction_is_the_reference():
    probe = {**SEED_004_PROBE, "pairs": [dict(SEED_004_PROBE["pairs"][0], peer_gbs=14.0),
                                         dict(SEED_004_PROBE["pairs"][1], peer_gbs=10.0)]}
    verdict = judge_collectives(with_sendrecv(SEED_004, 9.75), P2P, None, probe=probe)
    assert verdict["status"] == "pass" and "GPU1->GPU0 10.00 GB/s" in verdict["measured"]["sendrecv_of_peer"]


def test_no_probe_or_no_p2p_means_no_peer_comparison():
    alone = judge_collectives(with_sendrecv(SEED_004, 6.90), P2P, None)
    assert alone["status"] == "pass" and "not compared" in alone["measured"]["sendrecv_of_peer"]
    shm = judge_collectives(with_sendrecv(SEED_004, 2.0), NO_P2P, None, probe=SEED_004_PROBE)
    assert shm["status"] == "pass" and "sendrecv_of_peer" not in shm["measured"]


def test_all_gather_and_reduce_scatter_are_figures_held_to_the_baseline():
    verdict = judge_collectives(SEED_004_ALL, P2P, SEED_004_ALL_BASELINE, probe=SEED_004_PROBE)
    assert verdict["status"] == "pass", verdict
    assert verdict["metrics"]["all_gather_busbw_gbs"] == 9.16 and verdict["metrics"]["reduce_scatter_busbw_gbs"] == 8.92
    halved = {**SEED_004_ALL, "results": [dict(r, busbw_gbs=r["busbw_gbs"] * 0.5) if r["op"] == "reduce_scatter"
                                          else r for r in SEED_004_ALL["results"]]}
    verdict = judge_collectives(halved, P2P, SEED_004_ALL_BASELINE, probe=SEED_004_PROBE)
    assert verdict["status"] == "fail" and "reduce_scatter_busbw_gbs 4.46 vs baseline 8.92 (0.50x)" in verdict["why"]


def test_a_held_all_gather_that_was_not_measured_warns():
    verdict = judge_collectives(SEED_004, P2P, SEED_004_ALL_BASELINE, probe=SEED_004_PROBE)
    assert verdict["status"] == "warn" and "not measured: all_gather" in verdict["why"]
    assert verdict["code"] == "RB-COLLECTIVES-OP-NOT-MEASURED"
    assert judge_collectives(SEED_004, P2P, SEED_004_BASELINE, probe=SEED_004_PROBE)["status"] == "pass"


# isAllDirectP2p in the collectives run's own log (seed 004's must: "the final log confirms isAllDirectP2p 1 via
# P2P/IPC", not SHM). The "Check P2P Type" line in NCCL's format (NVIDIA/nccl src/transport.cc,
# ncclTransportCheckP2pType) put in front of real logs of the fixtures (tests/fixtures/parse/SOURCES.md).
CHECK_LINE = "host:1:1 [0] NCCL INFO Check P2P Type isAllDirectP2p {} directMode 0 isAllCudaP2p 1\n"


def with_run_log(data, fixture, direct):
    text = CHECK_LINE.format(direct) + (LOGS / f"{fixture}.txt").read_text()
    return {**data, "nccl_log": text, "log": collectives.log_summary(text)}


def test_is_all_direct_p2p_0_in_the_runs_own_log_fails_collectives_where_p2p_is_expected():
    data = with_run_log(SEED_004, "nccl1817_shm_8gpu", 0)
    verdict = judge_collectives(data, {**P2P, "gpu": {"count": 2, "vendor": "amd"}}, SEED_004_BASELINE,
                                probe=SEED_004_PROBE)
    assert verdict["status"] == "fail", verdict
    assert "isAllDirectP2p 0 (channels via SHM/direct/direct)" in verdict["why"]
    assert "isAllDirectP2p 1 via P2P/IPC" in verdict["why"]
    assert verdict["expected"]["isAllDirectP2p"] == 1 and verdict["measured"]["isAllDirectP2p"].startswith("0 ")
    assert "NCCL_P2P_LEVEL" in verdict["remedy"]  # the amd remedy: the environment file, then RCCL's patch
    assert verdict["metrics"]["sendrecv_busbw_gbs"] == 9.75  # the figures are still recorded
    assert verdict["code"] == "RB-COLLECTIVES-NOT-DIRECT-P2P"
    nvidia = judge_collectives(data, {**P2P, "gpu": {"count": 2, "vendor": "nvidia"}}, SEED_004_BASELINE)
    assert nvidia["status"] == "fail" and "P2P driver fork" in nvidia["remedy"]


def test_is_all_direct_p2p_1_passes_and_is_shown():
    data = with_run_log(SEED_004, "nccl_tests29_old_ring_ipc", 1)
    verdict = judge_collectives(data, P2P, SEED_004_BASELINE, probe=SEED_004_PROBE)
    assert verdict["status"] == "pass", verdict
    assert verdict["measured"]["isAllDirectP2p"] == "1 in the run's own log (p2p)"


def test_is_all_direct_p2p_0_is_the_expected_state_where_p2p_is_declared_unavailable():
    """seed 000's box: P2P declared unavailable, the collectives held to their SHM path."""
    shm = {"available": True, "results": [{"op": "sendrecv", "busbw_gbs": 6.0, "wrong": 0},
                                          {"op": "all_reduce", "busbw_gbs": 5.8, "wrong": 0}]}
    verdict = judge_collectives(with_run_log(shm, "nccl1817_shm_8gpu", 0), NO_P2P,
                                {"sendrecv_busbw_gbs": 6.0, "all_reduce_busbw_gbs": 5.8})
    assert verdict["status"] == "pass", verdict
    assert "declared unavailable" in verdict["measured"]["isAllDirectP2p"] and "isAllDirectP2p" not in \
        verdict["expected"]


def test_a_run_without_the_check_line_is_not_judged_on_it():
    text = (LOGS / "nccl1817_shm_8gpu.txt").read_text()  # older NCCL: no "Check P2P Type" line
    data = {**SEED_004, "nccl_log": text, "log": collectives.log_summary(text)}
    verdict = judge_collectives(data, P2P, SEED_004_BASELINE)
    assert verdict["status"] == "pass" and "isAllDirectP2p" not in verdict["measured"]


def test_the_collector_summarises_a_recorded_runs_own_log(tmp_path):
    commands = tmp_path / "var" / "lib" / "rigbook" / "commands"
    commands.mkdir(parents=True)
    text = CHECK_LINE.format(0) + (LOGS / "nccl1817_shm_8gpu.txt").read_text()
    (commands / "collectives.json").write_text(json.dumps({**SEED_004, "nccl_log": text}))
    data = collectives.collect_collectives(str(tmp_path))
    assert data["log"] == {"all_direct_p2p": False, "all_cuda_p2p": True, "path": "shm",
                           "transports": ["SHM/direct/direct"], "nccl_version": None}
    (commands / "collectives.json").write_text(json.dumps(SEED_004))
    assert "log" not in collectives.collect_collectives(str(tmp_path))


def test_nccl_transport_fails_on_is_all_direct_p2p_0_where_p2p_is_expected():
    text = CHECK_LINE.format(0) + (LOGS / "nccl_tests29_old_ring_ipc.txt").read_text()
    verdict = judge_nccl_transport(collectives.transport_evidence(text, "test"), P2P)
    assert verdict["status"] == "fail" and "isAllDirectP2p 0" in verdict["why"], verdict
    assert verdict["measured"]["isAllCudaP2p"] is True
    # every channel via P2P/IPC: no SHM fallback; the level the inventory pins was not set
    assert verdict["codes"] == ["RB-NCCL-NOT-DIRECT-P2P", "RB-NCCL-P2P-LEVEL-UNSET"]
    shm = CHECK_LINE.format(0) + (LOGS / "nccl1817_shm_8gpu.txt").read_text()
    assert judge_nccl_transport(collectives.transport_evidence(shm, "test"), NO_P2P)["status"] == "pass"


# --- one GPU: counted from the GPUs the box shows (the static "gpus" part), as the static layers count them ----------

NO_RUN = {"available": False, "error": "no nccl-tests binaries (all_reduce_perf, sendrecv_perf) and no serving Python "
                                        "to run the bundled benchmark with"}


def test_one_gpu_in_sysfs_skips_with_no_gpu_count_in_the_inventory():
    """real-gpu-run.md defect 9: the shipped localhost inventory (no rigbook_gpu) on a one-GPU box."""
    collectives = judge_collectives(NO_RUN, {}, gpus_seen=1)
    assert collectives["status"] == "skip" and collectives["why"].startswith("one GPU: no collective between GPUs")
    transport = judge_nccl_transport({"available": False, "source": "journal"}, {}, gpus_seen=1)
    assert transport["status"] == "skip" and transport["why"] == "one GPU: NCCL opens no channel between GPUs"
    # not counted (a climb without the static part): the inventory's count decides, as before
    assert judge_collectives(NO_RUN, {})["status"] == "unknown"
    assert judge_collectives(NO_RUN, {"gpu": {"count": 1}})["status"] == "skip"


def test_a_gpu_missing_from_a_box_declared_with_two_is_no_one_gpu_skip():
    declared_two = {"gpu": {"vendor": "nvidia", "count": 2}}
    assert judge_collectives(NO_RUN, declared_two, gpus_seen=1)["status"] == "unknown"
    assert judge_nccl_transport({"available": False, "source": "journal"}, declared_two,
                                gpus_seen=1)["status"] == "unknown"
    assert judge_collectives(NO_RUN, {"gpu": {"count": 1}}, gpus_seen=2)["status"] == "unknown"


def test_each_finding_of_a_run_names_its_code_the_most_severe_first():
    """A collectives verdict with several findings lists each one's code (ladder/codes.py), the fail class first."""
    failed = {**SEED_004, "failures": [{"text": "Cuda failure 'mapping of buffer object failed'",
                                        "code": "CUDA_ERROR_MAP_FAILED"}]}
    assert judge_collectives(failed, P2P)["code"] == "RB-COLLECTIVES-RUN-FAILED"
    one_rank = {**SEED_004, "world_size": 1, "results": [dict(SEED_004["results"][0], wrong=2)]}
    assert judge_collectives(one_rank, P2P)["code"] == "RB-COLLECTIVES-WRONG-ONE-RANK"
    # below the baseline (fail) and the sendrecv a little short of the peer copy (warn): both, the fail first
    slow = judge_collectives(with_sendrecv(with_busbw(SEED_004, 0.5), 8.5), P2P, SEED_004_BASELINE,
                             probe=SEED_004_PROBE)
    assert slow["status"] == "fail"
    assert slow["codes"] == ["RB-COLLECTIVES-BASELINE", "RB-COLLECTIVES-SENDRECV-PEER-DIP"]
    ab = {**SEED_004, "ab": {"gain": 1.02, "busbw_gbs": 9.75, "p2p_disabled_busbw_gbs": 9.6}}
    assert judge_collectives(ab, P2P)["code"] == "RB-COLLECTIVES-NO-P2P-GAIN"
