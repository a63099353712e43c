# -*- coding: utf-8 -*-
"""Parse `lspci -v` / `-vv` / `-vvv` / `-vvnn` output into devices, BARs, links and ReBAR.

Pure function `parse(text) -> dict`; standard library only, Python 3.8+.
Output contract: docs/parse-formats.md ("lspci").
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

# "03:00.0 VGA compatible controller [0300]: NVIDIA Corporation ... [10de:2206] (rev a1)"
_HEADER_RE = re.compile(
    r"^\s*(?:[$#]\s+)?(?P<slot>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<rest>\S.*)$"
)
_CLASS_RE = re.compile(r"^(?P<cls>[^:]+?)(?:\s*\[(?P<code>[0-9a-fA-F]{4})\])?:\s*(?P<desc>.*)$")
_IDS_RE = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")
_REGION_RE = re.compile(
    r"^(?:Region\s+(?P<index>\d+):\s*)?(?P<kind>Memory|I/O ports)\s+at\s+"
    r"(?P<addr><[^>]*>|[0-9a-fA-F]+)(?P<rest>.*)$"
)
_SIZE_RE = re.compile(r"\[size=([0-9]+[KMGTP]?)\]")
_LINK_SPEED_RE = re.compile(r"Speed\s+(?P<speed>[0-9.]+)\s*GT/s(?:\s*\((?P<mark>[^)]*)\))?")
_LINK_WIDTH_RE = re.compile(r"Width\s+x(?P<width>\d+)(?:\s*\((?P<mark>[^)]*)\))?")
_REBAR_RE = re.compile(
    r"^BAR\s+(?P<bar>\d+):\s*current size:\s*(?P<cur>[0-9.]+\s*[KMGTP]?B?)(?:,\s*supported:\s*(?P<sup>.*))?$"
)
_CAP_RE = re.compile(r"^Capabilities:")


def _link(rest: str, with_marks: bool):
    speed = _LINK_SPEED_RE.search(rest)
    width = _LINK_WIDTH_RE.search(rest)
    if not speed and not width:
        return None
    link = {
        "speed_gts": float(speed.group("speed")) if speed else None,
        "width": int(width.group("width")) if width else None,
    }
    if with_marks:
        link["_speed_mark"] = (speed.group("mark") or "").strip().lower() if speed else ""
        link["_width_mark"] = (width.group("mark") or "").strip().lower() if width else ""
    return link


def _finish_link(dev: dict) -> None:
    sta = dev.get("link_sta")
    if sta is None:
        return
    cap = dev.get("link_cap") or {}
    for key, field in (("speed", "speed_gts"), ("width", "width")):
        mark = sta.pop(f"_{key}_mark", "")
        if mark == "downgraded":
            flag = True
        elif mark == "ok":
            flag = False
        else:
            have, most = sta.get(field), cap.get(field)
            flag = bool(have is not None and most is not None and have < most)
        sta[f"{key}_downgraded"] = flag


def _region(m) -> dict:
    rest = m.group("rest")
    addr = m.group("addr")
    kind = "io" if m.group("kind").startswith("I/O") else "memory"
    size = _SIZE_RE.search(rest)
    bits = None
    bm = re.search(r"\((\d+)-bit", rest)
    if bm:
        bits = int(bm.group(1))
    prefetch = None
    if "non-prefetchable" in rest:
        prefetch = False
    elif "prefetchable" in rest:
        prefetch = True
    return {
        "index": int(m.group("index")) if m.group("index") is not None else None,
        "kind": kind,
        "address": None if addr.startswith("<") else int(addr, 16),
        "size_bytes": parse_text.size_to_bytes(size.group(1)) if size else None,
        "bits": bits,
        "prefetchable": prefetch,
        "disabled": "[disabled]" in rest,
    }


def _new_device(m) -> dict:
    rest = m.group("rest")
    cm = _CLASS_RE.match(rest)
    cls = cm.group("cls").strip() if cm else None
    desc = cm.group("desc") if cm else rest
    ids = _IDS_RE.search(desc)
    return {
        "slot": parse_text.normalise_slot(m.group("slot")),
        "ids": (f"{ids.group(1)}:{ids.group(2)}").lower() if ids else None,
        "class": cls,
        "description": desc.strip() or None,
        "link_cap": None,
        "link_sta": None,
        "regions": [],
        "rebar": [],
        "driver": None,
    }


def parse(text: str) -> dict:
    devices = []
    dev = None
    in_rebar = False
    for raw in parse_text.lines(text):
        line = raw.strip()
        if not line:
            continue
        header = _HEADER_RE.match(raw)
        if header and _CLASS_RE.match(header.group("rest")) and not line.startswith(("Region", "BAR")):
            if dev is not None:
                _finish_link(dev)
            dev = _new_device(header)
            devices.append(dev)
            in_rebar = False
            continue
        if dev is None:
            continue
        if _CAP_RE.match(line):
            in_rebar = "Physical Resizable BAR" in line
            continue
        if in_rebar:
            rm = _REBAR_RE.match(line)
            if rm:
                sup = rm.group("sup") or ""
                supported = [parse_text.size_to_bytes(s) for s in sup.split()]
                dev["rebar"].append({
                    "bar": int(rm.group("bar")),
                    "current_bytes": parse_text.size_to_bytes(rm.group("cur")),
                    "supported_bytes": [s for s in supported if s is not None],
                })
                continue
            in_rebar = False
        rm = _REGION_RE.match(line)
        if rm:
            dev["regions"].append(_region(rm))
            continue
        if line.startswith("LnkCap:") and dev["link_cap"] is None:
            dev["link_cap"] = _link(line[len("LnkCap:"):], with_marks=False)
            continue
        if line.startswith("LnkSta:") and dev["link_sta"] is None:
            dev["link_sta"] = _link(line[len("LnkSta:"):], with_marks=True)
            continue
        if line.startswith("Kernel driver in use:"):
            dev["driver"] = line.split(":", 1)[1].strip() or None
    if dev is not None:
        _finish_link(dev)
    return {"devices": devices}
