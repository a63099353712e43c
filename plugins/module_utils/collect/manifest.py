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
dpkg, DKMS, /opt/rigbook, /etc/rigbook, the serve units) and the host's identity are read under SYSTEM, "/" but
in tests. Commands (dkms status, nvidia-smi -q, ip addr) run live when their root is "/", and are read from
var/lib/rigbook/commands/<name>.txt under any other root.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess

from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import pci
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence

SCHEMA = 1
COMMANDS = {
    "dkms-status": ["dkms", "status"],
    "ip-addr": ["ip", "-o", "addr", "show"],
}
# The source builds a role made (rigbook.homelab.source_build): item group -> the stamp of the active prefix. Twins
# that installed one group build have byte-equal stamps (no time in them) and equal stamped files.
BUILD_STAMPS = (("rccl", host_model.RCCL_CURRENT.lstrip("/") + "/.rigbook-build.json"),
                ("nccl_tests", host_model.NCCL_TESTS_CURRENT.lstrip("/") + "/.rigbook-build.json"))
SGLANG_STAMPS = "opt/rigbook/sglang/*/.rigbook-venv.json"
ENV_FILES = ("etc/rigbook/gpu.env", "etc/rigbook/cuda.env")
SERVE_UNITS = "etc/systemd/system/rigbook-serve-*.service"
SERVE_ENV = "etc/rigbook/serve/*.env"
DMI_SERIALS = ("board_serial", "product_serial", "chassis_serial", "product_uuid")
DMI_PINNED = ("bios_version", "bios_date", "board_name", "board_vendor")
# Kernel parameters naming this host's own disks: host-unique, kept apart from the pinned cmdline.
# The serve unit's `--host ADDRESS` (ExecStart=): the address is the host's own, the rest of the unit is pinned.
BIND_ARG = re.compile(r"^ExecStart=.*?\s--host\s+(\S+)", re.M)
UNIQUE_CMDLINE = ("root", "resume", "cryptdevice", "rd.luks.uuid")


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


def _under(root, rel):
    return os.path.join(root or "/", rel)


def sha256_of(path):
    """Hex sha256 of a file, or None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def command_text(root, name, timeout=60):
    """Output of command NAME: run live under "/", read var/lib/rigbook/commands/<name>.txt elsewhere."""
    if name in evidence.COMMANDS:
        return evidence.command_output(root, name, timeout)[0]
    if evidence.is_live(root):
        try:
            proc = subprocess.run(COMMANDS[name], capture_output=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None
    return pci.read_text(_under(root, os.path.join(*evidence.COMMANDS_DIR + (name + ".txt",))))


def read_json(path):
    text = pci.read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"error": "not valid JSON"}


# --- kernel and packages ----------------------------------------------------------------------------------------

def parse_dpkg_status(text):
    """{package: {"version", "held"}} of the installed packages in a dpkg status file."""
    packages = {}
    for stanza in re.split(r"\n\s*\n", text or ""):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
        status = fields.get("Status", "").split()
        if "Package" in fields and status[-1:] == ["installed"]:
            packages[fields["Package"]] = {"version": fields.get("Version"), "held": status[0] == "hold"}
    return packages


def default_kernel(root):
    """The release /boot/vmlinuz points at (what the boot loader starts by default), or None."""
    try:
        target = os.readlink(_under(root, "boot/vmlinuz"))
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
    kernel = evidence.collect_kernel(root)
    installed = sorted(os.path.basename(p)[len("vmlinuz-"):] for p in glob.glob(_under(system, "boot/vmlinuz-*")))
    cmdline = kernel["cmdline"]
    own_disks = [p for p in cmdline or [] if p.split("=", 1)[0] in UNIQUE_CMDLINE]
    items = {
        "kernel.running": _item("kernel_state", kernel["release"]),
        "kernel.cmdline": _item("kernel_state", None if cmdline is None else [p for p in cmdline
                                                                               if p not in own_disks]),
        "host.cmdline_disks": _item("host", own_disks, unique=True),
        "kernel.config": _item("kernel_state", kernel["config"]),
        "kernel.default": _item("kernel_state", default_kernel(system)),
        "kernel.installed": _item("kernel_state", installed),
    }
    for kernel_name, modules in sorted(parse_dkms_status(command_text(system, "dkms-status")).items()):
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
    found = sorted(glob.glob(_under(system, "lib/modules/%s/updates/dkms/*" % kernel_name)))
    if not found:
        return None
    digest = hashlib.sha256()
    for path in found:
        digest.update(("%s %s\n" % (os.path.basename(path), sha256_of(path))).encode())
    return digest.hexdigest()


def package_items(root):
    packages = parse_dpkg_status(pci.read_text(_under(root, "var/lib/dpkg/status")))
    held = dict((name, p["version"]) for name, p in sorted(packages.items()) if p["held"])
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
        home = home or parse_env_file(pci.read_text(_under(root, rel))).get("CUDA_HOME")
    home = home or "/usr/local/cuda"
    data = read_json(_under(root, os.path.join(home.lstrip("/"), "version.json")))
    return ((data or {}).get("cuda") or {}).get("version") if isinstance(data, dict) else None


def driver_items(root, system):
    release = pci.read_text(_under(root, "proc/sys/kernel/osrelease"))
    nvidia = pci.read_text(_under(root, "sys/module/nvidia/version"))
    items = {
        "driver.nvidia": _item("driver_state", nvidia),
        "driver.nvidia_files": _item("driver_state", evidence.module_files(root, release, "nvidia") or None),
        "driver.amdgpu": _item("driver_state", pci.read_text(_under(root, "sys/module/amdgpu/version"))),
        "rocm.version": _item("amd_rocm", pci.read_text(_under(system, "opt/rocm/.info/version"))),
        "cuda.version": _item("cuda_toolchain", cuda_version(system)),
    }
    for rel in ENV_FILES:
        # gpu.env holds every GPU role's block (cuda_toolchain, amd_rocm, rccl); cuda.env only an older converge's
        role = "cuda_toolchain" if rel.endswith("cuda.env") else "gpu_env"
        items["file.%s" % rel] = _item(role, sha256_of(_under(system, rel)))
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
        path = _under(root, rel)
        stamp = read_json(path)
        if stamp is None:
            continue
        items.update({
            group + ".version": _item(group, stamp.get("version")),
            group + ".stamp_sha256": _build_hash(group, group, sha256_of(path)),
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
    for path in sorted(glob.glob(_under(root, SGLANG_STAMPS))):
        venv = os.path.dirname(path)
        name = os.path.basename(venv)
        stamp = read_json(path) or {}
        items["sglang.%s.versions" % name] = _item("sglang", stamp.get("versions"))
        items["sglang.%s.patches" % name] = _item("sglang", patches_of(stamp))
        items["sglang.%s.stamp_sha256" % name] = _build_hash("sglang", "sglang.%s" % name, sha256_of(path))
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
    for path in sorted(glob.glob(_under(root, SERVE_UNITS))):
        rel = os.path.relpath(path, root or "/")
        masked, bind = unit_bind(pci.read_text(path))
        digest = hashlib.sha256(masked.encode()).hexdigest() if masked is not None else None
        items["file.%s" % rel] = _item("serve", digest)
        if bind is not None:
            items["bind.%s" % rel] = _item("serve", bind, unique=True)
    for path in sorted(glob.glob(_under(root, SERVE_ENV))):
        rel = os.path.relpath(path, root or "/")
        # A key file holds this host's API key: its hash tells nothing about the twin.
        items["file.%s" % rel] = _item("serve", sha256_of(path), unique=rel.endswith(".key.env"))
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
    smi = smi_sections(command_text(root, "nvidia-smi-q")) if any(g["vendor"] == "nvidia" for g in gpus) else {}
    items = {"gpu.count": _item("pcie_link", len(gpus))}
    for gpu in gpus:
        slot = gpu["slot"]
        base = _under(root, os.path.join("sys", "bus", "pci", "devices", slot))
        info = smi.get(slot, {})
        model = info.get("product") or pci.read_text(os.path.join(base, "product_name"))
        items["gpu.%s.model" % slot] = _item("firmware", {"ids": "%s:%s" % (gpu["vendor_id"], gpu["device_id"]),
                                                           "subsystem": gpu["subsystem"], "name": model})
        items["gpu.%s.vbios" % slot] = _item("firmware", info.get("vbios")
                                             or pci.read_text(os.path.join(base, "vbios_version")))
        items["gpu.%s.link" % slot] = _item("pcie_link", gpu["link"])
        items["gpu.%s.bars" % slot] = _item("dma_window", [b.get("size") for b in gpu["bars"] or []])
        serial = info.get("serial") or pci.read_text(os.path.join(base, "serial_number"))
        if serial and serial not in ("N/A", "[scrubbed]"):
            items["gpu.%s.serial" % slot] = _item("host", serial, unique=True)
    return items


def platform_items(root):
    items = {}
    dmi = _under(root, "sys/class/dmi/id")
    for name in DMI_PINNED:
        value = pci.read_text(os.path.join(dmi, name))
        if value is not None:
            items["dmi.%s" % name] = _item("firmware", value)
    for name in DMI_SERIALS:
        value = pci.read_text(os.path.join(dmi, name))
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
    hostname = pci.read_text(_under(root, "etc/hostname")) or pci.read_text(_under(root, "proc/sys/kernel/hostname"))
    items = {
        "host.hostname": _item("host", hostname, unique=True),
        "host.machine_id": _item("host", pci.read_text(_under(root, "etc/machine-id")), unique=True),
        "host.addresses": _item("host", parse_ip_addr(command_text(root, "ip-addr")), unique=True),
    }
    for path in sorted(glob.glob(_under(root, "sys/class/net/*/address"))):
        iface = os.path.basename(os.path.dirname(path))
        if iface != "lo":
            items["host.mac.%s" % iface] = _item("host", pci.read_text(path), unique=True)
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
