# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The libraries a process has mapped, and which of them is NCCL or RCCL: decided here alone (standard library only).

A library is NCCL or RCCL by its file name: libnccl.so* or librccl.so*, also when it is a wheel's own copy that the
pinned venv kept beside the link that replaced it (NAME.rigbook-bundled, builds.KEPT_SUFFIX): an engine not
restarted after the relink still maps that file, and is then on the bundled copy. /proc/PID/maps marks a file that
was deleted (or replaced) after it was mapped with " (deleted)": its path may now name another file, so its digest is
read through /proc/PID/map_files/START-END (the mapping itself), or it is unknown.
"""

from __future__ import annotations

import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, text

KINDS = (("nccl", "libnccl.so"), ("rccl", "librccl.so"))
DELETED = files.DELETED
MAX_MAPS = 32 << 20
RANGE = re.compile(r"^[0-9a-f]+-[0-9a-f]+$")


def collective_kind(file_path):
    """"nccl" or "rccl" when FILE_PATH names an NCCL or RCCL library (a kept bundled copy too), else None."""
    name = os.path.basename(file_path or "")  # a versioned (.so.2), kept (.rigbook-bundled) or deleted name too
    for kind, prefix in KINDS:
        if name.startswith(prefix):
            return kind
    return None


def is_collectives(file_path):
    return collective_kind(file_path) is not None


def parse_maps(maps_text):
    """[{path, range, deleted}] of the files a /proc/PID/maps text maps, each path once, in order."""
    seen, found = set(), []
    for line in (maps_text or "").splitlines():
        fields = line.split(None, 5)
        if len(fields) != 6 or not fields[5].startswith("/"):
            continue
        file_path = text.bounded(fields[5].strip(), 4096)
        deleted = file_path.endswith(DELETED)
        if deleted:
            file_path = file_path[: -len(DELETED)]
        if file_path in seen:
            continue
        seen.add(file_path)
        found.append({"path": file_path, "range": fields[0] if RANGE.match(fields[0]) else None,
                      "deleted": deleted})
    return found


def read_maps(root, pid):
    """The /proc/PID/maps text of process PID under ROOT, or None."""
    return files.read_text(files.path(root, "proc", str(int(pid)), "maps"), limit=MAX_MAPS, strip=False)


def mapping_digest(root, pid, mapping):
    """(sha256, None) of a mapped file, or (None, why). A deleted one is read through /proc/PID/map_files (the
    mapping itself, not what its old name holds now), and is unknown where that cannot be read."""
    if mapping.get("deleted"):
        if not mapping.get("range"):
            return None, "%s was deleted after it was mapped" % mapping["path"]
        sha, error = files.digest(files.path(root, "proc", str(int(pid)), "map_files", mapping["range"]))
        if sha is None:
            return None, "%s was deleted after it was mapped and its mapping cannot be read (%s)" % (
                mapping["path"], error)
        return sha, None
    return files.digest(files.path(root, mapping["path"].lstrip("/")))
