"""The lab's commands: up, status, down, break, heal."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rigbook.errors import UserError
from rigbook.lab import artifacts, faults, hardware_trees, inventory, machine, rootfs, state, system, tracking
from rigbook.lab.state import Host, Lab
from rigbook.lab.system import LabFailure, progress
from rigbook.paths import facts


def _count(hosts: list) -> str:
    return f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"


def _ssh_material(hosts: list) -> str:
    """The client key pair (made once per lab) and a known_hosts naming only these hosts."""
    ssh = state.ssh_dir()
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ssh / "id_ed25519"
    if not key.exists():
        system.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigbook-lab", "-f", str(key)])
    return key.with_suffix(".pub").read_text()


def _teardown_all(lab: Lab) -> None:
    errors = []
    for host in lab.hosts:
        try:
            machine.teardown(host)
        except LabFailure as exc:
            errors.append(str(exc))
    if errors:
        raise LabFailure("; ".join(errors))


def _leftovers(lab: Lab) -> list:
    """Anything of LAB still running or mounted (empty when it is really down)."""
    left = []
    for host in lab.hosts:
        pids = tracking.processes(host)
        if pids:
            left.append(f"{host.name}: processes {sorted(pids)}")
    left += [f"mount {m}" for m in system.mounts_under(state.lab_dir())]
    return left


def up(count: int | None, rigs: list | None, bare: list | None = None, block: int = 0) -> int:
    hosts = state.plan_hosts(count, rigs, bare, block)
    system.require_root("up")
    with state.locked():
        existing = state.load()
        if existing:
            running = [h.name for h in existing.hosts if tracking.is_running(h)]
            if running:
                raise UserError(f"the lab is already up ({', '.join(running)} running): "
                                "run `provision lab down` first")
            progress("cleaning up a lab that is no longer running ...")
            _teardown_all(existing)
            state.state_file().unlink(missing_ok=True)
        for host in hosts:
            machine.check_port_free(host)
        system.ensure_tools()
        artifacts.prepare()  # before anything starts: a failed download leaves nothing behind
        plan = rootfs.plan()
        cached = rootfs.is_built(plan)
        root = rootfs.ensure(plan)
        if cached:
            progress(f"using the cached rootfs {root}")
        lab = Lab(hosts=[], rootfs=str(root), systemd_host=machine.is_systemd_host())
        start = time.monotonic()
        try:
            _start(lab, hosts, root)
        except BaseException as exc:
            progress(f"rolling back ({type(exc).__name__}): stopping what was started ...")
            _teardown_all(lab)
            system.remove_tree(state.lab_dir() / "hosts")
            shutil.rmtree(state.lab_dir() / "inventory", ignore_errors=True)
            shutil.rmtree(state.ssh_dir(), ignore_errors=True)
            state.state_file().unlink(missing_ok=True)
            raise
        elapsed = time.monotonic() - start
    inv = "lab" if inventory.is_default(hosts) else str(inventory.inventory_dir())
    names = ", ".join(h.name for h in hosts)
    progress(f"{_count(hosts)} up in {elapsed:.1f} s: {names}")
    bare = [h for h in hosts if h.bare]
    if bare:
        progress(f"bare: {', '.join(h.name for h in bare)} (user {state.BARE_ADMIN}, password in "
                 f"{bare[0].admin_password_file}{' etc.' if len(bare) > 1 else ''}): "
                 f"first RIGBOOK_BOOTSTRAP_PASSWORD=... provision bootstrap {bare[0].name} -i {inv} --user "
                 f"{state.BARE_ADMIN} --accept-new-host-key")
    progress(f"next: provision site.yml -i {inv}   (then: provision lab status / break / heal / down)")
    return 0


def _start(lab: Lab, hosts: list, root) -> None:
    pubkey = _ssh_material(hosts)
    known = []
    for host in hosts:
        lab.hosts.append(host)
        state.save(lab)  # recorded before anything exists, so a rollback or `lab down` finds it
        machine.prepare_root(host, root)
        state.save(lab)
        line = f"[{host.address}]:{host.port} {machine.configure(host, pubkey)}\n"
        if not host.bare:  # a bare host's key is for `provision bootstrap` to accept explicitly
            known.append(line)
        (state.ssh_dir() / "known_hosts").write_text("".join(known))
        machine.start(host, lab.systemd_host)
        state.save(lab)
        progress(f"{host.name}: booting ({host.rig}, {host.root_mode} root, ssh {host.address}:{host.port})")
    machine.wait_ready(hosts)
    inventory.write(hosts)


def down() -> int:
    system.require_root("down")
    with state.locked():
        lab = state.load()
        if lab is None:
            progress("the lab is not up; nothing to stop")
            return 0
        for host in lab.hosts:
            if tracking.is_running(host):
                progress(f"{host.name}: shutting down ...")
        _teardown_all(lab)
        left = _leftovers(lab)
        if left:
            raise LabFailure("lab down left things behind: " + "; ".join(left))
        for sub in ("inventory", "ssh", "hosts"):
            shutil.rmtree(state.lab_dir() / sub, ignore_errors=True)
        state.state_file().unlink(missing_ok=True)
    progress(f"lab down: {_count(lab.hosts)} stopped; no processes, mounts or cgroups left")
    return 0


def status() -> int:
    lab = state.load()
    if lab is None:
        print("the lab is not up")
        return 0
    print(f"{'host':<14} {'rig':<11} {'state':<8} {'ssh':<21} {'boots':>5} {'rss':>8}  faults")
    for host in lab.hosts:
        running = tracking.is_running(host)
        boots = (host.dir / "boots").read_text().strip() if (host.dir / "boots").exists() else "-"
        rss = f"{tracking.rss_kib(host) / 1024:.0f} MiB" if running else "-"
        print(f"{host.name:<14} {host.rig:<11} {'running' if running else 'stopped':<8} "
              f"{host.address + ':' + str(host.port):<21} {boots:>5} {rss:>8}  {', '.join(host.faults) or '-'}")
    for host in lab.hosts:
        if host.bare:
            print(f"{host.name}: started bare: user {state.BARE_ADMIN} (group sudo), password in "
                  f"{host.admin_password_file}; run `provision bootstrap {host.name}` before Ansible")
    print(f"rootfs: {lab.rootfs}")
    print(f"evidence root on each host: {state.EVIDENCE_ROOT}")
    return 0


def _host_for_edit(name: str, what: str) -> tuple:
    system.require_root(what)
    lab = state.load()
    if lab is None:
        raise UserError("the lab is not up: run `provision lab up` first")
    host = lab.host(name)
    if not host.evidence.is_dir():
        raise UserError(f"{host.name} has no evidence tree at {host.evidence} (is its root mounted?)")
    return lab, host


def break_(name: str, fault: str) -> int:
    faults.get_fault(fault)  # UserError for an unknown fault, before anything else
    with state.locked():
        lab, host = _host_for_edit(name, "break")
        if fault in host.faults:
            raise UserError(f"{host.name} already has fault {fault!r}: `provision lab heal {host.name}` first")
        rig = hardware_trees.load_rig(host.rig)
        changes = faults.plan(fault, host.evidence, rig)
        if not changes:
            raise UserError(f"fault {fault!r} changes nothing on {host.name}: rig {host.rig} already has "
                            "it, or records nothing it edits")
        faults.apply(changes, runner=lambda script: _run_in_host(host, script), backup_dir=_fault_backups(host))
        host.faults.append(fault)
        state.save(lab)
        restart = faults.restart_script([fault])
        if restart:
            _run_in_host(host, restart)
    layer = faults.get_fault(fault)["layer"]
    progress(f"{host.name}: broke layer {layer} with {fault} ({len(changes)} paths changed): "
             f"{faults.describe(fault, rig)}")
    return 0


def _fault_backups(host) -> Path:
    """Where `lab break` keeps the host files a fault changes (outside the host), for `lab heal`."""
    return host.dir / "fault-backups"


def _run_in_host(host, script: str) -> None:
    """A fault's script, as root inside the running host (over its SSH, as Ansible reaches it)."""
    machine.run_as_root(host, script, "the fault's script", timeout=600, detail=400)


def _record_booted_kernel(host) -> None:
    """Run the lab's boot hook on the fresh tree, so a healed host still shows the kernel it booted."""
    hook = host.root / "usr/local/sbin/rigbook-lab-boot-kernel"
    if hook.exists():
        result = facts("runner").run(["chroot", str(host.root), "/usr/local/sbin/rigbook-lab-boot-kernel"],
                                     timeout=60)
        if result.rc is None:  # chroot missing, or the hook hung: not a failed hook but a broken heal
            raise LabFailure(f"{host.name}: the boot hook on the healed tree: {result.error}")
        if result.rc != 0:
            progress(f"{host.name}: the boot hook failed on the healed tree: {result.stderr.strip()[-300:]}")


def heal(name: str) -> int:
    with state.locked():
        lab, host = _host_for_edit(name, "heal")
        fresh = host.evidence.with_name(".evidence.new")
        old = host.evidence.with_name(".evidence.old")
        for d in (fresh, old):
            shutil.rmtree(d, ignore_errors=True)
        hardware_trees.materialize(host.rig, fresh)
        host.evidence.rename(old)
        fresh.rename(host.evidence)
        shutil.rmtree(old)
        faults.restore(_fault_backups(host), host.root)
        _record_booted_kernel(host)
        healed, host.faults = host.faults, []
        state.save(lab)
        restart = faults.restart_script(healed)
        if restart:
            _run_in_host(host, restart)
    progress(f"{host.name}: evidence tree restored to rig {host.rig}"
             + (f" (removed: {', '.join(healed)})" if healed else " (it had no faults)"))
    return 0


__all__ = ["up", "down", "status", "break_", "heal", "Host"]
