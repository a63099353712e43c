"""module_utils/apt.py's dpkg-query reader, the one that deb_packages, rocm_check and provision adopt use. REAL is
recorded: `dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' bash libc6 nosuch-pkg` on a Debian 12
machine (rc 1, the unknown name only on stderr); the other states are reconstructed in the same format (dpkg's
status abbreviations: desired, status, error flag)."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils import apt

REAL = "bash\tii \t5.2.15-2+b8\nlibc6\tii \t2.36-9+deb12u14\n"
STATES = ("rocm-core\thi \t7.1.0.70100-38~24.04\n"       # held
          "linux-image-6.1.0-40-amd64\trc \t6.1.153-1\n"  # removed, configuration files left
          "nvidia-open-kernel-dkms\tun \t\n"               # known, never installed
          "amdgpu-dkms\tri \t6.16.6.70100-38~24.04\n"      # a removal asked for, still installed
          "half\tiU \t1.0\n"                               # unpacked, not configured
          "libc6:i386\tii \t2.36-9+deb12u14\n"             # an architecture suffix
          "garbage line without tabs\n")


def test_installed_states_and_an_architecture_suffix():
    assert apt.parse_installed(REAL) == {"bash": "5.2.15-2+b8", "libc6": "2.36-9+deb12u14"}
    assert apt.parse_installed(STATES) == {"rocm-core": "7.1.0.70100-38~24.04", "amdgpu-dkms": "6.16.6.70100-38~24.04",
                                           "libc6": "2.36-9+deb12u14"}
    assert apt.parse_installed(None) == {} and apt.parse_installed("") == {}


def test_installed_versions_runs_one_query_and_names_every_package_asked_for():
    calls = []

    def run(argv):
        calls.append(argv)
        return 1, REAL  # dpkg-query exits 1 when a name is unknown and still lists the known ones

    assert apt.installed_versions(run, ["bash", "nosuch-pkg"]) == {"bash": "5.2.15-2+b8", "nosuch-pkg": None,
                                                                   "libc6": "2.36-9+deb12u14"}
    assert calls == [apt.DPKG_QUERY + ["bash", "nosuch-pkg"]]
    assert apt.installed_versions(run, []) == {} and len(calls) == 1  # nothing asked: nothing run
