#!/usr/bin/env python3
"""Benchmark converging N fresh twins at once against converging one (one build per group), beside the executor floor.

Run as root from the checkout:
  .venv/bin/python benchmarks/fleet_converge.py [--rig x99-3080] [--hosts 4] [--address-block 9]

For 1 and then N hosts of --rig (all twins: one inventory group), each in a temporary state directory of its own
and lab address block --address-block (127.B.x.x; loopback only): `provision lab up`, then one timed `provision
site.yml -i <the lab's inventory>` of the fresh hosts (kernel install and its reboot, the driver's DKMS build, the
CUDA wheels, the group's builds, the SGLang venv, the serve units), then `lab down`. Printed: each converge's seconds
and tasks, how many hosts built the group's builds (roles/group_build: one builds, the others install its archive)
and the executor floor on the same lab: one play of the same number of ansible.builtin.ping tasks on all its hosts
(what the executor alone costs for that many hosts and tasks). Target (issue 24): N twins within 1.5x one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.5
BUILD_LOGS = ("/opt/rigbook/nccl-tests/.nccl-tests-build.log", "/opt/rigbook/rccl/.rccl-build.log")


def provision(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigbook", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)


def tasks_of(run_json: str) -> int:
    """Tasks run on the busiest host of the converge (ok, which counts changed, + skipped + failed; `--json`)."""
    import json

    hosts = json.loads(run_json)["hosts"].values()
    return max(sum(int(h.get(k) or 0) for k in ("ok", "skipped", "failed")) for h in hosts)


def ping_floor(inventory: str, tasks: int) -> float:
    """Seconds of one play of TASKS ansible.builtin.ping tasks on every host of INVENTORY, run as provision runs."""
    import ansible_runner

    from rigbook.run import ansible_env

    with tempfile.TemporaryDirectory(prefix="bench-fleet-floor-") as private:
        book = Path(private) / "ping.yml"
        book.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n" + "    - ansible.builtin.ping:\n" * tasks)
        env = ansible_env(mitogen=False)
        started = time.monotonic()
        runner = ansible_runner.run(private_data_dir=private, playbook=str(book), inventory=inventory, envvars=env,
                                    quiet=True, fact_cache_type=env.get("ANSIBLE_CACHE_PLUGIN", "jsonfile"))
        elapsed = time.monotonic() - started
    if runner.rc != 0:
        sys.exit(f"the ping play failed (rc {runner.rc})")
    return elapsed


def builders(hosts: list) -> list:
    """The hosts with a build log of a group build (they compiled; the others installed the archive)."""
    from rigbook.lab import machine, state

    lab = state.load()
    found = []
    for name in hosts:
        probe = subprocess.run(machine.ssh_command(lab.host(name), " || ".join(f"test -e {p}" for p in BUILD_LOGS)),
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0:
            found.append(name)
    return found


def converge(rig: str, count: int, block: int) -> dict:
    """Bring up COUNT fresh hosts of RIG, converge them with one site.yml run, measure the floor, take them down."""
    os.environ["RIGBOOK_STATE_DIR"] = tempfile.mkdtemp(prefix=f"rigbook-bench-fleet-{count}-")
    up = provision("lab", "up", "--hosts", str(count), "--rig", *([rig] * count), "--address-block", str(block))
    if up.returncode != 0:
        sys.exit(up.stdout[-2000:] + up.stderr[-2000:])
    inventory = str(Path(os.environ["RIGBOOK_STATE_DIR"]) / "lab" / "inventory")
    try:
        from rigbook.lab import state

        hosts = [h.name for h in state.load().hosts]
        started = time.monotonic()
        site = provision("site.yml", "-i", inventory, "--json")
        seconds = time.monotonic() - started
        if site.returncode != 0:
            sys.exit(f"converge of {count} failed: {site.stdout[-3000:]}{site.stderr[-3000:]}")
        tasks = tasks_of(site.stdout)
        return {"hosts": hosts, "seconds": seconds, "tasks": tasks, "floor": ping_floor(inventory, tasks),
                "builders": builders(hosts)}
    finally:
        down = provision("lab", "down")
        if down.returncode != 0:
            print(down.stdout + down.stderr, file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rig", default="x99-3080", help="lab rig of the twins (x99-3080, x99-r9700)")
    parser.add_argument("--hosts", type=int, default=4, help="twins converged at once")
    parser.add_argument("--address-block", type=int, default=9, help="lab address block (127.B.x.x)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (lab hosts)")
    if args.hosts < 2:
        sys.exit("--hosts: at least 2")
    sys.path.insert(0, str(REPO / "src"))
    results = {count: converge(args.rig, count, args.address_block) for count in (1, args.hosts)}
    for count, r in results.items():
        print(f"{count} fresh {args.rig} host(s): site.yml {r['seconds']:.1f} s, {r['tasks']} tasks per host; "
              f"built by {', '.join(r['builders']) or 'none'}; executor floor (a play of {r['tasks']} pings on "
              f"{count} host(s)): {r['floor']:.1f} s")
    one, many = results[1], results[args.hosts]
    ratio = many["seconds"] / one["seconds"]
    print(f"{args.hosts} twins / one: {ratio:.2f}x (target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'}); "
          f"the executor floor alone: {many['floor'] / one['floor']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
