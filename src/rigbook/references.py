"""Reference baselines: the figures a healthy box of one hardware class reached, shipped with the collection
(references/NAME.yml, each citing its source) and named by a host's `rigbook_reference` (the host model's
`reference`). A reference judges a box from its first run, until the box has a baseline of its own or its group's
(baselines.resolve: own, then group, then reference). A reference file is the project's data, still read as data:
its name plain, its figures finite numbers (baselines.figures_of), its text bounded."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rigbook.errors import UserError
from rigbook.paths import collection_root

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}\Z")
MAX_BYTES = 64 << 10
MAX_TEXT = 2000


def folder() -> Path:
    return collection_root() / "references"


def names() -> list:
    """The shipped references' names, sorted."""
    return sorted(p.stem for p in folder().glob("*.yml") if NAME.match(p.stem))


def load(name: str) -> dict:
    """{"name", "describes", "source", "metrics"} of the shipped reference NAME; UserError for a name that is no
    shipped reference or a file that is not one."""
    if not isinstance(name, str) or not NAME.match(name) or name not in names():
        raise UserError(f"rigbook_reference {str(name)[:80]!r}: no such reference (shipped: {', '.join(names())})")
    path = folder() / f"{name}.yml"
    try:
        raw = path.read_bytes()
        if len(raw) > MAX_BYTES:
            raise UserError(f"reference {path}: larger than {MAX_BYTES >> 10} KiB")
        data = yaml.safe_load(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"reference {path}: not readable as YAML ({str(exc)[:200]})") from None
    if not isinstance(data, dict) or data.get("name") != name or not isinstance(data.get("metrics"), dict):
        raise UserError(f"reference {path}: not a reference (name {name}, metrics: figure -> number)")
    # deferred: rigbook.baselines imports this module's callers; figures_of is its one reader of a figure
    from rigbook.baselines import figures_of

    metrics = figures_of(data["metrics"], f"reference {name}")
    if not metrics:
        raise UserError(f"reference {path}: holds no figure")
    text = {key: " ".join(str(data.get(key) or "").split())[:MAX_TEXT] for key in ("describes", "source")}
    return {"name": name, "metrics": metrics, **text}
