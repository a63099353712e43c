"""Per-run folders under the state directory, and `provision runs`."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from rigbook.paths import runs_dir

RECORD = "run.json"


def new_run_dir(playbook: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = runs_dir() / f"{stamp}-{playbook.stem}-{secrets.token_hex(3)}"
    path.mkdir(parents=True, mode=0o700)  # a run's artifacts hold its events and variables: the user's alone
    os.chmod(path, 0o700)
    return path


def save_record(run_dir: Path, record: dict) -> None:
    """Write RUN_DIR/run.json atomically: a run killed while writing it leaves the previous record, not half of one."""
    from rigbook.statefile import write_json_atomic

    write_json_atomic(run_dir / RECORD, record, default=str)


def recent(limit: int = 20) -> list:
    base = runs_dir()
    if not base.is_dir():
        return []
    records = []
    for path in sorted(base.iterdir(), reverse=True):
        record_file = path / RECORD
        if not record_file.is_file():
            records.append({"dir": str(path), "exit_code": None, "playbook": "?", "started": "?"})
        else:
            try:
                record = json.loads(record_file.read_text())
            except (OSError, ValueError):
                record = {"exit_code": None, "playbook": "?", "started": "?"}
            record["dir"] = str(path)
            records.append(record)
        if len(records) >= limit:
            break
    return records


def print_recent(limit: int, stream) -> int:
    records = recent(limit)
    if not records:
        print(f"no runs yet under {runs_dir()}", file=stream)
        return 0
    for r in records:
        hosts = r.get("hosts") or {}
        failed = sorted(h for h, e in hosts.items() if e.get("state") in ("failed", "unreachable"))
        status = {0: "ok", 1: "failed", 2: "bad input", 3: "unreachable", 130: "interrupted"}.get(
            r.get("exit_code"), "unfinished"
        )
        extra = f"  failed: {', '.join(failed)}" if failed else ""
        print(
            f"{r.get('started', '?')}  {status:<11} {r.get('playbook', '?')} -i {r.get('inventory', '?')}"
            f"  hosts={len(hosts)}{extra}\n    {r['dir']}",
            file=stream,
        )
    return 0
