"""The `provision` command as a subprocess (`python -m rigbook`), and what a command changed: a listing of a folder
(to show that a command changed nothing there) and one value of an inventory file changed by a test."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


# --- the provision command ------------------------------------------------------------------------------------

def provision_argv(*args) -> list:
    return [sys.executable, "-m", "rigbook", *map(str, args)]


def provision(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """Run `provision ARGS` (as `python -m rigbook`) with this environment plus ENV; capture text output."""
    return subprocess.run(provision_argv(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# --- what a command changed ----------------------------------------------------------------------------------

def tree_listing(root: Path, skip=()) -> dict:
    """Every path under ROOT (links not followed; the paths in SKIP and what is under them left out) -> (its
    type, its mode, a file's sha256 or a link's target). Two listings are equal when nothing under ROOT was
    created, removed, rewritten, re-linked or re-moded."""
    skip = {Path(p) for p in skip}
    seen = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        for name in dirs + files:
            path = here / name
            if path in skip:
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                what = None
            seen[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), what)
    return seen


def changed_tasks(run_dir, changed_only: bool = True) -> dict:
    """{host: [(task name, its result)]} of the tasks that reported a change (or would, in check mode) in the run
    stored in RUN_DIR, in order (ansible-runner's job events); CHANGED_ONLY false: every task that ran ok."""
    events = []
    for path in Path(run_dir).glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        if event.get("event") == "runner_on_ok" and (
                not changed_only or (event["event_data"].get("res") or {}).get("changed")):
            events.append((event["counter"], event["event_data"]))
    found: dict = {}
    for _, data in sorted(events, key=lambda e: e[0]):
        found.setdefault(data["host"], []).append((data["task"], data["res"]))
    return found


# --- inventories edited by a test ---------------------------------------------------------------------------

def edit_yaml(path: Path, mutate) -> Path:
    """Load the YAML file PATH ({} when missing), let MUTATE change the data in place, write it back."""
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    mutate(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def set_key(dotted: str, value):
    """A mutation for edit_yaml: set the key path DOTTED (a.b.c, mappings made on the way) to VALUE."""
    def mutate(data):
        node = data
        keys = dotted.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value

    return mutate
