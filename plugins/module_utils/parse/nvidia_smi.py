# -*- coding: utf-8 -*-
"""Parse `nvidia-smi -q` (whole or partial) and `nvidia-smi topo -m` / `topo -p2p X`.

Pure functions `parse_q(text)`, `parse_topo(text)` (and `parse` = `parse_q`);
standard library only, Python 3.8+. Contract: docs/parse-formats.md ("nvidia-smi-q", "nvidia-smi-topo").
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

_GPU_HEADER_RE = re.compile(r"^GPU\s+(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*$")
_KV_RE = re.compile(r"^(?P<key>[^:]+?)\s*:\s*(?P<value>.*)$")
_MIB_RE = re.compile(r"^\s*(\d+)\s*MiB")


def _new_gpu(bus_id):
    return {
        "bus_id": parse_text.normalise_slot(bus_id) if bus_id else None,
        "product_name": None,
        "fb_total_mib": None,
        "bar1_total_mib": None,
        "pcie_gen_max": None,
        "pcie_gen_current": None,
        "link_width_max": None,
        "link_width_current": None,
    }


def _value(value: str):
    value = value.strip()
    return None if value in ("", "N/A", "[N/A]", "Unknown Error", "[Unknown Error]") else value


def _mib(value: str):
    m = _MIB_RE.match(value or "")
    return int(m.group(1)) if m else None


def _width(value: str):
    m = re.match(r"^\s*x?(\d+)\s*x?\s*$", value or "")
    return int(m.group(1)) if m else None


def parse_q(text: str) -> dict:
    result = {"driver_version": None, "cuda_version": None, "gpus": []}
    gpu = None
    section = None
    for raw in parse_text.lines(text):
        line = raw.strip()
        if not line:
            continue
        header = _GPU_HEADER_RE.match(line)
        if header:
            gpu = _new_gpu(header.group("bus"))
            result["gpus"].append(gpu)
            section = None
            continue
        kv = _KV_RE.match(line)
        if not kv or (kv.group("value") == "" and not line.endswith(":")):
            # a section header ("FB Memory Usage", "PCIe Generation", ...)
            section = line.rstrip(":").strip().lower()
            continue
        key = kv.group("key").strip()
        value = _value(kv.group("value"))
        lkey = key.lower()
        if lkey in ("driver version", "kmd version") and gpu is None:
            if result["driver_version"] is None:
                result["driver_version"] = value
            continue
        if lkey in ("cuda version", "cuda umd version") and gpu is None:
            if result["cuda_version"] is None:
                result["cuda_version"] = value
            continue
        if lkey in ("product name", "bus id", "total", "max", "current"):
            if gpu is None:
                gpu = _new_gpu(None)
                result["gpus"].append(gpu)
        else:
            continue
        if lkey == "product name":
            gpu["product_name"] = value
        elif lkey == "bus id":
            if gpu["bus_id"] is None and value:
                gpu["bus_id"] = parse_text.normalise_slot(value)
        elif lkey == "total" and section == "fb memory usage":
            gpu["fb_total_mib"] = _mib(value)
        elif lkey == "total" and section == "bar1 memory usage":
            gpu["bar1_total_mib"] = _mib(value)
        elif section == "pcie generation" and lkey in ("max", "current"):
            gpu[f"pcie_gen_{lkey}"] = parse_text.to_int(value or "")
        elif section == "link width" and lkey in ("max", "current"):
            gpu[f"link_width_{lkey}"] = _width(value)
    return result


parse = parse_q

# --- topo -------------------------------------------------------------------

_DEVICE_TOKEN_RE = re.compile(r"^(?:GPU\d+|NIC\d+|mlx\d+_\d+|\w+_\d+)$")
_P2P_VALUES = {"OK", "CNS", "GNS", "TNS", "NS", "U", "DR", "X"}


def _table_kind(header_tokens, links) -> str:
    if "CPU" in header_tokens or "Affinity" in header_tokens:
        return "matrix"
    values = {v for row in links.values() for v in row.values()}
    if values and values <= _P2P_VALUES:
        return "p2p"
    return "matrix"


def parse_topo(text: str) -> dict:
    tables = []
    columns = None
    table = None
    for raw in parse_text.lines(text):
        tokens = raw.split()
        if not tokens:
            columns = None
            continue
        if "GPU0" in tokens[1:] and columns is None and not _DEVICE_TOKEN_RE.match(tokens[0]):
            # a prompt or command pasted on the header line: "nvidia-smi topo -m    GPU0  GPU1 ..."
            tokens = tokens[tokens.index("GPU0"):]
        is_header = bool(_DEVICE_TOKEN_RE.match(tokens[0])) and (
            len(tokens) == 1 or bool(_DEVICE_TOKEN_RE.match(tokens[1])) or tokens[1] == "CPU"
        )
        if is_header:
            # a header line: device names, then maybe "CPU Affinity ..."
            cols = []
            for tok in tokens:
                if not _DEVICE_TOKEN_RE.match(tok):
                    break
                cols.append(tok)
            columns = cols
            table = {"header": tokens, "gpus": [c for c in cols if c.startswith("GPU")], "links": {}}
            tables.append(table)
            continue
        if columns is not None and tokens[0] in columns and len(tokens) > 1:
            name = tokens[0]
            cells = tokens[1:1 + len(columns)]
            if not name.startswith("GPU"):
                continue
            row = {}
            for col, cell in zip(columns, cells):
                if col.startswith("GPU") and col != name:
                    row[col] = cell
            table["links"][name] = row
            continue
        if columns is not None:
            columns = None
    tables = [t for t in tables if t["links"]]
    if not tables:
        return {"kind": None, "gpus": [], "links": {}}
    out = []
    for t in tables:
        out.append({"kind": _table_kind(t["header"], t["links"]), "gpus": t["gpus"], "links": t["links"]})
    first = dict(out[0])
    if len(out) > 1:
        first["more"] = out[1:]
    return first
