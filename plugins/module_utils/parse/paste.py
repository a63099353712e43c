# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Split a paste into the tool outputs it holds and name the kind of each (pure; standard library only).

People paste what a forum thread needs in one block: shell prompts and `$ command` lines, `--` or code-fence
separators, cut lines (`...`, `[snip]`), timestamps, and several tools' outputs one after the other. This module
reads such a paste line by line and returns its parts, each {kind, first, last, lines, command}; `first`/`last` are
1-based line numbers of the paste.

The rule, in order:
1. A hard boundary ends a segment: a shell prompt with a command (`$ lspci -vv`, `user@box:~$ ...`, `# nvidia-smi
   ...` when a known tool follows `#`), a code fence (```), a line of dashes (`--`, `-----`) or of `~` / `_`.
   Lines of `=` are not boundaries: nvidia-smi -q and rocm-smi print them inside their own output.
2. In a segment, the lines of a *scanned* kind (SCANNED: NCCL/RCCL log lines, kernel log lines) belong to that kind
   wherever they stand: nccl-tests run with NCCL_DEBUG=INFO interleaves INFO lines with its table, and each parser
   reads its own lines only.
3. The other lines form *block* parts: a line that shows a block kind's signature starts a part of that kind (or
   goes on with it); a line with no signature stays with the part it follows. A line that starts a new run of
   the same kind (an nccl-tests header `# nThread`, a new p2pBandwidthLatencyTest banner) starts a new part.
   A segment introduced by a command that names a kind (`$ lspci -tv`) starts in that kind.
4. Lines before any signature in a segment form an `unrecognised` part (reported, never judged).
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import kernel_log
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl

UNRECOGNISED = "unrecognised"
SCANNED = ("nccl-log", "kernel-log")
BLOCKS = ("lspci", "lspci-tree", "nvidia-smi-q", "nvidia-smi-topo", "nccl-tests", "p2p-bandwidth",
          "rocm-smi-topo", "transferbench")
KINDS = BLOCKS + SCANNED

# What each kind is, in words (the report names the kind it read).
TITLES = {
    "lspci": "lspci -v/-vv/-vvv",
    "lspci-tree": "lspci -tv",
    "nvidia-smi-q": "nvidia-smi -q",
    "nvidia-smi-topo": "nvidia-smi topo -m / -p2p",
    "nccl-tests": "nccl-tests / rccl-tests",
    "p2p-bandwidth": "p2pBandwidthLatencyTest",
    "rocm-smi-topo": "rocm-smi --showtopo",
    "transferbench": "TransferBench",
    "nccl-log": "NCCL / RCCL log",
    "kernel-log": "dmesg / journalctl -k",
    UNRECOGNISED: "not recognised",
}

# The tools a `# command` line may name (a bare `#` is also nccl-tests' comment mark, so it needs a known word).
_TOOLS = (r"(?:sudo\s+)?(?:\S*/)?(?:lspci|nvidia-smi|dmesg|journalctl|rocm-smi|amd-smi|rocminfo|\S+_perf|"
          r"p2pBandwidthLatencyTest|simpleP2P|TransferBench|mpirun|torchrun|python3?|NCCL_\w+=\S*|env)\b")
_PROMPT_RE = re.compile(
    r"^\s*(?:\([\w.-]+\)\s*)?"  # a venv / conda prefix
    r"(?:[\w.-]+@[\w.-]+(?::\S*)?\s*[$#%]|\$|>)\s+(?P<cmd>\S.*)$"
    r"|^\s*#\s+(?P<rootcmd>" + _TOOLS + r".*)$"
)
_FENCE_RE = re.compile(r"^\s*(?:`{3,}|~{3,})")
_RULE_RE = re.compile(r"^\s*(?:-{2,}|_{3,})\s*$")

# A command that names its kind: the segment it introduces starts in that kind.
_COMMAND_KINDS = (
    (re.compile(r"\blspci\b.*\s-\w*t"), "lspci-tree"),
    (re.compile(r"\blspci\b"), "lspci"),
    (re.compile(r"\bnvidia-smi\s+topo\b"), "nvidia-smi-topo"),
    (re.compile(r"\bnvidia-smi\b.*\s-q\b"), "nvidia-smi-q"),
    (re.compile(r"\b(?:dmesg|journalctl)\b"), "kernel-log"),
    (re.compile(r"\w+_perf\b"), "nccl-tests"),
    (re.compile(r"\bp2pBandwidthLatencyTest\b"), "p2p-bandwidth"),
    (re.compile(r"\brocm-smi\b.*--showtopo"), "rocm-smi-topo"),
    (re.compile(r"\bTransferBench\b"), "transferbench"),
)

# Signatures of the block kinds: (kind, pattern searched in the line, whether a match starts a new run of the kind).
_LSPCI_HEADER_RE = re.compile(r"^\s*(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s+"
                              r"[A-Za-z0-9][^:\[]*(?:\[[0-9a-fA-F]{4}\])?:\s")
_SIGNATURES = (
    ("p2p-bandwidth", re.compile(r"P2P \(Peer-to-Peer\) GPU Bandwidth Latency Test"), True),
    ("p2p-bandwidth", re.compile(r"P2P Connectivity Matrix|P2P=(?:Enabled|Disabled) (?:Bandwidth|Latency)|"
                                 r"Device=\d+\s+(?:CAN|CANNOT) Access Peer|pciBusID:\s*[0-9a-fA-F]+,"), False),
    ("nvidia-smi-q", re.compile(r"=+\s*NVSMI LOG\s*=+"), True),
    ("nvidia-smi-q", re.compile(r"^\s*(?:Attached GPUs|Driver Version|CUDA Version|Product Name|Bus Id|GPU UUID|"
                                r"VBIOS Version|Persistence Mode|Compute Mode|Minor Number)\s+:|"
                                r"^\s*(?:FB Memory Usage|BAR1 Memory Usage|PCIe Generation|Link Width)\s*$"), False),
    ("nvidia-smi-topo", re.compile(r"^\s*(?:\S.*?\s)?GPU0(?:\s+(?:GPU|NIC|mlx)\w*)*\s+(?:GPU1|NIC0|CPU Affinity)\b|"
                                   r"^\s*X\s+=\s+Self|^\s*(?:CNS|GNS|TNS|NS)\s+=\s+|^\s*OK\s+=\s+Status Ok|"
                                   r"^\s*(?:PIX|PXB|PHB|NODE|SYS|NV#)\s+=\s+Connection"), False),
    ("nccl-tests", re.compile(r"^\s*#\s*nThread\s+\d|Collective test starting"), True),
    ("nccl-tests", re.compile(r"^\s*#\s*(?:Using devices|Avg bus bandwidth|Out of bounds values|Rank\s+\d+ Group)|"
                              r"^\s*#?\s*size\s+count\s+type\b|^\s*#\s+\(B\)\s+\(elements\)"), False),
    ("rocm-smi-topo", re.compile(r"ROCm System Management Interface|(?:Weight|Hops|Link Type) between two GPUs"),
     False),
    ("transferbench", re.compile(r"\bTransferBench\b"), False),
    ("lspci-tree", re.compile(r"^[\s|`+\\-]*-\[[0-9a-fA-F]{4}:[0-9a-fA-F]{2}\]-|^[\s|]*[+`\\]-[0-9a-fA-F]{2}\.[0-7]"),
     False),
    ("lspci", re.compile(r"^\s+(?:Region \d+:|LnkCap:|LnkSta:|Capabilities: \[|Kernel driver in use:)"), False),
)
# The NCCL/RCCL log lines: INFO / WARN lines and the version banner.
_NCCL_LINE_RE = re.compile(r"\b[NR]CCL (?:INFO|WARN|TRACE)\b|\b[NR]CCL version \d")


def scanned_kind(line):
    """The scanned kind of LINE ("nccl-log", "kernel-log") or None."""
    if _NCCL_LINE_RE.search(line) or parse_nccl.failure_of(line):
        return "nccl-log"
    if kernel_log.is_kernel_line(line) or kernel_log.classify(line)[0] is not None:
        return "kernel-log"
    return None


def block_kind(line):
    """(kind, starts a new run) of a line that shows a block kind's signature, else (None, False)."""
    for kind, pattern, starts in _SIGNATURES:
        if pattern.search(line):
            return kind, starts
    if _LSPCI_HEADER_RE.match(line):
        return "lspci", False
    if parse_nccl.result_row(line) is not None:
        return "nccl-tests", False
    return None, False


# A segment that goes on with the kind before a `--` line is hinted as _CARRY + kind (never a part's command).
_CARRY = "\0carry:"


def command_kind(command):
    """The kind a pasted command's output is (`lspci -tv` -> lspci-tree), or None."""
    if command and command.startswith(_CARRY):
        return command[len(_CARRY):]
    for pattern, kind in _COMMAND_KINDS:
        if pattern.search(command or ""):
            return kind
    return None


def boundary(line):
    """(is a hard boundary, the command it names or None)."""
    match = _PROMPT_RE.match(line)
    if match:
        return True, (match.group("cmd") or match.group("rootcmd")).strip()
    if _FENCE_RE.match(line) or _RULE_RE.match(line):
        return True, None
    return False, None


class _Part:
    def __init__(self, kind, command=None):
        self.kind = kind
        self.command = command
        self.numbered = []
        self.body = False  # a line of the kind's own (not its start banner) was added: a new banner is a new run

    def add(self, number, line, body=True):
        self.numbered.append((number, line))
        self.body = self.body or body

    def out(self):
        return {"kind": self.kind, "command": self.command, "first": self.numbered[0][0],
                "last": self.numbered[-1][0], "lines": [line for _, line in self.numbered]}


def _segment_parts(numbered, command):
    """The parts of one segment (NUMBERED: [(line number, line)]) introduced by COMMAND (or None)."""
    parts, scanned = [], {}
    hinted = command_kind(command)
    if command and command.startswith(_CARRY):
        command = None
    current = None
    if hinted in BLOCKS:
        current = _Part(hinted, command)
        parts.append(current)
    for number, line in numbered:
        kind = scanned_kind(line)
        if kind is None and hinted in SCANNED and line.strip() and block_kind(line)[0] is None:
            kind = hinted  # `dmesg -t` and the like: the command says what its lines are
        if kind is not None:
            if kind not in scanned:
                scanned[kind] = _Part(kind, command if hinted == kind else None)
                parts.append(scanned[kind])
            scanned[kind].add(number, line)
            continue
        kind, starts = block_kind(line)
        if kind is not None and (current is None or current.kind != kind or (starts and current.body)):
            current = _Part(kind, command if hinted == kind else None)
            parts.append(current)
        elif current is None:
            if not line.strip():
                continue
            current = _Part(UNRECOGNISED, command)
            parts.append(current)
        current.add(number, line, body=not starts)
    return [p for p in parts if any(line.strip() for _, line in p.numbered)]


def split(lines):
    """The parts of a paste (LINES: its normalised lines, parse/text.lines), in order of their first line:
    [{kind, command, first, last, lines}]. A part's COMMAND is the `$ command` that introduced it, when one did.
    A segment after a line of dashes (grep -A's `--` between its matches) that starts with no signature goes on with
    the block kind the segment before it ended in."""
    out = []
    numbered = []
    command = None
    for number, line in enumerate(lines, 1):
        hard, named = boundary(line)
        if hard:
            parts = _segment_parts(numbered, command)
            out.extend(parts)
            blocks = [p for p in parts if p.kind in BLOCKS]
            carried = blocks[-1].kind if blocks and named is None and _RULE_RE.match(line) else None
            numbered, command = [], named if named is not None else (_CARRY + carried if carried else None)
            continue
        numbered.append((number, line))
    out.extend(_segment_parts(numbered, command))
    return sorted((part.out() for part in out), key=lambda part: part["first"])
