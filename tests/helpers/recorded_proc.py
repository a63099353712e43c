"""A recorded /proc under an evidence root (simulated at the evidence boundary): the TCP tables and, per process,
its cgroup file and the socket descriptors it holds, as the kernel shows them."""

from __future__ import annotations

import os


def recorded_root(tmp_path, tcp: str, tcp6: str, procs: dict) -> str:
    """An evidence root holding /proc/net/tcp TCP, /proc/net/tcp6 TCP6 and PROCS {pid: (cgroup text, [socket inodes
    held])}: each process's fd 0 is /dev/null (a descriptor that is no socket), its sockets from fd 3 on."""
    root = tmp_path / "root"
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/tcp").write_text(tcp)
    (root / "proc/net/tcp6").write_text(tcp6)
    for pid, (cgroup, inodes) in procs.items():
        fd = root / "proc" / str(pid) / "fd"
        fd.mkdir(parents=True)
        (root / "proc" / str(pid) / "cgroup").write_text(cgroup)
        os.symlink("/dev/null", fd / "0")
        for number, inode in enumerate(inodes, 3):
            os.symlink(f"socket:[{inode}]", fd / str(number))
    return str(root)
