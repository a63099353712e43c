# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""apt-get and dpkg runs that wait for a held package lock and repair an interrupted dpkg (standard library only).

A fresh Ubuntu's unattended-upgrades holds the dpkg lock for minutes after boot, and two hosts sharing one apt
archive cache (the lab's twins) take its lock in turn: apt-get then fails at once with "Could not get lock ...".
`run_apt` retries such a run until LOCK_TIMEOUT seconds have passed (as ansible.builtin.apt's lock_timeout), and
names the lock and its holder when it gives up. A run cut short inside dpkg (the connection dropped, Ctrl-C) leaves
"dpkg was interrupted"; `run_apt` runs `dpkg --configure -a` once and retries, so the next run repairs it.

The one reader of what dpkg has installed (deb_packages, rocm_check and provision adopt's collect/adopt.py all read
it here): DPKG_QUERY + names or patterns, `parse_installed` of its output, `installed_versions` of named packages.
And the one reader of what apt could install: POLICY + names, `parse_policy` of its output (installed version,
candidate, the sources of the installed version), `candidates` of named packages. Ubuntu drops superseded kernels
from its archive: the headers of an older installed kernel then show `Candidate: (none)`.
"""

from __future__ import annotations

import re
import time

ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
LOCK_TIMEOUT = 300
RETRY_EVERY = 3
LOCKED = re.compile(r"Could not get lock (\S+?)\.?(?:\s|$)|Unable to acquire the dpkg frontend lock \((\S+)\)"
                    r"|Unable to lock (?:the administration )?directory (\S+)")
HOLDER = re.compile(r"It is held by process (\d+ \([^)]*\))")
INTERRUPTED = "dpkg was interrupted"
CONFIGURE = ["dpkg", "--configure", "-a"]
WAIT = (time.sleep, time.monotonic)  # (sleep, clock): replaced in tests
# dpkg-query's listing, one package a line: name, status abbreviation (desired, status, error: "ii ", "hi ", "rc "),
# version. Followed by package names or glob patterns; without any it lists every package dpkg knows.
DPKG_QUERY = ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Version}\n"]
# apt's view of packages, followed by package names: installed version, candidate, version table.
POLICY = ["apt-cache", "policy"]
NONE = "(none)"


def parse_installed(text):
    """{package: version} of the packages DPKG_QUERY's output lists as installed: the status's second letter is "i"
    (ii, hi held; also ri/pi, a removal asked for but not done: the files are still there). "rc" (configuration
    files left), "un" (unknown) and half-installed states are not installed. An architecture suffix (:amd64) is
    dropped; a line of another shape is skipped."""
    found = {}
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1][1:2] == "i" and parts[0] and parts[2]:
            found[parts[0].split(":")[0]] = parts[2]
    return found


def installed_versions(run, names):
    """{name: version or None} of NAMES (package names or dpkg-query patterns) through RUN(argv) -> (rc, stdout);
    None: not installed or unknown to dpkg (dpkg-query then exits 1 but still lists the packages it knows). Without
    NAMES nothing is run. Patterns add every installed package they match."""
    out = dict((n, None) for n in names)
    if not names:
        return out
    _rc, stdout = run(DPKG_QUERY + list(names))
    out.update(parse_installed(stdout))
    return out


def parse_policy(text):
    """{package: {"installed", "candidate", "sources"}} from `apt-cache policy PKG ...`. installed and candidate are
    None where apt prints "(none)"; sources are those listed under the installed version (its version line starts
    with ***), e.g. ["500 http://deb.debian.org/debian bookworm/main amd64 Packages", "100 /var/lib/dpkg/status"].
    Version lines are indented by up to 5 spaces, their sources by 8. A package apt does not know at all is not
    listed (apt-cache prints nothing for it and says so on stderr)."""
    found, package, in_installed = {}, None, False
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            package = line.strip().rstrip(":")
            found[package] = {"installed": None, "candidate": None, "sources": []}
            in_installed = False
            continue
        if package is None:
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if stripped.startswith(("Installed:", "Candidate:")):
            key, value = stripped.split(":", 1)
            value = value.strip()
            found[package][key.lower()] = None if value == NONE or not value else value
        elif stripped.startswith("Version table:"):
            continue
        elif indent >= 8:
            if in_installed:
                found[package]["sources"].append(stripped)
        else:
            in_installed = stripped.startswith("*** ")
    return found


def candidates(run, names):
    """{name: candidate version or None} of NAMES through RUN(argv) -> (rc, stdout): None when apt has no
    installation candidate (the archive dropped it, or apt does not know the name). Without NAMES nothing is
    run. A failed apt-cache (rc != 0) raises RuntimeError: no candidate is never guessed from a broken apt."""
    out = dict((n, None) for n in names)
    if not names:
        return out
    rc, stdout = run(POLICY + list(names))
    if rc != 0:
        raise RuntimeError("%s exited %d" % (" ".join(POLICY + list(names)), rc))
    policy = parse_policy(stdout)
    for name in names:
        out[name] = (policy.get(name) or {}).get("candidate")
    return out


def lock_held(text):
    """(lock path, holder or None) when apt-get's output says a lock is held, else None."""
    found = LOCKED.search(text or "")
    if not found:
        return None
    holder = HOLDER.search(text)
    return next(g for g in found.groups() if g), holder.group(1) if holder else None


def run_apt(module, argv, lock_timeout=LOCK_TIMEOUT):
    """Run ARGV (apt-get or dpkg); (rc, out, err) of the last try, retrying while a lock is held."""
    sleep, clock = WAIT
    deadline = clock() + max(0, lock_timeout)
    repaired = False
    while True:
        rc, out, err = module.run_command(argv, environ_update=ENV)
        if rc == 0:
            return rc, out, err
        if INTERRUPTED in out + err and not repaired:
            repaired = True
            crc, cout, cerr = module.run_command(CONFIGURE, environ_update=ENV)
            if crc != 0 and lock_held(cout + cerr) is None:
                return crc, cout, "an interrupted dpkg run could not be finished (dpkg --configure -a): " + cerr
            continue
        if lock_held(out + err) is None or clock() >= deadline:
            return rc, out, err
        sleep(min(RETRY_EVERY, max(0.0, deadline - clock())))


def lock_message(what, rc, out, err, lock_timeout):
    """The failure message of an apt-get run: the held lock and its holder when that is why it failed."""
    held = lock_held(out + err)
    if held:
        path, holder = held
        return ("%s: the package lock %s is still held%s after %d s (lock_timeout); another package manager is "
                "running on the host (unattended-upgrades after a boot, or a second run): let it finish, or raise "
                "lock_timeout" % (what, path, " by process %s" % holder if holder else "", lock_timeout))
    return "%s failed (rc %d): %s" % (what, rc, (err or out).strip()[-2000:])


def apt_or_fail(module, argv, what, lock_timeout=LOCK_TIMEOUT):
    """run_apt, then fail_json naming the step (and the held lock) when it did not succeed; returns stdout."""
    rc, out, err = run_apt(module, argv, lock_timeout)
    if rc != 0:
        module.fail_json(msg=lock_message(what, rc, out, err, lock_timeout), cmd=argv)
    return out
