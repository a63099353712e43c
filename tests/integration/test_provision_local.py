"""Real `provision` runs (ansible-runner, ansible-playbook) against this machine over a local connection.

The GPUs are simulated at the evidence boundary only: a small sysfs tree written by the test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from helpers.cli import provision, provision_argv


def simulated_sysfs(root: Path, gpus: list) -> Path:
    """Write a minimal recorded-sysfs tree: one root port per GPU (SIMULATED for tests)."""
    for index, (vendor, device) in enumerate(gpus):
        port = f"0000:00:0{index + 2}.0"
        slot = f"0000:0{index + 3}:00.0"
        real = root / "sys" / "devices" / "pci0000:00" / port / slot
        real.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", "0x030000")):
            (real / name).write_text(value + "\n")
        links = root / "sys" / "bus" / "pci" / "devices"
        links.mkdir(parents=True, exist_ok=True)
        (links / slot).symlink_to(os.path.relpath(real, links))
    return root


# The host roles of a simulated AMD pair with no pins (their missing pins refuse the run before any host is
# contacted: tested once, below), and of a simulated NVIDIA host.
HOST_ROLES = "kernel,amd_rocm,rccl"
NVIDIA_ROLES = "kernel,nvidia_p2p_driver,cuda_toolchain"


def local_inventory(tmp_path: Path, host_vars: dict) -> Path:
    inv = tmp_path / "inventory"
    inv.mkdir()
    vars_ = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **host_vars}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": vars_}}}))
    return inv


def amd_pair_inventory(tmp_path: Path) -> Path:
    """localhost with a simulated tree of two R9700s (no EFI, no BARs: the ladder stops at firmware)."""
    evidence = simulated_sysfs(tmp_path / "evidence", [("0x1002", "0x7551"), ("0x1002", "0x7551")])
    return local_inventory(
        tmp_path, {"rigbook_evidence_root": str(evidence), "rigbook_gpu": {"vendor": "amd", "count": 2}}
    )


def test_site_json_summary_on_localhost(repo):
    proc = provision("site.yml", "-i", "localhost", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # nothing but the JSON object on stdout
    host = summary["hosts"]["localhost"]
    assert summary["exit_code"] == 0
    assert host["failed"] == 0 and host["unreachable"] == 0 and host["ok"] >= 4
    assert host["state"] == "ok"
    # progress went to stderr, as plain lines (no terminal here)
    assert "PLAY Preflight" in proc.stderr and "TASK List GPUs from sysfs" in proc.stderr
    assert "\x1b[" not in proc.stderr
    record = json.loads((Path(summary["run_dir"]) / "run.json").read_text())
    assert record["exit_code"] == 0
    assert (Path(summary["run_dir"]) / "artifacts").is_dir()


def test_check_mode_and_junit(tmp_path):
    junit = tmp_path / "report.xml"
    proc = provision("site.yml", "-i", "localhost", "--check", "--junit", str(junit))
    assert proc.returncode == 0, proc.stderr
    assert "summary" in proc.stdout and "localhost" in proc.stdout
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "0"
    cases = list(suite.iter("testcase"))
    assert {c.get("classname") for c in cases} == {"localhost"}
    names = [c.get("name") for c in cases]
    assert names[0] == "host"
    layers = [n.removeprefix("layer: ") for n in names[1:]]
    assert layers[:5] == ["firmware", "pcie_link", "dma_window", "kernel_state", "driver_state"]
    assert layers[-2:] == ["collectives", "nccl_transport"]


def test_gpu_count_mismatch_fails_the_host(tmp_path):
    evidence = simulated_sysfs(tmp_path / "evidence", [("0x10de", "0x2216")])
    inv = local_inventory(
        tmp_path, {"rigbook_evidence_root": str(evidence), "rigbook_gpu": {"vendor": "nvidia", "count": 2}}
    )
    junit = tmp_path / "report.xml"
    proc = provision("site.yml", "-i", str(inv), "--json", "--junit", str(junit), "--skip-tags", NVIDIA_ROLES)
    assert proc.returncode == 1, proc.stderr
    host = json.loads(proc.stdout)["hosts"]["localhost"]
    assert host["state"] == "failed" and host["failed"] == 1
    failure = host["failures"][0]
    assert failure["task"] == "List GPUs from sysfs"
    assert "the inventory says 2 nvidia GPU(s), the host has 1" in failure["msg"]
    assert "0000:03:00.0" in failure["msg"]
    names = [c.get("name") for c in ET.parse(junit).getroot().iter("testcase")]
    assert names == ["host", "task: List GPUs from sysfs"]  # the host stopped before the ladder


def test_gpu_count_match_passes_preflight_and_reaches_the_ladder(tmp_path):
    inv = amd_pair_inventory(tmp_path)
    proc = provision("site.yml", "-i", str(inv), "--json")
    # an AMD host with no pins: the run is refused before any host is contacted, naming every missing pin
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    for key, role in (("rigbook_pins.kernel.release", "kernel"), ("rigbook_pins.rocm.version", "amd_rocm"),
                      ("rigbook_pins.rocm.repo", "amd_rocm"), ("rigbook_pins.rccl.source", "rccl")):
        assert f"host localhost: {key}: needed by the {role} role" in proc.stderr, proc.stderr
    proc = provision("site.yml", "-i", str(inv), "--json", "--skip-tags", HOST_ROLES)
    host = json.loads(proc.stdout)["hosts"]["localhost"]
    # preflight passes; the bare simulated tree has no EFI and no BARs, so the ladder stops at firmware
    assert proc.returncode == 1
    assert [f["task"] for f in host["failures"]] == [
        "Ladder 1-5: firmware, PCIe link, DMA window, kernel state, driver state"]
    assert [v["layer"] for v in host["ladder"]] == ["firmware"] and "CSM" in host["ladder"][0]["why"]
    assert host["failures"][0]["msg"].startswith("firmware: fail:")
    # the verdict's failure code passes through the module's result into the summary, and names the task's failure
    code = host["ladder"][0]["code"]
    assert code.startswith("RB-FIRMWARE-") and host["failures"][0]["code"] == code
    proc = provision("site.yml", "-i", str(inv), "--json", "--skip-tags", f"ladder,{HOST_ROLES}")
    assert proc.returncode == 0, proc.stderr


def test_only_unreachable_hosts_exit_3(tmp_path):
    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "inventory"
    inv.mkdir()
    host = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "nobody",
            "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=no"}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gone": host}}}))
    proc = provision("site.yml", "-i", str(inv), "--json")
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["hosts"]["gone"]["state"] == "unreachable"


def test_invalid_inventory_stops_before_any_host(tmp_path):
    inv = local_inventory(tmp_path, {"rigbook_gpu": {"vendor": "nvidia", "cuont": 2}})
    proc = provision("site.yml", "-i", str(inv), "--json")
    assert proc.returncode == 2
    assert "rigbook_gpu.cuont" in proc.stderr and proc.stdout == ""


def test_ctrl_c_stops_ansible_cleanly(tmp_path):
    marker = f"rigbook-test-sleep-{os.getpid()}"
    book = tmp_path / "slow.yml"
    book.write_text(
        "---\n- name: Slow\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - name: Sleep\n      ansible.builtin.command: bash -c 'exec -a {marker} sleep 120'\n"
    )
    proc = subprocess.Popen(
        provision_argv(book, "-i", "localhost"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode:
        time.sleep(0.3)
    assert time.time() < deadline, "the slow task never started"
    # a second run against the same state directory is refused at once, naming the first
    second = provision("site.yml", "-i", "localhost", "--check", timeout=60)
    assert second.returncode == 4, second.stderr
    assert "another provision run is using the state directory" in second.stderr, second.stderr
    assert f"pid {proc.pid}: provision {book} -i localhost" in second.stderr, second.stderr
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "localhost: INTERRUPTED in task 'Sleep': run the same command again" in out, out[-2000:]
    time.sleep(1)
    leftovers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert not leftovers, f"ansible left {leftovers} running"
    # the lock went with the interrupted run
    after = provision("site.yml", "-i", "localhost", "--check", "--tags", "never-matches", timeout=120)
    assert after.returncode == 0, after.stderr[-2000:]


def test_runs_lists_recent_runs():
    provision("site.yml", "-i", "localhost", "--check")
    proc = provision("runs", "-n", "3")
    assert proc.returncode == 0
    assert "site.yml -i" in proc.stdout and "ok" in proc.stdout


def test_facts_are_cached_between_runs_in_the_state_dir(tmp_path):
    """Smart gathering only pays off when the fact cache outlives the run (ansible-runner would move it into
    each run's artifact folder): the second run finds the facts and gathers nothing."""
    inv = amd_pair_inventory(tmp_path)
    state = {"RIGBOOK_STATE_DIR": str(tmp_path / "state")}
    # one small role is enough: facts are gathered at the play's start whatever its tags
    first = provision("site.yml", "-i", str(inv), "--json", "--tags", "bios_checklist", env=state)
    assert first.returncode == 0, first.stderr
    [cache_file] = (tmp_path / "state" / "facts").glob("*localhost")
    assert "ansible_system" in cache_file.read_text()  # the facts gathered by the first run
    second = provision("site.yml", "-i", str(inv), "--json", "--tags", "bios_checklist", env=state)
    assert second.returncode == 0, second.stderr
    run_dir = Path(json.loads(second.stdout)["run_dir"])
    events = [json.loads(p.read_text()) for p in run_dir.glob("artifacts/*/job_events/*.json")]
    gathered = [e for e in events if (e.get("event_data") or {}).get("task_action") == "gather_facts"
                and e.get("event") == "runner_on_ok"]
    assert gathered == []  # smart gathering found the cached facts


def test_an_unknown_layer_is_named_not_a_traceback(tmp_path):
    inv = amd_pair_inventory(tmp_path)
    proc = provision("verify", "-i", str(inv), "--json", "-e", '{"p2p_verify_layers": ["pcie_link", "bogus"]}')
    assert proc.returncode == 1, proc.stderr
    host = json.loads(proc.stdout)["hosts"]["localhost"]
    msg = host["failures"][0]["msg"]
    assert "unknown layer(s) bogus" in msg and "firmware, pcie_link" in msg
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_corrupt_baselines_file_is_kept_aside_and_the_run_stops_before_any_host(tmp_path):
    """As a user meets it: a baselines file cut short (a full disk, an editor); the next verify says so, keeps the
    file aside byte for byte and contacts no host; the run after that goes on without the baseline."""
    inv = amd_pair_inventory(tmp_path)
    state = tmp_path / "state"
    env = {**os.environ, "RIGBOOK_STATE_DIR": str(state)}
    baselines = state / "baselines"
    baselines.mkdir(parents=True)
    broken = '{"host": "localhost", "recorded": {"metrics": {"p2p_gbps": 6.0'
    (baselines / "localhost.json").write_text(broken)
    proc = provision("verify", "-i", str(inv), "--json", env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    kept = sorted(baselines.glob("localhost.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == broken
    assert f"baselines file {baselines / 'localhost.json'} is corrupt" in proc.stderr, proc.stderr
    assert f"kept aside as {kept[0]}" in proc.stderr and "before contacting any host" in proc.stderr, proc.stderr
    assert not (state / "runs").exists() or not any((state / "runs").iterdir())  # no run was started
    again = provision("verify", "-i", str(inv), "--json", "--tags", "pcie_link", env=env, timeout=300)
    assert again.returncode in (0, 1), again.stderr[-2000:]
    assert json.loads(again.stdout)["hosts"]["localhost"]["baseline_source"] == "none"


def test_long_tasks_print_still_in_lines_in_a_pipe_and_quick_ones_none(tmp_path):
    """Not a terminal: every RIGBOOK_PROGRESS_EVERY seconds one line per host still in a task that long, on the
    progress stream (stderr with --json, so stdout stays one JSON object), and none once the summary is out."""
    every = {"RIGBOOK_PROGRESS_EVERY": "1"}
    slow = tmp_path / "slow.yml"
    slow.write_text(
        "---\n- name: Slow\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Sleep three seconds\n      ansible.builtin.command: sleep 3\n"
    )
    proc = provision(slow, "-i", "localhost", "--json", env=every, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["exit_code"] == 0  # nothing but the JSON object on stdout
    lines = proc.stderr.splitlines()
    still = [i for i, line in enumerate(lines) if "still in 'Sleep" in line]
    assert still, proc.stderr[-2000:]
    assert all(re.fullmatch(r"  \.\.\. localhost: still in 'Sleep three seconds' after \ds", lines[i])
               for i in still), proc.stderr[-2000:]
    assert max(still) < lines.index("summary"), proc.stderr[-2000:]  # nothing after the run ended
    quick = tmp_path / "quick.yml"
    quick.write_text(
        "---\n- name: Quick\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        + "".join(f"    - name: Say {n}\n      ansible.builtin.debug:\n        msg: hello {n}\n" for n in range(5))
    )
    proc = provision(quick, "-i", "localhost", env=every, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "  TASK Say 4" in proc.stdout and "summary" in proc.stdout
    assert "still in" not in proc.stdout + proc.stderr


def test_a_real_run_leaves_nothing_under_the_state_directory_others_can_read(tmp_path):
    """ansible-runner's artifacts (its command file holds every -e), the run record, baselines.json, the fact cache
    and Ansible's local temp: after a real run all are the user's alone, and a loose (0755) state directory is
    tightened to 0700."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    proc = provision("verify", "-i", "localhost", "--json", "-e", "rigbook_test_secret=sk-local",
                     env={"RIGBOOK_STATE_DIR": str(state)})
    assert proc.returncode in (0, 1), proc.stderr
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    assert "sk-local" in next(run_dir.glob("artifacts/*/command")).read_text()  # why the folder is private
    assert "sk-local" not in (state / "run.lock").read_text()
    loose = [f"{oct(p.lstat().st_mode & 0o777)} {p}" for p in [state, *state.rglob("*")]
             if not p.is_symlink() and p.lstat().st_mode & 0o077]
    assert loose == []
