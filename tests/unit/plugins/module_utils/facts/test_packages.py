"""facts/packages.py: the one dpkg-query reader (deb_packages, rocm_check, provision adopt, the host manifest) and
the one apt-cache policy reader. REAL is recorded: `dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\t${Version}\\n'
bash libc6 nosuch-pkg` on a Debian 12 machine (rc 1, the unknown name only on stderr); the other states are
reconstructed in the same format (dpkg's status abbreviations: desired, status, error flag)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import packages

REAL = "bash\tii \t5.2.15-2+b8\nlibc6\tii \t2.36-9+deb12u14\n"
STATES = ("rocm-core\thi \t7.1.0.70100-38~24.04\n"       # held
          "linux-image-6.1.0-40-amd64\trc \t6.1.153-1\n"  # removed, configuration files left
          "nvidia-open-kernel-dkms\tun \t\n"               # known, never installed
          "amdgpu-dkms\tri \t6.16.6.70100-38~24.04\n"      # a removal asked for, still installed
          "half\tiU \t1.0\n"                               # unpacked, not configured
          "libc6:i386\tii \t2.36-9+deb12u14\n"             # an architecture suffix
          "garbage line without tabs\n")


def test_installed_states_and_an_architecture_suffix():
    assert packages.parse_installed(REAL) == {"bash": "5.2.15-2+b8", "libc6": "2.36-9+deb12u14"}
    assert packages.parse_installed(STATES) == {"rocm-core": "7.1.0.70100-38~24.04",
                                                "amdgpu-dkms": "6.16.6.70100-38~24.04", "libc6": "2.36-9+deb12u14"}
    assert packages.parse_installed(None) == {} and packages.parse_installed("") == {}


def test_the_listing_says_which_installed_packages_are_held():
    found = packages.parse_listing(STATES)
    assert found["rocm-core"] == {"version": "7.1.0.70100-38~24.04", "held": True}
    assert found["amdgpu-dkms"]["held"] is False and "linux-image-6.1.0-40-amd64" not in found


def test_a_line_of_another_shape_is_skipped_not_trusted():
    assert packages.parse_listing("Bad Name\tii \t1.0\nok\tii \t1.0 $(reboot)\nfine\tii \t1.0\n") == {
        "fine": {"version": "1.0", "held": False}}


def test_installed_versions_runs_one_query_and_names_every_package_asked_for():
    calls = []

    def run(argv):
        calls.append(argv)
        return 1, REAL  # dpkg-query exits 1 when a name is unknown and still lists the known ones

    assert packages.installed_versions(["bash", "nosuch-pkg"], run=run) == {
        "bash": "5.2.15-2+b8", "nosuch-pkg": None, "libc6": "2.36-9+deb12u14"}
    assert calls == [packages.DPKG_QUERY + ["bash", "nosuch-pkg"]]
    assert packages.installed_versions([], run=run) == {} and len(calls) == 1  # nothing asked: nothing run


def test_listing_of_named_packages_keeps_the_held_flag():
    calls = []

    def run(argv):
        calls.append(argv)
        return 1, STATES

    found = packages.listing(["rocm-core", "amdgpu-dkms", "linux-image-6.1.0-40-amd64"], run=run)
    assert found["rocm-core"] == {"version": "7.1.0.70100-38~24.04", "held": True}
    assert found["amdgpu-dkms"] == {"version": "6.16.6.70100-38~24.04", "held": False}
    assert found["linux-image-6.1.0-40-amd64"] is None  # only its configuration files are left
    assert calls == [packages.DPKG_QUERY + ["rocm-core", "amdgpu-dkms", "linux-image-6.1.0-40-amd64"]]
    assert packages.listing([], run=run) == {} and len(calls) == 1


# --- apt-cache policy: the one reader of what apt could install (tests/fixtures/ubuntu/SOURCES.md: reconstructed) ---

UBUNTU_POLICY = (Path(__file__).resolve().parents[4] / "fixtures" / "ubuntu"
                 / "apt-cache-policy-headers.txt").read_text()


def test_policy_names_the_candidate_and_none_where_the_archive_dropped_a_kernel():
    found = packages.parse_policy(UBUNTU_POLICY)
    assert found["linux-headers-6.8.0-90-generic"] == {
        "installed": "6.8.0-90.91", "candidate": "6.8.0-90.91",
        "sources": ["500 http://archive.ubuntu.com/ubuntu noble-updates/main amd64 Packages",
                    "500 http://security.ubuntu.com/ubuntu noble-security/main amd64 Packages",
                    "100 /var/lib/dpkg/status"]}
    assert found["linux-headers-6.8.0-45-generic"] == {"installed": None, "candidate": None, "sources": []}
    # the release kernel's headers: noble's release pocket is frozen, never pruned (sources: the installed version's)
    assert found["linux-headers-6.8.0-31-generic"] == {"installed": None, "candidate": "6.8.0-31.31", "sources": []}


def test_candidates_of_known_dropped_and_unknown_names_in_one_run():
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, UBUNTU_POLICY

    names = ["linux-headers-6.8.0-90-generic", "linux-headers-6.8.0-45-generic", "linux-headers-6.8.12-r9700-p2p-dma44"]
    assert packages.candidates(names, run=run) == {names[0]: "6.8.0-90.91", names[1]: None, names[2]: None}
    assert calls == [["apt-cache", "policy"] + names]
    assert packages.candidates([], run=run) == {} and len(calls) == 1


def test_a_failed_apt_cache_is_an_error_not_a_missing_candidate():
    with pytest.raises(RuntimeError, match="apt-cache policy x exited 100"):
        packages.candidates(["x"], run=lambda argv: (100, ""))
