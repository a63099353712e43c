"""A second identical box, on the lab (marker: lab): three hosts, two of them 3080 twins, one of the twins started
bare and bootstrapped, both twins converged by one site.yml run in parallel, their manifests diffed, and the twin
with no baseline of its own held to the first box's group baseline; then `provision report` of that history in
headless Chromium.

The issue's measured failure is the starting point: twins share the lab's apt archive cache (as two boxes behind one
apt proxy share a mirror), so the second twin's kernel install met "Could not get lock /var/cache/apt/archives/lock"
while the first one installed. Here the first twin also has its dpkg lock held at the start (as unattended-upgrades
holds it for minutes after a fresh boot): rigbook's package runs wait for both.

The test keeps its own state directory (RIGBOOK_STATE_DIR under tmp_path): no baseline or run of the session's lab
leaks into the twins' judgement. It runs after every test of the session's lab (which it takes down) and takes its
own lab down at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest
from helpers import LAB_MARKS, REPO, LabHost, browse, chromium, leftovers, page_dom, provision

pytestmark = LAB_MARKS
ARTIFACTS = REPO / "tests" / "artifacts-out"
FIRST, TWIN, GROUP = "lab-3080", "lab-3080-2", "x99_3080"
HOLD_S = 45
HOLDER = ("import fcntl, time; f = open('/var/lib/dpkg/lock-frontend', 'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
          "open('/run/rigbook-test-hold', 'w').write('held'); "
          f"time.sleep({HOLD_S}); "
          "open('/var/tmp/rigbook-test-released', 'w').write(time.strftime('%Y-%m-%d %H:%M:%S'))")


@pytest.fixture
def twins_lab(no_lab, lab_artifacts, tmp_path, monkeypatch):
    """Three lab hosts (x99-3080, x99-r9700, x99-3080) in a state directory of the test's own, the second 3080
    started bare; yields the generated inventory's path. Runs after every test of the session's lab (`no_lab` takes
    that one down) and takes its own lab down at the end."""
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    up = provision("lab", "up", "--hosts", "3", "--rig", "x99-3080", "x99-r9700", "x99-3080", "--bare", TWIN,
                   timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield str(tmp_path / "state/lab/inventory")
    finally:
        down = provision("lab", "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert leftovers() == []


def bootstrap(inventory: str, *args) -> object:
    password = (LabHost(TWIN).host.dir / "admin-password").read_text().strip()
    return provision("bootstrap", TWIN, "-i", inventory, "--user", "admin", *args,
                     env={**os.environ, "RIGBOOK_BOOTSTRAP_PASSWORD": password}, timeout=300)


def test_two_twins_converge_in_parallel_diff_clean_and_the_twin_is_held_to_the_group_baseline(twins_lab):
    inventory = twins_lab
    first, twin = LabHost(FIRST), LabHost(TWIN)

    # the bare twin: refused while its host key is unknown, then bootstrapped with the key accepted explicitly
    refused = bootstrap(inventory)
    assert refused.returncode != 0 and "SHA256:" in refused.stderr, refused.stdout + refused.stderr
    done = bootstrap(inventory, "--accept-new-host-key")
    assert done.returncode == 0, done.stdout + done.stderr

    # unattended-upgrades on the first twin: its dpkg lock held when the run starts
    first.run(f"setsid nohup /usr/bin/python3 -c {shlex.quote(HOLDER)} >/dev/null 2>&1 &")
    deadline = time.monotonic() + 30
    while first.run("test -e /run/rigbook-test-hold", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the lock holder did not start"
        time.sleep(0.3)

    started = time.monotonic()
    site = provision("site.yml", "-i", inventory, "--limit", GROUP, "--json", timeout=1800)
    elapsed = time.monotonic() - started
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    summary = json.loads(site.stdout)["hosts"]
    assert {summary[h]["failed"] for h in (FIRST, TWIN)} == {0}, summary
    # both converged by the one run: each got the pinned kernel and its one reboot
    assert first.boots() == 2 and twin.boots() == 2
    # the first twin's kernel install waited for the held lock instead of failing
    released = first.out("cat /var/tmp/rigbook-test-released").strip()
    installs = re.findall(r"^(\S+ \S+) install linux-image-", first.out("cat /var/log/dpkg.log"), re.M)
    assert installs and min(installs) >= released, (released, installs)
    print(f"site.yml converged both twins in {elapsed:.0f} s")

    manifest = provision("manifest", "-i", inventory, "--limit", GROUP, timeout=600)
    assert manifest.returncode == 0, manifest.stdout[-2000:] + manifest.stderr[-2000:]
    diff = provision("diff", FIRST, TWIN, "--json")
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
    result = json.loads(diff.stdout)
    assert result["pinned"] == {}, result["pinned"]
    unique = {row["item"] for row in result["unique"]}
    assert {"host.hostname", "host.machine_id", "bind.etc/systemd/system/rigbook-serve-standin.service"} <= unique
    assert result["same"] > 20

    # the first box's figures as the group's baseline; the twin has none of its own
    record = provision("baseline", "record", "-i", inventory, "--limit", FIRST, "--group", timeout=600)
    assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-2000:]
    healthy = provision("verify", "-i", inventory, "--limit", TWIN, "--json", timeout=600)
    assert healthy.returncode == 0, healthy.stdout[-2000:] + healthy.stderr[-2000:]
    assert json.loads(healthy.stdout)["hosts"][TWIN]["baseline_source"] == f"group {GROUP}"

    # the 3080 box has no P2P: its held figures are the host-staged copies (its recorded tree has no collectives
    # figures for busbw-half to halve), so the twin's bandwidth is halved where it is measured
    broke = provision("lab", "break", TWIN, "p2p-bandwidth-half")
    assert broke.returncode == 0, broke.stdout + broke.stderr
    halved = provision("verify", "-i", inventory, "--limit", TWIN, "--json", timeout=600)
    assert halved.returncode == 1, halved.stdout[-2000:] + halved.stderr[-2000:]
    host = json.loads(halved.stdout)["hosts"][TWIN]
    assert host["baseline_source"] == f"group {GROUP}", host
    failed = [v for v in host["ladder"] if v["status"] == "fail"]
    assert [v["layer"] for v in failed] == ["p2p_bandwidth"], host["ladder"]
    assert "baseline" in failed[0]["why"], failed[0]
    report_of_the_lab_history(inventory, Path(json.loads(halved.stdout)["run_dir"]).name,
                              [v["layer"] for v in host["ladder"]])


def report_of_the_lab_history(inventory: str, halved_run: str, layers: list) -> None:
    """`provision report` of this lab history (a group baseline, a healthy and a halved verify of the twin) in
    headless Chromium with the network off: every host and layer, every recorded figure drawn, the halved run
    below the fail band; the screenshot kept (and made the README's picture with RIGBOOK_UPDATE_SCREENSHOT=1)."""
    from rigbook.paths import state_dir

    out = state_dir() / "report.html"
    made = provision("report", "-i", inventory, "-o", str(out))
    assert made.returncode == 0, made.stdout + made.stderr
    assert "http://" not in out.read_text() and "https://" not in out.read_text()
    binary = chromium()
    profile = state_dir() / "chromium"
    profile.mkdir()
    find = page_dom(out, profile)

    for name in (FIRST, TWIN, "lab-r9700"):
        assert find("section", class_="host", data_host=name), name
    points = 0
    for name in (FIRST, TWIN):
        history = json.loads((state_dir() / "baselines" / f"{name}.json").read_text())["history"]
        for entry in history:
            for metric, value in entry["metrics"].items():
                if isinstance(value, (int, float)):
                    (point,) = find("circle", data_host=name, data_metric=metric,
                                    data_run=Path(entry["run_dir"]).name)
                    assert float(point["data-value"]) == value
                    points += 1
    assert points == len(find("circle")) and points >= 6, points  # every recorded figure, and nothing else
    assert [e["data-layer"] for e in find("tr", data_host=TWIN) if "data-layer" in e] == layers
    halved_points = [e for e in find("circle", data_host=TWIN, data_run=halved_run) if e["data-status"] == "fail"]
    assert halved_points, "the halved run drew no failing point"
    for point in halved_points:
        (band,) = find("rect", data_band="fail", data_host=TWIN, data_metric=point["data-metric"])
        top, bottom = float(band["y"]), float(band["y"]) + float(band["height"])
        assert top < float(point["cy"]) <= bottom, (point, band)  # drawn below the fail line

    shot = state_dir() / "report.png"
    taken = browse(binary, out, profile, f"--screenshot={shot}", "--window-size=1280,2400")
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report-lab.png")
    if os.environ.get("RIGBOOK_UPDATE_SCREENSHOT"):
        shutil.copy(shot, REPO / "docs" / "report.png")
