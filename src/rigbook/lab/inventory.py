"""The inventory of the lab that is actually up, written to <state>/lab/inventory/.

inventory/lab in the repository is the default layout (lab-3080 + lab-r9700). When `lab up` is
given other rigs or more hosts, this generated inventory lists exactly the hosts that run,
with the same groups; its group_vars/ and locks/ are links to inventory/lab's, so the connection
settings, host variables and locks are the repository's.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rigbook import paths
from rigbook.errors import UserError
from rigbook.lab import state

# The repository's inventory/lab directories every lab inventory shares: the group variables, and the locks they name
# relative to the inventory directory (rigbook_pins.sglang.lock).
SHARED = ("group_vars", "locks")
HEADER = "# Written by `provision lab up`: the lab hosts running now. Use: provision site.yml -i {path}\n"


def inventory_dir() -> Path:
    return state.lab_dir() / "inventory"


def _own_bind(host) -> dict:
    """A twin's serve profiles, listening on the twin's own address: the lab's hosts share this machine's network,
    so a second host of a lab rig, or a host of a second lab (another address block), would otherwise take the
    first one's port (the first host of each rig in block 0 keeps inventory/lab's)."""
    if not host.address.startswith("127.0.11."):
        path = paths.collection_root() / "inventory/lab/group_vars" / f"{host.group}.yml"
        profiles = (yaml.safe_load(path.read_text()) or {}).get("rigbook_serve") if path.is_file() else None
        if profiles:
            return {"rigbook_serve": [{**profile, "bind": host.address} for profile in profiles]}
    return {}


def render(hosts: list) -> dict:
    groups: dict = {}
    for host in hosts:
        groups.setdefault(host.group, {"hosts": {}})["hosts"][host.name] = {
            "ansible_host": host.address, "ansible_port": host.port, **_own_bind(host)}
    return {"all": {"children": {"lab": {"children": groups}}}}


def is_default(hosts: list) -> bool:
    """Whether the static inventory/lab describes exactly these hosts."""
    static = yaml.safe_load((paths.collection_root() / "inventory/lab/hosts.yml").read_text())
    return render(hosts) == static


def running_inventory() -> Path | None:
    """What `-i lab` names while this state directory's lab is up in a layout of its own (more hosts, other rigs, an
    address block other than 0): the generated inventory of exactly those hosts. None for the default layout (the
    repository's inventory/lab describes it) or when no lab is up."""
    try:
        lab = state.load()
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"-i lab: the lab's state file {state.state_file()} cannot be read ({type(err).__name__}: "
                        f"{err}); name an inventory path instead") from None
    if lab is None or not lab.hosts or is_default(lab.hosts):
        return None
    generated = inventory_dir()
    return generated if (generated / "hosts.yml").is_file() else None


def write(hosts: list) -> Path:
    d = inventory_dir()
    d.mkdir(parents=True, exist_ok=True)
    text = HEADER.format(path=d) + "---\n" + yaml.safe_dump(render(hosts), sort_keys=False)
    (d / "hosts.yml").write_text(text)
    for name in SHARED:
        link = d / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(paths.collection_root() / "inventory/lab" / name, target_is_directory=True)
    return d
