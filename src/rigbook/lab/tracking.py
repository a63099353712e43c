"""What belongs to a lab host: its supervisor, its processes, its cgroups, its memory.

Only processes recorded by this state directory are ever signalled: the supervisor's pid file is
checked against its command line, and the rest is found from it (process tree), from the host's
own cgroups, and from the root directory of the container.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rigbook.lab import state
from rigbook.lab.state import Host
from rigbook.procs import children_map

SUPERVISOR = Path(__file__).resolve().with_name("supervisor.py")
CGROUP_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")


def _cmdline(pid: int) -> list:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _read_pid(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def supervisor_pid(host: Host) -> int:
    """The host's supervisor pid if that process is alive and really is its supervisor, else 0."""
    pid = host.supervisor_pid
    args = _cmdline(pid) if pid else []
    return pid if str(SUPERVISOR) in args and str(host.dir / "supervisor.json") in args else 0


def is_running(host: Host) -> bool:
    return bool(supervisor_pid(host))


def _tree(pid: int, kids: dict) -> set:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += kids.get(p, [])
    return out


def _in_cgroups(host: Host) -> set:
    pids = set()
    for group in host.cgroups:
        for procs in Path(group).rglob("cgroup.procs") if Path(group).is_dir() else []:
            try:
                pids |= {int(x) for x in procs.read_text().split()}
            except (OSError, ValueError):
                pass
    return pids


def processes_in_root(root: Path) -> set:
    """Processes whose root directory is ROOT (what runs inside that container).

    Compared by device and inode: a process in the container's mount namespace reads its root
    as "/" through readlink, but stat() of /proc/PID/root reaches the same directory."""
    try:
        st = os.stat(root)
    except OSError:
        return set()
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                other = os.stat(entry / "root")
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                pids.add(int(entry.name))
    return pids


def processes(host: Host) -> set:
    """Every live process that belongs to HOST."""
    kids = children_map()
    pids = set()
    sup = supervisor_pid(host)
    if sup:
        pids |= _tree(sup, kids)
    nspawn = _read_pid(host.dir / "nspawn.pid")
    if nspawn and "systemd-nspawn" in " ".join(_cmdline(nspawn)) and str(host.root) in _cmdline(nspawn):
        pids |= _tree(nspawn, kids)
    pids |= _in_cgroups(host) | processes_in_root(host.root)
    return {p for p in pids if p != os.getpid() and not _is_zombie(p)}  # zombies have exited


def rss_kib(host: Host) -> int:
    total = 0
    for pid in processes(host):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return total


def wait_gone(pids: set, seconds: float) -> set:
    deadline = time.monotonic() + seconds
    while True:
        alive = {p for p in pids if Path(f"/proc/{p}").exists() and not _is_zombie(p)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True



# --- cgroups ------------------------------------------------------------------------------


def _cgroup_roots() -> list:
    """Mounted cgroup hierarchies nspawn and the container's systemd use: v2, and v1 name=systemd."""
    roots = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            point, fstype, opts = left.split()[4], right.split()[0], right.split()[-1]
            if point in CGROUP_MOUNTS and (fstype == "cgroup2" or "name=systemd" in opts.split(",")):
                roots.append(point)
    return roots


def make_cgroups(host: Host) -> list:
    groups = []
    for root in _cgroup_roots():
        group = Path(root) / f"rigbook-lab-{state.lab_id()}" / host.name
        group.mkdir(parents=True, exist_ok=True)
        groups.append(str(group))
    return groups


def _rmdir(d: Path) -> None:
    """rmdir a cgroup; the kernel may need a moment after its last process exits."""
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    d.rmdir()


def remove_cgroups(host: Host) -> None:
    for group in host.cgroups:
        g = Path(group)
        if g.is_dir():
            for d in sorted((p for p in g.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                _rmdir(d)
            _rmdir(g)
        try:
            g.parent.rmdir()  # rigbook-lab-<id>, once its last host is gone
        except OSError:
            pass
