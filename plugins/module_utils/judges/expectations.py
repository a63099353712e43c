# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a host is held to, decided once for every layer: is P2P expected, and the baseline tolerance.

Pure; standard library only.
"""

from __future__ import annotations

# Below fail_below x baseline a figure fails, below warn_below x baseline it warns (aznhc/nccl-tests style).
DEFAULT_TOLERANCE = {"fail_below": 0.8, "warn_below": 0.95}
# The collectives layer's sendrecv bus bandwidth as a share of the peer copy the p2p_bandwidth layer measured on the
# same box: warn below sendrecv_of_peer_warn_below, fail below sendrecv_of_peer_fail_below. Not the baseline's
# 0.95x/0.8x: seed 004's healthy box gives SendRecv 9.75 vs peer copy 10.29 GB/s = 0.95 (the write-up calls it the
# pass), its stock RCCL over SHM SendRecv 6.90 vs 10.29 GB/s = 0.67 (the failure the RCCL patch fixed).
SENDRECV_OF_PEER_TOLERANCE = {"sendrecv_of_peer_warn_below": 0.9, "sendrecv_of_peer_fail_below": 0.75}


def p2p_expected(ladder_view, gpus_seen=None):
    """rigbook_p2p.expected when the host variables declare it; otherwise P2P is expected with two or more GPUs,
    counted from what the layer saw (GPUS_SEEN: sysfs functions, probe devices) when it saw anything, else
    from rigbook_gpu.count."""
    p2p = (ladder_view or {}).get("p2p") or {}
    if "expected" in p2p:
        return bool(p2p["expected"])
    if gpus_seen is None:
        gpus_seen = ((ladder_view or {}).get("gpu") or {}).get("count") or 0
    return gpus_seen >= 2


def declared(ladder_view):
    """Why P2P is not expected, in words (for the verdicts of a host held to the SHM / host-staged path)."""
    p2p = (ladder_view or {}).get("p2p") or {}
    if "expected" in p2p:
        return "P2P is declared unavailable (%s)" % " ".join(str(p2p.get("reason") or "no reason given").split())
    return "P2P is not expected (no rigbook_p2p.expected)"


def tolerance(ladder_view=None, override=None, defaults=None):
    """The thresholds a layer compares with: DEFAULT_TOLERANCE, then DEFAULTS (a layer's own thresholds),
    then the ladder view's `tolerance` (the host model's), then OVERRIDE (the module's tolerance option,
    rigbook_tolerance)."""
    merged = dict(DEFAULT_TOLERANCE)
    merged.update(defaults or {})
    merged.update((ladder_view or {}).get("tolerance") or {})
    merged.update(override or {})
    return merged
