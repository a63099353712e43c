"""The collection as users get it: built with `ansible-galaxy collection build`, installed from the tarball into a
clean path, run by an ansible-core of its own (a release in a venv of its own, cached), and nothing else on Ansible's
collection paths.

The checkout is a collection too (galaxy.yml at the root) and the test session links it as
<state>/collections/ansible_collections/rigbook/homelab (rigbook.paths.link_collection, tests/conftest.py) and puts
that folder on sys.path: `isolated_env()` gives a run ANSIBLE_COLLECTIONS_PATH = the install folder alone, turns
ANSIBLE_COLLECTIONS_SCAN_SYS_PATH off, drops PYTHONPATH and every ANSIBLE_* / RIGBOOK_* variable of the session and
gives it a HOME of its own (no ~/.ansible/collections), so a module the tarball lacks fails the run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the .venv's ansible-core (scripts/test installs `.[test]`)

# The supported ansible-core range: meta/runtime.yml's requires_ansible (its lowest release) up to the newest release
# tested, stated in README.md's Development section. NEWEST is the newest ansible-core on PyPI when it was last
# raised (2.21.5, 2026-12): raise it, and the README line, when a newer one ships.
LOWEST = "2.19.0"
NEWEST = "2.21.5"

# The lowest controller Python of each ansible-core series (ansible-core's support matrix): 2.19 runs on 3.11-3.13,
# 2.20 and 2.21 need 3.12 or later. The .venv's own Python (3.11) where it may, else a newer one found on the box.
CONTROLLER_PYTHON = {"2.19": (3, 11), "2.20": (3, 12), "2.21": (3, 12)}

# ansible-core venvs, one per release and Python, kept between runs (pip's --no-compile: a few seconds each once
# the wheels are cached); RIGBOOK_TEST_ANSIBLE_CACHE moves them.
CACHE = Path(os.environ.get("RIGBOOK_TEST_ANSIBLE_CACHE") or "/tmp/rigbook-test-ansible-core")


def run(args, cwd=None, env=None, timeout=600):
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def requires_ansible() -> str:
    """meta/runtime.yml's requires_ansible (the collection's own statement of the ansible-core it needs)."""
    text = (REPO / "meta" / "runtime.yml").read_text()
    match = re.search(r"^requires_ansible:\s*[\"']?([^\"'\n]+)[\"']?\s*$", text, re.M)
    assert match, "meta/runtime.yml has no requires_ansible"
    return match.group(1).strip()


def isolated_env(collections: Path, home: Path) -> dict:
    """The environment of a run that sees the installed collection and nothing else (see the module's text)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANSIBLE_", "RIGBOOK_")) and key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    home.mkdir(parents=True, exist_ok=True)
    env.update({
        "HOME": str(home),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    })
    return env


def build(dest: Path, bin_dir: Path = BIN) -> Path:
    """`ansible-galaxy collection build` of the checkout (galaxy.yml's build_ignore leaves src/, tests/, ... out)."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = run([bin_dir / "ansible-galaxy", "collection", "build", "--output-path", dest, REPO], cwd=dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = dest.glob("rigbook-homelab-*.tar.gz")
    return tarball


def install(tarball: Path, dest: Path, bin_dir: Path, home: Path) -> Path:
    """`ansible-galaxy collection install TARBALL -p DEST` by BIN_DIR's ansible-core; returns DEST, a collections
    path (DEST/ansible_collections/rigbook/homelab)."""
    proc = run([bin_dir / "ansible-galaxy", "collection", "install", tarball, "-p", dest],
               cwd=dest.parent, env=isolated_env(dest, home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (dest / "ansible_collections" / "rigbook" / "homelab" / "MANIFEST.json").is_file(), proc.stdout
    return dest


def _python_version(python: str):
    try:
        proc = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=30)
    except OSError:
        return None
    if proc.returncode != 0:  # e.g. a pyenv shim of a version that is not selected
        return None
    return tuple(int(part) for part in proc.stdout.strip().split("."))


def python_for(version: str) -> tuple:
    """(path, (major, minor)) of a Python that runs ansible-core VERSION as a controller: the .venv's own where it
    may, else the lowest newer one on PATH or under ~/.pyenv/versions."""
    series = ".".join(version.split(".")[:2])
    need = CONTROLLER_PYTHON[series]
    if sys.version_info[:2] >= need:
        return sys.executable, sys.version_info[:2]
    found = []
    names = [f"python3.{minor}" for minor in range(need[1], 15)]
    candidates = [shutil.which(name) for name in names]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python3"))
    for python in filter(None, candidates):
        got = _python_version(python)
        if got and got >= need:
            found.append((got, python))
    assert found, f"no Python {need[0]}.{need[1]} or later on this box for ansible-core {version} ({names})"
    got, python = min(found)
    return python, got


def requirements(tarball: Path) -> list:
    """The controller-side Python requirements the built collection declares (its requirements.txt, which
    meta/execution-environment.yml names for ansible-builder)."""
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        assert "meta/execution-environment.yml" in names and "requirements.txt" in names, names
        text = tar.extractfile("requirements.txt").read().decode()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def ansible_core(version: str, extra: tuple = ()) -> Path:
    """The bin folder of a venv holding ansible-core==VERSION and the EXTRA requirements, nothing else (made once,
    under a lock: two test processes may ask at once; a folder without its ready mark is made again)."""
    python, got = python_for(version)
    key = hashlib.sha256("\n".join(sorted(extra)).encode()).hexdigest()[:8]
    venv = CACHE / f"ansible-core-{version}-py{got[0]}.{got[1]}-{key}"
    ready = venv / ".rigbook-ready"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(str(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.is_file():
            shutil.rmtree(venv, ignore_errors=True)
            proc = run([python, "-m", "venv", "--without-pip", venv])
            assert proc.returncode == 0, proc.stdout + proc.stderr
            # the .venv's pip installs into it (pip's --python: no ensurepip in the new venv), from PyPI
            proc = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
                        "--no-compile", "--disable-pip-version-check", f"ansible-core=={version}", *extra])
            assert proc.returncode == 0, proc.stdout + proc.stderr
            ready.write_text(version + "\n")
    bin_dir = venv / "bin"
    proc = run([bin_dir / "ansible", "--version"])
    assert proc.returncode == 0 and f"[core {version}]" in proc.stdout, proc.stdout + proc.stderr
    return bin_dir


def collection_list(bin_dir: Path, collections: Path, home: Path) -> dict:
    """`ansible-galaxy collection list --format json` under the isolated environment: {path: {name: {version}}}."""
    proc = run([bin_dir / "ansible-galaxy", "collection", "list", "--format", "json"], cwd=home,
               env=isolated_env(collections, home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)
