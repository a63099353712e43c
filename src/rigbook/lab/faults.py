"""Faults as data (faults.yml): validate them, plan their edits on a tree, apply the plan.

Planning reads every file a fault touches and computes the new contents first; nothing is
written until the whole plan is known, so a fault either applies completely or not at all.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

from rigbook.errors import UserError
from rigbook.lab import hardware_trees
from rigbook.paths import link_collection

FAULTS_FILE = Path(__file__).resolve().parent / "faults.yml"
OPS = ("set", "replace", "remove", "copy", "scale", "bar")
_PLACEHOLDER = re.compile(r"\{(release|upgraded_release|bdf|index|port)\}")

_EDIT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "scope": {"enum": ["tree", "gpus", "ports"]},
        "gpus": {"oneOf": [{"const": "all"}, {"type": "array", "minItems": 1,
                                               "items": {"type": ["integer", "string"]}}]},
        **{op: {"type": "string", "minLength": 1} for op in OPS if op != "bar"},
        "bar": {"oneOf": [{"const": "vram"}, {"type": "integer", "minimum": 0, "maximum": 5}]},
        "content": {"type": "string"},
        "pattern": {"type": "string", "minLength": 1},
        "with": {"type": "string"},
        "to": {"type": "string", "minLength": 1},
        "keys": {"type": "string", "minLength": 1},
        "factor": {"type": "number", "exclusiveMinimum": 0},
        "size": {"type": ["string", "integer"]},
        "base": {"type": "integer", "minimum": 0},
        "stride": {"type": "integer", "minimum": 0},
    },
}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["faults"],
    "properties": {"faults": {
        "type": "object",
        "minProperties": 1,
        "propertyNames": {"pattern": "^[a-z0-9][a-z0-9-]*$"},
        "additionalProperties": {
            "type": "object",
            "additionalProperties": False,
            "required": ["layer", "description", "edits"],
            "properties": {
                "layer": {"type": "string"},
                "description": {"type": "string", "minLength": 10},
                "vendors": {"type": "array", "items": {"enum": ["nvidia", "amd"]}, "minItems": 1},
                "edits": {"type": "array", "minItems": 1, "items": _EDIT_SCHEMA},
            },
        },
    }},
}
# What each operation needs besides its own key.
_NEEDS = {"set": {"content"}, "replace": {"pattern", "with"}, "remove": set(), "copy": {"to"},
          "scale": {"keys", "factor"}, "bar": set()}


def layer_names() -> list:
    """The ladder's layers in order, from the collection's layer registry (a fault names the layer it fails)."""
    link_collection()
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

    return registry.names()


def validate(data: dict) -> dict:
    """Check a faults document; raise ValueError naming the fault and edit that is wrong."""
    try:
        jsonschema.validate(data, SCHEMA)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ValueError(f"faults: {where}: {exc.message}") from None
    layers = layer_names()
    for name, fault in data["faults"].items():
        if fault["layer"] not in layers:
            raise ValueError(f"faults: {name}/layer: {fault['layer']!r} is no layer of the ladder "
                             f"({', '.join(layers)})")
        for i, edit in enumerate(fault["edits"]):
            ops = [op for op in OPS if op in edit]
            if len(ops) != 1:
                raise ValueError(f"faults: {name}/edits/{i}: needs exactly one of {', '.join(OPS)}")
            missing = _NEEDS[ops[0]] - set(edit)
            if missing:
                raise ValueError(f"faults: {name}/edits/{i}: {ops[0]} needs {', '.join(sorted(missing))}")
            if ops[0] == "bar" and edit.get("scope") != "gpus":
                raise ValueError(f"faults: {name}/edits/{i}: bar works with scope: gpus only")
            if "pattern" in edit or "keys" in edit:
                re.compile(edit.get("pattern") or edit["keys"])
            if "size" in edit:
                hardware_trees.parse_size(edit["size"])
    return data


@lru_cache(maxsize=None)
def _load() -> str:
    return FAULTS_FILE.read_text(encoding="utf-8")


def load_faults() -> dict:
    return validate(yaml.safe_load(_load()))["faults"]


def fault_names() -> list:
    return sorted(load_faults())


def get_fault(name: str) -> dict:
    faults = load_faults()
    if name not in faults:
        raise UserError(f"unknown fault {name!r} (known: {', '.join(sorted(faults))})")
    return faults[name]


@dataclass
class Change:
    path: Path
    content: str | None  # None: remove


def _fill(text: str, ctx: dict) -> str:
    return _PLACEHOLDER.sub(lambda m: str(ctx[m.group(1)]), text)


def _targets(edit: dict, profile: dict) -> list:
    """(base directory relative to the tree root, placeholder context) for each place the edit hits."""
    kernel = profile["kernel"]
    ctx = {"release": kernel["release"], "upgraded_release": kernel.get("upgraded_release", kernel["release"]),
           "bdf": "", "index": "", "port": ""}
    scope = edit.get("scope", "tree")
    if scope == "tree":
        return [("", ctx)]
    wanted = edit.get("gpus", "all")
    out = []
    for index, gpu in enumerate(hardware_trees.gpus(profile)):
        if wanted != "all" and index not in wanted and gpu["bdf"] not in wanted:
            continue
        gctx = dict(ctx, bdf=gpu["bdf"], index=index, port=gpu["port"], gpu=gpu)
        if scope == "gpus":
            out.append((hardware_trees.device_dir(gpu) + "/", gctx))
        else:
            out.append((f"sys/devices/pci0000:00/{gpu['port']}/", gctx))
    return out


class _View:
    """The tree as the plan sees it: files already changed by earlier edits win over the disk."""

    def __init__(self, root: Path):
        self.root = root
        self.changes: dict = {}

    def read(self, rel: str):
        path = self.root / rel
        if path in self.changes:
            return self.changes[path]
        if any(p in self.changes and self.changes[p] is None for p in path.parents):
            return None
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def exists(self, rel: str) -> bool:
        path = self.root / rel
        return self.read(rel) is not None or (path not in self.changes and path.exists())

    def put(self, rel: str, content):
        self.changes[self.root / rel] = content


def _scale(data, pattern, factor, prefix=""):
    """Multiply the numbers whose dotted key path (list items by index: results.0.busbw_gbs) matches."""
    if isinstance(data, dict):
        return {k: _scale(v, pattern, factor, f"{prefix}.{k}" if prefix else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [_scale(v, pattern, factor, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(data)]
    if isinstance(data, (int, float)) and not isinstance(data, bool) and pattern.search(prefix):
        return round(data * factor, 6)
    return data


def _bar(text: str, edit: dict, gctx: dict) -> str:
    gpu = gctx["gpu"]
    index = gpu["vram_bar"] if edit["bar"] == "vram" else edit["bar"]
    lines = text.splitlines()
    start, end, flags = (int(x, 16) for x in lines[index].split())
    size = end - start + 1 if edit.get("size", "keep") == "keep" else hardware_trees.parse_size(edit["size"])
    if "base" in edit:
        start = edit["base"] + edit.get("stride", 0) * gctx["index"]
    lines[index] = f"0x{start:016x} 0x{start + size - 1:016x} 0x{flags:016x}"
    return "\n".join(lines) + "\n"


def _plan_edit(view: _View, edit: dict, profile: dict) -> None:
    op = next(op for op in OPS if op in edit)
    for base, ctx in _targets(edit, profile):
        rel = base + _fill(edit[op], ctx) if op != "bar" else base + "resource"
        text = view.read(rel)
        if op == "set":
            view.put(rel, _fill(edit["content"], ctx))
        elif op == "remove":
            if view.exists(rel):
                view.put(rel, None)
        elif op == "copy":
            if text is not None:
                view.put(base + _fill(edit["to"], ctx), text)
        elif text is None:
            continue
        elif op == "replace":
            view.put(rel, re.sub(edit["pattern"], _fill(edit["with"], ctx), text, flags=re.M))
        elif op == "scale":
            scaled = _scale(json.loads(text), re.compile(edit["keys"]), edit["factor"])
            view.put(rel, json.dumps(scaled, indent=2) + "\n")
        elif op == "bar":
            view.put(rel, _bar(text, edit, ctx))


def plan(fault_name: str, tree: Path, profile: dict) -> list:
    """The changes FAULT_NAME makes to TREE (a host's evidence root); [] when it changes nothing."""
    fault = get_fault(fault_name)
    vendors = fault.get("vendors")
    if vendors and profile["vendor"] not in vendors:
        raise UserError(
            f"fault {fault_name!r} is for {'/'.join(vendors)} GPUs; profile {profile['name']} has {profile['vendor']}"
        )
    view = _View(Path(tree))
    for edit in fault["edits"]:
        _plan_edit(view, edit, profile)
    changes = []
    for path, content in view.changes.items():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if content != current or (content is None and path.exists()):
            changes.append(Change(path, content))
    return changes


def apply(changes: list) -> None:
    for change in changes:
        if change.content is None:
            if change.path.is_dir() and not change.path.is_symlink():
                shutil.rmtree(change.path)
            elif change.path.exists() or change.path.is_symlink():
                change.path.unlink()
        else:
            change.path.parent.mkdir(parents=True, exist_ok=True)
            change.path.write_text(change.content, encoding="utf-8")


def describe(fault_name: str, profile: dict) -> str:
    fault = get_fault(fault_name)
    kernel = profile["kernel"]
    ctx = {"release": kernel["release"], "upgraded_release": kernel.get("upgraded_release", "")}
    return " ".join(_fill(fault["description"], dict(ctx, bdf="", index="", port="")).split())
