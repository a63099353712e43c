# -*- coding: utf-8 -*-
"""Parse nccl-tests / rccl-tests result tables and NCCL_DEBUG=INFO logs.

Pure functions `parse_tests(text)` and `parse_log(text)`; standard library only, Python 3.8+.
Contract: docs/parse-formats.md ("nccl-tests", "nccl-log").
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

# --- nccl-tests -------------------------------------------------------------

_LINE_PREFIX_RE = re.compile(r"^\s*(?:\d+:\s+|[\w.-]+:\s+(?=\s*\d))")
_AVG_RE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan|inf)", re.IGNORECASE)
_OOB_RE = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?", re.IGNORECASE)
_INT_RE = re.compile(r"^-?\d+$")
_NUM_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def _num(token: str):
    if _INT_RE.match(token):
        return int(token)
    if _NUM_RE.match(token):
        value = float(token)
        return int(value) if value.is_integer() and "e" in token.lower() else value
    return None


def _wrong(token: str):
    if token.upper() == "N/A":
        return None
    return _num(token)


def _group(tokens):
    time_us, algbw, busbw, wrong = tokens
    values = (parse_text.to_float(time_us), parse_text.to_float(algbw), parse_text.to_float(busbw))
    if None in values:
        return None
    return {"time_us": values[0], "algbw_gbs": values[1], "busbw_gbs": values[2], "wrong": _wrong(wrong)}


def _row(line: str):
    tokens = line.split()
    if len(tokens) < 7 or not _INT_RE.match(tokens[0]) or not _INT_RE.match(tokens[1]):
        return None
    if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", tokens[2]):
        return None
    rest = tokens[3:]
    redop = None
    if rest and re.match(r"^[A-Za-z][A-Za-z0-9_]*$", rest[0]) and rest[0].upper() != "N/A":
        redop = rest[0]
        rest = rest[1:]
    root = None
    if len(rest) in (5, 9) and _INT_RE.match(rest[0]):
        root = int(rest[0])
        rest = rest[1:]
    if len(rest) not in (4, 8):
        return None
    out_of_place = _group(rest[:4])
    if out_of_place is None:
        return None
    in_place = _group(rest[4:8]) if len(rest) == 8 else None
    return {
        "size_bytes": int(tokens[0]),
        "count": int(tokens[1]),
        "type": tokens[2],
        "redop": redop,
        "root": root,
        "out_of_place": out_of_place,
        "in_place": in_place,
    }


def result_row(line: str):
    """One result row of an nccl-tests table (_row), or None: how a paste's splitter knows a row without a header."""
    return _row(_LINE_PREFIX_RE.sub("", line).strip()) if line and not line.lstrip().startswith("#") else None


def parse_tests(text: str) -> dict:
    rows = []
    avg = None
    oob = None
    oob_status = None
    collective = None
    for raw in parse_text.lines(text):
        line = _LINE_PREFIX_RE.sub("", raw) if not raw.lstrip().startswith("#") else raw
        stripped = line.strip()
        if not stripped:
            continue
        if "#" in stripped:
            m = _AVG_RE.search(stripped)
            if m:
                value = parse_text.to_float(m.group(1))
                avg = value if avg is None else avg
                continue
            m = _OOB_RE.search(stripped)
            if m:
                oob = int(m.group(1)) if oob is None else oob
                oob_status = (m.group(2) or "").upper() or None
                continue
            m = re.search(r"Collective test (?:concluded|starting):\s*(\S+)", stripped)
            if m:
                collective = m.group(1)
            continue
        row = _row(stripped)
        if row is not None:
            rows.append(row)
        elif collective is None:
            m = re.search(r"\b(\w+_perf)\b", stripped)
            if m:
                collective = m.group(1)
    return {
        "rows": rows,
        "avg_busbw_gbs": avg,
        "out_of_bounds": oob,
        "out_of_bounds_status": oob_status,
        "collective": collective,
    }


# --- NCCL_DEBUG=INFO logs ---------------------------------------------------

_VERSION_RE = re.compile(r"\b(NCCL|RCCL) version\s+(\d+\.\d+\.\d+)")
_CHANNEL_RE = re.compile(
    r"\b(?:Channel|Ring)\s+(?P<ch>\d+)(?:/(?P<sub>\d+))?\s*:\s*"
    r"(?P<from>\d+)(?:\[(?P<fromdev>[0-9a-fA-Fx]+)\])?\s*->\s*"
    r"(?P<to>\d+)(?:\[(?P<todev>[0-9a-fA-Fx]+)\])?"
    r"(?:\s*\[(?P<dir>send|receive)\])?\s+via\s+(?P<via>.+)$"
)
# The "Check P2P Type" line: NCCL's ncclTransportCheckP2pType (NVIDIA/nccl src/transport.cc@081eafaf: "Check P2P Type
# isAllDirectP2p %d directMode %d isAllCudaP2p %d"; RCCL 2.27 prints "isAllDirectP2p %d directMode %d"; older RCCL
# (ROCm/rccl src/transport.cc@47da6731) the same flag as "intraNodeP2pSupport %d directMode %d"). isAllDirectP2p is 1
# when every pair of local ranks can use the P2P transport within NCCL_P2P_LEVEL, with no intermediate GPU; isAllCudaP2p
# is 1 when every pair has CUDA P2P at all, whatever the distance.
_DIRECT_RE = re.compile(r"\b(?:isAllDirectP2p|intraNodeP2pSupport)\s+(\d+)")
_CUDA_P2P_RE = re.compile(r"\bisAllCudaP2p\s+(\d+)")


def _transport(via: str) -> str:
    words = via.split()
    token = words[0]
    if len(words) > 1 and words[1] == "pointer":
        token += " pointer"
    elif token == "direct" and words[1:3] == ["shared", "memory"]:
        token = "direct shared memory"
    return token


def _family(transport: str) -> str:
    upper = transport.upper()
    if upper.startswith("P2P"):
        return "p2p"
    if upper.startswith("SHM") or transport == "direct shared memory":
        return "shm"
    if upper.startswith("NET") or upper.startswith("COLLNET"):
        return "net"
    return "other"


# A failed run's own words: NCCL's WARN lines, and the tests' failure trailer ("Test NCCL failure common.cu:958
# 'unhandled cuda error (run with NCCL_DEBUG=INFO for details)'", "Test CUDA failure common.cu:892 'mapping of buffer
# object failed'"). A log of a failed run is evidence, not bad input.
_FAILURE_RE = re.compile(r"\b[NR]CCL WARN\b\s*(?P<warn>.*)$|\bTest (?:NCCL |CUDA |HIP )?failure\b.*?'(?P<test>[^']+)'"
                         r"|\b(?:NCCL|CUDA|HIP) (?:failure|error)\b.*?'(?P<quoted>[^']+)'")
# CUDA/HIP error names of the words a failure line quotes (cuda.h's cudaGetErrorString texts; seed 000's "mapping of
# buffer object failed" is CUDA_ERROR_MAP_FAILED, error 205 in cuda.h; seen at cudaDeviceEnablePeerAccess when the
# peer's BAR cannot be mapped, https://github.com/tinygrad/open-gpu-kernel-modules/issues/16).
FAILURE_CODES = (
    ("mapping of buffer object failed", "CUDA_ERROR_MAP_FAILED"),
    ("peer access is not supported between these two devices", "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"),
    ("peer access has not been enabled", "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"),
    ("unhandled cuda error", "unhandled cuda error"),
    ("unhandled system error", "unhandled system error"),
    ("invalid device ordinal", "CUDA_ERROR_INVALID_DEVICE"),
    ("out of memory", "out of memory"),
)
MAX_FAILURES = 20


def failure_of(line: str):
    """{"text": the failure's words, "code": a FAILURE_CODES name or None, "by": "test" (the tests' own trailer) or
    "library" (NCCL/RCCL's WARN, a CUDA error line)} of a failure line, or None."""
    m = _FAILURE_RE.search(line or "")
    if not m:
        return None
    text = (m.group("warn") or m.group("test") or m.group("quoted") or "").strip()[:300]
    low = text.lower()
    code = next((name for words, name in FAILURE_CODES if words in low), None)
    return {"text": text, "code": code, "by": "test" if m.group("test") else "library"}


class LogReader:
    """parse_log one line at a time: feed() each normalised line (parse_text.lines), then result()."""

    def __init__(self):
        self.version = None
        self.library = None
        self.channels = []
        self.transports = []
        self.direct = []
        self.cuda_p2p = []
        self.failures = []

    def feed(self, raw: str) -> None:
        failure = failure_of(raw)
        if failure and len(self.failures) < MAX_FAILURES and failure not in self.failures:
            self.failures.append(failure)
        if self.version is None:
            m = _VERSION_RE.search(raw)
            if m:
                self.library, self.version = m.group(1), m.group(2)
        m = _DIRECT_RE.search(raw)
        if m:
            self.direct.append(m.group(1) != "0")
        m = _CUDA_P2P_RE.search(raw)
        if m:
            self.cuda_p2p.append(m.group(1) != "0")
        m = _CHANNEL_RE.search(raw)
        if not m:
            return
        transport = _transport(m.group("via"))
        self.channels.append({
            "channel": int(m.group("ch")),
            "from_rank": int(m.group("from")),
            "to_rank": int(m.group("to")),
            "transport": transport,
            "direction": m.group("dir"),
        })
        if transport not in self.transports:
            self.transports.append(transport)

    def result(self) -> dict:
        channels = self.channels
        families = {_family(c["transport"]) for c in channels}
        if not channels:
            path = "unknown"
        elif len(families) == 1 and families != {"other"}:
            path = families.pop()
        else:
            path = "mixed"
        return {
            "nccl_version": self.version,
            "library": self.library,
            "channels": channels,
            "transports": self.transports,
            "all_direct_p2p": (all(self.direct) if self.direct else None),
            "all_cuda_p2p": (all(self.cuda_p2p) if self.cuda_p2p else None),
            "path": path,
            "failures": self.failures,
        }


def parse_log(text) -> dict:
    """TEXT: the whole log (a str) or an iterable of its lines (parse_text.lines)."""
    reader = LogReader()
    for raw in parse_text.lines(text):
        reader.feed(raw)
    return reader.result()


parse = parse_log
