"""Benchmark: time of the five static P2P-ladder layers on one host (target: under 3 s for all five).

By default on the lab host lab-r9700 (brings the lab up if it is not; root needed); --inventory/--host pick
another host, e.g. a real GPU box over a local connection. Times, median of RUNS:
  1. `provision verify -i INV --limit HOST --tags <the five static layers>`, the whole command
     (ansible-playbook start, connection, the ladder task, summary);
  2. the ladder task alone (rigbook.homelab.ladder, phase static: the five layers in one module run), from
     ansible-runner's per-task event timestamps of that run;
  3. collect + judge in-process (no Ansible, the same climb): the lab host's recorded tree, or / here.
Run: .venv/bin/python benchmarks/ladder_static.py [RUNS] [--inventory INV --host HOST]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

TARGET_S = 3.0


def provision(*args):
    return subprocess.run([sys.executable, "-m", "rigbook", *args], capture_output=True, text=True)


def task_seconds(run_dir: Path) -> float:
    """Sum of the ladder tasks' durations, from the runner's job events."""
    total = 0.0
    for event_file in (run_dir / "artifacts").glob("*/job_events/*.json"):
        event = json.loads(event_file.read_text())
        data = event.get("event_data") or {}
        done = event.get("event") in ("runner_on_ok", "runner_on_failed")
        if done and str(data.get("task", "")).startswith("Ladder"):
            start = datetime.fromisoformat(data["start"])
            end = datetime.fromisoformat(data["end"])
            total += (end - start).total_seconds()
    return total


def timed_run(*args) -> tuple:
    """(wall seconds, ladder task seconds, summary) of one `provision ... --json` run."""
    start = time.perf_counter()
    proc = provision(*args, "--json")
    wall = time.perf_counter() - start
    if not proc.stdout.strip():
        sys.exit(f"provision {' '.join(args)} gave no summary: {proc.stderr.strip()[-1500:]}")
    summary = json.loads(proc.stdout)
    return wall, task_seconds(Path(summary["run_dir"])), summary


def static_layers() -> list:
    from rigbook.paths import link_collection

    link_collection()
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

    return registry.of_phase(registry.STATIC)


def in_process_seconds(inventory: str, host: str) -> tuple:
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import Context, climb

    from rigbook.run import resolve_inventory
    from rigbook.snapshots import ladder_view_of
    from rigbook.validate import validate

    inv = validate(resolve_inventory(inventory))
    ladder_view = ladder_view_of(inv, host)
    if inventory == "lab":
        from rigbook.lab.hardware_trees import materialize

        root, where = str(materialize("x99-r9700", Path(tempfile.mkdtemp()) / "t")), "the recorded x99-r9700 tree"
    else:
        root, where = "/", "/ of this machine"
    layers = static_layers()
    start = time.perf_counter()
    for _ in range(20):
        climb(layers, Context(root, ladder_view), stop_at_fail=False)
    return (time.perf_counter() - start) / 20, where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=5)
    parser.add_argument("--inventory", default="lab")
    parser.add_argument("--host", default="lab-r9700")
    args = parser.parse_args()
    started_lab = False
    if args.inventory == "lab" and "running" not in provision("lab", "status").stdout:
        up = provision("lab", "up")
        if up.returncode != 0:
            print(f"lab up failed: {up.stderr.strip()}")
            return 1
        started_lab = True
    try:
        one = []
        static = [layer.name for layer in static_layers()]
        for _ in range(args.runs):
            wall, task, summary = timed_run("verify", "-i", args.inventory, "--limit", args.host,
                                            "--tags", ",".join(static))
            layers = [v["layer"] for v in summary["hosts"][args.host].get("ladder", [])]
            if layers != static:
                sys.exit(f"expected the static verdicts {static}, got {layers}: {summary['hosts'][args.host]}")
            one.append((wall, task))
        in_process, where = in_process_seconds(args.inventory, args.host)
        wall, task = (statistics.median(x) for x in zip(*one))
        print(f"static ladder on {args.host} (inventory {args.inventory}), median of {args.runs} runs:")
        print(f"  whole `provision verify` command: {wall:.2f} s ({wall / TARGET_S:.2f}x of the {TARGET_S:.0f} s "
              "target; includes ansible-playbook start-up)")
        print(f"  the static-ladder task:           {task:.2f} s ({task / TARGET_S:.2f}x of target, "
              f"{task / len(static):.2f} s per layer)")
        print(f"  collect + judge in-process:       {in_process * 1000:.1f} ms ({where})")
    finally:
        if started_lab:
            provision("lab", "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
