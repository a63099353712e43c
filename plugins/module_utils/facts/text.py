# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bounds every fact reader applies to what a box printed (standard library only).

A box is untrusted input: a value read from it is cut to a length, stripped of control characters and, where a
caller names a character set, refused outside it. Nothing here templates or evaluates.
"""

from __future__ import annotations

import math
import re

MAX_FIELD = 4096
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
TEMPLATE_MARKS = ("{{", "{%", "{#")


def bounded(value, limit=MAX_FIELD):
    """VALUE as text, control characters (all but tab and newline) removed, cut to LIMIT characters; None stays
    None."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return CONTROL.sub("", str(value))[:limit]


def line(value, limit=MAX_FIELD):
    """One line of VALUE (the first), bounded and stripped; None for None."""
    text = bounded(value, limit * 4 if limit else None)
    if text is None:
        return None
    return text.split("\n", 1)[0].strip()[:limit]


def matching(value, pattern, limit=MAX_FIELD):
    """VALUE (stripped) when the whole of it matches the regular expression PATTERN and fits LIMIT, else None."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    if len(value) > limit or not re.match(r"(?:%s)\Z" % pattern, value):
        return None
    return value


def finite(value):
    """VALUE as a finite float (ints and numeric text too), else None: NaN, infinities, booleans are no figure."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def integer(value):
    """VALUE as an int (numeric text too), else None."""
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def templated(value):
    """True when VALUE (a string) holds a Jinja2 mark: such text must reach Ansible only marked unsafe."""
    return isinstance(value, str) and any(mark in value for mark in TEMPLATE_MARKS)
