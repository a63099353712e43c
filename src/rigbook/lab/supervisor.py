"""Keeps one lab host running: systemd-nspawn -b in a loop that restarts on reboot (exit 133).

Started detached (its own session) by `provision lab up` as `python -I supervisor.py SPEC.json`;
standard library only, so it stays small: it starts nspawn through the collection's facts/runner
(spawn) and writes its state files through facts/files (write_atomic), imported from the
collections folder SPEC names. It joins the host's own cgroups first (so nspawn's
payload/ and supervisor/ groups never mix with another host's), then runs the container. A
`systemctl reboot` inside makes nspawn exit with 133: the loop boots it again, which gives it a
new boot id. Any other exit (poweroff, failure) ends the loop. SIGTERM (from `lab down`) is
passed to nspawn, which shuts the container down in order, and ends the loop.
"""

import json
import os
import signal
import sys
import time

REBOOT_EXIT = 133


def _facts(collections):
    """facts/runner and facts/files of the collection linked under COLLECTIONS (paths.link_collection)."""
    if collections not in sys.path:
        sys.path.insert(0, collections)
    # deferred: ansible_collections.rigbook.homelab is importable only once COLLECTIONS is on sys.path (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner

    return runner, files


def main(spec_path):
    with open(spec_path) as fh:
        spec = json.load(fh)
    runner, files = _facts(spec["collections"])
    for group in spec["cgroups"]:
        with open(os.path.join(group, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    host_dir = spec["dir"]
    state = {"stop": False, "child": None}

    def on_signal(signum, frame):
        state["stop"] = True
        child = state["child"]
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    boots, rc = 0, None
    with open(spec["console"], "ab", buffering=0) as console:
        while not state["stop"]:
            boots += 1
            files.write_atomic(os.path.join(host_dir, "boots"), f"{boots}\n")
            console.write(f"\n=== rigbook lab: boot {boots} at {time.strftime('%H:%M:%S')} ===\n".encode())
            child = runner.spawn(spec["nspawn"], stdout=console, stderr=console)
            state["child"] = child
            if state["stop"]:
                child.send_signal(signal.SIGTERM)
            files.write_atomic(os.path.join(host_dir, "nspawn.pid"), f"{child.pid}\n")
            rc = child.wait()
            console.write(f"=== rigbook lab: nspawn exited {rc} ===\n".encode())
            if rc != REBOOT_EXIT:
                break
    files.write_atomic(os.path.join(host_dir, "exit"), f"{rc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
