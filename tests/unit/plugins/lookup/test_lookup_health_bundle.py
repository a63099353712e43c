"""lookup/health_bundle.py: the path of rigbook-health.pyz, built in the state directory's own folder. What root's
timer runs on every box is the bundle, whatever another user of the controller planted: a file at the old name in
the temporary directory is never looked at, a file of other content or a link at the new place is never returned,
and a folder others may write is refused with a lookup error that says why."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from rigbook.paths import link_collection

link_collection()
from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.lookup import health_bundle as lookup  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.plugin_utils import health_bundle  # noqa: E402

MODULE_UTILS = Path(lookup.__file__).resolve().parents[1] / "module_utils"
PLANTED = b"import os\nos.system('id > /tmp/owned')\n"


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """(state directory, temporary directory) of this test: RIGBOOK_STATE_DIR and the temporary directory."""
    state, tmp = tmp_path / "state", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(state))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return state, tmp


def bundle():
    data = health_bundle.bundle_bytes(str(MODULE_UTILS))
    return data, health_bundle.NAME % hashlib.sha256(data).hexdigest()[:16]


def test_the_lookup_builds_in_a_private_folder_of_the_state_directory(dirs):
    state, tmp = dirs
    data, name = bundle()
    [path] = lookup.LookupModule().run([])
    assert path == str(state / health_bundle.FOLDER / name)
    assert Path(path).read_bytes() == data
    assert os.stat(state / health_bundle.FOLDER).st_mode & 0o777 == 0o700
    assert not list(tmp.iterdir())  # nothing in the temporary directory


def test_a_file_planted_at_the_old_temporary_name_is_never_used(dirs):
    _state, tmp = dirs
    data, name = bundle()
    planted = tmp / name  # the name anyone could compute: /tmp/rigbook-health-<sha>.pyz
    planted.write_bytes(PLANTED)
    [path] = lookup.LookupModule().run([])
    assert Path(path).parent != tmp and Path(path).read_bytes() == data
    assert planted.read_bytes() == PLANTED


@pytest.mark.parametrize("plant", ["other-content", "link-to-other", "link-to-the-bundle"])
def test_what_was_planted_at_the_new_place_is_never_what_the_lookup_returns(dirs, tmp_path, plant):
    state, _tmp = dirs
    data, name = bundle()
    folder = state / health_bundle.FOLDER
    folder.mkdir(parents=True, mode=0o700)
    target = folder / name
    elsewhere = tmp_path / "elsewhere.pyz"
    elsewhere.write_bytes(data if plant == "link-to-the-bundle" else PLANTED)
    if plant == "other-content":
        target.write_bytes(PLANTED)
    else:
        target.symlink_to(elsewhere)
    [path] = lookup.LookupModule().run([])
    assert path == str(target) and not os.path.islink(path)
    assert Path(path).read_bytes() == data  # what the role's copy task reads
    assert elsewhere.read_bytes() == (data if plant == "link-to-the-bundle" else PLANTED)  # never written through


@pytest.mark.parametrize("mode", [0o770, 0o722, 0o707])
def test_a_folder_with_loose_modes_is_refused_with_a_lookup_error(dirs, mode):
    state, _tmp = dirs
    folder = state / health_bundle.FOLDER
    folder.mkdir(parents=True, mode=0o700)
    folder.chmod(mode)
    with pytest.raises(AnsibleLookupError, match="rigbook-health.pyz not built: .*writable by group or others"):
        lookup.LookupModule().run([])
    assert not list(folder.iterdir())


def test_a_folder_that_is_a_link_is_refused_and_its_target_untouched(dirs, tmp_path):
    state, _tmp = dirs
    state.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    (state / health_bundle.FOLDER).symlink_to(theirs)
    with pytest.raises(AnsibleLookupError, match="is a symbolic link"):
        lookup.LookupModule().run([])
    assert not list(theirs.iterdir())


def test_the_roles_copy_task_installs_what_the_lookup_returns():
    tasks = (MODULE_UTILS.parents[1] / "roles" / "health" / "tasks" / "converge.yml").read_text()
    assert "src: \"{{ lookup('rigbook.homelab.health_bundle') }}\"" in tasks
