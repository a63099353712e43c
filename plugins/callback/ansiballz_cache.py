# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keep Ansible's built module payloads (AnsiballZ) between runs of one state directory."""

from __future__ import annotations

DOCUMENTATION = r"""
name: ansiballz_cache
type: aggregate
short_description: Keeps Ansible's built module payloads between runs
description:
  - 'Ansible builds each module''s payload (the module and every module_utils file it imports, found by
    parsing them) once per run, in a folder of its own process that it removes at the end: 0.1 to 0.3 s of the
    controller''s CPU for each module a run uses, every run.'
  - 'Loaded by rigbook''s runs (the provision command adds this folder to the callback plugin path and exports
    RIGBOOK_STATE_DIR); it points that folder''s payload cache at RIGBOOK_STATE_DIR/ansiballz/KEY, so a later
    run reads the payloads the first one built. KEY is the sha256 of what a payload is made of - the
    collection''s modules and module_utils (their content), ansible-core''s Python files (path, size,
    modification time), its version and the controller''s Python - so an edit of either builds them again.'
  - 'The folder is the controller user''s own (created 0700; one that is a link, another user''s, or open to
    others is not used, and the run builds its payloads as Ansible does). Folders of other keys unused for a
    day are removed.'
  - 'At the end of a run (and at the start of the next, for a run that ended early) each kept payload gets the
    bytecode of its Python files beside them (PEP 552 unchecked-hash .pyc, compiled by the controller''s Python):
    a box whose Python is the same version imports them without compiling (0.05 to 0.12 s of the box''s CPU for
    each module run, a third to a half of it); another version''s import sees the other magic number and compiles
    the source, as without them. A payload holding them has a C(.bytecode) file beside it.'
  - 'Does nothing without RIGBOOK_STATE_DIR, under a strategy that builds no AnsiballZ payloads (mitogen), or
    where Ansible keeps its payloads elsewhere.'
"""

import base64
import dataclasses
import hashlib
import importlib.util
import io
import marshal
import os
import pickle
import shutil
import stat
import sys
import time
import zipfile

from ansible import constants as C
from ansible import release
from ansible.plugins.callback import CallbackBase
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.plugin_utils import collection_files
from ansible_collections.rigbook.homelab.plugins.plugin_utils.private_folder import (
    PAYLOAD_FOLDER,
    private_folder,
    state_dir,
)

ANSIBLE_CACHE = "ansiballz_cache"  # the folder under C.DEFAULT_LOCAL_TMP that ansible-core's module_common uses
STALE_S = 86400  # a folder of another key unused this long is removed
WHY_PRIVATE = "module payloads built there run on every box, so they are kept only in a folder of your own"
PAYLOAD_PARTS = ("plugins/modules", "plugins/module_utils")  # of the collection: what its payloads hold
BYTECODE_MARK = ".bytecode"  # a file beside a kept payload: its bytecode was added
UNCHECKED_HASH = 0b01  # PEP 552 flags: hash-based, the source not checked


def payload_key(collection=collection_files.COLLECTION, ansible_dir=None):
    """The sha256 of what a payload is made of: this collection's modules and module_utils by content, ansible-core's
    Python files by path, size and modification time, ansible-core's version and this Python's."""
    ansible_dir = ansible_dir or os.path.dirname(os.path.abspath(release.__file__))
    digest = hashlib.sha256()
    digest.update(("%s\0%s\0%s\0%s\0" % (release.__version__, sys.version, collection, collection_files.digest(
        collection, PAYLOAD_PARTS))).encode("utf-8", "surrogateescape"))
    for parent, dirs, names in os.walk(ansible_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            st = os.stat(os.path.join(parent, name))
            digest.update(("%s %d %d\n" % (os.path.join(parent, name), st.st_size, st.st_mtime_ns)).encode(
                "utf-8", "surrogateescape"))
    return digest.hexdigest()


def prune(top, keep, now=None):
    """Remove the key folders under TOP other than KEEP unused for STALE_S."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(top)
    except OSError:
        return
    for name in names:
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if name != keep and stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_S:
            shutil.rmtree(path, ignore_errors=True)


def use_kept_payloads(top, local_tmp):
    """Point LOCAL_TMP's payload cache at TOP/KEY (TOP and TOP/KEY made by private_folder); the folder. Raises OSError
    (FolderRefused among them) when it cannot be used."""
    key = payload_key()
    folder = private_folder(os.path.join(private_folder(top, "the state directory", why=WHY_PRIVATE), key),
                            "the payload folder", why=WHY_PRIVATE)
    link = os.path.join(local_tmp, ANSIBLE_CACHE)
    if os.path.lexists(link):
        raise FileExistsError("%s exists already: Ansible built payloads before this plugin loaded" % link)
    os.symlink(folder, link)
    os.utime(folder)
    prune(top, key)
    return folder


def bytecode(source, name):
    """The .pyc of SOURCE (bytes) for this Python (PEP 552, unchecked hash), or None where this Python cannot compile
    it (the box's may: it compiles the source then, as without bytecode)."""
    try:
        code = compile(source, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return (importlib.util.MAGIC_NUMBER + UNCHECKED_HASH.to_bytes(4, "little") + importlib.util.source_hash(source)
            + marshal.dumps(code))


def with_bytecode(zip_data):
    """ZIP_DATA (a payload's zip, base64, as Ansible keeps it) with each .py file's bytecode beside it (X.pyc, where
    zipimport looks first)."""
    source = zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info in source.infolist():
            data = source.read(info)
            zf.writestr(info, data)
            compiled = bytecode(data, info.filename) if info.filename.endswith(".py") else None
            if compiled is not None:
                entry = zipfile.ZipInfo(info.filename[:-3] + ".pyc", info.date_time)
                entry.compress_type = info.compress_type
                zf.writestr(entry, compiled)
    return base64.b64encode(out.getvalue())


def add_bytecode(folder):
    """Give each payload kept in FOLDER (ansible-core's pickled cache entries, frozen dataclasses holding the zip as
    zip_data; the folder is this user's alone) its bytecode, once; the count done. Each is replaced whole (a run
    reading it meanwhile reads the old or the new)."""
    done = 0
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith((".lock", "-part", BYTECODE_MARK)) or os.path.exists(path + BYTECODE_MARK):
            continue
        with open(path, "rb") as handle:
            payload = pickle.load(handle)
        payload = dataclasses.replace(payload, zip_data=with_bytecode(payload.zip_data))
        files.write_many([(path, pickle.dumps(payload)), (path + BYTECODE_MARK, b"")], mode=0o600)
        done += 1
    return done


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, display=None):
        super().__init__(display=display)
        self._folder = None
        if not os.environ.get("RIGBOOK_STATE_DIR"):
            return
        try:
            folder = use_kept_payloads(os.path.join(state_dir(), PAYLOAD_FOLDER), C.DEFAULT_LOCAL_TMP)
        except OSError as exc:
            self._display.warning("module payloads are built for this run only: %s" % exc)
        else:
            self._display.vvv("ansiballz_cache: module payloads kept in %s" % folder)
            self._folder = folder
            self._add_bytecode()  # payloads of a run that ended before its end

    def _add_bytecode(self):
        if not self._folder:
            return
        try:
            done = add_bytecode(self._folder)
        except (OSError, EOFError, AttributeError, TypeError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
            # an ansible-core that keeps its payloads in another form: they work as they are, compiled on the box
            self._display.warning("module payloads kept without bytecode: %s: %s" % (type(exc).__name__, exc))
        else:
            self._display.vvv("ansiballz_cache: bytecode added to %d payloads" % done)

    def v2_playbook_on_stats(self, stats):
        self._add_bytecode()
