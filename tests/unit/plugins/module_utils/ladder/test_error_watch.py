"""ladder/error_watch.sequence: the one error-counter sequence (load the "before" -> delta -> judge -> store) the
climb runs after each runtime layer and the health timer once per run."""

from __future__ import annotations

import json

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import error_counters as collect
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, error_watch

GPU = "0000:03:00.0"


def _reading(aer):
    return {"aer": {GPU: aer}, "devices": {}, "log": {}, "log_source": "test"}


def test_loads_the_stored_before_judges_the_rise_and_stores_now(tmp_path):
    state = str(tmp_path / "error-counters.json")
    collect.store_state(state, _reading({"correctable": 1}))
    ctx = climb.Context(str(tmp_path), {"tolerance": {error_watch.THRESHOLD_KEY: 2}})
    out = error_watch.sequence(ctx, _reading({"correctable": 4}), state, store=True)
    assert out["before"]["aer"] == {GPU: {"correctable": 1}} and out["delta"]["aer"] == {GPU: {"correctable": 3}}
    assert out["judged"]["status"] == "warn" and out["load_error"] is None and out["store_error"] is None
    assert json.loads((tmp_path / "error-counters.json").read_text())["aer"] == {GPU: {"correctable": 4}}
    # at the threshold: accepted
    assert error_watch.sequence(ctx, _reading({"correctable": 6}), state)["judged"]["status"] == "pass"


def test_a_given_before_is_not_loaded_and_nothing_is_stored_unless_asked(tmp_path):
    state = tmp_path / "error-counters.json"
    state.write_text("{not json")
    ctx = climb.Context(str(tmp_path))
    out = error_watch.sequence(ctx, _reading({"nonfatal": 1}), str(state), before=_reading({"nonfatal": 0}), load=False)
    assert out["judged"]["status"] == "fail" and not out["delta"]["since_boot"] and out["load_error"] is None
    assert state.read_text() == "{not json"
    out = error_watch.sequence(ctx, _reading({"nonfatal": 1}), str(state))
    assert out["before"] is None and out["delta"]["since_boot"] and "not valid JSON" in out["load_error"]
    assert out["judged"]["status"] == "fail"  # since boot: the fail class still counts
