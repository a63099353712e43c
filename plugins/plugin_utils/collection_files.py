# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's own files as one sha256 (controller side, standard library): what a run's roles and modules are
made of, for the converged states' inputs (action/host_model) and the kept module payloads' key
(callback/ansiballz_cache)."""

from __future__ import annotations

import hashlib
import os

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTS = ("meta", "playbooks", "plugins", "roles")  # everything a run of the collection reads
_DIGESTS = {}


def digest(top=COLLECTION, parts=PARTS):
    """The sha256 over the files under each of PARTS of the collection at TOP (each file's path relative to TOP and
    its content; no __pycache__, no .pyc), computed once per process for each PARTS of this collection (a tree given
    as TOP is read each time)."""
    key = tuple(parts)
    if top == COLLECTION and key in _DIGESTS:
        return _DIGESTS[key]
    value = hashlib.sha256()
    for part in parts:
        for parent, dirs, names in os.walk(os.path.join(top, part)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                if name.endswith(".pyc"):
                    continue
                file_path = os.path.join(parent, name)
                value.update(os.path.relpath(file_path, top).encode("utf-8", "surrogateescape") + b"\0")
                value.update(files.sha256_of(file_path).encode("ascii") + b"\n")
    if top == COLLECTION:
        _DIGESTS[key] = value.hexdigest()
    return value.hexdigest()
