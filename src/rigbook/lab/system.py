"""This machine: root, the system tools the lab needs (installed through apt), mounts, progress.

Every command the lab runs goes through the collection's facts/runner (`paths.facts("runner")`): `run` here for
the ones whose failure ends the lab command, runner.run where a caller judges the result itself, runner.spawn for
a child that keeps running (the supervisor, nspawn, debootstrap's streamed output).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from rigbook.errors import Reported, UserError
from rigbook.paths import facts

# command -> Debian package that provides it
TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "mount": "mount",
    "chroot": "coreutils",
    "apt-ftparchive": "apt-utils",  # the ROCm stand-in repository (src/rigbook/lab/artifacts.py)
    "gpg": "gpg",
}


class LabFailure(Reported):
    """Something went wrong while doing the work (not bad input): printed on one line, exit 1."""

    exit_code = 1


def progress(message: str) -> None:
    print(f"lab: {message}", flush=True)


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UserError(
            f"`provision lab {what}` needs root (it boots systemd-nspawn containers and mounts their "
            f"roots): run it as root, e.g. `sudo provision lab {what}`"
        )


def missing_tools() -> list:
    return [tool for tool in TOOLS if not shutil.which(tool, path=_path())]


def _path() -> str:
    extra = "/usr/local/sbin:/usr/sbin:/sbin"
    return os.environ.get("PATH", "/usr/bin:/bin") + os.pathsep + extra


def ensure_tools() -> None:
    """Install what is missing through apt-get, with a progress line; or say exactly what to install."""
    missing = missing_tools()
    if not missing:
        return
    packages = sorted({TOOLS[t] for t in missing})
    apt = shutil.which("apt-get", path=_path())
    if not apt or os.environ.get("RIGBOOK_LAB_NO_INSTALL"):
        raise UserError(
            f"missing {', '.join(missing)}: install the packages {' '.join(packages)} "
            f"(e.g. `apt-get install {' '.join(packages)}`)"
        )
    progress(f"installing {' '.join(packages)} with apt-get (missing: {', '.join(missing)}) ...")
    runner = facts("runner")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    cmd = [apt, "install", "-y", "--no-install-recommends", *packages]
    result = runner.run(cmd, env=env)
    if result.rc != 0:
        progress("apt-get install failed; refreshing the package lists and trying once more ...")
        runner.run([apt, "update"], env=env)
        result = runner.run(cmd, env=env)
    if result.rc != 0 or missing_tools():
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [result.error or "no output"]
        raise LabFailure(f"could not install {' '.join(packages)} with apt-get: {tail[0]}")
    progress(f"installed {' '.join(packages)}")


def run(cmd: list, env: dict | None = None, timeout: float | None = None):
    """Run CMD through facts/runner (PATH includes sbin; ENV, when given, is the whole environment, else this
    process's) and return its runner.Result; raise LabFailure with its last stderr line when it fails, and with
    why when it cannot start or runs past TIMEOUT."""
    result = facts("runner").run(cmd, env=dict(env or {}, PATH=_path()), clean_env=bool(env), timeout=timeout)
    if result.rc is None:
        raise LabFailure(f"`{' '.join(str(c) for c in cmd[:4])}` failed: {result.error}")
    if result.rc != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.rc}"]
        raise LabFailure(f"`{' '.join(str(c) for c in cmd[:4])}` failed: {last[0]}")
    return result


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts_under(path: Path) -> list:
    """Mount points at or below PATH, deepest first (from /proc/self/mountinfo)."""
    base = str(Path(path).resolve())
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            point = _unescape(line.split()[4])
            if point == base or point.startswith(base + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_under(path: Path) -> list:
    """Unmount everything at or below PATH; returns what could not be unmounted."""
    stuck = []
    runner = facts("runner")
    for point in mounts_under(path):
        if runner.run(["umount", point]).rc != 0:
            stuck.append(point)
    return [p for p in stuck if p in mounts_under(path)]


def remove_tree(path: Path) -> None:
    """rm -rf PATH, refusing while anything is still mounted below it."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    left = mounts_under(path)
    if left:
        raise LabFailure(f"{left[0]} is still mounted: not removing {path}")
    shutil.rmtree(path)


def python() -> str:
    return sys.executable
