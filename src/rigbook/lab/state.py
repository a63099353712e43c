"""Where the lab keeps its state (<state>/lab/) and how hosts are named and addressed.

Host k (1, 2, ...) of a rig whose slot is s is named after the rig (lab-3080, then
lab-3080-2, ...) and listens on 127.<b>.<10+k>.<s>:2222: an address that depends only on the
host's own name and the lab's address block b (0 unless `lab up --address-block`), so the static
inventory/lab stays right whichever hosts of block 0 are up, and two labs (two state directories)
can run on one machine side by side in two blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rigbook import paths, statefile
from rigbook.errors import UserError
from rigbook.lab import hardware_trees

SSH_PORT = 2222
MAX_PER_RIG = 8
MAX_ADDRESS_BLOCK = 99  # 127.<block>.x.x; 127.0.0.0/8 is loopback as a whole on Linux
EVIDENCE_ROOT = "/var/lib/rigbook-lab/evidence"  # inside each host: rigbook_evidence_root
DEFAULT_RIGS = ["x99-3080", "x99-r9700"]
USER = "rigbook"
BARE_ADMIN = "admin"  # a bare host's existing account: group sudo, a password (no key), as a fresh install has


def lab_dir() -> Path:
    return paths.state_dir().resolve() / "lab"


def state_file() -> Path:
    return lab_dir() / "lab.json"


def ssh_dir() -> Path:
    return lab_dir() / "ssh"


def lab_id() -> str:
    """Short id of this state directory: names our cgroups so two checkouts never mix."""
    return hashlib.sha256(str(lab_dir()).encode()).hexdigest()[:8]


@dataclass
class Host:
    name: str
    rig: str
    group: str
    address: str
    port: int = SSH_PORT
    supervisor_pid: int = 0
    root_mode: str = ""  # overlay | copy
    cgroups: list = field(default_factory=list)
    faults: list = field(default_factory=list)
    bare: bool = False  # no rigbook user, key or sudoers drop-in; host key not in known_hosts (`lab up --bare`)

    @property
    def dir(self) -> Path:
        return lab_dir() / "hosts" / self.name

    @property
    def block(self) -> int:
        """The lab's address block: B of 127.B.x.x."""
        return int(self.address.split(".")[1])

    @property
    def admin_password_file(self) -> Path:
        """A bare host's admin password (mode 0600), for `provision bootstrap`."""
        return self.dir / "admin-password"

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def evidence(self) -> Path:
        return self.root / EVIDENCE_ROOT.lstrip("/")


@dataclass
class Lab:
    hosts: list
    rootfs: str = ""
    systemd_host: bool = False

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise UserError(f"no lab host {name!r} (hosts: {', '.join(h.name for h in self.hosts) or 'none'})")


def plan_hosts(count: int | None, rigs: list | None, bare: list | None = None, block: int = 0) -> list:
    """The hosts `lab up` will make, checked: known rigs, a sane count; BARE: the names to start bare
    ([] = every host, None = none); BLOCK: the address block (127.<BLOCK>.x.x)."""
    if not isinstance(block, int) or isinstance(block, bool) or not 0 <= block <= MAX_ADDRESS_BLOCK:
        raise UserError(f"--address-block must be a whole number from 0 to {MAX_ADDRESS_BLOCK} (got {block!r})")
    names = list(rigs or DEFAULT_RIGS)
    for name in names:
        hardware_trees.load_rig(name)  # UserError for an unknown rig
    if count is None:
        count = len(names)
    if count < 1:
        raise UserError(f"--hosts must be at least 1 (got {count})")
    if count < len(names) and not rigs:
        names = names[:count]
    elif count < len(names):
        raise UserError(f"--hosts {count} is fewer than the {len(names)} rigs given")
    hosts, seen = [], {}
    for i in range(count):
        rig = hardware_trees.load_rig(names[i % len(names)])
        meta = rig["host"]
        k = seen[rig["name"]] = seen.get(rig["name"], 0) + 1
        if k > MAX_PER_RIG:
            raise UserError(f"at most {MAX_PER_RIG} hosts per rig (asked for {k} of {rig['name']})")
        name = meta["name"] if k == 1 else f"{meta['name']}-{k}"
        hosts.append(Host(name, rig["name"], meta["group"], f"127.{block}.{10 + k}.{meta['slot']}"))
    if bare is not None:
        names = [h.name for h in hosts]
        unknown = [b for b in bare if b not in names]
        if unknown:
            raise UserError(f"--bare {', '.join(unknown)}: not a host of this lab (hosts: {', '.join(names)})")
        for host in hosts:
            host.bare = not bare or host.name in bare
    return hosts


def load() -> Lab | None:
    path = state_file()
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Lab([Host(**_renamed(h)) for h in data["hosts"]], data.get("rootfs", ""), data.get("systemd_host", False))


def _renamed(host: dict) -> dict:
    """A host as lab.json holds it; a lab brought up before the lab rigs were renamed wrote "profile" for "rig"."""
    if "profile" in host and "rig" not in host:
        host = {("rig" if key == "profile" else key): value for key, value in host.items()}
    return host


def save(lab: Lab) -> None:
    """lab.json through the one atomic write (facts/files.write_atomic)."""
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.facts("files").write_atomic(str(path), json.dumps({"hosts": [asdict(h) for h in lab.hosts],
                                                             "rootfs": lab.rootfs,
                                                             "systemd_host": lab.systemd_host}, indent=2) + "\n")


@contextmanager
def locked():
    """One lab command at a time per state directory (statefile.exclusive, the run lock's mechanism)."""
    try:
        with statefile.exclusive(lab_dir() / ".lock", {"pid": os.getpid()}):
            yield
    except statefile.Busy as busy:
        who = f" (pid {busy.holder['pid']})" if busy.holder.get("pid") else ""
        raise UserError(f"another `provision lab` command{who} is running on this state directory") from None
