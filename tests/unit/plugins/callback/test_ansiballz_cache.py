"""callback/ansiballz_cache.py: Ansible's module payloads built once per state directory and key, not once per run.

The key follows what a payload is made of (a module's or module_utils' content, ansible-core's files); a folder
not the user's alone is refused (the run builds its payloads as Ansible does); folders of other keys go after a
day. The last test runs real `ansible-playbook` twice with the environment `provision` gives it."""

from __future__ import annotations

import base64
import dataclasses
import importlib
import io
import os
import pickle
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from rigbook.paths import link_collection

link_collection()
from ansible_collections.rigbook.homelab.plugins.callback import ansiballz_cache  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.plugin_utils.private_folder import FolderRefused  # noqa: E402


def _collection(top: Path) -> Path:
    """A collection tree of one module and one module_utils file, and an ansible-core tree of one file, under TOP."""
    (top / "coll" / "plugins" / "modules").mkdir(parents=True)
    (top / "coll" / "plugins" / "module_utils").mkdir(parents=True)
    (top / "coll" / "plugins" / "modules" / "m.py").write_text("import os\n")
    (top / "coll" / "plugins" / "module_utils" / "u.py").write_text("X = 1\n")
    (top / "ansible").mkdir()
    (top / "ansible" / "basic.py").write_text("Y = 1\n")
    return top


def _key(top: Path) -> str:
    return ansiballz_cache.payload_key(str(top / "coll"), str(top / "ansible"))


def test_the_key_follows_what_a_payload_is_made_of(tmp_path):
    top = _collection(tmp_path)
    first = _key(top)
    assert _key(top) == first
    (top / "coll" / "plugins" / "module_utils" / "u.py").write_text("X = 2\n")
    edited = _key(top)
    assert edited != first
    (top / "coll" / "plugins" / "module_utils" / "v.py").write_text("Z = 1\n")
    added = _key(top)
    assert added not in (first, edited)
    os.utime(top / "ansible" / "basic.py", ns=(1, 1))  # an ansible-core file replaced (pip: another mtime)
    assert _key(top) not in (first, edited, added)
    (top / "coll" / "README.md").write_text("docs\n")  # no part of a payload
    assert _key(top) == _key(top)


def test_the_run_s_payload_folder_becomes_a_link_to_the_kept_one(tmp_path):
    top, local_tmp = tmp_path / "state" / "ansiballz", tmp_path / "ansible-local-1"
    local_tmp.mkdir()
    folder = ansiballz_cache.use_kept_payloads(str(top), str(local_tmp))
    assert Path(folder).parent == top and Path(folder).name == ansiballz_cache.payload_key()
    assert os.readlink(local_tmp / ansiballz_cache.ANSIBLE_CACHE) == folder
    assert oct(os.stat(folder).st_mode & 0o777) == oct(0o700) and oct(top.stat().st_mode & 0o777) == oct(0o700)
    with pytest.raises(FileExistsError, match="Ansible built payloads before this plugin loaded"):
        ansiballz_cache.use_kept_payloads(str(top), str(local_tmp))


@pytest.mark.parametrize("make", [
    lambda top: (top.parent.mkdir(parents=True), (top.parent / "theirs").mkdir(),
                 top.symlink_to(top.parent / "theirs")),
    lambda top: (top.mkdir(parents=True), top.chmod(0o777)),
], ids=["link", "open-to-others"])
def test_a_folder_not_the_users_alone_is_not_used(tmp_path, make):
    top, local_tmp = tmp_path / "state" / "ansiballz", tmp_path / "ansible-local-1"
    local_tmp.mkdir()
    make(top)
    with pytest.raises(FolderRefused, match="module payloads built there run on every box"):
        ansiballz_cache.use_kept_payloads(str(top), str(local_tmp))
    assert os.listdir(local_tmp) == []  # Ansible builds its payloads in its own folder, as without the plugin


def test_folders_of_other_keys_unused_for_a_day_are_removed(tmp_path):
    for name in ("current", "recent", "old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "payload").write_bytes(b"p")
    day_ago = time.time() - ansiballz_cache.STALE_S - 60
    for name in ("current", "old"):
        os.utime(tmp_path / name, (day_ago, day_ago))
    ansiballz_cache.prune(str(tmp_path), "current")
    assert sorted(os.listdir(tmp_path)) == ["current", "recent"]


PLAY = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - rigbook.homelab.converged:
        inputs: "0000000000000000000000000000000000000000000000000000000000000000"
        roles: []
"""


def test_a_second_run_uses_the_payload_the_first_built(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    from rigbook.run import ansible_env  # deferred: reads RIGBOOK_STATE_DIR

    env = {**os.environ, **ansible_env(mitogen=False)}
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    argv = [str(Path(os.sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=/usr/bin/python3", str(play)]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    (folder,) = (tmp_path / "state" / "ansiballz").iterdir()  # one key: this collection (through this state
    # directory's link to it) and this ansible-core
    payloads = sorted(p for p in os.listdir(folder) if p.endswith("-none"))
    assert payloads == ["ansible_collections.rigbook.homelab.plugins.modules.converged-ZIP_DEFLATED-none"], payloads
    assert (folder / (payloads[0] + ansiballz_cache.BYTECODE_MARK)).exists()  # the first run's end added bytecode
    built = (folder / payloads[0]).stat().st_mtime_ns
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert (folder / payloads[0]).stat().st_mtime_ns == built  # read, not built again
    assert not list((tmp_path / "state" / "tmp").glob("ansible-local-*"))  # Ansible removed its own folder, not ours


def _payload_zip(files: dict) -> bytes:
    """A payload's zip as Ansible keeps it (base64) holding FILES {name: text}."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), text)
    return base64.b64encode(out.getvalue())


def _import_from(zip_data: bytes, tmp_path: Path, swap: dict) -> int:
    """Import pkg.mod from ZIP_DATA with SWAP {name: bytes} written over its entries (a source changed after its
    bytecode was made, a bytecode of another Python); pkg.mod.X."""
    source = zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data)))
    archive = tmp_path / f"payload-{len(list(tmp_path.glob('payload-*.zip')))}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for info in source.infolist():
            zf.writestr(info, swap.get(info.filename, source.read(info)))
    sys.path.insert(0, str(archive))
    try:
        for name in ("pkg.mod", "pkg"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module("pkg.mod").X
    finally:
        sys.path.remove(str(archive))
        for name in ("pkg.mod", "pkg"):
            sys.modules.pop(name, None)


def test_bytecode_beside_each_source_is_what_a_box_of_this_python_imports(tmp_path):
    zip_data = ansiballz_cache.with_bytecode(_payload_zip({"pkg/__init__.py": "", "pkg/mod.py": "X = 1\n",
                                                            "pkg/broken.py": "def (:\n", "pkg/data.txt": "x"}))
    names = sorted(zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data))).namelist())
    # every source kept (tracebacks, other Pythons); no bytecode for one this Python cannot compile
    assert names == ["pkg/__init__.py", "pkg/__init__.pyc", "pkg/broken.py", "pkg/data.txt", "pkg/mod.py",
                     "pkg/mod.pyc"]
    assert _import_from(zip_data, tmp_path, {}) == 1
    # the bytecode is what is read: a source changed under it is not compiled (unchecked hash) ...
    assert _import_from(zip_data, tmp_path, {"pkg/mod.py": b"X = 2\n"}) == 1
    # ... unless the bytecode is another Python's: its magic number differs and the source is compiled
    other = bytearray(ansiballz_cache.bytecode(b"X = 3\n", "pkg/mod.py"))
    other[0] ^= 0xFF
    assert _import_from(zip_data, tmp_path, {"pkg/mod.py": b"X = 2\n", "pkg/mod.pyc": bytes(other)}) == 2


@dataclasses.dataclass(frozen=True)
class _Kept:
    """Stands in for ansible-core's pickled cache entry, a frozen dataclass (add_bytecode reads its zip_data)."""

    zip_data: bytes
    metadata: str = "kept as it was"


def test_each_kept_payload_gets_its_bytecode_once(tmp_path):
    zip_data = _payload_zip({"pkg/__init__.py": "", "pkg/mod.py": "X = 1\n"})
    (tmp_path / "mod-ZIP_DEFLATED-none").write_bytes(pickle.dumps(_Kept(zip_data)))
    (tmp_path / "mod-ZIP_DEFLATED-none.lock").write_text("")
    assert ansiballz_cache.add_bytecode(str(tmp_path)) == 1
    kept = pickle.loads((tmp_path / "mod-ZIP_DEFLATED-none").read_bytes())
    assert "pkg/mod.pyc" in zipfile.ZipFile(io.BytesIO(base64.b64decode(kept.zip_data))).namelist()
    assert kept.metadata == "kept as it was"
    assert ansiballz_cache.add_bytecode(str(tmp_path)) == 0  # marked: not read again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mod-ZIP_DEFLATED-none", "mod-ZIP_DEFLATED-none.bytecode",
                                                          "mod-ZIP_DEFLATED-none.lock"]  # no temp file left
