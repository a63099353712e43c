"""Where things live: the collection root, the state directory, run folders."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from rigbook.errors import UserError

COLLECTION_NAMESPACE = "rigbook"
COLLECTION_NAME = "homelab"
# Where a built wheel carries the collection: rigbook/collection/ beside this file (setup.py's build_py copies it).
PACKAGED_COLLECTION = Path(__file__).resolve().parent / "collection"
# Where an editable install (pip install -e .) finds it: the checkout, two levels above src/rigbook/.
CHECKOUT = Path(__file__).resolve().parents[2]


def _is_collection(candidate: Path) -> bool:
    return (candidate / "galaxy.yml").is_file() and (candidate / "playbooks").is_dir()


def collection_root() -> Path:
    """The directory holding galaxy.yml, meta/, playbooks/, roles/, plugins/ and inventory/.

    In order: RIGBOOK_COLLECTION_ROOT (an error when it holds no collection), the copy an installed wheel carries
    (rigbook/collection/), the checkout of an editable install."""
    override = os.environ.get("RIGBOOK_COLLECTION_ROOT")
    if override:
        if _is_collection(Path(override)):
            return Path(override)
        raise UserError(f"RIGBOOK_COLLECTION_ROOT={override} holds no rigbook collection (galaxy.yml, playbooks/)")
    for candidate in (PACKAGED_COLLECTION, CHECKOUT):
        if _is_collection(candidate):
            return candidate
    raise UserError(
        f"cannot find the rigbook collection (galaxy.yml, playbooks/) in {PACKAGED_COLLECTION} or {CHECKOUT}: "
        "reinstall rigbook (`pip install .` or, from a checkout, `pip install -e .`), or set "
        "RIGBOOK_COLLECTION_ROOT to a directory holding the collection"
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


def link_collection() -> Path:
    """Link rigbook.homelab to collection_root() under <state>/collections/ansible_collections/ (a symlink, made or
    repointed here), put that directory on sys.path, and return it: a collections path for Ansible
    (ANSIBLE_COLLECTIONS_PATH), and `import ansible_collections.rigbook.homelab...` for the controller, which so
    runs the same module_utils code that the targets run.
    """
    root = collection_root()
    base = state_dir() / "collections"
    link = base / "ansible_collections" / COLLECTION_NAMESPACE / COLLECTION_NAME
    link.parent.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and Path(os.readlink(link)) == root):
        if link.exists() and not link.is_symlink():
            link.unlink()
        # a new link under a unique name, then os.replace: two processes repointing it at once never collide
        tmp = link.with_name(f".{link.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        tmp.symlink_to(root, target_is_directory=True)
        try:
            os.replace(tmp, link)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    return base


def load_collection_file(relative: str, name: str):
    """The Python file RELATIVE of the collection root, loaded as module NAME by path (no collection link, no
    sys.path change); UserError when the collection lacks it."""
    import importlib.util

    location = collection_root() / relative
    if not location.is_file():
        raise UserError(f"the collection has no {relative} ({location}): reinstall rigbook, or use its checkout")
    spec = importlib.util.spec_from_file_location(name, location)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
