# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who listens on a TCP port: the listening sockets, the processes that hold them and their control groups
(standard library only).

- `parse_tcp(TEXT, family)`: the lines of /proc/net/tcp (family 4) or /proc/net/tcp6 (6) as {address, port, state,
  inode}; the address as text (the kernel prints each 32-bit word of it in the box's byte order), the state as the
  kernel's hex code (LISTEN is 0A). A line of another shape is skipped.
- `socket_inode(TARGET)`: the inode of an fd link's target "socket:[INODE]", else None.
- `parse_cgroup(TEXT)`: the control group paths of /proc/PID/cgroup in the hierarchies systemd names a unit's
  ControlGroup in: the unified one ("0::PATH") and the v1 systemd one ("N:name=systemd:PATH").
- Readers under the evidence root ("/" live; a recorded tree holds proc/net/tcp, proc/net/tcp6, proc/PID/fd/N links
  and proc/PID/cgroup files): `listening(root, port)`, `holders(root, inodes)`, `cgroups_of(root, pid)`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import struct

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

LISTEN = "0A"
TABLES = ((4, ("proc", "net", "tcp")), (6, ("proc", "net", "tcp6")))
MAX_TABLE = 8 << 20  # bytes of one /proc/net/tcp table read (a few hundred thousand sockets)
MAX_CGROUP = 64 << 10
SOCKET = re.compile(r"^socket:\[(\d{1,20})\]$")
HEX_ADDRESS = {4: re.compile(r"^[0-9A-Fa-f]{8}$"), 6: re.compile(r"^[0-9A-Fa-f]{32}$")}
PID = re.compile(r"^\d{1,10}$")
SYSTEMD_HIERARCHIES = ("", "name=systemd")


def _address(hex_text, family):
    """The text of an address /proc/net/tcp{,6} printed as HEX_TEXT (each 32-bit word in the box's byte order)."""
    words = [int(hex_text[i:i + 8], 16) for i in range(0, len(hex_text), 8)]
    return str(ipaddress.ip_address(b"".join(struct.pack("=I", word) for word in words)))


def parse_tcp(text, family=4):
    """[{address, port, state, inode}] of the socket lines of a /proc/net/tcp (FAMILY 4) or tcp6 (6) TEXT."""
    found = []
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3].upper(), fields[9]
        address, sep, port = local.partition(":")
        if not sep or not HEX_ADDRESS[family].match(address) or not re.match(r"^[0-9A-Fa-f]{4}$", port) \
                or not re.match(r"^[0-9A-F]{2}$", state) or not inode.isdigit():
            continue
        found.append({"address": _address(address, family), "port": int(port, 16), "state": state,
                      "inode": int(inode), "family": family})
    return found


def socket_inode(target):
    """The inode of an fd link TARGET such as "socket:[12345]", else None."""
    match = SOCKET.match(target or "")
    return int(match.group(1)) if match else None


def parse_cgroup(text):
    """The control group paths of a /proc/PID/cgroup TEXT in systemd's hierarchies (SYSTEMD_HIERARCHIES)."""
    paths = []
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3 and parts[1] in SYSTEMD_HIERARCHIES and parts[2].startswith("/"):
            paths.append(parts[2])
    return paths


def in_group(paths, group):
    """Whether one of PATHS (parse_cgroup) is the control group GROUP or lies under it."""
    group = (group or "").rstrip("/")
    return bool(group) and any(p == group or p.startswith(group + "/") for p in paths)


def listening(root, port):
    """[{address, port, state, inode, family}] of the TCP sockets listening on PORT (both tables) under ROOT."""
    found = []
    for family, parts in TABLES:
        text = files.read_text(files.path(root, *parts), limit=MAX_TABLE, strip=False)
        found += [s for s in parse_tcp(text, family) if s["state"] == LISTEN and s["port"] == int(port)]
    return found


def _pids(root):
    try:
        names = os.listdir(files.path(root, "proc"))
    except OSError:
        return []
    return sorted(int(n) for n in names if PID.match(n))


def holders(root, inodes):
    """{inode: [pid]} of the processes under ROOT that hold a socket of INODES open (their /proc/PID/fd links); a
    process whose fds cannot be read (gone, or another user's without privilege) is passed by."""
    wanted = set(inodes)
    found = dict((inode, []) for inode in wanted)
    for pid in _pids(root):
        fd_dir = files.path(root, "proc", str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                inode = socket_inode(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
            if inode in wanted and pid not in found[inode]:
                found[inode].append(pid)
    return found


def cgroups_of(root, pid):
    """The control group paths of process PID under ROOT (parse_cgroup); [] when it cannot be read."""
    return parse_cgroup(files.read_text(files.path(root, "proc", str(pid), "cgroup"), limit=MAX_CGROUP))
