"""The lab for real: systemd-nspawn hosts, sshd on 127.0.0.0/8, Ansible over SSH with host keys checked.

Needs root (containers, mounts). The first run builds the cached rootfs with debootstrap (about a
minute, kept in /var/cache/rigbook/lab-rootfs or RIGBOOK_LAB_CACHE); later runs boot from it.
The tests share the session's one lab (tests/integration/conftest.py), ordered by what they ask of it: the
`lab up` checks on the fresh lab, then the running lab, the converged lab, `lab down`, and last the tests that
need no lab running.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import ansible_runner
import yaml
from helpers.cli import REPO, provision
from helpers.lab_host import LAB_MARKS, leftovers

from rigbook.lab import cli as lab_cli
from rigbook.lab import machine, state, tracking
from rigbook.lab.system import LabFailure
from rigbook.run import ansible_env

pytestmark = LAB_MARKS
LAB_INVENTORY = REPO / "inventory" / "lab"


def play(tmp_path: Path, tasks: list, hosts: str, inventory: Path = LAB_INVENTORY, name="play"):
    """Run TASKS on HOSTS through ansible_runner.run (real ansible-playbook over the lab's SSH)."""
    private = tmp_path / f"runner-{name}"
    (private / "project").mkdir(parents=True)
    book = [{"name": name, "hosts": hosts, "gather_facts": False, "tasks": tasks}]
    (private / "project" / "play.yml").write_text(yaml.safe_dump(book, sort_keys=False))
    runner = ansible_runner.run(private_data_dir=str(private), playbook="play.yml", inventory=str(inventory),
                                envvars=ansible_env(), quiet=True)
    results = {}
    for event in runner.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok":
            results.setdefault(data["host"], {})[data["task"]] = data["res"]
    return runner, results


def read_evidence(tmp_path, host: str, rel: str, name: str) -> str:
    task = {"name": "read", "ansible.builtin.slurp": {"src": "{{ rigbook_evidence_root }}/" + rel}}
    runner, results = play(tmp_path, [task], host, name=name)
    assert runner.rc == 0, runner.stdout.read()
    import base64

    return base64.b64decode(results[host]["read"]["content"]).decode()


def test_up_boots_two_real_systemd_hosts(fresh_lab):
    assert "lab-3080: up on 127.0.11.1:2222" in fresh_lab and "lab-r9700: up on 127.0.11.2:2222" in fresh_lab
    lab = state.load()
    assert [h.name for h in lab.hosts] == ["lab-3080", "lab-r9700"]
    known = (state.ssh_dir() / "known_hosts").read_text().splitlines()
    assert [line.split()[0] for line in known] == ["[127.0.11.1]:2222", "[127.0.11.2]:2222"]
    for host in lab.hosts:
        assert tracking.is_running(host)
        cmd = machine.ssh_command(host, "id -un; sudo -n id -u; ps -p 1 -o comm=; systemctl is-system-running; "
                                        "hostname; ss -ltnH")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.split("\n")
        assert lines[:5] == ["rigbook", "0", "systemd", "running", host.name]
        assert f"{host.address}:{host.port}" in out.stdout  # sshd listens on its loopback address only
    status = provision("lab", "status")
    assert status.returncode == 0
    assert status.stdout.count("running") == 2


def test_wrong_host_key_is_refused(lab, tmp_path):
    """Host key checking is on: a known_hosts that names another key makes SSH fail."""
    host = state.load().host("lab-3080")
    fake = tmp_path / "known_hosts"
    other = (state.lab_dir() / "hosts/lab-r9700/ssh_host_ed25519_key.pub").read_text().split()[:2]
    fake.write_text(f"[{host.address}]:{host.port} {' '.join(other)}\n")
    cmd = machine.ssh_command(host, "true")
    cmd[cmd.index(f"UserKnownHostsFile={state.ssh_dir() / 'known_hosts'}")] = f"UserKnownHostsFile={fake}"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in out.stderr


def test_bad_input_while_up(lab):
    again = provision("lab", "up")
    assert again.returncode == 2
    assert "the lab is already up (lab-3080, lab-r9700 running)" in again.stderr
    for args, message in [
        (["break", "lab-9090", "link-x8"], "no lab host 'lab-9090'"),
        (["break", "lab-3080", "dma-window-above-44bit"], "is for amd GPUs"),
        (["break", "lab-3080", "bar1-256m"], "changes nothing on lab-3080"),
        (["break", "lab-3080", "no-such-fault"], "unknown fault"),
    ]:
        proc = provision("lab", *args)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert all(tracking.is_running(h) for h in state.load().hosts)


def test_reboot_through_ansible_comes_back_with_a_new_boot_id(lab, tmp_path):
    boot_id = {"name": "boot id", "ansible.builtin.command": "cat /proc/sys/kernel/random/boot_id",
               "changed_when": False}
    tasks = [boot_id, {"name": "reboot", "ansible.builtin.reboot": {"reboot_timeout": 120}, "become": True},
             dict(boot_id, name="boot id after")]
    host = state.load().host("lab-3080")
    boots_before = int((host.dir / "boots").read_text())  # site.yml's own reboot may have come first
    other = state.load().host("lab-r9700").dir / "boots"
    other_before = other.read_text()
    runner, results = play(tmp_path, tasks, "lab-3080", name="reboot")
    assert runner.rc == 0, runner.stdout.read()
    res = results["lab-3080"]
    assert res["reboot"]["rebooted"] is True
    before, after = res["boot id"]["stdout"], res["boot id after"]["stdout"]
    assert before and after and before != after
    assert int((host.dir / "boots").read_text()) == boots_before + 1  # the supervisor booted it again
    assert tracking.is_running(host)
    assert other.read_text() == other_before  # the other lab host was not touched


def test_break_and_heal_change_what_the_evidence_reads(lab, tmp_path):
    resource = "sys/bus/pci/devices/0000:03:00.0/resource"
    pristine = read_evidence(tmp_path, "lab-r9700", resource, "r0")
    assert pristine.splitlines()[0].startswith("0x0000003800000000")

    proc = provision("lab", "break", "lab-r9700", "dma-window-above-44bit")
    assert proc.returncode == 0, proc.stderr
    assert "broke layer dma_window" in proc.stdout
    broken = read_evidence(tmp_path, "lab-r9700", resource, "r1")
    assert broken != pristine and int(broken.split()[0], 16) >= 1 << 44

    ladder = provision("site.yml", "-i", "lab", "--limit", "lab-r9700", "--json")
    assert ladder.returncode != 0  # the P2P ladder reads the broken tree and fails
    assert "dma_window" in ladder.stdout + ladder.stderr

    proc = provision("lab", "break", "lab-3080", "iommu-flags-lost")
    assert proc.returncode == 0, proc.stderr
    assert "iommu=pt" not in read_evidence(tmp_path, "lab-3080", "proc/cmdline", "c1")
    assert "dma-window-above-44bit" in provision("lab", "status").stdout

    for name in ("lab-r9700", "lab-3080"):
        proc = provision("lab", "heal", name)
        assert proc.returncode == 0 and "restored" in proc.stdout, proc.stderr
    assert read_evidence(tmp_path, "lab-r9700", resource, "r2") == pristine
    assert "iommu=pt" in read_evidence(tmp_path, "lab-3080", "proc/cmdline", "c2")
    healed = provision("site.yml", "-i", "lab", "--limit", "lab-r9700", "--json")  # converged by the AMD role tests
    assert healed.returncode == 0, healed.stdout[-3000:] + healed.stderr[-3000:]


def test_down_leaves_nothing_running(lab_last):
    rootfs = state.load().rootfs
    proc = provision("lab", "down")
    assert proc.returncode == 0, proc.stderr
    assert leftovers() == []
    assert not state.state_file().exists()
    assert Path(rootfs, "usr/bin/python3").exists()  # the cache stays for the next `lab up`
    assert "not up" in provision("lab", "status").stdout


def test_port_taken_is_refused_and_nothing_starts(no_lab):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    address = state.plan_hosts(None, None, block=lab_cli.default_block())[1].address  # lab-r9700's
    listener.bind((address, state.SSH_PORT))
    listener.listen()
    try:
        proc = provision("lab", "up")
    finally:
        listener.close()
    assert proc.returncode == 2
    assert f"port taken: {address}:2222 (for lab-r9700)" in proc.stderr and proc.stderr.count("\n") == 1
    assert not state.state_file().exists() and leftovers() == []


def test_failed_boot_rolls_everything_back(no_lab, monkeypatch, capsys):
    """A host that never answers (simulated by failing the readiness wait) leaves nothing behind."""

    def never_ready(hosts, timeout=0):
        assert all(tracking.is_running(h) for h in hosts)  # they really were started
        raise LabFailure("lab-r9700 did not come up over SSH (simulated)")

    monkeypatch.setattr(machine, "wait_ready", never_ready)
    assert lab_cli.main(["up"]) == 1
    out = capsys.readouterr()
    assert "rolling back" in out.out and "did not come up" in out.err
    assert leftovers() == [] and not state.state_file().exists()
