"""deb_packages' glue, in-process: faked dpkg-query/apt-get/apt-mark/dpkg-deb outputs, the exact commands in
order, `changed`, the result and the messages."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import deb_packages
from helpers.modules import fail, ok, run_module

IMAGE, HEADERS = "linux-image-6.1.0-47-amd64", "linux-headers-6.1.0-47-amd64"
NAMES = [IMAGE, HEADERS]
APT = ["apt-get", "-y", "-q", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
INSTALL = APT + ["install", "--no-install-recommends"]
UPDATE = ["apt-get", "-q", "update"]
ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "NEEDRESTART_MODE": "l", "NEEDRESTART_SUSPEND": "1"}


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


# --- the controller's store of a distribution kernel's .debs (module_utils/deb_store.py) ----------------------------
# A kernel the archive dropped: the apt-cache policy and apt-cache show outputs are RECONSTRUCTED in apt 2.7's formats
# (tests/unit/plugins/module_utils/test_deb_store_rules.py holds a recorded apt-cache show).

R, KV = "7.0.0-31-generic", "7.0.0-31.31~24.04.1"
K_IMAGE, K_MODULES, K_EXTRA, K_HEADERS = (f"linux-image-{R}", f"linux-modules-{R}", f"linux-modules-extra-{R}",
                                          f"linux-headers-{R}")
K_COMMON = "linux-hwe-7.0-headers-7.0.0-31"
KERNEL = [K_IMAGE, K_MODULES, K_EXTRA, K_HEADERS]
KEEP = KERNEL + ["linux-*headers-7.0.0-31", "linux-headers-7.0.0-31-common"]
ARCH = ["dpkg", "--print-architecture"]
KDEBS = {n: f"!<arch>\n{n}".encode() for n in KERNEL + [K_COMMON]}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def store_record(names=(*KERNEL, K_COMMON), arch="amd64"):
    """What the controller hands a box (deb_store's records): each package's version, architecture and sha256."""
    return {"release": R, "architecture": arch, "packages": {
        n: {"version": KV, "architecture": "all" if n == K_COMMON else "amd64", "sha256": sha(KDEBS[n])}
        for n in names}}


def policy(*names, candidate):
    return "".join(f"{n}:\n  Installed: (none)\n  Candidate: {candidate or '(none)'}\n  Version table:\n"
                   + (f"     {candidate} 500\n        500 http://archive.ubuntu.com/ubuntu noble-updates/main amd64 "
                      "Packages\n" if candidate else "") for n in names)


def cache_show(name, version, sha256, arch="amd64"):
    return (f"Package: {name}\nArchitecture: {arch}\nVersion: {version}\nPriority: optional\nSection: kernel\n"
            f"Filename: pool/main/l/linux-hwe-7.0/{name}_{version}_{arch}.deb\nSize: 100\nSHA256: {sha256}\n"
            "Description: the kernel\n\n")


def installed_rows(*names, status="hi "):
    return [(n, status, KV) for n in names]


@pytest.fixture
def boxdirs(tmp_path, monkeypatch):
    """apt's archive cache and the box's note folder, under tmp_path."""
    from ansible_collections.rigbook.homelab.plugins.module_utils import deb_store

    archives, notes = tmp_path / "archives", tmp_path / "notes"
    archives.mkdir()
    monkeypatch.setattr(deb_store, "ARCHIVES", str(archives))
    monkeypatch.setattr(deb_store, "BOX_RECORD_DIR", str(notes))
    return SimpleNamespace(archives=archives, notes=notes, keep=tmp_path / "keep")


@pytest.fixture
def fresh_index(monkeypatch, tmp_path):
    index = tmp_path / "lists"
    index.mkdir()
    monkeypatch.setattr(deb_packages, "INDEX", str(index))
    return index


def test_a_dropped_kernel_is_not_installed_from_the_archive_the_stored_files_are_named(boxdirs, fresh_index):
    """apt-cache policy: no candidate for the stored version -> nothing installed, nothing held; from_store."""
    record = store_record()
    lacking = sorted(record["packages"])
    run = run_module(deb_packages, {"name": KERNEL, "hold": True, "store": [record], "keep": KEEP,
                                    "record": "kernel"}, [
        (ARCH, ok("amd64\n")),
        (query(*KERNEL, K_COMMON, *KEEP[4:]), dpkg(missing=[*KERNEL, K_COMMON])),
        (POLICY + lacking, ok(policy(*lacking, candidate=None))),
    ], diff=True)
    assert not run.failed, run.msg
    assert run.result["from_store"] == lacking and run.result["installed"] == [] and run.result["held"] == []
    assert run.result["changed"] is False and run.result["architecture"] == "amd64"
    assert f"{K_IMAGE} {KV} (to install from the controller's store, sha256 {sha(KDEBS[K_IMAGE])})\n" in \
        run.result["diff"]["after"]
    assert not boxdirs.notes.exists()


def test_check_mode_says_the_kernel_comes_from_the_store_as_a_change(boxdirs, stale_index):
    """--check --diff shows what the converge will do: no index refresh, the stored versions and sha256 diffed."""
    record = store_record([K_IMAGE])
    run = run_module(deb_packages, {"name": [K_IMAGE], "store": [record], "record": "kernel"}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(missing=[K_IMAGE])),
        (POLICY + [K_IMAGE], ok(policy(K_IMAGE, candidate=None))),
    ], check_mode=True, diff=True)
    assert not run.failed, run.msg
    assert run.result["from_store"] == [K_IMAGE] and run.result["changed"] is True
    assert run.result["diff"] == {
        "before": f"{K_IMAGE} (not installed)\n",
        "after": f"{K_IMAGE} {KV} (to install from the controller's store, sha256 {sha(KDEBS[K_IMAGE])})\n",
        "before_header": "packages", "after_header": "packages"}


def test_a_reupload_of_the_same_abi_is_not_what_the_store_holds_either(boxdirs, fresh_index):
    record = store_record([K_IMAGE])
    run = run_module(deb_packages, {"name": [K_IMAGE], "store": [record], "record": "kernel"}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(missing=[K_IMAGE])),
        (POLICY + [K_IMAGE], ok(policy(K_IMAGE, candidate="7.0.0-31.32~24.04.1"))),
    ])
    assert not run.failed and run.result["from_store"] == [K_IMAGE]


def test_a_stale_index_is_refreshed_before_the_store_is_chosen(boxdirs, stale_index):
    record = store_record([K_IMAGE])
    run = run_module(deb_packages, {"name": [K_IMAGE], "store": [record], "record": "kernel"}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(missing=[K_IMAGE])),
        (POLICY + [K_IMAGE], ok(policy(K_IMAGE, candidate=None))),
        (UPDATE, ok()),
        (POLICY + [K_IMAGE], ok(policy(K_IMAGE, candidate=KV))),  # the fresh index offers it
        (INSTALL + [K_IMAGE], ok()),
        (query(K_IMAGE), dpkg(*installed_rows(K_IMAGE, status="ii "))),
    ])
    assert not run.failed, run.msg
    assert run.result["from_store"] == [] and run.result["installed"] == [K_IMAGE]
    # installed from the archive at the stored version: the note names the stored sha256
    assert json.loads((boxdirs.notes / "kernel.json").read_text()) == {
        "release": R, "architecture": "amd64", "packages": {K_IMAGE: {"version": KV, "sha256": sha(KDEBS[K_IMAGE])}}}
    assert run.result["recorded"] == str(boxdirs.notes / "kernel.json")


def test_the_stored_files_are_installed_held_and_noted(boxdirs, tmp_path):
    record = store_record()
    files = {}
    for name, data in KDEBS.items():
        path = tmp_path / f"{name}_{KV}.deb"
        path.write_bytes(data)
        files[name] = str(path)
    order = [*KERNEL, K_COMMON]
    run = run_module(deb_packages, {"name": KERNEL, "debs": [files[n] for n in order], "hold": True,
                                    "store": [record], "record": "kernel"}, [
        *[(show(files[n]), ok(f"{n}\t{KV}\n")) for n in order],
        (ARCH, ok("amd64\n")),
        (query(*order), dpkg(missing=order)),
        (INSTALL + [files[n] for n in order], ok()),
        (query(*order), dpkg(*installed_rows(*order, status="ii "))),
        (["apt-mark", "hold", *order], ok()),
    ])
    assert not run.failed, run.msg
    assert run.result["installed"] == order and run.result["held"] == order and run.result["from_store"] == []
    note = json.loads((boxdirs.notes / "kernel.json").read_text())
    assert note["packages"] == {n: {"version": KV, "sha256": sha(KDEBS[n])} for n in order}
    assert UPDATE not in run.commands and POLICY + [K_IMAGE] not in run.commands


def test_a_converged_box_with_its_note_runs_two_read_only_commands_and_changes_nothing(boxdirs):
    record = store_record()
    note = boxdirs.notes / "kernel.json"
    note.parent.mkdir()
    note.write_text(json.dumps({"release": R, "architecture": "amd64", "packages": {
        n: {"version": KV, "sha256": sha(KDEBS[n])} for n in record["packages"]}}))
    before = note.stat().st_mtime_ns
    rows = dpkg(*installed_rows(*KERNEL, K_COMMON))
    run = run_module(deb_packages, {"name": KERNEL, "hold": True, "store": [record], "keep": KEEP,
                                    "record": "kernel"}, [(ARCH, ok("amd64\n")),
                                                          (query(*KERNEL, K_COMMON, *KEEP[4:]), rows)])
    assert not run.failed, run.msg
    assert run.result["changed"] is False and run.result["kept"] == [] and run.result["recorded"] is None
    assert note.stat().st_mtime_ns == before


def test_the_first_box_keeps_the_debs_apt_kept_with_the_index_s_sha256(boxdirs):
    """No record yet: every installed package of the release is kept, from apt's own cache."""
    for name in (K_IMAGE, K_COMMON):
        arch = "all" if name == K_COMMON else "amd64"
        (boxdirs.archives / f"{name}_{KV}_{arch}.deb").write_bytes(KDEBS[name])
    keep = [K_IMAGE, "linux-*headers-7.0.0-31"]
    run = run_module(deb_packages, {"name": [K_IMAGE], "keep": keep, "record": "kernel"}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE, keep[1]), dpkg(*installed_rows(K_IMAGE, K_COMMON))),
        (["apt-cache", "show", f"{K_COMMON}={KV}"], ok(cache_show(K_COMMON, KV, sha(KDEBS[K_COMMON]), arch="all"))),
        (["apt-cache", "show", f"{K_IMAGE}={KV}"], ok(cache_show(K_IMAGE, KV, sha(KDEBS[K_IMAGE])))),
    ])
    assert not run.failed, run.msg
    assert run.result["kept"] == [
        {"name": K_COMMON, "version": KV, "architecture": "all",
         "path": str(boxdirs.archives / f"{K_COMMON}_{KV}_all.deb"), "sha256": sha(KDEBS[K_COMMON]),
         "index_sha256": [sha(KDEBS[K_COMMON])], "readable_by_anyone": False},  # under pytest's 0700 folder
        {"name": K_IMAGE, "version": KV, "architecture": "amd64",
         "path": str(boxdirs.archives / f"{K_IMAGE}_{KV}_amd64.deb"), "sha256": sha(KDEBS[K_IMAGE]),
         "index_sha256": [sha(KDEBS[K_IMAGE])], "readable_by_anyone": False}]
    assert run.result["changed"] is False and run.result["recorded"] is None  # no record to note yet


def test_a_deb_apt_no_longer_kept_is_downloaded_again_by_apt(boxdirs):
    def download(argv):
        boxdirs.keep.joinpath(f"{K_IMAGE}_{KV}_amd64.deb").write_bytes(KDEBS[K_IMAGE])
        return ok(f"Get:1 http://archive.ubuntu.com/ubuntu noble-updates/main amd64 {K_IMAGE} amd64 {KV}\n")
    run = run_module(deb_packages, {"name": [K_IMAGE], "keep": [K_IMAGE], "keep_dir": str(boxdirs.keep)}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(*installed_rows(K_IMAGE))),
        (["apt-cache", "show", f"{K_IMAGE}={KV}"], ok(cache_show(K_IMAGE, KV, sha(KDEBS[K_IMAGE])))),
        (["apt-get", "-q", "download", f"{K_IMAGE}={KV}"], download),
    ])
    assert not run.failed, run.msg
    assert run.result["kept"][0]["path"] == str(boxdirs.keep / f"{K_IMAGE}_{KV}_amd64.deb")
    assert run.environs[-1] == ENV  # through the one apt runner, needrestart told to stay out


def test_a_keep_dir_that_cannot_be_written_is_said_not_a_traceback(boxdirs, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    run = run_module(deb_packages, {"name": [K_IMAGE], "keep": [K_IMAGE], "keep_dir": str(blocked / "keep")}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(*installed_rows(K_IMAGE))),
        (["apt-cache", "show", f"{K_IMAGE}={KV}"], ok(cache_show(K_IMAGE, KV, sha(KDEBS[K_IMAGE])))),
    ])
    assert not run.failed, run.msg
    assert run.result["kept"] == [] and run.result["not_kept"][0]["why"].startswith(
        f"its .deb cannot be read or fetched again into {blocked / 'keep'}: ")


def test_a_version_no_index_lists_is_not_kept_and_said(boxdirs):
    status_only = (f"Package: {K_IMAGE}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {KV}\n"
                   "Description: the kernel\n\n")
    run = run_module(deb_packages, {"name": [K_IMAGE], "keep": [K_IMAGE], "keep_dir": str(boxdirs.keep)}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(*installed_rows(K_IMAGE))),
        (["apt-cache", "show", f"{K_IMAGE}={KV}"], ok(status_only)),
    ])
    assert not run.failed, run.msg
    assert run.result["kept"] == [] and run.result["not_kept"] == [{
        "name": K_IMAGE, "version": KV,
        "why": f"no package index lists {K_IMAGE} {KV} (apt-cache show): nothing vouches for its .deb"}]
    assert not boxdirs.keep.exists()  # nothing downloaded for a version no index vouches for


def test_check_mode_keeps_nothing_and_writes_no_note(boxdirs):
    run = run_module(deb_packages, {"name": [K_IMAGE], "store": [store_record([K_IMAGE])], "keep": [K_IMAGE],
                                    "record": "kernel"},
                     [(ARCH, ok("amd64\n")), (query(K_IMAGE), dpkg(*installed_rows(K_IMAGE)))], check_mode=True)
    assert not run.failed, run.msg
    assert run.result["recorded"] == str(boxdirs.notes / "kernel.json") and run.result["changed"] is True
    assert not boxdirs.notes.exists()


def test_another_architecture_s_record_is_not_this_box_s(boxdirs, fresh_index):
    run = run_module(deb_packages, {"name": [K_IMAGE], "store": [store_record([K_IMAGE], arch="arm64")],
                                    "record": "kernel"}, [
        (ARCH, ok("amd64\n")),
        (query(K_IMAGE), dpkg(missing=[K_IMAGE])),
        (INSTALL + [K_IMAGE], ok()),
        (query(K_IMAGE), dpkg(*installed_rows(K_IMAGE, status="ii "))),
    ])
    assert not run.failed and run.result["from_store"] == [] and run.result["recorded"] is None


def test_the_store_options_are_refused_with_state_absent_and_a_bad_note_name():
    absent = run_module(deb_packages, {"name": [K_IMAGE], "state": "absent", "keep": [K_IMAGE]})
    assert absent.failed and absent.commands == []
    assert absent.msg == "store, keep and record are for installing: they cannot be used with state=absent"
    bad = run_module(deb_packages, {"name": [K_IMAGE], "record": "../etc/passwd"})
    assert bad.failed and bad.commands == [] and bad.msg == "record must be a short lowercase name, not '../etc/passwd'"


def test_every_apt_command_runs_with_needrestart_told_to_list_only():
    """apt's needrestart hook (Ubuntu) must not restart the engine or sshd mid-play: every apt-get, apt-mark and
    apt-cache of this module runs with module_utils/apt.ENV."""
    run = run_module(deb_packages, {"name": NAMES, "hold": True}, [
        (query(*NAMES), dpkg(missing=NAMES)),
        (INSTALL + NAMES, fail(100, f"E: Unable to locate package {HEADERS}\n")),
        (UPDATE, ok()),
        (INSTALL + NAMES, ok()),
        (query(*NAMES), dpkg((IMAGE, "ii ", "6.1.176-1"), (HEADERS, "ii ", "6.1.176-1"))),
        (["apt-mark", "hold", *NAMES], ok()),
    ])
    assert not run.failed, run.msg
    apt_runs = [env for argv, env in zip(run.commands, run.environs) if argv[0].startswith("apt")]
    assert len(apt_runs) == 4
    assert all(env["NEEDRESTART_MODE"] == "l" and env["NEEDRESTART_SUSPEND"] == "1" for env in apt_runs)
