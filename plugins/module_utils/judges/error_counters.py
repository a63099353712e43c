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

from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import worse

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


def _quote(lines):
    """The last few log lines, quoted for a `why`."""
    lines = list(lines or [])[-MAX_QUOTED_LINES:]
    return (": " + " | ".join('"%s"' % line for line in lines)) if lines else ""


def _aer_findings(delta, warn_above):
    """[(severity, text, remedy)] of the AER counters that rose."""
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
                            % (where, counter, rise, line), REMEDY_AER))
            else:
                line = _quote((log.get("aer_" + severity) or {}).get("lines"))
                out.append(("fail", "%s: %s AER +%d%s" % (where, counter, rise, line), REMEDY_AER))
    return out


def _xid_findings(delta):
    entry = (delta.get("log") or {}).get("xid") or {}
    numbers = dict((int(k), v) for k, v in (entry.get("numbers") or {}).items())
    critical = sorted(n for n in numbers if n in CRITICAL_XIDS)
    other = sorted(n for n in numbers if n not in CRITICAL_XIDS)
    out = []
    if critical:
        out.append(("fail", "critical Xid %s in the kernel log%s"
                    % (", ".join(str(n) for n in critical), _quote(entry.get("lines"))), REMEDY_XID))
    if other and not delta.get("since_boot"):
        out.append(("warn", "Xid %s in the kernel log%s"
                    % (", ".join(str(n) for n in other), _quote(entry.get("lines"))), REMEDY_XID))
    return out


def _log_findings(delta):
    log = delta.get("log") or {}
    out = []
    reset = log.get("amdgpu_reset") or {}
    if reset.get("count"):
        out.append(("fail", "%d amdgpu GPU reset / ring timeout line(s)%s"
                    % (reset["count"], _quote(reset.get("lines"))), REMEDY_AMDGPU))
    fault = log.get("iommu_fault") or {}
    if fault.get("count"):
        out.append(("fail", "%d IOMMU fault line(s) (DMAR / AMD-Vi)%s"
                    % (fault["count"], _quote(fault.get("lines"))), REMEDY_IOMMU))
    return out


def judge(delta, correctable_warn_above=DEFAULT_CORRECTABLE_WARN_ABOVE):
    """{"status": pass|warn|fail, "problems": [...], "notes": [...], "remedies": [...], "since_boot",
    "unknown": [...]} of one delta. CORRECTABLE_WARN_ABOVE: correctable AER rises up to it are accepted."""
    delta = delta or {}
    try:
        warn_above = int(correctable_warn_above)
    except (TypeError, ValueError):
        warn_above = DEFAULT_CORRECTABLE_WARN_ABOVE
    findings = _aer_findings(delta, warn_above) + _xid_findings(delta) + _log_findings(delta)
    problems = [text for severity, text, _ in findings if severity == "fail"]
    notes = [text for severity, text, _ in findings if severity == "warn"]
    remedies = []
    for _, _, remedy in findings:
        if remedy not in remedies:
            remedies.append(remedy)
    status = "fail" if problems else "warn" if notes else "pass"
    return {"status": status, "problems": problems, "notes": notes, "remedies": remedies,
            "since_boot": bool(delta.get("since_boot")), "unknown": list(delta.get("unknown") or [])}


def worsen(verdict, judged, errors):
    """VERDICT with JUDGED applied: its status raised to JUDGED's when worse (judges/verdict.SEVERITY: never
    lowered, so a warn leaves an unknown unknown), `why` extended with the problems and notes, the remedies
    appended, measured["errors"] = ERRORS. A pass judgement leaves VERDICT as it is; a warn judgement leaves the
    status of a verdict that measured nothing (not_measured: the skip of a layer that ran out of GPU memory beside an
    engine, ladder/beside_engine.py) as it is, so a correctable AER burst never turns "not measured" into a warn."""
    if judged["status"] == "pass":
        return verdict
    out = dict(verdict)
    if judged["status"] != "warn" or not verdict.get("not_measured"):
        out["status"] = worse(out.get("status"), judged["status"])
    when = "since boot (no earlier reading)" if judged["since_boot"] else "during this layer"
    text = "hardware errors %s: %s" % (when, "; ".join(judged["problems"] + judged["notes"]))
    out["why"] = "%s; %s" % (out["why"], text) if out.get("why") else text
    out["remedy"] = " ".join([r for r in [out.get("remedy")] if r] + judged["remedies"])
    measured = out.get("measured")
    measured = dict(measured) if isinstance(measured, dict) else {"layer": measured}
    measured["errors"] = errors
    out["measured"] = measured
    return out
