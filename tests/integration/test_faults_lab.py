"""Runs that survive faults, on the session's lab with lab-r9700 converged (marker: lab): the SSH connection lost in
the middle of a long build, Ctrl-C in the middle of it, and a reboot that never comes back. Each run ends with the
host and the step named; nothing half-built stays (the build a cut-short run left running on the host is waited for,
not raced), and the same command run again converges.

The faults are real on the lab host: its sshd is stopped (every session with it), and the reboot comes up without
sshd (the unit masked). The tests reach the host without SSH (nsenter into the container) to bring sshd back, as a
user would at the box's console.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest
from helpers.cli import provision_argv
from helpers.lab_host import LAB_MARKS, LabHost

from rigbook.lab import machine
from rigbook.paths import state_dir

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("r9700_converged")]
LAB = LabHost("lab-r9700")
BUILD_STAMP = "/opt/rigbook/rccl/current/.rigbook-build.json"
BUILD_TASK = "Wait for the group's build"  # roles/group_build
REBOOT_TASK = "Reboot once into the new kernel, driver and boot target"


@pytest.fixture(scope="module")
def r9700_converged(lab, lab_artifacts):
    """lab-r9700 converged by site.yml, the RCCL build included (a re-run where the AMD role tests converged it
    already): every fault here is on that host alone."""
    proc, summary, _changed, _ = LAB.site()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return summary


def sshd_back() -> None:
    """At the host's console: sshd unmasked and started, then wait until it answers."""
    proc = LAB.console("systemctl unmask ssh.service >/dev/null 2>&1; systemctl start ssh.service")
    assert proc.returncode == 0, proc.stderr
    machine.wait_ready([LAB.host], timeout=120)


def converged_again() -> dict:
    proc, summary, changed, _ = LAB.site()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the runtime layers of a box whose engine serves are measured only when the stack under it changed in the run
    # (site.yml's ladder); the same RCCL rebuilt, or nothing rebuilt, is no change: each is a skip that says so
    for verdict in summary["ladder"]:
        assert verdict["status"] in ("pass", "warn") or (
            verdict["status"] == "skip" and "nothing under it changed in this run" in verdict["why"]), verdict
    return summary


def cut_short(action) -> tuple:
    """A site.yml run that must rebuild RCCL (its build stamp removed), cut short by ACTION(process) two seconds
    into the wait for the build; (exit code, the JSON summary's host entry or None, stdout + stderr)."""
    LAB.run(f"rm {BUILD_STAMP}")  # the build is no longer known good: site.yml rebuilds it (a long async task)
    shutil.rmtree(state_dir() / "builds", ignore_errors=True)  # and none left on the controller to install
    run = subprocess.Popen(provision_argv("site.yml", "-i", "lab", "--limit", LAB.name, "--json"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in run.stderr:
            seen.append(line)
            if BUILD_TASK in line:
                break
        assert any(BUILD_TASK in line for line in seen), "".join(seen[-40:])
        time.sleep(2)
        action(run)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    summary = json.loads(out)["hosts"][LAB.name] if out.strip().startswith("{") else None
    return run.returncode, summary, out + "".join(seen) + err


def rebuilt_whole() -> None:
    stamp = json.loads(LAB.out(f"cat {BUILD_STAMP}"))
    assert stamp["files"], stamp  # a whole build: its checked files are stamped
    assert LAB.run("pgrep -f 'cmake --[b]uild'", check=False).returncode == 1  # no build left running


def test_ssh_lost_during_the_rccl_build_is_named_and_a_rerun_finishes_the_build():
    def drop_ssh(_run):
        stopped = LAB.console("systemctl stop ssh.service; pkill -KILL -x sshd; true")
        assert stopped.returncode == 0, stopped.stderr

    code, summary, out = cut_short(drop_ssh)
    assert code == 3, out[-3000:]  # only unreachable hosts
    assert summary["state"] == "unreachable" and summary["failures"][0]["task"] == BUILD_TASK, summary
    assert f"{LAB.name}: UNREACHABLE at task '{BUILD_TASK}'" in out, out[-3000:]
    assert "once it answers SSH again, run the same command" in out, out[-3000:]
    sshd_back()
    converged_again()
    rebuilt_whole()


def test_ctrl_c_during_the_rccl_build_names_the_task_and_a_rerun_finishes_the_build():
    code, summary, out = cut_short(lambda run: run.send_signal(signal.SIGINT))
    assert code == 130, out[-3000:]
    assert summary["state"] == "interrupted" and summary["interrupted_in"] == BUILD_TASK, summary
    assert f"{LAB.name}: INTERRUPTED in task '{BUILD_TASK}': run the same command again" in out, out[-3000:]
    converged_again()
    rebuilt_whole()


def test_a_reboot_that_never_comes_back_is_named_and_a_rerun_converges():
    LAB.run("systemctl mask ssh.service")  # the next boot comes up without sshd
    boots = LAB.boots()
    proc, summary, _changed, _ = LAB.site("-e", "rigbook_reboot_required=true", "-e", "rigbook_reboot_timeout=20",
                                          "--skip-tags", "ladder")
    out = proc.stdout + proc.stderr
    try:
        assert proc.returncode == 1, out[-3000:]
        assert LAB.boots() == boots + 1  # it did reboot; it only never answered
        assert summary["failures"][0]["task"] == REBOOT_TASK, summary
        assert f"{LAB.name}: FAILED at task '{REBOOT_TASK}'" in proc.stderr + proc.stdout, out[-3000:]
        assert "did not come back within rigbook_reboot_timeout" in out, out[-3000:]
    finally:
        sshd_back()
    converged_again()
