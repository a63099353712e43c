#!/usr/bin/env python3
"""Benchmark a converged re-run of site.yml on one lab host, three ways in the same run.

Run as root from the checkout:
  .venv/bin/python benchmarks/converged_rerun.py [--runs 1] [--mitogen 0.3.54] [--rig x99-r9700]
      [--modes rigbook,mitogen]

1. stock Ansible settings: no pipelining, no ControlPersist (ControlMaster=no), no fact cache;
2. rigbook's defaults (src/rigbook/run.py ansible_env(mitogen=False)): pipelining, ControlPersist, smart
   gathering with a jsonfile fact cache;
3. rigbook's defaults plus the mitogen strategy (mitogen_linear), mitogen installed into a cached
   --target directory (/var/cache/rigbook/mitogen-<version>; pip fetches it once).

It brings up one lab host of --rig (x99-3080: the NVIDIA play; x99-r9700: the AMD play) in a temporary
state directory, converges it once with site.yml (timed, not part of the comparison; the lab's artifacts are
prepared as `lab up` does, see docs/lab.md) and re-runs it once (the converge rebooted it: the roles that watch the
boot run once more; timed, not compared), then times each mode's re-run (which must report changed=0) and
prints seconds, seconds per task, each role's seconds (from the runner's task events), and the executor floor:
the same number of ansible.builtin.ping tasks in one play, run the same way. Then it splits the re-run into the roles
apart from the ladder and the ladder, each against the floor; the roles against the floor of the tasks they run when
none is skipped as converged (one more run with every role named by --tags; docs/converged.md). Targets: <= 0.1
s/task with mitogen, < 0.35 s/task without; roles apart from the ladder <= 0.5x that floor (1.0x with mitogen); a
whole converged re-run <= 12 s (8 s with mitogen).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rigbook.run import BUILDS_DIR

REPO = Path(__file__).resolve().parents[1]
TARGET_MITOGEN, TARGET_DEFAULTS = 0.1, 0.35


def provision(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigbook", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=1800)


def mitogen_dir(version: str) -> Path:
    target = Path(f"/var/cache/rigbook/mitogen-{version}")
    if not (target / "ansible_mitogen").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        f"mitogen=={version}"], check=True)
    return target


def mode_env(mode: str) -> dict:
    from rigbook.run import ansible_env

    env = ansible_env(mitogen=(mode == "mitogen"))
    if mode == "stock":
        for key in ("ANSIBLE_PIPELINING", "ANSIBLE_GATHERING", "ANSIBLE_CACHE_PLUGIN",
                    "ANSIBLE_CACHE_PLUGIN_CONNECTION", "ANSIBLE_CACHE_PLUGIN_TIMEOUT"):
            env.pop(key, None)
        env["ANSIBLE_PIPELINING"] = "False"
        env["ANSIBLE_SSH_ARGS"] = "-o ControlMaster=no"
        env["ANSIBLE_GATHERING"] = "implicit"
    if mode == "mitogen" and env.get("ANSIBLE_STRATEGY") != "mitogen_linear":
        from rigbook.run import mitogen_strategy

        sys.exit(f"mitogen was asked for but is not usable here: {mitogen_strategy()[1]}")
    return env


def play(mode: str, inventory: str, playbook: Path, host: str, tags: str | None = None) -> tuple:
    """(seconds, return code, tasks run on the host, changed, {role: seconds}) of one run of PLAYBOOK on HOST."""
    import ansible_runner

    env = mode_env(mode)
    with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-") as private:
        started = time.monotonic()
        # a fact cache plugin named in full keeps ansible-runner from moving the cache into the run folder
        # the variables provision gives every run (they are among the converged states' inputs: other values would
        # run every role once, as after an inventory change)
        extravars = {"rigbook_builds_dir": str(Path(os.environ["RIGBOOK_STATE_DIR"]) / BUILDS_DIR),
                     "rigbook_verify_builds": False}
        runner = ansible_runner.run(private_data_dir=private, playbook=str(playbook), inventory=inventory,
                                    limit=host, envvars=env, quiet=True, tags=tags, extravars=extravars,
                                    fact_cache_type=env.get("ANSIBLE_CACHE_PLUGIN", "jsonfile"))
        elapsed = time.monotonic() - started
        done = [e for e in runner.events if e.get("event") in ("runner_on_ok", "runner_on_skipped",
                                                                "runner_on_failed")]
        if runner.rc != 0:
            print(runner.stdout.read()[-2000:])
        return (elapsed, runner.rc, len(done), (runner.stats or {}).get("changed", {}).get(host, 0),
                role_seconds(done))


def role_seconds(events: list) -> dict:
    """{role: (seconds, tasks)} (tasks outside a role under "(play)") from the task events' start and end stamps."""
    from datetime import datetime

    out = {}
    for event in events:
        data = event.get("event_data") or {}
        if not data.get("start") or not data.get("end"):
            continue
        seconds = (datetime.fromisoformat(data["end"]) - datetime.fromisoformat(data["start"])).total_seconds()
        role = (data.get("role") or "(play)").split(".")[-1]
        total, tasks = out.get(role, (0.0, 0))
        out[role] = (total + seconds, tasks + 1)
    return out


def ping_play(mode: str, inventory: str, host: str, count: int) -> float:
    """Seconds of one play of COUNT ansible.builtin.ping tasks on HOST in MODE (one module run per task)."""
    book = Path(tempfile.mkdtemp(prefix="bench-floor-")) / "ping.yml"
    book.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n" + "    - ansible.builtin.ping:\n" * count)
    elapsed, rc, _, _, _ = play(mode, inventory, book, host)
    if rc != 0:
        sys.exit(f"{mode}: ping play failed (rc {rc})")
    return elapsed


def floor(mode: str, inventory: str, host: str, count: int = 21) -> float:
    """Seconds per task of the executor itself in MODE: a play of COUNT pings minus a play of one, per extra
    task (one module run per task, nothing else on the host)."""
    return (ping_play(mode, inventory, host, count) - ping_play(mode, inventory, host, 1)) / (count - 1)


def rerun(mode: str, inventory: str, host: str, tags: str | None = None) -> tuple:
    """(seconds, tasks run on the host, changed, {role: seconds}) of one site.yml run in MODE."""
    elapsed, rc, tasks, changed, roles = play(mode, inventory, REPO / "playbooks" / "site.yml", host, tags)
    if rc != 0:
        sys.exit(f"{mode}: site.yml failed (rc {rc})")
    return elapsed, tasks, changed, roles


def every_role_tags() -> str:
    """--tags naming every role site.yml runs (and the ladder's): a run that skips no converged role, so the tasks a
    converged re-run ran before roles were skipped (docs/converged.md)."""
    sys.path.insert(0, str(REPO.parent))
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

    return ",".join(sorted({tag for _, tags, _ in host_model.ROLES for tag in tags}))


def apart(roles: dict) -> tuple:
    """((seconds, tasks) of everything but the ladder, (seconds, tasks) of the ladder) of a run's {role: (s, n)}."""
    ladder = roles.get("p2p_verify", (0.0, 0))
    rest = [v for role, v in roles.items() if role != "p2p_verify"]
    return (sum(s for s, _ in rest), sum(n for _, n in rest)), ladder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="re-runs per mode (median reported)")
    parser.add_argument("--mitogen", default="0.3.54", help="mitogen version for the third mode")
    parser.add_argument("--rig", default="x99-3080", help="lab rig of the one host (x99-3080, x99-r9700)")
    parser.add_argument("--modes", default="stock,rigbook,mitogen", help="comma-separated: stock, rigbook, mitogen")
    args = parser.parse_args()
    host = "lab-" + args.rig.split("-", 1)[1]
    modes = [m for m in args.modes.split(",") if m]
    if os.geteuid() != 0:
        sys.exit("run as root (lab hosts)")
    sys.path.insert(0, str(mitogen_dir(args.mitogen)))
    os.environ["RIGBOOK_STATE_DIR"] = tempfile.mkdtemp(prefix="rigbook-bench-rerun-")
    up = provision("lab", "up", "--hosts", "1", "--rig", args.rig)
    if up.returncode != 0:
        sys.exit(up.stderr)
    inventory = str(Path(os.environ["RIGBOOK_STATE_DIR"]) / "lab" / "inventory")
    try:
        started = time.monotonic()
        converge = provision("site.yml", "-i", inventory, "--limit", host)
        if converge.returncode != 0:
            sys.exit(f"converge failed: {converge.stdout[-3000:]}")
        print(f"first converge (fresh host, one reboot): {time.monotonic() - started:.1f} s")
        # the converge rebooted the box and its ladder judged the new boot: the roles that watch the boot carried their
        # states over to it (docs/converged.md), so the first re-run is converged too; shown apart all the same
        settle = rerun(modes[0], inventory, host)
        print(f"first re-run after it: {settle[0]:.1f} s, {settle[1]} tasks, changed={settle[2]}")
        results = {}
        for mode in modes:
            runs = [rerun(mode, inventory, host) for _ in range(args.runs)]
            seconds = statistics.median(r[0] for r in runs)
            # the last re-run's tasks and roles
            tasks, changed, roles = runs[-1][1], max(r[2] for r in runs), runs[-1][3]
            same_count = ping_play(mode, inventory, host, tasks)
            per_ping = floor(mode, inventory, host)
            results[mode] = (seconds, tasks)
            print(f"{mode:8s} {seconds:7.1f} s  {tasks} tasks  {seconds / tasks:.3f} s/task  changed={changed}  "
                  f"(executor floor: {per_ping:.3f} s per ansible.builtin.ping task; a play of "
                  f"{tasks} pings {same_count:.1f} s, so this re-run is {seconds / same_count:.2f}x the floor)")
            print("    role                  seconds  tasks  x floor (tasks x one ping task)")
            for role, (role_s, role_tasks) in sorted(roles.items(), key=lambda kv: -kv[1][0]):
                print(f"    {role:20s} {role_s:8.2f} {role_tasks:6d}  {role_s / (role_tasks * per_ping):6.2f}x")
            # the same re-run with every role named by --tags: none skipped, the tasks it ran before (the reference)
            _, full_tasks, _, full_roles = rerun(mode, inventory, host, every_role_tags())
            (rest_s, rest_n), (ladder_s, ladder_n) = apart(roles)
            (_, full_rest_n), _ = apart(full_roles)
            print(f"    roles apart from the ladder: {rest_s:.2f} s in {rest_n} tasks = "
                  f"{rest_s / (full_rest_n * per_ping):.2f}x the floor of the {full_rest_n} tasks they run with every "
                  f"role named (--tags; {full_tasks} tasks in all)")
            print(f"    the ladder: {ladder_s:.2f} s in {ladder_n} tasks = {ladder_s / (ladder_n * per_ping):.2f}x "
                  f"its floor; whole re-run {seconds:.1f} s")
        if {"stock", "rigbook", "mitogen"} <= set(results):
            stock = results["stock"][0]
            rigbook, mitogen = results["rigbook"][0], results["mitogen"][0]
            print(f"ratios: stock/rigbook {stock / rigbook:.1f}x, stock/mitogen {stock / mitogen:.1f}x, "
                  f"rigbook/mitogen {rigbook / mitogen:.1f}x")
        per_task = {m: s / t for m, (s, t) in results.items()}
        for mode, target in (("mitogen", TARGET_MITOGEN), ("rigbook", TARGET_DEFAULTS)):
            if mode in per_task:
                print(f"target {mode}: {per_task[mode]:.3f} s/task against {target} "
                      f"({'met' if per_task[mode] <= target else 'NOT met'})")
    finally:
        provision("lab", "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
