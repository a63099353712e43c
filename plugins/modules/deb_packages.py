#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)



DOCUMENTATION = r"""
---
module: deb_packages
short_description: Install, hold or purge Debian packages in one call, without python3-apt
description:
  - Installs the named packages that are missing and the local .deb files whose exact version is not installed,
    with apt-get and no recommends; marks them held against upgrades (O(hold)); or purges them (O(state=absent)).
  - Reads the package state with dpkg-query, so it needs no python3-apt and works in check mode on a fresh host.
  - Runs C(apt-get update) only when an install fails for lack of a current package index.
  - Supports check mode and diff mode (the package list before and after).
version_added: "1.0.0"
author:
  - rigbook developers
options:
  name:
    description:
      - Package names.
      - With O(state=absent) also dpkg-query globs (V(nvidia-dkms-*)): every installed package they match is purged.
    type: list
    elements: str
    default: []
  if_available:
    description:
      - Package names installed only where apt has an installation candidate for them (C(apt-cache policy)); one
        without (C(Candidate (none\)), or unknown to apt) is skipped and named in RV(unavailable) instead of failing
        the install. Ubuntu drops superseded kernels from its archive, so the headers of an older installed kernel
        have no candidate.
      - Before a package is called unavailable the package index is refreshed once (C(apt-get update)) when it is
        older than an hour (so a converged box with a dropped kernel does not refresh it on every run); not in
        check mode, where it is reported from the index as it is.
      - Never held (O(hold) applies to O(name) and O(debs)).
    type: list
    elements: str
    default: []
  debs:
    description: Local .deb files to install when the version each holds is not the installed one (their package
      names and versions are read from the files).
    type: list
    elements: path
    default: []
  state:
    description: V(present) installs what is missing; V(absent) purges what is installed.
    type: str
    choices: [present, absent]
    default: present
  hold:
    description: Hold the packages (apt-mark hold) so upgrades leave them alone.
    type: bool
    default: false
  lock_timeout:
    description:
      - Seconds to wait for a package lock another process holds (unattended-upgrades on a fresh box, a twin
        sharing the apt archive cache) before failing with the lock and its holder named.
      - A dpkg run left interrupted by an earlier run is finished first (C(dpkg --configure -a)).
    type: int
    default: 300
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: Install and hold the pinned kernel
  rigbook.homelab.deb_packages:
    name: [linux-image-6.1.0-47-amd64, linux-headers-6.1.0-47-amd64]
    hold: true

- name: Install the headers of the other installed kernels where the archive still has them
  rigbook.homelab.deb_packages:
    if_available: [linux-headers-6.8.0-45-generic, linux-headers-6.8.0-90-generic]

- name: Purge Ubuntu's prebuilt NVIDIA modules of every branch and kernel
  rigbook.homelab.deb_packages:
    name: ["linux-modules-nvidia-*", "nvidia-dkms-*"]
    state: absent
"""

RETURN = r"""
installed:
  description: Packages this call installed (or would install in check mode).
  returned: always
  type: list
  elements: str
unavailable:
  description: Packages of O(if_available) that are not installed and that apt has no installation candidate for
    (skipped, not installed).
  returned: always
  type: list
  elements: str
removed:
  description: Packages this call purged (or would purge).
  returned: always
  type: list
  elements: str
held:
  description: Packages this call put on hold (or would).
  returned: always
  type: list
  elements: str
versions:
  description: Installed version of each named package after the call (null when not installed).
  returned: always
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.apt import (
    ENV,
    LOCK_TIMEOUT,
    apt_or_fail,
    lock_held,
    lock_message,
    run_apt,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import packages, runner

# The package index: refreshed before a package is called unavailable when older than INDEX_MAX_AGE seconds.
INDEX = "/var/lib/apt/lists"
INDEX_MAX_AGE = 3600
APT = ["apt-get", "-y", "-q", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]


def versions_of(found):
    """{name: version or None} of a packages.listing (dpkg-query through facts/packages.py, the one reader; unknown
    names are simply not installed)."""
    return dict((name, item["version"] if item else None) for name, item in found.items())


def candidates(module, names):
    """{name: candidate version or None} from apt-cache policy (facts/packages.py, the one reader); a failed
    apt-cache fails the module with its error."""
    def run(argv):
        result = runner.run(argv, env=ENV)
        if result.rc != 0:
            module.fail_json(msg=result.error, cmd=argv)
        return result.rc, result.stdout
    return packages.candidates(names, run=run)


def index_is_stale():
    """Whether the package index is older than INDEX_MAX_AGE (or missing): apt-get update replaces its files."""
    try:
        return time.time() - os.stat(INDEX).st_mtime > INDEX_MAX_AGE
    except OSError:
        return True


def is_glob(name):
    return any(c in name for c in "*?[")


def deb_fields(module, path):
    """(package name, version) a .deb file holds (dpkg-deb reads the file, not what dpkg has installed)."""
    result = runner.run(["dpkg-deb", "--show", "--showformat=${Package}\t${Version}\n", path], env=ENV)
    parts = result.stdout.strip().split("\t")
    if result.rc != 0 or len(parts) != 2 or not all(parts):
        module.fail_json(msg="%s is not a readable .deb: %s" % (path, (result.stderr or result.stdout).strip()
                                                                  or result.error))
    return parts[0], parts[1]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="list", elements="str", default=[]),
            debs=dict(type="list", elements="path", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            hold=dict(type="bool", default=False),
            if_available=dict(type="list", elements="str", default=[]),
            lock_timeout=dict(type="int", default=LOCK_TIMEOUT),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def run(argv, what):
        return apt_or_fail(module, argv, what, p["lock_timeout"])

    for deb in p["debs"]:
        if not os.path.isfile(deb):
            module.fail_json(msg="local .deb %s does not exist" % deb)
    debs, deb_versions = {}, {}
    for deb in p["debs"]:
        package, version = deb_fields(module, deb)
        debs[package], deb_versions[package] = deb, version
    if p["state"] == "absent" and p["if_available"]:
        module.fail_json(msg="if_available installs packages: it cannot be used with state=absent")
    if p["state"] == "present" and any(is_glob(n) for n in p["name"]):
        module.fail_json(msg="a glob in name (%s) purges with state=absent; to install, name the packages"
                         % ", ".join(n for n in p["name"] if is_glob(n)))
    optional = [n for n in dict.fromkeys(p["if_available"]) if n not in p["name"] and n not in debs]
    required = list(dict.fromkeys(list(p["name"]) + list(debs)))
    names = required + optional
    found_before = packages.listing(names)
    before = versions_of(found_before)
    result = dict(changed=False, installed=[], removed=[], held=[], unavailable=[])
    if p["state"] == "absent":
        # globs add every installed package they match (dpkg-query lists them); the globs themselves are no package
        result["removed"] = sorted(n for n, v in before.items() if v is not None and not is_glob(n))
        if result["removed"] and not module.check_mode:
            run(APT + ["purge"] + result["removed"], "apt-get purge")
    else:
        # a pinned .deb counts as missing while another version of its package is installed
        missing = [n for n in required if before[n] is None or deb_versions.get(n, before[n]) != before[n]]
        wanted = [n for n in optional if before[n] is None]
        if wanted:
            found = candidates(module, wanted)
            if any(v is None for v in found.values()) and not module.check_mode and index_is_stale():
                run(["apt-get", "-q", "update"], "apt-get update")  # a stale index is no missing package
                found = candidates(module, wanted)
            result["unavailable"] = [n for n in wanted if found[n] is None]
            missing += [n for n in wanted if found[n] is not None]
        result["installed"] = missing
        if missing and not module.check_mode:
            targets = [debs.get(n, n) for n in missing]
            argv = APT + ["install", "--no-install-recommends"]
            if any(before[n] is not None for n in missing):  # the pinned version replaces another (held) one
                argv += ["--allow-downgrades", "--allow-change-held-packages"]
            argv += targets
            rc, out, err = run_apt(argv, p["lock_timeout"])
            if rc is None or (rc != 0 and lock_held(out + err)):
                module.fail_json(msg=lock_message("apt-get install", rc, out, err, p["lock_timeout"]), cmd=argv)
            if rc != 0:  # a stale index (404, unknown package): refresh once and retry
                run(["apt-get", "-q", "update"], "apt-get update")
                run(argv, "apt-get install")
    mutated = result["installed"] or result["removed"]
    found_after = found_before if module.check_mode or not mutated else packages.listing(names)
    if p["state"] == "present" and p["hold"]:
        # held: dpkg's selection as the listing after the install shows it (a held package apt replaced stays held)
        result["held"] = [n for n in required if not (found_after.get(n) or {}).get("held")]
        if result["held"] and not module.check_mode:
            run(["apt-mark", "hold"] + result["held"], "apt-mark hold")
    result["versions"] = versions_of(found_after)
    result["changed"] = bool(result["installed"] or result["removed"] or result["held"])
    if module._diff and result["changed"]:
        listed = [n for n in names if not is_glob(n)] + sorted(n for n in before if n not in names)

        def text(state, extra):
            return "".join("%s %s\n" % (n, state.get(n) or "(not installed)") for n in listed) + extra

        def planned(n):
            if n in result["removed"]:
                return None
            if n in result["installed"]:
                return " ".join(v for v in (deb_versions.get(n), "(to install)") if v)
            return before[n]
        result["diff"] = dict(
            before=text(before, ""),
            after=text(dict((n, planned(n)) for n in listed), "".join("hold %s\n" % n for n in result["held"])),
            before_header="packages", after_header="packages")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
