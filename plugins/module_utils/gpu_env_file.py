# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU environment file's format (/etc/rigbook/gpu.env; standard library only): a header, then one block per
owning role between `# BEGIN <owner>` and `# END <owner>` lines, KEY=value lines in each. rigbook.homelab.gpu_env
writes it; a role's converged state watches its own block (module_utils/converged.py, `block:PATH#OWNER`)."""

from __future__ import annotations

import hashlib
import re

HEADER = [
    "# rigbook: the GPU stack's environment (KEY=value, read by systemd EnvironmentFile= and `set -a; . FILE`).",
    "# Written by rigbook.homelab.gpu_env: each role owns one block; change the profile, not this file.",
]
KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OWNER_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
BARE_RE = re.compile(r"^[A-Za-z0-9_./:,@%+=-]*$")
LINE_RE = re.compile(r"^(?:export\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")


def parse(text):
    """(blocks {owner: [lines]}, order [owner or None], loose [lines outside blocks, header excluded])."""
    blocks, order, loose, current = {}, [], [], None
    for line in text.splitlines():
        begin = re.match(r"^# BEGIN (\S+)\s*$", line)
        end = re.match(r"^# END (\S+)\s*$", line)
        if begin and current is None:
            current = begin.group(1)
            blocks[current] = []
            order.append(current)
        elif end and current == end.group(1):
            current = None
        elif current is not None:
            blocks[current].append(line)
        elif line not in HEADER:
            loose.append(line)
    return blocks, order, loose


def keys_of(lines):
    out = {}
    for line in lines:
        match = LINE_RE.match(line.strip())
        if match:
            value = match.group("value")
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            out[match.group("key")] = value
    return out


def block_digest(text, owner):
    """The sha256 of OWNER's block in the file TEXT (its lines, in order), or "absent" when it has no such block."""
    blocks = parse(text)[0]
    if owner not in blocks:
        return "absent"
    return hashlib.sha256("\n".join(blocks[owner]).encode("utf-8", "surrogateescape")).hexdigest()
