# -*- coding: utf-8 -*-
"""Shared helpers for the rigbook text parsers (standard library only, Python 3.8+).

The parsers read what people paste: any indentation, Windows line ends, ANSI colour
codes, shell prompts and unrelated lines around the interesting part.
"""

from __future__ import annotations

import re

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# mpirun --tag-output / srun -l style prefixes: "[1,0]<stdout>:" or "[1,0]<stderr>:"
_MPI_TAG_RE = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:")
_SLOT_RE = re.compile(
    r"^(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})\.(?P<fn>[0-7])$"
)

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


def normalise(text: str) -> str:
    """Strip ANSI codes, NULs and BOMs; turn CRLF / CR line ends into LF."""
    if text is None:
        return ""
    text = strip_ansi(text)
    text = text.replace("\ufeff", "").replace("\x00", "")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def clean_line(line: str) -> str:
    """One normalised line with its mpirun output tag removed and its trailing blanks stripped."""
    return _MPI_TAG_RE.sub("", line).rstrip()


def lines(source):
    """Normalised lines, with mpirun output tags removed, one at a time. SOURCE is the whole text (a str) or an
    iterable of lines (an open text file, read as it is iterated: a large input is never held whole)."""
    if source is None or isinstance(source, str):
        for line in normalise(source).split("\n"):
            yield clean_line(line)
        return
    for chunk in source:
        chunk = normalise(chunk)
        if chunk.endswith("\n"):
            chunk = chunk[:-1]
        for line in chunk.split("\n"):
            yield clean_line(line)


def normalise_slot(value: str):
    """'03:00.0' -> '0000:03:00.0'; '00000000:0A:00.0' -> '0000:0a:00.0'; None if not a slot."""
    if value is None:
        return None
    m = _SLOT_RE.match(value.strip())
    if not m:
        return None
    dom = int(m.group("dom"), 16) if m.group("dom") else 0
    bus, dev = int(m.group("bus"), 16), int(m.group("dev"), 16)
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{m.group('fn')}"


def size_to_bytes(value: str):
    """'256M' / '256MB' / '32G' / '128' / '512K' -> bytes (binary units); None if not a size."""
    if value is None:
        return None
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:i?B)?\s*$", value.strip(), re.IGNORECASE)
    if not m:
        return None
    number = float(m.group(1))
    return int(number * _UNITS[m.group(2).upper()])


def to_int(value: str):
    """An integer from the text, or None ('N/A', '', junk)."""
    if value is None:
        return None
    m = re.match(r"^\s*([-+]?\d+)", value)
    return int(m.group(1)) if m else None


def to_float(value: str):
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return number
