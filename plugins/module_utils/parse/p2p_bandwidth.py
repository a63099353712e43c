# -*- coding: utf-8 -*-
"""Parse CUDA samples `p2pBandwidthLatencyTest` output into its matrices.

Pure function `parse(text) -> dict`; standard library only, Python 3.8+.
Contract: docs/parse-formats.md ("p2p-bandwidth").
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

_TITLES = (
    (re.compile(r"Unidirectional P2P=Disabled Bandwidth", re.I), "unidirectional_p2p_disabled"),
    (re.compile(r"Unidirectional P2P=Enabled Bandwidth.*P2P Reads", re.I), "unidirectional_p2p_enabled_reads"),
    (re.compile(r"Unidirectional P2P=Enabled Bandwidth", re.I), "unidirectional_p2p_enabled"),
    (re.compile(r"Bidirectional P2P=Disabled Bandwidth", re.I), "bidirectional_p2p_disabled"),
    (re.compile(r"Bidirectional P2P=Enabled Bandwidth", re.I), "bidirectional_p2p_enabled"),
    (re.compile(r"P2P=Disabled Latency", re.I), "latency_p2p_disabled_us"),
    (re.compile(r"P2P=Enabled Latency", re.I), "latency_p2p_enabled_us"),
    (re.compile(r"P2P Connectivity Matrix", re.I), "p2p_connectivity"),
)
_BANDWIDTH = (
    "unidirectional_p2p_disabled",
    "unidirectional_p2p_enabled",
    "bidirectional_p2p_disabled",
    "bidirectional_p2p_enabled",
)
_DEVICE_RE = re.compile(r"Device:\s*(\d+),\s*(.+?),\s*pciBusID:\s*([0-9a-fA-F]+),\s*pciDeviceID:\s*([0-9a-fA-F]+),"
                        r"\s*pciDomainID:\s*([0-9a-fA-F]+)")
_ACCESS_RE = re.compile(r"Device=(\d+)\s+(CAN|CANNOT) Access Peer Device=(\d+)")


def _cell(token: str):
    try:
        return float(token)
    except ValueError:
        return None


def parse(text: str) -> dict:
    tables = {}
    devices = []
    access = {}
    current = None
    columns = None
    sub = None  # latency matrices have a "GPU" part and a "CPU" part
    for raw in parse_text.lines(text):
        line = raw.strip()
        m = _DEVICE_RE.search(line)
        if m:
            dom, bus, dev = int(m.group(5), 16), int(m.group(3), 16), int(m.group(4), 16)
            devices.append({"index": int(m.group(1)), "name": m.group(2).strip(),
                            "bus_id": f"{dom:04x}:{bus:02x}:{dev:02x}.0"})
            continue
        m = _ACCESS_RE.search(line)
        if m:
            access.setdefault(m.group(1), {})[m.group(3)] = m.group(2) == "CAN"
            continue
        for pattern, key in _TITLES:
            if pattern.search(line):
                current, columns, sub = key, None, None
                break
        else:
            if current is None:
                continue
            tokens = line.split()
            if not tokens:
                if columns is not None and not current.startswith("latency"):
                    current = None
                columns = None
                continue
            if tokens[0] in ("D\\D", "GPU", "CPU") and all(re.match(r"^\d+$", t) for t in tokens[1:]):
                columns = tokens[1:]
                sub = tokens[0]
                continue
            if columns is None or not re.match(r"^\d+$", tokens[0]):
                current, columns = None, None
                continue
            cells = tokens[1:1 + len(columns)]
            key = current
            if current.startswith("latency"):
                key = current.replace("_us", "_cpu_us" if sub == "CPU" else "_gpu_us")
            row = {}
            for col, cell in zip(columns, cells):
                if current == "p2p_connectivity":
                    row[col] = cell == "1" if cell in ("0", "1") else None
                else:
                    row[col] = _cell(cell)
            tables.setdefault(key, {})[tokens[0]] = row
    result = {
        "matrices": {key: tables.get(key) for key in _BANDWIDTH},
        "p2p_connectivity": tables.get("p2p_connectivity"),
        "unidirectional_p2p_enabled_reads": tables.get("unidirectional_p2p_enabled_reads"),
        "latency_us": {key: value for key, value in tables.items() if key.startswith("latency")},
        "devices": devices,
        "can_access_peer": access or None,
    }
    return result
