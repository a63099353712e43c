"""The health timer on the converged lab (marker: lab): rigbook-health.timer on each lab host runs the static
layers, the error counters and the serving layer without requests every rigbook_health.interval_s (20 s in the lab,
inventory/lab/group_vars/lab.yml) and writes node_exporter textfile metrics; a lab fault shows in them within one
interval and clears after heal. Real systemd timer, real files; the GPUs are the lab's recorded trees. Only
127.0.0.0/8 is contacted."""

from __future__ import annotations

import re
import time

import pytest
from helpers.cli import provision
from helpers.lab_host import LAB_MARKS, LabHost

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("converged_lab")]
HOST = "lab-r9700"
PROM = "/var/lib/prometheus/node-exporter/rigbook.prom"
INTERVAL_S = 20


def _metrics(box):
    text = box.out(f"cat {PROM}")
    return {name: float(value) for name, value in re.findall(r"^(rigbook_\S+) (\S+)$", text, re.M)}


def _wait_for(box, predicate, what, limit_s=2 * INTERVAL_S + 15):
    """The metrics once PREDICATE holds of them, waiting at most LIMIT_S (a run ends within one interval)."""
    deadline = time.monotonic() + limit_s
    while True:
        metrics = _metrics(box)
        if predicate(metrics):
            return metrics
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s: {metrics}"
        time.sleep(2)


def test_the_timer_shows_a_fault_within_an_interval_and_clears_after_heal():
    box = LabHost(HOST)
    assert box.out("systemctl is-active rigbook-health.timer").strip() == "active"
    assert box.out("systemctl is-enabled rigbook-health.timer").strip() == "enabled"
    link = 'rigbook_layer_status{layer="pcie_link"}'
    healthy = _wait_for(box, lambda m: m.get(link) == 0, "a healthy run")
    assert healthy['rigbook_layer_status{layer="serving"}'] == 0  # the engine: up, ready, on its transport
    assert healthy["rigbook_error_counters_status"] == 0
    broke = provision("lab", "break", HOST, "link-x8")
    assert broke.returncode == 0, broke.stderr
    try:
        since = time.time()
        failed = _wait_for(box, lambda m: m.get(link) == 2, "link-x8 in the metrics")
        assert failed["rigbook_health_last_run_timestamp_seconds"] >= since - 1
        assert "pcie_link: fail: " in box.out("journalctl -u rigbook-health.service --no-pager -o cat -n 40")
    finally:
        healed = provision("lab", "heal", HOST)
        assert healed.returncode == 0, healed.stderr
    _wait_for(box, lambda m: m.get(link) == 0, "the heal in the metrics")
