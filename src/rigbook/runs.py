"""Per-run folders under the state directory, and `provision runs`."""

from __future__ import annotations

import os
import re
import secrets
import sys
import time
from pathlib import Path

from rigbook.errors import UserError
from rigbook.paths import inventory_key, runs_dir
from rigbook.statefile import private_dir, read_json, write_json_atomic
from rigbook.terminal import terminal_safe

RECORD = "run.json"
INVENTORY_KEY = re.compile(r"[0-9a-f]{16}")  # what paths.inventory_key gives


def new_run_dir(playbook: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = private_dir(runs_dir()) / f"{stamp}-{playbook.stem}-{secrets.token_hex(3)}"
    path.mkdir(mode=0o700)  # a run's artifacts hold its events and variables: the user's alone
    os.chmod(path, 0o700)
    return path


def save_record(run_dir: Path, record: dict) -> None:
    """Write RUN_DIR/run.json atomically: a run killed while writing it leaves the previous record, not half of one."""
    write_json_atomic(run_dir / RECORD, record, default=str)


class BadRecord(UserError):
    """A run.json that is unreadable or not a run record's shape: names the file and what is wrong (exit 2)."""

    def __init__(self, path: Path, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"run record {path} is unusable: {problem}")


def _type(value) -> str:
    return type(value).__name__


def _list_of_objects(value, what: str) -> str | None:
    if value is None or (isinstance(value, list) and all(isinstance(item, dict) for item in value)):
        return None
    return f"{what} is not a list of objects"


def _host_problem(host: str, entry) -> str | None:
    if not isinstance(entry, dict):
        return f"hosts.{host} is not an object but {_type(entry)}"
    if entry.get("state") is not None and not isinstance(entry["state"], str):
        return f"hosts.{host}.state is not a string but {_type(entry['state'])}"
    for key in ("ladder", "failures"):
        problem = _list_of_objects(entry.get(key), f"hosts.{host}.{key}")
        if problem:
            return problem
    for number, verdict in enumerate(entry.get("ladder") or []):
        for key in ("layer", "status"):
            if verdict.get(key) is not None and not isinstance(verdict[key], str):
                return f"hosts.{host}.ladder[{number}].{key} is not a string but {_type(verdict[key])}"
    return None


def record_problem(record) -> str | None:
    """What is wrong with the shape of a run record, or None: the one place that decides it, so `provision runs`,
    the report and `provision diff` use what they read as it is."""
    if not isinstance(record, dict):
        return f"not a JSON object but {_type(record)}"
    for key in ("playbook", "inventory", "inventory_key", "started", "limit"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is not a string but {_type(record[key])}"
    code = record.get("exit_code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        return f"exit_code is not a whole number but {_type(code)}"
    hosts = record.get("hosts")
    if hosts is None:
        return None
    if not isinstance(hosts, dict):
        return f"hosts is not an object but {_type(hosts)}"
    for host, entry in hosts.items():
        problem = _host_problem(host, entry)
        if problem:
            return problem
    return None


def inventory_key_of(record: dict) -> str | None:
    """The inventory key (paths.inventory_key) of the run RECORD (a sound one: record_problem passed): the key it
    recorded; for a record written before runs recorded one, the key of the inventory path it names when that path
    is absolute (run.py always wrote it resolved), else None: a run of no known inventory, shown for none."""
    key = record.get("inventory_key")
    if isinstance(key, str) and INVENTORY_KEY.fullmatch(key):
        return key
    given = record.get("inventory")
    return inventory_key(given) if key is None and isinstance(given, str) and os.path.isabs(given) else None


def read_record(run_dir: Path) -> dict | None:
    """RUN_DIR's run record with "dir" (the folder) added; None when the run wrote none; BadRecord naming the file
    and the problem when it cannot be read, is not UTF-8 JSON or not a run record's shape."""
    path = Path(run_dir) / RECORD
    try:
        record, problem = read_json(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadRecord(path, f"cannot read: {exc.strerror or exc}") from None
    problem = problem or record_problem(record)
    if problem:
        raise BadRecord(path, problem)
    return {**record, "dir": str(run_dir)}


def run_dirs() -> list:
    """The run folders, newest first (by name: each starts with its local start time)."""
    base = runs_dir()
    if not base.is_dir():
        return []
    return sorted((path for path in base.iterdir() if path.is_dir()), reverse=True)


def read_records(dirs=None) -> tuple:
    """([record], [BadRecord]) of DIRS (default: every run folder, newest first); a folder without a record is left
    out, a bad one is in the second list (the caller warns about it and goes on)."""
    found, bad = [], []
    for path in run_dirs() if dirs is None else dirs:
        try:
            record = read_record(path)
        except BadRecord as exc:
            bad.append(exc)
            continue
        if record is not None:
            found.append(record)
    return found, bad


def recent(limit: int = 20, warn=None) -> list:
    """The LIMIT newest runs, newest first; a run without a record is listed unfinished; a bad record is named
    through WARN (a line for stderr) and listed with exit_code "bad record"."""
    records = []
    for path in run_dirs():
        try:
            record = read_record(path)
        except BadRecord as exc:
            if warn:
                warn(f"warning: {exc}; listed as a bad record")
            record = {"dir": str(path), "exit_code": "bad record", "playbook": "?", "started": "?"}
        if record is None:
            record = {"dir": str(path), "exit_code": None, "playbook": "?", "started": "?"}
        records.append(record)
        if len(records) >= limit:
            break
    return records


def print_recent(limit: int, stream) -> int:
    """`provision runs`: the LIMIT newest runs, each line terminal_safe (a run record is a state file: a host name or
    path in it never moves the cursor or writes the clipboard)."""
    records = recent(limit, warn=lambda line: print(terminal_safe(line), file=sys.stderr))
    if not records:
        print(terminal_safe(f"no runs yet under {runs_dir()}"), file=stream)
        return 0
    for r in records:
        hosts = r.get("hosts") or {}
        failed = sorted(h for h, e in hosts.items() if e.get("state") in ("failed", "unreachable"))
        code = r.get("exit_code")
        status = code if code == "bad record" else {0: "ok", 1: "failed", 2: "bad input", 3: "unreachable",
                                                    4: "busy", 130: "interrupted"}.get(code, "unfinished")
        extra = f"  failed: {', '.join(failed)}" if failed else ""
        print(terminal_safe(f"{r.get('started', '?')}  {status:<11} {r.get('playbook', '?')} -i "
                            f"{r.get('inventory', '?')}  hosts={len(hosts)}{extra}"), file=stream)
        print(terminal_safe(f"    {r['dir']}"), file=stream)
    return 0
