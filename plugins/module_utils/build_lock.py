# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One build at a time per install path on a host (standard library only).

A long build runs as an async job on the host: when the run that started it is cut short (Ctrl-C, the connection
dropped), the job goes on, and the next run would start a second build into the same prefix and remove the first
one's files under it. `hold(path)` takes an exclusive flock for PATH (a lock file under LOCK_DIR, so nothing is
left beside what is built) for the rest of the module process (the kernel drops it when the process exits, however
it exits), waiting for the build that holds it: the next run then reads what that build left (its stamp, or none)
before deciding anything.
"""

from __future__ import annotations

import fcntl
import os
import time

LOCK_DIR = "/run/lock/rigbook"
_HELD = {}  # path -> fd: this process holds it already (a module run once per process; tests run many)


def lock_file(path):
    """The lock file that stands for PATH."""
    return os.path.join(LOCK_DIR, os.path.normpath(path).strip("/").replace("/", "_") + ".lock")


def hold(path, note=None):
    """Hold PATH's build lock until this process exits; returns the seconds waited. NOTE(text) is told when another
    process holds it."""
    lock = lock_file(path)
    if lock in _HELD:
        return 0.0
    if not os.path.isdir(LOCK_DIR):
        os.makedirs(LOCK_DIR, 0o755)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _HELD[lock] = fd
        return 0.0
    except OSError:
        pass
    if note:
        note("waiting for another build of %s to finish (a run cut short leaves its build running)" % path)
    started = time.monotonic()
    fcntl.flock(fd, fcntl.LOCK_EX)
    _HELD[lock] = fd
    return round(time.monotonic() - started, 1)
