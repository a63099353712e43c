# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Copy the files the P2P ladder reads into a recorded evidence tree (standard library only).

The tree has the layout of docs/evidence.md, so replaying it runs the very collectors and
judges a live run uses. Serial numbers and UUIDs are scrubbed; nothing else is taken.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pci
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files as facts_files
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import kernel, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import cuda as cuda_probe
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import hip as hip_probe

PCI_ATTRS = (
    "vendor", "device", "class", "subsystem_vendor", "subsystem_device", "resource", "numa_node",
    "current_link_speed", "max_link_speed", "current_link_width", "max_link_width", "dma_mask_bits",
)  # fmt: skip
SCRUB = [
    (re.compile(r"^(\s*(?:Serial Number|GPU UUID|Board Part Number|Module Id|GPU Part Number)\s*:).*$", re.M),
     r"\1 [scrubbed]"),
    (re.compile(r"^(\s*(?:Capabilities: \[[0-9a-f]+\] )?Device Serial Number).*$", re.M), r"\1 [scrubbed]"),
    (re.compile(r"GPU-[0-9a-fA-F-]{36}"), "GPU-[scrubbed]"),
]  # fmt: skip
CPUINFO_KEYS = ("vendor_id", "cpu family", "model", "model name", "address sizes")


def scrub(text):
    for pattern, replacement in SCRUB:
        text = pattern.sub(replacement, text)
    return text


def _write(dest, rel, text):
    target = os.path.join(dest, rel)
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    with open(target, "w") as handle:
        handle.write(text if text.endswith("\n") or not text else text + "\n")
    return rel


def _copy(root, dest, rel, filter_fn=None):
    text = facts_files.read_text(os.path.join(root, rel))
    if text is None:
        return None
    return _write(dest, rel, filter_fn(text) if filter_fn else text)


def _copy_pci_function(root, dest, slot, copied):
    real = os.path.realpath(os.path.join(root, "sys", "bus", "pci", "devices", slot))
    rel_real = os.path.relpath(real, root)
    if not rel_real.startswith("sys" + os.sep) or rel_real in copied:
        return rel_real
    copied.add(rel_real)
    for attr in PCI_ATTRS:
        _copy(root, dest, os.path.join(rel_real, attr))
    for resize in glob.glob(os.path.join(real, "resource[0-9]_resize")):
        _copy(root, dest, os.path.join(rel_real, os.path.basename(resize)))
    link_dir = os.path.join(dest, "sys", "bus", "pci", "devices")
    if not os.path.isdir(link_dir):
        os.makedirs(link_dir)
    link = os.path.join(link_dir, slot)
    if not os.path.lexists(link):
        os.symlink(os.path.relpath(os.path.join(dest, rel_real), link_dir), link)
    return rel_real


def _cpuinfo(text):
    """The first CPU's CPUINFO_KEYS, and its flags line cut to the one flag the ladder reads (hypervisor: a virtual
    machine, static_evidence.collect_virtual); an empty flags line says the flag is absent."""
    first = text.split("\n\n")[0]
    keep = [line for line in first.splitlines() if line.split(":")[0].strip() in CPUINFO_KEYS]
    for line in first.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            keep.append("flags\t\t: %s" % ("hypervisor" if "hypervisor" in value.split() else ""))
            break
    return "\n".join(keep)


def _kernel_config(text):
    keep = [line for line in text.splitlines() if any(key + "=" in line or key + " is not set" in line
                                                      for key in evidence.KERNEL_CONFIG_KEYS)]
    return "# filtered by rigbook snapshot: only the options the ladder reads\n" + "\n".join(keep)


def _module_options(text):
    return "\n".join(line for line in text.splitlines() if re.match(r"^\s*options\s+(nvidia|amdgpu)", line))


def _live_probe(vendor):
    """Run the vendor's GPU probe (peer access, copy bandwidth) in a child process."""
    probe_mod = cuda_probe if vendor == "nvidia" else hip_probe
    return probe_mod.probe_isolated(), "live " + evidence.PROBES[vendor]


def capture(root, dest, label, probe=True):
    """Write the evidence tree of ROOT into DEST; returns a manifest dict.

    Under a live root the GPU probe runs too (PROBE), so a replay can judge peer access and bandwidth.
    """
    root = root or "/"
    copied = set()
    files = []
    gpus, error = pci.list_gpus(root)
    for gpu in gpus:
        _copy_pci_function(root, dest, gpu["slot"], copied)
        for bridge in evidence.upstream_chain(root, gpu["slot"]):
            _copy_pci_function(root, dest, bridge["slot"], copied)
        bridge = evidence.host_bridge(root, evidence.upstream_chain(root, gpu["slot"]))
        if bridge and bridge.get("ids"):
            _copy_pci_function(root, dest, bridge["slot"], copied)
    if os.path.isdir(os.path.join(root, "sys", "firmware", "efi")):
        os.makedirs(os.path.join(dest, "sys", "firmware", "efi"))
    release = kernel.release(root)
    plain = ["proc/cmdline", "proc/sys/kernel/osrelease", "proc/driver/nvidia/version", "opt/rocm/.info/version",
             "sys/module/nvidia/version", "sys/module/nvidia/srcversion",
             "sys/module/nvidia_uvm/parameters/uvm_disable_hmm",
             "sys/module/amdgpu/version",
             # whether it is a virtual machine (static_evidence.collect_virtual): DMI's platform names, Xen's type
             "sys/class/dmi/id/sys_vendor", "sys/class/dmi/id/product_name", "sys/hypervisor/type"]  # fmt: skip
    for rel in plain:
        files.append(_copy(root, dest, rel))
    for name in ("nvidia", "nvidia_uvm", "amdgpu"):
        if os.path.isdir(os.path.join(root, "sys", "module", name)):
            os.makedirs(os.path.join(dest, "sys", "module", name), exist_ok=True)
    files.append(_copy(root, dest, "proc/cpuinfo", _cpuinfo))
    if release:
        files.append(_copy(root, dest, "boot/config-" + release, _kernel_config))
        for name in ("nvidia", "amdgpu"):
            for rel in evidence.module_files(root, release, name):
                files.append(_write(dest, os.path.join("lib", "modules", release, rel), ""))
        for stamp in evidence.nvidia_build_stamps(root, release)[0]:  # rigbook's stamp of the DKMS build (srcversion)
            files.append(_copy(root, dest, stamp["path"]))
    for conf in glob.glob(os.path.join(root, "etc", "modprobe.d", "*.conf")):
        files.append(_copy(root, dest, os.path.relpath(conf, root), _module_options))
    for props in glob.glob(os.path.join(root, "sys", "class", "kfd", "kfd", "topology", "nodes", "*", "properties")):
        files.append(_copy(root, dest, os.path.relpath(props, root)))
    commands = {}
    recorded = facts_files.path(root, *runner.COMMANDS_DIR)
    if not facts_files.is_live(root) and os.path.isdir(recorded):
        # a recorded tree (lab host, earlier snapshot): keep every recorded output, probes included
        for name in sorted(os.listdir(recorded)):
            if name.endswith((".txt", ".json")):
                files.append(_copy(root, dest, os.path.join(*runner.COMMANDS_DIR + (name,)), scrub))
    elif probe:
        for vendor in sorted({g["vendor"] for g in gpus}):
            data, source = _live_probe(vendor)
            commands[evidence.PROBES[vendor]] = source
            rel = os.path.join(*runner.COMMANDS_DIR + (evidence.PROBES[vendor] + ".json",))
            files.append(_write(dest, rel, scrub(json.dumps(data, indent=2))))
    for name in sorted(evidence.COMMANDS):
        text, source = runner.recorded_or_live(root, name, evidence.COMMANDS[name])
        commands[name] = source
        if text is not None:
            files.append(_write(dest, os.path.join(*runner.COMMANDS_DIR + (name + ".txt",)), scrub(text)))
    _write(dest, "CAPTURED", "%s\ncaptured %s by rigbook snapshot from %s\n"
           % (label, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), root))  # fmt: skip
    return {
        "label": label,
        "gpus": [g["slot"] for g in gpus],
        "error": error,
        "pci_functions": sorted(copied),
        "files": sorted(f for f in files if f),
        "commands": commands,
    }


if __name__ == "__main__":  # pragma: no cover - `python3 snapshot.py ROOT DEST LABEL` on a box without Ansible
    import json
    import sys

    print(json.dumps(capture(sys.argv[1], sys.argv[2], " ".join(sys.argv[3:]) or "unlabelled"), indent=2))
