"""`provision verify --replay`: the real H200 capture and probe judged with no host contacted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile


def _snapshot_dir(fixtures, tmp_path, ladder_view, name="ladder_view.json"):
    host = tmp_path / "snap" / "h200"
    shutil.copytree(fixtures / "evidence" / "h200-vm", host / "tree", symlinks=True)
    commands = host / "tree" / "var" / "lib" / "rigbook" / "commands"
    shutil.copy(fixtures / "probe" / "h200-cuda-probe.json", commands / "cuda-probe.json")
    (host / name).write_text(json.dumps(ladder_view))
    return tmp_path / "snap"


def replay(path):
    return subprocess.run([sys.executable, "-m", "rigbook", "verify", "--replay", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)


def test_replay_of_the_real_h200(fixtures, tmp_path):
    ladder_view = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141, "pcie": {"gen": 5, "width": 16}},
                   "pins": {"nvidia_driver": {"version": "580.159.04"}}}
    snap = _snapshot_dir(fixtures, tmp_path, ladder_view)
    archive = tmp_path / "snap.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(snap / "h200", arcname="h200")
    for source in (snap, archive):
        proc = replay(source)
        assert proc.returncode == 0, proc.stderr
        ladder = {v["layer"]: v["status"] for v in json.loads(proc.stdout)["hosts"]["h200"]["ladder"]}
        # firmware: the VM has no EFI, and its hypervisor boots it (the recorded nvidia-smi -q: Pass-Through), no CSM
        assert ladder == {"firmware": "pass", "pcie_link": "pass", "dma_window": "skip", "kernel_state": "pass",
                          "driver_state": "pass", "peer_access": "skip", "p2p_bandwidth": "skip",
                          "collectives": "skip", "nccl_transport": "skip"}  # no serve profile: no serving layer


def test_replay_fails_on_a_regression(fixtures, tmp_path):
    ladder_view = {"gpu": {"vendor": "nvidia", "count": 1, "pcie": {"gen": 5, "width": 16}},
                   "pins": {"nvidia_driver": {"version": "615.71.09"}}}
    # a snapshot taken before the rename holds the ladder view as profile.json: still read
    proc = replay(_snapshot_dir(fixtures, tmp_path, ladder_view, name="profile.json"))
    assert proc.returncode == 1
    driver = [v for v in json.loads(proc.stdout)["hosts"]["h200"]["ladder"] if v["layer"] == "driver_state"][0]
    assert driver["status"] == "fail" and "pinned 615.71.09" in driver["why"]


def test_replay_bad_input(tmp_path):
    proc = replay(tmp_path / "missing.tar.gz")
    assert proc.returncode == 2 and "no such file" in proc.stderr
    (tmp_path / "junk.tar.gz").write_text("not a tarball")
    proc = replay(tmp_path / "junk.tar.gz")
    assert proc.returncode == 2 and "not a snapshot tarball" in proc.stderr


def test_replay_of_the_real_snapshot_taken_by_provision_snapshot(fixtures):
    """Taken with `provision snapshot` on the H200 host (tests/fixtures/device/README.md)."""
    proc = replay(fixtures / "device" / "h200-snapshot.tar.gz")
    assert proc.returncode == 0, proc.stderr
    ladder = {v["layer"]: v for v in json.loads(proc.stdout)["hosts"]["h200"]["ladder"]}
    assert ladder["driver_state"]["status"] == "pass"
    assert ladder["driver_state"]["measured"]["userspace"] == "580.159.04"
    assert ladder["p2p_bandwidth"]["status"] == "skip"
    assert "H2D 55.27 GB/s" in ladder["p2p_bandwidth"]["why"]  # the live probe's figure, recorded
    assert ladder["collectives"]["status"] == "skip"  # one GPU


def test_device_run_figures(fixtures):
    runs = [json.loads((fixtures / "device" / f"verify-{n}.json").read_text()) for n in (1, 2)]
    for run in runs:
        assert run["exit_code"] == 0
        statuses = {v["layer"]: v["status"] for v in run["hosts"]["h200"]["ladder"]}
        assert statuses["pcie_link"] == statuses["driver_state"] == "pass"
    second = {v["layer"]: v for v in runs[1]["hosts"]["h200"]["ladder"]}
    assert "vs baseline" in second["p2p_bandwidth"]["why"]


def test_live_static_ladder_on_the_h200_matches_the_replay_of_its_snapshot(fixtures):
    """The one-call static ladder ran live on the H200 (static-ladder-verify.json); replaying the snapshot
    taken there with `provision snapshot` gives the same verdicts for the same five layers, but for the one rule
    changed since (JUDGED_SINCE): the live run called the VM's missing EFI "CSM is on" (a warn); judged now, its
    hypervisor boots it, no CSM (real-gpu-run.md defect 6)."""
    live = json.loads((fixtures / "device" / "static-ladder-verify.json").read_text())["hosts"]["h200"]
    assert [f["task"] for f in live.get("failures", [])] == []
    live_ladder = {v["layer"]: (v["status"], v["measured"]) for v in live["ladder"]}
    assert list(live_ladder) == ["firmware", "pcie_link", "dma_window", "kernel_state", "driver_state"]
    proc = replay(fixtures / "device" / "h200-snapshot.tar.gz")
    replayed = {v["layer"]: (v["status"], v["measured"]) for v in json.loads(proc.stdout)["hosts"]["h200"]["ladder"]}
    judged_since = {"firmware": ("warn", "pass")}
    for layer, (status, measured) in live_ladder.items():
        got_status, got = replayed[layer]
        assert (status, got_status) == judged_since.get(layer, (status, status)), layer
        if layer in judged_since:
            # measured since: whether the box is a virtual machine, and what said so
            assert got.pop("virtual_machine").endswith("Virtualization Mode Pass-Through")
        if not isinstance(measured, dict):
            assert got == measured, layer
            continue
        assert {key: got.get(key) for key in measured} == measured, layer
        # what a judge measures since the snapshot was taken (driver_state's srcversion) is unknown in it, not made up
        assert all(got[key] is None for key in set(got) - set(measured)), layer


def test_device_run_of_the_two_task_ladder(fixtures):
    """The role's two ladder tasks on the H200 (two-task-ladder.sh): the runtime task probed the GPU and ran the
    bundled benchmark live; with one GPU the pair layers skip and say what they measured."""
    for n in (1, 2):
        run = json.loads((fixtures / "device" / f"two-task-verify-{n}.json").read_text())
        assert run["exit_code"] == 0
        ladder = {v["layer"]: v for v in run["hosts"]["h200"]["ladder"]}
        assert list(ladder) == ["firmware", "pcie_link", "dma_window", "kernel_state", "driver_state",
                                "peer_access", "p2p_bandwidth", "collectives", "nccl_transport"]
        assert {layer: ladder[layer]["status"] for layer in ("peer_access", "p2p_bandwidth", "collectives")} == \
            dict.fromkeys(("peer_access", "p2p_bandwidth", "collectives"), "skip")
        assert "host copies H2D" in ladder["p2p_bandwidth"]["why"]
        assert "#wrong 0" in ladder["collectives"]["why"]
