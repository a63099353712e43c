"""plugin_utils/private_folder.py: the state directory by the CLI's rule, and a folder of the controller user's alone
(what may not be used is refused with the reason the caller gives, nothing changed)."""

from __future__ import annotations

import os
import re

import pytest

from rigbook import paths
from rigbook.paths import link_collection

link_collection()
from ansible_collections.rigbook.homelab.plugins.plugin_utils import private_folder  # noqa: E402


@pytest.mark.parametrize("env, expected", [
    ({"RIGBOOK_STATE_DIR": "/srv/s", "XDG_STATE_HOME": "/x", "HOME": "/h"}, "/srv/s"),
    ({"RIGBOOK_STATE_DIR": "~/s", "HOME": "/h"}, "/h/s"),
    ({"XDG_STATE_HOME": "/x", "HOME": "/h"}, "/x/rigbook"),
    ({"HOME": "/h"}, "/h/.local/state/rigbook"),
])
def test_the_state_directory_follows_the_clis_rule(monkeypatch, env, expected):
    for name in ("RIGBOOK_STATE_DIR", "XDG_STATE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert private_folder.state_dir() == expected
    monkeypatch.setattr(paths, "_guard_state_dir", lambda path: None)  # the CLI's rule, without making the folder
    assert str(paths.state_dir()) == expected


def test_a_missing_folder_and_its_parents_are_made_the_users_alone(tmp_path):
    folder = tmp_path / "state" / "kept"
    assert private_folder.private_folder(str(folder)) == str(folder)
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700) and oct(folder.parent.stat().st_mode & 0o777) == oct(0o700)


@pytest.mark.parametrize("make, words", [
    (lambda f: (f.mkdir(), f.chmod(0o775)), "the folder {f} is writable by group or others (mode 0775): WHY"),
    (lambda f: ((f.parent / "theirs").mkdir(), f.symlink_to(f.parent / "theirs")),
     "{f} is a symbolic link: WHY, never where a link leads"),
    (lambda f: f.write_bytes(b"x"), "{f} is not a folder"),
    (lambda f: f.parent.chmod(0o777), "the state directory {p} is writable by group or others (mode 0777): WHY"),
], ids=["group-writable", "link", "a-file", "open-parent"])
def test_a_folder_not_the_users_alone_is_refused_with_the_callers_reason(tmp_path, make, words):
    parent = tmp_path / "state"
    parent.mkdir(mode=0o700)
    folder = parent / "kept"
    make(folder)
    with pytest.raises(private_folder.FolderRefused, match=re.escape(words.format(f=folder, p=parent))):
        private_folder.private_folder(str(folder), "the state directory", why="WHY")
    if folder.is_dir() and not folder.is_symlink():
        assert os.listdir(folder) == []
