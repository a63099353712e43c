# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure judges of the collectives and nccl_transport layers."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import baseline_compare as baseline_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import expectations
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import code_entry as _code
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import generic_code, make, rank, worse

# The ops every collectives run has (nccl-tests/rccl-tests sendrecv_perf, all_reduce_perf; the bundled benchmark), and
# the ones a run of rccl-tests/nccl-tests adds when the programs are there (all_gather_perf, reduce_scatter_perf; seed
# 004: AllGather busbw 9.16, ReduceScatter busbw 8.92 GB/s). Each op's busbw is a metric held to the baseline.
REQUIRED_OPS = ("sendrecv", "all_reduce")
EXTRA_OPS = ("all_gather", "reduce_scatter")
OPS = REQUIRED_OPS + EXTRA_OPS
AB_MIN_GAIN = 1.1  # P2P allowed vs NCCL_P2P_DISABLE=1: below this on a box that expects P2P, P2P was not used


def shm_remedy(level, want, env_file=None):
    """What to do when RCCL/NCCL chose SHM although P2P is expected, from the P2P level the run's log shows (LEVEL)
    and the one rigbook_p2p.nccl_p2p_level pins (WANT): a missing level is the GPU environment file's (amd_rocm
    role), a level that was set and ignored is an unpatched RCCL (rccl role)."""
    where = env_file or "the serving environment"
    if want and not level:
        return ("NCCL_P2P_LEVEL was not set for the run (%s lacks it; rigbook_p2p pins %s): re-run the amd_rocm role, "
                "which writes NCCL_P2P_LEVEL from rigbook_p2p.nccl_p2p_level into the GPU environment file; then "
                "check the lower layers (peer_access, kernel_state after an upgrade)." % (where, want))
    if level:
        return ("NCCL_P2P_LEVEL=%s was set and the library still chose SHM: the installed RCCL lacks the P2P-level "
                "patch (RCCL 2.27.7 lets the Intel default override the user's level): re-run the rccl role, which "
                "builds (or switches back to) the patched prefix; then check the lower layers (peer_access, "
                "kernel_state after an upgrade)." % level)
    return ("Check the lower layers first (peer_access, kernel_state after an upgrade); set NCCL_P2P_LEVEL=%s in the "
            "GPU environment file (amd_rocm role); for RCCL 2.27.7 on Intel hosts the P2P-level patch is needed as "
            "well (rccl role)." % (want or "PHB"))


def peer_copy_gbs(probe):
    """(slowest peer copy GB/s between two GPUs, "GPUi->GPUj") the p2p_bandwidth layer measured (PROBE: the probe
    evidence), or (None, why not)."""
    probe = probe or {}
    if not probe.get("available"):
        return None, "no peer copy measured (%s)" % (probe.get("error") or "the probe did not run")
    copies = [(p["peer_gbs"], "GPU%d->GPU%d" % (p["src"], p["dst"])) for p in probe.get("pairs") or []
              if p.get("src") != p.get("dst") and p.get("peer_gbs")]
    if not copies:
        return None, "the probe timed no peer copy"
    return min(copies)


def _sendrecv_of_peer(rows, probe, tol):
    """(status, text) of sendrecv busbw against the box's own peer copy: fail / warn below the tolerance's
    sendrecv_of_peer_* shares, None status when not compared (TEXT says why)."""
    sendrecv = (rows.get("sendrecv") or {}).get("busbw_gbs")
    peer, where = peer_copy_gbs(probe)
    if sendrecv is None or peer is None:
        return None, "sendrecv vs peer copy not compared: %s" % (where if peer is None else "no sendrecv busbw")
    ratio = float(sendrecv) / float(peer)
    text = "sendrecv busbw %.2f GB/s is %.2fx the peer copy %s %.2f GB/s" % (sendrecv, ratio, where, peer)
    if ratio < tol["sendrecv_of_peer_fail_below"]:
        return "fail", "%s, below %.2fx: the library does not get the path the GPUs have (seed 004: stock RCCL fell " \
                       "back to SHM, SendRecv 6.90 vs 10.29 GB/s = 0.67)" % (text, tol["sendrecv_of_peer_fail_below"])
    if ratio < tol["sendrecv_of_peer_warn_below"]:
        return "warn", "%s, below %.2fx (seed 004: 9.75 vs 10.29 GB/s = 0.95 on a healthy box)" % (
            text, tol["sendrecv_of_peer_warn_below"])
    return "pass", text


DIRECT_P2P_REMEDY = {
    "amd": None,  # shm_remedy: the GPU environment file's NCCL_P2P_LEVEL, then RCCL's P2P-level patch
    "nvidia": ("NCCL found no direct P2P path between the GPUs within NCCL_P2P_LEVEL: check the layers below "
               "(peer_access: the P2P driver fork loaded, a large BAR1; driver_state), then NCCL_P2P_LEVEL in the GPU "
               "environment file (newer NCCL on a box whose GPUs sit under different host bridges picks P2P only "
               "with NCCL_P2P_LEVEL=SYS)."),
}


def _direct_p2p(data, ladder_view, measured, expected):
    """(why, remedy) when the collectives run's own NCCL/RCCL log says isAllDirectP2p 0 on a box whose P2P is
    expected (seed 004: "the final log confirms isAllDirectP2p 1 via P2P/IPC", not SHM); None otherwise. Where P2P is
    declared unavailable isAllDirectP2p 0 is the path the box is held to (seed 000: SHM)."""
    log = data.get("log") or {}
    direct = log.get("all_direct_p2p")
    if direct is None:
        return None
    measured["isAllDirectP2p"] = "%d in the run's own log (%s)" % (direct, log.get("path"))
    if not expectations.p2p_expected(ladder_view):
        measured["isAllDirectP2p"] += ", as expected: %s" % expectations.declared(ladder_view)
        return None
    expected["isAllDirectP2p"] = 1
    if direct:
        return None
    vendor = (ladder_view.get("gpu") or {}).get("vendor")
    remedy = DIRECT_P2P_REMEDY.get(vendor) or shm_remedy(data.get("p2p_level"),
                                                         (ladder_view.get("p2p") or {}).get("nccl_p2p_level"),
                                                         data.get("env_file"))
    library = "NCCL/RCCL %s" % log["nccl_version"] if log.get("nccl_version") else "NCCL/RCCL"
    channels = ", ".join(log.get("transports") or []) or "none logged"
    return ("the collectives run's own %s log says isAllDirectP2p 0 (channels via %s): the library found no direct "
            "P2P between the GPUs, so these figures are not the P2P path's (seed 004 accepts only \"isAllDirectP2p 1 "
            "via P2P/IPC\", not SHM)" % (library, channels), remedy)


SENDRECV_REMEDY = (
    "SendRecv runs well below the peer copy the GPUs themselves make: check nccl_transport (a silent SHM fallback: "
    "NCCL_P2P_LEVEL=PHB in the GPU environment file, and the P2P-level patch for RCCL 2.27.7 on Intel hosts), then "
    "run the tests by hand with NCCL_DEBUG=INFO and the GPU environment file."
)


def shows_one_gpu(ladder_view, gpus_seen=None):
    """Whether the box has one GPU: the GPUs it shows (GPUS_SEEN: the static evidence's sysfs functions, as the other
    layers count them) where it shows any, unless rigbook_gpu.count declares more (a GPU gone missing is no "one
    GPU" skip); else rigbook_gpu.count."""
    count = (ladder_view.get("gpu") or {}).get("count")
    if gpus_seen:
        return gpus_seen == 1 and (count is None or count <= 1)
    return count == 1


FAILED_RUN_REMEDY = (
    "The run stopped on its own error (its WARN lines and the test's failure trailer say which): a peer mapping that "
    "failed is the peer_access layer's (large BAR, the P2P driver fork); run it again with NCCL_DEBUG=INFO and, to "
    "tell P2P from the rest, once with NCCL_P2P_DISABLE=1."
)


# The failure codes of the two layers' findings (ladder/codes.py gathers them; docs/codes.md is generated from them).
CODES = {
    "RB-COLLECTIVES-RUN-FAILED": _code(
        "collectives", "the collectives run stopped on its own error",
        "nccl-tests / rccl-tests or the bundled benchmark failed (its WARN lines, the test's failure trailer): often a "
        "peer mapping that failed ('Cuda failure 205 mapping of buffer object failed').",
        "The run's own failure lines (parse/nccl.failure_of).",
        "Read the failure lines; a failed peer mapping is the peer_access layer's (large BAR, the P2P driver fork); "
        "run it again with NCCL_DEBUG=INFO and once with NCCL_P2P_DISABLE=1."),
    "RB-COLLECTIVES-WRONG-ONE-RANK": _code(
        "collectives", "a single-GPU reduction gave wrong values",
        "The benchmark ran on one rank and its results are wrong: the GPU itself computes or stores wrong.",
        "The run's #wrong column with world size 1.",
        "Check the GPU (dmesg Xid, dcgmi diag)."),
    "RB-COLLECTIVES-WRONG-RESULTS": _code(
        "collectives", "collectives between the GPUs gave wrong results",
        "A collective's results are wrong (or out of bounds): corruption on the peer path, whatever the bandwidth.",
        "The #wrong (and out-of-bounds) columns of nccl-tests / rccl-tests or the bundled benchmark, per op.",
        "Disable P2P (NCCL_P2P_DISABLE=1) until the lower layers and the integrity test (peer_access) pass."),
    "RB-COLLECTIVES-NO-P2P-GAIN": _code(
        "collectives", "the collectives gain nothing from P2P: they did not use it",
        "SendRecv with P2P allowed runs less than 1.1x its busbw with NCCL_P2P_DISABLE=1 on a box that expects P2P: "
        "the library fell back to SHM or the network.",
        "The A/B run (option ab): sendrecv busbw with P2P allowed and with NCCL_P2P_DISABLE=1.",
        "Set NCCL_P2P_LEVEL in the GPU environment file (amd_rocm role); for RCCL 2.27.7 on Intel hosts the "
        "P2P-level patch (rccl role); check peer_access and kernel_state."),
    "RB-COLLECTIVES-NOT-DIRECT-P2P": _code(
        "collectives", "the collectives run's own log says isAllDirectP2p 0",
        "NCCL/RCCL found no direct P2P between the GPUs for this run, so its figures are not the P2P path's (seed "
        "004 accepts only \"isAllDirectP2p 1 via P2P/IPC\").",
        "The NCCL_DEBUG=INFO log of the collectives run itself.",
        "NVIDIA: the layers below (peer_access, driver_state), then NCCL_P2P_LEVEL. AMD: NCCL_P2P_LEVEL in the GPU "
        "environment file, then RCCL's P2P-level patch (rccl role)."),
    "RB-COLLECTIVES-BASELINE": _code(
        "collectives", "bus bandwidth fell below the baseline's fail line",
        "An op's busbw runs below the tolerance's fail_below share (0.8x) of this host's recorded figure (measured "
        "again once before it fails: ladder/repeat.py); often an SHM fallback after a kernel or driver upgrade.",
        "Each op's busbw against the host's baseline (provision baseline record).",
        "Check nccl_transport (SHM fallback after a kernel or driver upgrade), then p2p_bandwidth and the PCIe link."),
    "RB-COLLECTIVES-BASELINE-DIP": _code(
        "collectives", "bus bandwidth is slightly below the baseline",
        "An op's busbw runs between the tolerance's fail_below (0.8x) and warn_below (0.95x) shares of this host's "
        "recorded figure.",
        "Each op's busbw against the host's baseline.",
        "Watch the trend; check nccl_transport, p2p_bandwidth and the PCIe link."),
    "RB-COLLECTIVES-SENDRECV-BELOW-PEER": _code(
        "collectives", "SendRecv runs far below the peer copy the GPUs make",
        "SendRecv busbw is below the tolerance's sendrecv_of_peer_fail_below share of the slowest peer copy the "
        "p2p_bandwidth layer timed: the library does not get the path the GPUs have (seed 004: stock RCCL fell back "
        "to SHM, SendRecv 6.90 vs 10.29 GB/s = 0.67).",
        "sendrecv busbw against the probe's slowest peer copy.",
        SENDRECV_REMEDY),
    "RB-COLLECTIVES-SENDRECV-PEER-DIP": _code(
        "collectives", "SendRecv runs somewhat below the peer copy the GPUs make",
        "SendRecv busbw is below the tolerance's sendrecv_of_peer_warn_below share of the slowest peer copy (seed "
        "004: 9.75 vs 10.29 GB/s = 0.95 on a healthy box).",
        "sendrecv busbw against the probe's slowest peer copy.",
        SENDRECV_REMEDY),
    "RB-COLLECTIVES-OP-NOT-MEASURED": _code(
        "collectives", "an op the baseline holds was not measured",
        "The run lacks an op (sendrecv, all_reduce, or an all_gather / reduce_scatter the baseline records): its "
        "program is missing or did not run.",
        "The ops of the collectives run against the required ops and the baseline's.",
        "Install the missing nccl-tests / rccl-tests program, or run it by hand with NCCL_DEBUG=INFO."),
    "RB-P2P-SHM-FALLBACK": _code(
        "nccl_transport", "NCCL channels go through SHM (or the network), not P2P",
        "On a box that expects P2P, NCCL/RCCL fell back silently to the shared-memory (or network) transport: "
        "NCCL_P2P_LEVEL missing, an RCCL without the P2P-level patch, or a lower layer broken after an upgrade.",
        "The 'Channel ... via' lines of an NCCL_DEBUG=INFO log (the bundled benchmark's, or the serving unit's).",
        "Check the lower layers first (peer_access, kernel_state after an upgrade); set NCCL_P2P_LEVEL in the GPU "
        "environment file (amd_rocm role); for RCCL 2.27.7 on Intel hosts the P2P-level patch (rccl role)."),
    "RB-NCCL-NOT-DIRECT-P2P": _code(
        "nccl_transport", "the NCCL log says isAllDirectP2p 0",
        "NCCL/RCCL found no direct P2P between the GPUs (seed 004 accepts only \"isAllDirectP2p 1 via P2P/IPC\").",
        "The isAllDirectP2p value of an NCCL_DEBUG=INFO log.",
        "Check the lower layers first (peer_access, kernel_state after an upgrade), then NCCL_P2P_LEVEL and, for "
        "RCCL 2.27.7 on Intel hosts, the P2P-level patch."),
    "RB-NCCL-NET-TRANSPORT": _code(
        "nccl_transport", "NCCL channels go through the network transport",
        "On a box declared without P2P the GPUs should talk through SHM; the network transport means NCCL did not "
        "see the GPUs as one host's.",
        "The 'Channel ... via' lines of an NCCL_DEBUG=INFO log.",
        "Check that the ranks run on one host and that NCCL_SHM_DISABLE is not set; see the NCCL log's topology."),
    "RB-NCCL-P2P-DECLARED-UNAVAILABLE": _code(
        "nccl_transport", "every channel goes via P2P although P2P is declared unavailable",
        "rigbook_p2p.expected is false, yet NCCL uses P2P on every channel: the box changed or the declaration is "
        "stale.",
        "The 'Channel ... via' lines of an NCCL_DEBUG=INFO log.",
        "If P2P works now, set rigbook_p2p.expected true; otherwise find out what changed."),
    "RB-NCCL-P2P-LEVEL-MISMATCH": _code(
        "nccl_transport", "NCCL_P2P_LEVEL differs from the level rigbook_p2p pins",
        "The run's environment set another NCCL_P2P_LEVEL than rigbook_p2p.nccl_p2p_level.",
        "The NCCL_P2P_LEVEL the NCCL log shows against rigbook_p2p.nccl_p2p_level.",
        "Set NCCL_P2P_LEVEL in the serving unit's / GPU environment file to the pinned level (amd_rocm role)."),
    "RB-NCCL-P2P-LEVEL-UNSET": _code(
        "nccl_transport", "NCCL_P2P_LEVEL was not set where rigbook_p2p pins one",
        "The run's environment lacks NCCL_P2P_LEVEL although rigbook_p2p.nccl_p2p_level pins it, beside a transport "
        "problem.",
        "The NCCL log shows no NCCL_P2P_LEVEL; rigbook_p2p.nccl_p2p_level pins one.",
        "Re-run the amd_rocm role, which writes NCCL_P2P_LEVEL into the GPU environment file."),
}
BASELINE_CODES = {"fail": "RB-COLLECTIVES-BASELINE", "warn": "RB-COLLECTIVES-BASELINE-DIP",
                  "unknown": generic_code("collectives", "unknown")}
SENDRECV_CODES = {"fail": "RB-COLLECTIVES-SENDRECV-BELOW-PEER", "warn": "RB-COLLECTIVES-SENDRECV-PEER-DIP"}


def judge_collectives(data, ladder_view, baseline_metrics=None, tolerance=None, probe=None, gpus_seen=None):
    """Wrong results fail whatever the bandwidth; busbw is held to the recorded baseline; where P2P is expected,
    sendrecv busbw is held to the peer copy the p2p_bandwidth layer measured on the box (PROBE). GPUS_SEEN: the GPUs
    the box shows (shows_one_gpu)."""
    layer = "collectives"
    one_gpu = shows_one_gpu(ladder_view, gpus_seen)
    if one_gpu and not data.get("results"):
        return make(layer, "skip", measured={"source": data.get("source")}, expected=None,
                    why="one GPU: no collective between GPUs (%s)" % (data.get("error") or "nothing measured"))
    if data.get("failures") and not one_gpu:
        texts = ["%s%s" % (f.get("text"), " (%s)" % f["code"] if f.get("code") else "") for f in data["failures"]]
        return make(layer, "fail", {"source": data.get("source"), "failure lines": texts}, {"failure lines": "none"},
                    "the collectives run failed: %s" % "; ".join(texts[:3]), FAILED_RUN_REMEDY,
                    code="RB-COLLECTIVES-RUN-FAILED")
    if not data.get("available", True) or not data.get("results"):
        return make(layer, "unknown", measured=None, expected="sendrecv and all_reduce results",
                    why=data.get("error") or "no collectives result",
                    remedy="Install nccl-tests/rccl-tests, or set p2p_verify_python to a venv with PyTorch so the "
                           "bundled benchmark runs.")
    rows = {r["op"]: r for r in data["results"]}
    if data.get("world_size") == 1:
        ran = ", ".join("%s #wrong %s" % (op, r.get("wrong")) for op, r in sorted(rows.items()))
        why = "one GPU: the benchmark ran on one rank (%s), no traffic between GPUs to judge" % ran
        if any(r.get("wrong") for r in rows.values()):
            return make(layer, "fail", {"source": data.get("source")}, {"wrong": 0},
                        "wrong results on one rank: " + ran,
                        "A single-GPU reduction gave wrong values: check the GPU (dmesg Xid, dcgmi diag).",
                        code="RB-COLLECTIVES-WRONG-ONE-RANK")
        return make(layer, "skip", {"source": data.get("source"), "world_size": 1}, None, why)
    metrics = {}
    measured = {"source": data.get("source")}
    for op in OPS:
        row = rows.get(op)
        if row is None:
            continue
        metrics["%s_busbw_gbs" % op] = round(row["busbw_gbs"], 3) if row.get("busbw_gbs") is not None else None
        measured[op] = "busbw %s GB/s, #wrong %s" % (metrics["%s_busbw_gbs" % op], row.get("wrong"))
    for op in sorted(set(rows) - set(OPS)):  # another test (alltoall, a pasted table that names none): shown, not held
        measured[op] = "busbw %s GB/s, #wrong %s" % (rows[op].get("busbw_gbs"), rows[op].get("wrong"))
    wrong = {op: r.get("wrong") for op, r in rows.items() if r.get("wrong")}
    oob = {op: r.get("out_of_bounds") for op, r in rows.items() if r.get("out_of_bounds")}
    expected = {"wrong": 0}
    if wrong or oob:
        why = "wrong results: %s" % ", ".join("%s #wrong %s" % kv for kv in sorted(wrong.items()))
        if oob:
            why += "; out of bounds values: %s" % ", ".join("%s %s" % kv for kv in sorted(oob.items()))
        return make(layer, "fail", measured, expected, why,
                    "Wrong collective results mean corruption on the peer path: disable P2P (NCCL_P2P_DISABLE=1) "
                    "until the lower layers and the integrity test (peer_access) pass.", metrics=metrics,
                    code="RB-COLLECTIVES-WRONG-RESULTS")
    # the path the collectives took: P2P gain over NCCL_P2P_DISABLE=1 (with ab), and the run's own log
    no_p2p, no_p2p_codes, remedy = [], [], None
    ab = data.get("ab")
    if ab:
        if ab.get("gain") is not None:
            measured["p2p_gain"] = "%.2fx (sendrecv busbw %s GB/s vs %s GB/s with NCCL_P2P_DISABLE=1)" % (
                ab["gain"], ab.get("busbw_gbs"), ab.get("p2p_disabled_busbw_gbs"))
        else:
            measured["p2p_gain"] = "not measured: %s" % ab.get("error")
        if expectations.p2p_expected(ladder_view) and ab.get("gain") is not None and ab["gain"] < AB_MIN_GAIN:
            expected["p2p_gain"] = ">= %.1fx" % AB_MIN_GAIN
            want = (ladder_view.get("p2p") or {}).get("nccl_p2p_level")
            no_p2p.append("P2P gain %.2fx over NCCL_P2P_DISABLE=1, below %.1fx: the collectives did not use P2P"
                          % (ab["gain"], AB_MIN_GAIN))
            no_p2p_codes.append("RB-COLLECTIVES-NO-P2P-GAIN")
            remedy = shm_remedy(data.get("p2p_level"), want, data.get("env_file"))
    direct = _direct_p2p(data, ladder_view, measured, expected)
    if direct:
        no_p2p.append(direct[0])
        no_p2p_codes.append("RB-COLLECTIVES-NOT-DIRECT-P2P")
        remedy = remedy or direct[1]
    if no_p2p:
        return make(layer, "fail", measured, expected, "; ".join(no_p2p), remedy, metrics=metrics,
                    codes=no_p2p_codes)
    missing = [op for op in REQUIRED_OPS if op not in rows]
    if missing and data.get("error"):
        return make(layer, "unknown", measured, expected, "%s not measured: %s" % (", ".join(missing), data["error"]),
                    "Run the failing program by hand with NCCL_DEBUG=INFO and the GPU environment file.",
                    metrics=metrics)
    tol = expectations.tolerance(ladder_view, tolerance, defaults=expectations.SENDRECV_OF_PEER_TOLERANCE)
    baseline_metrics = baseline_metrics or {}
    status, texts, ratios = baseline_mod.compare_all(metrics, baseline_metrics, tol)
    found = [(status, BASELINE_CODES.get(status))]  # (status, code) of each finding
    expected.update({k: ">= %.2fx of %s" % (tol["fail_below"], v) for k, v in baseline_metrics.items()
                     if k in metrics})
    missing += ["%s (the baseline holds %s)" % (op, "%s_busbw_gbs" % op) for op in EXTRA_OPS
                if op not in rows and baseline_metrics.get("%s_busbw_gbs" % op) is not None]
    path = "P2P" if expectations.p2p_expected(ladder_view) else "the SHM path (P2P declared unavailable)"
    peer_status, peer_text = None, None
    if expectations.p2p_expected(ladder_view):
        peer_status, peer_text = _sendrecv_of_peer(rows, probe, tol)
        measured["sendrecv_of_peer"] = peer_text
        expected["sendrecv_of_peer"] = ">= %.2fx the peer copy (p2p_bandwidth)" % tol["sendrecv_of_peer_warn_below"]
    remedy = ""
    no_baseline = status == "skip"
    if no_baseline:
        status = "pass"
        texts = ["no regression check yet: " + "; ".join(texts) + "; record one with `provision baseline record`"]
    elif status in ("fail", "warn"):
        remedy = ("Bus bandwidth fell against the baseline over %s: check nccl_transport (SHM fallback after a "
                  "kernel or driver upgrade), then p2p_bandwidth and the PCIe link." % path)
    if peer_status in ("warn", "fail"):
        texts.insert(0, peer_text)
        remedy = " ".join(filter(None, [SENDRECV_REMEDY, remedy]))
        status = worse(status, peer_status)
        found.append((peer_status, SENDRECV_CODES[peer_status]))
    if missing and status == "pass" and not no_baseline:
        status = "warn"
        texts.append("not measured: %s" % ", ".join(missing))
        found.append(("warn", "RB-COLLECTIVES-OP-NOT-MEASURED"))
    codes = [code for _, code in sorted(found, key=lambda f: -rank(f[0])) if code]
    return make(layer, status, measured, expected, "; ".join(texts), remedy, metrics=metrics, codes=codes)


def judge_nccl_transport(parsed, ladder_view, gpus_seen=None):
    """Every channel via P2P when P2P is expected (a silent SHM fallback fails); SHM when declared unavailable.
    GPUS_SEEN: the GPUs the box shows (shows_one_gpu)."""
    layer = "nccl_transport"
    expected_p2p = expectations.p2p_expected(ladder_view, gpus_seen or None)
    want_level = (ladder_view.get("p2p") or {}).get("nccl_p2p_level")
    expected = {"path": "p2p" if expected_p2p else "shm"}
    if shows_one_gpu(ladder_view, gpus_seen):
        return make(layer, "skip", measured={"source": parsed.get("source")}, expected=None,
                    why="one GPU: NCCL opens no channel between GPUs")
    if want_level:
        expected["NCCL_P2P_LEVEL"] = want_level
    if not parsed.get("available") or parsed.get("path") == "unknown":
        return make(layer, "unknown", measured={"source": parsed.get("source")}, expected=expected,
                    why="no NCCL channel lines found (%s)" % parsed.get("source"),
                    remedy="Run with NCCL_DEBUG=INFO (the bundled benchmark does), or point to the serving unit.")
    channels = parsed.get("channels") or []
    by_transport = {}
    for channel in channels:
        by_transport[channel["transport"]] = by_transport.get(channel["transport"], 0) + 1
    measured = {
        "path": parsed["path"],
        "channels": ", ".join("%d via %s" % (n, t) for t, n in sorted(by_transport.items())),
        "isAllDirectP2p": parsed.get("all_direct_p2p"),
        "isAllCudaP2p": parsed.get("all_cuda_p2p"),
        "NCCL_P2P_LEVEL": parsed.get("p2p_level"),
        "nccl_version": parsed.get("nccl_version"),
    }
    problems, notes, codes = [], [], []
    if expected_p2p:
        not_p2p = [c for c in channels if not c["transport"].upper().startswith("P2P")]
        if not_p2p:
            kinds = sorted({c["transport"] for c in not_p2p})
            problems.append("%d of %d channels go through %s, not P2P: NCCL fell back silently"
                            % (len(not_p2p), len(channels), ", ".join(kinds)))
            codes.append("RB-P2P-SHM-FALLBACK")
        if parsed.get("all_direct_p2p") is False:
            problems.append("isAllDirectP2p 0: the library found no direct P2P between the GPUs (seed 004 accepts "
                            "only \"isAllDirectP2p 1 via P2P/IPC\")")
            codes.append("RB-NCCL-NOT-DIRECT-P2P")
    else:
        if parsed["path"] == "net":
            problems.append("channels go through the network transport")
            codes.append("RB-NCCL-NET-TRANSPORT")
        elif parsed["path"] == "p2p":
            notes.append("every channel goes via P2P although rigbook_p2p declares P2P unavailable")
            codes.append("RB-NCCL-P2P-DECLARED-UNAVAILABLE")
    if want_level and parsed.get("p2p_level") and parsed["p2p_level"] != want_level:
        notes.append("NCCL_P2P_LEVEL is %s, rigbook_p2p pins %s" % (parsed["p2p_level"], want_level))
        codes.append("RB-NCCL-P2P-LEVEL-MISMATCH")
    elif want_level and not parsed.get("p2p_level") and problems:
        notes.append("NCCL_P2P_LEVEL was not set (rigbook_p2p pins %s)" % want_level)
        codes.append("RB-NCCL-P2P-LEVEL-UNSET")
    remedy = ""
    if problems or notes:
        remedy = ("Check the lower layers first (peer_access, kernel_state after an upgrade); set NCCL_P2P_LEVEL=%s "
                  "in the serving unit's environment; for RCCL 2.27.7 on Intel hosts the P2P-level patch is needed "
                  "as well." % (want_level or "PHB"))
        if problems and expected_p2p and parsed.get("from_tests_run"):
            remedy = shm_remedy(parsed.get("p2p_level"), want_level, parsed.get("env_file"))
    if problems:
        return make(layer, "fail", measured, expected, "; ".join(problems + notes), remedy, codes=codes)
    if notes:
        return make(layer, "warn", measured, expected, "; ".join(notes), remedy, codes=codes)
    return make(layer, "pass", measured, expected,
                "every channel via %s" % ", ".join(parsed.get("transports") or []))
