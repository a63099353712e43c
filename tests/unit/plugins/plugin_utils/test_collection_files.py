"""plugin_utils/collection_files.py: the collection's own files as one sha256 (the converged states' inputs, the kept
module payloads' key)."""

from __future__ import annotations

from rigbook.paths import link_collection

link_collection()
from ansible_collections.rigbook.homelab.plugins.plugin_utils import collection_files  # noqa: E402


def test_the_digest_changes_with_a_file_of_its_own_and_not_with_bytecode(tmp_path):
    for part in collection_files.PARTS:
        (tmp_path / part).mkdir()
    task = tmp_path / "roles" / "main.yml"
    task.write_text("- name: a\n")
    (tmp_path / "plugins" / "__pycache__").mkdir()
    (tmp_path / "plugins" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    first = collection_files.digest(str(tmp_path))
    (tmp_path / "plugins" / "__pycache__" / "x.pyc").write_bytes(b"\1")
    assert collection_files.digest(str(tmp_path)) == first
    task.write_text("- name: b\n")
    assert collection_files.digest(str(tmp_path)) != first


def test_parts_limit_what_is_read(tmp_path):
    (tmp_path / "plugins" / "modules").mkdir(parents=True)
    (tmp_path / "roles").mkdir()
    (tmp_path / "plugins" / "modules" / "m.py").write_text("A = 1\n")
    first = collection_files.digest(str(tmp_path), ("plugins/modules",))
    (tmp_path / "roles" / "main.yml").write_text("- name: a\n")
    assert collection_files.digest(str(tmp_path), ("plugins/modules",)) == first
    assert collection_files.digest(str(tmp_path)) != first
