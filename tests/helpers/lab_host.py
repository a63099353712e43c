"""The lab as a test drives it: `LAB_MARKS` (root only, marker `lab`), `LabHost` (one running lab host: a root
shell over its SSH or without it, its boot count, a reboot, `provision site.yml` limited to it, its node_exporter's
metrics over HTTP) and `leftovers()`
(anything of the lab still running, mounted or in the cgroup tree)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.cli import provision

# --- the lab ---------------------------------------------------------------------------------------------------

# scripts/test runs the tests marked lab in four lab groups (tests/integration/conftest.py), each in a pytest
# process of its own, every other test in a fifth one beside them.
LAB_MARKS = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="lab hosts need root (systemd-nspawn, mounts)"),
]


class LabHost:
    """One running lab host as a test drives it: a root shell over its SSH, its boot count, a reboot."""

    def __init__(self, name: str):
        self.name = name

    @property
    def host(self):
        from rigbook.lab import state

        return state.load().host(self.name)

    def run(self, command: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
        """COMMAND as root on the host (sudo -n sh -c), as Ansible reaches it."""
        import json
        import shlex

        from rigbook.lab import machine

        proc = subprocess.run(machine.ssh_command(self.host, f"sudo -n sh -c {shlex.quote(command)}"),
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{self.name}: {json.dumps(command)}: {proc.stderr or proc.stdout}"
        return proc

    def out(self, command: str) -> str:
        return self.run(command).stdout

    def console(self, command: str) -> subprocess.CompletedProcess:
        """COMMAND as root inside the host without SSH (its sshd may be what a test stopped): nsenter into the
        namespaces of the container's PID 1, found among the host's processes by its in-container pid."""
        from rigbook.lab import tracking

        for pid in sorted(tracking.processes(self.host)):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == "1":
                return subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", "sh", "-c",
                                       command], capture_output=True, text=True, timeout=120)
        raise AssertionError(f"{self.name}: no container init process found")

    def boots(self) -> int:
        return int((self.host.dir / "boots").read_text())

    def site(self, *args, inventory: str = "lab", timeout: int = 900) -> tuple:
        """`provision site.yml -i INVENTORY --limit HOST --json ARGS`: (process, the host's summary entry, the
        names of the tasks that changed it, seconds)."""
        import json
        import time

        started = time.monotonic()
        proc = provision("site.yml", "-i", inventory, "--limit", self.name, "--json", *args, timeout=timeout)
        elapsed = time.monotonic() - started
        summary = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        changed = [line.split(": ", 2)[2] for line in proc.stderr.splitlines()
                   if line.strip().startswith("changed: ")]
        return proc, summary.get("hosts", {}).get(self.name, {}), changed, elapsed

    def reboot(self, timeout: float = 180) -> None:
        """`systemctl reboot` on the host, then wait until it booted again and its sshd answers."""
        import time

        from rigbook.lab import machine

        count = self.boots()
        subprocess.run(machine.ssh_command(self.host, "sudo -n systemctl reboot"), capture_output=True, timeout=60)
        deadline = time.monotonic() + timeout
        while self.boots() == count:
            assert time.monotonic() < deadline, f"{self.name} did not reboot"
            time.sleep(0.5)
        machine.wait_ready([self.host], timeout=timeout)

    def scrape(self, timeout: float = 10) -> str:
        """The host's node_exporter metrics through its HTTP endpoint (its own loopback address, port 9100; Debian's
        prometheus-node-exporter, whose textfile collector serves the health timer's file), as Prometheus scrapes
        them. No proxy: only this machine's loopback is contacted."""
        import urllib.request

        from rigbook.lab import machine

        url = f"http://{self.host.address}:{machine.NODE_EXPORTER_PORT}/metrics"
        assert url.startswith("http://127."), url
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=timeout) as response:
            assert response.status == 200, (url, response.status)
            return response.read().decode()


def leftovers() -> list:
    """Anything of this state directory's lab still running, mounted or in the cgroup tree."""
    from rigbook.lab import state, tracking
    from rigbook.lab.system import mounts_under

    lab_dir = str(state.lab_dir())
    group = f"/rigbook-lab-{state.lab_id()}/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroups = (entry / "cgroup").read_text()
            args = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, waiting for PID 1 to reap it: not running
        except (OSError, IndexError):
            continue
        if group in cgroups or (lab_dir in args and ("supervisor" in args or "nspawn" in args)):
            found.append(f"process {entry.name}: {args[:120]}")
    found += [f"mount {m}" for m in mounts_under(state.lab_dir())]
    for base in tracking.CGROUP_MOUNTS:
        cgroup = Path(base) / f"rigbook-lab-{state.lab_id()}"
        if cgroup.exists():
            found.append(f"cgroup {cgroup}")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    found += [f"loop {line}" for line in loops.splitlines() if lab_dir in line]
    return found
