#!/usr/bin/env python3
"""Benchmark the lab: first rootfs build, `lab up` of 2 hosts from the cached rootfs, memory per host.

Run as root from the checkout:  .venv/bin/python benchmarks/lab_up.py [--runs 3] [--skip-first-build]

Targets (the lab issue): `lab up` of 2 hosts from the cache under 60 s, under 150 MB RSS per
running host. The first build goes to a fresh temporary cache (RIGBOOK_LAB_CACHE) so it measures a
real debootstrap; --skip-first-build uses the normal cache instead. Everything runs in a temporary
state directory and is brought down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_UP_S = 60.0
TARGET_RSS_MB = 150.0


def provision(*args: str, env: dict) -> tuple:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rigbook", *args], capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        why = proc.stderr.strip() or proc.stdout[-500:]
        sys.exit(f"`provision {' '.join(args)}` failed ({proc.returncode}): {why}")
    return elapsed, proc.stdout


def first_build(env: dict) -> float:
    code = ("import time; from rigbook.lab import rootfs, system; system.ensure_tools(); p = rootfs.plan(); "
            "t = time.monotonic(); rootfs.build(p); print(time.monotonic() - t)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"rootfs build failed: {proc.stderr.strip()[-500:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def memory(env: dict) -> dict:
    code = ("import json; from rigbook.lab import state, tracking; "
            "print(json.dumps({h.name: tracking.rss_kib(h) for h in state.load().hosts}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return {name: kib / 1024 for name, kib in json.loads(proc.stdout).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="lab up/down cycles to time (default 3)")
    parser.add_argument("--skip-first-build", action="store_true", help="use the normal rootfs cache")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait before reading memory")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("benchmarks/lab_up.py needs root (it boots lab hosts)")
    state_dir = tempfile.mkdtemp(prefix="rigbook-bench-state-")
    env = dict(os.environ, RIGBOOK_STATE_DIR=state_dir)
    cache = None
    results: dict = {}
    try:
        if not args.skip_first_build:
            cache = tempfile.mkdtemp(prefix="rigbook-bench-cache-", dir="/var/tmp")
            env["RIGBOOK_LAB_CACHE"] = cache
            print("first build of the rootfs (debootstrap) into a fresh cache ...", flush=True)
            results["first_build_s"] = round(first_build(env), 1)
            print(f"  first build: {results['first_build_s']:.1f} s", flush=True)
        else:
            provision("lab", "up", env=env)  # make sure the cache exists before timing
            provision("lab", "down", env=env)
        ups, downs, rss = [], [], {}
        for run in range(args.runs):
            up_s, _ = provision("lab", "up", env=env)
            ups.append(up_s)
            if run == 0:
                time.sleep(args.settle)
                rss = memory(env)
            down_s, _ = provision("lab", "down", env=env)
            downs.append(down_s)
            print(f"  run {run + 1}: lab up {up_s:.1f} s, lab down {down_s:.1f} s", flush=True)
        results.update(
            lab_up_2_hosts_s={"median": round(statistics.median(ups), 2), "min": round(min(ups), 2),
                              "max": round(max(ups), 2), "runs": len(ups)},
            lab_down_s={"median": round(statistics.median(downs), 2)},
            rss_mb_per_host={k: round(v, 1) for k, v in rss.items()},
        )
    finally:
        subprocess.run([sys.executable, "-m", "rigbook", "lab", "down"], capture_output=True, env=env)
        shutil.rmtree(state_dir, ignore_errors=True)
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    up = results["lab_up_2_hosts_s"]["median"]
    worst = max(results["rss_mb_per_host"].values())
    print()
    if "first_build_s" in results:
        print(f"first rootfs build (debootstrap + configure): {results['first_build_s']:.1f} s")
    print(f"lab up, 2 hosts, cached rootfs: median {up:.2f} s over {args.runs} runs "
          f"(target < {TARGET_UP_S:.0f} s: {'ok' if up < TARGET_UP_S else 'MISSED'})")
    for name, mb in results["rss_mb_per_host"].items():
        print(f"memory {name}: {mb:.1f} MB RSS (container + nspawn + supervisor)")
    print(f"worst host {worst:.1f} MB RSS (target < {TARGET_RSS_MB:.0f} MB: "
          f"{'ok' if worst < TARGET_RSS_MB else 'MISSED'})")
    print(f"lab down: median {results['lab_down_s']['median']:.2f} s")
    print(json.dumps(results))
    return 0 if up < TARGET_UP_S and worst < TARGET_RSS_MB else 1


if __name__ == "__main__":
    sys.exit(main())
