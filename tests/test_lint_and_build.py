"""The project's own quality gates, run by the test command: ruff, ansible-lint (production), galaxy build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rigbook.paths import link_collection

BIN = Path(sys.executable).parent


def _run(args, cwd, env=None, timeout=600):
    env = {**os.environ, **(env or {})}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_ruff_clean(repo):
    proc = _run([str(BIN / "ruff"), "check", "src", "plugins", "tests", "benchmarks"], repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile(repo):
    env = {"ANSIBLE_COLLECTIONS_PATH": str(link_collection()), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = _run([str(BIN / "ansible-lint"), "--offline", "--profile", "production", "--nocolor", "roles", "playbooks"],
                repo, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_galaxy_collection_build(repo, tmp_path):
    proc = _run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(repo)], repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = list(tmp_path.glob("rigbook-homelab-*.tar.gz"))
    assert len(built) == 1
    listing = subprocess.run(["tar", "tzf", str(built[0])], capture_output=True, text=True).stdout
    assert "plugins/modules/gpu_inventory.py" in listing and "roles/preflight/tasks/main.yml" in listing
    assert "references/x99-r9700-pair.yml" in listing  # the shipped reference baselines travel with the collection
    # the Prometheus alert rules and the Grafana dashboard (docs/health.md) too
    assert "roles/health/files/rigbook-alerts.yml" in listing and "roles/health/files/rigbook-fleet-dashboard.json" \
        in listing
    assert "src/rigbook" not in listing and ".venv" not in listing
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_every_module_documents_itself(repo):
    env = {"ANSIBLE_COLLECTIONS_PATH": str(link_collection())}
    modules = sorted(p.stem for p in (repo / "plugins" / "modules").glob("*.py"))
    assert {"ladder", "host_model", "dkms_module", "artifact"} <= set(modules)
    # one ansible-doc for all of them (its start costs a second of CPU): it fails naming the module it cannot parse
    proc = _run([str(BIN / "ansible-doc"), "--json", *(f"rigbook.homelab.{name}" for name in modules)], repo, env=env)
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    assert sorted(docs) == [f"rigbook.homelab.{name}" for name in modules], sorted(docs)
    for name, doc in docs.items():
        assert doc["doc"]["short_description"], name
    callbacks = sorted(p.stem for p in (repo / "plugins" / "callback").glob("*.py"))
    proc = _run([str(BIN / "ansible-doc"), "-t", "callback", "--json",
                 *(f"rigbook.homelab.{name}" for name in callbacks)], repo, env=env)
    assert proc.returncode == 0 and callbacks, proc.stderr
    assert sorted(json.loads(proc.stdout)) == [f"rigbook.homelab.{name}" for name in callbacks]


def test_test_file_names_are_unique(repo):
    """tests/unit mirrors the code in folders without __init__.py: pytest imports each test file by its base name,
    so two files of one name in two folders would not both be collected (an import file mismatch)."""
    seen = {}
    for path in sorted(Path(repo, "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(repo)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
