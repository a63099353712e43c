"""Benchmark: time of the five static P2P-ladder layers on one lab host (target: under 3 s for all five).

Brings the lab up if it is not (root needed), then times, for lab-r9700:
  1. `provision verify -i lab --limit lab-r9700 --tags <the five static layers>`, the whole command
     (ansible-playbook start, SSH, five module runs, summary);
  2. the ladder task alone (rigbook.homelab.static_ladder: the five layers in one module run), from
     ansible-runner's per-task event timestamps of that run;
  3. collect + judge in-process on the same recorded tree (no Ansible), for comparison.
Run: .venv/bin/python benchmarks/ladder_static.py [RUNS]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

STATIC = "firmware,pcie_link,dma_window,kernel_state,driver_state"
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


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    started_lab = False
    if provision("lab", "status").returncode != 0 or "running" not in provision("lab", "status").stdout:
        up = provision("lab", "up")
        if up.returncode != 0:
            print(f"lab up failed: {up.stderr.strip()}")
            return 1
        started_lab = True
    try:
        walls, tasks = [], []
        for _ in range(runs):
            start = time.perf_counter()
            proc = provision("verify", "-i", "lab", "--limit", "lab-r9700", "--tags", STATIC, "--json")
            walls.append(time.perf_counter() - start)
            summary = json.loads(proc.stdout)
            assert len(summary["hosts"]["lab-r9700"]["ladder"]) == 5, summary
            tasks.append(task_seconds(Path(summary["run_dir"])))
        from rigbook.lab.evidence import materialize
        from rigbook.paths import collections_path
        from rigbook.snapshots import profile_of
        from rigbook.validate import validate

        collections_path()
        from ansible_collections.rigbook.homelab.plugins.module_utils import evidence, ladder_static

        tree = materialize("x99-r9700", Path(tempfile.mkdtemp()) / "t")
        profile = profile_of(validate("inventory/lab"), "lab-r9700")
        start = time.perf_counter()
        for _ in range(100):
            ladder_static.judge_all(evidence.collect_static(str(tree)), profile)
        in_process = (time.perf_counter() - start) / 100
        wall, task = statistics.median(walls), statistics.median(tasks)
        print(f"static ladder on lab-r9700, median of {runs} runs:")
        print(f"  whole `provision verify` command: {wall:.2f} s ({wall / TARGET_S:.2f}x of the {TARGET_S:.0f} s "
              "target; includes ansible-playbook start-up)")
        print(f"  the static-ladder task over SSH:  {task:.2f} s ({task / TARGET_S:.2f}x of target, "
              f"{task / 5:.2f} s per layer)")
        print(f"  collect + judge in-process:       {in_process * 1000:.1f} ms")
    finally:
        if started_lab:
            provision("lab", "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
