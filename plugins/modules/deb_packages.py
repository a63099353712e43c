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
  - Every apt command runs non-interactive with needrestart kept from restarting services (its apt hook suspended,
    list-only mode; module_utils/apt.py), so an install never restarts a serving engine or sshd mid-play.
  - With O(store), O(keep) and O(record) it is the box's side of the controller's store of a pinned distribution
    kernel's .debs (rigbook.homelab.deb_store; roles/kernel). The archive drops a superseded kernel's packages, so the
    first box keeps the .debs it installed and a later box installs those exact files.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  name:
    description:
      - Package names.
      - "With O(state=absent) also dpkg-query globs (V(nvidia-dkms-*)): every installed package they match is purged."
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
  store:
    description:
      - The controller's records of stored .debs (rigbook.homelab.deb_store's C(records)), each with a release, an
        architecture and its packages (each package's version, architecture and sha256); the one of this box's dpkg
        architecture counts.
      - When a package of O(name) is missing and the archive no longer offers the stored version of a package of that
        record not installed at it (C(apt-cache policy) shows no candidate, or another version; the index refreshed
        once first when older than an hour), nothing is installed or held; RV(from_store) names those packages, to be
        installed from the stored files (O(debs)) by a second call. While the archive offers each, apt installs them
        from it.
    type: list
    elements: dict
    default: []
  keep:
    description:
      - dpkg-query patterns of installed packages whose .debs go to the controller's store when it holds no version of
        them (O(store)), listed in RV(kept) with the index's SHA256 of that version (C(apt-cache show NAME=VERSION), the
        hash apt checked the download against). The file is apt's own in /var/cache/apt/archives, else downloaded
        again by C(apt-get download) into O(keep_dir) (apt checks it against the index) while the archive offers it;
        one no index lists is named in RV(not_kept). Nothing is kept in check mode.
    type: list
    elements: str
    default: []
  keep_dir:
    description: Where a .deb apt no longer keeps is downloaded again for O(keep).
    type: path
    default: /var/cache/rigbook/artifacts
  record:
    description:
      - The name of this box's note of the stored .debs its packages were installed from
        (C(/var/lib/rigbook/debs/NAME.json)), written from the O(store) record of its architecture, each package
        installed at its recorded version, with that version and sha256. The host manifest reads it (C(provision
        diff) shows each package's sha256). Written only when it changes.
    type: str
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
architecture:
  description: This box's dpkg architecture.
  returned: when store, keep or record is given
  type: str
from_store:
  description: The packages to install from the store's files (nothing was installed or held by this call).
  returned: when store, keep or record is given
  type: list
  elements: str
kept:
  description: Each .deb to keep in the controller's store, C({name, version, architecture, path, sha256,
    index_sha256, readable_by_anyone}) (sha256 is this box's claim; the controller hashes the file itself;
    readable_by_anyone - the login user can fetch it without become, which would send it base64-encoded).
  returned: when store, keep or record is given
  type: list
  elements: dict
not_kept:
  description: Each package of O(keep) the store lacks whose .deb could not be kept, C({name, version, why}).
  returned: when store, keep or record is given
  type: list
  elements: dict
recorded:
  description: The note O(record) wrote (or would write), else null.
  returned: when store, keep or record is given
  type: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import deb_store
from ansible_collections.rigbook.homelab.plugins.module_utils.apt import (
    ENV,
    LOCK_TIMEOUT,
    apt_or_fail,
    lock_held,
    lock_message,
    run_apt,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, packages, runner, text

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


def architecture(module):
    """This box's dpkg architecture (what its kernel packages are built for)."""
    result = runner.run(["dpkg", "--print-architecture"], env=ENV)
    found = text.matching(result.stdout, deb_store.ARCH)
    if result.rc != 0 or not found:
        module.fail_json(msg="dpkg --print-architecture: %s" % (result.error or "no architecture printed"))
    return found


def keep_one(module, name, version, arch, keep_dir, lock_timeout):
    """({name, version, architecture, path, sha256, index_sha256}, None) of the installed NAME VERSION's .deb, or
    (None, why): the package index's SHA256 of that version, the file apt kept, else one apt-get download fetches
    again (checked by apt against the same index)."""
    result = runner.run(["apt-cache", "show", "%s=%s" % (name, version)], env=ENV)
    stanzas = deb_store.parse_show(result.stdout) if result.rc == 0 else []
    index = deb_store.index_sha256(stanzas, name, version, arch)
    if not index:
        return None, "no package index lists %s %s (apt-cache show): nothing vouches for its .deb" % (name, version)
    found_arch = next(s["architecture"] for s in stanzas if s["package"] == name and s["version"] == version
                      and s["sha256"] in index)
    file_name = deb_store.cache_name(name, version, found_arch)
    path = os.path.join(deb_store.ARCHIVES, file_name)
    if not os.path.isfile(path):
        path = os.path.join(keep_dir, file_name)
    try:
        if not os.path.isfile(path):
            if not os.path.isdir(keep_dir):
                os.makedirs(keep_dir, 0o755)
            argv = ["apt-get", "-q", "download", "%s=%s" % (name, version)]
            rc, out, err = run_apt(argv, lock_timeout, cwd=keep_dir)
            if rc != 0 or not os.path.isfile(path):
                return None, "its .deb is no longer in %s and apt-get download failed: %s" % (
                    deb_store.ARCHIVES, text.line(lock_message("apt-get download", rc, out, err, lock_timeout), 400))
        claimed = files.sha256_of(path)
    except OSError as exc:
        return None, "its .deb cannot be read or fetched again into %s: %s" % (keep_dir, exc.strerror or exc)
    return {"name": name, "version": version, "architecture": found_arch, "path": path, "sha256": claimed,
            "index_sha256": index, "readable_by_anyone": files.readable_by_anyone(path)}, None


def write_record(module, name, record, installed):
    """Write the box's note NAME of the stored .debs its packages were installed from when it changes; its path, or
    None when there is nothing to note or it is unchanged."""
    note = deb_store.box_record(record, installed)
    if note is None:
        return None
    path = deb_store.box_record_path(name)
    current, _error = files.read_json(path, limit=deb_store.MAX_RECORD)
    if current == note:
        return None
    if not module.check_mode:
        error = files.write_json(path, note, mode=0o644)
        if error:
            module.fail_json(msg=error)
    return path


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="list", elements="str", default=[]),
            debs=dict(type="list", elements="path", default=[]),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            hold=dict(type="bool", default=False),
            if_available=dict(type="list", elements="str", default=[]),
            lock_timeout=dict(type="int", default=LOCK_TIMEOUT),
            store=dict(type="list", elements="dict", default=[]),
            keep=dict(type="list", elements="str", default=[]),
            keep_dir=dict(type="path", default="/var/cache/rigbook/artifacts"),
            record=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    store_mode = bool(p["store"] or p["keep"] or p["record"])
    if store_mode and p["state"] == "absent":
        module.fail_json(msg="store, keep and record are for installing: they cannot be used with state=absent")
    if p["record"] is not None and not text.matching(p["record"], deb_store.RECORD_NAME):
        module.fail_json(msg="record must be a short lowercase name, not %r" % text.line(p["record"], 80))

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
    # the store: this box's record and the packages it or O(keep) names, listed with NAMES in one dpkg-query
    arch = architecture(module) if store_mode else None
    record = deb_store.record_for(p["store"], arch) if store_mode else None
    stored = record["packages"] if record else {}
    extra = [n for n in dict.fromkeys(list(stored) + list(p["keep"])) if n not in names]
    every = packages.listing(names + extra)
    found_before = every if not extra else dict((n, every.get(n)) for n in names)
    installed = versions_of(every)
    before = versions_of(found_before)
    result = dict(changed=False, installed=[], removed=[], held=[], unavailable=[])
    if store_mode:
        result.update(architecture=arch, from_store=[], kept=[], not_kept=[], recorded=None)
    # a missing package: from the archive while it offers every stored version not installed (nor given in O(debs)),
    # else from the stored files
    lacking = dict((n, e) for n, e in sorted(stored.items()) if e["version"] not in (installed.get(n),
                                                                                     deb_versions.get(n)))
    if lacking and any(before[n] is None for n in required):
        found = candidates(module, list(lacking))
        if deb_store.from_store(lacking, installed, found) and not module.check_mode and index_is_stale():
            run(["apt-get", "-q", "update"], "apt-get update")  # a stale index is no dropped kernel
            found = candidates(module, list(lacking))
        result["from_store"] = deb_store.from_store(lacking, installed, found)
        if result["from_store"]:
            # nothing done here; in check mode the change the next calls make is said (and diffed) here
            result["versions"], result["changed"] = before, module.check_mode
            if module._diff:
                result["diff"] = dict(
                    before="".join("%s %s\n" % (n, installed.get(n) or "(not installed)") for n in lacking),
                    after="".join("%s %s (to install from the controller's store, sha256 %s)\n" % (
                        n, e["version"], e["sha256"]) for n, e in lacking.items()),
                    before_header="packages", after_header="packages")
            module.exit_json(**result)
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
    every = every if module.check_mode or not mutated else packages.listing(names + extra)
    found_after = every if not extra else dict((n, every.get(n)) for n in names)
    installed = versions_of(every)
    if p["state"] == "present" and p["hold"]:
        # held: dpkg's selection as the listing after the install shows it (a held package apt replaced stays held)
        result["held"] = [n for n in required if not (found_after.get(n) or {}).get("held")]
        if result["held"] and not module.check_mode:
            run(["apt-mark", "hold"] + result["held"], "apt-mark hold")
    result["versions"] = versions_of(found_after)
    if p["keep"] and not module.check_mode:
        wanted = dict((n, v) for n, v in installed.items() if v and deb_store.matches(n, p["keep"]))
        for name in deb_store.to_keep(wanted, stored):
            item, why = keep_one(module, name, wanted[name], arch, p["keep_dir"], p["lock_timeout"])
            if item:
                result["kept"].append(item)
            else:
                result["not_kept"].append({"name": name, "version": wanted[name], "why": why})
                module.warn("%s %s is not kept in the controller's store: %s" % (name, wanted[name], why))
    if p["record"]:
        result["recorded"] = write_record(module, p["record"], record, installed)
    result["changed"] = bool(result["installed"] or result["removed"] or result["held"] or result.get("recorded"))
    if module._diff and result["changed"]:
        listed = [n for n in names if not is_glob(n)] + sorted(n for n in before if n not in names)

        def shown(state, extra):
            return "".join("%s %s\n" % (n, state.get(n) or "(not installed)") for n in listed) + extra

        def planned(n):
            if n in result["removed"]:
                return None
            if n in result["installed"]:
                return " ".join(v for v in (deb_versions.get(n), "(to install)") if v)
            return before[n]
        result["diff"] = dict(
            before=shown(before, ""),
            after=shown(dict((n, planned(n)) for n in listed), "".join("hold %s\n" % n for n in result["held"])
                        + ("note %s\n" % result["recorded"] if result.get("recorded") else "")),
            before_header="packages", after_header="packages")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
