# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime layers beside a serving engine: how a layer is judged when an engine held the GPUs while it ran
(standard library only; pure).

On a converged box the engine holds most of the GPUs' memory (seed 000: --mem-fraction-static 0.88) and serves
traffic: the peer probe or a collectives test run beside it can run out of GPU memory, and its figures are lowered by
the engine's own traffic. So the runtime phase stops this host's serve units for its layers and starts them again
after (ladder/serving_hold.py). What still runs beside the layers (an engine started by hand, a unit left running with
p2p_verify_stop_serving false or in check mode) is described by BESIDE:

    {"engines": [label, ...], "memory": {"used_mib", "total_mib", "gpus", "error"}, "remedy": "what to do"}

and judged here, after the layer's own judge and before the "expected layer unknown fails" rule (ladder/climb.py):
- an unknown verdict whose evidence shows the GPU ran out of memory becomes a skip naming the engine and the memory
  it holds: not measured, for that reason, said with what to do - not a box that cannot measure the layer (marked
  not_measured: a warn of the error counters after it never makes it a warn, their fail class still fails it);
- a figures layer (FIGURES: p2p_bandwidth, collectives) keeps its status and says it was measured beside the engine;
  a fail or a warn gets the remedy too. Nothing is ever softened: only an unknown with an out-of-memory in its own
  evidence changes status, and the error counters around the layer still raise it.
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import make
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

# The driver's and the collectives libraries' words for it: CUDA_ERROR_OUT_OF_MEMORY (cuMemAlloc, a context the driver
# could not create), hipErrorOutOfMemory, cudaErrorMemoryAllocation / hipErrorMemoryAllocation (runtime API),
# nccl-tests' "Cuda failure ... 'out of memory'", PyTorch's "CUDA out of memory" / torch.OutOfMemoryError.
OUT_OF_MEMORY = re.compile(r"OUT_OF_MEMORY|OutOfMemory|MemoryAllocation|\bout of memory\b", re.I)
# The layers whose figures the engine's traffic lowers (peer_access and nccl_transport judge what works, not how fast).
FIGURES = ("p2p_bandwidth", "collectives")
# The runtime evidence parts that run something on the GPUs (registry.PARTS).
GPU_PARTS = ("probe", "collectives", "nccl_transport")
MAX_LINES = 3
MAX_LINE = 200
MAX_DEPTH = 6
# The failure code of the out-of-memory skip (judged; ladder/codes.py gathers it): the layer's own unknown code follows
# it in `codes`.
CODES = {
    "RB-BESIDE-ENGINE-OOM": {
        "layer": "ladder",
        "title": "a runtime layer ran out of GPU memory beside a serving engine: not measured",
        "cause": "An engine held the GPUs while the layer ran (started by hand, or a serve unit left running with "
                 "p2p_verify_stop_serving false or in check mode) and the layer's probe or test ran out of GPU memory "
                 "beside it: the layer was not measured, for that reason, which is not a box that cannot measure it.",
        "measured": "The layer's own evidence says out of memory (CUDA_ERROR_OUT_OF_MEMORY, hipErrorOutOfMemory, "
                    "'out of memory') while the run's beside record names the engine and the GPU memory it holds.",
        "action": "Stop the engine for the runtime layers (p2p_verify_stop_serving true, not in check mode), or run "
                  "the verify when the engine is down; the verdict's remedy says how for this host.",
    },
}


def gpu_work(layers, options):
    """Whether LAYERS (registry.Layer) run anything on the GPUs, so that an engine beside them matters: the probe
    unless OPTIONS give its result, the collectives, the NCCL transport unless OPTIONS give its log."""
    parts = set(part for layer in layers if layer.phase == registry.RUNTIME for part in layer.needs)
    if options.get("probe_result"):
        parts.discard("probe")
    if options.get("log"):
        parts.discard("nccl_transport")
    return bool(parts & set(GPU_PARTS))


def _lines(value, found, depth=0):
    """The lines of the strings in VALUE (dicts and lists walked, DEPTH bounded) that say out of memory, into FOUND
    (at most MAX_LINES, each at most MAX_LINE characters, each once)."""
    if len(found) >= MAX_LINES or depth > MAX_DEPTH:
        return found
    if isinstance(value, str):
        for line in value.splitlines():
            if OUT_OF_MEMORY.search(line):
                line = " ".join(line.split())[:MAX_LINE]
                if line not in found:
                    found.append(line)
                if len(found) >= MAX_LINES:
                    break
    elif isinstance(value, dict):
        for item in value.values():
            _lines(item, found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _lines(item, found, depth + 1)
    return found


def out_of_memory(evidence, parts):
    """The lines of the evidence PARTS (a layer's registry.Layer.needs) that say the GPU ran out of memory."""
    found = []
    for part in parts:
        _lines((evidence or {}).get(part), found)
    return found


def memory_text(memory):
    """"35600 MiB of the GPUs' 40960 MiB (GPU0 17800/20480 MiB, GPU1 17800/20480 MiB)", or why it is not known."""
    memory = memory or {}
    if memory.get("used_mib") is None:
        return "an amount of GPU memory not read (%s)" % (memory.get("error") or "no reading")
    text = "%d MiB of the GPUs' %s MiB" % (memory["used_mib"], memory.get("total_mib") or "?")
    gpus = ["GPU%s %s/%s MiB" % (g.get("gpu"), g.get("used_mib"), g.get("total_mib")) for g in memory.get("gpus") or []]
    return text + (" (%s)" % ", ".join(gpus) if len(gpus) > 1 else "")


def engines_text(beside):
    engines = list((beside or {}).get("engines") or [])
    return " and ".join(engines) if engines else "an engine"


def judged(verdict, parts, evidence, beside):
    """VERDICT of a runtime layer whose evidence PARTS were collected while BESIDE (the module doc) ran; VERDICT
    itself when nothing ran beside it."""
    if not beside or not beside.get("engines"):
        return verdict
    engines, memory = engines_text(beside), memory_text(beside.get("memory"))
    remedy = beside.get("remedy") or ""
    oom = out_of_memory(evidence, parts)
    if verdict["status"] == "unknown" and oom:
        out = make(verdict["layer"], "skip",
                   measured={"out_of_memory": oom, "beside": list(beside["engines"]),
                             "gpu_memory_used_mib": (beside.get("memory") or {}).get("used_mib")},
                   expected=verdict.get("expected"),
                   why="skipped: %s holds %s, and the layer ran out of GPU memory beside it (%s); not measured"
                       % (engines, memory, oom[0]),
                   remedy=remedy, codes=["RB-BESIDE-ENGINE-OOM"] + _own_codes(verdict))
        out["beside"] = list(beside["engines"])
        out["not_measured"] = True  # a warn of the error counters leaves it a skip (judges/error_counters.worsen)
        return out
    if verdict["layer"] not in FIGURES or verdict["status"] == "skip":
        return verdict
    out = dict(verdict, beside=list(beside["engines"]))
    out["why"] = "%s; measured beside %s, which holds %s: its traffic can lower these figures" % (
        verdict.get("why") or verdict["status"], engines, memory)
    if verdict["status"] in ("fail", "warn") and remedy:
        out["remedy"] = ((verdict.get("remedy") or "") + " " + remedy).strip()
    return out


def _own_codes(verdict):
    return list(verdict.get("codes") or ([verdict["code"]] if verdict.get("code") else []))


def not_measured(names, why, remedy=""):
    """A skip verdict for each runtime layer of NAMES that this run chose not to measure, saying WHY."""
    return [make(name, "skip", why=why, remedy=remedy) for name in names]
