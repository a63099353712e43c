# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence from pasted tool outputs (pure; standard library only): the parts of a paste (parse/paste.split), each
read by its kind's parser, made into the evidence parts the ladder's judges read, so `provision diagnose` judges a
paste with the same judges as a live run, a lab run or a replay.

What each kind gives (docs/diagnose.md has the table):
- lspci -vv: "gpus" (BARs, ReBAR sizes, link capability and status) -> firmware, pcie_link, dma_window. The boot
  mode and the kernel command line are not in lspci: "uefi" is None (not read).
- p2pBandwidthLatencyTest: "probe" (can-access per pair from its connectivity matrix, peer copy GB/s from the
  P2P=Enabled matrix, the host-staged copy from P2P=Disabled, both ways at once from the bidirectional matrix)
  -> peer_access, p2p_bandwidth. It does not check the copied data: pattern_ok stays None.
- nvidia-smi topo -p2p r: "probe" with can-access per pair only (OK, or NS/CNS/GNS/TNS) -> peer_access.
- nccl-tests / rccl-tests: "collectives" (the largest row per test, out of place; its own failure lines) ->
  collectives; a failed run's trailer is kept as `failures`.
- NCCL/RCCL log: "nccl_transport" (collect/collective_bench.transport_evidence) -> nccl_transport; its failure
  lines (a mapping that failed) go to the probe's `failures` -> peer_access.
- kernel log: the error-counter judge's input (judges/error_counters: the AER, Xid, IOMMU and amdgpu lines it holds).
Where two parts of one kind disagree, the later one in the paste is the one judged (threads paste the newest
state last); the report says which part was set aside.
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import kernel_log
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import lspci as parse_lspci
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nvidia_smi as parse_nvidia_smi
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import p2p_bandwidth as parse_p2p

VENDORS = {"10de": "nvidia", "1002": "amd"}
GPU_CLASSES = ("vga compatible controller", "3d controller", "display controller")
P2P_OK = "OK"
NO_DATA_CHECK = "p2pBandwidthLatencyTest does not check the copied data"
# The kinds the evidence builder reads; the others (lspci -tv, rocm-smi --showtopo, TransferBench) are recognised
# and named, not judged yet.
JUDGED_KINDS = ("lspci", "nvidia-smi-q", "p2p-bandwidth", "nvidia-smi-topo", "nccl-tests", "nccl-log", "kernel-log")
# The layers each evidence part lets the ladder judge (the rest are "not in the pastes").
LAYERS_OF = {
    "gpus": ("firmware", "pcie_link", "dma_window"),
    "probe": ("peer_access", "p2p_bandwidth"),
    "probe_failures": ("peer_access",),  # a probe made of failure lines only: nothing was timed
    "collectives": ("collectives",),
    "nccl_transport": ("nccl_transport",),
}


def where(part):
    """A part's place in the paste, in words: "lines 3-40 (lspci -vv)"."""
    text = "lines %d-%d" % (part["first"], part["last"]) if part["last"] != part["first"] else "line %d" % part["first"]
    return text


# lspci without -n names the vendor in words only.
_VENDOR_WORDS = (("NVIDIA", "10de"), ("Advanced Micro Devices", "1002"), ("AMD/ATI", "1002"),
                 ("ATI Technologies", "1002"))


def _vendor_named(description):
    """The vendor id of a device lspci names in words (`NVIDIA Corporation ...`), or None."""
    return next((vid for words, vid in _VENDOR_WORDS if words in (description or "")), None)


def _gpu_of(device):
    """A `gpus` entry (collect/static_evidence.collect_gpus's shape) of one lspci device, or None when the device is
    no NVIDIA/AMD display function."""
    vendor_id = (device.get("ids") or ":").split(":")[0] or _vendor_named(device.get("description"))
    cls = (device.get("class") or "").lower()
    if vendor_id not in VENDORS or not cls.startswith(GPU_CLASSES):
        return None
    bars = []
    for position, region in enumerate(device.get("regions") or []):
        if region.get("address") is None or not region.get("size_bytes"):
            continue  # unassigned; a [disabled] region (decoding off, no driver bound) still has its place and size
        index = region["index"] if region.get("index") is not None else position
        bars.append({
            "index": index, "start": region["address"], "end": region["address"] + region["size_bytes"] - 1,
            "size": region["size_bytes"], "kind": region["kind"], "prefetchable": bool(region.get("prefetchable")),
            "bits": region.get("bits") or (64 if region["address"] >= 1 << 32 else 32),
        })
    cap, sta = device.get("link_cap") or {}, device.get("link_sta") or {}
    return {
        "slot": device["slot"], "vendor": VENDORS[vendor_id], "vendor_id": "0x" + vendor_id,
        "device_id": "0x" + device["ids"].split(":")[1] if device.get("ids") else None, "class": cls,
        "subsystem": None, "upstream_port": None,
        "bars": bars if device.get("regions") else None,
        "resize": {entry["bar"]: sorted(entry.get("supported_bytes") or []) for entry in device.get("rebar") or []},
        "link": {"current_speed_gts": sta.get("speed_gts"), "max_speed_gts": cap.get("speed_gts"),
                 "current_width": sta.get("width"), "max_width": cap.get("width")},
        "chain": [], "host_bridge": None, "dma_mask_bits": None,
    }


def gpus_of(parts):
    """{"gpus": [...], "uefi": None, "kernel": {}} of the lspci parts (a later part's device replaces an earlier one
    of the same slot), or {} when they show no GPU."""
    by_slot = {}
    for part in parts:
        for device in parse_lspci.parse("\n".join(part["lines"]))["devices"]:
            gpu = _gpu_of(device)
            if gpu is not None:
                by_slot[gpu["slot"]] = gpu
    if not by_slot:
        return {}
    return {"gpus": [by_slot[slot] for slot in sorted(by_slot)], "uefi": None, "kernel": {"cmdline": None},
            "root": "the pasted lspci output"}


def gpus_of_smi(parts):
    """[gpus entries] of the nvidia-smi -q parts: the link (PCIe generation and width, max and current) and BAR1 (its
    size; nvidia-smi does not say where it is placed: start None), each GPU by its Bus Id, else by its place in the
    output; and the VRAM (FB Memory Usage Total) in GiB when every GPU shows the same."""
    # deferred: static_layers is the judges' module; only nvidia-smi -q parts need its speed table
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges.static_layers import GEN_SPEED_GTS

    gpus, vram = [], set()
    for part in parts:
        for number, smi in enumerate(parse_nvidia_smi.parse_q("\n".join(part["lines"]))["gpus"]):
            if smi.get("fb_total_mib"):
                vram.add(smi["fb_total_mib"])
            bar1 = smi.get("bar1_total_mib")
            gpus.append({
                "slot": smi.get("bus_id") or "GPU%d of %s" % (number, where(part)), "vendor": "nvidia",
                "vendor_id": "0x10de", "device_id": None, "class": None, "subsystem": None, "upstream_port": None,
                "bars": [{"index": 1, "start": None, "end": None, "size": bar1 << 20, "kind": "memory",
                          "prefetchable": True, "bits": 64}] if bar1 else None,
                "resize": {},
                "link": {"current_speed_gts": GEN_SPEED_GTS.get(smi.get("pcie_gen_current")),
                         "max_speed_gts": GEN_SPEED_GTS.get(smi.get("pcie_gen_max")),
                         "current_width": smi.get("link_width_current"), "max_width": smi.get("link_width_max")},
                "chain": [], "host_bridge": None, "dma_mask_bits": None, "read_by": "nvidia-smi -q",
            })
    return gpus, (vram.pop() / 1024.0 if len(vram) == 1 else None)


def _matrix(parsed, key):
    return (parsed.get("matrices") or {}).get(key) or {}


def _cell(matrix, i, j):
    value = (matrix.get(str(i)) or {}).get(str(j))
    return value if isinstance(value, (int, float)) and value >= 0 else None


def probe_of_p2p_test(part):
    """The probe evidence (probe/cuda.py's shape) of one p2pBandwidthLatencyTest part, or None when it holds no
    matrix and no device."""
    parsed = parse_p2p.parse("\n".join(part["lines"]))
    connectivity = parsed.get("p2p_connectivity") or {}
    access = parsed.get("can_access_peer") or {}
    enabled, disabled = _matrix(parsed, "unidirectional_p2p_enabled"), _matrix(parsed, "unidirectional_p2p_disabled")
    both = _matrix(parsed, "bidirectional_p2p_enabled")
    indices = sorted({d["index"] for d in parsed.get("devices") or []}
                     | {int(k) for table in (connectivity, enabled, disabled, both) for k in table if k.isdigit()})
    if not indices:
        return None
    names = {d["index"]: d for d in parsed.get("devices") or []}
    devices = [{"index": i, "name": (names.get(i) or {}).get("name"), "pci_bus_id": (names.get(i) or {}).get("bus_id"),
                "h2d_gbs": None, "d2h_gbs": None, "errors": []} for i in indices]
    pairs, bidir = [], []
    for i in indices:
        for j in indices:
            if i == j:
                continue
            can = (access.get(str(i)) or {}).get(str(j))
            if can is None:
                can = (connectivity.get(str(i)) or {}).get(str(j))
            pairs.append({"src": i, "dst": j, "can_access_peer": can,
                          # the test enables peer access on every pair its connectivity matrix marks 1
                          "enable_peer": "ok" if can else None,
                          "peer_gbs": _cell(enabled, i, j), "host_staged_gbs": _cell(disabled, i, j),
                          "pattern_ok": None, "staged_pattern_ok": None, "errors": [NO_DATA_CHECK]})
            if i < j and _cell(both, i, j) is not None:
                bidir.append({"a": i, "b": j, "gbs": _cell(both, i, j), "errors": []})
    return {"available": True, "api": "cuda", "source": "pasted p2pBandwidthLatencyTest (%s)" % where(part),
            "devices": devices, "pairs": pairs, "bidir": bidir, "errors": []}


def probe_of_topo(part):
    """The probe evidence of an `nvidia-smi topo -p2p` table (can-access per pair, nothing measured), or None when
    the part holds no such table (a `topo -m` matrix is read for its GPUs only)."""
    parsed = parse_nvidia_smi.parse_topo("\n".join(part["lines"]))
    tables = [dict(parsed, more=None)] + list(parsed.get("more") or []) if parsed.get("kind") else []
    table = next((t for t in tables if t.get("kind") == "p2p"), None)
    if table is None:
        return None
    index = dict((name, int(name[3:])) for name in table["gpus"] if name[3:].isdigit())
    pairs = []
    for src, row in sorted(table["links"].items()):
        for dst, cell in sorted(row.items()):
            if src in index and dst in index and src != dst:
                pairs.append({"src": index[src], "dst": index[dst], "can_access_peer": cell == P2P_OK,
                              "enable_peer": None, "peer_gbs": None, "host_staged_gbs": None, "pattern_ok": None,
                              "staged_pattern_ok": None,
                              "errors": ["nvidia-smi topo -p2p says %s; it enables and copies nothing" % cell]})
    devices = [{"index": i, "name": None, "pci_bus_id": None, "h2d_gbs": None, "d2h_gbs": None, "errors": []}
               for i in sorted(index.values())]
    return {"available": True, "api": "cuda", "source": "pasted nvidia-smi topo -p2p (%s)" % where(part),
            "devices": devices, "pairs": pairs, "bidir": [], "errors": []}


def gpu_count_of_topo(part):
    """How many GPUs an `nvidia-smi topo` part shows (None when it shows none)."""
    parsed = parse_nvidia_smi.parse_topo("\n".join(part["lines"]))
    return len(parsed.get("gpus") or []) or None


_OP_RE = re.compile(r"^(\w+?)(?:_perf)?$")


def collectives_of(parts, log_parts):
    """The collectives evidence of the nccl-tests PARTS (one result per test, a later run of a test replacing an
    earlier one; LOG_PARTS: the NCCL log parts beside them, the run's own log and its failure trailer), or None when
    they hold neither a result row nor a failure line."""
    logs = ["\n".join(p["lines"]) for p in log_parts]
    rows, failures, sources = {}, [], []
    for part in parts:
        text = "\n".join(part["lines"])
        parsed = parse_nccl.parse_tests(text)
        op = _OP_RE.match(parsed.get("collective") or "")
        row = collective_bench.rows_from_nccl_tests(op.group(1) if op else "unnamed test", text)
        if row:
            rows[row["op"]] = row
        for line in part["lines"]:
            failure = parse_nccl.failure_of(line)
            if failure and failure not in failures:
                failures.append(failure)
        sources.append(where(part))
    sources += [where(p) for p in log_parts if p not in parts]
    for text in logs:
        for failure in parse_nccl.parse_log(text)["failures"]:
            if failure not in failures:
                failures.append(failure)
    if not rows and not failures:
        return None
    data = {"available": bool(rows), "source": "pasted nccl-tests / NCCL output (%s)" % ", ".join(sources),
            "results": [rows[op] for op in sorted(rows)], "failures": failures[:parse_nccl.MAX_FAILURES],
            "error": None if rows else "the run printed no result row"}
    log = "\n".join(logs)
    if log.strip():
        data["log"] = collective_bench.log_summary(log)
    return data


def _ranks_of(parts):
    """How many GPUs NCCL logs show: the ranks their channel lines connect, when every channel stays inside the box
    (a NET channel means ranks on other machines: the box's own count is then not read); None when unknown."""
    ranks, remote = set(), False
    for part in parts:
        for channel in parse_nccl.parse_log("\n".join(part["lines"]))["channels"]:
            ranks.update((channel["from_rank"], channel["to_rank"]))
            remote = remote or channel["transport"].upper().startswith(("NET", "COLLNET"))
    return len(ranks) if ranks and not remote else None


def transport_of(part):
    """The nccl_transport evidence of one NCCL/RCCL log part."""
    return collective_bench.transport_evidence("\n".join(part["lines"]), "pasted NCCL log (%s)" % where(part))


def kernel_log_of(parts):
    """The error-counter judge's input (a delta, judges/error_counters.judge) of every kernel log part together:
    each error line in the paste counts as one that rose (a paste is what the owner saw, not since boot)."""
    parsed = kernel_log.parse("\n".join(line for part in parts for line in part["lines"]))
    counts = dict((severity, parsed["aer_" + name]["count"]) for severity, name in
                  (("correctable", "corrected"), ("nonfatal", "nonfatal"), ("fatal", "fatal")))
    aer = {"the pasted kernel log": dict((k, v) for k, v in counts.items() if v)} if any(counts.values()) else {}
    return {"aer": aer, "devices": {}, "log": parsed, "since_boot": False}


def evidence_of(parts):
    """(evidence, facts, used): the evidence parts of PARTS (parse/paste.split's, each with its kind), the facts
    the pastes show ({"vendor", "gpus"}), and per evidence part the paste parts it was built from (the later of
    two parts of a single-valued kind wins; the report names the part set aside)."""
    by_kind = {}
    for part in parts:
        by_kind.setdefault(part["kind"], []).append(part)
    evidence, used, facts = {}, {}, {"vendor": None, "gpus": None, "vram_gib": None}
    static = gpus_of(by_kind.get("lspci") or [])
    smi, facts["vram_gib"] = gpus_of_smi(by_kind.get("nvidia-smi-q") or [])
    if static:
        # lspci places the BARs; nvidia-smi -q adds the GPUs lspci did not show (by Bus Id)
        seen = {gpu["slot"] for gpu in static["gpus"]}
        static["gpus"] += [gpu for gpu in smi if ":" in gpu["slot"] and gpu["slot"] not in seen]
    elif smi:
        static = {"gpus": smi, "uefi": None, "kernel": {"cmdline": None}, "root": "the pasted nvidia-smi -q output"}
    if static:
        evidence.update(static)
        used["gpus"] = list(by_kind.get("lspci") or []) + list(by_kind.get("nvidia-smi-q") or [])
        vendors = {gpu["vendor"] for gpu in static["gpus"]}
        facts.update(gpus=len(static["gpus"]), vendor=vendors.pop() if len(vendors) == 1 else None)
    probes = [(probe_of_p2p_test(p), p) for p in by_kind.get("p2p-bandwidth") or []]
    probes += [(probe_of_topo(p), p) for p in by_kind.get("nvidia-smi-topo") or []]
    probes = [(probe, part) for probe, part in probes if probe]
    if probes:
        # a measured probe (p2pBandwidthLatencyTest) over a topo table; the later of two of a kind
        measured = [(probe, part) for probe, part in probes if any(p["peer_gbs"] is not None for p in probe["pairs"])]
        probe, part = (measured or probes)[-1]
        evidence["probe"], used["probe"] = probe, [part]
    # the most GPUs any paste shows (one lspci excerpt may show one card of two)
    counts = [facts["gpus"], len(evidence["probe"]["devices"]) if "probe" in evidence else None,
              _ranks_of(by_kind.get("nccl-log") or [])]
    counts += [gpu_count_of_topo(p) for p in by_kind.get("nvidia-smi-topo") or []]
    facts["gpus"] = max([c for c in counts if c] or [None]) if any(counts) else None
    if by_kind.get("nvidia-smi-topo") or by_kind.get("nvidia-smi-q"):
        facts["vendor"] = facts["vendor"] or "nvidia"
    logs = by_kind.get("nccl-log") or []
    read = [(p, parse_nccl.parse_log("\n".join(p["lines"]))) for p in logs]
    tests = by_kind.get("nccl-tests") or []
    trailers = [p for p, parsed in read if any(f["by"] == "test" for f in parsed["failures"])]
    collectives = collectives_of(tests, [p for p in logs if p in trailers or any(
        p["first"] <= t["last"] and t["first"] <= p["last"] for t in tests)])
    if collectives:
        evidence["collectives"], used["collectives"] = collectives, list(tests) + trailers
    if logs:
        with_channels = [p for p, parsed in read if parsed["channels"]]
        part = (with_channels or logs)[-1]
        evidence["nccl_transport"], used["nccl_transport"] = transport_of(part), [part]
        failed = [p for p, parsed in read if any(f.get("code") for f in parsed["failures"])]
        failures = [f for _, parsed in read for f in parsed["failures"] if f.get("code")]
        if failures and "probe" in evidence:
            evidence["probe"]["failures"] = failures[:parse_nccl.MAX_FAILURES]
            used["probe"].extend(failed)
        elif failures:
            evidence["probe"] = {"available": True, "api": "cuda", "devices": [], "pairs": [], "bidir": [],
                                 "errors": [], "source": "pasted NCCL log (its failure lines)",
                                 "failures": failures[:parse_nccl.MAX_FAILURES]}
            used["probe_failures"] = failed
    if by_kind.get("kernel-log"):
        evidence["kernel_log"], used["kernel_log"] = kernel_log_of(by_kind["kernel-log"]), list(by_kind["kernel-log"])
    return evidence, facts, used
