# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI evidence from sysfs under an evidence root (standard library only: runs on the target).

The root is "/" on a real machine, or a recorded tree laid out the same way (docs/evidence.md); its files are read
through facts/files.py.
"""

import os

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
# PCI base class 0x03 (display): 0x0300 VGA, 0x0302 3D controller, 0x0380 other display.
DISPLAY_CLASS_PREFIX = "0x03"


def sysfs_path(root, *parts):
    return files.path(root, "sys", *parts)


def pci_devices_dir(root):
    return sysfs_path(root, "bus", "pci", "devices")


def device_attrs(root, slot):
    base = os.path.join(pci_devices_dir(root), slot)
    attrs = {}
    for name in ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node"):
        attrs[name] = files.read_text(os.path.join(base, name))
    return attrs


def upstream_port(root, slot):
    """The BDF of the bridge above SLOT (from the sysfs symlink's target), or None."""
    link = os.path.join(pci_devices_dir(root), slot)
    try:
        target = os.path.realpath(link)
    except OSError:
        return None
    parent = os.path.basename(os.path.dirname(target))
    if parent.count(":") == 2 and "." in parent:
        return parent
    return None


def root_port(root, slot):
    """The BDF of the root port SLOT sits below (the topmost bridge of its sysfs path: past a card's own PCIe
    switch), or None."""
    link = os.path.join(pci_devices_dir(root), slot)
    try:
        current = os.path.dirname(os.path.realpath(link))
    except OSError:
        return None
    found = None
    while True:
        name = os.path.basename(current)
        if not (name.count(":") == 2 and "." in name):
            return found
        found, current = name, os.path.dirname(current)


def list_gpus(root):
    """Display-class PCI functions of NVIDIA and AMD, sorted by slot.

    Returns (gpus, error): error is a message when sysfs cannot be read at all.
    """
    directory = pci_devices_dir(root)
    try:
        slots = sorted(os.listdir(directory))
    except OSError as exc:
        return [], "cannot list %s: %s" % (directory, exc.strerror)
    gpus = []
    for slot in slots:
        attrs = device_attrs(root, slot)
        cls = attrs.get("class") or ""
        vendor = (attrs.get("vendor") or "").lower()
        if not cls.lower().startswith(DISPLAY_CLASS_PREFIX) or vendor not in ("0x10de", "0x1002"):
            continue
        gpus.append(
            {
                "slot": slot,
                "vendor": VENDORS[vendor],
                "vendor_id": vendor,
                "device_id": (attrs.get("device") or "").lower() or None,
                "class": cls.lower(),
                "subsystem": "%s:%s" % (attrs.get("subsystem_vendor"), attrs.get("subsystem_device"))
                if attrs.get("subsystem_vendor")
                else None,
                "upstream_port": upstream_port(root, slot),
            }
        )
    return gpus, None


def judge_gpu_count(gpus, expected_count, expected_vendor):
    """(ok, message) for the GPUs found against rigbook_gpu (count, vendor). Pure."""
    matching = [g for g in gpus if not expected_vendor or g["vendor"] == expected_vendor]
    found = ", ".join("%s %s:%s" % (g["slot"], g["vendor_id"], g["device_id"]) for g in gpus) or "none"
    if expected_count is None:
        return True, "%d GPU(s) found: %s (no count expected)" % (len(gpus), found)
    if len(matching) != expected_count:
        what = "%s GPU(s)" % expected_vendor if expected_vendor else "GPU(s)"
        return False, "the inventory says %d %s, the host has %d: %s" % (
            expected_count,
            what,
            len(matching),
            found,
        )
    return True, "%d %s GPU(s) as expected: %s" % (len(matching), expected_vendor or "", found)
