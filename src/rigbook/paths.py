"""Where things live: the collection root (this checkout), the state directory, run folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rigbook.errors import UserError

COLLECTION_NAMESPACE = "rigbook"
COLLECTION_NAME = "homelab"


def collection_root() -> Path:
    """The directory holding galaxy.yml, playbooks/, roles/, plugins/ and inventory/."""
    override = os.environ.get("RIGBOOK_COLLECTION_ROOT")
    candidates = [Path(override)] if override else []
    candidates.append(Path(__file__).resolve().parents[2])
    for candidate in candidates:
        if (candidate / "galaxy.yml").is_file() and (candidate / "playbooks").is_dir():
            return candidate
    raise UserError(
        "cannot find the rigbook collection (galaxy.yml, playbooks/): install rigbook from its "
        "checkout with `pip install -e .`, or set RIGBOOK_COLLECTION_ROOT to the checkout"
    )


def state_dir() -> Path:
    """Per-user state: run artifacts, the collection link, lab state. RIGBOOK_STATE_DIR overrides."""
    override = os.environ.get("RIGBOOK_STATE_DIR")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rigbook"


def runs_dir() -> Path:
    return state_dir() / "runs"


def collections_path() -> Path:
    """A directory Ansible can use as a collections path, with rigbook.homelab linked to the checkout.

    Also put on sys.path so the controller imports the same module_utils code that the targets run.
    """
    root = collection_root()
    base = state_dir() / "collections"
    link = base / "ansible_collections" / COLLECTION_NAMESPACE / COLLECTION_NAME
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == root:
        pass
    else:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(root, target_is_directory=True)
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    return base
