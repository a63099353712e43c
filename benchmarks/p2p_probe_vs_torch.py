"""Benchmark: the ctypes CUDA probe's host<->device copies against PyTorch doing the same copies.

Same size, pinned host memory on both sides, both timed with CUDA events after one warm-up:
  probe: plugins/module_utils/probe/cuda.py (driver API through ctypes, run the way the modules run
         it: in a forked child with a hard timeout), cuMemcpyHtoDAsync/DtoHAsync on its own stream;
  torch: torch.empty(..., pin_memory=True) and .copy_(non_blocking=True) on a side stream.
Target: the probe reaches at least 95% of the reference (median of TRIALS runs each).
It also drives the probe's peer code path on pair (0, 0) (one GPU: those figures mean nothing,
the point is that every call runs and is cleaned up).

Run: python3 benchmarks/p2p_probe_vs_torch.py [--size BYTES] [--reps N] [--trials N]
       [--json-out probe.json] [--self-pair-json selfpair.json]
Without a GPU (or without torch) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from rigbook.paths import link_collection  # noqa: E402

link_collection()  # puts ansible_collections.rigbook.homelab on sys.path
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import cuda as cuda_probe  # noqa: E402

TARGET = 0.95


def torch_copies(torch, ordinal: int, size: int, reps: int) -> dict:
    """H2D and D2H GB/s of pinned-host <-> device copies through PyTorch, event-timed like the probe."""
    device = torch.device("cuda", ordinal)
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    out = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)  # warm-up
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(reps):
                dst.copy_(src, non_blocking=True)
            stop.record(stream)
        stop.synchronize()
        out[name] = size * reps / (start.elapsed_time(stop) / 1e3) / 1e9
    del host, dev
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256 << 20, help="bytes per copy (default 256 MiB)")
    parser.add_argument("--reps", type=int, default=20, help="timed copies per figure")
    parser.add_argument("--trials", type=int, default=3, help="runs of each side; medians are compared")
    parser.add_argument("--json-out", help="write the probe's JSON (the median H2D trial) here")
    parser.add_argument("--self-pair-json", help="write the pair-(0,0) probe's JSON here")
    args = parser.parse_args()
    print(f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', '(unset)')}")

    # The probe first, in forked children, while this process has not touched CUDA.
    runs = [cuda_probe.probe_isolated(size_bytes=args.size, reps=args.reps) for _ in range(args.trials)]
    first = runs[0]
    if not first.get("available"):
        print(f"no GPU present: {first.get('error')}")
        return 0
    self_pair = cuda_probe.probe_isolated(size_bytes=args.size, reps=args.reps, pairs=[(0, 0)])
    try:
        import torch
    except ImportError as exc:
        print(f"torch is not importable ({exc}): no reference to compare with")
        return 0
    if not torch.cuda.is_available():
        print("torch sees no GPU: no reference to compare with")
        return 0

    dev0 = first["devices"][0]
    print(f"driver {first['driver']} ({first['driver_version']}), {len(first['devices'])} GPU(s)")
    for dev in first["devices"]:
        print(f"  index {dev['index']} ordinal {dev['ordinal']}: {dev['name']} at {dev['pci_bus_id']}")
    print(f"size {args.size} bytes ({args.size >> 20} MiB), reps {args.reps}, trials {args.trials}, pinned host memory")
    elapsed = ", ".join(str(r.get("elapsed_s")) + " s" for r in runs)
    print(f"probe elapsed per run: {elapsed}")

    refs = [torch_copies(torch, dev0["ordinal"], args.size, args.reps) for _ in range(args.trials)]
    ok = True
    for name in ("h2d", "d2h"):
        probe_figs = [r["devices"][0][f"{name}_gbs"] for r in runs]
        ref_figs = [r[name] for r in refs]
        if any(f is None for f in probe_figs):
            print(f"{name.upper()}: probe did not measure it: {[r['devices'][0]['errors'] for r in runs]}")
            ok = False
            continue
        probe_med, ref_med = statistics.median(probe_figs), statistics.median(ref_figs)
        ratio = probe_med / ref_med
        verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
        ok = ok and ratio >= TARGET
        print(
            f"{name.upper()}  probe {probe_med:7.2f} GB/s  torch {ref_med:7.2f} GB/s  ratio {ratio:.3f}  "
            f"[{verdict}, target >= {TARGET}]  (probe runs {', '.join(f'{f:.2f}' for f in probe_figs)}; "
            f"torch runs {', '.join(f'{f:.2f}' for f in ref_figs)})"
        )

    if self_pair.get("available"):
        (pair,) = self_pair["pairs"] or [{}]
        bidir = (self_pair["bidir"] or [{}])[0]
        print(
            "peer code path on pair (0,0) (one GPU: figures are device-local copies, not P2P): "
            f"can_access_peer {pair.get('can_access_peer')}, enable_peer {pair.get('enable_peer')}, "
            f"pattern_ok {pair.get('pattern_ok')}, peer {pair.get('peer_gbs')} GB/s, "
            f"host-staged {pair.get('host_staged_gbs')} GB/s (staged pattern_ok {pair.get('staged_pattern_ok')}), "
            f"bidir {bidir.get('gbs')} GB/s, errors {pair.get('errors')} {self_pair.get('errors')}, "
            f"cleanup errors {self_pair.get('cleanup_errors', [])}, elapsed {self_pair.get('elapsed_s')} s"
        )
    else:
        print(f"peer code path on pair (0,0): probe unavailable: {self_pair.get('error')}")
        ok = False

    if args.json_out:
        h2d = sorted(runs, key=lambda r: r["devices"][0]["h2d_gbs"] or 0)[len(runs) // 2]
        Path(args.json_out).write_text(json.dumps(h2d, indent=1, sort_keys=True) + "\n")
    if args.self_pair_json:
        Path(args.self_pair_json).write_text(json.dumps(self_pair, indent=1, sort_keys=True) + "\n")
    print("RESULT:", "probe within target" if ok else "probe BELOW target or path failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
