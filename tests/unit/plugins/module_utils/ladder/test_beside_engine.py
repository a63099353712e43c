"""ladder/beside_engine.py: how a runtime layer is judged when an engine ran beside it - an unknown that ran out of GPU
memory becomes a skip naming the engine and the memory it holds, a figures layer says it was measured beside it,
nothing is ever softened - and, through the climb, that such a skip is not the "expected layer unknown fails" rule's
fail while an unknown for any other reason still is. The OOM lines are the words the drivers and tools print (the
CUresult / hipError names of probe/cuda.py and probe/hip.py; nccl-tests' `Cuda failure common.cu:NNN 'out of memory'`
line and PyTorch's `torch.OutOfMemoryError: CUDA out of memory.`, reconstructed from their source's format strings)."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import beside_engine, climb, registry

BESIDE = {"engines": ["rigbook-serve-qwen.service (not stopped: p2p_verify_stop_serving is false)"],
          "memory": {"used_mib": 36044, "total_mib": 40960, "error": None,
                     "gpus": [{"gpu": "0", "used_mib": 18022, "total_mib": 20480},
                              {"gpu": "1", "used_mib": 18022, "total_mib": 20480}]},
          "remedy": "Let the runtime phase stop the serve units for its layers."}
OOM_PROBE = {"available": True, "api": "cuda", "errors": [],
             "devices": [{"index": 0, "errors": ["cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"]},
                         {"index": 1, "errors": ["cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"]}],
             "pairs": [{"src": 0, "dst": 1, "errors": ["skipped: buffers could not be allocated"]}]}


@pytest.mark.parametrize("text", [
    "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY",
    "hipMalloc: hipErrorOutOfMemory",
    "sendrecv_perf exited 1: Cuda failure common.cu:892 'out of memory'",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB",
    "hipErrorMemoryAllocation",
])
def test_the_drivers_and_tools_words_for_out_of_memory_are_found(text):
    evidence = {"collectives": {"available": False, "error": "rc 1", "runs": [{"log": "line one\n" + text + "\n"}]}}
    assert beside_engine.out_of_memory(evidence, ("collectives",)) == [text]
    assert beside_engine.out_of_memory(evidence, ("probe",)) == []  # only the layer's own evidence counts


def test_an_unknown_that_ran_out_of_memory_beside_an_engine_is_a_skip_naming_it_and_its_memory():
    unknown = verdict.make("peer_access", "unknown", {"GPU0->GPU1": "not verified"}, {"every ordered pair": "ok"},
                           "GPU0->GPU1: peer copy not verified (skipped: buffers could not be allocated)")
    out = beside_engine.judged(unknown, ("probe",), {"probe": OOM_PROBE}, BESIDE)
    assert out["status"] == "skip" and out["layer"] == "peer_access"
    assert out["why"].startswith("skipped: rigbook-serve-qwen.service (not stopped: p2p_verify_stop_serving is false) "
                                 "holds 36044 MiB of the GPUs' 40960 MiB (GPU0 18022/20480 MiB, GPU1 18022/20480 MiB)")
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in out["why"]
    assert out["remedy"] == BESIDE["remedy"] and out["expected"] == unknown["expected"]
    assert out["measured"]["gpu_memory_used_mib"] == 36044 and out["beside"] == BESIDE["engines"]
    assert out["codes"] == ["RB-BESIDE-ENGINE-OOM", "RB-PEER-ACCESS-UNKNOWN"]  # the layer's own kept


def test_nothing_beside_changes_nothing_and_a_fail_is_never_softened():
    unknown = verdict.make("peer_access", "unknown", why="no figure")
    assert beside_engine.judged(unknown, ("probe",), {"probe": OOM_PROBE}, None) is unknown
    assert beside_engine.judged(unknown, ("probe",), {"probe": OOM_PROBE}, {"engines": []}) is unknown
    # an unknown without an out-of-memory in its evidence stays unknown (the climb's rule then fails it)
    assert beside_engine.judged(unknown, ("probe",), {"probe": {"error": "no libcuda"}}, BESIDE) is unknown
    failed = verdict.make("p2p_bandwidth", "fail", why="GPU0->GPU1: 2.10 GB/s below the baseline 10.29",
                          remedy="Check the link.")
    out = beside_engine.judged(failed, ("probe",), {"probe": OOM_PROBE}, BESIDE)
    assert out["status"] == "fail"
    assert out["why"].startswith("GPU0->GPU1: 2.10 GB/s below the baseline 10.29; measured beside rigbook-serve-qwen")
    assert out["why"].endswith("its traffic can lower these figures")
    assert out["remedy"] == "Check the link. " + BESIDE["remedy"]


def test_the_figures_layers_say_they_were_measured_beside_the_engine_the_others_do_not():
    for layer in ("p2p_bandwidth", "collectives"):
        passed = verdict.make(layer, "pass", why="as expected")
        out = beside_engine.judged(passed, ("probe",), {}, BESIDE)
        assert out["status"] == "pass" and "measured beside rigbook-serve-qwen.service" in out["why"]
        assert "remedy" not in out or out["remedy"] == ""
    for layer in ("peer_access", "nccl_transport"):
        passed = verdict.make(layer, "pass", why="as expected")
        assert beside_engine.judged(passed, ("probe",), {}, BESIDE) is passed


def test_memory_not_read_is_said():
    assert beside_engine.memory_text({"used_mib": None, "error": "nvidia-smi: not found"}) == (
        "an amount of GPU memory not read (nvidia-smi: not found)")
    assert beside_engine.memory_text({"used_mib": 100, "total_mib": 200, "gpus": [{"gpu": "0"}]}) == (
        "100 MiB of the GPUs' 200 MiB")


def test_gpu_work_is_the_probe_the_collectives_and_the_transport_unless_given():
    runtime = registry.of_phase(registry.RUNTIME)
    assert beside_engine.gpu_work(runtime, {})
    assert not beside_engine.gpu_work(registry.of_phase(registry.STATIC) + registry.of_phase(registry.SERVING), {})
    probe_layers = [registry.get("peer_access"), registry.get("p2p_bandwidth")]
    assert not beside_engine.gpu_work(probe_layers, {"probe_result": {"available": True}})
    assert not beside_engine.gpu_work([registry.get("nccl_transport")], {"log": "NCCL INFO ..."})
    assert beside_engine.gpu_work([registry.get("nccl_transport")], {"probe_result": {"available": True}})


# --- through the climb: the expected-unknown rule sees the skip, never an unknown left to fail ----------------------

def _climb(monkeypatch, probe, beside):
    monkeypatch.setitem(registry.PARTS, "probe", lambda ctx, evidence: {"probe": probe})
    monkeypatch.setattr(registry.get("peer_access"), "judge",
                        lambda evidence, ctx: verdict.make("peer_access", "unknown", why="peer copy not verified"))
    ctx = climb.Context("/tree", {"measure": {"layers": True}}, options={"beside": beside})
    return climb.climb(["peer_access"], ctx)[0][0]


def test_in_the_climb_an_out_of_memory_beside_an_engine_is_a_skip_and_the_play_goes_on(monkeypatch):
    out = _climb(monkeypatch, OOM_PROBE, BESIDE)
    assert out["status"] == "skip" and out["why"].startswith("skipped: rigbook-serve-qwen.service")
    assert out["code"] == "RB-BESIDE-ENGINE-OOM"


def test_in_the_climb_an_out_of_memory_with_nothing_beside_still_fails_the_box_that_should_measure_it(monkeypatch):
    out = _climb(monkeypatch, OOM_PROBE, None)
    assert out["status"] == "fail" and out["why"].startswith("unknown on a box that should measure it")
    assert out["code"] == "RB-EXPECTED-UNMEASURED"


def test_in_the_climb_an_unknown_for_another_reason_beside_an_engine_still_fails(monkeypatch):
    out = _climb(monkeypatch, {"available": False, "error": "libamdhip64.so: cannot open"}, BESIDE)
    assert out["status"] == "fail" and "unknown on a box that should measure it" in out["why"]
