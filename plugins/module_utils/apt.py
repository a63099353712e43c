# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""apt-get and dpkg runs that wait for a held package lock and repair an interrupted dpkg (standard library only).

A fresh Ubuntu's unattended-upgrades holds the dpkg lock for minutes after boot, and two hosts sharing one apt
archive cache (the lab's twins) take its lock in turn: apt-get then fails at once with "Could not get lock ...".
`run_apt` retries such a run until LOCK_TIMEOUT seconds have passed (as ansible.builtin.apt's lock_timeout), and
names the lock and its holder when it gives up. A run cut short inside dpkg (the connection dropped, Ctrl-C) leaves
"dpkg was interrupted"; `run_apt` runs `dpkg --configure -a` once and retries, so the next run repairs it. Every
command goes through facts/runner.py (the one command runner), with ENV: non-interactive, and needrestart told not to
restart services (every apt-get of rigbook's modules runs here).

What dpkg has installed and what apt could install are read in facts/packages.py (the one reader).
"""

from __future__ import annotations

import re
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

# needrestart (on Ubuntu servers by default; its apt hook runs after every dpkg run) never restarts a service mid-play:
# NEEDRESTART_SUSPEND makes the hook skip it, NEEDRESTART_MODE=l makes it only list if it runs anyway (needrestart(1),
# ENVIRONMENT; the hook: needrestart's ex/apt/apt-pinvoke). docs/architecture.md says why.
ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "NEEDRESTART_MODE": "l", "NEEDRESTART_SUSPEND": "1"}
LOCK_TIMEOUT = 300
RETRY_EVERY = 3
LOCKED = re.compile(r"Could not get lock (\S+?)\.?(?:\s|$)|Unable to acquire the dpkg frontend lock \((\S+)\)"
                    r"|Unable to lock (?:the administration )?directory (\S+)")
HOLDER = re.compile(r"It is held by process (\d+ \([^)]*\))")
INTERRUPTED = "dpkg was interrupted"
CONFIGURE = ["dpkg", "--configure", "-a"]
WAIT = (time.sleep, time.monotonic)  # (sleep, clock): replaced in tests


def _run(argv, cwd=None):
    """(rc, stdout, stderr) of ARGV (in the folder CWD) through the one runner; rc None (the reason as stderr) when it
    could not start."""
    result = runner.run(argv, env=ENV, cwd=cwd)
    if result.rc is None:
        return None, result.stdout, result.error
    return result.rc, result.stdout, result.stderr


def lock_held(text):
    """(lock path, holder or None) when apt-get's output says a lock is held, else None."""
    found = LOCKED.search(text or "")
    if not found:
        return None
    holder = HOLDER.search(text)
    return next(g for g in found.groups() if g), holder.group(1) if holder else None


def run_apt(argv, lock_timeout=LOCK_TIMEOUT, cwd=None):
    """Run ARGV (apt-get or dpkg; in the folder CWD: apt-get download writes there); (rc, out, err) of the last try,
    retrying while a lock is held. rc is None (the reason in err) when it could not start at all."""
    sleep, clock = WAIT
    deadline = clock() + max(0, lock_timeout)
    repaired = False
    while True:
        rc, out, err = _run(argv, cwd)
        if rc == 0 or rc is None:
            return rc, out, err
        if INTERRUPTED in out + err and not repaired:
            repaired = True
            crc, cout, cerr = _run(CONFIGURE)
            if crc is None or (crc != 0 and lock_held(cout + cerr) is None):
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
    if rc is None:
        return "%s could not run: %s" % (what, (err or out).strip()[-2000:])
    return "%s failed (rc %d): %s" % (what, rc, (err or out).strip()[-2000:])


def apt_or_fail(module, argv, what, lock_timeout=LOCK_TIMEOUT):
    """run_apt, then fail_json naming the step (and the held lock) when it did not succeed; returns stdout."""
    rc, out, err = run_apt(argv, lock_timeout)
    if rc != 0:
        module.fail_json(msg=lock_message(what, rc, out, err, lock_timeout), cmd=argv)
    return out
