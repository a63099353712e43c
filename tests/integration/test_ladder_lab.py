"""The P2P ladder end to end: `provision verify -i lab` over real SSH against the lab's simulated rigs.

The session's lab (tests/integration/conftest.py), converged by site.yml first (fixture `converged_lab`).
Healthy rigs, baseline recording, the 3080 box with P2P flipped to expected, and one fault of each kind of evidence
broken on a host, verified, and healed (heal runs the lab's boot hook again, so the healed tree shows the kernel the
host booted); every fault of src/rigbook/lab/faults.yml is judged in-process by
tests/unit/rigbook/lab/test_lab_ladder.py. Needs root (the lab).
"""

from __future__ import annotations

import json

import pytest
from helpers.cli import provision
from helpers.lab_host import LAB_MARKS

from rigbook.lab import faults

pytestmark = LAB_MARKS
# Over SSH, one fault for each kind of evidence a lab fault edits (and each phase of the climb): the full matrix of
# src/rigbook/lab/faults.yml, every fault on every rig it applies to, runs in-process in
# tests/unit/rigbook/lab/test_lab_ladder.py (the same recorded trees and judges, the same fault edits). These cases
# check what only the lab adds: the fault applied on a running host, read back through SSH by the ladder module, the
# play failed at that layer, the heal.
# Engine faults (serving phase): tests/integration/test_serving_lab.py; faults of what the roles built (the RCCL
# build): tests/integration/test_rccl_lab.py.
SSH_CASES = [
    ("link-x8", "lab-r9700"),                          # static phase, a sysfs edit (link width of GPUs and ports)
    ("driver-userspace-mismatch", "lab-3080"),         # static phase, a recorded command output (nvidia-smi -q)
    ("kernel-upgraded-module-missing", "lab-3080"),    # static phase, a kernel change (osrelease, cmdline)
    ("aer-fatal", "lab-3080"),                         # runtime phase, an error counter (AER totals, kernel log)
    ("p2p-bandwidth-half", "lab-r9700"),               # runtime phase, a probe result (the HIP probe's figures)
    ("busbw-half", "lab-r9700"),                       # runtime phase, a collectives output (rccl-tests figures)
]


def verify(*args):
    proc = provision("verify", "-i", "lab", "--json", *args)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["hosts"]


def test_healthy_lab_passes_and_the_3080_warns_on_bar1(converged_lab):
    code, hosts = verify()
    assert code == 0, hosts
    r9700 = {v["layer"]: v["status"] for v in hosts["lab-r9700"]["ladder"]}
    assert list(r9700) == ["firmware", "pcie_link", "dma_window", "kernel_state", "driver_state", "peer_access",
                           "p2p_bandwidth", "collectives", "nccl_transport", "serving"]
    assert set(r9700.values()) == {"pass"}
    x3080 = hosts["lab-3080"]["ladder"]
    assert x3080[0]["status"] == "warn" and "BAR1 256 MiB" in x3080[0]["why"]
    assert {v["layer"]: v["status"] for v in x3080[1:]}["nccl_transport"] == "pass"


def test_tags_judge_only_the_layers_named(converged_lab):
    code, hosts = verify("--limit", "lab-r9700", "--tags", "pcie_link,peer_access")
    assert code == 0, hosts
    assert [v["layer"] for v in hosts["lab-r9700"]["ladder"]] == ["pcie_link", "peer_access"]


def test_3080_with_p2p_expected_fails_at_firmware_with_the_bios_remedy(converged_lab):
    code, hosts = verify("--limit", "lab-3080", "-e", json.dumps({"rigbook_p2p": {"expected": True}}))
    assert code == 1
    host = hosts["lab-3080"]
    assert host["failures"][0]["task"].startswith("Ladder 1-5: firmware")
    assert [v["layer"] for v in host["ladder"]] == ["firmware"]  # the host stopped at the first rung
    firmware = host["ladder"][0]
    assert firmware["status"] == "fail" and "Above 4G Decoding ON" in firmware["remedy"]
    assert "not possible on this board" in host["failures"][0]["msg"]
    assert "measured" in host["failures"][0]["msg"] and "expected" in host["failures"][0]["msg"]


def test_baseline_record_then_compare(converged_lab):
    proc = provision("baseline", "record", "-i", "lab", "--json")
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["lab-r9700"]["baseline"] == "recorded" and hosts["lab-3080"]["baseline"] == "recorded"
    shown = provision("baseline", "show", "lab-r9700").stdout
    assert "sendrecv_busbw_gbs" in shown and "9.75" in shown and "peer_gbs_0_1" in shown
    code, hosts = verify()
    assert code == 0
    collectives = [v for v in hosts["lab-r9700"]["ladder"] if v["layer"] == "collectives"][0]
    assert "sendrecv_busbw_gbs 9.75 vs baseline 9.75 (1.00x)" in collectives["why"]


@pytest.mark.parametrize("fault,host", SSH_CASES)
def test_fault_fails_the_play_at_its_layer(converged_lab, fault, host):
    layer = faults.get_fault(fault)["layer"]
    broke = provision("lab", "break", host, fault)
    assert broke.returncode == 0, broke.stderr
    try:
        code, hosts = verify("--limit", host)
        if faults.get_fault(fault).get("status") == "warn":  # a warning at its layer, against the last run's counts
            assert code == 0, hosts
            statuses = {v["layer"]: v["status"] for v in hosts[host]["ladder"]}
            assert statuses[layer] == "warn", hosts[host]["ladder"]
            return
        assert code == 1, hosts
        entry = hosts[host]
        assert [v["layer"] for v in entry["ladder"] if v["status"] == "fail"] == [layer]
        assert entry["ladder"][-1]["layer"] == layer  # the host stopped at that rung
        msg = entry["failures"][0]["msg"]
        assert msg.startswith(f"{layer}: fail:") and "measured" in msg and "expected" in msg
    finally:
        healed = provision("lab", "heal", host)
        assert healed.returncode == 0, healed.stderr


def test_a_layer_left_unknown_fails_the_box_that_should_measure_it_unless_allowed(converged_lab):
    """Fault collectives-tool-missing: the nccl-tests the nccl_tests role built lose sendrecv_perf, so the 3080's
    collectives layer has no tool and comes out unknown; the box should measure it (its GPUs are declared), so the
    play fails there, and passes with `--allow-unknown collectives`, the layer shown unknown and allowed."""
    broke = provision("lab", "break", "lab-3080", "collectives-tool-missing")
    assert broke.returncode == 0, broke.stderr
    try:
        code, hosts = verify("--limit", "lab-3080")
        assert code == 1, hosts
        ladder = hosts["lab-3080"]["ladder"]
        assert ladder[-1]["layer"] == "collectives", ladder  # the host stopped at that rung
        assert ladder[-1]["status"] == "fail" and ladder[-1]["why"].startswith("unknown on a box that should measure")
        assert "`--allow-unknown collectives`" in ladder[-1]["remedy"]
        code, hosts = verify("--limit", "lab-3080", "--allow-unknown", "collectives")
        assert code == 0, hosts
        statuses = {v["layer"]: v for v in hosts["lab-3080"]["ladder"]}
        assert statuses["collectives"]["status"] == "unknown", statuses["collectives"]
        assert "(allowed unknown: --allow-unknown)" in statuses["collectives"]["why"]
        assert statuses["nccl_transport"]["status"] == "pass"  # the climb went on past the allowed layer
    finally:
        healed = provision("lab", "heal", "lab-3080")
        assert healed.returncode == 0, healed.stderr
    code, hosts = verify("--limit", "lab-3080")
    assert code == 0, hosts
    assert {v["layer"]: v["status"] for v in hosts["lab-3080"]["ladder"]}["collectives"] == "pass"
