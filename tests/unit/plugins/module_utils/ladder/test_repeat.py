"""ladder/repeat.py through the climb: a figure below the baseline's fail line is measured again before it fails.

A fail that recovers on the repeat is a warn saying both figures, one that holds fails saying both; a fail for
anything but figures (wrong results, an SHM fallback, no real P2P) is never repeated; a replay and a recorded tree
cannot measure again and say so; a replay of evidence holding the repeat is judged as the live climb judged it.
The host-copy figures are the real H200's (tests/fixtures/device/baseline-show.txt: h2d 55.34, d2h 55.24 GB/s).
"""

from __future__ import annotations

import copy

from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry, repeat

BASELINE = {"h2d_gbs_0": 55.34, "d2h_gbs_0": 55.24}
ONE_GPU = {"gpu": {"count": 1, "vendor": "nvidia"}, "p2p": {"expected": False, "reason": "one GPU"}}
TWO_GPUS = {"gpu": {"count": 2, "vendor": "nvidia", "pcie": {"gen": 3, "width": 16}}, "p2p": {"expected": True}}
QUIET = {"aer": {}, "devices": {}, "log": {}, "log_source": "test"}


def host_probe(h2d, d2h=55.22):
    return {"available": True, "api": "cuda", "errors": [],
            "devices": [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "0000:00:06.0",
                         "h2d_gbs": h2d, "d2h_gbs": d2h}], "pairs": [], "bidir": []}


def pair_probe(peer=10.29, staged=6.0, pattern_ok=True):
    pairs = [{"src": s, "dst": d, "can_access_peer": True, "enable_peer": "ok", "pattern_ok": pattern_ok,
              "staged_pattern_ok": True, "peer_gbs": peer, "host_staged_gbs": staged} for s, d in ((0, 1), (1, 0))]
    return {"available": True, "api": "cuda", "errors": [],
            "devices": [{"index": i, "name": "GPU", "pci_bus_id": f"0000:0{i}:00.0", "h2d_gbs": 12.0,
                         "d2h_gbs": 12.0} for i in (0, 1)], "pairs": pairs,
            "bidir": [{"a": 0, "b": 1, "gbs": 19.76}]}


def run(sendrecv=9.75, all_reduce=9.51, wrong=0, direct=None):
    out = {"available": True, "source": "nccl-tests", "results": [
        {"op": "sendrecv", "busbw_gbs": sendrecv, "wrong": wrong}, {"op": "all_reduce", "busbw_gbs": all_reduce,
                                                                   "wrong": 0}]}
    if direct is not None:
        out["log"] = {"all_direct_p2p": direct, "path": "nccl.log", "transports": ["SHM"]}
    return out


def _climb(monkeypatch, layer, part, runs, view, baseline, root="/", evidence=None, extra=None):
    """One climb of LAYER whose PART's collector returns RUNS in turn; (verdict, evidence, collector calls)."""
    runs = list(runs)
    calls = []

    def collect(ctx, evidence):
        calls.append(len(calls))
        return {part: copy.deepcopy(runs[min(len(calls), len(runs)) - 1])}

    monkeypatch.setattr(registry, "ERROR_COUNTERS", lambda ctx, evidence: QUIET)
    for need in registry.get(layer).needs:
        monkeypatch.setitem(registry.PARTS, need, lambda ctx, evidence: {"gpus": [{}, {}]})
    monkeypatch.setitem(registry.PARTS, part, collect)
    ctx = climb.Context(root, view, baseline, options=extra)
    verdicts, found = climb.climb([layer], ctx, evidence=evidence)
    return verdicts[0], found, len(calls)


def test_a_host_copy_below_the_line_that_recovers_on_the_repeat_is_a_warn_saying_both(monkeypatch):
    out, evidence, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2), host_probe(54.9)],
                                  ONE_GPU, BASELINE)
    assert calls == 2
    assert out["status"] == "warn"
    assert out["why"].startswith("measured again: h2d_gbs_0 41.20 then 54.90 GB/s (baseline 55.34), below 0.80x on "
                                 "the first run only, so a warn, not a fail")
    assert out["repeated"] == {"figures": {"h2d_gbs_0": [41.2, 54.9]}, "fail_below": 0.8}
    # its own code: a one-GPU box's skip code does not describe this warn
    assert out["code"] == "RB-P2P-BANDWIDTH-BASELINE-FIRST-RUN" and "codes" not in out
    assert out["metrics"]["h2d_gbs_0"] == 54.9  # the better run counts
    assert evidence["probe"]["devices"][0]["h2d_gbs"] == 41.2  # the first run stays the layer's evidence
    assert evidence[repeat.REPEATED]["probe"]["devices"][0]["h2d_gbs"] == 54.9


def test_a_host_copy_below_the_line_on_both_runs_fails_saying_both(monkeypatch):
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2), host_probe(42.0)],
                           ONE_GPU, BASELINE)
    assert calls == 2 and out["status"] == "fail"
    assert "fell against the baseline: h2d_gbs_0 42.00 vs baseline 55.34 (0.76x), below 0.80x" in out["why"]
    assert out["why"].endswith("measured again: h2d_gbs_0 41.20 then 42.00 GB/s (baseline 55.34), both below 0.80x")
    assert out["repeated"]["figures"] == {"h2d_gbs_0": [41.2, 42.0]}
    assert out["code"] == "RB-P2P-BANDWIDTH-BASELINE"


def test_a_peer_copy_pair_layer_is_repeated_per_figure(monkeypatch):
    base = {"peer_gbs_0_1": 10.29, "peer_gbs_1_0": 10.29}
    first, second = pair_probe(), pair_probe()
    first["pairs"][0]["peer_gbs"] = 7.0  # GPU0->GPU1 low on the first run,
    second["pairs"][1]["peer_gbs"] = 7.1  # GPU1->GPU0 low on the second: no figure is below the line twice
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [first, second], TWO_GPUS, base)
    assert calls == 2 and out["status"] == "warn", out["why"]
    assert "peer_gbs_0_1 7.00 then 10.29 GB/s (baseline 10.29), below 0.80x on the first run only" in out["why"]
    both_low = pair_probe(peer=7.0)
    out, _, _ = _climb(monkeypatch, "p2p_bandwidth", "probe", [both_low, both_low], TWO_GPUS, base)
    assert out["status"] == "fail" and "peer_gbs_1_0 7.00 then 7.00 GB/s (baseline 10.29), both below" in out["why"]


def test_collectives_below_the_line_are_repeated_and_a_wrong_result_in_the_repeat_fails(monkeypatch):
    base = {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}
    view = dict(TWO_GPUS, p2p={"expected": False, "reason": "test"})
    out, _, calls = _climb(monkeypatch, "collectives", "collectives", [run(sendrecv=6.9), run()], view, base)
    assert calls == 2 and out["status"] == "warn"
    assert "sendrecv_busbw_gbs 6.90 then 9.75 GB/s (baseline 9.75), below 0.80x on the first run only" in out["why"]
    assert out["code"] == "RB-COLLECTIVES-BASELINE-FIRST-RUN"
    out, _, calls = _climb(monkeypatch, "collectives", "collectives", [run(sendrecv=6.9), run(wrong=3)], view, base)
    assert calls == 2 and out["status"] == "fail" and out["why"].startswith("wrong results: sendrecv #wrong 3")
    assert out["code"] == "RB-COLLECTIVES-WRONG-RESULTS"


def test_a_wrong_result_fail_is_never_repeated(monkeypatch):
    base = {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}
    out, evidence, calls = _climb(monkeypatch, "collectives", "collectives", [run(sendrecv=6.9, wrong=2), run()],
                                  TWO_GPUS, base)
    assert calls == 1 and out["status"] == "fail" and out["why"].startswith("wrong results")
    assert "repeated" not in out and "measured again" not in out["why"] and repeat.REPEATED not in evidence
    # a peer copy that came back wrong (peer_access's and p2p_bandwidth's probe) is no figure either
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [pair_probe(peer=5.0, staged=6.0), pair_probe()],
                           TWO_GPUS, {"peer_gbs_0_1": 10.29})
    assert calls == 1 and out["status"] == "fail" and "no real P2P" in out["why"] and "repeated" not in out


def test_an_shm_fallback_is_never_repeated(monkeypatch):
    base = {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}
    out, _, calls = _climb(monkeypatch, "collectives", "collectives", [run(sendrecv=6.9, direct=0), run()],
                           TWO_GPUS, base)
    assert calls == 1 and out["status"] == "fail" and "isAllDirectP2p 0" in out["why"] and "repeated" not in out
    # sendrecv below the box's own peer copy (seed 004: stock RCCL over SHM, 6.90 vs 10.29 GB/s)
    evidence = {"root": "/", "probe": pair_probe(), "collectives": run(sendrecv=6.9)}
    out, _, _ = _climb(monkeypatch, "collectives", "collectives", [run()], TWO_GPUS, base, evidence=evidence)
    assert out["status"] == "fail" and "the peer copy" in out["why"] and "repeated" not in out
    assert "not measured again" not in out["why"]


def test_a_replay_does_not_measure_again_and_says_so(monkeypatch):
    evidence = {"root": "/", "probe": host_probe(41.2)}
    out, found, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(54.9)], ONE_GPU, BASELINE,
                               evidence=evidence)
    assert calls == 0 and out["status"] == "fail"
    assert out["why"].endswith("; not measured again (a replay judges the recorded evidence)")
    assert out["not_repeated"] == "a replay judges the recorded evidence" and repeat.REPEATED not in found


def test_a_replay_of_evidence_holding_the_repeat_judges_it_as_the_live_climb_did(monkeypatch):
    live, evidence, _ = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2), host_probe(54.9)],
                               ONE_GPU, BASELINE)
    replayed, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [], ONE_GPU, BASELINE,
                                evidence=copy.deepcopy(evidence))
    assert calls == 0 and replayed == live


def test_a_recorded_tree_or_a_given_probe_result_is_not_measured_again(monkeypatch, tmp_path):
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2), host_probe(54.9)],
                           ONE_GPU, BASELINE, root=str(tmp_path))
    assert calls == 1 and out["status"] == "fail"
    assert out["why"].endswith(f"not measured again (the figures are read from a recording under {tmp_path})")
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2), host_probe(54.9)],
                           ONE_GPU, BASELINE, extra={"probe_result": host_probe(41.2)})
    assert out["status"] == "fail" and out["not_repeated"] == "the probe result was given (probe_result)"


def test_a_repeat_that_measured_nothing_leaves_the_first_fail(monkeypatch):
    gone = {"available": False, "error": "cuInit: CUDA_ERROR_NO_DEVICE"}
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2), gone], ONE_GPU, BASELINE)
    assert calls == 2 and out["status"] == "fail"
    assert "h2d_gbs_0 41.20 then not measured (baseline 55.34)" in out["why"]
    assert "the repeat measured nothing (the GPU probe could not run: cuInit: CUDA_ERROR_NO_DEVICE)" in out["why"]


def test_no_baseline_or_a_passing_figure_is_not_repeated(monkeypatch):
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(41.2)], ONE_GPU, {})
    assert calls == 1 and out["status"] == "skip" and "repeated" not in out
    out, _, calls = _climb(monkeypatch, "p2p_bandwidth", "probe", [host_probe(54.0)], ONE_GPU, BASELINE)
    assert calls == 1 and out["status"] == "skip"


def test_the_better_of_two_probes_never_makes_a_peer_copy_look_host_staged():
    first, second = pair_probe(peer=10.0, staged=8.9), pair_probe(peer=7.0, staged=6.0)
    merged = repeat.better_probe(first, second)
    for pair in merged["pairs"]:
        assert pair["peer_gbs"] == 10.0 and pair["host_staged_gbs"] == 8.9 and pair["peer_gbs"] > 1.1 * 8.9
    assert repeat.better_probe(first, {"available": False}) == {"available": False}
