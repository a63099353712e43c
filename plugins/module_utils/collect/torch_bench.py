# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bundled two-process collectives benchmark (sendrecv, all_reduce) over torch.distributed + NCCL/RCCL.

This file is standard library at import time: the collectives module ships its source to the
target and runs it with the serving environment's Python, which has PyTorch. Ranks meet on a
loopback TCP port. Output: one JSON object on stdout, in nccl-tests' terms (algbw, busbw, #wrong),
plus the NCCL INFO log written by the ranks.

    python3 torch_bench.py [--size BYTES] [--iters N] [--world N]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import sys
import tempfile
import time


def busbw_factor(op, world):
    """nccl-tests' bus bandwidth factor: all_reduce 2(n-1)/n, sendrecv 1."""
    if op == "all_reduce":
        return 2.0 * (world - 1) / world if world > 1 else 1.0
    return 1.0


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, size, iters, out_dir):  # pragma: no cover - needs GPUs
    # deferred: torch is optional (only the serving venv's Python has it) and this file is imported without it
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    count = size // 4
    results = []

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000.0 / iters  # microseconds

    buf = torch.full((count,), float(rank + 1), device="cuda", dtype=torch.float32)
    time_us = timed(lambda: (buf.fill_(float(rank + 1)), dist.all_reduce(buf)))
    buf.fill_(float(rank + 1))
    dist.all_reduce(buf)
    expected = world * (world + 1) / 2.0
    wrong = int((buf != expected).sum().item())
    algbw = size / time_us / 1e3
    results.append({"op": "all_reduce", "size_bytes": size, "time_us": time_us, "algbw_gbs": algbw,
                    "busbw_gbs": algbw * busbw_factor("all_reduce", world), "wrong": wrong})
    if world >= 2:
        send = torch.arange(count, device="cuda", dtype=torch.float32) + rank * 7
        recv = torch.empty_like(send)
        peer_to, peer_from = (rank + 1) % world, (rank - 1) % world

        def sendrecv():
            ops = [dist.P2POp(dist.isend, send, peer_to), dist.P2POp(dist.irecv, recv, peer_from)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        time_us = timed(sendrecv)
        want = torch.arange(count, device="cuda", dtype=torch.float32) + peer_from * 7
        wrong = int((recv != want).sum().item())
        algbw = size / time_us / 1e3
        results.append({"op": "sendrecv", "size_bytes": size, "time_us": time_us, "algbw_gbs": algbw,
                        "busbw_gbs": algbw * busbw_factor("sendrecv", world), "wrong": wrong})
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(os.path.join(out_dir, "results.json"), "w") as handle:
            # the NCCL torch was BUILT with, whatever library is in use (a real H200 host: 2.28.9 while the
            # preloaded 2.28.3 ran); the version in use is NCCL's own INFO line, read from the ranks' log
            json.dump({"ranks": gathered, "torch_built_with_nccl": ".".join(map(str, torch.cuda.nccl.version())),
                       "torch": torch.__version__}, handle)
    dist.destroy_process_group()


def merge(rank_results):
    """Worst case over ranks: the slowest rank's time, the sum of wrong elements."""
    merged = {}
    for results in rank_results:
        for row in results:
            key = row["op"]
            if key not in merged:
                merged[key] = dict(row)
                continue
            current = merged[key]
            current["wrong"] += row["wrong"]
            if row["time_us"] > current["time_us"]:
                for field in ("time_us", "algbw_gbs", "busbw_gbs"):
                    current[field] = row[field]
    return [merged[k] for k in sorted(merged)]


def main(argv=None):  # pragma: no cover - needs GPUs
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=256 << 20)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--world", type=int, default=0, help="ranks (default: every visible GPU, at most 2)")
    args = parser.parse_args(argv)
    try:
        # deferred: torch is optional (only the serving venv's Python has it): its absence is reported below
        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        print(json.dumps({"available": False, "error": "PyTorch is not importable: %s" % exc}))
        return 0
    gpus = torch.cuda.device_count()
    world = args.world or min(gpus, 2)
    if gpus < 1 or world > gpus:
        print(json.dumps({"available": False, "error": "%d GPU(s) visible, %d rank(s) asked" % (gpus, world)}))
        return 0
    out_dir = tempfile.mkdtemp(prefix="rigbook-bench-")
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(out_dir, "nccl.%h.%p.log")
    started = time.time()
    mp.spawn(_rank_main, args=(world, _free_port(), args.size, args.iters, out_dir), nprocs=world, join=True)
    with open(os.path.join(out_dir, "results.json")) as handle:
        raw = json.load(handle)
    log = ""
    for name in sorted(glob.glob(os.path.join(out_dir, "nccl.*.log"))):
        with open(name, errors="replace") as handle:
            log += handle.read()
    print(json.dumps({
        "available": True, "backend": "torch.distributed", "world_size": world,
        "torch_built_with_nccl": raw["torch_built_with_nccl"], "torch": raw["torch"],
        "results": merge(raw["ranks"]), "duration_s": round(time.time() - started, 2),
        "nccl_log": log,
    }))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
