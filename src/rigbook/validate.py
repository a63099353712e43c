"""Validate every host's rigbook_* variables against the profile schema, before any host is contacted."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from rigbook import inventory as inventory_mod
from rigbook.errors import UserError

PREFIX = "rigbook_"


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


@lru_cache(maxsize=1)
def schema() -> dict:
    text = resources.files("rigbook").joinpath("schema/profile.schema.json").read_text()
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(schema())


def _key_path(error) -> str:
    parts = []
    for part in error.absolute_path:
        parts.append(f"[{part}]" if isinstance(part, int) else ("." if parts else "") + str(part))
    return "".join(parts)


def _show(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _schema_at(error) -> dict:
    return error.schema if isinstance(error.schema, dict) else {}


def _describe(error):
    """(key path, message) for one jsonschema error, in words a user can act on."""
    path = _key_path(error)
    kind = error.validator
    value = error.instance
    sub = _schema_at(error)
    if "propertyNames" in error.absolute_schema_path:
        return [(path, f"bad key {_show(value)}: names must match {error.validator_value}")]
    if kind == "additionalProperties":
        allowed = sorted(sub.get("properties", {}))
        unknown = sorted(set(value) - set(allowed))
        problems = []
        for key in unknown:
            hint = difflib.get_close_matches(key, allowed, n=1)
            did = f"; did you mean {hint[0]!r}?" if hint else ""
            full = f"{path}.{key}" if path else key
            what = "variable" if not path else "key"
            problems.append((full, f"unknown {what} {key!r} (allowed: {', '.join(allowed)}){did}"))
        return problems
    if kind == "required":
        missing = [k for k in error.validator_value if k not in (value or {})]
        return [(path, f"missing required key {k!r}") for k in missing]
    if kind == "enum":
        allowed = ", ".join(_show(v) for v in error.validator_value)
        return [(path, f"bad value {_show(value)}: allowed values are {allowed}")]
    if kind == "const":
        return [(path, f"bad value {_show(value)}: must be {_show(error.validator_value)}")]
    if kind == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        return [(path, f"bad value {_show(value)} ({type(value).__name__}): must be {_article(wanted)}")]
    if kind == "pattern":
        return [(path, f"bad value {_show(value)}: must match {error.validator_value}")]
    bounds = {
        "minimum": "at least",
        "maximum": "at most",
        "exclusiveMinimum": "greater than",
        "exclusiveMaximum": "less than",
        "minLength": "a string of length at least",
        "minItems": "a list of at least",
    }
    if kind in bounds:
        return [(path, f"bad value {_show(value)}: must be {bounds[kind]} {error.validator_value}")]
    if kind in ("oneOf", "anyOf"):
        options = [sorted(o.get("required", [])) for o in error.validator_value if isinstance(o, dict)]
        if all(options):
            names = " or ".join("+".join(o) for o in options)
            which = "exactly one of" if kind == "oneOf" else "at least one of"
            return [(path, f"needs {which}: {names}")]
    return [(path, error.message)]


def _article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _source_problems(source) -> list:
    own = {k: v for k, v in source.variables.items() if str(k).startswith(PREFIX)}
    problems = []
    for error in sorted(_validator().iter_errors(own), key=lambda e: list(map(str, e.absolute_path))):
        for key_path, message in _describe(error):
            problems.append(Problem(source.file, source.owner, key_path or "(variables)", message))
    return problems


def _host_problems(inv, host: str) -> list:
    """Checks that need the merged view of one host (a combination of keys from several files)."""
    merged = inv.host_vars(host)
    gpu = merged.get("rigbook_gpu") or {}
    pins = merged.get("rigbook_pins") or {}
    p2p = merged.get("rigbook_p2p") or {}
    problems = []

    def add(key: str, key_path: str, message: str):
        source = inv.provenance(host, key)
        file = source.file if source else inv.path
        problems.append(Problem(file, f"host {host}", key_path, message))

    vendor = gpu.get("vendor") if isinstance(gpu, dict) else None
    if not isinstance(pins, dict) or not isinstance(p2p, dict):
        return problems
    wrong_vendor = {"nvidia": ("rocm", "rccl"), "amd": ("nvidia_driver", "cuda_toolchain")}
    for pin in wrong_vendor.get(vendor, ()):
        if pin in pins:
            add("rigbook_pins", f"rigbook_pins.{pin}", f"pinned for a box whose rigbook_gpu.vendor is {vendor}")
    if p2p.get("expected") is True and isinstance(gpu.get("count"), int) and gpu["count"] < 2:
        add("rigbook_p2p", "rigbook_p2p.expected", f"true, but rigbook_gpu.count is {gpu['count']} (P2P needs 2 GPUs)")
    if p2p and not gpu:
        add("rigbook_p2p", "rigbook_p2p", "set, but the host has no rigbook_gpu profile")
    return problems


def validate(inventory_path: Path):
    """Load and validate; returns the Inventory or raises InventoryInvalid / UserError."""
    inv = inventory_mod.load(inventory_path)
    problems = []
    for source in inv.sources:
        problems.extend(_source_problems(source))
    if not problems:
        for host in sorted(inv.hosts):
            problems.extend(_host_problems(inv, host))
    if problems:
        raise InventoryInvalid(problems)
    return inv
