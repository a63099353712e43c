"""plugin_utils/health_bundle.py: rigbook-health.pyz is reproducible byte for byte, named by its sha256, and runs as
the timer runs it (`python3 rigbook-health.pyz --config FILE`) against a lab rig's recorded tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
from helpers.cli import REPO

from rigbook.lab import hardware_trees
from rigbook.paths import link_collection
from rigbook.snapshots import ladder_view_of
from rigbook.validate import validate

link_collection()
from ansible_collections.rigbook.homelab.plugins.plugin_utils import health_bundle  # noqa: E402

MODULE_UTILS = REPO / "plugins" / "module_utils"


def test_the_bundle_is_reproducible_and_named_by_its_sha256(tmp_path):
    first = health_bundle.bundle_bytes(str(MODULE_UTILS))
    assert health_bundle.bundle_bytes(str(MODULE_UTILS)) == first
    (tmp_path / "a").mkdir()
    path = health_bundle.bundle_path(str(MODULE_UTILS), str(tmp_path / "a"))
    assert health_bundle.bundle_path(str(MODULE_UTILS), str(tmp_path / "a")) == path  # found, not rewritten
    names = zipfile.ZipFile(path).namelist()
    assert "__main__.py" in names and f"{health_bundle.PACKAGE}/ladder/health.py" in names
    assert "ansible_collections/__init__.py" in names and not [n for n in names if "__pycache__" in n]


def test_a_file_of_the_bundles_name_is_used_only_when_its_sha256_is_the_bundles(tmp_path):
    path = health_bundle.bundle_path(str(MODULE_UTILS), str(tmp_path))
    good = open(path, "rb").read()
    with open(path, "wb") as planted:  # cut short, or put there by another user of the temporary directory
        planted.write(good[:100])
    assert health_bundle.bundle_path(str(MODULE_UTILS), str(tmp_path)) == path
    assert open(path, "rb").read() == good and os.stat(path).st_mode & 0o777 == 0o644
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(good)
    os.unlink(path)
    os.symlink(elsewhere, path)  # a link is never written through, even to the right bytes
    with pytest.raises(OSError, match="symbolic link"):
        health_bundle.bundle_path(str(MODULE_UTILS), str(tmp_path))
    assert elsewhere.read_bytes() == good


def test_the_bundle_runs_as_the_timer_runs_it(tmp_path):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    config = tmp_path / "health.json"
    config.write_text(json.dumps({"host": "lab-r9700", "ladder_view": ladder_view_of(validate("inventory/lab"),
                                                                                     "lab-r9700"),
                                  "evidence_root": str(tree), "serve": [], "textfile": str(tmp_path / "rigbook.prom"),
                                  "state_dir": str(tmp_path / "state")}))
    pyz = health_bundle.bundle_path(str(MODULE_UTILS), str(tmp_path))
    # -I: isolated from this checkout (no current directory, no PYTHONPATH, no user site): only the zip is imported
    proc = subprocess.run([sys.executable, "-I", pyz, "--config", str(config)], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a layer of the unbooted tree fails (its kernel is the seed's)
    assert "firmware: pass" in proc.stdout and "error_counters: " in proc.stdout
    assert 'rigbook_layer_status{layer="pcie_link"} 0' in (tmp_path / "rigbook.prom").read_text()
