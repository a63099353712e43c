# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serve profile's API key file: the one reader (standard library only).

The key is the file's first line, stripped. It is a secret: it never reaches argv, a log or a report, and a key of
another shape is refused rather than sent: at most MAX_KEY characters of printable ASCII without spaces (what an
HTTP Authorization header carries).
"""

from __future__ import annotations

import re

MAX_KEY = 512
KEY = re.compile(r"^[\x21-\x7e]{1,%d}$" % MAX_KEY)


def parse_key(first_line):
    """(key, error) of a key file's first line: (None, why) when it is empty or of another shape (the key itself is
    never in the error)."""
    key = (first_line or "").strip()
    if not key:
        return None, "is empty"
    if not KEY.match(key):
        return None, "holds no key of printable characters without spaces (at most %d)" % MAX_KEY
    return key, None


def read_key(key_path):
    """(key, error) of the API key file KEY_PATH: (None, None) when no file is named; (None, why) when it cannot be
    read or holds no valid key."""
    if not key_path:
        return None, None
    try:
        with open(key_path, "rb") as handle:
            first = handle.readline(MAX_KEY * 4 + 2)
    except OSError as exc:
        return None, "api_key_file %s: %s" % (key_path, exc.strerror or exc)
    key, why = parse_key(first.decode("utf-8", "replace"))
    return key, (None if key else "api_key_file %s %s" % (key_path, why))
