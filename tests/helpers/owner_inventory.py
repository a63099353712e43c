"""The inventory the owner of a hand-made lab box writes before `provision adopt` (tests/integration/test_adopt_*):
the lab's hosts and connection, the group's rig, GPUs and P2P as inventory/lab has them, without the pins and serve
profiles adopt is to write, and what the owner adds (OWN: group variables, e.g. serve_user)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from helpers.cli import REPO


def owner_inventory(generated: str, group: str, own: dict) -> Path:
    """The inventory beside the lab's GENERATED one (made once, then reused by the module's later tests)."""
    inv = Path(generated).parent / "adopted-inventory"
    if inv.exists():
        return inv
    (inv / "group_vars").mkdir(parents=True)
    shutil.copy(REPO / "inventory/lab/group_vars/lab.yml", inv / "group_vars/lab.yml")
    variables = yaml.safe_load((REPO / f"inventory/lab/group_vars/{group}.yml").read_text())
    for key in ("rigbook_pins", "rigbook_serve"):
        variables.pop(key)
    variables.update(own)
    (inv / f"group_vars/{group}.yml").write_text("---\n" + yaml.safe_dump(variables, sort_keys=False))
    hosts = yaml.safe_load((Path(generated) / "hosts.yml").read_text())
    for entry in hosts["all"]["children"]["lab"]["children"][group]["hosts"].values():
        entry.pop("rigbook_serve", None)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return inv
