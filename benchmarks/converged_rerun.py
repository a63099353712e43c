#!/usr/bin/env python3
"""Benchmark a converged re-run of site.yml on one lab host, three ways in the same run.

Run as root from the checkout:  .venv/bin/python benchmarks/converged_rerun.py [--runs 1] [--mitogen 0.3.54]

1. stock Ansible settings: no pipelining, no ControlPersist (ControlMaster=no), no fact cache;
2. rigbook's defaults (src/rigbook/run.py ansible_env(mitogen=False)): pipelining, ControlPersist, smart
   gathering with a jsonfile fact cache;
3. rigbook's defaults plus the mitogen strategy (mitogen_linear), mitogen installed into a cached
   --target directory (/var/cache/rigbook/mitogen-<version>; pip fetches it once).

It brings up one lab host (x99-3080) in a temporary state directory, converges it once with site.yml (timed,
not part of the comparison; needs the artifacts of tests/artifacts/pack.py and the CUDA wheel directory, see
docs/lab.md), then times each mode's re-run (which must report changed=0) and prints seconds, seconds per task
and the ratios. Targets (issue 6): <= 0.1 s/task with mitogen, < 0.35 s/task without.
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


def play(mode: str, inventory: str, playbook: Path) -> tuple:
    """(seconds, return code, tasks run on the host, changed) of one run of PLAYBOOK on lab-3080 in MODE."""
    import ansible_runner

    env = mode_env(mode)
    with tempfile.TemporaryDirectory(prefix=f"bench-{mode}-") as private:
        started = time.monotonic()
        # a fact cache plugin named in full keeps ansible-runner from moving the cache into the run folder
        runner = ansible_runner.run(private_data_dir=private, playbook=str(playbook), inventory=inventory,
                                    limit="lab-3080", envvars=env, quiet=True,
                                    fact_cache_type=env.get("ANSIBLE_CACHE_PLUGIN", "jsonfile"))
        elapsed = time.monotonic() - started
        tasks = sum(1 for e in runner.events if e.get("event") in ("runner_on_ok", "runner_on_skipped",
                                                                     "runner_on_failed"))
        if runner.rc != 0:
            print(runner.stdout.read()[-2000:])
        return elapsed, runner.rc, tasks, (runner.stats or {}).get("changed", {}).get("lab-3080", 0)


def floor(mode: str, inventory: str, count: int = 21) -> float:
    """Seconds per task of the executor itself in MODE: a play of COUNT ansible.builtin.ping tasks minus a
    play of one, per extra task (one module run per task, nothing else on the host)."""
    seconds = []
    for n in (1, count):
        book = Path(tempfile.mkdtemp(prefix="bench-floor-")) / "ping.yml"
        book.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n" + "    - ansible.builtin.ping:\n" * n)
        elapsed, rc, _, _ = play(mode, inventory, book)
        if rc != 0:
            sys.exit(f"{mode}: ping play failed (rc {rc})")
        seconds.append(elapsed)
    return (seconds[1] - seconds[0]) / (count - 1)


def rerun(mode: str, inventory: str) -> tuple:
    """(seconds, tasks run on the host, changed) of one site.yml run in MODE."""
    elapsed, rc, tasks, changed = play(mode, inventory, REPO / "playbooks" / "site.yml")
    if rc != 0:
        sys.exit(f"{mode}: site.yml failed (rc {rc})")
    return elapsed, tasks, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="re-runs per mode (median reported)")
    parser.add_argument("--mitogen", default="0.3.54", help="mitogen version for the third mode")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (lab hosts)")
    sys.path.insert(0, str(mitogen_dir(args.mitogen)))
    os.environ["RIGBOOK_STATE_DIR"] = tempfile.mkdtemp(prefix="rigbook-bench-rerun-")
    up = provision("lab", "up", "--hosts", "1", "--profile", "x99-3080")
    if up.returncode != 0:
        sys.exit(up.stderr)
    inventory = str(Path(os.environ["RIGBOOK_STATE_DIR"]) / "lab" / "inventory")
    try:
        started = time.monotonic()
        converge = provision("site.yml", "-i", inventory, "--limit", "lab-3080")
        if converge.returncode != 0:
            sys.exit(f"converge failed: {converge.stdout[-3000:]}")
        print(f"first converge (fresh host, one reboot): {time.monotonic() - started:.1f} s")
        results = {}
        for mode in ("stock", "rigbook", "mitogen"):
            runs = [rerun(mode, inventory) for _ in range(args.runs)]
            seconds = statistics.median(r[0] for r in runs)
            tasks, changed = runs[0][1], max(r[2] for r in runs)
            results[mode] = (seconds, tasks)
            print(f"{mode:8s} {seconds:7.1f} s  {tasks} tasks  {seconds / tasks:.3f} s/task  changed={changed}  "
                  f"(executor floor: {floor(mode, inventory):.3f} s per ansible.builtin.ping task)")
        stock = results["stock"][0]
        rigbook, mitogen = results["rigbook"][0], results["mitogen"][0]
        print(f"ratios: stock/rigbook {stock / rigbook:.1f}x, stock/mitogen {stock / mitogen:.1f}x, "
              f"rigbook/mitogen {rigbook / mitogen:.1f}x")
        per_task = {m: s / t for m, (s, t) in results.items()}
        print(f"targets: mitogen {per_task['mitogen']:.3f} s/task (<= {TARGET_MITOGEN}: "
              f"{'met' if per_task['mitogen'] <= TARGET_MITOGEN else 'NOT met'}), rigbook defaults "
              f"{per_task['rigbook']:.3f} s/task (< {TARGET_DEFAULTS}: "
              f"{'met' if per_task['rigbook'] < TARGET_DEFAULTS else 'NOT met'})")
    finally:
        provision("lab", "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
