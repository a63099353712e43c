# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Judge the hardware error counters that rose during a runtime layer (pure; standard library only).

Input: a delta of collect/error_counters.py. Seed 004 accepted its P2P path with "AER errors 0, DMAR errors
0, GPU resets 0" during the tests. The classes follow public health checks (Azure/azurehpc-health-checks'
customTests/azure_gpu_xid.nhc for the critical Xid list, Meta GCM's check-syslogs for AER fatal vs correctable):
- fail: any new nonfatal or fatal AER (GPU or its root port), any new Xid of CRITICAL_XIDS (Azure's NHC list),
  any amdgpu GPU reset / ring timeout, any IOMMU (DMAR / AMD-Vi) fault;
- warn: new correctable AER above the threshold (default 0: any new one warns; "a rising count is a link
  degrading"), any other new Xid.
A delta "since boot" (no earlier reading: a first run) is judged on the fail class only; correctable counts
and other Xids since boot say nothing about this run.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import code_entry, rank, recoded, worse

CRITICAL_XIDS = frozenset((48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120))
DEFAULT_CORRECTABLE_WARN_ABOVE = 0
MAX_QUOTED_LINES = 3

REMEDY_AER = ("PCIe errors on the GPU's link: reseat the GPU and its riser (or take the riser out), check the "
              "slot's power, and train the link one generation lower in the BIOS if the count keeps rising.")
REMEDY_IOMMU = ("IOMMU faults on the peer path: boot with iommu=pt (intel_iommu=on iommu=pt / amd_iommu=on "
                "iommu=pt) and check that every peer BAR lies inside the GPU's DMA window (the dma_window layer).")
REMEDY_XID = ("An NVIDIA Xid: look it up in NVIDIA's Xid catalog; check the driver is the pinned build "
              "(driver_state), and for Xid 79 (fallen off the bus) the card's power and seating.")
REMEDY_AMDGPU = ("The amdgpu driver reset the GPU: check the amdgpu / ROCm build is the pinned one, the card's "
                 "power and seating, and the kernel log before the reset for what hung.")


def _code(title, cause, measured, action):
    return code_entry("error_counters", title, cause, measured, action)


# The failure codes of the counters' findings (ladder/codes.py gathers them). worsen() puts them in front of the
# layer's own codes when the counters raise the layer's status.
CODES = {
    "RB-HW-AER-UNCORRECTABLE": _code(
        "an uncorrectable (nonfatal or fatal) PCIe AER error rose during the layer",
        "The GPU's link, or the root port above it, reported an uncorrectable PCIe error: a transaction was lost or "
        "corrupted (a bad riser, a slot's power, a link trained too fast).",
        "sysfs aer_dev_nonfatal / aer_dev_fatal of the GPU and aer_rootport_total_err_nonfatal / _fatal of its root "
        "port, read before and after the layer (or since boot on a first run), with the kernel log's AER lines.",
        REMEDY_AER),
    "RB-HW-AER-CORRECTABLE": _code(
        "correctable PCIe AER errors rose during the layer",
        "The link corrected errors by replaying them: no data was lost, but a rising count is a link degrading.",
        "sysfs aer_dev_correctable of the GPU and aer_rootport_total_err_cor of its root port, before and after the "
        "layer, above the tolerance's aer_correctable_warn_above (default 0); not judged since boot.",
        REMEDY_AER),
    "RB-HW-XID-CRITICAL": _code(
        "a critical NVIDIA Xid appeared in the kernel log",
        "The NVIDIA driver logged an Xid of the critical list (Azure's NHC list: 48 double-bit ECC, 79 fallen off the "
        "bus, 119/120 GSP errors, ...): the GPU or its link failed.",
        "The kernel log's 'NVRM: Xid' lines that appeared during the layer (or since boot on a first run).",
        REMEDY_XID),
    "RB-HW-XID-OTHER": _code(
        "an NVIDIA Xid not on the critical list appeared in the kernel log",
        "The NVIDIA driver logged an Xid outside the critical list (often an application fault, e.g. Xid 13 or 109).",
        "The kernel log's 'NVRM: Xid' lines that appeared during the layer; not judged since boot.",
        REMEDY_XID),
    "RB-HW-AMDGPU-RESET": _code(
        "the amdgpu driver reset a GPU (or a ring timed out)",
        "amdgpu logged a GPU reset or a ring timeout during the layer: a job hung on the GPU.",
        "The kernel log's amdgpu 'GPU reset' / 'ring ... timeout' lines.",
        REMEDY_AMDGPU),
    "RB-HW-IOMMU-FAULT": _code(
        "the IOMMU faulted a DMA (DMAR / AMD-Vi)",
        "A device's DMA hit an address the IOMMU does not map: on the peer path, a peer BAR outside the GPU's DMA "
        "window or an IOMMU in translating mode.",
        "The kernel log's DMAR / AMD-Vi fault lines.",
        REMEDY_IOMMU),
}


def _quote(lines):
    """The last few log lines, quoted for a `why`."""
    lines = list(lines or [])[-MAX_QUOTED_LINES:]
    return (": " + " | ".join('"%s"' % line for line in lines)) if lines else ""


def _aer_findings(delta, warn_above):
    """[(severity, text, remedy, code)] of the AER counters that rose."""
    out = []
    log = delta.get("log") or {}
    devices = delta.get("devices") or {}
    for bdf, counters in sorted((delta.get("aer") or {}).items()):
        where = devices.get(bdf) or bdf
        for counter, rise in sorted(counters.items()):
            severity = counter.replace("rootport_", "")
            if severity == "correctable":
                if delta.get("since_boot") or rise <= warn_above:
                    continue
                line = _quote((log.get("aer_corrected") or {}).get("lines"))
                out.append(("warn", "%s: %s +%d (a rising count is a link degrading)%s"
                            % (where, counter, rise, line), REMEDY_AER, "RB-HW-AER-CORRECTABLE"))
            else:
                line = _quote((log.get("aer_" + severity) or {}).get("lines"))
                out.append(("fail", "%s: %s AER +%d%s" % (where, counter, rise, line), REMEDY_AER,
                            "RB-HW-AER-UNCORRECTABLE"))
    return out


def _xid_findings(delta):
    entry = (delta.get("log") or {}).get("xid") or {}
    numbers = dict((int(k), v) for k, v in (entry.get("numbers") or {}).items())
    critical = sorted(n for n in numbers if n in CRITICAL_XIDS)
    other = sorted(n for n in numbers if n not in CRITICAL_XIDS)
    out = []
    if critical:
        out.append(("fail", "critical Xid %s in the kernel log%s"
                    % (", ".join(str(n) for n in critical), _quote(entry.get("lines"))), REMEDY_XID,
                    "RB-HW-XID-CRITICAL"))
    if other and not delta.get("since_boot"):
        out.append(("warn", "Xid %s in the kernel log%s"
                    % (", ".join(str(n) for n in other), _quote(entry.get("lines"))), REMEDY_XID,
                    "RB-HW-XID-OTHER"))
    return out


def _log_findings(delta):
    log = delta.get("log") or {}
    out = []
    reset = log.get("amdgpu_reset") or {}
    if reset.get("count"):
        out.append(("fail", "%d amdgpu GPU reset / ring timeout line(s)%s"
                    % (reset["count"], _quote(reset.get("lines"))), REMEDY_AMDGPU, "RB-HW-AMDGPU-RESET"))
    fault = log.get("iommu_fault") or {}
    if fault.get("count"):
        out.append(("fail", "%d IOMMU fault line(s) (DMAR / AMD-Vi)%s"
                    % (fault["count"], _quote(fault.get("lines"))), REMEDY_IOMMU, "RB-HW-IOMMU-FAULT"))
    return out


def judge(delta, correctable_warn_above=DEFAULT_CORRECTABLE_WARN_ABOVE):
    """{"status": pass|warn|fail, "problems": [...], "notes": [...], "remedies": [...], "codes": [...], "since_boot",
    "unknown": [...]} of one delta; codes: each finding's code (CODES), the fail class first. CORRECTABLE_WARN_ABOVE:
    correctable AER rises up to it are accepted."""
    delta = delta or {}
    try:
        warn_above = int(correctable_warn_above)
    except (TypeError, ValueError):
        warn_above = DEFAULT_CORRECTABLE_WARN_ABOVE
    findings = _aer_findings(delta, warn_above) + _xid_findings(delta) + _log_findings(delta)
    problems = [text for severity, text, _, _ in findings if severity == "fail"]
    notes = [text for severity, text, _, _ in findings if severity == "warn"]
    remedies, codes = [], []
    for _, _, remedy, _ in findings:
        if remedy not in remedies:
            remedies.append(remedy)
    for _, _, _, code in sorted(findings, key=lambda f: -rank(f[0])):
        if code not in codes:
            codes.append(code)
    status = "fail" if problems else "warn" if notes else "pass"
    return {"status": status, "problems": problems, "notes": notes, "remedies": remedies, "codes": codes,
            "since_boot": bool(delta.get("since_boot")), "unknown": list(delta.get("unknown") or [])}


def worsen(verdict, judged, errors):
    """VERDICT with JUDGED applied: its status raised to JUDGED's when worse (judges/verdict.SEVERITY: never
    lowered, so a warn leaves an unknown unknown), `why` extended with the problems and notes, the remedies
    appended, measured["errors"] = ERRORS, JUDGED's codes added to VERDICT's: in front (verdict.recoded) when the
    counters raised the status, after the layer's own otherwise. A pass judgement leaves VERDICT as it is; a warn
    judgement leaves the status of a verdict that measured nothing (not_measured: the skip of a layer that ran out of
    GPU memory beside an engine, ladder/beside_engine.py) as it is, so a correctable AER burst never turns "not
    measured" into a warn."""
    if judged["status"] == "pass":
        return verdict
    out = dict(verdict)
    if judged["status"] != "warn" or not verdict.get("not_measured"):
        out["status"] = worse(out.get("status"), judged["status"])
    out = _coded(out, verdict, judged.get("codes") or [])
    when = "since boot (no earlier reading)" if judged["since_boot"] else "during this layer"
    text = "hardware errors %s: %s" % (when, "; ".join(judged["problems"] + judged["notes"]))
    out["why"] = "%s; %s" % (out["why"], text) if out.get("why") else text
    out["remedy"] = " ".join([r for r in [out.get("remedy")] if r] + judged["remedies"])
    measured = out.get("measured")
    measured = dict(measured) if isinstance(measured, dict) else {"layer": measured}
    measured["errors"] = errors
    out["measured"] = measured
    return out


def _coded(out, verdict, codes):
    """OUT (VERDICT worsened) with the counters' CODES: first when the status rose (verdict.recoded), after the
    verdict's own otherwise."""
    if not codes:
        return out
    if out["status"] != verdict.get("status"):
        for code in reversed(codes):  # the counters' codes first, in their order, the layer's own after them
            out = recoded(out, code)
        return out
    own = verdict.get("codes") or ([verdict["code"]] if verdict.get("code") else [])
    ordered = own + [c for c in codes if c not in own]
    out["code"] = ordered[0]
    if len(ordered) > 1:
        out["codes"] = ordered
    return out
