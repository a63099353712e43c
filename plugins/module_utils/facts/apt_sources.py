# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The apt sources a box has configured (standard library only; read-only): the one parser of both formats.

- one-line (sources.list(5), "ONE-LINE-STYLE FORMAT"): `deb [ option=value ... ] URI SUITE [COMPONENT ...]`, what
  /etc/apt/sources.list and /etc/apt/sources.list.d/*.list hold; a line commented out (`# deb ...`) is an entry
  apt does not use (enabled False); everything after `#` is a comment.
- deb822 (sources.list(5), "DEB822-STYLE FORMAT"): /etc/apt/sources.list.d/*.sources, stanzas of `Field: value`
  separated by blank lines, a value continued on lines that start with a space; `Enabled: no` turns a stanza off;
  `Signed-By` names keyring files (or fingerprints) or holds the key itself (INLINE_KEY).

Each entry is typed and bounded: {file, format ("one-line" or "deb822"), types, uris, suites, components,
signed_by (lists of strings; a key given inline is [INLINE_KEY]), enabled (bool)}; strings are one line without
control characters, each at most text.MAX_FIELD characters, each list at most MAX_ITEMS, at most MAX_ENTRIES entries a
file and MAX_FILES files. `parse_one_line(text)` and `parse_deb822(text)` are pure; `read_all(root)` reads every file
apt reads under ROOT ("/" on a box, a recorded tree in tests).
"""

from __future__ import annotations

import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, text

SOURCES_LIST = "/etc/apt/sources.list"
SOURCES_DIR = "/etc/apt/sources.list.d"
ONE_LINE = "one-line"
DEB822 = "deb822"
INLINE_KEY = "inline"  # signed_by of a deb822 stanza whose Signed-By holds the key itself
TYPES = ("deb", "deb-src")
MAX_ITEMS = 64
MAX_ENTRIES = 512
MAX_FILES = 256
MAX_FILE = 1 << 20
# apt reads the files of sources.list.d whose names are made of these characters and end in .list or .sources
# (apt.conf(5): Dir::Etc::SourceParts; other names, *.save or *.disabled, it ignores)
PART_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.(list|sources)$")
OFF = ("no", "false", "0", "off")


def _word(value):
    return text.line(value) or ""


def _words(values):
    return [w for w in (_word(v) for v in list(values)[:MAX_ITEMS]) if w]


def _entry(where, fmt, types, uris, suites, components, signed_by, enabled):
    return {"file": _word(where) if where else None, "format": fmt, "types": _words(types), "uris": _words(uris),
            "suites": _words(suites), "components": _words(components), "signed_by": _words(signed_by),
            "enabled": bool(enabled)}


def _signed_by(value):
    """Key files or fingerprints of a Signed-By value (commas or spaces between them), or [INLINE_KEY]."""
    if "BEGIN PGP" in value:
        return [INLINE_KEY]
    return [part for part in re.split(r"[,\s]+", value) if part]


ONE_LINE_ENTRY = re.compile(r"^(deb|deb-src)\s+(?:\[([^\]]*)\]\s*)?(\S+)\s+(\S+)((?:\s+\S+)*)\s*$")


def parse_one_line(source, where=None):
    """The entries of one-line-style TEXT (sources.list, *.list), in order; a line commented out that is an entry
    comes back with enabled False. Options: signed-by (its files, comma-separated), the others ignored."""
    found = []
    for raw in text.bounded(source or "", MAX_FILE).splitlines():
        line = raw.strip()
        enabled = True
        if line.startswith("#"):
            line, enabled = line.lstrip("#").strip(), False
        line = line.split("#", 1)[0].strip()
        match = ONE_LINE_ENTRY.match(line)
        if not match:
            continue
        signed = []
        for option in (match.group(2) or "").split():
            name, eq, value = option.partition("=")
            if eq and name.rstrip("+-").lower() == "signed-by":
                signed += _signed_by(value)
        found.append(_entry(where, ONE_LINE, [match.group(1)], [match.group(3)], [match.group(4)],
                            match.group(5).split(), signed, enabled))
        if len(found) >= MAX_ENTRIES:
            break
    return found


def _stanzas(source):
    """{field (lowercase): value} of each stanza of deb822 TEXT; a continued value keeps its lines."""
    stanzas, fields, name = [], {}, None
    for line in text.bounded(source or "", MAX_FILE).splitlines():
        if not line.strip():
            if fields:
                stanzas.append(fields)
            fields, name = {}, None
            continue
        if line.startswith("#"):
            continue
        if line[:1] in (" ", "\t"):
            if name is not None:
                fields[name] += "\n" + line.strip()
            continue
        key, colon, value = line.partition(":")
        if colon:
            name = key.strip().lower()
            fields[name] = value.strip()
    if fields:
        stanzas.append(fields)
    return stanzas


def parse_deb822(source, where=None):
    """The entries of deb822-style TEXT (*.sources), one a stanza with URIs, in order; `Enabled: no` is enabled
    False."""
    found = []
    for fields in _stanzas(source)[:MAX_ENTRIES]:
        if not fields.get("uris", "").split():
            continue
        enabled = fields.get("enabled", "yes").strip().lower() not in OFF
        found.append(_entry(where, DEB822, fields.get("types", "").split(), fields["uris"].split(),
                            fields.get("suites", "").split(), fields.get("components", "").split(),
                            _signed_by(fields.get("signed-by", "")), enabled))
    return found


def source_files(root):
    """The files apt reads under ROOT, as paths on the box: /etc/apt/sources.list, then sources.list.d's *.list and
    *.sources in name order (at most MAX_FILES)."""
    names = [SOURCES_LIST]
    try:
        listed = os.listdir(files.path(root, SOURCES_DIR.lstrip("/")))
    except OSError:
        listed = []
    names += ["%s/%s" % (SOURCES_DIR, name) for name in sorted(listed) if PART_NAME.match(name)]
    return names[:MAX_FILES]


def read_all(root):
    """Every entry of every file apt reads under ROOT (source_files), in apt's order, each with its file."""
    found = []
    for name in source_files(root):
        body = files.read_text(files.path(root, name.lstrip("/")), limit=MAX_FILE, strip=False)
        if body is None:
            continue
        found += (parse_deb822 if name.endswith(".sources") else parse_one_line)(body, name)
    return found
