"""ladder/climb.py: everything that modifies a verdict, applied in the climb's one order (its docstring) with the one
severity order (judges/verdict.SEVERITY), never turns an expected layer that measured nothing into a pass or a warn.

1. Every base status of an expected runtime layer x every modifier of the error counters (none, a correctable AER
   rise: warn, an uncorrectable one: fail, counters unreadable) x allow_unknown (none, the host model's, the run's):
   the modifier never lowers a status, and an expected layer that came out unknown is never a pass or a warn.
2. The real figures judges (p2p_bandwidth on the probe, collectives on a collectives run) on evidence that measured
   nothing (the probe or the run did not run; once with the driver's out-of-memory words in it) or measured (at the
   baseline, or below its fail line) x a baseline recorded or not x what a repeat measures (ladder/repeat.py: the
   figure recovers, holds, or the repeat measures nothing; it runs only where a figure fell below the line) x an
   engine beside the layer or not (ladder/beside_engine.py) x the error-counter modifiers x allow_unknown: each
   combination ends exactly as the stated order says, and one that measured nothing never ends pass or warn.
"""

from __future__ import annotations

import itertools

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry, repeat

GPU = "0000:03:00.0"
LAYER = "peer_access"


def _reading(aer, log=True):
    return {"aer": {GPU: aer}, "devices": {}, "log": {} if log else None, "log_source": "test"}


# modifier -> (reading before the layer, reading after it, the status the counters alone give)
MODIFIERS = {
    "none": (_reading({"correctable": 0, "nonfatal": 0}), _reading({"correctable": 0, "nonfatal": 0}), "pass"),
    "correctable_rise": (_reading({"correctable": 0, "nonfatal": 0}),
                         _reading({"correctable": 7, "nonfatal": 0}), "warn"),
    "uncorrectable_rise": (_reading({"correctable": 0, "nonfatal": 0}),
                           _reading({"correctable": 0, "nonfatal": 1}), "fail"),
    "unreadable": (_reading({"correctable": None, "nonfatal": None}, log=False),
                   _reading({"correctable": None, "nonfatal": None}, log=False), "pass"),
}
ALLOW = {
    "none": ({}, {}),
    "host_model": ({"allow_unknown": [LAYER]}, {}),
    "run_option": ({}, {"allow_unknown": [LAYER]}),
}


def _climb(monkeypatch, base, modifier, allow):
    """One live climb of the expected runtime layer LAYER judged BASE, with MODIFIER's readings around it."""
    before, after, _ = MODIFIERS[modifier]
    readings = iter([before, after])
    monkeypatch.setattr(registry, "ERROR_COUNTERS", lambda ctx, evidence: next(readings))
    monkeypatch.setitem(registry.PARTS, "probe", lambda ctx, evidence: {"probe": {}})
    monkeypatch.setattr(registry.get(LAYER), "judge",
                        lambda evidence, ctx: verdict.make(LAYER, base, {"n": 1}, None, "judged " + base))
    view, options = ALLOW[allow]
    ctx = climb.Context("/", dict(view, measure={"layers": True}), options=options)
    out, _ = climb.climb([LAYER], ctx)
    assert len(out) == 1
    return out[0]


@pytest.mark.parametrize("base, modifier, allow",
                         list(itertools.product(verdict.STATUSES, sorted(MODIFIERS), sorted(ALLOW))))
def test_no_modifier_turns_an_expected_unknown_into_pass_or_warn(monkeypatch, base, modifier, allow):
    out = _climb(monkeypatch, base, modifier, allow)
    counters = MODIFIERS[modifier][2]
    assert verdict.rank(out["status"]) >= verdict.rank(base)  # a modifier never lowers a status
    if base != "unknown":
        assert out["status"] == (base if counters == "pass" else verdict.worse(base, counters))
        return
    assert out["status"] not in ("pass", "warn")
    if allow == "none":
        assert out["status"] == "fail" and "unknown on a box that should measure it" in out["why"]
        # the rule's code first, the layer's own kept after it
        assert out["codes"][:2] == ["RB-EXPECTED-UNMEASURED", "RB-PEER-ACCESS-UNKNOWN"]
    else:
        assert out["status"] == ("fail" if counters == "fail" else "unknown") and out["allowed_unknown"]
    if counters != "pass":
        assert "hardware errors during this layer" in out["why"]


def test_a_modifier_that_raises_a_status_puts_its_code_first_and_keeps_the_layers_own(monkeypatch):
    """The expected-unknown rule and the error counters: raising a status, the modifier's code comes first (it is why
    the verdict is what it is), the layer's own codes after it; not raising it, the modifier's come after."""
    out = _climb(monkeypatch, "unknown", "none", "none")
    assert out["status"] == "fail" and out["code"] == "RB-EXPECTED-UNMEASURED"
    assert out["codes"] == ["RB-EXPECTED-UNMEASURED", "RB-PEER-ACCESS-UNKNOWN"]
    out = _climb(monkeypatch, "warn", "uncorrectable_rise", "none")
    assert out["status"] == "fail" and out["codes"] == ["RB-HW-AER-UNCORRECTABLE", "RB-PEER-ACCESS-WARN"]
    out = _climb(monkeypatch, "pass", "correctable_rise", "none")
    assert out["status"] == "warn" and out["code"] == "RB-HW-AER-CORRECTABLE" and "codes" not in out
    out = _climb(monkeypatch, "unknown", "uncorrectable_rise", "host_model")  # allowed unknown, then the counters
    assert out["status"] == "fail" and out["codes"] == ["RB-HW-AER-UNCORRECTABLE", "RB-PEER-ACCESS-UNKNOWN"]
    out = _climb(monkeypatch, "fail", "uncorrectable_rise", "none")  # not raised: the layer's own stays first
    assert out["codes"] == ["RB-PEER-ACCESS-FAIL", "RB-HW-AER-UNCORRECTABLE"]
    out = _climb(monkeypatch, "unknown", "correctable_rise", "run_option")  # a warn leaves an unknown unknown
    assert out["status"] == "unknown" and out["codes"] == ["RB-PEER-ACCESS-UNKNOWN", "RB-HW-AER-CORRECTABLE"]


# The real judges: a two-GPU box expecting P2P on a Gen3 x16 link (seed 004's figures: peer 10.29, SendRecv 9.75,
# AllReduce 9.51 GB/s); "low" is below the baseline's 0.80x fail line and clear of every other check.
VIEW = {"gpu": {"count": 2, "vendor": "nvidia", "pcie": {"gen": 3, "width": 16}}, "p2p": {"expected": True}}
OOM = "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"


def _probe(peer):
    pairs = [{"src": s, "dst": d, "can_access_peer": True, "enable_peer": "ok", "pattern_ok": True,
              "staged_pattern_ok": True, "peer_gbs": peer, "host_staged_gbs": 6.0} for s, d in ((0, 1), (1, 0))]
    return {"available": True, "api": "cuda", "errors": [], "pairs": pairs, "bidir": [{"a": 0, "b": 1, "gbs": 19.76}],
            "devices": [{"index": i, "name": f"GPU{i}", "pci_bus_id": f"0000:0{i}:00.0"} for i in (0, 1)]}


def _run(sendrecv):
    return {"available": True, "source": "nccl-tests", "results": [
        {"op": "sendrecv", "busbw_gbs": sendrecv, "wrong": 0}, {"op": "all_reduce", "busbw_gbs": 9.51, "wrong": 0}]}


# layer -> (its evidence part, {evidence kind: the part's value}, its baseline)
FIGURES = {
    "p2p_bandwidth": ("probe", {"measured": _probe(10.29), "low": _probe(8.0), "recovers": _probe(10.2),
                                "nothing": {"available": False, "error": "libcuda.so.1: cannot open shared object"},
                                "nothing_oom": {"available": False, "error": OOM}},
                      {"peer_gbs_0_1": 10.29, "peer_gbs_1_0": 10.29}),
    "collectives": ("collectives", {"measured": _run(9.75), "low": _run(7.0), "recovers": _run(9.7),
                                    "nothing": {"available": False, "error": "no nccl-tests binaries"},
                                    "nothing_oom": {"available": False, "error": "sendrecv_perf exited 1: Cuda failure "
                                                                                 "common.cu:892 'out of memory'"}},
                    {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}),
}
SECOND = {"recovers": "recovers", "holds": "low", "nothing": "nothing"}  # what the repeat measures
BESIDE = {"none": None,
          "engine": {"engines": ["sglang (pid 4242, not stopped)"], "remedy": "Stop the engine for the runtime layers.",
                     "memory": {"used_mib": 36044, "total_mib": 40960}}}


def _expected(first, baseline, second, beside, counters, allow):
    """The status the climb's stated order gives (its docstring), step by step."""
    nothing = first.startswith("nothing")
    if nothing:
        status = "unknown"  # 1. the judge
    elif first == "low" and baseline:
        status = {"recovers": "warn", "holds": "fail", "nothing": "fail"}[second]  # 2. repeat before fail
    else:
        status = "pass"
    not_measured = nothing and beside != "none" and first == "nothing_oom"
    if not_measured:
        status = "skip"  # 3. beside an engine
    if status == "unknown" and allow == "none":
        status = "fail"  # 4. the expected-unknown rule
    if counters == "fail" or (counters == "warn" and not not_measured):
        status = verdict.worse(status, counters)  # 5. the counters: a warn leaves what measured nothing as it is
    return status


@pytest.mark.parametrize("layer, first, baseline, second, beside, modifier, allow", list(itertools.product(
    sorted(FIGURES), ("measured", "low", "nothing", "nothing_oom"), (True, False), sorted(SECOND), sorted(BESIDE),
    sorted(MODIFIERS), sorted(ALLOW))))
def test_no_composition_of_modifiers_passes_an_expected_layer_that_measured_nothing(
        monkeypatch, layer, first, baseline, second, beside, modifier, allow):
    part, kinds, recorded = FIGURES[layer]
    before, after, counters = MODIFIERS[modifier]
    readings = iter([before, after])
    runs = iter([kinds[first], kinds[SECOND[second]]])
    monkeypatch.setattr(registry, "ERROR_COUNTERS", lambda ctx, evidence: next(readings))
    for need in registry.get(layer).needs:
        monkeypatch.setitem(registry.PARTS, need, lambda ctx, evidence: {"gpus": [{}, {}]})
    monkeypatch.setitem(registry.PARTS, part, lambda ctx, evidence: {part: next(runs)})
    view, options = ({key: [layer] for key in named} for named in ALLOW[allow])  # allowed: this layer
    ctx = climb.Context("/", dict(VIEW, measure={"layers": True}, **view), recorded if baseline else {},
                        options=dict(options, beside=BESIDE[beside]))
    out, evidence = climb.climb([layer], ctx)
    out = out[0]
    repeated = first == "low" and baseline
    assert ("repeated" in out) == repeated and (repeat.REPEATED in evidence) == repeated
    assert out["status"] == _expected(first, baseline, second, beside, counters, allow), out["why"]
    if first.startswith("nothing"):
        assert out["status"] not in ("pass", "warn")
    if counters == "fail":
        assert out["status"] == "fail" and "hardware errors during this layer" in out["why"]
        assert "RB-HW-AER-UNCORRECTABLE" in out.get("codes", [out["code"]])
    if out["status"] != "pass":
        assert out["code"]  # whatever the composition, a verdict that is not a pass names its code
    if beside == "engine" and not first.startswith("nothing"):
        assert "measured beside sglang (pid 4242, not stopped)" in out["why"]
