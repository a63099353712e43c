# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Count the hardware error lines of a kernel log (`journalctl -k -b -o short-monotonic --no-pager`, or dmesg).

Pure function `parse(text) -> dict`; standard library only, Python 3.8+. Any line prefix (journald's
`[  12.345678] host kernel: `, dmesg's `[  12.345678] `, `--ctime`) is fine: the patterns search inside a line.

Categories (sources: the kernel's AER sysfs ABI, Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats; the
log patterns of leptonai/gpud and Meta's GCM check-syslogs; the kernel's own IOMMU fault messages):
- xid: NVIDIA Xid lines, `NVRM: Xid.*?: (\\d+),` (leptonai/gpud); the Xid numbers are kept.
- amdgpu_reset: amdgpu ring timeouts (`ring gfx_0.0.0 timeout`) and resets (`GPU reset begin!`).
- iommu_fault: Intel `DMAR: [DMA Read|DMA Write ...] Request device [..] fault addr` and `[INTR-REMAP]`
  lines (drivers/iommu/intel/dmar.c), AMD `AMD-Vi: Event logged [IO_PAGE_FAULT ...` (drivers/iommu/amd/iommu.c;
  the event may be split over two lines, so IO_PAGE_FAULT is matched alone). These are ratelimited: counts are
  occurrences, not exact totals.
- aer_fatal, aer_nonfatal, aer_corrected: the AER driver's "error received" lines (the sysfs counters are the
  authority; these lines are what a verdict quotes).
Each category keeps its count and its last KEEP_LINES lines (bounded), stripped.
"""

from __future__ import annotations

import re

KEEP_LINES = 20
XID_RE = re.compile(r"NVRM: Xid.*?: (\d+),")
CATEGORIES = (
    ("xid", XID_RE),
    ("amdgpu_reset", re.compile(r"amdgpu.*?(?:GPU reset begin|ring \S+ timeout)")),
    ("iommu_fault", re.compile(r"DMAR: \[(?:DMA (?:Read|Write)|INTR-REMAP)[^\]]*\].*fault|IO_PAGE_FAULT")),
    ("aer_fatal", re.compile(r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Fatal\) error")),
    ("aer_nonfatal", re.compile(r"AER: (?:Multiple )?Uncorrect(?:ed|able) \(Non-Fatal\) error")),
    ("aer_corrected", re.compile(r"AER: (?:Multiple )?Correct(?:ed|able) error")),
)
NAMES = tuple(name for name, _ in CATEGORIES)
# A kernel log line: dmesg's `[  12.345678]` or `[Fri Aug 30 11:43:09 2024]` (--ctime), journald's `host kernel: `.
KERNEL_LINE_RE = re.compile(r"^\s*\[\s*\d+\.\d+\]|^\s*\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
                            r"|^\S.* kernel: ")


def is_kernel_line(line):
    """Whether LINE carries a kernel log's prefix (dmesg's, --ctime's or journald's)."""
    return bool(KERNEL_LINE_RE.match(line or ""))


def empty():
    """The parse of a log with no error line."""
    out = dict((name, {"count": 0, "lines": []}) for name in NAMES)
    out["xid"]["numbers"] = {}
    return out


def classify(line):
    """(category, Xid number or None) of one log line, or (None, None)."""
    for name, pattern in CATEGORIES:
        match = pattern.search(line)
        if match:
            return name, (int(match.group(1)) if name == "xid" else None)
    return None, None


def _lines(text):
    """TEXT's lines as given: TEXT is the whole log (a str) or an iterable of lines (an open file, read as it is
    iterated)."""
    if text is None or isinstance(text, str):
        return (text or "").splitlines()
    return (line for chunk in text for line in chunk.splitlines())


def parse(text, keep=KEEP_LINES):
    """{category: {count, lines (the last KEEP), and for xid numbers {"79": 1}}, "lines_read": N}."""
    out = empty()
    read = 0
    for line in _lines(text):
        read += 1
        name, xid = classify(line)
        if name is None:
            continue
        entry = out[name]
        entry["count"] += 1
        entry["lines"].append(line.strip())
        if len(entry["lines"]) > keep:
            del entry["lines"][0]
        if xid is not None:
            entry["numbers"][str(xid)] = entry["numbers"].get(str(xid), 0) + 1
    out["lines_read"] = read
    return out
