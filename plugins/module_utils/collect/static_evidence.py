# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Collect the static P2P-ladder evidence under a root (standard library only, Python 3.8+).

All I/O of the static layers lives here; the judges (ladder_static.py) are pure. The same
functions read "/" on a real box and a recorded tree (lab host, snapshot, test fixture), through
facts/ (files under the root, the kernel). Commands are only run when the root is "/"; under a
recorded root their saved output is read from var/lib/rigbook/commands/<name>.txt
(facts/runner.recorded_or_live).
"""

from __future__ import annotations

import glob
import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pci
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, kernel, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import text as fact_text

# name -> argv, run on a live root only (runner.recorded_or_live: the recording NAME.txt elsewhere)
COMMANDS = {
    "nvidia-smi-q": ["nvidia-smi", "-q"],
    "nvidia-smi-topo": ["nvidia-smi", "topo", "-m"],
    "nvidia-smi-version": ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
    "lspci-vvv": ["lspci", "-vvv", "-nn"],
}
# GPU driver probes (cuda_probe / hip_probe) by vendor: JSON evidence, recorded as <name>.json
PROBES = {"nvidia": "cuda-probe", "amd": "hip-probe"}
IORESOURCE_IO = 0x100
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000
GIB = 1 << 30
MIB = 1 << 20
GEN_SPEED_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
KERNEL_CONFIG_KEYS = ("CONFIG_PCI_P2PDMA", "CONFIG_HSA_AMD_P2P", "CONFIG_DMABUF_MOVE_NOTIFY", "CONFIG_PCI_IOV")
# Where DKMS keeps the fork's builds (its default dkms_tree) and the package name the nvidia_p2p_driver role gives it:
# rigbook's build stamp of each kernel's build sits there (plugins/modules/dkms_module.py writes it).
DKMS_TREE = ("var", "lib", "dkms")
NVIDIA_DKMS_PACKAGE = "nvidia"
SRCVERSION = r"[0-9A-F]{8,40}"  # modpost's digest of a module's sources (24 hex digits)
VERSION = r"[0-9A-Za-z][0-9A-Za-z.+~_-]{0,63}"


def probe_output(root, name, live_fn):
    """(evidence dict, source) of a GPU driver probe: call LIVE_FN under "/", read its recording elsewhere.

    A probe's output is JSON, recorded as var/lib/rigbook/commands/<name>.json. A missing or
    garbled recording reads as {"available": false, "error": ...}, which the judges call unknown.
    """
    if files.is_live(root):
        try:
            return live_fn(), "live " + name
        except Exception as exc:  # the probes never raise; this is the last guard
            return {"available": False, "error": "%s raised %r" % (name, exc)}, "live " + name
    rel = os.path.join(*runner.COMMANDS_DIR + (name + ".json",))
    data, error = files.read_json(files.path(root, rel))
    if data is None and error is None:
        return {"available": False, "error": "no recording at " + rel}, "no recording at " + rel
    if not isinstance(data, dict):
        return {"available": False, "error": "garbled recording at %s (%s)" % (
            rel, error or "not a JSON object")}, "recorded " + rel
    return data, "recorded " + rel


def parse_speed(text):
    """'8.0 GT/s PCIe' / '8 GT/s' -> 8.0; None when unknown."""
    m = re.match(r"^\s*([0-9.]+)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def parse_int(text):
    try:
        return int((text or "").strip(), 0)
    except ValueError:
        return None


def read_resources(root, slot):
    """BARs from the sysfs resource file: [{index, start, end, size, kind, prefetchable, bits}]."""
    text = files.read_text(files.path(root, "sys", "bus", "pci", "devices", slot, "resource"))
    if text is None:
        return None
    bars = []
    for index, line in enumerate(text.splitlines()[:6]):  # lines 0-5 are BAR0-BAR5
        fields = line.split()
        if len(fields) != 3:
            return None
        start, end, flags = (int(f, 16) for f in fields)
        if start == 0 and end == 0:
            continue
        bars.append(
            {
                "index": index,
                "start": start,
                "end": end,
                "size": end - start + 1,
                "kind": "io" if flags & IORESOURCE_IO else "memory",
                "prefetchable": bool(flags & IORESOURCE_PREFETCH),
                "bits": 64 if flags & IORESOURCE_MEM_64 else 32,
            }
        )
    return bars


def read_resize(root, slot):
    """Resizable-BAR sizes per BAR from resourceN_resize (bit n = 2^n MiB supported)."""
    out = {}
    base = files.path(root, "sys", "bus", "pci", "devices", slot)
    for name in sorted(glob.glob(os.path.join(base, "resource[0-9]_resize"))):
        mask = parse_int(files.read_text(name))
        if mask is None:
            continue
        index = int(os.path.basename(name)[len("resource")])
        out[index] = [(1 << bit) * MIB for bit in range(64) if mask & (1 << bit)]
    return out


def read_link(root, slot):
    base = files.path(root, "sys", "bus", "pci", "devices", slot)
    return {
        "current_speed_gts": parse_speed(files.read_text(os.path.join(base, "current_link_speed"))),
        "max_speed_gts": parse_speed(files.read_text(os.path.join(base, "max_link_speed"))),
        "current_width": parse_int(files.read_text(os.path.join(base, "current_link_width"))),
        "max_width": parse_int(files.read_text(os.path.join(base, "max_link_width"))),
    }


def upstream_chain(root, slot):
    """Bridges from the GPU up to the root port, nearest first, with their ids and links."""
    chain = []
    link = files.path(root, "sys", "bus", "pci", "devices", slot)
    current = os.path.realpath(link)
    while True:
        parent = os.path.dirname(current)
        name = os.path.basename(parent)
        if not (name.count(":") == 2 and "." in name):
            break
        attrs = pci.device_attrs(root, name)
        chain.append(
            {
                "slot": name,
                "ids": "%s:%s" % ((attrs.get("vendor") or "?")[2:], (attrs.get("device") or "?")[2:]),
                "link": read_link(root, name),
            }
        )
        current = parent
    return chain


def host_bridge(root, chain):
    """The host bridge (function 00.0 of the root bus) of a GPU's root port, with ids."""
    if not chain:
        return None
    port = chain[-1]["slot"]
    bridge = port[: port.rindex(":") + 1] + "00.0"
    attrs = pci.device_attrs(root, bridge)
    if not attrs.get("vendor"):
        return {"slot": bridge, "ids": None}
    return {"slot": bridge, "ids": "%s:%s" % (attrs["vendor"][2:], attrs["device"][2:])}


def collect_gpus(root):
    gpus, error = pci.list_gpus(root)
    for gpu in gpus:
        gpu["bars"] = read_resources(root, gpu["slot"])
        gpu["resize"] = read_resize(root, gpu["slot"])
        gpu["link"] = read_link(root, gpu["slot"])
        gpu["chain"] = upstream_chain(root, gpu["slot"])
        gpu["host_bridge"] = host_bridge(root, gpu["chain"])
        # the DMA mask the bound driver set (the PCI core's default of 32 bits before any driver binds)
        gpu["dma_mask_bits"] = parse_int(files.read_text(files.path(root, "sys", "bus", "pci", "devices", gpu["slot"],
                                                                    "dma_mask_bits")))
    return gpus, error


def kernel_config(root, release):
    if not release:
        return None, None
    for candidate in (files.path(root, "boot", "config-" + release), files.path(root, "proc", "config")):
        text = files.read_text(candidate)
        if text is not None:
            values = {}
            for line in text.splitlines():
                m = re.match(r"^(CONFIG_[A-Z0-9_]+)=(.*)$", line)
                if m and m.group(1) in KERNEL_CONFIG_KEYS:
                    values[m.group(1)] = m.group(2)
                m = re.match(r"^# (CONFIG_[A-Z0-9_]+) is not set$", line)
                if m and m.group(1) in KERNEL_CONFIG_KEYS:
                    values[m.group(1)] = "n"
            return values, candidate
    return None, None


def collect_kernel(root):
    release = kernel.release(root)
    config, config_path = kernel_config(root, release)
    return {
        "release": release,
        "cmdline": kernel.cmdline(root),
        "config": config,
        "config_path": config_path,
    }


def module_files(root, release, name):
    """Installed .ko files of module NAME for RELEASE, relative to lib/modules/<release>."""
    if not release:
        return []
    base = files.path(root, "lib", "modules", release)
    found = []
    for dirpath, _dirs, names in os.walk(base):
        for file in names:
            stem = file.split(".ko")[0] if ".ko" in file else None
            if stem is not None and stem.replace("-", "_") == name.replace("-", "_"):
                found.append(os.path.relpath(os.path.join(dirpath, file), base))
    return sorted(found)


def modprobe_options(root):
    texts = []
    for name in sorted(glob.glob(files.path(root, "etc", "modprobe.d", "*.conf"))):
        text = files.read_text(name)
        if text:
            texts.append(text)
    return "\n".join(texts)


def uvm_disable_hmm_configured(root):
    """Whether a modprobe.d file under ROOT sets nvidia-uvm's uvm_disable_hmm=1 (the next load of the module)."""
    return bool(re.search(r"^\s*options\s+nvidia[-_]uvm\s+.*uvm_disable_hmm=1", modprobe_options(root), re.M))


def srcversion_of(text):
    """A module's srcversion (the hex digest modpost writes) from TEXT, or None for anything else."""
    return fact_text.matching(text, SRCVERSION)


def nvidia_build_stamps(root, release):
    """(stamps, error) of rigbook's build stamps of the P2P fork's DKMS builds for RELEASE (one per version DKMS holds
    for it, normally one): [{path, version, modules: {module: {path, srcversion}}}]; ([], None) when rigbook built none
    for it (no stamp in DKMS's tree); ERROR names each stamp that could not be read."""
    if not release:
        return [], None
    # deferred: facts/builds (tarfile, gzip) costs ~4 ms to import; only the NVIDIA driver's part reads a stamp
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds

    pattern = files.path(root, *DKMS_TREE + (NVIDIA_DKMS_PACKAGE, "*", release, "*", builds.BUILD_STAMP))
    found = sorted(glob.glob(pattern))
    errors, stamps = [], []
    for path in found:
        stamp, error = builds.read_stamp(path)
        rel = os.path.relpath(path, files.path(root))
        if error or not stamp:
            errors.append("%s: %s" % (rel, error or "empty"))
            continue
        modules = stamp.get("modules") if isinstance(stamp.get("modules"), dict) else {}
        stamps.append({
            "path": rel,
            "version": fact_text.matching(stamp.get("version"), VERSION),
            "modules": {fact_text.line(name, 64): {"path": fact_text.line(entry.get("path"), 512)
                                                   if isinstance(entry.get("path"), str) else None,
                                                   "srcversion": srcversion_of(entry.get("srcversion"))}
                        for name, entry in sorted(modules.items())[:16] if isinstance(entry, dict)},
        })
    return stamps, "; ".join(errors) or None


def collect_nvidia(root, release, userspace_too=True):
    proc_version = files.read_text(files.path(root, "proc", "driver", "nvidia", "version"))
    smi_text, smi_source = (runner.recorded_or_live(root, "nvidia-smi-version", COMMANDS["nvidia-smi-version"])
                            if userspace_too else (None, "not asked"))
    userspace = None
    if smi_text:
        first = smi_text.strip().splitlines()[0].strip() if smi_text.strip() else ""
        userspace = first or None
    if userspace is None and userspace_too:
        q_text, _ = runner.recorded_or_live(root, "nvidia-smi-q", COMMANDS["nvidia-smi-q"])
        m = re.search(r"^\s*(?:Driver Version|KMD Version)\s*:\s*(\S+)", q_text or "", re.M)
        userspace = m.group(1) if m else None
    m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9.]+)", proc_version or "")
    stamps, stamp_error = nvidia_build_stamps(root, release)
    return {
        "loaded": os.path.isdir(files.path(root, "sys", "module", "nvidia")),
        "module_version": files.read_text(files.path(root, "sys", "module", "nvidia", "version")),
        "srcversion": srcversion_of(files.read_text(files.path(root, "sys", "module", "nvidia", "srcversion"))),
        "build_stamps": stamps,
        "build_stamp_error": stamp_error,
        "proc_version": proc_version,
        "proc_module_version": m.group(1) if m else None,
        "open_kernel_module": ("Open Kernel Module" in proc_version) if proc_version else None,
        "module_files": module_files(root, release, "nvidia"),
        "userspace_version": userspace,
        "userspace_source": smi_source,
        "uvm_loaded": os.path.isdir(files.path(root, "sys", "module", "nvidia_uvm")),
        "uvm_disable_hmm": files.read_text(files.path(root, "sys", "module", "nvidia_uvm", "parameters",
                                                      "uvm_disable_hmm")),
        "modprobe_uvm_disable_hmm": uvm_disable_hmm_configured(root),
    }


def _property(text, name):
    m = re.search(r"^%s\s+(\d+)\s*$" % name, text or "", re.M)
    return int(m.group(1)) if m else None


def collect_amd(root):
    nodes = []
    for node in sorted(glob.glob(files.path(root, "sys", "class", "kfd", "kfd", "topology", "nodes", "*"))):
        props = files.read_text(os.path.join(node, "properties"))
        if props is None:
            continue
        nodes.append(
            {
                "node": os.path.basename(node),
                "gpu": (_property(props, "simd_count") or 0) > 0,
                "io_links_count": _property(props, "io_links_count"),
                "p2p_links_count": _property(props, "p2p_links_count"),
            }
        )
    return {
        "loaded": os.path.isdir(files.path(root, "sys", "module", "amdgpu")),
        "rocm_version": files.read_text(files.path(root, "opt", "rocm", ".info", "version")),
        "kfd_nodes": nodes,
    }


def collect_cpu(root):
    text = files.read_text(files.path(root, "proc", "cpuinfo")) or ""
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    sizes = re.search(r"^address sizes\s*:\s*(\d+) bits physical", text, re.M)
    flags = re.search(r"^flags\s*:(.*)$", text, re.M)
    return {
        "vendor": vendor.group(1) if vendor else None,
        "family": int(family.group(1)) if family else None,
        "model": model.group(1).strip() if model else None,
        # the CPU's physical address width: the top of the physical address space the kernel hands out (HMM's
        # device-private regions land just below it)
        "address_bits": int(sizes.group(1)) if sizes and 0 < int(sizes.group(1)) <= 64 else None,
        # x86's CPUID "hypervisor" bit, which every hypervisor sets for its guests (KVM, Firecracker, QEMU, VMware,
        # Hyper-V, Xen HVM); None where cpuinfo has no x86 flags line (another architecture, an old snapshot)
        "hypervisor": ("hypervisor" in flags.group(1).split()) if flags else None,
    }


# A virtual machine's platform names (/sys/class/dmi/id sys_vendor or product_name, whole words): QEMU/KVM, VMware,
# VirtualBox, Xen, Hyper-V ("Microsoft Corporation" / "Virtual Machine"), bhyve, Parallels, Google Compute Engine.
VM_PLATFORMS = re.compile(r"\b(QEMU|KVM|VMware|VirtualBox|innotek|Xen|HVM domU|Virtual Machine|BHYVE|Parallels|"
                          r"Google Compute Engine)\b", re.I)
# What NVIDIA's driver says of its GPU in nvidia-smi -q: "None" on bare metal; "Pass-Through" (a GPU passed
# through to a virtual machine) and "VGPU" (a vGPU guest) only inside a virtual machine.
SMI_VIRTUALIZATION = re.compile(r"^\s*Virtualization Mode\s*:\s*(\S[^\n]{0,40})$", re.M)


def collect_virtual(root, cpu, gpus, uefi):
    """{"vm": True | False | None, "seen": words}: whether the box is a virtual machine (its hypervisor, not a BIOS,
    boots it and lays out its PCI devices). Read in this order, the first that decides: the CPU's hypervisor flag
    (CPU: collect_cpu), the DMI platform names, /sys/hypervisor/type; where the CPU's flags are not known, a box with
    NVIDIA GPUs and no EFI asks the driver (nvidia-smi -q "Virtualization Mode"; under a recorded root its
    recording, which the snapshots before the flags were kept hold)."""
    if (cpu or {}).get("hypervisor"):
        return {"vm": True, "seen": "the CPU's hypervisor flag (/proc/cpuinfo)"}
    dmi = files.path(root, "sys", "class", "dmi", "id")
    for name in ("sys_vendor", "product_name"):
        value = fact_text.line(files.read_text(os.path.join(dmi, name), limit=256), 64)
        if value and VM_PLATFORMS.search(value):
            return {"vm": True, "seen": "DMI %s %r" % (name, value)}
    kind = fact_text.line(files.read_text(files.path(root, "sys", "hypervisor", "type"), limit=64), 16)
    if kind:
        return {"vm": True, "seen": "/sys/hypervisor/type %r" % kind}
    if (cpu or {}).get("hypervisor") is False:
        return {"vm": False, "seen": "no hypervisor flag in /proc/cpuinfo"}
    if not uefi and any(g.get("vendor") == "nvidia" for g in gpus or []):
        text, source = runner.recorded_or_live(root, "nvidia-smi-q", COMMANDS["nvidia-smi-q"])
        mode = SMI_VIRTUALIZATION.search(text or "")
        if mode:
            value = fact_text.line(mode.group(1), 40)
            vm = value.lower() not in ("none", "n/a")
            return {"vm": vm, "seen": "%s: Virtualization Mode %s" % (source, value)}
    return {"vm": None, "seen": "no sign either way (no x86 flags in /proc/cpuinfo, no virtual platform in DMI)"}


# The parts of the static evidence, each (ctx, evidence so far) -> {key: value}; the layer registry
# (ladder/registry.py) names which parts each layer needs. Commands such as nvidia-smi run only for the parts
# that need them.


def gpus_part(ctx, evidence):
    gpus, error = collect_gpus(ctx.root)
    uefi = os.path.isdir(files.path(ctx.root, "sys", "firmware", "efi"))
    cpu = evidence.get("cpu") or collect_cpu(ctx.root)
    return {"gpus": gpus, "error": error, "uefi": uefi, "virtual": collect_virtual(ctx.root, cpu, gpus, uefi)}


def kernel_part(ctx, evidence):
    return {"kernel": collect_kernel(ctx.root)}


def cpu_part(ctx, evidence):
    return {"cpu": collect_cpu(ctx.root)}


def _release(ctx, evidence):
    return (evidence.get("kernel") or collect_kernel(ctx.root)).get("release")


def nvidia_kernel_part(ctx, evidence):
    """The NVIDIA kernel module only (no nvidia-smi run)."""
    return {"nvidia": collect_nvidia(ctx.root, _release(ctx, evidence), userspace_too=False)}


def nvidia_part(ctx, evidence):
    return {"nvidia": collect_nvidia(ctx.root, _release(ctx, evidence))}


def amd_part(ctx, evidence):
    return {"amd": collect_amd(ctx.root)}


PARTS = {
    "gpus": gpus_part,
    "kernel": kernel_part,
    "cpu": cpu_part,
    "nvidia_kernel": nvidia_kernel_part,
    "nvidia": nvidia_part,
    "amd": amd_part,
}


class _Root:
    def __init__(self, root):
        self.root = root


ALL_PARTS = ("gpus", "kernel", "cpu", "nvidia", "amd")


def collect_static(root, parts=ALL_PARTS):
    """The static evidence of PARTS as one JSON-able dict (all of it is what a snapshot stores as evidence.json)."""
    ctx, out = _Root(root), {"root": root}
    for name in parts:
        out.update(PARTS[name](ctx, out))
    return out
