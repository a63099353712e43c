"""The cached Debian root filesystem every lab host starts from (rootfs.yml is its recipe).

Built once with debootstrap from this machine's own apt sources, then configured in a chroot
(sources with every suite, the sudo user, sshd, masked timers), and kept under the cache
directory keyed by a hash of the recipe. A changed recipe or changed apt sources give a new key,
hence a new build; an unchanged one is reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rigbook.lab import aptsources
from rigbook.lab.system import LabFailure, progress, remove_tree, run, unmount_under
from rigbook.paths import facts

RECIPE_FILE = Path(__file__).resolve().parent / "rootfs.yml"
DEFAULT_CACHE = Path("/var/cache/rigbook/lab-rootfs")
# Bump when build()/_configure() change what ends up in the rootfs.
SETUP_VERSION = 1
SSHD_CONFIG = """\
# rigbook lab host: keys only, one host key (written per host), no DNS lookups.
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UseDNS no
"""
_PACKAGE_LINE = re.compile(r"^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) \S+")
_PHASES = {"Retrieving": "downloaded", "Validating": "downloaded", "Extracting": "extracted",
           "Unpacking": "unpacked", "Configuring": "configured"}


def cache_dir() -> Path:
    return Path(os.environ.get("RIGBOOK_LAB_CACHE") or DEFAULT_CACHE)


def load_recipe() -> dict:
    with open(RECIPE_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def architecture() -> str:
    """This machine's Debian architecture (`dpkg --print-architecture`; from uname where dpkg cannot say)."""
    out, _why = facts("runner").output(["dpkg", "--print-architecture"])
    if out is None:
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    return out.strip()


@dataclass
class Plan:
    recipe: dict
    mirror: aptsources.Source
    sources: list
    arch: str
    key: str

    @property
    def path(self) -> Path:
        return cache_dir() / self.key

    @property
    def root(self) -> Path:
        return self.path / "rootfs"


def plan(apt_dir: Path = aptsources.APT_DIR) -> Plan:
    recipe = load_recipe()
    found = aptsources.read_sources(apt_dir)
    sources = aptsources.for_suite(found, recipe["suite"])
    mirror = aptsources.mirror_for(found, recipe["suite"])
    if not sources:
        sources = [mirror]
    arch = architecture()
    material = json.dumps(
        {"recipe": recipe, "sources": aptsources.render_deb822(sources), "mirror": mirror.uris,
         "arch": arch, "setup": SETUP_VERSION},
        sort_keys=True,
    )
    return Plan(recipe, mirror, sources, arch, hashlib.sha256(material.encode()).hexdigest()[:16])


def is_built(p: Plan) -> bool:
    return (p.path / "recipe.json").is_file() and (p.root / "usr/bin/python3").exists()


def ensure(p: Plan) -> Path:
    """The rootfs for plan P: the cached one, or a fresh build (under a lock, so only one builds)."""
    if is_built(p):
        return p.root
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_built(p):
            build(p)
    return p.root


def _debootstrap(p: Plan, target: Path, log) -> None:
    recipe = p.recipe
    cmd = ["debootstrap", f"--variant={recipe['variant']}", f"--arch={p.arch}",
           f"--include={','.join(recipe['packages'])}",
           f"--components={','.join(p.mirror.components or ['main'])}"]
    keyring = p.mirror.signed_by
    if keyring and "\n" not in keyring and Path(keyring).is_file():
        cmd.append(f"--keyring={keyring}")
    cmd += [recipe["suite"], str(target), p.mirror.uris[0]]
    runner = facts("runner")
    env = {"PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}  # LC_ALL=C: runner's own
    proc = runner.spawn(cmd, env=env, stdout=runner.PIPE, stderr=runner.STDOUT, text=True)
    phase, count, tail = None, 0, []
    for line in proc.stdout:
        log.write(line)
        tail = (tail + [line.rstrip()])[-15:]
        m = _PACKAGE_LINE.match(line)
        if m:
            step = _PHASES[m.group(1)]
            if step != phase:
                if phase:
                    progress(f"debootstrap: {phase} {count} packages")
                phase, count = step, 0
            count += 1
        elif line.startswith(("E: ", "W: ")) or (line.startswith("I: ") and line.rstrip().endswith("...")):
            progress(f"debootstrap: {line[3:].strip()}")
    if phase:
        progress(f"debootstrap: {phase} {count} packages")
    if proc.wait() != 0:
        raise LabFailure(f"debootstrap failed (exit {proc.returncode}): {tail[-1] if tail else 'no output'}")


def _chroot(root: Path, *cmd: str) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive",
           "HOME": "/root"}
    run(["chroot", str(root), *cmd], env=env)


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def _configure(p: Plan, root: Path) -> None:
    recipe = p.recipe
    # apt: the machine's sources for the suite, every companion suite included.
    for src in p.sources:
        keyring = src.signed_by
        if keyring and "\n" not in keyring and Path(keyring).is_file() and not (root / keyring.lstrip("/")).exists():
            (root / keyring.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(keyring, root / keyring.lstrip("/"))
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    _write(root, "etc/apt/sources.list.d/debian.sources", aptsources.render_deb822(p.sources))
    progress("rootfs: apt-get update with the machine's sources (" +
             ", ".join(s for src in p.sources for s in src.suites) + ") ...")
    _chroot(root, "apt-get", "update", "-q")
    # the account Ansible uses
    user = recipe["user"]
    _chroot(root, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", user)
    _write(root, f"etc/sudoers.d/{user}", f"{user} ALL=(ALL) NOPASSWD:ALL\n", 0o440)
    # sshd: host keys are written per host; the ones debootstrap generated must not be shared
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    _write(root, "etc/ssh/sshd_config.d/10-rigbook-lab.conf", SSHD_CONFIG)
    for unit in recipe.get("mask", []):
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # identity is per host
    _write(root, "etc/machine-id", "")
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    _write(root, "etc/hostname", "lab\n")
    _write(root, "etc/hosts", "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n")
    _chroot(root, "apt-get", "clean")
    _write(root, "etc/rigbook-lab-rootfs", f"{p.key}\n")


def build(p: Plan) -> Path:
    start = time.monotonic()
    work = cache_dir() / f".build-{p.key}-{os.getpid()}"
    remove_tree(work)
    target = work / "rootfs"
    target.mkdir(parents=True)
    progress(f"building the lab rootfs ({p.recipe['suite']}, {p.arch}, key {p.key}) with debootstrap "
             f"from {p.mirror.file or 'RIGBOOK_LAB_MIRROR'}; this takes about a minute, once")
    try:
        with open(work / "debootstrap.log", "w") as log:
            _debootstrap(p, target, log)
        _configure(p, target)
        recipe = {"key": p.key, "recipe": p.recipe, "arch": p.arch, "mirror": p.mirror.uris,
                  "sources": aptsources.render_deb822(p.sources), "setup": SETUP_VERSION,
                  "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.monotonic() - start, 1)}
        (work / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
        if p.path.exists():
            remove_tree(p.path)
        facts("files").move_atomic(str(work), str(p.path))
    except BaseException:
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)
        raise
    progress(f"rootfs built in {time.monotonic() - start:.0f} s: {p.root}")
    return p.root
