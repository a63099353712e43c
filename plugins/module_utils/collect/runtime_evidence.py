# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evidence of the runtime layers (all I/O; standard library only): the GPU probe, the collectives run, the
NCCL log. Live under "/", read from the recordings elsewhere (var/lib/rigbook/commands/, docs/evidence.md).

Each *_part takes (ctx, evidence): ctx.root, ctx.ladder_view and ctx.options (the ladder module's options,
ladder/climb.OPTION_DEFAULTS), and what the climb has collected so far.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import collective_bench
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as recorded
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import cuda as cuda_probe
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import hip as hip_probe


def ipc_legacy_of(ladder_view):
    """HSA_ENABLE_IPC_MODE_LEGACY pinned in rigbook_pins.rocm.hsa_env, as a bool (None when not pinned)."""
    env = (((ladder_view.get("pins") or {}).get("rocm") or {}).get("hsa_env")) or {}
    value = env.get(hip_probe.IPC_ENV)
    return None if value is None else str(value).strip() not in ("0", "false", "False", "")


def collect_probe(root, ladder_view, size_bytes=cuda_probe.DEFAULT_SIZE, reps=cuda_probe.DEFAULT_REPS,
                  deadline_s=None, ipc_legacy=None):
    """The vendor's probe (both tried when the vendor is unknown), live or recorded.

    The probe only reads and measures (device memory it allocates is freed), so check mode runs it too."""
    vendor = (ladder_view.get("gpu") or {}).get("vendor")
    vendors = [vendor] if vendor in recorded.PROBES else ["nvidia", "amd"]
    if ipc_legacy is None:
        ipc_legacy = ipc_legacy_of(ladder_view)
    live = {
        "nvidia": lambda: cuda_probe.probe_isolated(
            size_bytes=size_bytes, reps=reps, deadline_s=deadline_s or cuda_probe.DEFAULT_DEADLINE_S),
        "amd": lambda: hip_probe.probe_isolated(
            size_bytes=size_bytes, reps=reps, deadline_s=deadline_s or hip_probe.DEFAULT_DEADLINE_S,
            ipc_legacy=ipc_legacy),
    }
    tried = []
    for name in vendors:
        data, source = recorded.probe_output(root, recorded.PROBES[name], live[name])
        data = dict(data, source=source)
        if data.get("available"):
            return data
        tried.append(data)
    if len(tried) > 1:
        return dict(tried[0], error="; ".join("%s: %s" % (t.get("api"), t.get("error")) for t in tried))
    return tried[0]


def _env(ctx):
    return {k: str(v) for k, v in (ctx.options.get("env") or {}).items()}


def probe_part(ctx, evidence):
    """{"probe": ...}: a probe result already taken (option probe_result), else the probe run once."""
    opts = ctx.options
    return {"probe": opts.get("probe_result") or collect_probe(
        ctx.root, ctx.ladder_view, opts.get("probe_bytes") or cuda_probe.DEFAULT_SIZE,
        opts.get("reps") or cuda_probe.DEFAULT_REPS, opts.get("deadline_s"), opts.get("ipc_legacy"))}


def collectives_part(ctx, evidence):
    """{"collectives": ...}: nccl-tests / rccl-tests, else the bundled benchmark (one run, its NCCL log kept)."""
    opts = ctx.options
    # the inventory's count, else the GPUs the box shows (the static "gpus" part, collected before this one)
    gpus = (ctx.ladder_view.get("gpu") or {}).get("count") or len(evidence.get("gpus") or []) or 2
    return {"collectives": collective_bench.collect_collectives(
        ctx.root, opts.get("python"), opts.get("nccl_tests_dir"), opts.get("collective_bytes") or (256 << 20),
        opts.get("iters") or 10, gpus=gpus, env=_env(ctx), env_file=opts.get("env_file"), ab=bool(opts.get("ab")))}


def nccl_transport_part(ctx, evidence):
    """{"nccl_transport": ...}: the NCCL INFO log given, else the collectives run's, else recorded / journal."""
    opts = ctx.options
    run = evidence.get("collectives") or {}
    if not opts.get("log") and run.get("nccl_log") and run.get("source", "").startswith("rccl-tests"):
        parsed = collective_bench.transport_evidence(run["nccl_log"], "the log of the collectives run (%s)"
                                                     % run["source"])
        parsed.update(from_tests_run=True, env_file=run.get("env_file"))
        return {"nccl_transport": parsed}
    log = opts.get("log") or run.get("nccl_log")
    text, source = collective_bench.collect_nccl_log(ctx.root, log, opts.get("unit"), opts.get("python"),
                                                     env=_env(ctx))
    return {"nccl_transport": collective_bench.transport_evidence(text, source)}
