"""Benchmark: wall time of `provision --help` and `provision validate -i inventory/homelab`.

Targets (issue: foundation): --help under 0.5 s. Prints the median of N runs and the ratio to the target.
Run: .venv/bin/python benchmarks/cli_speed.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROVISION = [sys.executable, "-m", "rigbook"]
TARGETS = {"provision --help": 0.5, "provision validate -i inventory/homelab": 1.0}


def timed(args: list) -> float:
    start = time.perf_counter()
    proc = subprocess.run(PROVISION + args, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    cases = {"provision --help": ["--help"], "provision validate -i inventory/homelab": ["validate", "-i", "homelab"]}
    for name, args in cases.items():
        timed(args)  # warm the page cache
        samples = [timed(args) for _ in range(runs)]
        median = statistics.median(samples)
        target = TARGETS[name]
        print(
            f"{name}: median {median:.3f} s over {runs} runs (min {min(samples):.3f}, max {max(samples):.3f}); "
            f"target {target:.2f} s, ratio {median / target:.2f}x of target"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
