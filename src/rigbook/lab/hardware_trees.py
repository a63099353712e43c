"""Recorded hardware trees: lab rigs (YAML) and the materializer that lays them out.

A lab rig (rigs/<name>.yml) describes one box at the evidence boundary: its PCI functions
with their BARs and links, kernel release and command line, loaded modules, literal files and
recorded command outputs. `materialize(name, dest)` writes that as the tree of docs/evidence.md:
real directories nested under their upstream port, relative symlinks in sys/bus/pci/devices.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

import yaml

from rigbook.errors import UserError

RIGS_DIR = Path(__file__).resolve().parent / "rigs"
COMMANDS_DIR = "var/lib/rigbook/commands"
RESOURCE_LINES = 13  # 6 BARs, the ROM, 6 SR-IOV BARs: what sysfs prints for an endpoint
ROM_LINE = 6
# struct resource flags as sysfs `resource` prints them (IORESOURCE_* | PCI_BASE_ADDRESS_*).
BAR_FLAGS = {
    "mem32": 0x40200,
    "mem32pref": 0x42208,
    "mem64pref": 0x14220C,
    "io": 0x40101,
    "rom": 0x46200,
}
_SIZE_RE = re.compile(r"^(\d+)\s*([KMGT]?)i?B?$")


def rig_names() -> list:
    return sorted(p.stem for p in RIGS_DIR.glob("*.yml"))


@lru_cache(maxsize=None)
def _load(name: str) -> dict:
    with open(RIGS_DIR / f"{name}.yml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_rig(name: str) -> dict:
    """The rig NAME as a dict (a fresh copy); UserError when there is no such rig."""
    if name not in rig_names():
        raise UserError(f"unknown lab rig {name!r} (known: {', '.join(rig_names())})")
    return json.loads(json.dumps(_load(name)))


def parse_size(value) -> int:
    """256M, 32G, 512K, 128 -> bytes (binary units)."""
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value).strip())
    if not m:
        raise ValueError(f"bad size {value!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


def functions(rig: dict) -> list:
    """Every PCI function below a root port, sorted by BDF, with its root port's BDF (`port`), its sysfs directory
    (`path`) and the directory of the device in its slot (`slot_path`: the function right below the root port on
    its way up, the card's switch upstream port on a card with an on-board PCIe switch). A function with
    `functions` of its own is a bridge (a switch port): those sit below it, as in sysfs."""
    out = []

    def walk(fns, port, parent, slot_path):
        for fn in fns:
            path = f"{parent}/{fn['bdf']}"
            entry = {k: v for k, v in fn.items() if k != "functions"}
            out.append(dict(entry, port=port, path=path, slot_path=slot_path or path,
                            bridge="functions" in fn))
            walk(fn.get("functions") or [], port, path, slot_path or path)

    for port in rig["pci"]["ports"]:
        walk(port.get("functions", []), port["bdf"], f"sys/devices/pci0000:00/{port['bdf']}", None)
    return sorted(out, key=lambda f: f["bdf"])


def gpus(rig: dict) -> list:
    """Display-class functions in BDF order: the GPUs faults address by index."""
    return [f for f in functions(rig) if str(f["class"]).lower().startswith("0x03")]


def device_dir(fn_or_port: dict) -> str:
    """Path (relative to the tree root) of the real sysfs directory of a function or port."""
    if "path" in fn_or_port:
        return fn_or_port["path"]
    return f"sys/devices/pci0000:00/{fn_or_port['bdf']}"


def resource_text(bars: list) -> str:
    lines = [(0, 0, 0)] * RESOURCE_LINES
    for bar in bars:
        index = ROM_LINE if bar["bar"] == "rom" else int(bar["bar"])
        start, size = int(bar["start"]), parse_size(bar["size"])
        lines[index] = (start, start + size - 1, BAR_FLAGS[bar["type"]])
    return "".join(f"0x{s:016x} 0x{e:016x} 0x{f:016x}\n" for s, e, f in lines)


def _write(root: Path, rel: str, content: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")


def _symlink(root: Path, rel: str, target: str) -> None:
    link = root / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


def _pci_ids(root: Path, d: str, item: dict) -> None:
    for key in ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision"):
        if key in item:
            _write(root, f"{d}/{key}", f"{item[key]}\n")


def _link(root: Path, d: str, link: dict) -> None:
    _write(root, f"{d}/current_link_speed", f"{link['speed']}\n")
    _write(root, f"{d}/current_link_width", f"{link['width']}\n")
    _write(root, f"{d}/max_link_speed", f"{link['max_speed']}\n")
    _write(root, f"{d}/max_link_width", f"{link['max_width']}\n")


def _bind(root: Path, d: str, bdf: str, driver: str) -> None:
    """driver -> ../../bus/pci/drivers/X and the driver's link back, relative as in sysfs."""
    depth = d.count("/")  # sys/devices/pci0000:00/<port>/<fn>: climb back to sys/
    _symlink(root, f"{d}/driver", "../" * (depth) + f"bus/pci/drivers/{driver}")
    _symlink(root, f"sys/bus/pci/drivers/{driver}/{bdf}", "../../../../" + d[len("sys/"):])


# sysfs AER statistics (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats), all zero: a healthy boot.
# The field names are those of drivers/pci/pcie/aer.c (aer_correctable_error_string / aer_uncorrectable_...).
AER_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
AER_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF",
                     "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked",
                     "TLPBlockedErr", "PoisonTLPBlocked")


def _aer(root: Path, d: str, root_port: bool) -> None:
    """Zero AER counters of a PCIe function; the aer_rootport_total_err_* files on root ports only."""
    for name, fields, total in (("aer_dev_correctable", AER_CORRECTABLE, "TOTAL_ERR_COR"),
                                ("aer_dev_nonfatal", AER_UNCORRECTABLE, "TOTAL_ERR_NONFATAL"),
                                ("aer_dev_fatal", AER_UNCORRECTABLE, "TOTAL_ERR_FATAL")):
        _write(root, f"{d}/{name}", "".join(f"{field} 0\n" for field in fields + (total,)))
    if root_port:
        for suffix in ("cor", "nonfatal", "fatal"):
            _write(root, f"{d}/aer_rootport_total_err_{suffix}", "0\n")


def _pci(root: Path, pci: dict) -> None:
    bridge = pci["host_bridge"]
    entries = [(device_dir(bridge), bridge)]
    for port in pci["ports"]:
        entries.append((device_dir(port), dict(port, driver="pcieport", root_port=True)))
    entries += [(device_dir(fn), dict(fn, driver="pcieport") if fn["bridge"] else fn)
                for fn in functions({"pci": pci})]
    for d, item in entries:
        (root / d).mkdir(parents=True, exist_ok=True)
        _pci_ids(root, d, item)
        if "link" in item:
            _link(root, d, item["link"])
        if "bars" in item:
            _write(root, f"{d}/resource", resource_text(item["bars"]))
        for bar, bitmap in (item.get("resize") or {}).items():
            _write(root, f"{d}/resource{bar}_resize", f"{bitmap}\n")
        if "numa_node" in item:
            _write(root, f"{d}/numa_node", f"{item['numa_node']}\n")
        if item is not bridge:
            _aer(root, d, root_port=bool(item.get("root_port")))
        if item.get("driver"):
            _bind(root, d, item["bdf"], item["driver"])
        _symlink(root, f"sys/bus/pci/devices/{item['bdf']}", "../../../" + d[len("sys/"):])


def _kernel(root: Path, rig: dict) -> None:
    kernel = rig["kernel"]
    release = kernel["release"]
    _write(root, "proc/cmdline", " ".join(kernel["cmdline"].split()) + "\n")
    _write(root, "proc/sys/kernel/osrelease", release + "\n")
    _write(root, f"boot/config-{release}", "".join(line + "\n" for line in kernel["config"]))
    # A real kernel that stands in for the recorded custom one in the lab (its .debs installed by the kernel role):
    # the tree keeps the custom kernel's recorded config under the stand-in's release, and the lab's boot hook
    # never overwrites a config the tree already has (docs/lab.md).
    for standin in kernel.get("standin_releases") or []:
        header = f"# RECONSTRUCTED: the P2P config of {release}, recorded for its lab stand-in {standin}\n"
        _write(root, f"boot/config-{standin}", header + "".join(line + "\n" for line in kernel["config"]))
    for module in rig.get("modules", []):
        base = f"sys/module/{module['name']}"
        _write(root, f"{base}/initstate", "live\n")
        if module.get("version"):
            _write(root, f"{base}/version", module["version"] + "\n")
        for param, value in (module.get("parameters") or {}).items():
            _write(root, f"{base}/parameters/{param}", f"{value}\n")
        _write(root, f"lib/modules/{release}/{module['file']}", "")  # paths only matter


def materialize(rig_name: str, dest: Path) -> Path:
    """Write the recorded tree of RIG_NAME into DEST (created; must be absent or empty)."""
    return materialize_rig(load_rig(rig_name), dest)


def materialize_rig(rig: dict, dest: Path) -> Path:
    """Write the recorded tree of RIG (a rig as load_rig returns it) into DEST (created; must be absent or empty)."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"{dest} is not empty: will not write an evidence tree over it")
    dest.mkdir(parents=True, exist_ok=True)
    _write(dest, "RECONSTRUCTED", f"rig {rig['name']}: {' '.join(rig['reconstructed_from'].split())}\n")
    if rig.get("uefi"):
        _write(dest, "sys/firmware/efi/fw_platform_size", "64\n")
    _kernel(dest, rig)
    _pci(dest, rig["pci"])
    for rel, content in (rig.get("files") or {}).items():
        _write(dest, rel, content)
    for name, content in (rig.get("commands") or {}).items():
        _write(dest, f"{COMMANDS_DIR}/{name}.txt", content)
    for name, data in (rig.get("records") or {}).items():
        _write(dest, f"{COMMANDS_DIR}/{name}", json.dumps(data, indent=2) + "\n")
    return dest
