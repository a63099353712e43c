# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hardware error counters around the runtime layers (all I/O; standard library only, Python 3.8+).

read_counters(root, gpus) reads, under the evidence root ("/" live, or a recorded tree laid out the same way):
- per GPU BDF and its parent (root) port, the AER totals of sysfs aer_dev_correctable / aer_dev_nonfatal /
  aer_dev_fatal (their TOTAL_ERR_* lines) and, on root ports only, aer_rootport_total_err_cor / _nonfatal /
  _fatal (cumulative over the hierarchy below the port). A file that is not there reads None (unknown), never 0.
- the kernel log since boot: live `journalctl -k -b -o short-monotonic --no-pager` (the journal, not the dmesg
  ring buffer, which wraps); under a recorded tree var/lib/rigbook/commands/kernel-log.txt
  (facts/runner.recorded_or_live). No log: None.
  Counted by parse/kernel_log.py (Xid lines and numbers, amdgpu resets / ring timeouts, DMAR / AMD-Vi faults,
  AER lines), each category keeping its last lines.
delta(before, after) is what rose between two readings; before None means "since boot" (a first run).
load_state / store_state keep a host's last reading in STATE_FILE (the ladder's error_state option).
"""

from __future__ import annotations

import os
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pci
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as recorded
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import kernel_log

STATE_FILE = "/var/lib/rigbook/error-counters.json"
KERNEL_LOG_ARGV = ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager"]
KERNEL_LOG_RECORDING = "kernel-log"  # var/lib/rigbook/commands/kernel-log.txt under a recorded tree
KERNEL_LOG_TIMEOUT_S = 60
# sysfs file -> (TOTAL_ERR_* key, counter name)
AER_DEV_FILES = (
    ("aer_dev_correctable", "TOTAL_ERR_COR", "correctable"),
    ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL", "nonfatal"),
    ("aer_dev_fatal", "TOTAL_ERR_FATAL", "fatal"),
)
AER_ROOTPORT_FILES = (
    ("aer_rootport_total_err_cor", "rootport_correctable"),
    ("aer_rootport_total_err_nonfatal", "rootport_nonfatal"),
    ("aer_rootport_total_err_fatal", "rootport_fatal"),
)
SEVERITY_OF = {"correctable": "correctable", "nonfatal": "nonfatal", "fatal": "fatal",
               "rootport_correctable": "correctable", "rootport_nonfatal": "nonfatal", "rootport_fatal": "fatal"}


def total_of(text, key):
    """The number on the KEY line of an aer_dev_* file ("TOTAL_ERR_COR 3"), or None."""
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == key:
            try:
                return int(fields[1])
            except ValueError:
                return None
    return None


def aer_counts(root, bdf):
    """{counter: int or None} of one PCI function: the aer_dev_* totals, plus the root-port totals where the
    function has them (root ports only). A missing file is None (unknown)."""
    base = os.path.join(pci.pci_devices_dir(root), bdf)
    counts = {}
    for name, key, counter in AER_DEV_FILES:
        counts[counter] = total_of(files.read_text(os.path.join(base, name)), key)
    for name, counter in AER_ROOTPORT_FILES:
        text = files.read_text(os.path.join(base, name))
        if text is not None:
            counts[counter] = recorded.parse_int(text)
    return counts


def kernel_log_text(root):
    """(text or None, source): the journal's kernel messages of this boot live, the recording elsewhere."""
    return runner.recorded_or_live(root, KERNEL_LOG_RECORDING, KERNEL_LOG_ARGV, KERNEL_LOG_TIMEOUT_S)


def _slots(gpus):
    """[(gpu BDF, its upstream port BDF or None)] from GPU dicts (pci.list_gpus) or plain BDF strings."""
    out = []
    for gpu in gpus or []:
        if isinstance(gpu, dict):
            out.append((gpu.get("slot"), gpu.get("upstream_port")))
        else:
            out.append((str(gpu), None))
    return [(slot, port) for slot, port in out if slot]


def read_counters(root, gpus):
    """A reading of the counters now: {"aer": {bdf: {counter: n}}, "devices": {bdf: what it is}, "log": parse or None,
    "log_source": text, "taken_at": epoch s}. GPUS: pci.list_gpus dicts or BDFs (their parent port is then read
    from sysfs)."""
    aer, devices = {}, {}
    for index, (slot, port) in enumerate(_slots(gpus)):
        port = pci.root_port(root, slot) or port  # the root port, past a card's own switch (the R9700's)
        aer[slot] = aer_counts(root, slot)
        devices[slot] = "GPU%d %s" % (index, slot)
        if port:
            aer[port] = aer_counts(root, port)
            devices[port] = "root port %s of GPU%d" % (port, index)
    text, source = kernel_log_text(root)
    return {"aer": aer, "devices": devices, "log": kernel_log.parse(text) if text is not None else None,
            "log_source": source, "taken_at": int(time.time())}


def _rise(before, after):
    """after - before of one counter; a drop means the counter was reset (a reboot): the rise is then AFTER.
    None when AFTER is unknown; AFTER when BEFORE is unknown."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def _aer_delta(before, after):
    out = {}
    for bdf, counts in (after or {}).items():
        old = (before or {}).get(bdf) or {}
        for counter, value in counts.items():
            rise = _rise(old.get(counter), value)
            if rise:
                out.setdefault(bdf, {})[counter] = rise
    return out


def _log_delta(before, after):
    """{category: {count, lines (the new ones, as far as kept), numbers (xid: of the new lines)}} of what rose."""
    out = {}
    for name in kernel_log.NAMES:
        new = (after or {}).get(name) or {}
        old = (before or {}).get(name) or {}
        rise = _rise(old.get("count"), new.get("count"))
        if not rise:
            continue
        lines = list(new.get("lines") or [])[-rise:]
        entry = {"count": rise, "lines": lines}
        if name == "xid":
            numbers = {}
            for line in lines:
                number = kernel_log.classify(line)[1]
                if number is not None:
                    numbers[str(number)] = numbers.get(str(number), 0) + 1
            entry["numbers"] = numbers
        out[name] = entry
    return out


def delta(before, after):
    """What rose from BEFORE to AFTER (readings): {"aer": {bdf: {counter: rise}}, "log": {category: ...},
    "devices", "since_boot": BEFORE is None, "unknown": [what could not be read]}. BEFORE None: every count
    of AFTER is taken as risen since boot."""
    before = before or {}
    unknown = []
    for bdf, counts in sorted((after.get("aer") or {}).items()):
        missing = sorted(c for c, v in counts.items() if v is None)
        if missing:
            unknown.append("%s: no %s counter" % (bdf, "/".join(missing)))
    if after.get("log") is None:
        unknown.append("kernel log: %s" % after.get("log_source"))
    log_before = before.get("log")
    if before and log_before is None and after.get("log") is not None:
        unknown.append("kernel log: not read before (%s); its lines are counted since boot"
                       % before.get("log_source"))
    return {
        "aer": _aer_delta(before.get("aer"), after.get("aer")),
        "log": _log_delta(log_before, after.get("log")),
        "devices": dict(after.get("devices") or {}),
        "since_boot": not before,
        "unknown": unknown,
    }


def load_state(path):
    """(the reading stored at PATH or None, error text or None)."""
    data, error = files.read_json(path) if path else (None, None)
    if error:
        return None, "not valid JSON or unreadable (%s); taken as no earlier reading" % error
    if data is None:
        return None, None
    if not isinstance(data, dict) or not isinstance(data.get("aer"), dict):
        return None, "%s holds no reading; taken as no earlier reading" % path
    return data, None


def store_state(path, reading):
    """Write READING to PATH atomically (facts/files.write_json: parents created); the error text, or None."""
    return files.write_json(path, reading)


def reading_part(ctx, evidence):
    """The climb's reading (ladder/error_watch.py): the GPUs the static part found, else listed from sysfs."""
    gpus = evidence.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        gpus, _ = pci.list_gpus(ctx.root)
    return read_counters(ctx.root, gpus)
