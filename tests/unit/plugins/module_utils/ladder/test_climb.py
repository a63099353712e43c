"""ladder/climb.py: the "expected layer unknown fails" rule against the error-counter modifier of the runtime layers.

Every base status of an expected runtime layer x every modifier of the error counters (none, a correctable AER rise:
warn, an uncorrectable one: fail, counters unreadable) x allow_unknown (none, the host model's, the run's): the
modifier never lowers a status, and an expected layer that came out unknown is never a pass or a warn.
"""

from __future__ import annotations

import itertools

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry

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
    else:
        assert out["status"] == ("fail" if counters == "fail" else "unknown") and out["allowed_unknown"]
    if counters != "pass":
        assert "hardware errors during this layer" in out["why"]
