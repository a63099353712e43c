"""facts/api_key.py: the one API key reader: first line, stripped, printable ASCII without spaces."""

from __future__ import annotations

import os

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import api_key


def test_the_key_is_the_first_line_stripped(tmp_path):
    (tmp_path / "key").write_text("  sk-rigbook-0123\nsecond line\n")
    assert api_key.read_key(str(tmp_path / "key")) == ("sk-rigbook-0123", None)


def test_no_file_named_is_no_key_and_no_error():
    assert api_key.read_key(None) == (None, None) and api_key.read_key("") == (None, None)


def test_an_unreadable_empty_or_misshapen_key_is_refused_without_showing_it(tmp_path):
    key, why = api_key.read_key(str(tmp_path / "missing"))
    assert key is None and "No such file" in why
    (tmp_path / "empty").write_text("\n")
    key, why = api_key.read_key(str(tmp_path / "empty"))
    assert key is None and "is empty" in why
    for bad in ("two words", "tab\tinside", "\x1b[2Jescape", "k" * (api_key.MAX_KEY + 1)):
        (tmp_path / "bad").write_text(bad + "\n")
        key, why = api_key.read_key(str(tmp_path / "bad"))
        assert key is None and bad.strip() not in why


def test_a_key_file_with_no_read_permission_says_so(tmp_path):
    if os.geteuid() == 0:
        (tmp_path / "k").mkdir()  # root reads any file: a folder is what root cannot read as a key
        key, why = api_key.read_key(str(tmp_path / "k"))
    else:
        (tmp_path / "k").write_text("secret\n")
        os.chmod(tmp_path / "k", 0)
        key, why = api_key.read_key(str(tmp_path / "k"))
    assert key is None and why.startswith("api_key_file ")
