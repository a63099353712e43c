# -*- coding: utf-8 -*-
"""Parse `rocminfo` (the HSA agents) and `rocm-smi` (the concise table): which GPUs the ROCm tools list.

Pure functions; standard library only, Python 3.8+. Both return {"gpus": [...], "errors": [...]}: a GPU the
tool does not list is simply absent, and text that is not the tool's output gives no GPU and an error.
"""

from __future__ import annotations

import re

_AGENT_RE = re.compile(r"^\*{3,}\s*$\n^Agent\s+(\d+)\s*$\n^\*{3,}\s*$", re.M)
_KV_RE = re.compile(r"^  (?P<key>[A-Za-z][A-Za-z0-9 .()/_-]*?):\s*(?P<value>.*?)\s*$")
# rocm-smi's concise table: a row starts with the device index and the KFD node, then the device id
_SMI_ROW_RE = re.compile(r"^(?P<device>\d+)\s+(?P<node>\d+)\s+(?P<did>0x[0-9a-fA-F]{4}),")


def parse_rocminfo(text):
    """GPU agents of `rocminfo`: [{agent, name (gfx target), marketing_name, chip_id, bdfid}]."""
    starts = list(_AGENT_RE.finditer(text or ""))
    if not starts:
        return {"gpus": [], "errors": ["no HSA agents found (not rocminfo output?)"]}
    gpus = []
    for i, match in enumerate(starts):
        block = text[match.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        fields = {}
        for line in block.splitlines():
            kv = _KV_RE.match(line)  # agent-level fields are indented by two spaces exactly
            if kv and kv.group("key") not in fields:
                fields[kv.group("key")] = kv.group("value")
        if fields.get("Device Type") != "GPU":
            continue
        chip = re.match(r"^\d+\((0x[0-9a-fA-F]+)\)", fields.get("Chip ID", ""))
        bdf = fields.get("BDFID", "")
        gpus.append({
            "agent": int(match.group(1)),
            "name": fields.get("Name"),
            "marketing_name": fields.get("Marketing Name"),
            "chip_id": "0x%04x" % int(chip.group(1), 16) if chip else None,
            "bdfid": int(bdf) if bdf.isdigit() else None,
        })
    return {"gpus": gpus, "errors": []}


def parse_rocm_smi(text):
    """Device rows of `rocm-smi` (the concise table): [{device, node, device_id}]."""
    if "ROCm System Management Interface" not in (text or ""):
        return {"gpus": [], "errors": ["no ROCm SMI header found (not rocm-smi output?)"]}
    gpus = []
    for line in text.splitlines():
        row = _SMI_ROW_RE.match(line.strip())
        if row:
            gpus.append({"device": int(row.group("device")), "node": int(row.group("node")),
                         "device_id": row.group("did").lower()})
    return {"gpus": gpus, "errors": []}


def bdfid_to_slot(bdfid):
    """rocminfo's BDFID (bus << 8 | device << 3 | function) as a PCI address without the domain."""
    if bdfid is None:
        return None
    return "%02x:%02x.%d" % (bdfid >> 8, (bdfid >> 3) & 0x1F, bdfid & 0x7)
