# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The small state files the ladder keeps on a host between runs (the serve units' restart counts, the error
counters' last snapshot): written atomically (standard library only)."""

from __future__ import annotations

import json
import os


def write_json(path, data):
    """Write DATA to PATH atomically (parents created); the error text, or None."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=True))


def write_text(path, text, mode=0o644):
    """Write TEXT to PATH atomically (parents created; a reader sees the old file or the new one, never a part, as
    node_exporter's textfile collector needs); the error text, or None."""
    tmp = path + ".tmp"
    try:
        parent = os.path.dirname(path)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent)
        with open(tmp, "w") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        return "cannot write %s: %s" % (path, exc.strerror or exc)
    return None
