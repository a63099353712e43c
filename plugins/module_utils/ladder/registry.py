# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The P2P ladder's layers, defined once (standard library only).

Each layer: its name, its place in the ladder (the order of LAYERS, lowest first: a higher layer means little
while a lower one fails), its phase (static: read from sysfs/procfs and commands; runtime: measured through
the GPU driver; serving: the engine the serve role started, asked over HTTP), the evidence parts it needs, its
judge and the tags that select it. Each evidence part has one collector. The ladder modules, replay, the lab's
fault table, the p2p_verify role (checked by a test) and the benchmarks all read this table; adding a layer is
one entry here plus its collector and judge.

A judge here is called as judge(evidence, ctx): EVIDENCE holds every part collected so far (static parts
at the top level, as collect_static returns them; runtime parts under their own keys), CTX is the climb's
Context (ladder_view, baseline, tolerance, root, options). The pure judges under judges/ keep their own explicit
arguments; the small adapters below say what each one reads.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import error_counters, static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import (
    collective_layers,
    peer_layers,
    serving_layer,
    static_layers,
)

STATIC = "static"
RUNTIME = "runtime"
SERVING = "serving"
PHASES = (STATIC, RUNTIME, SERVING)


class Layer:
    """One rung of the ladder. TAGS are extra tags that select it besides its name."""

    def __init__(self, name, phase, needs, judge, tags=(), summary=""):
        if phase not in PHASES:
            raise ValueError("layer %s: unknown phase %r" % (name, phase))
        self.name = name
        self.phase = phase
        self.needs = tuple(needs)
        self.judge = judge
        self.tags = (name,) + tuple(tags)
        self.summary = summary

    def __repr__(self):
        return "Layer(%s, %s)" % (self.name, self.phase)


def _static(judge):
    """A static judge reads the whole static evidence and the ladder view."""
    def run(evidence, ctx):
        return judge(evidence, ctx.ladder_view)
    return run


def _peer_access(evidence, ctx):
    return peer_layers.judge_peer_access(evidence.get("probe"), ctx.ladder_view)


def _p2p_bandwidth(evidence, ctx):
    return peer_layers.judge_p2p_bandwidth(evidence.get("probe"), ctx.ladder_view, ctx.baseline, ctx.tolerance)


def _collectives(evidence, ctx):
    """Also reads the probe the p2p_bandwidth layer (one rung down) measured, when this climb collected it: sendrecv
    is held to the box's own peer copy (a climb of this layer alone compares with the baseline only)."""
    return collective_layers.judge_collectives(evidence.get("collectives") or {}, ctx.ladder_view, ctx.baseline,
                                               ctx.tolerance, probe=evidence.get("probe"),
                                               gpus_seen=_gpus_seen(evidence))


def _nccl_transport(evidence, ctx):
    return collective_layers.judge_nccl_transport(evidence.get("nccl_transport") or {}, ctx.ladder_view,
                                                  gpus_seen=_gpus_seen(evidence))


def _gpus_seen(evidence):
    """How many GPUs the box shows (the static "gpus" part, sysfs: what the static layers count), None when that
    part was not collected."""
    gpus = evidence.get("gpus")
    return len(gpus) if isinstance(gpus, list) else None


def _serving(evidence, ctx):
    return serving_layer.judge_serving(evidence.get("serving") or {}, ctx.ladder_view, ctx.baseline, ctx.tolerance)


def _runtime(name):
    """A runtime collector of collect/runtime_evidence.py, loaded on first use: a static climb's module run
    never imports the probe or the benchmark code. (A plain import statement, so that Ansible ships the file.)"""
    def collect(ctx, evidence):
        # deferred: runtime_evidence (the ctypes probe, the benchmarks) costs ~21 ms to import; static climbs need none
        from ansible_collections.rigbook.homelab.plugins.module_utils.collect import runtime_evidence

        return getattr(runtime_evidence, name)(ctx, evidence)
    collect.__name__ = name
    return collect


def _serving_part(ctx, evidence):
    """The serving collector (collect/serving_evidence.py), loaded on first use like the runtime ones."""
    # deferred: serving_evidence costs ~38 ms to import (with the collectives code); only the serving layer needs it
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import serving_evidence

    return serving_evidence.serving_part(ctx, evidence)


def _error_counters(ctx, evidence):
    """The hardware error counters (collect/error_counters.py) the climb reads around the runtime layers
    (ladder/error_watch.py)."""
    return error_counters.reading_part(ctx, evidence)


# (ctx, evidence) -> a reading of the error counters, taken before the first runtime layer and after each one.
ERROR_COUNTERS = _error_counters

# The collectors, one per evidence part: (ctx, evidence so far) -> {key: value} merged into the evidence.
PARTS = dict(static_evidence.PARTS)
PARTS.update({
    "probe": _runtime("probe_part"),
    "collectives": _runtime("collectives_part"),
    "nccl_transport": _runtime("nccl_transport_part"),
    "serving": _serving_part,
})

LAYERS = [
    Layer("firmware", STATIC, ("gpus",), _static(static_layers.judge_firmware),
          summary="UEFI boot, GPU BARs above 4 GiB, VRAM BAR >= VRAM (ReBAR)"),
    Layer("pcie_link", STATIC, ("gpus",), _static(static_layers.judge_pcie_link),
          summary="link width and speed per GPU against rigbook_gpu.pcie and LnkCap"),
    Layer("dma_window", STATIC, ("gpus", "kernel"), _static(static_layers.judge_dma_window),
          summary="each peer BAR below the GPU's DMA reach"),
    Layer("kernel_state", STATIC, ("gpus", "kernel", "cpu", "nvidia_kernel"), _static(static_layers.judge_kernel_state),
          summary="running kernel and cmdline as pinned, P2PDMA config, nvidia-uvm HMM with iommu=pt"),
    Layer("driver_state", STATIC, ("gpus", "kernel", "nvidia", "amd"), _static(static_layers.judge_driver_state),
          summary="the loaded module is the pinned build for the running kernel; userspace equal"),
    Layer("peer_access", RUNTIME, ("probe",), _peer_access,
          summary="can-access-peer both ways, enabling succeeds, a peer copy of a pattern verifies"),
    Layer("p2p_bandwidth", RUNTIME, ("probe",), _p2p_bandwidth,
          summary="peer GB/s each way and both ways vs the host-staged copy, the link and the baseline"),
    Layer("collectives", RUNTIME, ("gpus", "collectives"), _collectives,
          summary="sendrecv, all_reduce, all_gather and reduce_scatter bus bandwidth vs the baseline, sendrecv vs "
                  "the peer copy of p2p_bandwidth, no wrong results"),
    Layer("nccl_transport", RUNTIME, ("gpus", "nccl_transport"), _nccl_transport,
          summary="the NCCL/RCCL INFO log shows P2P (not a silent SHM fallback)"),
    Layer("serving", SERVING, ("serving",), _serving,
          summary="each serve unit active and not crash-looping, ready, serving its model name, TTFT and decode "
                  "tok/s vs the baseline, the engine's own log on the expected transport"),
]


def names(phase=None):
    """Layer names in ladder order, of one PHASE or all."""
    return [layer.name for layer in LAYERS if phase is None or layer.phase == phase]


def expected_layers(view):
    """The layers a box must measure, from the ladder view's `measure` (host_model.verify_settings): every layer
    when its GPUs are declared, the serving layer only with serve profiles; none otherwise."""
    measure = (view or {}).get("measure") or {}
    if not measure.get("layers"):
        return []
    return [layer.name for layer in LAYERS if layer.phase != SERVING or measure.get("serving")]


def get(name):
    for layer in LAYERS:
        if layer.name == name:
            return layer
    raise KeyError(name)


def of_phase(phase):
    """The layers of PHASE in ladder order; every layer when PHASE is None."""
    return [layer for layer in LAYERS if phase is None or layer.phase == phase]


def select(phase, requested=None):
    """(layers of PHASE in ladder order, unknown names) for REQUESTED layer names or tags; None selects every
    layer of the phase. A name that selects no layer of PHASE (of any phase when PHASE is None) is unknown."""
    if requested is None:
        return of_phase(phase), []
    requested = set(str(name) for name in requested)
    layers = [layer for layer in of_phase(phase) if requested & set(layer.tags)]
    known = set(tag for layer in of_phase(phase) for tag in layer.tags)
    return layers, sorted(requested - known)


def select_by_run_tags(phase, run_tags):
    """The layers of PHASE that Ansible's run tags (--tags) name; all of them when the tags name none (a run
    with no --tags, or tags of roles and plays only). Tags that are no layer's are not an error here."""
    layers, _ = select(phase, run_tags or [])
    return layers or of_phase(phase)
