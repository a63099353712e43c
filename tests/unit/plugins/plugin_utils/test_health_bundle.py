"""plugin_utils/health_bundle.py: rigbook-health.pyz is reproducible byte for byte, named by its sha256, built only in
a folder of the controller user's own (never the temporary directory, never through a link, never from a planted
file), and runs as the timer runs it (`python3 rigbook-health.pyz --config FILE`) against a lab rig's recorded
tree."""

from __future__ import annotations

import json
import os
import re
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
from ansible_collections.rigbook.homelab.plugins.plugin_utils.private_folder import FolderRefused  # noqa: E402

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
    folder = tmp_path / "bundle"
    path = health_bundle.bundle_path(str(MODULE_UTILS), str(folder))
    good = open(path, "rb").read()
    assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(path).st_mode & 0o777 == 0o600
    with open(path, "wb") as planted:  # cut short, or of other content
        planted.write(good[:100])
    assert health_bundle.bundle_path(str(MODULE_UTILS), str(folder)) == path
    assert open(path, "rb").read() == good
    elsewhere = tmp_path / "elsewhere"
    for content in (b"#!/bin/sh\nid > /tmp/owned\n", good):  # a link is never followed, even to the right bytes
        elsewhere.write_bytes(content)
        os.unlink(path)
        os.symlink(elsewhere, path)
        assert health_bundle.bundle_path(str(MODULE_UTILS), str(folder)) == path
        assert not os.path.islink(path) and open(path, "rb").read() == good
        assert elsewhere.read_bytes() == content


@pytest.mark.parametrize("make, words", [
    (lambda f: (f.mkdir(), f.chmod(0o770)), "writable by group or others (mode 0770)"),
    (lambda f: (f.mkdir(), f.chmod(0o757)), "writable by group or others (mode 0757)"),
    pytest.param(lambda f: (f.mkdir(), os.chown(f, 65534, 65534)), "is owned by uid 65534",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder away needs root")),
    (lambda f: ((f.parent / "theirs").mkdir(), f.symlink_to(f.parent / "theirs")), "is a symbolic link"),
    (lambda f: f.write_bytes(b"x"), "is not a folder"),
], ids=["group-writable", "world-writable", "foreign-owner", "link", "a-file"])
def test_a_folder_that_is_not_the_users_alone_is_refused_and_nothing_is_written_there(tmp_path, make, words):
    folder = tmp_path / "bundle"
    make(folder)
    before = sorted(os.listdir(tmp_path)) + (sorted(os.listdir(folder)) if folder.is_dir() else [])
    with pytest.raises(FolderRefused, match=re.escape(words)):
        health_bundle.bundle_path(str(MODULE_UTILS), str(folder))
    assert sorted(os.listdir(tmp_path)) + (sorted(os.listdir(folder)) if folder.is_dir() else []) == before


def test_a_state_directory_others_may_write_is_refused(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    state.chmod(0o777)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(state))
    with pytest.raises(FolderRefused, match=r"the state directory .* writable by group or others"):
        health_bundle.bundle_path(str(MODULE_UTILS))
    assert not list(state.iterdir())


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
