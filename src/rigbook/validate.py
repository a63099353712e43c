"""Validate every host's rigbook_* variables against the profile schema, before any host is contacted.

Then, per host, the checks that need its merged view: combinations of keys, and the serve profiles' traps
(rigbook_serve, judged with the box's GPU count, vendor and rigbook_p2p.expected). Errors stop the command (exit 2,
naming file, host and key path); warnings are printed on stderr and do not stop it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rigbook import inventory as inventory_mod
from rigbook import paths
from rigbook.errors import UserError

PREFIX = "rigbook_"
# Both inside the collection (paths.collection_root()), shared with the preflight role's validate_profile task.
SCHEMA_FILE = "meta/profile.schema.json"
SHARED_MODULE = "plugins/plugin_utils/profile_schema.py"


@dataclass(frozen=True)
class Problem:
    file: Path
    owner: str  # "group x99_3080" / "host rig1"
    key_path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.owner}: {self.key_path}: {self.message}"


class InventoryInvalid(UserError):
    def __init__(self, problems):
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        super().__init__(
            f"inventory is invalid ({len(lines)} problem{'s' if len(lines) != 1 else ''}):\n  "
            + "\n  ".join(lines)
        )


def _shared():
    """plugins/plugin_utils/profile_schema.py of the collection: the schema file and the wording, one copy for the
    CLI and the preflight role's validate_profile task. Loaded by path: no collection link, no sys.path change."""
    return _load_shared(str(paths.collection_root()))


@lru_cache(maxsize=4)
def _load_shared(root: str):
    return paths.load_collection_file(SHARED_MODULE, "rigbook_profile_schema")


def schema_file() -> Path:
    return paths.collection_root() / SCHEMA_FILE


def schema() -> dict:
    return _shared().load_schema(str(schema_file()))


def _source_problems(source) -> list:
    shared = _shared()
    try:
        found = shared.schema_problems(source.variables, str(schema_file()))
    except shared.SchemaUnavailable as exc:
        raise UserError(str(exc)) from None
    return [Problem(source.file, source.owner, key_path, message) for key_path, message in found]


def _file_of(inv, host: str, key: str) -> Path:
    source = inv.provenance(host, key)
    return source.file if source else inv.path


def _host_problems(inv, host: str) -> list:
    """Checks that need the merged view of one host (a combination of keys from several files)."""
    problems = []
    for key, key_path, message in _shared().combination_problems(inv.host_vars(host)):
        problems.append(Problem(_file_of(inv, host, key), f"host {host}", key_path, message))
    return problems


def _serve_findings(inv, host: str) -> tuple:
    """(errors, warnings) as Problems: the host's rigbook_serve traps, judged with what its inventory says."""
    shared = _shared()
    try:
        errors, warnings = shared.serve_findings(inv.host_vars(host))
    except shared.SchemaUnavailable as exc:
        raise UserError(str(exc)) from None
    file = _file_of(inv, host, "rigbook_serve")
    return ([Problem(file, f"host {host}", key_path, message) for key_path, message in errors],
            [Problem(file, f"host {host}", key_path, message) for key_path, message in warnings])


def check(inventory_path: Path) -> tuple:
    """(Inventory, problems, warnings): the schema per file; when it passes, each host's combinations and serve
    profiles. Raises UserError when the inventory cannot be read."""
    inv = inventory_mod.load(inventory_path)
    problems, warnings = [], []
    for source in inv.sources:
        problems.extend(_source_problems(source))
    if not problems:
        for host in sorted(inv.hosts):
            problems.extend(_host_problems(inv, host))
            serve_errors, serve_warnings = _serve_findings(inv, host)
            problems.extend(serve_errors)
            warnings.extend(serve_warnings)
    return inv, problems, warnings


def validate(inventory_path: Path, warn=None):
    """Load and validate; returns the Inventory or raises InventoryInvalid / UserError. Warnings are printed on
    WARN (default stderr, so a --json stdout stays JSON) and do not stop anything."""
    inv, problems, warnings = check(inventory_path)
    if problems:
        raise InventoryInvalid(problems)
    stream = warn if warn is not None else sys.stderr
    for warning in warnings:
        print(f"warning: {warning}", file=stream, flush=True)
    return inv
