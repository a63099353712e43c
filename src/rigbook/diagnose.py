"""`provision diagnose FILE... | -`: the P2P ladder's judgement on pasted tool outputs; contacts no host.

Each input is read bounded (parse_cmd.bounded_lines: at most 64 MiB or a million lines), split into the tool outputs
it holds (parse/paste.split), made into the ladder's evidence (collect/pasted_evidence) and judged by the registry's
own judges through the one climb (ladder/climb.climb with the evidence given: nothing is collected). A layer no
paste covers is `unknown (not in the pastes)`. The facts a judge needs and a paste rarely shows (the GPU's VRAM,
its PCIe generation and width, whether the owner expects P2P) come from the command line. Exit codes as verify:
0 nothing failed, 1 a layer (or the kernel log) failed, 2 bad input (nothing recognised in it, an unreadable file).
docs/diagnose.md.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

from rigbook import display, parse_cmd
from rigbook.errors import UserError
from rigbook.paths import link_collection

NOT_IN_PASTES = "not in the pastes"
PCIE_RE = re.compile(r"^(?:gen)?([1-6])\s*[x:]\s*(1|2|4|8|16|32)$", re.IGNORECASE)


@dataclass
class Facts:
    """What the owner says of the box (the command line's --vendor, --gpus, --vram-gib, --pcie, --p2p)."""

    vendor: str | None = None
    gpus: int | None = None
    vram_gib: float | None = None
    pcie: str | None = None
    p2p: str | None = None


def pcie_of(text: str | None) -> dict:
    """{"gen", "width"} of "3x16" / "gen3:16"; UserError for anything else."""
    if text is None:
        return {}
    match = PCIE_RE.match(text.strip())
    if not match:
        raise UserError(f"--pcie {text!r}: give the generation and width as GENxWIDTH, e.g. 3x16")
    return {"gen": int(match.group(1)), "width": int(match.group(2))}


def ladder_view_of(facts: Facts, shown: dict) -> dict:
    """The ladder view the judges read (host_model.ladder_view's shape): the command line's facts over what the
    pastes show (SHOWN: {"vendor", "gpus"}); P2P expected only when the owner says so or two GPUs are seen."""
    if facts.gpus is not None and not 1 <= facts.gpus <= 64:
        raise UserError(f"--gpus {facts.gpus}: between 1 and 64")
    if facts.vram_gib is not None and not 0 < facts.vram_gib <= 1024:
        raise UserError(f"--vram-gib {facts.vram_gib}: more than 0 and at most 1024")
    gpu = {"vendor": facts.vendor or shown.get("vendor"), "count": facts.gpus or shown.get("gpus")}
    if facts.vram_gib or shown.get("vram_gib"):
        gpu["vram_gib"] = facts.vram_gib or shown["vram_gib"]
    if facts.pcie:
        gpu["pcie"] = pcie_of(facts.pcie)
    view = {"gpu": {k: v for k, v in gpu.items() if v is not None}, "pins": {}}
    if facts.p2p is not None:
        view["p2p"] = {"expected": facts.p2p == "yes",
                       "reason": f"the owner's --p2p {facts.p2p} (provision diagnose)"}
    return view


def read_parts(files: list) -> list:
    """The parts of every input (parse/paste.split), each with its `file`; UserError (exit 2) for an unreadable or
    endless input."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.parse import paste
    from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

    parts = []
    for file in files:
        where = "stdin" if file == "-" else file
        with parse_cmd.open_input(file) as handle:
            try:
                lines = [parse_text.clean_line(parse_text.normalise(line).rstrip("\n"))
                         for line in parse_cmd.bounded_lines(handle, {"kernel": 0}, where)]
            except OSError as exc:
                raise UserError(f"cannot read {file}: {exc.strerror or exc}") from None
        for part in paste.split(lines):
            part["file"] = where
            parts.append(part)
    return parts


def judge(parts: list, facts: Facts) -> dict:
    """{"ladder": verdicts in ladder order, "kernel_log": a verdict or None, "parts": what was read, "facts": the
    ladder view} of PARTS."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pasted_evidence
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges import error_counters, verdict
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb, registry
    from ansible_collections.rigbook.homelab.plugins.module_utils.parse import paste

    evidence, shown, used = pasted_evidence.evidence_of(parts)
    view = ladder_view_of(facts, shown)
    covered = {layer for part in used for layer in pasted_evidence.LAYERS_OF.get(part, ())}
    judged, _ = climb.climb([layer for layer in registry.LAYERS if layer.name in covered],
                            climb.Context("/", view), stop_at_fail=False, evidence=dict(evidence, root="the pastes"))
    by_name = {v["layer"]: v for v in judged}
    ladder = []
    for layer in registry.LAYERS:
        if layer.name in by_name:
            ladder.append(dict(by_name[layer.name], read_from=_read_from(used, layer.name, pasted_evidence)))
        else:
            ladder.append(verdict.make(layer.name, "unknown", None, layer.summary, NOT_IN_PASTES,
                                       _wanted_for(layer.name)))
    kernel = None
    if "kernel_log" in evidence:
        result = error_counters.judge(evidence["kernel_log"])
        log = evidence["kernel_log"]["log"]
        counts = {name: log[name]["count"] for name in log if isinstance(log[name], dict) and log[name]["count"]}
        # the error counters' own code when their judgement names one (docs/codes.md)
        kernel = verdict.make("kernel_log", result["status"], counts or {"error lines": 0},
                              "no hardware error line (AER, Xid, IOMMU fault, GPU reset)",
                              "; ".join(result["problems"] + result["notes"]) or "no hardware error line in the log",
                              " ".join(result["remedies"]) if result["status"] != "pass" else "",
                              code=result.get("code"), codes=result.get("codes"))
        kernel["read_from"] = _places(used["kernel_log"])
    judged_ids = {id(p) for parts_used in used.values() for p in parts_used}
    listed = []
    for part in parts:
        judged_here = id(part) in judged_ids
        entry = {"file": part["file"], "first": part["first"], "last": part["last"], "kind": part["kind"],
                 "title": paste.TITLES.get(part["kind"], part["kind"]), "command": part.get("command"),
                 "judged": judged_here}
        if not judged_here:
            entry["why_not"] = _why_not(part, pasted_evidence, any(
                id(other) in judged_ids and other["kind"] == part["kind"] for other in parts))
        listed.append(entry)
    return {"ladder": ladder, "kernel_log": kernel, "parts": listed, "facts": view}


def _places(parts: list) -> list:
    return [f"{p['file']} lines {p['first']}-{p['last']}" for p in parts]


def _read_from(used: dict, layer: str, pasted_evidence) -> list:
    return _places([p for key, parts in used.items() if layer in pasted_evidence.LAYERS_OF.get(key, ())
                    for p in parts])


def _wanted_for(layer: str) -> str:
    """What to paste for a LAYER no paste covers."""
    return {
        "firmware": "Paste `sudo lspci -vv` of the GPUs (their Region and Resizable BAR lines).",
        "pcie_link": "Paste `sudo lspci -vv` of the GPUs (LnkCap / LnkSta).",
        "dma_window": "Paste `sudo lspci -vv` of the GPUs (their Region lines).",
        "kernel_state": "Judged on the box itself: `provision verify` (or a snapshot replayed).",
        "driver_state": "Judged on the box itself: `provision verify` (or a snapshot replayed).",
        "peer_access": "Paste p2pBandwidthLatencyTest's output, or `nvidia-smi topo -p2p r`.",
        "p2p_bandwidth": "Paste p2pBandwidthLatencyTest's output (its P2P=Enabled and P2P=Disabled matrices).",
        "collectives": "Paste nccl-tests / rccl-tests output (all_reduce_perf, sendrecv_perf).",
        "nccl_transport": "Paste a run's log with NCCL_DEBUG=INFO (its `Channel ... via` lines).",
        "serving": "Judged on the box itself: `provision verify --tags serving`.",
    }.get(layer, "")


def _why_not(part: dict, pasted_evidence, kind_judged: bool) -> str:
    """Why PART was not judged; KIND_JUDGED: another part of its kind was."""
    if part["kind"] == "unrecognised":
        return "no tool output rigbook reads was recognised in these lines"
    if part["kind"] not in pasted_evidence.JUDGED_KINDS:
        return "recognised; no judge reads this kind yet"
    if kind_judged:
        return "set aside: another part of the same kind is the one judged (the later, or the measured one)"
    return "recognised; it holds nothing a judge reads (a topo table of one GPU, a header without rows)"


def main(files: list, as_json: bool, facts: Facts) -> int:
    parts = read_parts(files)
    if not any(part["kind"] != "unrecognised" for part in parts):
        where = ", ".join("stdin" if f == "-" else f for f in files)
        raise UserError(f"{where}: no tool output rigbook reads was found (docs/diagnose.md lists the kinds: lspci "
                        "-vv, nvidia-smi -q / topo, NCCL/RCCL logs, nccl-tests, p2pBandwidthLatencyTest, dmesg, ...); "
                        "nothing judged")
    result = judge(parts, facts)
    statuses = [v["status"] for v in result["ladder"]] + ([result["kernel_log"]["status"]]
                                                          if result["kernel_log"] else [])
    code = 1 if "fail" in statuses else 0
    if as_json:
        sys.stdout.write(json.dumps(dict(result, exit_code=code), indent=2) + "\n")
        return code
    console = display.make_console(sys.stdout)
    for part in result["parts"]:
        command = f" (after `{part['command']}`)" if part["command"] else ""
        state = "judged" if part["judged"] else part["why_not"]
        console.print(display.terminal_safe(f"read {part['file']} lines {part['first']}-{part['last']}: "
                                            f"{part['title']}{command}: {state}"))
    covered = [v for v in result["ladder"] if v["why"] != NOT_IN_PASTES]
    display.print_ladder(console, "the pastes", covered + ([result["kernel_log"]] if result["kernel_log"] else []))
    for v in result["ladder"]:
        if v["why"] == NOT_IN_PASTES:
            coded = f" [{v['code']}]" if v.get("code") else ""
            console.print(display.terminal_safe(f"  {v['layer']}: unknown{coded} ({NOT_IN_PASTES}): {v['remedy']}"))
    console.print(display.terminal_safe(f"diagnose: {'FAILED' if code else 'nothing failed'} "
                                        f"({len(covered)} of {len(result['ladder'])} layers in the pastes)"))
    return code
