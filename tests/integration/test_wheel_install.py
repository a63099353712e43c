"""A wheel built from the repo, installed in a fresh venv away from the checkout: `provision validate` and
`provision verify --replay` work from the collection the wheel carries (rigbook/collection/, setup.py's build_py).

Offline and without root: the wheel is built with the test venv's setuptools and wheel (--no-build-isolation), the
fresh venv has no pip and gets the wheel alone (--no-deps); its dependencies (ansible-core, jsonschema, ...) come
from the test venv's site-packages through a .pth file, which adds that directory but runs none of its .pth files,
so the test venv's editable rigbook stays out of sight. Takes about 5 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests" / "fixtures" / "device" / "h200-snapshot.tar.gz"
# Checkout-only things left out of the copy the wheel is built from (build outputs, venvs, caches).
TOP_IGNORED = {".venv", ".git", "build", "dist", ".ansible", ".pytest_cache", ".ruff_cache", ".whl", ".gl", ".device"}


def _ignore(directory, names):
    top = Path(directory) == REPO
    return {n for n in names if (top and n in TOP_IGNORED) or n == "__pycache__" or n.endswith((".pyc", ".egg-info"))}


def _run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)


def _verdicts(stdout: str) -> dict:
    """The --json summary, with each replay's own temporary directory (named in some messages) made equal."""
    return json.loads(re.sub(r"rigbook-replay-[A-Za-z0-9_]+", "rigbook-replay-*", stdout))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(fresh venv, wheel): the wheel built from a copy of the repo, installed in a venv of its own."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(REPO, source, ignore=_ignore, symlinks=True)
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                 "--disable-pip-version-check", "-q", "-w", base / "dist", source])
    assert proc.returncode == 0, "building the wheel (needs setuptools and wheel: pip install -e '.[test]'):\n" + \
        proc.stdout + proc.stderr
    (wheel,) = (base / "dist").glob("rigbook-*.whl")
    venv = base / "fresh"
    proc = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert proc.returncode == 0, proc.stderr
    python = venv / "bin" / "python"
    proc = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                 "--disable-pip-version-check", "-q", wheel])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    test_venv = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "rigbook_test_dependencies.pth").write_text("\n".join(test_venv) + "\n")
    return venv, wheel


@pytest.fixture
def elsewhere(tmp_path):
    """A working directory outside the checkout, its own state directory, no RIGBOOK_COLLECTION_ROOT."""
    env = {k: v for k, v in os.environ.items() if k not in ("RIGBOOK_COLLECTION_ROOT", "PYTHONPATH", "VIRTUAL_ENV")}
    env["RIGBOOK_STATE_DIR"] = str(tmp_path / "state")
    work = tmp_path / "work"
    work.mkdir()
    return work, env


def test_the_wheel_carries_the_collection(installed):
    _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("galaxy.yml", "meta/host_vars.schema.json", "meta/runtime.yml", "plugins/action/host_model.py",
                   "plugins/plugin_utils/host_vars_schema.py", "roles/preflight/tasks/main.yml", "playbooks/site.yml",
                   "inventory/homelab/hosts.yml", "inventory/lab/group_vars/x99_3080.yml", "tests/artifacts/pack.py"):
        assert f"rigbook/collection/{needed}" in names, needed
    assert {"rigbook/lab/rigs/x99-3080.yml", "rigbook/lab/rigs/x99-r9700.yml"} <= set(names)  # the lab rigs
    inside = [n for n in names if n.startswith("rigbook/collection/")]
    assert not [n for n in inside if "__pycache__" in n or n.startswith("rigbook/collection/src/")
                or n.startswith("rigbook/collection/tests/fixtures/") or "/.venv/" in n]


def test_the_installed_package_and_its_collection_are_used(installed, elsewhere):
    venv, _ = installed
    work, env = elsewhere
    code = ("import json, rigbook; from rigbook import paths; "
            "print(json.dumps([rigbook.__file__, str(paths.collection_root())]))")
    proc = _run([venv / "bin" / "python", "-c", code], cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    package, root = map(Path, json.loads(proc.stdout))
    assert package.is_relative_to(venv) and root.is_relative_to(venv), (package, root)
    assert root == package.parent / "collection"


def test_validate_a_copy_of_homelab(installed, elsewhere):
    venv, _ = installed
    work, env = elsewhere
    inv = work / "homelab"
    shutil.copytree(REPO / "inventory" / "homelab", inv)
    proc = _run([venv / "bin" / "provision", "validate", "-i", inv], cwd=work, env=env)
    # the installed collection's host model: what only the seeds' owners can supply is named (exit 2)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "inventory is not ready: 10 inputs the play needs are missing" in proc.stderr
    assert "rigbook_pins.kernel.debs: needed by the kernel role" in proc.stderr
    group = inv / "group_vars" / "x99_3080.yml"
    data = yaml.safe_load(group.read_text())
    data["rigbook_gpu"]["count"] = "two"
    group.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = _run([venv / "bin" / "provision", "validate", "-i", inv], cwd=work, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "x99_3080.yml: group x99_3080: rigbook_gpu.count: bad value \"two\" (str): must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_replay_the_h200_snapshot_as_the_checkout_does(installed, elsewhere, tmp_path):
    venv, _ = installed
    work, env = elsewhere
    snapshot = work / SNAPSHOT.name
    shutil.copy(SNAPSHOT, snapshot)
    wheel = _run([venv / "bin" / "provision", "verify", "--replay", snapshot, "--json"], cwd=work, env=env)
    checkout_env = {**env, "RIGBOOK_STATE_DIR": str(tmp_path / "checkout-state")}
    checkout = _run([sys.executable, "-m", "rigbook", "verify", "--replay", snapshot, "--json"],
                    cwd=work, env=checkout_env)
    assert checkout.stdout, checkout.stderr
    assert wheel.returncode == checkout.returncode, wheel.stderr
    assert _verdicts(wheel.stdout) == _verdicts(checkout.stdout)
    assert json.loads(wheel.stdout)["hosts"]["h200"]["ladder"]
    link = Path(env["RIGBOOK_STATE_DIR"]) / "collections" / "ansible_collections" / "rigbook" / "homelab"
    assert link.resolve().is_relative_to(venv.resolve()), link.resolve()
