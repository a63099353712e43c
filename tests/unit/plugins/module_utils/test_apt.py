"""module_utils/apt.py: apt-get and dpkg runs that wait for a held package lock and finish an interrupted dpkg
once, every command through facts/runner.py. The messages are apt's own (Debian 12 / Ubuntu 24.04 wording); the
clock is faked. (What dpkg has installed and what apt could install: facts/test_packages.py.)"""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import apt
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

INSTALL = ["apt-get", "-y", "install", "dkms"]
FRONTEND_HELD = ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 "
                 "(unattended-upgr)\nE: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is "
                 "another process using it?\n")
LISTS_HELD = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 77 (apt-get)\n"
INTERRUPTED = "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem.\n"


@pytest.fixture
def box(monkeypatch):
    """runner.run answering from a script of (argv, rc, stderr) rows in order; the calls and the sleeps of a fake
    clock (each sleep advances it) are recorded."""
    state = {"script": [], "calls": [], "envs": [], "sleeps": [], "now": 1000.0}

    def run(argv, env=None, **_kwargs):
        state["calls"].append(list(argv))
        state["envs"].append(env)
        want, rc, err = state["script"].pop(0)
        assert list(argv) == want
        error = None if rc == 0 else "could not start" if rc is None else f"{argv[0]} exited {rc}"
        return runner.Result(list(argv), rc, "", err, error, False)

    def sleep(seconds):
        state["sleeps"].append(seconds)
        state["now"] += seconds

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(apt, "WAIT", (sleep, lambda: state["now"]))
    return state


def test_lock_held_names_the_lock_and_its_holder():
    assert apt.lock_held(FRONTEND_HELD) == ("/var/lib/dpkg/lock-frontend", "4242 (unattended-upgr)")
    assert apt.lock_held("E: Unable to lock directory /var/cache/apt/archives/\n") == (
        "/var/cache/apt/archives/", None)
    assert apt.lock_held("E: Unable to locate package nosuch\n") is None and apt.lock_held(None) is None


def test_a_held_lock_is_retried_until_it_is_free(box):
    box["script"] = [(INSTALL, 100, FRONTEND_HELD), (INSTALL, 100, LISTS_HELD), (INSTALL, 0, "")]
    assert apt.run_apt(INSTALL) == (0, "", "")
    assert len(box["calls"]) == 3 and box["sleeps"] == [apt.RETRY_EVERY, apt.RETRY_EVERY]
    assert all(env == apt.ENV for env in box["envs"])  # non-interactive, one language


def test_a_lock_held_past_the_timeout_is_given_up_and_named(box):
    box["script"] = [(INSTALL, 100, FRONTEND_HELD)] * 5
    rc, out, err = apt.run_apt(INSTALL, lock_timeout=10)
    assert rc == 100 and sum(box["sleeps"]) == 10 and box["script"] == []
    assert apt.lock_message("apt-get install", rc, out, err, 10).startswith(
        "apt-get install: the package lock /var/lib/dpkg/lock-frontend is still held by process 4242 "
        "(unattended-upgr) after 10 s (lock_timeout)")


def test_another_failure_is_not_retried(box):
    box["script"] = [(INSTALL, 100, "E: Unable to locate package dkms\n")]
    rc, out, err = apt.run_apt(INSTALL)
    assert rc == 100 and box["sleeps"] == []
    assert apt.lock_message("apt-get install", rc, out, err, 300) == (
        "apt-get install failed (rc 100): E: Unable to locate package dkms")


def test_an_interrupted_dpkg_is_finished_once_then_the_run_retried(box):
    box["script"] = [(INSTALL, 100, INTERRUPTED), (apt.CONFIGURE, 0, ""), (INSTALL, 100, INTERRUPTED)]
    rc, _out, err = apt.run_apt(INSTALL)
    assert rc == 100 and err == INTERRUPTED and box["calls"].count(apt.CONFIGURE) == 1  # once, not forever


def test_an_interrupted_dpkg_that_cannot_be_finished_says_so(box):
    box["script"] = [(INSTALL, 100, INTERRUPTED), (apt.CONFIGURE, 1, "dpkg: error processing package dkms\n")]
    rc, _out, err = apt.run_apt(INSTALL)
    assert rc == 1 and err.startswith("an interrupted dpkg run could not be finished (dpkg --configure -a): dpkg:")


def test_a_command_that_cannot_start_is_no_lock_to_wait_for(box):
    box["script"] = [(INSTALL, None, "")]
    rc, out, err = apt.run_apt(INSTALL)
    assert rc is None and err == "could not start" and box["sleeps"] == []
    assert apt.lock_message("apt-get install", rc, out, err, 300) == "apt-get install could not run: could not start"


def test_needrestart_is_told_to_list_only_and_its_apt_hook_to_stay_out(box):
    """Ubuntu's needrestart apt hook restarts services after a dpkg run (24.04's default); mid-play that would restart
    the serving engine (20-30 GB of weights reloaded) or sshd. needrestart(1), ENVIRONMENT: NEEDRESTART_MODE overrides
    the restart mode, NEEDRESTART_SUSPEND makes the apt-get hook skip needrestart (its ex/apt/apt-pinvoke)."""
    assert apt.ENV["NEEDRESTART_MODE"] == "l" and apt.ENV["NEEDRESTART_SUSPEND"] == "1"
    assert apt.ENV["DEBIAN_FRONTEND"] == "noninteractive"
    box["script"] = [(INSTALL, 0, "")]
    assert apt.run_apt(INSTALL) == (0, "", "")
    assert box["envs"] == [apt.ENV]
