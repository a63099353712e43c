# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host manifest: what makes two boxes the same, read under an evidence root (standard library only).

One flat mapping of items, each {"group": ladder layer or role, "value": ..., "unique": bool}. Pinned items
(kernels, cmdline, DKMS, driver/ROCm/CUDA/RCCL/SGLang versions and stamps, patch hashes, the serving venv's
packages, the serve units' and environment files' sha256, GPU models, VBIOS, PCIe links, BAR sizes) must be
equal on two twins; host-unique items (serials, MACs, machine-id, hostname, addresses) differ by nature and are
marked "unique": true. Hardware facts (the running kernel and its cmdline, sysfs, DMI, nvidia-smi) are read under
ROOT like the other collectors ("/" on a real box, a recorded tree on a lab host); what the roles installed (boot/,
dpkg, DKMS, /opt/rigbook, /etc/rigbook, the serve units, the kernel's stored .debs: kernel.debs, each package's
version and sha256 from the kernel role's note, module_utils/deb_store) and the host's identity are read under
SYSTEM, "/" but in tests. Commands (dkms status, dpkg-query, nvidia-smi -q, ip addr) run live when their root is
"/", and are read from var/lib/rigbook/commands/<name>.txt under any other root (facts/runner.recorded_or_live); files
are read through facts/ (files, kernel, packages, builds).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils import deb_store, host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, kernel, packages, runner

SCHEMA = 1
# name -> argv, run on a live root only (the recording NAME.txt elsewhere); nvidia-smi-q is static_evidence's
COMMANDS = {
    "dkms-status": ["dkms", "status"],
    "ip-addr": ["ip", "-o", "addr", "show"],
}
DPKG_RECORDING = packages.DPKG_QUERY[0]  # dpkg's listing (facts/packages.DPKG_QUERY), recorded as dpkg-query.txt
# The source builds a role made (rigbook.homelab.source_build): item group -> the stamp of the active prefix. Twins
# that installed one group build have byte-equal stamps (no time in them) and equal stamped files.
BUILD_STAMPS = (("rccl", os.path.join(host_model.RCCL_CURRENT.lstrip("/"), builds.BUILD_STAMP)),
                ("nccl_tests", os.path.join(host_model.NCCL_TESTS_CURRENT.lstrip("/"), builds.BUILD_STAMP)))
SGLANG_STAMPS = os.path.join("opt/rigbook/sglang/*", builds.VENV_STAMP)
ENV_FILES = ("etc/rigbook/gpu.env", "etc/rigbook/cuda.env")
SERVE_UNITS = "etc/systemd/system/rigbook-serve-*.service"
SERVE_ENV = "etc/rigbook/serve/*.env"
DMI_SERIALS = ("board_serial", "product_serial", "chassis_serial", "product_uuid")
DMI_PINNED = ("bios_version", "bios_date", "board_name", "board_vendor")
# The serve unit's `--host ADDRESS` (ExecStart=): the address is the host's own, the rest of the unit is pinned.
BIND_ARG = re.compile(r"^ExecStart=.*?\s--host\s+(\S+)", re.M)


def _item(group, value, unique=False):
    return {"group": group, "value": value, "unique": bool(unique)}


def _build_hash(group, build, value, bits=False):
    """The hash of the build BUILD (a source build's or a venv's stamp, or a kernel's DKMS modules): a diff lists it
    with the builds. BITS: only the bits of a build made on the box - two boxes that built the same pin each have
    their own (a compiler's output is not byte-identical), so it is never a pinned difference."""
    item = dict(_item(group, value), build=build)
    if bits:
        item["bits"] = True
    return item


# --- kernel and packages ----------------------------------------------------------------------------------------

def default_kernel(root):
    """The release /boot/vmlinuz points at (what the boot loader starts by default), or None."""
    try:
        target = os.readlink(files.path(root, "boot/vmlinuz"))
    except OSError:
        return None
    name = os.path.basename(target)
    return name[len("vmlinuz-"):] if name.startswith("vmlinuz-") else None


def parse_dkms_status(text):
    """{kernel: ["module/version: state", ...]} from `dkms status` lines ("nvidia/580.x, 6.8.0, x86_64: installed")."""
    by_kernel = {}
    for line in (text or "").splitlines():
        m = re.match(r"^\s*([^,\s]+)(?:,\s*|/)([^,\s]+),\s*([^,\s]+),\s*[^:]+:\s*(.+?)\s*$", line)
        if m:
            by_kernel.setdefault(m.group(3), []).append("%s/%s: %s" % (m.group(1), m.group(2), m.group(4)))
    return dict((k, sorted(v)) for k, v in by_kernel.items())


def kernel_items(root, system):
    running = evidence.collect_kernel(root)
    installed = sorted(os.path.basename(p)[len("vmlinuz-"):] for p in glob.glob(files.path(system, "boot/vmlinuz-*")))
    cmdline = running["cmdline"]
    items = {
        "kernel.running": _item("kernel_state", running["release"]),
        # the box owner's own words are pinned; those naming this host's own disks are host-unique
        "kernel.cmdline": _item("kernel_state", None if cmdline is None else kernel.own_words(cmdline)),
        "host.cmdline_disks": _item("host", kernel.host_words(cmdline), unique=True),
        "kernel.config": _item("kernel_state", running["config"]),
        "kernel.default": _item("kernel_state", default_kernel(system)),
        "kernel.installed": _item("kernel_state", installed),
    }
    # the stored .debs the kernel role installed the distribution kernel from: {package: {version, sha256}}
    debs, why = deb_store.read_box_record(system, "kernel")
    items["kernel.debs"] = _item("kernel_state", debs if why is None else "unreadable: %s" % why)
    dkms_text, _source = runner.recorded_or_live(system, "dkms-status", COMMANDS["dkms-status"])
    for kernel_name, modules in sorted(parse_dkms_status(dkms_text).items()):
        items["dkms.%s" % kernel_name] = _item("driver_state", modules)
        built = dkms_modules_sha256(system, kernel_name)
        if built:
            items["dkms.%s.modules_sha256" % kernel_name] = _build_hash("driver_state", "dkms.%s" % kernel_name, built,
                                                                        bits=True)
    return items


def dkms_modules_sha256(system, kernel_name):
    """The sha256 over the modules DKMS installed for KERNEL_NAME (lib/modules/<kernel>/updates/dkms: each name and
    sha256), or None without any: twins that installed one group build have equal ones, two separate builds of the
    same source and kernel do not (measured on the lab: an adopted box's build by hand and its twin's)."""
    found = sorted(glob.glob(files.path(system, "lib/modules/%s/updates/dkms/*" % kernel_name)))
    if not found:
        return None
    digest = hashlib.sha256()
    for path in found:
        digest.update(("%s %s\n" % (os.path.basename(path), files.digest(path)[0])).encode())
    return digest.hexdigest()


def package_items(root):
    """The held packages of dpkg-query's listing (facts/packages; recorded as dpkg-query.txt under a recorded root)."""
    text, _source = runner.recorded_or_live(root, DPKG_RECORDING, packages.DPKG_QUERY)
    listing = packages.parse_listing(text)
    held = dict((name, p["version"]) for name, p in sorted(listing.items()) if p["held"])
    items = {"packages.held": _item("packages", held)}
    kernels = sorted(n for n in held if n.startswith("linux-image-"))
    items["kernel.held"] = _item("kernel_state", kernels)
    return items


# --- driver and toolchain ---------------------------------------------------------------------------------------

def parse_env_file(text):
    values = {}
    for line in (text or "").splitlines():
        m = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:
            values[m.group(1)] = m.group(2).strip().strip("'\"")
    return values


def cuda_version(root):
    """The CUDA toolchain's version.json under CUDA_HOME of the GPU environment file (cuda.env on a box the
    cuda_toolchain role converged before it wrote a block of gpu.env), else /usr/local/cuda."""
    home = None
    for rel in ENV_FILES:
        home = home or parse_env_file(files.read_text(files.path(root, rel))).get("CUDA_HOME")
    home = home or "/usr/local/cuda"
    data, _error = files.read_json(files.path(root, os.path.join(home.lstrip("/"), "version.json")))
    return ((data or {}).get("cuda") or {}).get("version") if isinstance(data, dict) else None


def driver_items(root, system):
    release = kernel.release(root)
    nvidia = files.read_text(files.path(root, "sys/module/nvidia/version"))
    items = {
        "driver.nvidia": _item("driver_state", nvidia),
        "driver.nvidia_files": _item("driver_state", evidence.module_files(root, release, "nvidia") or None),
        "driver.amdgpu": _item("driver_state", files.read_text(files.path(root, "sys/module/amdgpu/version"))),
        "rocm.version": _item("amd_rocm", files.read_text(files.path(system, "opt/rocm/.info/version"))),
        "cuda.version": _item("cuda_toolchain", cuda_version(system)),
    }
    for rel in ENV_FILES:
        # gpu.env holds every GPU role's block (cuda_toolchain, amd_rocm, rccl); cuda.env only an older converge's
        role = "cuda_toolchain" if rel.endswith("cuda.env") else "gpu_env"
        items["file.%s" % rel] = _item(role, files.digest(files.path(system, rel))[0])
    return items


def patches_of(stamp):
    """The patch hashes a build or venv stamp records ("name -pN sha256" strings), per component."""
    if not isinstance(stamp, dict):
        return None
    found = list(stamp.get("patches") or [])
    for comp in stamp.get("components") or []:
        found += ["%s: %s" % (comp.get("name"), p) for p in comp.get("patches") or []]
    return sorted(found)


def build_items(root):
    """The version, stamp sha256, patches and stamped files' sha256 of each source build (BUILD_STAMPS) found."""
    items = {}
    for group, rel in BUILD_STAMPS:
        path = files.path(root, rel)
        stamp, error = builds.read_stamp(path)
        if stamp is None and error is None:
            continue
        stamp = stamp or {}  # a garbled stamp: its digest differs, its contents are unknown
        items.update({
            group + ".version": _item(group, stamp.get("version")),
            group + ".stamp_sha256": _build_hash(group, group, files.digest(path)[0]),
            group + ".patches": _item(group, patches_of(stamp)),
            group + ".files": _item(group, stamp.get("files")),
        })
    return items


def dist_packages(venv):
    """{name: version} from the *.dist-info folders of a venv's site-packages."""
    found = {}
    for info in glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info")):
        stem = os.path.basename(info)[: -len(".dist-info")]
        name, _, version = stem.partition("-")
        found[name.lower().replace("_", "-")] = version
    return dict(sorted(found.items()))


def sglang_items(root):
    items = {}
    for path in sorted(glob.glob(files.path(root, SGLANG_STAMPS))):
        venv = os.path.dirname(path)
        name = os.path.basename(venv)
        stamp = builds.read_stamp(path)[0] or {}
        items["sglang.%s.versions" % name] = _item("sglang", stamp.get("versions"))
        items["sglang.%s.patches" % name] = _item("sglang", patches_of(stamp))
        items["sglang.%s.stamp_sha256" % name] = _build_hash("sglang", "sglang.%s" % name, files.digest(path)[0])
        items["sglang.%s.packages" % name] = _item("sglang", dist_packages(venv))
    return items


def unit_bind(text):
    """(unit text with the engine's --host value masked, that value or None): a twin listens on its own address."""
    found = BIND_ARG.search(text or "")
    if not found:
        return text, None
    return text[:found.start(1)] + "<bind>" + text[found.end(1):], found.group(1)


def serve_items(root):
    items = {}
    for path in sorted(glob.glob(files.path(root, SERVE_UNITS))):
        rel = os.path.relpath(path, root or "/")
        masked, bind = unit_bind(files.read_text(path))
        digest = hashlib.sha256(masked.encode()).hexdigest() if masked is not None else None
        items["file.%s" % rel] = _item("serve", digest)
        if bind is not None:
            items["bind.%s" % rel] = _item("serve", bind, unique=True)
    for path in sorted(glob.glob(files.path(root, SERVE_ENV))):
        rel = os.path.relpath(path, root or "/")
        # A key file holds this host's API key: its hash tells nothing about the twin.
        items["file.%s" % rel] = _item("serve", files.digest(path)[0], unique=rel.endswith(".key.env"))
    return items


# --- hardware ---------------------------------------------------------------------------------------------------

def smi_sections(text):
    """{bus id (lower, 4-digit domain): {"product", "vbios", "serial"}} from `nvidia-smi -q`."""
    sections = {}
    for block in re.split(r"^(?=GPU [0-9A-Fa-f]{4,8}:)", text or "", flags=re.M):
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}):([0-9A-Fa-f:.]+)", block)
        if not m:
            continue
        slot = ("%s:%s" % (m.group(1)[-4:], m.group(2))).lower()
        sections[slot] = {"product": _smi_field(block, "Product Name"), "vbios": _smi_field(block, "VBIOS Version"),
                          "serial": _smi_field(block, "Serial Number")}
    return sections


def _smi_field(block, label):
    found = re.search(r"^\s*%s\s*:\s*(.+?)\s*$" % label, block, re.M)
    return found.group(1) if found else None


def gpu_items(root):
    gpus, _error = evidence.collect_gpus(root)
    smi = {}
    if any(g["vendor"] == "nvidia" for g in gpus):
        smi = smi_sections(runner.recorded_or_live(root, "nvidia-smi-q", evidence.COMMANDS["nvidia-smi-q"])[0])
    items = {"gpu.count": _item("pcie_link", len(gpus))}
    for gpu in gpus:
        slot = gpu["slot"]
        base = files.path(root, os.path.join("sys", "bus", "pci", "devices", slot))
        info = smi.get(slot, {})
        model = info.get("product") or files.read_text(os.path.join(base, "product_name"))
        items["gpu.%s.model" % slot] = _item("firmware", {"ids": "%s:%s" % (gpu["vendor_id"], gpu["device_id"]),
                                                          "subsystem": gpu["subsystem"], "name": model})
        items["gpu.%s.vbios" % slot] = _item("firmware", info.get("vbios")
                                             or files.read_text(os.path.join(base, "vbios_version")))
        items["gpu.%s.link" % slot] = _item("pcie_link", gpu["link"])
        items["gpu.%s.bars" % slot] = _item("dma_window", [b.get("size") for b in gpu["bars"] or []])
        serial = info.get("serial") or files.read_text(os.path.join(base, "serial_number"))
        if serial and serial not in ("N/A", "[scrubbed]"):
            items["gpu.%s.serial" % slot] = _item("host", serial, unique=True)
    return items


def platform_items(root):
    items = {}
    dmi = files.path(root, "sys/class/dmi/id")
    for name in DMI_PINNED:
        value = files.read_text(os.path.join(dmi, name))
        if value is not None:
            items["dmi.%s" % name] = _item("firmware", value)
    for name in DMI_SERIALS:
        value = files.read_text(os.path.join(dmi, name))
        if value is not None:
            items["dmi.%s" % name] = _item("host", value, unique=True)
    return items


def parse_ip_addr(text):
    """Sorted "iface address/prefix" entries of `ip -o addr show`, loopback left out."""
    found = []
    for line in (text or "").splitlines():
        m = re.match(r"^\d+:\s+(\S+)\s+inet6?\s+(\S+)", line)
        if m and m.group(1) != "lo":
            found.append("%s %s" % (m.group(1), m.group(2)))
    return sorted(found)


def identity_items(root):
    hostname = (files.read_text(files.path(root, "etc/hostname"))
                or files.read_text(files.path(root, "proc/sys/kernel/hostname")))
    addresses, _source = runner.recorded_or_live(root, "ip-addr", COMMANDS["ip-addr"])
    items = {
        "host.hostname": _item("host", hostname, unique=True),
        "host.machine_id": _item("host", files.read_text(files.path(root, "etc/machine-id")), unique=True),
        "host.addresses": _item("host", parse_ip_addr(addresses), unique=True),
    }
    for path in sorted(glob.glob(files.path(root, "sys/class/net/*/address"))):
        iface = os.path.basename(os.path.dirname(path))
        if iface != "lo":
            items["host.mac.%s" % iface] = _item("host", files.read_text(path), unique=True)
    return items


def collect_manifest(root="/", system="/"):
    """{"schema", "root", "system", "items"}: every manifest item of the host (hardware under ROOT, installed
    state and identity under SYSTEM)."""
    items = {}
    for part in (kernel_items(root, system), package_items(system), driver_items(root, system), build_items(system),
                 sglang_items(system), serve_items(system), gpu_items(root), platform_items(root),
                 identity_items(system)):
        items.update(part)
    return {"schema": SCHEMA, "root": root or "/", "system": system or "/", "items": items}
