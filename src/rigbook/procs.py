"""Process-tree helpers (Linux /proc): stop everything a run started, not only ansible-playbook."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def children_map() -> dict:
    """{ppid: [child pids]} for every process in /proc; processes that vanish mid-read are skipped."""
    children: dict = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the command name is in parentheses and may contain spaces: ppid is the 2nd field after ")"
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list:
    """All live descendants of PID, parents before children."""
    children = children_map()
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), ()):
            found.append(child)
            queue.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def terminate_tree(pid: int, grace_s: float = 5.0) -> list:
    """SIGTERM every descendant of PID (children first), SIGKILL what is left after GRACE_S."""
    victims = list(reversed(descendants(pid)))
    for victim in victims:
        try:
            os.kill(victim, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + grace_s
    while time.time() < deadline and any(_alive(v) for v in victims):
        time.sleep(0.1)
    for victim in victims:
        if _alive(victim):
            try:
                os.kill(victim, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return victims
