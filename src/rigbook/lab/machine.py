"""One lab host: its root (overlay on the cached rootfs, or a copy), its config, its container.

The container runs under supervisor.py, started detached. Stopping it goes through the
supervisor first, then kills whatever tracking.py still finds of the host, so that nothing is
left behind, and nothing else is touched.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import time
import uuid
from pathlib import Path

from rigbook import paths
from rigbook.errors import UserError
from rigbook.lab import hardware_trees, state
from rigbook.lab.state import Host
from rigbook.lab.system import LabFailure, progress, python, remove_tree, run, unmount_under
from rigbook.lab.tracking import (
    SUPERVISOR,
    is_running,
    make_cgroups,
    processes,
    remove_cgroups,
    supervisor_pid,
    wait_gone,
)

# node_exporter (Debian's prometheus-node-exporter, in the rootfs): every lab host shares this machine's network, so
# each listens on its own 127.B.x.y address (never on all of them, where the second host's could not bind), with the
# textfile collector on the folder the health timer writes (host_model.TEXTFILE_DIR, Debian's default).
NODE_EXPORTER_PORT = 9100
NODE_EXPORTER_DEFAULTS = """\
# rigbook lab host (see rigbook/lab/machine.py): node_exporter on this host's own address only
ARGS="--web.listen-address={address}:{port} --collector.textfile.directory=/var/lib/prometheus/node-exporter"
"""


def is_systemd_host() -> bool:
    """systemd is PID 1 here: nspawn can get its own scope from it (no cgroups of ours needed)."""
    return Path("/run/systemd/system").is_dir()


def overlay_supported() -> bool:
    if os.environ.get("RIGBOOK_LAB_ROOT_MODE") == "copy":
        return False
    try:
        return "overlay" in Path("/proc/filesystems").read_text()
    except OSError:
        return False


def check_port_free(host: Host) -> None:
    """UserError when something on this machine already listens where the host's sshd or node_exporter would."""
    for port in (host.port, NODE_EXPORTER_PORT):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # sshd sets it too: TIME_WAIT is fine
        try:
            sock.bind((host.address, port))
        except OSError as exc:
            raise UserError(
                f"port taken: {host.address}:{port} (for {host.name}) is already in use on this machine "
                f"({exc.strerror}); stop what listens there (`ss -ltnp`) and try again"
            ) from None
        finally:
            sock.close()


# --- creating and starting ----------------------------------------------------------------


def prepare_root(host: Host, rootfs: Path) -> None:
    """The host's own root: an overlay on the cached rootfs (or a full copy where overlay is missing)."""
    host.dir.mkdir(parents=True, exist_ok=True)
    host.root.mkdir(exist_ok=True)
    if overlay_supported() and not any(c in f"{rootfs}{host.dir}" for c in ",:"):
        (host.dir / "upper").mkdir(exist_ok=True)
        (host.dir / "work").mkdir(exist_ok=True)
        opts = f"lowerdir={rootfs},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}"
        run(["mount", "-t", "overlay", "overlay", "-o", opts, str(host.root)])
        host.root_mode = "overlay"
    else:
        progress(f"{host.name}: copying the rootfs (no overlayfs here, or a path it cannot take) ...")
        run(["cp", "-a", "--reflink=auto", f"{rootfs}/.", str(host.root)])
        host.root_mode = "copy"


def _owner(root: Path, user: str) -> tuple:
    for line in (root / "etc/passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == user:
            return int(parts[2]), int(parts[3])
    raise LabFailure(f"the lab rootfs has no user {user!r}")


def _put(root: Path, rel: str, text: str, mode: int = 0o644, owner: tuple | None = None) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    if owner:
        os.chown(path, *owner)


def configure(host: Host, client_pubkey: str) -> str:
    """Identity, sshd address, host key, the user's authorized key, the evidence tree.

    Returns the host's public host key line (for known_hosts)."""
    root = host.root
    key = host.dir / "ssh_host_ed25519_key"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(key)])
    _put(root, "etc/ssh/ssh_host_ed25519_key", key.read_text(), 0o600)
    pub = key.with_suffix(".pub").read_text()
    _put(root, "etc/ssh/ssh_host_ed25519_key.pub", pub)
    _put(root, "etc/ssh/sshd_config.d/20-rigbook-lab-listen.conf", f"ListenAddress {host.address}:{host.port}\n")
    _put(root, "etc/default/prometheus-node-exporter",
         NODE_EXPORTER_DEFAULTS.format(address=host.address, port=NODE_EXPORTER_PORT))
    _put(root, "etc/hostname", f"{host.name}\n")
    _put(root, "etc/hosts", f"127.0.0.1\tlocalhost\n{host.address}\t{host.name}\n"
                            "::1\t\tlocalhost ip6-localhost ip6-loopback\n")
    _put(root, "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
    _put(root, "etc/motd", f"\nrigbook lab host {host.name} (lab rig {host.rig}): a container; its GPUs are "
                           f"a recorded tree under {state.EVIDENCE_ROOT}\n\n")
    if host.bare:
        make_bare(host)
    else:
        owner = _owner(root, state.USER)
        home = root / "home" / state.USER / ".ssh"
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, *owner)
        _put(root, f"home/{state.USER}/.ssh/authorized_keys", client_pubkey, 0o600, owner)
    # The model a serve profile names (user data, not provisioned): for the lab's engine TEST STAND-IN only a
    # config.json, as SGLang checks the model directory holds one.
    _put(root, f"{STANDIN_MODEL}/config.json", json.dumps({"architectures": ["StandinForCausalLM"],
                                                            "rigbook_lab": "TEST STAND-IN model, no weights"}) + "\n")
    _put(root, "etc/dpkg/dpkg.cfg.d/50-rigbook-lab", LAB_DPKG_CFG)
    _put(root, "etc/initramfs-tools/conf.d/50-rigbook-lab", LAB_INITRAMFS_CONF)
    remove_tree(host.evidence)
    hardware_trees.materialize(host.rig, host.evidence)
    install_boot_hook(root)
    return " ".join(pub.split()[:2])


# A lab host is a container: it never loads a kernel module or boots an initrd, so a kernel package's own module
# tree (395 MiB for linux-image-6.1.0-47-amd64) is not unpacked and its initramfs is a small one. apt, dpkg, the
# package's maintainer scripts, DKMS and update-initramfs still run as on a box; dpkg does not fsync each file.
# Measured on a lab host: `dpkg -i` of a kernel image 78 s -> 5 s. The DKMS builds land in updates/dkms, kept.
LAB_DPKG_CFG = """\
# rigbook lab host only (see rigbook/lab/machine.py): no fsync per file; no kernel module tree
force-unsafe-io
path-exclude=/lib/modules/*/kernel/*
path-exclude=/usr/lib/modules/*/kernel/*
"""
LAB_INITRAMFS_CONF = """\
# rigbook lab host only (see rigbook/lab/machine.py): the container boots no initrd
MODULES=list
COMPRESSLEVEL=1
"""


BARE_SSHD = """\
# rigbook lab, bare host: password logins, as a fresh install has (read before 10-rigbook-lab.conf: first wins).
PasswordAuthentication yes
"""


def _chroot(root: Path, *cmd: str, stdin: str | None = None) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root"}
    result = paths.facts("runner").run(["chroot", str(root), *cmd], data=stdin, env=env, clean_env=True, timeout=60)
    if result.rc != 0:
        why = result.error if result.rc is None else (result.stderr or result.stdout).strip()[-300:]
        raise LabFailure(f"`chroot {root} {' '.join(cmd[:2])}` failed: {why}")


def make_bare(host: Host) -> None:
    """A host as a fresh Debian install leaves it: no rigbook user, key or sudoers drop-in (the rootfs has them:
    removed from this host's root only), an `admin` account in group sudo with a generated password (kept in
    host.admin_password_file, 0600) and password logins in sshd. Its host key is not put in known_hosts."""
    root = host.root
    if any(line.startswith(f"{state.USER}:") for line in (root / "etc/passwd").read_text().splitlines()):
        _chroot(root, "userdel", "--remove", state.USER)
    (root / f"etc/sudoers.d/{state.USER}").unlink(missing_ok=True)
    _chroot(root, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", state.BARE_ADMIN)
    password = secrets.token_urlsafe(12)
    _chroot(root, "chpasswd", stdin=f"{state.BARE_ADMIN}:{password}\n")
    fd = os.open(host.admin_password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(password + "\n")
    _put(root, "etc/ssh/sshd_config.d/05-rigbook-lab-bare.conf", BARE_SSHD)


def bare_ready(host: Host) -> str:
    """`systemctl is-system-running --wait` on a bare host, logged in as admin with its password (paramiko; the
    host key checked against the one the lab generated): its answer, or '' when not reachable yet."""
    # deferred: paramiko costs ~70 ms at start-up (benchmarks/cli_speed.py); only `lab up --bare` needs it
    import paramiko

    client = paramiko.SSHClient()
    pub = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
    key = paramiko.Ed25519Key(data=base64.b64decode(pub[1]))
    client.get_host_keys().add(f"[{host.address}]:{host.port}", pub[0], key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(host.address, host.port, username=state.BARE_ADMIN,
                       password=host.admin_password_file.read_text().strip(), look_for_keys=False,
                       allow_agent=False, timeout=3, banner_timeout=10, auth_timeout=10)
        _stdin, stdout, _stderr = client.exec_command("systemctl is-system-running --wait", timeout=90)
        return stdout.read().decode().strip()
    except (OSError, paramiko.SSHException):
        return ""
    finally:
        client.close()


# Directories of this machine shared with every lab host (created before boot):
# - the offline artifact directory (driver tarballs, installers, pip wheels), read-only, same path inside;
# - one apt download cache for all hosts, so kernel images and headers are fetched once per machine.
ARTIFACTS_DIR = Path("/var/cache/rigbook/artifacts")
STANDIN_MODEL = "srv/models/standin-model"
APT_CACHE_DIR = Path("/var/cache/rigbook/lab-apt-archives")


def apt_cache_dir(block: int = 0) -> Path:
    """The apt archive cache the hosts of address block BLOCK share: block 0's is the machine's one cache
    (RIGBOOK_LAB_APT_CACHE moves it); another block's is a folder of its own beside it, seeded with hard links of
    block 0's .debs (seed_apt_cache). apt locks a cache folder as a whole for a run, so two labs side by side on one
    cache would fail each other's plain `apt-get install` (E: Could not get lock /var/cache/apt/archives/lock)."""
    base = Path(os.environ.get("RIGBOOK_LAB_APT_CACHE") or APT_CACHE_DIR)
    return base if block == 0 else base.with_name(f"{base.name}-block{block}")


def seed_apt_cache(block: int) -> None:
    """Block BLOCK's cache gets every .deb block 0's has (a hard link; a copy across file systems): what one lab
    downloaded, the next one does not download again."""
    if block == 0:
        return
    source, target = apt_cache_dir(0), apt_cache_dir(block)
    (target / "partial").mkdir(parents=True, exist_ok=True)
    for deb in sorted(source.glob("*.deb")) if source.is_dir() else []:
        copy = target / deb.name
        if copy.exists() or deb.is_symlink() or not deb.is_file():
            continue
        try:
            os.link(deb, copy)
        except OSError:
            shutil.copyfile(deb, copy)


def shared_dirs(block: int = 0) -> list:
    """[(source on this machine, target inside the host, ro|rw)] for a host of address block BLOCK, from
    RIGBOOK_LAB_ARTIFACTS / _APT_CACHE too."""
    artifacts = Path(os.environ.get("RIGBOOK_LAB_ARTIFACTS") or ARTIFACTS_DIR)
    return [(artifacts, str(ARTIFACTS_DIR), "ro"), (apt_cache_dir(block), "/var/cache/apt/archives", "rw")]


# Lab-only boot hook (docs/lab.md, "Kernels in the lab"): a container runs the machine's kernel, so the
# kernel a lab host "boots" is chosen the way GRUB would choose it and written into the evidence tree.
BOOT_HOOK = r"""#!/bin/sh
# rigbook lab hook (not part of a real box): at each boot, record in the evidence tree the kernel GRUB
# would boot here: the GRUB_DEFAULT entry of /etc/default/grub.d/rigbook.cfg when that kernel is
# installed, else the newest /boot/vmlinuz-*. With no kernel installed the recorded tree is left alone.
ev=/var/lib/rigbook-lab/evidence
pick=$(sed -n 's/^GRUB_DEFAULT=.*with Linux \([^"]*\)".*/\1/p' /etc/default/grub.d/rigbook.cfg 2>/dev/null | tail -n 1)
if [ -z "$pick" ] || [ ! -e "/boot/vmlinuz-$pick" ]; then
  pick=$(ls /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -V | tail -n 1)
fi
[ -n "$pick" ] && [ -d "$ev/proc" ] || exit 0
printf '%s
' "$pick" > "$ev/proc/sys/kernel/osrelease"
mkdir -p "$ev/lib/modules" "$ev/boot"
# the booted kernel's modules are the host's real ones (DKMS builds land there)
[ -e "$ev/lib/modules/$pick" ] || ln -s "/lib/modules/$pick" "$ev/lib/modules/$pick"
# a config the recorded tree already has for this release stays (a stand-in kernel keeps the recorded one)
[ -e "/boot/config-$pick" ] && [ ! -e "$ev/boot/config-$pick" ] && cp "/boot/config-$pick" "$ev/boot/config-$pick"
echo "rigbook lab: booted kernel $pick (evidence tree updated)"
"""
BOOT_UNIT = """[Unit]
Description=rigbook lab: record the booted kernel in the evidence tree (lab only)
DefaultDependencies=no
After=local-fs.target
Before=sshd.service ssh.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/rigbook-lab-boot-kernel

[Install]
WantedBy=multi-user.target
"""


def install_boot_hook(root: Path) -> None:
    _put(root, "usr/local/sbin/rigbook-lab-boot-kernel", BOOT_HOOK, 0o755)
    _put(root, "etc/systemd/system/rigbook-lab-boot-kernel.service", BOOT_UNIT)
    link = root / "etc/systemd/system/multi-user.target.wants/rigbook-lab-boot-kernel.service"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to("/etc/systemd/system/rigbook-lab-boot-kernel.service")


def nspawn_command(host: Host, systemd_host: bool) -> list:
    cmd = ["systemd-nspawn", "--boot", f"--directory={host.root}", f"--machine={host.name}",
           f"--hostname={host.name}", "--register=no", "--link-journal=no", "--resolv-conf=copy-host",
           "--console=read-only", "--settings=no", "--private-users=no"]
    for source, target, mode in shared_dirs(host.block):
        cmd.append(f"--bind{'-ro' if mode == 'ro' else ''}={source}:{target}")
    if not systemd_host:
        cmd.append("--keep-unit")  # stay in the cgroups the supervisor joined (no systemd to ask for a scope)
    return cmd


def start(host: Host, systemd_host: bool) -> None:
    for source, _target, _mode in shared_dirs(host.block):
        source.mkdir(parents=True, exist_ok=True)
    seed_apt_cache(host.block)
    host.cgroups = [] if systemd_host else make_cgroups(host)
    # collections: where the supervisor (python -I, standard library only) imports facts/runner and files from
    spec = {"dir": str(host.dir), "cgroups": host.cgroups, "console": str(host.dir / "console.log"),
            "nspawn": nspawn_command(host, systemd_host), "collections": str(paths.link_collection())}
    spec_path = host.dir / "supervisor.json"
    spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"}
    with open(host.dir / "supervisor.log", "ab") as log:
        proc = paths.facts("runner").spawn([python(), "-I", str(SUPERVISOR), str(spec_path)], env=env, stdout=log,
                                           stderr=log, new_session=True)
    host.supervisor_pid = proc.pid
    (host.dir / "supervisor.pid").write_text(f"{proc.pid}\n")


def run_as_root(host: Host, script: str, what: str, timeout: float, detail: int = 800) -> None:
    """SCRIPT as root inside the running HOST, over its SSH as Ansible reaches it; LabFailure naming WHAT (and the
    last DETAIL characters it printed) when it fails, hangs past TIMEOUT or cannot be sent."""
    result = paths.facts("runner").run(ssh_command(host, "sudo -n sh -c " + shlex.quote(script)), timeout=timeout)
    if result.rc is None:
        raise LabFailure(f"{host.name}: {what} failed: {result.error}")
    if result.rc != 0:
        raise LabFailure(f"{host.name}: {what} failed (rc {result.rc}): "
                         f"{(result.stderr or result.stdout).strip()[-detail:]}")


def ssh_command(host: Host, *remote: str) -> list:
    ssh = state.ssh_dir()
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={ssh / 'known_hosts'}", "-o", "ConnectTimeout=3", "-o", "LogLevel=ERROR",
            "-i", str(ssh / "id_ed25519"), "-p", str(host.port), f"{state.USER}@{host.address}", *remote]


def console_tail(host: Host, lines: int = 4) -> str:
    try:
        text = (host.dir / "console.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no console output)"
    return " | ".join(line.strip() for line in text[-lines:])


def _listening(host: Host) -> bool:
    try:
        with socket.create_connection((host.address, host.port), timeout=1):
            return True
    except OSError:
        return False


def wait_ready(hosts: list, timeout: float = 120.0) -> None:
    """Until every host answers over SSH (host key checked) with sudo and a finished boot."""
    deadline = time.monotonic() + timeout
    pending = list(hosts)
    while pending:
        for host in list(pending):
            if not is_running(host):
                raise LabFailure(f"{host.name}: the container stopped while booting: {console_tail(host)}")
            if not _listening(host):
                continue
            if host.bare:
                status = [bare_ready(host)]
            else:
                cmd = ssh_command(host, "sudo -n true && systemctl is-system-running --wait")
                result = paths.facts("runner").run(cmd, timeout=90)
                if result.rc is None:  # no ssh, or no answer in 90 s
                    raise LabFailure(f"{host.name}: {result.error}")
                # its exit status is not looked at: "degraded" exits 1 and is up all the same
                status = result.stdout.strip().splitlines()[-1:] or [""]
            if status[0] in ("running", "degraded"):
                note = "" if status[0] == "running" else " (degraded: `systemctl --failed` inside says which unit)"
                if host.bare:
                    note += (f" (bare: no {state.USER} user; {state.BARE_ADMIN}'s password in "
                             f"{host.admin_password_file}; host key not in known_hosts)")
                progress(f"{host.name}: up on {host.address}:{host.port}{note}")
                pending.remove(host)
        if pending and time.monotonic() > deadline:
            names = ", ".join(h.name for h in pending)
            raise LabFailure(f"{names} did not come up over SSH within {timeout:.0f} s: {console_tail(pending[0])}")
        if pending:
            time.sleep(0.3)


# --- stopping ------------------------------------------------------------------------------


def stop(host: Host, timeout: float = 30.0) -> None:
    """Orderly shutdown through the supervisor; SIGKILL for whatever is left after TIMEOUT."""
    sup = supervisor_pid(host)
    deadline = time.monotonic() + timeout
    while sup and wait_gone({sup}, 0) and time.monotonic() < deadline:
        # Repeated: a container still in early boot has no handler for the shutdown signal yet,
        # and the kernel drops it; nspawn passes it on again each time it gets SIGTERM.
        os.kill(sup, signal.SIGTERM)
        wait_gone({sup}, 2)
    left = processes(host)
    if left:
        progress(f"{host.name}: {len(left)} processes did not stop in {timeout:.0f} s; killing them")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = wait_gone(left, 10)
    if left:
        raise LabFailure(f"{host.name}: processes {sorted(left)} survived SIGKILL")


def teardown(host: Host) -> None:
    """Stop HOST, unmount its root, remove its cgroups and its directory."""
    stop(host)
    stuck = unmount_under(host.dir)
    if stuck:
        raise LabFailure(f"{host.name}: could not unmount {stuck[0]}")
    remove_cgroups(host)
    remove_tree(host.dir)
