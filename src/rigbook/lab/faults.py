"""Faults as data (faults.yml): validate them, plan their edits on a tree, apply the plan.

Planning reads every file a fault touches and computes the new contents first; nothing is
written until the whole plan is known, so a fault either applies completely or not at all.

Most faults edit the host's evidence tree. `scope: host` edits act on the host's own files instead (the GPU
environment file, the RCCL prefix), relative to its root: file edits as above, and `run: SCRIPT`, a shell script run
inside the running host (by the runner `apply` gets; `lab break` runs it over SSH as root) when the host has the
file `needs:` names. Every host file a fault changes (and each `backup:` file of a script) is saved first into a
backup directory, which `restore` (`lab heal`) writes back.
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
OPS = ("set", "replace", "remove", "copy", "scale", "bar", "run")
EVIDENCE_ROOT = "var/lib/rigbook-lab/evidence"  # where a host's tree sits inside its root (state.EVIDENCE_ROOT)
ABSENT = ".rigbook-absent"  # a backup marker: the file did not exist before the fault
_PLACEHOLDER = re.compile(r"\{(release|upgraded_release|bdf|index|port)\}")

_EDIT_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "scope": {"enum": ["tree", "gpus", "ports", "slots", "host"]},
        "gpus": {"oneOf": [{"const": "all"}, {"type": "array", "minItems": 1,
                                               "items": {"type": ["integer", "string"]}}]},
        **{op: {"type": "string", "minLength": 1} for op in OPS if op != "bar"},
        "needs": {"type": "string", "minLength": 1},
        "backup": {"type": "array", "items": {"type": "string", "minLength": 1}},
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
                # the verdict the fault gives at its layer when not fail (a rising correctable count warns)
                "status": {"enum": ["warn"]},
                # systemd units (patterns) restarted after the fault is applied and after `lab heal`: a program
                # that reads its recorded behaviour once, at start (the lab's engine stand-in)
                "restart_units": {"type": "array", "minItems": 1,
                                  "items": {"type": "string", "pattern": "^[A-Za-z0-9@._*-]+$"}},
                # a fault that would change nothing a verify reads on a host that has PATH (relative to its root)
                "refused_when_host_has": {
                    "type": "object", "additionalProperties": False, "required": ["path", "because"],
                    "properties": {"path": {"type": "string", "minLength": 1},
                                   "because": {"type": "string", "minLength": 10}},
                },
                "edits": {"type": "array", "minItems": 1, "items": _EDIT_SCHEMA},
            },
        },
    }},
}
# What each operation needs besides its own key.
_NEEDS = {"set": {"content"}, "replace": {"pattern", "with"}, "remove": set(), "copy": {"to"},
          "scale": {"keys", "factor"}, "bar": set(), "run": {"needs"}}


def layer_names() -> list:
    """The ladder's layers in order, from the collection's layer registry (a fault names the layer it fails)."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
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
            if ops[0] == "run" and edit.get("scope") != "host":
                raise ValueError(f"faults: {name}/edits/{i}: run works with scope: host only")
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
    host_root: Path | None = None  # set for a host file (backed up before it is changed)
    run: str | None = None  # a script to run inside the host (PATH is then the host root)
    backup: tuple = ()  # host-relative files a script changes (backed up before it runs)


def _fill(text: str, ctx: dict) -> str:
    return _PLACEHOLDER.sub(lambda m: str(ctx[m.group(1)]), text)


def _targets(edit: dict, rig: dict) -> list:
    """(base directory relative to the tree root, placeholder context) for each place the edit hits."""
    kernel = rig["kernel"]
    ctx = {"release": kernel["release"], "upgraded_release": kernel.get("upgraded_release", kernel["release"]),
           "bdf": "", "index": "", "port": ""}
    scope = edit.get("scope", "tree")
    if scope in ("tree", "host"):
        return [("", ctx)]
    wanted = edit.get("gpus", "all")
    out = []
    for index, gpu in enumerate(hardware_trees.gpus(rig)):
        if wanted != "all" and index not in wanted and gpu["bdf"] not in wanted:
            continue
        gctx = dict(ctx, bdf=gpu["bdf"], index=index, port=gpu["port"], gpu=gpu)
        if scope == "gpus":
            out.append((hardware_trees.device_dir(gpu) + "/", gctx))
        elif scope == "slots":
            out.append((gpu["slot_path"] + "/", gctx))
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


def _plan_edit(view: _View, edit: dict, rig: dict) -> None:
    op = next(op for op in OPS if op in edit)
    for base, ctx in _targets(edit, rig):
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


def host_root_of(tree: Path) -> Path | None:
    """The host root a lab host's evidence tree sits in (None for a tree elsewhere: no host files to edit)."""
    tree = Path(tree)
    parts = EVIDENCE_ROOT.split("/")
    return tree.parents[len(parts) - 1] if tree.parts[-len(parts):] == tuple(parts) else None


def plan(fault_name: str, tree: Path, rig: dict, host_root: Path | None = None) -> list:
    """The changes FAULT_NAME makes to TREE (a host's evidence root) and to the host's files (HOST_ROOT, default the
    root TREE sits in); [] when it changes nothing."""
    fault = get_fault(fault_name)
    vendors = fault.get("vendors")
    if vendors and rig["vendor"] not in vendors:
        raise UserError(
            f"fault {fault_name!r} is for {'/'.join(vendors)} GPUs; rig {rig['name']} has {rig['vendor']}"
        )
    host_root = Path(host_root) if host_root else host_root_of(tree)
    refused = fault.get("refused_when_host_has")
    if refused and host_root and (host_root / refused["path"]).exists():
        raise UserError(f"fault {fault_name!r} would change nothing this host's verify reads: {refused['because']}")
    view = _View(Path(tree))
    host_view = _View(host_root) if host_root else None
    runs = []
    for edit in fault["edits"]:
        if edit.get("scope") != "host":
            _plan_edit(view, edit, rig)
        elif host_view is None:
            continue
        elif "run" in edit:
            if (host_root / edit["needs"]).exists():
                runs.append(Change(host_root, None, host_root, edit["run"], tuple(edit.get("backup") or ())))
        else:
            _plan_edit(host_view, edit, rig)
    changes = []
    for v, root in ((view, None), (host_view, host_root)):
        for path, content in (v.changes.items() if v else ()):
            current = path.read_text(encoding="utf-8") if path.is_file() else None
            if content != current or (content is None and path.exists()):
                changes.append(Change(path, content, root))
    return changes + runs


def _save(host_root: Path, path: Path, backup_dir: Path) -> None:
    """Keep PATH's content (or that it was absent) under BACKUP_DIR, once: the state before the first fault."""
    rel = path.relative_to(host_root)
    saved, absent = backup_dir / rel, backup_dir / (str(rel) + ABSENT)
    if saved.exists() or absent.exists():
        return
    saved.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        shutil.copy2(path, saved)  # follows links: the file a link names is what is restored, with its mode
    else:
        absent.write_text("")


def backup_paths(host_root: Path, rels) -> list:
    """The host files a script's `backup:` entries name: an entry may have `*` in its folders (a venv's name), expanded
    on the host; the file itself need not exist yet (then its absence is what `lab heal` restores)."""
    found = []
    for rel in rels:
        parts = rel.split("/")
        globbed = [i for i, part in enumerate(parts[:-1]) if any(c in part for c in "*?[")]
        if not globbed:
            found.append(host_root / rel)
            continue
        cut = globbed[-1] + 1
        found += [folder / "/".join(parts[cut:]) for folder in sorted(host_root.glob("/".join(parts[:cut])))
                  if folder.is_dir()]
    return found


def restore(backup_dir: Path, host_root: Path) -> list:
    """Write back every host file saved under BACKUP_DIR (remove those that were absent); the paths restored."""
    done = []
    if not backup_dir.is_dir():
        return done
    for saved in sorted(p for p in backup_dir.rglob("*") if p.is_file()):
        rel = saved.relative_to(backup_dir)
        if rel.name.endswith(ABSENT):
            target = host_root / str(rel)[:-len(ABSENT)]
            if target.is_file() or target.is_symlink():
                target.unlink()
        else:
            target = host_root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(saved, target)  # its mode too: a program comes back executable
        done.append(target)
    shutil.rmtree(backup_dir)
    return done


def apply(changes: list, runner=None, backup_dir: Path | None = None) -> None:
    """Write CHANGES; host files are saved into BACKUP_DIR first; scripts run through RUNNER(script)."""
    for change in changes:
        if change.host_root is not None and backup_dir is not None:
            for path in (backup_paths(change.host_root, change.backup) if change.run else [change.path]):
                _save(change.host_root, path, backup_dir)
        if change.run is not None:
            if runner is None:
                raise UserError("this fault runs a script inside the host: no runner given")
            runner(change.run)
        elif change.content is None:
            if change.path.is_dir() and not change.path.is_symlink():
                shutil.rmtree(change.path)
            elif change.path.exists() or change.path.is_symlink():
                change.path.unlink()
        else:
            change.path.parent.mkdir(parents=True, exist_ok=True)
            change.path.write_text(change.content, encoding="utf-8")


def restart_script(fault_names) -> str | None:
    """The shell script that restarts the units FAULT_NAMES name in restart_units (None: none to restart); units of
    a pattern that matches no loaded unit are skipped."""
    units = sorted({u for name in fault_names for u in get_fault(name).get("restart_units") or ()})
    if not units:
        return None
    quoted = " ".join(f"'{u}'" for u in units)
    # By the unit files on disk: a glob given to `systemctl restart` only matches units loaded in memory, and a
    # unit that failed (a crash loop's start limit) is unloaded once reset-failed
    return (f"units=$(systemctl list-unit-files --no-legend {quoted} | awk '{{print $1}}'); "
            '[ -z "$units" ] || { systemctl reset-failed $units 2>/dev/null; systemctl restart $units; }')


def describe(fault_name: str, rig: dict) -> str:
    fault = get_fault(fault_name)
    kernel = rig["kernel"]
    ctx = {"release": kernel["release"], "upgraded_release": kernel.get("upgraded_release", "")}
    return " ".join(_fill(fault["description"], dict(ctx, bdf="", index="", port="")).split())
