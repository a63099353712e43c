"""node_exporter on a lab host serves the health timer's metrics (marker: lab; a one-host lab of its own, lab-r9700,
fresh from `lab up`). Debian's prometheus-node-exporter is in the lab's rootfs and runs on every lab host, listening
on the host's own loopback address only (port 9100: the lab hosts share this machine's network); its textfile
collector reads the folder the rigbook-health timer writes. The test reads the metrics as Prometheus does, over
HTTP, never the file: the series the timer wrote, value for value; the timer's interval; a `link-x8` fault within
one interval, with its code, gone after heal; `promtool check metrics` on the rigbook families as served. Real
systemd timer, real node_exporter; the GPUs are the rig's recorded tree. Only 127.0.0.0/8 is contacted."""

from __future__ import annotations

import json
import re
import subprocess
import time

from helpers import prometheus
from helpers.cli import provision
from helpers.lab_host import LAB_MARKS, LabHost

pytestmark = LAB_MARKS
HOST = "lab-r9700"
PROM = "/var/lib/prometheus/node-exporter/rigbook.prom"
INTERVAL_S = 20  # rigbook_health.interval_s given with -e (the lab's own is 300 s)
LINK = 'rigbook_layer_status{layer="pcie_link"}'


def _served(box, predicate, what, limit_s=2 * INTERVAL_S + 15) -> tuple:
    """(the page node_exporter serves, its rigbook series, their codes) once PREDICATE holds of the series, waiting
    at most LIMIT_S (a run ends within one interval)."""
    deadline = time.monotonic() + limit_s
    while True:
        page = box.scrape()
        values, codes = prometheus.series(page)
        if predicate(values):
            return page, values, codes
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s: {values}"
        time.sleep(2)


def test_node_exporter_serves_what_the_health_timer_writes_over_http(exporter_box):
    box = LabHost(HOST)
    address = box.host.address
    assert box.out("systemctl is-active prometheus-node-exporter").strip() == "active"
    # on the host's own address only: this machine's sockets (the lab shares its network), none on every address
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout.split("\n")
    on_9100 = [line.split()[3] for line in listening if line.split() and line.split()[3].endswith(":9100")]
    assert f"{address}:9100" in on_9100 and not {"0.0.0.0:9100", "*:9100", "[::]:9100"} & set(on_9100), on_9100
    page = box.scrape()
    assert "node_textfile_scrape_error 0" in page and not prometheus.series(page)[0]  # no run yet: no rigbook series

    quick = provision("site.yml", "-i", exporter_box, "--limit", HOST, "--tags", "health", "-e",
                      json.dumps({"rigbook_health": {"interval_s": INTERVAL_S}}), timeout=600)
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    assert box.out("systemctl is-active rigbook-health.timer").strip() == "active"
    page, values, _codes = _served(box, lambda v: v.get(LINK) == 0, "a run with the link whole")
    assert values["rigbook_health_interval_seconds"] == INTERVAL_S
    assert values["rigbook_health_last_run_timestamp_seconds"] > time.time() - 2 * INTERVAL_S - 15
    assert re.search(r'^node_textfile_mtime_seconds\{file="(?:\S*/)?rigbook\.prom"\} ', page, re.M), page[-3000:]
    assert "node_textfile_scrape_error 0" in page
    # what node_exporter serves is the file the timer wrote, series for series (read between two unchanged reads)
    for _ in range(5):
        before = box.out(f"cat {PROM}")
        page = box.scrape()
        if box.out(f"cat {PROM}") == before:
            break
    assert prometheus.series(page) == prometheus.series(before)
    served = prometheus.families(page)
    assert served.count("# TYPE rigbook_") == prometheus.families(before).count("# TYPE rigbook_") >= 5
    checked = prometheus.run("check", "metrics", stdin=served)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked.stdout + checked.stderr

    broke = provision("lab", "break", HOST, "link-x8")
    assert broke.returncode == 0, broke.stderr
    try:
        since = time.time()
        _page, values, codes = _served(box, lambda v: v.get(LINK) == 2, "link-x8 served")
        assert values["rigbook_health_last_run_timestamp_seconds"] >= since - 1
        assert codes[LINK].startswith("RB-PCIE-"), codes  # the finding's code (docs/codes.md)
    finally:
        healed = provision("lab", "heal", HOST)
        assert healed.returncode == 0, healed.stderr
    _served(box, lambda v: v.get(LINK) == 0, "the heal served")
