# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judges of the two runtime layers, peer_access and p2p_bandwidth: (probe, ladder_view) -> verdict.

probe is the dict of cuda_probe.probe() / hip_probe.probe() (live, or read from a recording);
ladder_view is {"gpu": rigbook_gpu, "p2p": rigbook_p2p, "pins": ...}. No I/O here. A probe that
could not run is "unknown" (a hung one fails where P2P is expected); data that came back wrong
fails whatever the host variables say.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import baseline_compare as baseline_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import expectations
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import Findings, make
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import code_entry as _code

# Usable GB/s per lane after line coding (Gen1/2 8b/10b, Gen3-5 128b/130b, Gen6 FLIT 242/256).
GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8,
                6: 64 * 242 / 256 / 8}
# Thresholds as data (the tolerance option overrides any of them):
#   over_staged: a peer copy must beat the unpipelined host-staged copy by this factor to count as P2P;
#   link_warn_below: warn when a peer copy reaches less than this share of the link's limit;
#   link_fail_below: fail below this share: seed 004 stops there ("if TransferBench Push / DMA gives only 2-3 GB/s,
#     do not go on tuning RCCL above it"; 2-3 GB/s is 13-19% of its Gen3 x16 link's 15.75 GB/s, its healthy 10.29 GB/s
#     is 65%), and a Gen3 x16 peer copy below 3.94 GB/s is below even seed 000's host-staged 6.0 GB/s;
#   bidir_warn_below: warn when both directions at once give less than this times one direction.
RUNTIME_TOLERANCE = {"over_staged": 1.1, "link_warn_below": 0.5, "link_fail_below": 0.25, "bidir_warn_below": 1.3}
METRIC_PREFIXES = ("peer_gbs_", "host_staged_gbs_", "bidir_gbs_", "h2d_gbs_", "d2h_gbs_")
ENABLE_OK = ("ok", "already enabled")

BAR_REMEDY = (
    "The peer's memory window (BAR1) is too small to map: turn on Above 4G Decoding and Resizable BAR and "
    "boot UEFI (see the firmware layer). If the BIOS has no such options (the X99 TF board: BAR1 256 MiB), "
    "P2P is impossible on this board: set rigbook_p2p.expected false with the reason, and rigbook holds the "
    "host-staged path to its baseline instead."
)
REMEDIES = {
    "CUDA_ERROR_MAP_FAILED": BAR_REMEDY,
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": (
        "The driver refuses P2P for this pair: the stock GeForce driver blocks it (install the pinned P2P "
        "fork; see driver_state), or the topology does not allow it (nvidia-smi topo -p2p r)."
    ),
    "CUDA_ERROR_TOO_MANY_PEERS": "The GPU ran out of peer mappings: fewer GPUs per peer group.",
    "hipErrorPeerAccessUnsupported": (
        "amdgpu refused peer access: it needs CONFIG_HSA_AMD_P2P, large BARs, each peer BAR within the "
        "other GPU's DMA reach and a P2PDMA-allowed path between the root ports (firmware, dma_window, "
        "kernel_state and the KFD p2p links in driver_state)."
    ),
    "hipErrorMapFailed": BAR_REMEDY,
}
CAN_ACCESS_REMEDY = {
    "cuda": (
        "The driver reports no peer access: on GeForce cards install the pinned P2P driver fork (driver_state), "
        "check nvidia-smi topo -p2p r, and the firmware layer (large BAR)."
    ),
    "hip": (
        "HIP reports no peer access (no KFD P2P link): check kernel_state (P2PDMA, allowed host bridge) and "
        "dma_window (peer BAR within the 44-bit DMA reach)."
    ),
}
IPC_REMEDY = (
    "A HIP IPC handle could not be opened (or read back right) on the peer GPU: set HSA_ENABLE_IPC_MODE_LEGACY "
    "explicitly for this ROCm and kernel (0 = DMA-BUF IPC, needed on kernels without the legacy KFD IPC "
    "ioctls; the R9700 box runs 0) in rigbook_pins.rocm.hsa_env and the serving environment."
)
CORRUPTION_REMEDY = (
    "Data copied between the GPUs came back wrong: that is corruption, not slowness. Keep P2P off "
    "(NCCL_P2P_DISABLE=1) and do not serve from this box until the copy verifies; check dmesg for AER/IOMMU "
    "errors, the PCIe link, and whether this platform corrupts peer writes through its root complex."
)
NO_P2P_REMEDY = (
    "The copies go through host memory, not peer to peer: fix peer_access first (and the layers below it: "
    "firmware BAR/ReBAR, driver fork, P2PDMA), or declare P2P unavailable with rigbook_p2p.expected false."
)
LINK_REMEDY = (
    "Peer copies run far below the PCIe link: check pcie_link (trained width/speed), MaxPayload/ReadRequest, "
    "and for AMD that the copy engine (SDMA) path is used; compare with TransferBench / p2pBandwidthLatencyTest."
)


# The failure codes of the two layers' findings (ladder/codes.py gathers them; docs/codes.md is generated from them).
CODES = {
    "RB-P2P-ACCESS-PROBE-HUNG": _code(
        "peer_access", "the GPU probe hung on a box that expects P2P",
        "The peer probe did not finish within its deadline and was killed: peer copies that never finish are a broken "
        "P2P path (a mapping the IOMMU or the root complex drops).",
        "The probe (cuda_probe / hip_probe) run with a deadline; its timed_out flag.",
        "Check dmesg for Xid/AER/IOMMU faults during the probe, then the layers below (firmware, dma_window, "
        "kernel_state, driver_state)."),
    "RB-P2P-ACCESS-GPU-MISSING": _code(
        "peer_access", "the driver sees fewer GPUs than rigbook_gpu.count",
        "A GPU the inventory declares is not visible to the driver (fallen off the bus, not bound, not powered).",
        "The probe's device list against rigbook_gpu.count.",
        "Check gpu_inventory and driver_state (dmesg, nvidia-smi / rocm-smi)."),
    "RB-P2P-MAP-FAILED": _code(
        "peer_access", "enabling peer access failed: the peer's memory could not be mapped",
        "CUDA_ERROR_MAP_FAILED / hipErrorMapFailed ('mapping of buffer object failed'): the peer's memory window "
        "(BAR1) is too small to map, typically a board without Above 4G Decoding / Resizable BAR (seed 000: BAR1 "
        "256 MiB).",
        "The probe's cuCtxEnablePeerAccess / hipDeviceEnablePeerAccess result per ordered pair, or a program's own "
        "failure line (an NCCL log's 'Cuda failure 205').",
        BAR_REMEDY),
    "RB-P2P-ENABLE-UNSUPPORTED": _code(
        "peer_access", "the driver refuses peer access for the pair",
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED / hipErrorPeerAccessUnsupported: the stock GeForce driver blocks P2P, "
        "the topology does not allow it, or amdgpu lacks what P2P needs (CONFIG_HSA_AMD_P2P, large BARs, P2PDMA).",
        "The probe's enable-peer-access result per ordered pair, or a program's own failure line.",
        "NVIDIA: install the pinned P2P driver fork (driver_state), check nvidia-smi topo -p2p r. AMD: check "
        "kernel_state (P2PDMA, the allowed host bridge), dma_window and the KFD p2p links in driver_state."),
    "RB-P2P-TOO-MANY-PEERS": _code(
        "peer_access", "the GPU ran out of peer mappings",
        "CUDA_ERROR_TOO_MANY_PEERS: a GPU can map only so many peers.",
        "The probe's enable-peer-access result per ordered pair, or a program's own failure line.",
        "Use fewer GPUs per peer group."),
    "RB-P2P-ENABLE-FAILED": _code(
        "peer_access", "enabling peer access failed with another driver error",
        "Enabling peer access returned an error other than a mapping failure, a refusal or too many peers.",
        "The probe's enable-peer-access result per ordered pair; the verdict names the error.",
        "Look the error up in the driver's API reference; check driver_state and the firmware layer (large BAR)."),
    "RB-P2P-PEER-ACCESS-DENIED": _code(
        "peer_access", "the driver reports no peer access for the pair",
        "cuDeviceCanAccessPeer / hipDeviceCanAccessPeer says no: the stock GeForce driver, a topology without P2P, "
        "or (AMD) no KFD P2P link.",
        "The probe's can-access-peer answer per ordered pair.",
        "NVIDIA: install the pinned P2P driver fork (driver_state), check nvidia-smi topo -p2p r and the firmware "
        "layer (large BAR). AMD: check kernel_state (P2PDMA, the allowed host bridge) and dma_window."),
    "RB-P2P-CORRUPTION": _code(
        "peer_access", "data copied peer to peer came back wrong",
        "A pattern copied from one GPU to the other read back different: corruption on the peer path, not slowness "
        "(a platform whose root complex corrupts peer writes, a link with errors).",
        "The probe writes a pattern, copies it peer to peer and verifies it on the other GPU.",
        CORRUPTION_REMEDY),
    "RB-P2P-STAGED-CORRUPTION": _code(
        "peer_access", "data copied through host memory came back wrong",
        "A pattern copied from one GPU to the other through host memory read back different: corruption on the "
        "GPU's own link or memory, whatever the peer path.",
        "The probe copies a pattern GPU -> host -> GPU and verifies it.",
        CORRUPTION_REMEDY),
    "RB-P2P-IPC-FAILED": _code(
        "peer_access", "a HIP IPC handle could not be opened or read back on the peer GPU",
        "The IPC mode HIP uses (legacy KFD IPC or DMA-BUF) does not work with this ROCm and kernel: the engines' "
        "multi-process peer sharing fails.",
        "The probe exports a buffer through hipIpcGetMemHandle, opens it on the peer GPU and verifies it.",
        IPC_REMEDY),
    "RB-P2P-WORKS-DECLARED-UNAVAILABLE": _code(
        "peer_access", "peer access works on every pair although P2P is declared unavailable",
        "rigbook_p2p.expected is false, yet every pair enables peer access and verifies: the box changed (a BIOS "
        "update, a driver fork) or the declaration is stale.",
        "The probe's can-access, enable and pattern results on every ordered pair.",
        "If P2P is now possible on this box, set rigbook_p2p.expected true so rigbook holds it to its baseline; "
        "otherwise find out what changed."),
    "RB-P2P-BANDWIDTH-PROBE-HUNG": _code(
        "p2p_bandwidth", "the GPU probe hung on a box that expects P2P",
        "The peer probe did not finish within its deadline and was killed: peer copies that never finish are a broken "
        "P2P path.",
        "The probe (cuda_probe / hip_probe) run with a deadline; its timed_out flag.",
        "Check dmesg for Xid/AER/IOMMU faults during the probe, then the layers below (firmware, dma_window, "
        "kernel_state, driver_state)."),
    "RB-P2P-BANDWIDTH-GPU-MISSING": _code(
        "p2p_bandwidth", "the driver sees fewer GPUs than rigbook_gpu.count",
        "A GPU the inventory declares is not visible to the driver.",
        "The probe's device list against rigbook_gpu.count.",
        "Check gpu_inventory and driver_state (dmesg, nvidia-smi / rocm-smi)."),
    "RB-P2P-NOT-PEER-COPY": _code(
        "p2p_bandwidth", "the peer copy is not a P2P copy: peer access could not be enabled",
        "Peer access failed to enable for the pair, so the timed 'peer' copy went through host memory (seed 000: "
        "6.0 GB/s with CUDA_ERROR_MAP_FAILED).",
        "The probe's enable-peer-access result beside its timed peer copy per ordered pair.",
        NO_P2P_REMEDY),
    "RB-P2P-NO-REAL-P2P": _code(
        "p2p_bandwidth", "the peer copy is no faster than the host-staged copy",
        "Peer access said ok, but the peer copy runs no faster than a copy staged through host memory: the data goes "
        "through the host, not peer to peer.",
        "The probe times a peer copy and an unpipelined host-staged copy per ordered pair; the peer copy must beat it "
        "by the tolerance's over_staged factor (1.1x).",
        NO_P2P_REMEDY),
    "RB-P2P-BELOW-LINK": _code(
        "p2p_bandwidth", "the peer copy is far below the PCIe link: the path is broken, not slow",
        "The peer copy reaches less than the tolerance's link_fail_below share (25%) of the trained link's limit "
        "(seed 004: with TransferBench Push / DMA at only 2-3 GB/s on Gen3 x16, do not go on to tune the "
        "collectives).",
        "The probe's timed peer copy against the PCIe limit of rigbook_gpu.pcie (generation and width).",
        LINK_REMEDY),
    "RB-P2P-LINK-SHARE-LOW": _code(
        "p2p_bandwidth", "the peer copy reaches a low share of the PCIe link",
        "The peer copy is below the tolerance's link_warn_below share (50%) of the link's limit: slow, not broken "
        "(a link trained lower, small MaxPayload/ReadRequest, the copy not on the copy engine).",
        "The probe's timed peer copy against the PCIe limit of rigbook_gpu.pcie.",
        LINK_REMEDY),
    "RB-P2P-BIDIR-HALF-DUPLEX": _code(
        "p2p_bandwidth", "both directions at once give barely more than one direction",
        "The two directions share one bottleneck (a switch or root port that does not run both ways at full rate).",
        "The probe times both directions at once against the faster single direction; below the tolerance's "
        "bidir_warn_below (1.3x) warns.",
        LINK_REMEDY),
    "RB-P2P-BANDWIDTH-BASELINE": _code(
        "p2p_bandwidth", "a copy figure fell below the baseline's fail line",
        "A peer, host-staged, both-ways or host copy runs below the tolerance's fail_below share (0.8x) of this "
        "host's recorded known-good figure (measured again once before it fails: ladder/repeat.py).",
        "The probe's figures against the host's baseline (provision baseline record).",
        "After a kernel/driver/BIOS change check the layers below (pcie_link training, peer_access), and re-record "
        "the baseline only once the new figure is understood."),
    "RB-P2P-BANDWIDTH-BASELINE-DIP": _code(
        "p2p_bandwidth", "a copy figure is slightly below the baseline",
        "A copy figure runs between the tolerance's fail_below (0.8x) and warn_below (0.95x) shares of this host's "
        "recorded figure.",
        "The probe's figures against the host's baseline.",
        "Watch the trend; after a kernel/driver/BIOS change check pcie_link and peer_access."),
}
# The code of a peer-access error, as enabling returns it or a program's failure line names it.
ENABLE_CODES = {
    "CUDA_ERROR_MAP_FAILED": "RB-P2P-MAP-FAILED",
    "hipErrorMapFailed": "RB-P2P-MAP-FAILED",
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": "RB-P2P-ENABLE-UNSUPPORTED",
    "hipErrorPeerAccessUnsupported": "RB-P2P-ENABLE-UNSUPPORTED",
    "CUDA_ERROR_TOO_MANY_PEERS": "RB-P2P-TOO-MANY-PEERS",
}
HUNG_CODES = {"peer_access": "RB-P2P-ACCESS-PROBE-HUNG", "p2p_bandwidth": "RB-P2P-BANDWIDTH-PROBE-HUNG"}
MISSING_CODES = {"peer_access": "RB-P2P-ACCESS-GPU-MISSING", "p2p_bandwidth": "RB-P2P-BANDWIDTH-GPU-MISSING"}


def link_gbs(gen, width):
    """Theoretical one-way GB/s of a PCIe link (Gen3 x16 -> 15.75); None when unknown."""
    if not gen or not width or gen not in GBS_PER_LANE:
        return None
    return round(GBS_PER_LANE[gen] * width, 2)


def p2p_expected(probe, ladder_view):
    """The one rule (judges/expectations.py), counting the devices the probe saw when it ran."""
    probe = probe or {}
    seen = len(probe["devices"]) if probe.get("available") and probe.get("devices") is not None else None
    return expectations.p2p_expected(ladder_view, seen)


def runtime_metrics(probe):
    """Flat {name: GB/s} of a probe: peer_gbs_i_j, host_staged_gbs_i_j, bidir_gbs_a_b, h2d_gbs_i, d2h_gbs_i."""
    metrics = {}
    for dev in probe.get("devices") or []:
        for key in ("h2d_gbs", "d2h_gbs"):
            metrics["%s_%d" % (key, dev["index"])] = _round(dev.get(key))
    for pair in probe.get("pairs") or []:
        if pair["src"] == pair["dst"]:
            continue
        for key in ("peer_gbs", "host_staged_gbs"):
            metrics["%s_%d_%d" % (key, pair["src"], pair["dst"])] = _round(pair.get(key))
    for entry in probe.get("bidir") or []:
        if entry["a"] != entry["b"]:
            metrics["bidir_gbs_%d_%d" % (entry["a"], entry["b"])] = _round(entry.get("gbs"))
    return metrics


def _round(value):
    return round(float(value), 2) if value is not None else None


def _gbs(value):
    return "%.2f GB/s" % value if value is not None else "not measured"


def _why_missing(entry):
    errors = [e for e in entry.get("errors") or [] if e]
    return "; ".join(errors) if errors else "no figure"


def _unavailable(layer, probe, ladder_view, expected):
    """The verdict when the probe did not run, else None."""
    if probe.get("available"):
        return None
    error = probe.get("error") or "no probe result"
    if probe.get("timed_out") and p2p_expected(probe, ladder_view):
        return make(
            layer, "fail", measured={"probe": error}, expected=expected,
            why="the GPU probe hung: %s (peer copies that never finish are a broken P2P path)" % error,
            remedy="Check dmesg for Xid/AER/IOMMU faults during the probe, then the layers below (firmware, "
                   "dma_window, kernel_state, driver_state).",
            code=HUNG_CODES[layer],
        )
    return make(
        layer, "unknown", measured={"probe": error}, expected=expected,
        why="the GPU probe could not run: %s" % error,
        remedy="The driver's library (libcuda.so.1 / libamdhip64.so) must load and see the GPUs: see driver_state.",
    )


def _too_few(layer, probe, ladder_view, metrics=None):
    """skip for a one-GPU box, fail when rigbook_gpu.count is more GPUs than the driver sees; None for >= 2."""
    devices = probe.get("devices") or []
    want = (ladder_view.get("gpu") or {}).get("count")
    if len(devices) >= 2:
        return None
    first = devices[0] if devices else {}
    measured = {"gpus": len(devices), "gpu0": "%s at %s" % (first.get("name"), first.get("pci_bus_id"))}
    if want and want > len(devices):
        return make(
            layer, "fail", measured=measured, expected={"gpus": want},
            why="the driver sees %d GPU(s), rigbook_gpu.count is %d" % (len(devices), want),
            remedy="A GPU is missing: check gpu_inventory and driver_state (dmesg, nvidia-smi / rocm-smi).",
            metrics=metrics, code=MISSING_CODES[layer],
        )
    return None


def _describe_access(pair):
    checked = {True: "verified", False: "WRONG", None: "not checked"}
    parts = [
        "can-access %s" % {True: "yes", False: "no", None: "?"}[pair.get("can_access_peer")],
        "enable %s" % (pair.get("enable_peer") or "?"),
        "peer-copy pattern %s" % checked[pair.get("pattern_ok")],
        "host-staged pattern %s" % checked[pair.get("staged_pattern_ok")],
    ]
    if "ipc" in pair:
        ipc = pair["ipc"] or {}
        state = {True: "ok", False: "FAILED", None: "not checked"}[ipc.get("ok")]
        parts.append("IPC (%s) %s" % (ipc.get("mode"), state))
    return "; ".join(parts)


def _ordered(n):
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def _pairs(probe):
    return {(p["src"], p["dst"]): p for p in probe.get("pairs") or []}


def _probed_pairs(probe, pairs, count, found):
    """(label, pair) of every ordered GPU pair in PAIRS (the probe's, by (src, dst)); the probe's errors and the
    pairs it did not reach are gaps of FOUND."""
    for error in probe.get("errors") or []:
        found.gap("probe: %s" % error)
    for i, j in _ordered(count):
        label = "GPU%d->GPU%d" % (i, j)
        if (i, j) in pairs:
            yield label, pairs[(i, j)]
        else:
            found.gap("%s: not probed" % label)


def _failed_lines(probe):
    """[(text, remedy, code)] of the peer-access errors a program's own failure lines name (PROBE's `failures`: a
    pasted NCCL log's "Cuda failure 205 'mapping of buffer object failed'", parse/nccl.failure_of): a failed run is
    evidence."""
    out = []
    for failure in probe.get("failures") or []:
        if failure.get("code") in REMEDIES:
            out.append(("a program's own failure line says %s (%s): peer memory could not be mapped or accessed"
                        % (failure["code"], failure.get("text")), REMEDIES[failure["code"]],
                        ENABLE_CODES[failure["code"]]))
    return out


def judge_peer_access(probe, ladder_view):
    """Peer access both ways on every pair: can-access, enabling it, and a verified pattern copy (+ IPC on AMD)."""
    layer = "peer_access"
    probe, ladder_view = probe or {}, ladder_view or {}
    expected_p2p = p2p_expected(probe, ladder_view)
    if expected_p2p:
        expected = {"every ordered pair": "can-access yes; enable ok; pattern verified" + (
            "; IPC ok" if probe.get("api") == "hip" else "")}
    else:
        expected = {"every ordered pair": "pattern verified (peer access itself not required: %s)"
                                          % expectations.declared(ladder_view)}
    failed = _failed_lines(probe)
    if failed and not probe.get("pairs"):
        found = Findings()
        for text, remedy, code in failed:
            found.problem(text, remedy, code=code)
        return found.verdict(layer, {"failure lines": [text for text, _, _ in failed]}, expected)
    verdict = _unavailable(layer, probe, ladder_view, expected) or _too_few(layer, probe, ladder_view)
    if verdict:
        return verdict
    devices = probe["devices"]
    if len(devices) < 2:
        return make(layer, "skip", measured={"gpus": len(devices), "gpu0": devices[0].get("name") if devices else None},
                    expected=None, why="one GPU: no peer to access")
    api = probe.get("api") or "cuda"
    pairs = _pairs(probe)
    found = Findings()
    measured = {}
    for text, remedy, code in failed:
        found.problem(text, remedy, code=code)
    for label, pair in _probed_pairs(probe, pairs, len(devices), found):
        measured[label] = _describe_access(pair)
        for key, what, code in (("pattern_ok", "peer copy", "RB-P2P-CORRUPTION"),
                                ("staged_pattern_ok", "host-staged copy", "RB-P2P-STAGED-CORRUPTION")):
            if pair.get(key) is False:
                found.problem("%s: the %s came back wrong (%s)" % (label, what, _why_missing(pair)), CORRUPTION_REMEDY,
                              code=code)
            elif pair.get(key) is None:
                found.gap("%s: %s not verified (%s)" % (label, what, _why_missing(pair)))
        if not expected_p2p:
            continue
        if pair.get("can_access_peer") is False:
            found.problem("%s: the driver reports no peer access" % label, CAN_ACCESS_REMEDY.get(api),
                          code="RB-P2P-PEER-ACCESS-DENIED")
        elif pair.get("can_access_peer") is None:
            found.gap("%s: can-access-peer not read (%s)" % (label, _why_missing(pair)))
        enable = pair.get("enable_peer")
        if enable is None:
            found.gap("%s: enabling peer access not tried (%s)" % (label, _why_missing(pair)))
        elif enable not in ENABLE_OK:
            text = "%s: enabling peer access failed with %s" % (label, enable)
            if enable in ("CUDA_ERROR_MAP_FAILED", "hipErrorMapFailed"):
                text += " (mapping of buffer object failed)"
            found.problem(text, REMEDIES.get(enable, CAN_ACCESS_REMEDY.get(api)),
                          code=ENABLE_CODES.get(enable, "RB-P2P-ENABLE-FAILED"))
        if "ipc" in pair:
            ipc = pair.get("ipc") or {}
            if ipc.get("ok") is False:
                found.problem("%s: HIP IPC (%s) failed: %s" % (label, ipc.get("mode"), ipc.get("error")), IPC_REMEDY,
                              code="RB-P2P-IPC-FAILED")
            elif ipc.get("ok") is None:
                found.gap("%s: HIP IPC not checked (%s)" % (label, ipc.get("error")))
    if expected_p2p:
        return found.verdict(layer, measured, expected,
                             ok_text="peer access enabled and a pattern verified both ways on every pair")
    works = pairs and all(
        p.get("can_access_peer") and p.get("enable_peer") in ENABLE_OK and (p.get("ipc") or {"ok": True}).get("ok")
        for p in pairs.values() if p["src"] != p["dst"]
    )
    if works and not found.problems and not found.gaps:
        found.note(
            "peer access works on every pair although %s" % expectations.declared(ladder_view),
            "If P2P is now possible on this box, set rigbook_p2p.expected true so rigbook holds it to its "
            "baseline; otherwise find out what changed.", code="RB-P2P-WORKS-DECLARED-UNAVAILABLE",
        )
    errors = sorted({str(p.get("enable_peer")) for p in pairs.values() if p.get("enable_peer") not in ENABLE_OK})
    ok_text = "%s; copies between the GPUs verify through host memory" % expectations.declared(ladder_view)
    if errors:
        ok_text += "; enabling peer access gives %s, as expected" % ", ".join(errors)
    return found.verdict(layer, measured, expected, ok_text=ok_text)


def judge_p2p_bandwidth(probe, ladder_view, baseline_metrics=None, tolerance=None):
    """Peer copy GB/s each way and both ways at once vs the host-staged copy, the link limit and the baseline."""
    layer = "p2p_bandwidth"
    probe, ladder_view = probe or {}, ladder_view or {}
    baseline_metrics = baseline_metrics or {}
    tol = expectations.tolerance(ladder_view, tolerance, defaults=RUNTIME_TOLERANCE)
    expected_p2p = p2p_expected(probe, ladder_view)
    pcie = (ladder_view.get("gpu") or {}).get("pcie") or {}
    limit = link_gbs(pcie.get("gen"), pcie.get("width"))
    link_name = "Gen%s x%s" % (pcie.get("gen"), pcie.get("width"))
    expected = {}
    if expected_p2p:
        expected["peer"] = "> %.1fx the host-staged copy" % tol["over_staged"]
        if limit:
            expected["peer"] += ", >= %d%% of the %s limit %.2f GB/s (fails below %d%%)" % (
                100 * tol["link_warn_below"], link_name, limit, 100 * tol["link_fail_below"])
    else:
        expected["path"] = "host-staged (%s)" % expectations.declared(ladder_view)
    verdict = _unavailable(layer, probe, ladder_view, expected)
    if verdict:
        return verdict
    metrics = runtime_metrics(probe)
    held = {k: v for k, v in baseline_metrics.items() if k.startswith(METRIC_PREFIXES)}
    if held:
        expected["baseline"] = ">= %.2fx of the recorded figures" % tol["fail_below"]
    verdict = _too_few(layer, probe, ladder_view, metrics)
    if verdict:
        return verdict
    devices = probe["devices"]
    found = Findings()
    measured = {}
    if len(devices) < 2:
        for dev in devices:
            measured["GPU%d host copies" % dev["index"]] = "H2D %s, D2H %s" % (_gbs(dev.get("h2d_gbs")),
                                                                               _gbs(dev.get("d2h_gbs")))
        texts = _baseline_findings(found, metrics, held, tol)
        if found.problems or found.notes or found.gaps:
            out = found.verdict(layer, measured, expected)
        else:
            why = "one GPU: no peer pair; host copies %s" % ", ".join(measured.values())
            out = make(layer, "skip", measured, expected, "; ".join([why] + texts))
        out["metrics"] = metrics
        return out
    pairs = _pairs(probe)
    for label, pair in _probed_pairs(probe, pairs, len(devices), found):
        peer, staged = pair.get("peer_gbs"), pair.get("host_staged_gbs")
        text = "peer %s, host-staged %s" % (_gbs(peer), _gbs(staged))
        if peer is not None and staged:
            text += " (%.2fx)" % (peer / staged)
        if peer is not None and limit:
            text += ", %d%% of %s" % (round(100 * peer / limit), link_name)
        measured[label] = text
        if peer is None:
            found.gap("%s: peer copy not timed (%s)" % (label, _why_missing(pair)))
            continue
        if not expected_p2p:
            continue
        enable = pair.get("enable_peer")
        if enable is not None and enable not in ENABLE_OK:
            found.problem("%s: %.2f GB/s is not a P2P copy: peer access could not be enabled (%s)"
                          % (label, peer, enable), NO_P2P_REMEDY, code="RB-P2P-NOT-PEER-COPY")
        elif staged is None:
            found.gap("%s: no host-staged reference (%s)" % (label, _why_missing(pair)))
        elif peer <= staged * tol["over_staged"]:
            found.problem("%s: the peer copy (%.2f GB/s) is no faster than the host-staged copy (%.2f GB/s): "
                          "no real P2P" % (label, peer, staged), NO_P2P_REMEDY, code="RB-P2P-NO-REAL-P2P")
        if limit and peer < limit * tol["link_fail_below"]:
            found.problem("%s: %.2f GB/s is %d%% of the %s limit (%.2f GB/s), below %d%%: the peer path is broken, not "
                          "slow (seed 004: with TransferBench Push / DMA at only 2-3 GB/s, do not go on to tune the "
                          "collectives)" % (label, peer, round(100 * peer / limit), link_name, limit,
                                            round(100 * tol["link_fail_below"])), LINK_REMEDY,
                          code="RB-P2P-BELOW-LINK")
        elif limit and peer < limit * tol["link_warn_below"]:
            found.note("%s: %.2f GB/s is %d%% of the %s limit (%.2f GB/s)"
                       % (label, peer, round(100 * peer / limit), link_name, limit), LINK_REMEDY,
                       code="RB-P2P-LINK-SHARE-LOW")
        elif limit and peer > limit * 1.05:
            measured[label] += ", above the PCIe limit (NVLink or another fabric)"
    for entry in probe.get("bidir") or []:
        a, b = entry["a"], entry["b"]
        if a == b:
            continue
        label = "GPU%d<->GPU%d" % (a, b)
        both = entry.get("gbs")
        measured[label] = "%s both ways at once" % _gbs(both)
        if both is None:
            if expected_p2p:
                found.gap("%s: not timed (%s)" % (label, _why_missing(entry)))
            continue
        one_way = [pairs.get(k, {}).get("peer_gbs") for k in ((a, b), (b, a))]
        one_way = [v for v in one_way if v is not None]
        if expected_p2p and one_way and both < tol["bidir_warn_below"] * max(one_way):
            found.note("%s: both ways at once give %.2f GB/s, barely more than one way (%.2f GB/s): the directions "
                       "share one bottleneck" % (label, both, max(one_way)), LINK_REMEDY,
                       code="RB-P2P-BIDIR-HALF-DUPLEX")
    texts = _baseline_findings(found, metrics, held, tol)
    if expected_p2p:
        ok_text = "real P2P on every pair: faster than the host-staged copy"
        if limit:
            ok_text += " and within reach of the %s link" % link_name
    else:
        ok_text = "%s: host-staged copies measured" % expectations.declared(ladder_view)
    if not held:
        ok_text += "; no baseline recorded yet (record one with `provision baseline record`)"
    else:
        ok_text += "; " + "; ".join(texts)
    out = found.verdict(layer, measured, expected, ok_text=ok_text)
    out["metrics"] = metrics
    return out


def _baseline_findings(found, metrics, held, tol):
    """Each recorded figure against its baseline: fail -> problem, warn -> note, unmeasured -> gap; the texts."""
    remedy = ("The copies are slower than this host's known-good run: after a kernel/driver/BIOS change check the "
              "layers below (pcie_link training, peer_access), and re-record the baseline only once the new figure "
              "is understood.")
    texts = []
    for name in sorted(held):
        status, text = baseline_mod.compare(name, metrics.get(name), held[name], tol)
        texts.append(text)
        if status == "fail":
            found.problem("fell against the baseline: %s" % text, remedy, code="RB-P2P-BANDWIDTH-BASELINE")
        elif status == "warn":
            found.note("against the baseline: %s" % text, remedy, code="RB-P2P-BANDWIDTH-BASELINE-DIP")
        elif status == "unknown":
            found.gap(text)
    return texts
