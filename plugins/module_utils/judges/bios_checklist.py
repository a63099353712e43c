# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The BIOS checklist: what the user must switch in the firmware setup, each item judged from the OS side.

Pure: it reads the firmware evidence (evidence.collect_static(root, ("gpus",))) and the firmware
verdict (ladder_static.judge_firmware); it never claims to change a BIOS setting.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers as ladder_static

GIB = 1 << 30


def _bars(evidence, vendor):
    out = []
    for gpu in evidence.get("gpus") or []:
        bar = ladder_static._vram_bar(gpu, vendor) if gpu.get("bars") else None
        out.append((gpu, bar))
    return out


def checklist(evidence, ladder_view):
    """[{item, setting, done (True/False/None), seen}] for CSM, Above 4G Decoding and Resizable BAR."""
    vendor = ladder_static._vendor(evidence, ladder_view)
    vram_gib = (ladder_view.get("gpu") or {}).get("vram_gib")
    vram = int(vram_gib * GIB) if vram_gib else None
    bars = _bars(evidence, vendor)
    known = [(g, b) for g, b in bars if b is not None]
    uefi = bool(evidence.get("uefi"))
    virtual = evidence.get("virtual") or {}
    items = [{
        "item": "csm_off",
        "setting": "CSM (Compatibility Support Module) OFF: boot UEFI",
        "done": uefi,
        "seen": "UEFI boot (/sys/firmware/efi present)" if uefi else "legacy/CSM boot (no /sys/firmware/efi)",
    }]
    if not uefi and virtual.get("vm") is True:  # its hypervisor boots it: no BIOS, no CSM to switch
        items[0].update(done=None, seen="a virtual machine (%s) its hypervisor boots: no BIOS or CSM here"
                        % virtual.get("seen"))
    above = [b["start"] >= ladder_static.FOUR_GIB for _g, b in known]
    items.append({
        "item": "above_4g_decoding",
        "setting": "Above 4G Decoding ON",
        "done": all(above) if known else None,
        "seen": ", ".join("%s VRAM BAR at 0x%x" % (g["slot"], b["start"]) for g, b in known) or "no GPU BAR readable",
    })
    large = []
    for gpu, bar in known:
        sizes = (gpu.get("resize") or {}).get(bar["index"]) or []
        largest = max(sizes) if sizes else None
        large.append((vram is not None and bar["size"] >= vram) or (largest is not None and bar["size"] >= largest))
    items.append({
        "item": "resizable_bar",
        "setting": "Resizable BAR ON",
        "done": all(large) if known else None,
        "seen": ", ".join("%s VRAM BAR %s" % (g["slot"], ladder_static.human_bytes(b["size"])) for g, b in known)
        or "no GPU BAR readable",
    })
    return items


def render(items, verdict, p2p_required):
    mark = {True: "[x] done    ", False: "[ ] NOT DONE", None: "[?] unknown "}
    lines = ["BIOS checklist (read from the OS side; rigbook never changes BIOS settings):"]
    for item in items:
        lines.append("  %s %s -- %s" % (mark[item["done"]], item["setting"], item["seen"]))
    if verdict["status"] != "pass":
        lines.append("  firmware layer: %s: %s" % (verdict["status"], verdict["why"]))
    if not p2p_required and any(i["done"] is False for i in items):
        lines.append("  P2P is not required by the host variables (rigbook_p2p): these items are advice, "
                     "not a failure.")
    return lines
