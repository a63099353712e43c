"""facts/files.py: the evidence root, bounded reads, the sha256 of a file, the one atomic write and the no-follow
reader."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
import threading

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files


def test_path_joins_under_the_root_and_only_slash_is_live(tmp_path):
    assert files.path("", "proc", "cmdline") == "/proc/cmdline"
    assert files.path(str(tmp_path), "sys") == str(tmp_path / "sys")
    assert files.is_live("/") and files.is_live(None)
    assert not files.is_live(str(tmp_path))


def test_read_text_strips_bounds_and_says_none_for_what_cannot_be_read(tmp_path):
    (tmp_path / "a").write_bytes(b"  0x10de\n")
    (tmp_path / "big").write_bytes(b"x" * 100)
    (tmp_path / "bad").write_bytes(b"\xff\xfe")
    assert files.read_text(str(tmp_path / "a")) == "0x10de"
    assert files.read_text(str(tmp_path / "a"), strip=False) == "  0x10de\n"
    assert files.read_text(str(tmp_path / "big"), limit=10) == "x" * 10
    assert files.read_text(str(tmp_path / "bad")) == "\ufffd\ufffd"
    assert files.read_text(str(tmp_path / "missing")) is None
    assert files.read_text(str(tmp_path)) is None  # a folder


def test_read_json_tells_missing_from_garbled_and_too_large(tmp_path):
    (tmp_path / "ok.json").write_text('{"a": 1}')
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "big.json").write_text('"' + "x" * 100 + '"')
    assert files.read_json(str(tmp_path / "ok.json")) == ({"a": 1}, None)
    assert files.read_json(str(tmp_path / "missing.json")) == (None, None)
    data, error = files.read_json(str(tmp_path / "bad.json"))
    assert data is None and "not JSON" in error
    data, error = files.read_json(str(tmp_path / "big.json"), limit=50)
    assert data is None and "larger than 50 bytes" in error


def test_sha256_of_hashes_the_file_and_raises_for_what_has_no_digest(tmp_path):
    payload = os.urandom(3 << 20)  # more than one chunk
    (tmp_path / "lib.so").write_bytes(payload)
    os.symlink("lib.so", tmp_path / "link.so")
    assert files.sha256_of(str(tmp_path / "lib.so")) == hashlib.sha256(payload).hexdigest()
    assert files.sha256_of(str(tmp_path / "link.so")) == hashlib.sha256(payload).hexdigest()  # links followed
    with pytest.raises(OSError):
        files.sha256_of(str(tmp_path / "missing"))
    with pytest.raises(OSError):
        files.sha256_of(str(tmp_path))  # a folder has no digest


def test_digest_refuses_a_deleted_mapping_and_names_the_unreadable(tmp_path):
    (tmp_path / "libnccl.so.2").write_bytes(b"new file under the old name")
    sha, why = files.digest(str(tmp_path / "libnccl.so.2") + " (deleted)")
    assert sha is None and "was deleted" in why
    sha, why = files.digest(str(tmp_path / "missing"))
    assert sha is None and "cannot read" in why
    assert files.digest(str(tmp_path / "libnccl.so.2"))[0] == hashlib.sha256(b"new file under the old name").hexdigest()


def test_readable_by_anyone_needs_the_file_world_readable_and_every_folder_above_searchable(tmp_path):
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # /tmp and / are searchable by anyone; pytest's base is not
        os.chmod(top, 0o755)
        folder = os.path.join(top, "archives")
        os.mkdir(folder, 0o755)
        deb = os.path.join(folder, "linux-image.deb")
        with open(deb, "wb") as handle:
            handle.write(b"deb")
        os.chmod(deb, 0o644)
        assert files.readable_by_anyone(deb) is True
        os.chmod(deb, 0o640)
        assert files.readable_by_anyone(deb) is False
        os.chmod(deb, 0o644)
        os.chmod(folder, 0o750)
        assert files.readable_by_anyone(deb) is False
        os.chmod(folder, 0o755)
        assert files.readable_by_anyone(folder) is False  # a folder is no file to fetch
        assert files.readable_by_anyone(os.path.join(folder, "missing.deb")) is False
    (tmp_path / "kept.deb").write_bytes(b"deb")
    os.chmod(tmp_path / "kept.deb", 0o644)
    assert files.readable_by_anyone(str(tmp_path / "kept.deb")) is False  # pytest's base folder is 0700


def test_write_atomic_replaces_the_file_whole_with_its_mode(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    files.write_atomic(str(target), "new", mode=0o600)
    assert target.read_text() == "new"
    assert (target.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left


def test_write_atomic_never_writes_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "state.json")
    with pytest.raises(OSError, match="symbolic link"):
        files.write_atomic(str(tmp_path / "state.json"), "planted")
    assert victim.read_text() == "keep"


def test_the_mode_is_set_on_the_file_opened_not_on_what_its_name_holds_later(tmp_path, monkeypatch):
    """Another user of a shared folder swaps the temporary name for a link to root's file right after it is made:
    the mode goes to the file rigbook opened, never to the link's target."""
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    victim.chmod(0o600)
    real_mkstemp = files.tempfile.mkstemp

    def swapped(*args, **kwargs):
        handle, tmp = real_mkstemp(*args, **kwargs)
        os.unlink(tmp)
        os.symlink(victim, tmp)
        return handle, tmp

    monkeypatch.setattr(files.tempfile, "mkstemp", swapped)
    files.write_atomic(str(tmp_path / "metrics.prom"), "x 1\n", mode=0o644)
    assert victim.read_text() == "root's file" and victim.stat().st_mode & 0o777 == 0o600


def test_write_atomic_leaves_nothing_behind_when_it_fails(tmp_path, monkeypatch):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError):
        files.write_atomic(str(tmp_path / "x"), b"data")
    assert list(tmp_path.iterdir()) == []


def test_sync_folder_syncs_the_folder_after_the_rename_and_a_folder_that_cannot_is_named(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(files, "fsync_folder", synced.append)
    files.write_atomic(str(tmp_path / "a.json"), "{}")
    assert synced == []
    files.write_atomic(str(tmp_path / "a.json"), "{}", sync_folder=True)
    assert synced == [str(tmp_path)] and (tmp_path / "a.json").read_text() == "{}"
    monkeypatch.undo()
    assert files.fsync_folder(str(tmp_path)) is None
    assert "cannot open" in files.fsync_folder(str(tmp_path / "missing"))


def test_write_json_makes_parents_and_returns_the_error_text(tmp_path):
    assert files.write_json(str(tmp_path / "a" / "b.json"), {"b": 2, "a": 1}) is None
    assert (tmp_path / "a" / "b.json").read_text() == '{\n  "a": 1,\n  "b": 2\n}\n'
    (tmp_path / "file").write_text("")
    assert "cannot write" in files.write_json(str(tmp_path / "file" / "x.json"), {})


def test_link_atomic_repoints_a_link_and_refuses_a_folder(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    files.link_atomic("v1", str(tmp_path / "current"))
    files.link_atomic("v2", str(tmp_path / "current"))
    assert os.readlink(tmp_path / "current") == "v2"
    with pytest.raises(OSError, match="folder"):
        files.link_atomic("v2", str(tmp_path / "v1"))


def test_move_atomic_puts_a_finished_file_or_folder_in_place_and_refuses_a_link(tmp_path):
    (tmp_path / ".download-1").write_bytes(b"verified")
    (tmp_path / "artifact.tar.gz").write_bytes(b"old")
    assert files.move_atomic(str(tmp_path / ".download-1"), str(tmp_path / "artifact.tar.gz")).endswith("tar.gz")
    assert (tmp_path / "artifact.tar.gz").read_bytes() == b"verified" and not (tmp_path / ".download-1").exists()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "lib.so").write_text("built")
    files.move_atomic(str(tmp_path / "work"), str(tmp_path / "prefix"))
    assert (tmp_path / "prefix" / "lib.so").read_text() == "built"
    (tmp_path / "new").write_text("planted")
    os.symlink(tmp_path / "artifact.tar.gz", tmp_path / "link")
    with pytest.raises(OSError, match="symbolic link"):
        files.move_atomic(str(tmp_path / "new"), str(tmp_path / "link"))
    assert (tmp_path / "artifact.tar.gz").read_bytes() == b"verified" and (tmp_path / "new").exists()


def test_write_many_changes_no_target_when_one_cannot_be_staged(tmp_path):
    (tmp_path / "a.yml").write_text("old a")
    os.symlink(tmp_path / "a.yml", tmp_path / "b.yml")  # the second target is a link: refused
    with pytest.raises(OSError, match="symbolic link"):
        files.write_many([(str(tmp_path / "new.yml"), "new"), (str(tmp_path / "b.yml"), "planted")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yml", "b.yml"]  # nothing staged is left, nothing new
    assert (tmp_path / "a.yml").read_text() == "old a"
    files.write_many([(str(tmp_path / "x" / "one.yml"), "1"), (str(tmp_path / "two.yml"), b"2")], make_parents=True)
    assert (tmp_path / "x" / "one.yml").read_text() == "1" and (tmp_path / "two.yml").read_text() == "2"


# --- the no-follow reader: a tree a local user owns (tree/venv), a root-only file outside it (secret) --------------

SECRET = "root-only: hunter2"


def _tree(tmp_path):
    root = tmp_path / "tree"
    (root / "venv/lib").mkdir(parents=True)
    (root / "venv/lib/RECORD").write_text("mine\n")
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/RECORD").write_text(SECRET)
    return root, secret


def test_the_no_follow_reader_reads_a_regular_file_and_says_a_missing_one(tmp_path):
    root, _secret = _tree(tmp_path)
    assert files.read_nofollow(str(root), "/venv/lib/RECORD") == (b"mine\n", None)
    assert files.read_nofollow(str(root), "venv/lib/RECORD", limit=5) == (b"mine\n", None)
    assert files.read_nofollow(str(root), "venv/lib/none") == (None, None)
    assert files.read_nofollow(str(root), "venv/none/RECORD") == (None, None)
    assert files.json_nofollow(str(root), "venv/lib/none") == (None, None)
    (root / "venv/lib/a.json").write_text('{"a": 1}')
    assert files.json_nofollow(str(root), "venv/lib/a.json") == ({"a": 1}, None)
    assert "not JSON" in files.json_nofollow(str(root), "venv/lib/RECORD")[1]
    assert files.sha256_nofollow(str(root), "venv/lib/RECORD") == hashlib.sha256(b"mine\n").hexdigest()
    assert files.list_nofollow(str(root), "venv/lib") == [("RECORD", "file"), ("a.json", "file")]
    assert files.stat_nofollow(str(root), "venv", directory=True).st_uid == os.getuid()


def test_a_link_at_the_leaf_is_refused_never_followed(tmp_path):
    root, secret = _tree(tmp_path)
    (root / "venv/lib/RECORD").unlink()
    (root / "venv/lib/RECORD").symlink_to(secret)
    assert files.read_nofollow(str(root), "venv/lib/RECORD") == (
        None, "venv/lib/RECORD: a symbolic link on the way (not read)")
    assert files.json_nofollow(str(root), "venv/lib/RECORD")[0] is None
    for reader in (files.sha256_nofollow, files.open_regular, files.stat_nofollow):
        with pytest.raises(OSError) as refused:
            reader(str(root), "venv/lib/RECORD")
        assert refused.value.errno == errno.ELOOP
    assert files.list_nofollow(str(root), "venv/lib") == [("RECORD", "link")]


def test_a_link_at_a_middle_component_is_refused_never_followed(tmp_path):
    root, _secret = _tree(tmp_path)
    os.rename(root / "venv/lib", tmp_path / "moved")
    (root / "venv/lib").symlink_to(tmp_path / "elsewhere")
    assert files.read_nofollow(str(root), "venv/lib/RECORD") == (
        None, "venv/lib/RECORD: a symbolic link on the way (not read)")
    with pytest.raises(OSError) as refused:
        files.list_nofollow(str(root), "venv/lib")
    assert refused.value.errno == errno.ELOOP
    # a relative link to a folder inside the tree is refused all the same: no link is followed, wherever it leads
    (root / "venv/lib").unlink()
    os.rename(tmp_path / "moved", root / "venv/real")
    (root / "venv/lib").symlink_to("real")
    assert "symbolic link" in files.read_nofollow(str(root), "venv/lib/RECORD")[1]
    # a file where a folder is: named, not read
    (root / "venv/file").write_text("x")
    assert files.read_nofollow(str(root), "venv/file/RECORD")[1] == "venv/file/RECORD: Not a directory (not read)"


def test_dot_and_dot_dot_are_refused(tmp_path):
    root, _secret = _tree(tmp_path)
    for rel in ("venv/../../secret", "venv/./lib/RECORD", ".."):
        data, why = files.read_nofollow(str(root), rel)
        assert data is None and why == f"{rel}: a path with . or .. (not read)"


def test_a_file_swapped_for_a_link_between_check_and_read_is_refused(tmp_path, monkeypatch):
    """The owner of the tree swaps the file for a link to root's file after it was checked (stat_nofollow: a regular
    file) and at the worst moment of the read: its folder already open, the open of the file itself called."""
    root, secret = _tree(tmp_path)
    assert stat.S_ISREG(files.stat_nofollow(str(root), "venv/lib/RECORD").st_mode)  # the check
    real_open = os.open
    swapped = []

    def opener(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None and path == "RECORD":
            os.unlink(path, dir_fd=dir_fd)
            os.symlink(secret, path, dir_fd=dir_fd)
            swapped.append(path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", opener)
    data, why = files.read_nofollow(str(root), "venv/lib/RECORD")
    assert swapped == ["RECORD"] and (root / "venv/lib/RECORD").is_symlink()
    assert data is None and why == "venv/lib/RECORD: a symbolic link on the way (not read)"


def test_a_folder_swapped_for_a_link_while_the_path_is_walked_is_refused(tmp_path, monkeypatch):
    root, _secret = _tree(tmp_path)
    real_open = os.open

    def opener(path, flags, mode=0o777, *, dir_fd=None):
        if dir_fd is not None and path == "lib" and not os.path.islink(root / "venv/lib"):
            os.rename(root / "venv/lib", tmp_path / "moved")
            os.symlink(tmp_path / "elsewhere", root / "venv/lib")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", opener)
    assert files.read_nofollow(str(root), "venv/lib/RECORD") == (
        None, "venv/lib/RECORD: a symbolic link on the way (not read)")
    assert (root / "venv/lib").is_symlink()  # the swap was made


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    root, _secret = _tree(tmp_path)
    os.mkfifo(root / "venv/lib/pipe")
    found = []
    reader = threading.Thread(target=lambda: found.append(files.read_nofollow(str(root), "venv/lib/pipe")),
                              daemon=True)
    reader.start()
    reader.join(30)
    assert found == [(None, "venv/lib/pipe: not a regular file (not read)")]
    assert files.list_nofollow(str(root), "venv/lib") == [("RECORD", "file"), ("pipe", "other")]
    data, why = files.read_nofollow(str(root), "venv")  # a folder is no file either
    assert data is None and why == "venv: not a regular file (not read)"


def test_the_size_bound_and_the_owners_view(tmp_path):
    root, secret = _tree(tmp_path)
    (root / "venv/lib/big").write_bytes(b"x" * 100)
    assert files.read_nofollow(str(root), "venv/lib/big", limit=99) == (
        None, "venv/lib/big: larger than 99 bytes (not read)")
    assert files.read_nofollow(str(root), "venv/lib/big", limit=100)[0] == b"x" * 100
    # a hard link to root's file in a tree of uid 990: no link on the way; the owner's view refuses it
    os.link(secret, root / "venv/lib/hard")
    assert files.read_nofollow(str(root), "venv/lib/hard", owner=990) == (
        None, "venv/lib/hard: a file of uid 0 that uid 990 cannot read (not read)")
    with pytest.raises(OSError) as refused:
        files.sha256_nofollow(str(root), "venv/lib/hard", owner=990)
    assert refused.value.errno == errno.EACCES
    assert files.read_nofollow(str(root), "venv/lib/hard", owner=0)[0] == SECRET.encode()  # root's own view
    os.chown(root / "venv/lib/RECORD", 990, 990)
    (root / "venv/lib/RECORD").chmod(0o600)
    assert files.read_nofollow(str(root), "venv/lib/RECORD", owner=990)[0] == b"mine\n"  # its own file
    (root / "venv/lib/big").chmod(0o644)
    assert files.read_nofollow(str(root), "venv/lib/big", owner=990)[0] == b"x" * 100  # readable by every user
    with pytest.raises(OSError) as refused:
        files.list_nofollow(str(root), "venv/lib", limit=2)
    assert refused.value.errno == errno.EFBIG
