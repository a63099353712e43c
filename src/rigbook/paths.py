"""Where things live: the collection root, the state directory, run folders."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import stat
import sys
from pathlib import Path
from urllib.parse import quote, unquote

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


def name_file(name: str, suffix: str = ".json") -> str:
    """The file name under the state directory for a host or group NAME: NAME percent-encoded (anything but
    letters, digits and _.-~; a leading dot too) plus SUFFIX, so no name can climb out of its folder, hide, or hold a
    control character, whatever the inventory let through. Names as inventories write them are unchanged."""
    stem = quote(name, safe="")
    if stem.startswith("."):
        stem = "%2E" + stem[1:]
    return stem + suffix


def name_of_file(path: Path) -> str:
    """The host or group name a state file is named after (name_file's inverse)."""
    return unquote(path.stem)


def inventory_key(path) -> str | None:
    """The stable identity of an inventory: the first 16 hex digits of the SHA-256 of its resolved absolute path (a
    link to it, or a relative way there, is the same inventory). Runs record it (run.json "inventory_key") and the
    baselines files keep a section per key, so two inventories that name a host alike never share its runs or its
    baseline. None for what cannot be a path (not text, a NUL), which so belongs to no inventory. The one place that
    computes the key (runs.inventory_key_of reads it back from a run record)."""
    if not isinstance(path, (str, Path)) or not str(path):
        return None
    try:
        resolved = os.path.realpath(path)
        encoded = os.fsencode(resolved)
    except (ValueError, OSError):
        return None
    if b"\0" in encoded:
        return None
    return hashlib.sha256(encoded).hexdigest()[:16]


def state_dir() -> Path:
    """Per-user state: run artifacts, the collection link, lab state. RIGBOOK_STATE_DIR overrides. Made 0700 when
    missing; an existing one that group or others may read is tightened to the owner's alone (a run's artifacts hold
    its variables, -e included); UserError when that cannot be done."""
    override = os.environ.get("RIGBOOK_STATE_DIR")
    if override:
        path = Path(override).expanduser()
    else:
        path = Path(os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")) / "rigbook"
    _guard_state_dir(path)
    return path


def _guard_state_dir(path: Path) -> None:
    # deferred: import cycle: rigbook.statefile imports rigbook.paths at its top
    from rigbook import statefile

    try:
        statefile.private_dir(path)
        info = path.stat()
    except OSError as exc:
        raise UserError(f"state directory {path}: cannot make it: {exc.strerror or exc} (set RIGBOOK_STATE_DIR to a "
                        "folder of your own)") from None
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o077:
        return
    if mode & (stat.S_ISVTX | stat.S_IWOTH) or info.st_uid != os.geteuid():
        raise UserError(f"state directory {path} is a shared folder (mode {mode:04o}, owner uid {info.st_uid}): "
                        "rigbook keeps each run's variables there, so it must be a folder of your own; set "
                        "RIGBOOK_STATE_DIR to one")
    try:
        os.chmod(path, mode & ~0o077)
    except OSError as exc:
        raise UserError(f"state directory {path}: others may read it (mode {mode:04o}) and it cannot be made yours "
                        f"alone: {exc.strerror or exc}") from None


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
    # deferred: import cycle: rigbook.statefile imports rigbook.paths at its top
    from rigbook.statefile import private_dir

    private_dir(link.parent)
    if not (link.is_symlink() and Path(os.readlink(link)) == root):
        # facts/files.link_atomic (a link under this process's own name, renamed over LINK: two processes repointing
        # it at once never collide; a file there is replaced, a folder refused), loaded by its path: the package
        # import needs the link this makes
        _link_writer().link_atomic(str(root), str(link))
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    return base


FACTS_PACKAGE = "ansible_collections.rigbook.homelab.plugins.module_utils.facts"
FACTS_FILES = "plugins/module_utils/facts/files.py"


def _link_writer():
    """The collection's facts/files.py for link_collection: the imported module once the link exists, else loaded
    by its path (it is standard library only)."""
    return sys.modules.get(f"{FACTS_PACKAGE}.files") or load_collection_file(FACTS_FILES, "rigbook_facts_files")


def facts(name: str):
    """The collection's facts module NAME (runner, files, ...) on the controller: the commands rigbook runs here
    and the state files it writes go through the same code the targets run. Imported once, after link_collection."""
    return collection_module(f"module_utils.facts.{name}")


def collection_module(name: str):
    """The collection's module plugins.NAME (e.g. "plugin_utils.private_folder"), imported once, after
    link_collection."""
    full = f"ansible_collections.{COLLECTION_NAMESPACE}.{COLLECTION_NAME}.plugins.{name}"
    module = sys.modules.get(full)
    if module is None:
        link_collection()
        module = importlib.import_module(full)
    return module


def load_collection_file(relative: str, name: str):
    """The Python file RELATIVE of the collection root, loaded as module NAME by path (no collection link, no
    sys.path change); UserError when the collection lacks it."""
    location = collection_root() / relative
    if not location.is_file():
        raise UserError(f"the collection has no {relative} ({location}): reinstall rigbook, or use its checkout")
    spec = importlib.util.spec_from_file_location(name, location)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
