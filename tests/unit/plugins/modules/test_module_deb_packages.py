"""deb_packages' glue, in-process: faked dpkg-query/apt-get/apt-mark/dpkg-deb outputs, the exact commands in
order, `changed`, the result and the messages."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import deb_packages
from helpers.modules import fail, ok, run_module

IMAGE, HEADERS = "linux-image-6.1.0-47-amd64", "linux-headers-6.1.0-47-amd64"
NAMES = [IMAGE, HEADERS]
APT = ["apt-get", "-y", "-q", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
INSTALL = APT + ["install", "--no-install-recommends"]
UPDATE = ["apt-get", "-q", "update"]
ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}


def query(*names):
    return ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Version}\n", *names]


def dpkg(*rows, missing=()):
    """dpkg-query's answer: ROWS of (package, status, version) known to dpkg; MISSING unknown to it (rc 1)."""
    out = "".join(f"{name}\t{status}\t{version}\n" for name, status, version in rows)
    err = "".join(f"dpkg-query: no packages found matching {name}\n" for name in missing)
    return (1 if missing else 0), out, err


BOTH = dpkg((IMAGE, "hi ", "6.1.176-1"), (HEADERS, "hi ", "6.1.176-1"))
VERSIONS = {IMAGE: "6.1.176-1", HEADERS: "6.1.176-1"}


def test_converged_and_held_is_one_read_only_command():
    """dpkg-query's listing says which packages are held ("hi"): no apt-mark showhold."""
    run = run_module(deb_packages, {"name": NAMES, "hold": True}, [(query(*NAMES), BOTH)])
    assert not run.failed, run.msg
    assert run.commands == [query(*NAMES)]
    assert run.result == {"changed": False, "installed": [], "removed": [], "held": [], "unavailable": [],
                          "versions": VERSIONS}


def test_converged_without_hold_is_one_command():
    run = run_module(deb_packages, {"name": NAMES}, [(query(*NAMES), BOTH)])
    assert not run.failed and run.result["changed"] is False and run.commands == [query(*NAMES)]


def test_a_missing_package_is_installed_and_both_held():
    run = run_module(deb_packages, {"name": NAMES, "hold": True}, [
        (query(*NAMES), dpkg((IMAGE, "ii ", "6.1.176-1"), missing=[HEADERS])),
        (INSTALL + [HEADERS], ok("Setting up linux-headers-6.1.0-47-amd64 (6.1.176-1) ...\n")),
        (query(*NAMES), dpkg((IMAGE, "ii ", "6.1.176-1"), (HEADERS, "ii ", "6.1.176-1"))),
        (["apt-mark", "hold", IMAGE, HEADERS], ok()),
    ])
    assert not run.failed, run.msg
    assert run.environs[1] == ENV and run.environs[3] == ENV  # apt-get and apt-mark run non-interactive
    assert run.result == {"changed": True, "installed": [HEADERS], "removed": [], "held": [IMAGE, HEADERS],
                          "unavailable": [],
                          "versions": VERSIONS}


def test_a_removed_package_with_config_files_left_counts_as_missing():
    run = run_module(deb_packages, {"name": [IMAGE]}, [
        (query(IMAGE), dpkg((IMAGE, "rc ", "6.1.170-1"))),
        (INSTALL + [IMAGE], ok()),
        (query(IMAGE), dpkg((IMAGE, "ii ", "6.1.176-1"))),
    ])
    assert not run.failed and run.result["installed"] == [IMAGE]


def test_a_stale_index_is_refreshed_once_and_the_install_retried():
    run = run_module(deb_packages, {"name": [HEADERS]}, [
        (query(HEADERS), dpkg(missing=[HEADERS])),
        (INSTALL + [HEADERS], fail(100, f"E: Unable to locate package {HEADERS}\n")),
        (UPDATE, ok()),
        (INSTALL + [HEADERS], ok()),
        (query(HEADERS), dpkg((HEADERS, "ii ", "6.1.176-1"))),
    ])
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["versions"] == {HEADERS: "6.1.176-1"}


def test_check_mode_runs_only_the_queries_and_diffs_the_plan():
    run = run_module(deb_packages, {"name": NAMES, "hold": True},
                     [(query(*NAMES), dpkg((IMAGE, "ii ", "6.1.170-1"), missing=[HEADERS]))],
                     check_mode=True, diff=True)
    assert not run.failed, run.msg
    assert run.commands == [query(*NAMES)]
    assert run.result["changed"] is True
    assert run.result["installed"] == [HEADERS] and run.result["held"] == [IMAGE, HEADERS]
    assert run.result["versions"] == {IMAGE: "6.1.170-1", HEADERS: None}
    assert run.result["diff"] == {
        "before": f"{IMAGE} 6.1.170-1\n{HEADERS} (not installed)\n",
        "after": f"{IMAGE} 6.1.170-1\n{HEADERS} (to install)\nhold {IMAGE}\nhold {HEADERS}\n",
        "before_header": "packages", "after_header": "packages"}


def test_absent_purges_what_is_installed():
    stock = ["nvidia-kernel-dkms", "nvidia-open-kernel-dkms"]
    run = run_module(deb_packages, {"name": stock, "state": "absent"}, [
        (query(*stock), dpkg(("nvidia-kernel-dkms", "ii ", "535.216.01-1"), ("nvidia-open-kernel-dkms", "un ", ""))),
        (APT + ["purge", "nvidia-kernel-dkms"], ok()),
        (query(*stock), dpkg(("nvidia-kernel-dkms", "pn ", ""), ("nvidia-open-kernel-dkms", "un ", ""))),
    ])
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["removed"] == ["nvidia-kernel-dkms"]
    assert run.result["versions"] == dict.fromkeys(stock)


def test_absent_when_nothing_is_installed_is_one_command():
    run = run_module(deb_packages, {"name": ["nvidia-kernel-dkms"], "state": "absent"},
                     [(query("nvidia-kernel-dkms"), dpkg(missing=["nvidia-kernel-dkms"]))])
    assert not run.failed and run.result["changed"] is False and len(run.commands) == 1


def test_check_mode_absent_purges_nothing():
    run = run_module(deb_packages, {"name": ["nvidia-kernel-dkms"], "state": "absent"},
                     [(query("nvidia-kernel-dkms"), dpkg(("nvidia-kernel-dkms", "ii ", "535.216.01-1")))],
                     check_mode=True)
    assert not run.failed and run.result["changed"] is True and run.result["removed"] == ["nvidia-kernel-dkms"]


# --- local .deb files ----------------------------------------------------------------------------------------

@pytest.fixture
def deb(tmp_path):
    path = tmp_path / f"{IMAGE}_6.1.176-1_amd64.deb"
    path.write_bytes(b"!<arch>\n")  # what dpkg-deb reads from it is faked
    return str(path)


def show(path):
    return ["dpkg-deb", "--show", "--showformat=${Package}\t${Version}\n", path]


def test_a_deb_whose_version_is_installed_is_left_alone(deb):
    run = run_module(deb_packages, {"debs": [deb]},
                     [(show(deb), ok(f"{IMAGE}\t6.1.176-1\n")), (query(IMAGE), dpkg((IMAGE, "ii ", "6.1.176-1")))])
    assert not run.failed and run.result["changed"] is False


def test_a_deb_is_installed_by_path(deb):
    run = run_module(deb_packages, {"debs": [deb]}, [
        (show(deb), ok(f"{IMAGE}\t6.1.176-1\n")),
        (query(IMAGE), dpkg(missing=[IMAGE])),
        (INSTALL + [deb], ok()),
        (query(IMAGE), dpkg((IMAGE, "ii ", "6.1.176-1"))),
    ])
    assert not run.failed and run.result["installed"] == [IMAGE]


def test_a_pinned_deb_replaces_another_installed_version(deb):
    """The pin is the .deb's version: the same package at another version (held, from apt) is replaced."""
    run = run_module(deb_packages, {"debs": [deb], "hold": True}, [
        (show(deb), ok(f"{IMAGE}\t6.1.176-1\n")),
        (query(IMAGE), dpkg((IMAGE, "hi ", "6.1.170-1"))),
        (INSTALL + ["--allow-downgrades", "--allow-change-held-packages", deb], ok()),
        (query(IMAGE), dpkg((IMAGE, "hi ", "6.1.176-1"))),  # still held after apt replaced it
    ], diff=True)
    assert not run.failed, run.msg
    assert run.result["changed"] is True and run.result["installed"] == [IMAGE] and run.result["held"] == []
    assert run.result["versions"] == {IMAGE: "6.1.176-1"}
    assert run.result["diff"]["after"] == f"{IMAGE} 6.1.176-1 (to install)\n"


# --- failures and bad input ----------------------------------------------------------------------------------

def test_a_failing_install_names_apt_and_its_error():
    err = f"E: Package '{HEADERS}' has no installation candidate\n"
    run = run_module(deb_packages, {"name": [HEADERS]}, [
        (query(HEADERS), dpkg(missing=[HEADERS])),
        (INSTALL + [HEADERS], fail(100, err)),
        (UPDATE, ok()),
        (INSTALL + [HEADERS], fail(100, err)),
    ])
    assert run.failed
    assert run.msg == f"apt-get install failed (rc 100): {err.strip()}"
    assert run.result["cmd"] == INSTALL + [HEADERS]


def test_a_failing_update_is_named():
    run = run_module(deb_packages, {"name": [HEADERS]}, [
        (query(HEADERS), dpkg(missing=[HEADERS])),
        (INSTALL + [HEADERS], fail(100, "E: Failed to fetch ...\n")),
        (UPDATE, fail(100, "E: The repository 'http://deb.debian.org/debian bookworm Release' no longer has a "
                           "Release file.\n")),
    ])
    assert run.failed and run.msg.startswith("apt-get update failed (rc 100): E: The repository")


def test_a_failing_hold_is_named():
    run = run_module(deb_packages, {"name": [IMAGE], "hold": True}, [
        (query(IMAGE), dpkg((IMAGE, "ii ", "6.1.176-1"))),
        (["apt-mark", "hold", IMAGE], fail(1, "E: Can't select installed nor candidate version\n")),
    ])
    assert run.failed and run.msg == "apt-mark hold failed (rc 1): E: Can't select installed nor candidate version"


def test_an_unknown_state_is_refused_before_any_command():
    run = run_module(deb_packages, {"name": [IMAGE], "state": "latest"}, [])
    assert run.failed and run.commands == []
    assert run.msg == "value of state must be one of: present, absent, got: latest"


def test_a_missing_deb_is_refused(tmp_path):
    run = run_module(deb_packages, {"debs": [str(tmp_path / "nope.deb")]}, [])
    assert run.failed and run.msg == f"local .deb {tmp_path / 'nope.deb'} does not exist" and run.commands == []


def test_an_apt_get_that_cannot_start_fails_at_once_without_an_update():
    run = run_module(deb_packages, {"name": [HEADERS]}, [
        (query(HEADERS), dpkg(missing=[HEADERS])),
        (INSTALL + [HEADERS], (None, "", "No such file or directory")),
    ])
    assert run.failed and UPDATE not in run.commands
    assert run.msg.startswith("apt-get install could not run: apt-get -y -q") and "No such file" in run.msg


def test_an_unreadable_deb_is_refused(deb):
    err = f"dpkg-deb: error: '{deb}' is not a Debian format archive\n"
    run = run_module(deb_packages, {"debs": [deb]}, [(show(deb), fail(2, err))])
    assert run.failed and run.msg == f"{deb} is not a readable .deb: {err.strip()}"


# --- a package lock held by another process; a dpkg run left interrupted -------------------------------------

FRONTEND_HELD = ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 "
                 "(unattended-upgr)\nE: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is "
                 "another process using it?\n")
ARCHIVES_HELD = ("E: Could not get lock /var/cache/apt/archives/lock. It is held by process 5151 (apt-get)\n"
                 "E: Unable to lock directory /var/cache/apt/archives/\n")


@pytest.fixture
def clock(monkeypatch):
    """A fake clock for the lock wait: each sleep advances it; the sleeps are recorded."""
    from ansible_collections.rigbook.homelab.plugins.module_utils import apt

    now = [1000.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds
    monkeypatch.setattr(apt, "WAIT", (sleep, lambda: now[0]))
    return sleeps


def test_a_held_lock_is_waited_for_then_the_install_goes_on(clock):
    run = run_module(deb_packages, {"name": [HEADERS]}, [
        (query(HEADERS), dpkg(missing=[HEADERS])),
        (INSTALL + [HEADERS], fail(100, ARCHIVES_HELD)),
        (INSTALL + [HEADERS], fail(100, FRONTEND_HELD)),
        (INSTALL + [HEADERS], ok()),
        (query(HEADERS), dpkg((HEADERS, "ii ", "6.1.176-1"))),
    ])
    assert not run.failed, run.msg
    assert run.result["installed"] == [HEADERS] and len(clock) == 2 and all(0 < s <= 3 for s in clock)
    assert UPDATE not in run.commands  # a held lock is not a stale index


def test_a_lock_held_past_the_timeout_names_the_lock_and_its_holder(clock):
    tries = [(INSTALL + [HEADERS], fail(100, FRONTEND_HELD))] * 5
    run = run_module(deb_packages, {"name": [HEADERS], "lock_timeout": 10},
                     [(query(HEADERS), dpkg(missing=[HEADERS])), *tries])
    assert run.failed
    assert run.msg == ("apt-get install: the package lock /var/lib/dpkg/lock-frontend is still held by process 4242 "
                       "(unattended-upgr) after 10 s (lock_timeout); another package manager is running on the host "
                       "(unattended-upgrades after a boot, or a second run): let it finish, or raise lock_timeout")
    assert sum(clock) == 10 and run.commands.count(INSTALL + [HEADERS]) == 5 and UPDATE not in run.commands


def test_a_held_lock_on_hold_is_waited_for_too(clock):
    run = run_module(deb_packages, {"name": [IMAGE], "hold": True}, [
        (query(IMAGE), dpkg((IMAGE, "ii ", "6.1.176-1"))),
        (["apt-mark", "hold", IMAGE], fail(100, FRONTEND_HELD)),
        (["apt-mark", "hold", IMAGE], ok()),
    ])
    assert not run.failed and run.result["held"] == [IMAGE] and len(clock) == 1


def test_an_interrupted_dpkg_is_finished_once_then_the_install_retried(clock):
    interrupted = "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem.\n"
    run = run_module(deb_packages, {"name": [HEADERS]}, [
        (query(HEADERS), dpkg(missing=[HEADERS])),
        (INSTALL + [HEADERS], fail(100, interrupted)),
        (["dpkg", "--configure", "-a"], ok("Setting up linux-image-6.1.0-47-amd64 (6.1.176-1) ...\n")),
        (INSTALL + [HEADERS], ok()),
        (query(HEADERS), dpkg((HEADERS, "ii ", "6.1.176-1"))),
    ])
    assert not run.failed, run.msg
    assert run.commands.count(["dpkg", "--configure", "-a"]) == 1 and clock == []


def test_an_interrupted_dpkg_that_cannot_be_finished_is_named(clock):
    interrupted = "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem.\n"
    run = run_module(deb_packages, {"name": [IMAGE], "state": "absent"}, [
        (query(IMAGE), dpkg((IMAGE, "ii ", "6.1.176-1"))),
        (APT + ["purge", IMAGE], fail(100, interrupted)),
        (["dpkg", "--configure", "-a"], fail(1, "dpkg: error processing package linux-image-6.1.0-47-amd64\n")),
    ])
    assert run.failed
    assert run.msg.startswith("apt-get purge failed (rc 1): an interrupted dpkg run could not be finished "
                              "(dpkg --configure -a): dpkg: error processing package"), run.msg


# --- Ubuntu 24.04 (tests/fixtures/ubuntu/SOURCES.md says which outputs are recorded and which reconstructed) ---

UBUNTU = Path(__file__).resolve().parents[3] / "fixtures" / "ubuntu"
RUNNING, DROPPED = "linux-headers-6.8.0-90-generic", "linux-headers-6.8.0-45-generic"
RELEASED = "linux-headers-6.8.0-31-generic"  # noble's release pocket: never dropped
CUSTOM = "linux-headers-6.8.12-r9700-p2p-dma44"
POLICY = ["apt-cache", "policy"]


def _ubuntu(name):
    return (UBUNTU / name).read_text()


@pytest.fixture
def stale_index(monkeypatch, tmp_path):
    """The package index as a folder last written two hours ago."""
    index = tmp_path / "lists"
    index.mkdir()
    old = time.time() - 7200
    os.utime(index, (old, old))
    monkeypatch.setattr(deb_packages, "INDEX", str(index))
    return index


def test_headers_of_a_kernel_the_archive_dropped_are_skipped_and_named_not_a_failure(stale_index):
    policy = _ubuntu("apt-cache-policy-headers.txt")
    run = run_module(deb_packages, {"name": ["dkms"], "if_available": [RUNNING, DROPPED, CUSTOM]}, [
        (query("dkms", RUNNING, DROPPED, CUSTOM),
         dpkg(("dkms", "ii ", "3.0.11-1ubuntu13"), (RUNNING, "ii ", "6.8.0-90.91"), missing=[DROPPED, CUSTOM])),
        (POLICY + [DROPPED, CUSTOM], ok(policy)),
        (UPDATE, ok()),  # no candidate: the index is refreshed once before a package is called unavailable
        (POLICY + [DROPPED, CUSTOM], ok(policy)),
    ])
    assert not run.failed, run.msg
    assert run.result["unavailable"] == [DROPPED, CUSTOM] and run.result["installed"] == []
    assert run.result["changed"] is False  # nothing installed: a converged box stays changed=0


def test_headers_with_a_candidate_are_installed_the_others_named(stale_index):
    policy = ("linux-headers-6.8.0-88-generic:\n  Installed: (none)\n  Candidate: 6.8.0-88.89\n  Version table:\n"
              "     6.8.0-88.89 500\n        500 http://archive.ubuntu.com/ubuntu noble-updates/main amd64 Packages\n"
              + _ubuntu("apt-cache-policy-headers.txt"))
    other = "linux-headers-6.8.0-88-generic"
    run = run_module(deb_packages, {"if_available": [other, DROPPED]}, [
        (query(other, DROPPED), dpkg(missing=[other, DROPPED])),
        (POLICY + [other, DROPPED], ok(policy)),
        (UPDATE, ok()),
        (POLICY + [other, DROPPED], ok(policy)),
        (INSTALL + [other], ok()),
        (query(other, DROPPED), dpkg((other, "ii ", "6.8.0-88.89"), missing=[DROPPED])),
    ])
    assert not run.failed, run.msg
    assert run.result["installed"] == [other] and run.result["unavailable"] == [DROPPED] and run.result["changed"]


def test_headers_of_the_release_kernel_stay_in_the_release_pocket_and_are_installed(stale_index):
    run = run_module(deb_packages, {"if_available": [RELEASED]}, [
        (query(RELEASED), dpkg(missing=[RELEASED])),
        (POLICY + [RELEASED], ok(_ubuntu("apt-cache-policy-headers.txt"))),
        (INSTALL + [RELEASED], ok()),
        (query(RELEASED), dpkg((RELEASED, "ii ", "6.8.0-31.31"))),
    ])
    assert not run.failed, run.msg
    assert run.result["installed"] == [RELEASED] and run.result["unavailable"] == [] and run.result["changed"]


def test_a_fresh_index_is_not_refreshed_again_for_a_kernel_the_archive_dropped(stale_index):
    os.utime(stale_index)  # written just now
    run = run_module(deb_packages, {"if_available": [DROPPED]}, [
        (query(DROPPED), dpkg(missing=[DROPPED])),
        (POLICY + [DROPPED], ok(_ubuntu("apt-cache-policy-headers.txt"))),
    ])
    assert not run.failed and run.result["unavailable"] == [DROPPED] and run.result["changed"] is False


def test_check_mode_reports_unavailable_headers_from_the_index_as_it_is(stale_index):
    run = run_module(deb_packages, {"if_available": [DROPPED]}, [
        (query(DROPPED), dpkg(missing=[DROPPED])),
        (POLICY + [DROPPED], ok(_ubuntu("apt-cache-policy-headers.txt"))),
    ], check_mode=True)
    assert not run.failed and run.result["unavailable"] == [DROPPED] and run.result["changed"] is False


def test_a_broken_apt_cache_fails_instead_of_calling_every_package_unavailable():
    run = run_module(deb_packages, {"if_available": [DROPPED]}, [
        (query(DROPPED), dpkg(missing=[DROPPED])),
        (POLICY + [DROPPED], fail(100, "E: The package lists or status file could not be parsed or opened.\n")),
    ])
    assert run.failed and run.msg.startswith(f"apt-cache policy {DROPPED} exited 100: E: The package lists")


def test_globs_purge_every_installed_stock_nvidia_package_of_an_ubuntu_box():
    globs = ["linux-modules-nvidia-*", "linux-objects-nvidia-*", "linux-signatures-nvidia-*", "nvidia-dkms-*",
             "nvidia-driver-*", "libnvidia-*-[0-9]*"]
    listing = _ubuntu("dpkg-query-nvidia-570.txt")
    run = run_module(deb_packages, {"name": globs, "state": "absent"}, [
        (query(*globs), (0, listing, "")),
        (APT + ["purge", "libnvidia-cfg1-570", "libnvidia-common-570", "libnvidia-compute-570",
                "libnvidia-decode-570", "libnvidia-encode-570", "libnvidia-extra-570", "libnvidia-fbc1-570",
                "libnvidia-gl-570", "linux-modules-nvidia-570-6.8.0-90-generic", "linux-modules-nvidia-570-generic",
                "linux-objects-nvidia-570-6.8.0-90-generic", "linux-signatures-nvidia-6.8.0-90-generic",
                "nvidia-compute-utils-570", "nvidia-driver-570", "nvidia-firmware-570-570.195.03",
                "nvidia-kernel-common-570", "nvidia-kernel-source-570", "nvidia-utils-570",
                "xserver-xorg-video-nvidia-570"], ok()),
        (query(*globs), dpkg(missing=globs)),
    ], diff=True)
    assert not run.failed, run.msg
    assert "nvidia-dkms-570" not in run.result["removed"]  # "rc": only its configuration files are left
    assert len(run.result["removed"]) == 19 and run.result["changed"] is True
    assert "nvidia-driver-570 570.195.03-0ubuntu0.24.04.1\n" in run.result["diff"]["before"]
    assert "nvidia-driver-570 (not installed)\n" in run.result["diff"]["after"]


def test_globs_matching_nothing_installed_change_nothing():
    globs = ["linux-modules-nvidia-*", "nvidia-dkms-*"]
    run = run_module(deb_packages, {"name": globs, "state": "absent"}, [(query(*globs), dpkg(missing=globs))])
    assert not run.failed and run.result["removed"] == [] and run.result["changed"] is False


def test_a_glob_is_refused_for_an_install():
    run = run_module(deb_packages, {"name": ["nvidia-dkms-*"]})
    assert run.failed and "glob" in run.msg
