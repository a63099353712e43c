"""Hardware error counters around the runtime layers: the kernel-log parser (real fixtures), the sysfs collector
on recorded trees, delta, the judge, and the climb wiring with a fake sequence of readings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import error_counters as collect
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import error_counters as judges
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict as verdicts
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import kernel_log

from rigbook import parse_cmd
from rigbook.lab import faults, hardware_trees

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "parse" / "kernel-log"
GPU0, PORT0, GPU1, PORT1 = "0000:03:00.0", "0000:00:02.0", "0000:04:00.0", "0000:00:03.0"
R9700_GPU1 = "0000:06:00.0"  # behind its card's own PCIe switch (04:00.0 up, 05:00.0 down) below root port 00:03.0


def _log(name):
    return (FIXTURES / f"{name}.txt").read_text(encoding="utf-8")


# --- parser on real lines -------------------------------------------------------------------------------------

def test_xid_lines_and_numbers():
    parsed = kernel_log.parse(_log("xid_gpud_pr46"))
    assert parsed["xid"]["count"] == 4 and parsed["xid"]["numbers"] == {"13": 3, "109": 1}
    assert parsed["lines_read"] == 5 and parsed["iommu_fault"]["count"] == 0  # the peermem line is no Xid
    assert kernel_log.parse(_log("xid79_nvsentinel_155"))["xid"]["numbers"] == {"79": 1}


def test_iommu_fault_lines_intel_and_amd():
    dmar = kernel_log.parse(_log("dmar_tt_umd_1814"))["iommu_fault"]
    assert dmar["count"] == 1 and "fault addr 0x100000" in dmar["lines"][0]  # not the "handling fault status" line
    amd = kernel_log.parse(_log("amdvi_dasharo_1134"))["iommu_fault"]
    assert amd["count"] == 3 and amd["lines"][-1].endswith("flags=0x0070]")


def test_amdgpu_ring_timeout_and_reset():
    reset = kernel_log.parse(_log("amdgpu_reset_rocm_6273"))["amdgpu_reset"]
    assert reset["count"] == 2
    assert "ring gfx_0.0.0 timeout" in reset["lines"][0] and "GPU reset begin!" in reset["lines"][1]


def test_aer_lines():
    parsed = kernel_log.parse(_log("aer_nonfatal_ms02_10"))
    assert parsed["aer_nonfatal"]["count"] == 1 and parsed["aer_corrected"]["count"] == 1
    assert parsed["aer_fatal"]["count"] == 0


def test_kept_lines_are_bounded():
    text = "\n".join(f"NVRM: Xid (PCI:0000:03:00): 13, line {i}" for i in range(50))
    xid = kernel_log.parse(text, keep=5)["xid"]
    assert xid["count"] == 50 and len(xid["lines"]) == 5 and xid["lines"][-1].endswith("line 49")


def test_parse_cmd_kernel_log(capsys):
    assert parse_cmd.main("kernel-log", str(FIXTURES / "dmar_tt_umd_1814.txt")) == 0
    assert json.loads(capsys.readouterr().out)["iommu_fault"]["count"] == 1


# --- collector on recorded trees ------------------------------------------------------------------------------

def _tree(tmp_path, rig, fault=None):
    tree = hardware_trees.materialize(rig, tmp_path / f"{rig}-{fault or 'healthy'}")
    if fault:
        faults.apply(faults.plan(fault, tree, hardware_trees.load_rig(rig)))
    return str(tree)


def test_healthy_tree_reads_zero_counters_and_an_empty_log(tmp_path):
    reading = collect.read_counters(_tree(tmp_path, "x99-r9700"), [GPU0, R9700_GPU1])
    assert sorted(reading["aer"]) == [PORT0, PORT1, GPU0, R9700_GPU1]  # the root ports, past the cards' switches
    assert reading["aer"][GPU0] == {"correctable": 0, "nonfatal": 0, "fatal": 0}  # no rootport_* on an endpoint
    assert reading["aer"][PORT1]["rootport_fatal"] == 0
    assert reading["devices"][PORT1] == "root port 0000:00:03.0 of GPU1"
    assert reading["log"]["lines_read"] == 3 and reading["log"]["xid"]["count"] == 0
    assert reading["log_source"] == "recorded var/lib/rigbook/commands/kernel-log.txt"


def test_missing_files_are_unknown_never_zero(tmp_path):
    tree = Path(_tree(tmp_path, "x99-3080"))
    (tree / "var/lib/rigbook/commands/kernel-log.txt").unlink()
    (tree / "sys/bus/pci/devices" / GPU0 / "aer_dev_fatal").unlink()
    reading = collect.read_counters(str(tree), [GPU0])
    assert reading["log"] is None and reading["aer"][GPU0]["fatal"] is None
    delta = collect.delta(None, reading)
    assert "kernel log: no recording at var/lib/rigbook/commands/kernel-log.txt" in delta["unknown"]
    assert "0000:03:00.0: no fatal counter" in delta["unknown"]
    assert judges.judge(delta)["status"] == "pass"


def test_fault_trees_read_as_their_counters(tmp_path):
    burst = collect.read_counters(_tree(tmp_path, "x99-3080", "aer-correctable-burst"), [GPU0, GPU1])["aer"]
    assert burst[GPU0]["correctable"] == 250 and burst[PORT0]["rootport_correctable"] == 250
    fatal = collect.read_counters(_tree(tmp_path, "x99-r9700", "aer-fatal"), [GPU0, R9700_GPU1])
    assert fatal["aer"][PORT1]["fatal"] == 1 and fatal["log"]["aer_fatal"]["count"] == 1


def test_live_kernel_log_runs_journalctl(monkeypatch):
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return runner.Result(argv, 0, _log("xid79_nvsentinel_155"), "", None, False)

    monkeypatch.setattr(runner, "run", run)
    text, source = collect.kernel_log_text("/")
    assert calls == [collect.KERNEL_LOG_ARGV] and "Xid" in text and source.startswith("journalctl -k -b")

    def missing(argv, **kwargs):
        return runner.Result(argv, None, "", "", "journalctl: No such file or directory", False)

    monkeypatch.setattr(runner, "run", missing)
    assert collect.kernel_log_text("/") == (None, "journalctl: No such file or directory")


# --- delta and state ------------------------------------------------------------------------------------------

def _reading(aer=None, log_text="", source="test"):
    return {"aer": aer or {}, "devices": {}, "log": kernel_log.parse(log_text) if log_text is not None else None,
            "log_source": source}


def test_delta_counts_rises_and_new_lines():
    before = _reading({GPU0: {"correctable": 3, "fatal": 0}}, "NVRM: Xid (PCI:0000:03:00): 13, old\n")
    after = _reading({GPU0: {"correctable": 10, "fatal": 0}},
                  "NVRM: Xid (PCI:0000:03:00): 13, old\nNVRM: Xid (PCI:0000:03:00): 79, new\n")
    delta = collect.delta(before, after)
    assert delta["aer"] == {GPU0: {"correctable": 7}} and not delta["since_boot"]
    assert delta["log"]["xid"] == {"count": 1, "lines": ["NVRM: Xid (PCI:0000:03:00): 79, new"], "numbers": {"79": 1}}


def test_a_counter_that_dropped_was_reset_by_a_reboot():
    delta = collect.delta(_reading({GPU0: {"correctable": 50}}), _reading({GPU0: {"correctable": 4}}))
    assert delta["aer"] == {GPU0: {"correctable": 4}}


def test_state_round_trip_and_garbage(tmp_path):
    path = str(tmp_path / "sub" / "error-counters.json")
    assert collect.load_state(path) == (None, None)
    assert collect.store_state(path, _reading({GPU0: {"fatal": 0}})) is None
    assert collect.load_state(path)[0]["aer"] == {GPU0: {"fatal": 0}}
    Path(path).write_text("{not json")
    state, error = collect.load_state(path)
    assert state is None and "not valid JSON" in error


# --- judge ----------------------------------------------------------------------------------------------------

def _delta(aer=None, log_text=None, since_boot=False):
    after = _reading(aer, log_text or "")
    return collect.delta(None if since_boot else _reading(), after)


def test_correctable_warns_with_a_threshold():
    delta = _delta({PORT0: {"rootport_correctable": 250}})
    judged = judges.judge(delta)
    assert judged["status"] == "warn" and "rootport_correctable +250" in judged["notes"][0]
    assert "reseat" in judged["remedies"][0] and judged["codes"] == ["RB-HW-AER-CORRECTABLE"]
    assert judges.judge(delta, correctable_warn_above=250)["status"] == "pass"
    assert judges.judge(delta, correctable_warn_above=250)["codes"] == []


def test_fatal_aer_fails_quoting_the_log_line():
    judged = judges.judge(_delta({PORT1: {"fatal": 1}}, _log("aer_nonfatal_ms02_10").replace("Non-Fatal", "Fatal")))
    assert judged["status"] == "fail" and "fatal AER +1" in judged["problems"][0]
    assert "Uncorrectable (Fatal) error message received" in judged["problems"][0]
    assert judged["codes"] == ["RB-HW-AER-UNCORRECTABLE"]


@pytest.mark.parametrize("xid,status", [(79, "fail"), (48, "fail"), (119, "fail"), (13, "warn"), (109, "warn")])
def test_xid_classes(xid, status):
    judged = judges.judge(_delta(log_text=f"NVRM: Xid (PCI:0000:03:00): {xid}, pid=1, x\n"))
    assert judged["status"] == status and f"Xid {xid}" in " ".join(judged["problems"] + judged["notes"])
    assert "driver" in judged["remedies"][0]
    assert judged["codes"] == ["RB-HW-XID-CRITICAL" if status == "fail" else "RB-HW-XID-OTHER"]


def test_resets_and_iommu_faults_fail_with_their_remedy():
    reset = judges.judge(_delta(log_text=_log("amdgpu_reset_rocm_6273")))
    assert reset["status"] == "fail" and "GPU reset begin!" in reset["problems"][0]
    assert reset["codes"] == ["RB-HW-AMDGPU-RESET"]
    dmar = judges.judge(_delta(log_text=_log("dmar_tt_umd_1814")))
    assert dmar["status"] == "fail" and "iommu=pt" in dmar["remedies"][0] and "DMA window" in dmar["remedies"][0]
    assert dmar["codes"] == ["RB-HW-IOMMU-FAULT"]


def test_seed_004s_musts_aer_dmar_and_gpu_resets_zero():
    """seed 004 marked its P2P path passed only with "AER error = 0, DMAR error = 0, GPU reset = 0" during the
    tests: each that loses or corrupts data fails; a correctable AER (corrected by a replay) warns (docs/evidence.md
    says why)."""
    assert judges.judge(_delta())["status"] == "pass"
    for delta in (_delta({GPU0: {"nonfatal": 1}}), _delta({PORT0: {"rootport_fatal": 1}}),
                  _delta(log_text=_log("dmar_tt_umd_1814")), _delta(log_text=_log("amdgpu_reset_rocm_6273"))):
        assert judges.judge(delta)["status"] == "fail", delta
    assert judges.judge(_delta({GPU0: {"correctable": 1}}))["status"] == "warn"


def test_since_boot_judges_the_fail_class_only():
    quiet = _delta({GPU0: {"correctable": 900}}, _log("xid_gpud_pr46"), since_boot=True)
    assert judges.judge(quiet)["status"] == "pass"  # correctable and non-critical Xid since boot say nothing
    loud = _delta({GPU0: {"nonfatal": 2}}, _log("xid79_nvsentinel_155"), since_boot=True)
    judged = judges.judge(loud)
    assert judged["status"] == "fail" and len(judged["problems"]) == 2 and judged["since_boot"]
    assert judged["codes"] == ["RB-HW-AER-UNCORRECTABLE", "RB-HW-XID-CRITICAL"]


def test_worsen_keeps_a_worse_status_and_extends_why():
    judged = judges.judge(_delta({GPU0: {"correctable": 5}}))
    passed = verdicts.make("p2p_bandwidth", "pass", {"gbs": 10}, None, "as expected")
    out = judges.worsen(passed, judged, {"aer": {GPU0: {"correctable": 5}}})
    assert out["status"] == "warn" and out["why"].startswith("as expected; hardware errors during this layer")
    assert out["measured"] == {"gbs": 10, "errors": {"aer": {GPU0: {"correctable": 5}}}} and "reseat" in out["remedy"]
    failed = verdicts.make("p2p_bandwidth", "fail", "x", None, "slow", "fix it")
    out = judges.worsen(failed, judged, {})
    assert out["status"] == "fail" and out["measured"] == {"layer": "x", "errors": {}}
    assert out["remedy"].startswith("fix it ")
    assert judges.worsen(passed, judges.judge(_delta()), {}) is passed


def test_worsen_puts_the_counters_code_first_when_it_raises_the_status_and_keeps_the_layers_own():
    warned = verdicts.make("p2p_bandwidth", "warn", None, None, "x", code="RB-P2P-LINK-SHARE-LOW")
    loud = judges.judge(_delta({GPU0: {"nonfatal": 1, "correctable": 3}}))
    assert loud["codes"] == ["RB-HW-AER-UNCORRECTABLE", "RB-HW-AER-CORRECTABLE"]  # the fail class first
    out = judges.worsen(warned, loud, {})
    assert out["status"] == "fail" and out["code"] == "RB-HW-AER-UNCORRECTABLE"
    assert out["codes"] == ["RB-HW-AER-UNCORRECTABLE", "RB-HW-AER-CORRECTABLE", "RB-P2P-LINK-SHARE-LOW"]
    # not raised: the layer's own code stays first, the counters' follow
    failed = verdicts.make("p2p_bandwidth", "fail", None, None, "x", code="RB-P2P-NO-REAL-P2P")
    out = judges.worsen(failed, loud, {})
    assert out["code"] == "RB-P2P-NO-REAL-P2P"
    assert out["codes"] == ["RB-P2P-NO-REAL-P2P", "RB-HW-AER-UNCORRECTABLE", "RB-HW-AER-CORRECTABLE"]
    # a pass raised to a warn carries the counters' code alone
    passed = verdicts.make("p2p_bandwidth", "pass", None, None, "as expected")
    out = judges.worsen(passed, judges.judge(_delta({GPU0: {"correctable": 5}})), {})
    assert out["code"] == "RB-HW-AER-CORRECTABLE" and "codes" not in out


# --- climb wiring ---------------------------------------------------------------------------------------------

class FakeReadings:
    """Readings handed out in order (the last one repeats)."""

    def __init__(self, *readings):
        self.readings = list(readings)
        self.taken = 0

    def __call__(self, ctx, evidence):
        self.taken += 1
        return self.readings[min(self.taken, len(self.readings)) - 1]


def _runtime_ctx(root, **options):
    probe = {"available": True, "api": "cuda", "devices": [{}, {}]}
    return climb.Context(root, {"gpu": {"count": 2}, "p2p": {"expected": False, "reason": "test"}},
                         options=dict(probe_result=probe, **options))


def _judge_as(status):
    return lambda evidence, ctx: verdicts.make("x", status, {"n": 1}, None, "judged")


@pytest.fixture
def fake_layers(monkeypatch):
    """The four runtime layers with judges that pass and collectors that collect nothing."""
    for name in ("probe", "collectives", "nccl_transport"):
        monkeypatch.setitem(registry.PARTS, name, lambda ctx, evidence, name=name: {name: {}})
    for layer in registry.of_phase(registry.RUNTIME):
        monkeypatch.setattr(layer, "judge", _judge_as("pass"))


def test_live_the_layer_during_which_a_counter_rose_gets_the_fail(monkeypatch, fake_layers):
    clean = _reading({GPU0: {"fatal": 0}})
    risen = _reading({GPU0: {"fatal": 1}}, "pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: x\n")
    # before, after peer_access, after p2p_bandwidth, after collectives
    fake = FakeReadings(clean, clean, clean, risen)
    monkeypatch.setattr(registry, "ERROR_COUNTERS", fake)
    out, _ = climb.climb(registry.of_phase(registry.RUNTIME), _runtime_ctx("/"))
    assert [v["status"] for v in out] == ["pass", "pass", "fail"]  # stopped at collectives
    assert fake.taken == 4 and "fatal AER +1" in out[2]["why"] and "AER: Uncorrected (Fatal)" in out[2]["why"]
    assert out[2]["measured"]["errors"]["before"] == "the reading after the layer below"


def test_a_static_climb_and_a_saved_evidence_replay_take_no_reading(monkeypatch, fake_layers):
    fake = FakeReadings(_reading())
    monkeypatch.setattr(registry, "ERROR_COUNTERS", fake)
    climb.climb(["pcie_link"], _runtime_ctx("/nonexistent"))
    climb.climb(registry.of_phase(registry.RUNTIME), _runtime_ctx("/"), evidence={"root": "/"})
    assert fake.taken == 0


def test_recorded_tree_judges_against_the_stored_reading_and_stores(tmp_path, monkeypatch, fake_layers):
    state = tmp_path / "error-counters.json"
    collect.store_state(str(state), _reading({GPU0: {"correctable": 0}}))
    monkeypatch.setattr(registry, "ERROR_COUNTERS", FakeReadings(_reading({GPU0: {"correctable": 9}})))
    out, _ = climb.climb(registry.of_phase(registry.RUNTIME), _runtime_ctx(str(tmp_path), error_state=str(state)))
    assert [v["status"] for v in out] == ["warn", "pass", "pass", "pass"]  # seen at the first runtime layer
    assert json.loads(state.read_text())["aer"] == {GPU0: {"correctable": 9}}


def test_check_mode_and_no_state_option_write_nothing(tmp_path, monkeypatch, fake_layers):
    state = tmp_path / "error-counters.json"
    monkeypatch.setattr(registry, "ERROR_COUNTERS", FakeReadings(_reading({GPU0: {"correctable": 9}})))
    ctx = _runtime_ctx(str(tmp_path), error_state=str(state), check_mode=True)
    out, _ = climb.climb(registry.of_phase(registry.RUNTIME), ctx)
    assert not state.exists() and [v["status"] for v in out] == ["pass"] * 4  # first run: correctable not judged
    assert out[0]["status"] == "pass" and "errors" not in out[0]["measured"]
