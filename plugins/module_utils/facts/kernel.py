# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel: the running release, its command line and the words of it every boot has (standard library only).

The release is /proc/sys/kernel/osrelease and the command line /proc/cmdline under the evidence root. The
boot-only words (BOOT_WORDS, and the parameters named in BOOT_KEYS) are what every boot has - the image, the root
disk, quiet - and never a pin: `own_words` is the rest, the box owner's own choice (iommu=pt, pcie_acs_override=...),
up to "--" (what follows goes to init). HOST_KEYS name this host's own disks: a twin has its own. Of the own words
a pin carries only those the P2P stack reads (P2P_KEYS, P2P_MODULES: `p2p_words`, the one list); the rest are left
alone.

Also the kernel's side of the GPU driver: whether the module is loaded (/sys/module/NAME), the file it loads from
(modules.dep, or `modinfo -n` on a live box) and how that file got there (`installed_by`: DKMS, make
modules_install, a package), and the driver's userspace version from the versioned library the loader finds
(`driver_userspace`); and how the box boots (`boot_facts`: /lib/modules/RELEASE, EFI, GRUB), which says whether its
kernel is on its disk at all.
"""

from __future__ import annotations

import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, text

RELEASE = r"[A-Za-z0-9._+~-]{1,128}"
BOOT_WORDS = frozenset(("ro", "rw", "quiet", "splash", "$vt_handoff", "nosplash"))
BOOT_KEYS = frozenset(("BOOT_IMAGE", "root", "resume", "initrd", "rootflags", "rootfstype", "cryptdevice",
                       "rd.luks.uuid", "vt.handoff"))
HOST_KEYS = ("root", "resume", "cryptdevice", "rd.luks.uuid")
MAX_WORD = 1024
MAX_WORDS = 256


def parse_release(value):
    """A kernel release (6.8.0-90-generic), or None for text of another shape."""
    return text.matching(value, RELEASE)


def release(root):
    """The running kernel's release under ROOT, or None."""
    return parse_release(files.read_text(files.path(root, "proc", "sys", "kernel", "osrelease"), limit=4096))


BOOT_ID = r"[0-9a-f-]{36}"


def boot_id(root="/"):
    """This boot's id under ROOT (/proc/sys/kernel/random/boot_id: a new one at every boot), or None."""
    return text.matching(files.read_text(files.path(root, "proc", "sys", "kernel", "random", "boot_id"), limit=64),
                         BOOT_ID)


def parse_cmdline(value):
    """The words of a kernel command line (bounded in count and length), or None for None."""
    if value is None:
        return None
    words = text.bounded(value, MAX_WORD * MAX_WORDS).split()
    return [word[:MAX_WORD] for word in words[:MAX_WORDS]]


def cmdline(root):
    """The running kernel's command line under ROOT as words, or None when it cannot be read."""
    return parse_cmdline(files.read_text(files.path(root, "proc", "cmdline"), limit=MAX_WORD * MAX_WORDS))


def key_of(word):
    return word.split("=", 1)[0]


def is_boot_only(word):
    """True for a word every boot has (the image, the root disk, quiet): never a pin."""
    return word in BOOT_WORDS or key_of(word) in BOOT_KEYS


def own_words(words):
    """The words of a command line (a list, or the text) that are the box's own choice, up to "--"."""
    if isinstance(words, str):
        words = parse_cmdline(words)
    own = []
    for word in words or []:
        if word == "--":
            break
        if not is_boot_only(word):
            own.append(word)
    return own


def host_words(words):
    """The words naming this host's own disks (root=, resume=, ...): a twin has its own."""
    return [word for word in words or [] if key_of(word) in HOST_KEYS]


# --- the boot parameters a pin carries: those the P2P stack reads -------------------------------------------------

# The one list of what `provision adopt` pins of a box's command line: the words the P2P stack reads, by parameter
# name (the part before "="). Every other word of the box's own (console=, panic=, rdinit=, a hypervisor's or an
# owner's tuning) is left alone and said so: the kernel role writes what is pinned into a twin's GRUB.
P2P_KEYS = frozenset((
    # the IOMMU: on, off or in passthrough decides whether and how a GPU reaches a peer's BAR
    "intel_iommu", "amd_iommu", "iommu", "iommu.passthrough", "iommu.strict", "iommu.forcedac",
    # PCI/PCIe: resource reallocation for large BARs (pci=realloc), AER, MMCONFIG, ACS, ASPM and port services
    "pci", "pcie_aspm", "pcie_aspm.policy", "pcie_acs_override", "pcie_ports", "pcie_port_pm",
    # which driver binds the GPU: blacklists given on the command line
    "modprobe.blacklist", "rd.driver.blacklist", "module_blacklist",
))
# Module parameters given on the command line (NAME.param=value) of the GPU drivers, and nouveau's (kept off the
# NVIDIA GPUs): the module names with - and _ alike, as the kernel reads them.
P2P_MODULES = frozenset(("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem", "amdgpu",
                         "nouveau"))
# Left alone on purpose: iomem= (iomem=relaxed lets tools read device memory through /dev/mem: a tool's need, not
# the P2P stack's) and memmap= (it names this box's physical address ranges: a twin's memory map is its own).


def is_p2p_word(word):
    """True for a kernel parameter the P2P stack reads (P2P_KEYS, or a parameter of a module of P2P_MODULES)."""
    key = key_of(word)
    if key in P2P_KEYS:
        return True
    module, dot, _param = key.partition(".")
    return bool(dot) and module.replace("-", "_") in P2P_MODULES


def p2p_words(words):
    """(pinned, left alone) of a command line's own words (own_words: up to "--", no boot-only word): the words the
    P2P stack reads (is_p2p_word), and every other, each in its order."""
    own = own_words(words)
    return [w for w in own if is_p2p_word(w)], [w for w in own if not is_p2p_word(w)]


# --- the loaded GPU driver module, its file and how it got there; the userspace that goes with it ------------------

MODULES = ("lib", "modules")
DRIVER_VERSION = r"[0-9]+(\.[0-9]+){1,3}"
# How a module file got where it is, by its place under /lib/modules/<release>/ (the first that matches):
INSTALL_WAYS = (
    ("dkms", re.compile(r"^updates/dkms/")),  # DKMS (the fork's dkms.conf, amdgpu-dkms, a distribution's -dkms)
    # kbuild's modules_install with the driver's own INSTALL_MOD_DIR: the open modules' `make modules_install`
    # (seed 000's fork) and NVIDIA's .run installer without DKMS both put nvidia*.ko there
    ("make modules_install", re.compile(r"^kernel/drivers/video/")),
    # a distribution's package: Ubuntu's prebuilt linux-modules-nvidia-BRANCH-RELEASE (kernel/nvidia-BRANCH/), the
    # kernel package's own drivers (kernel/drivers/gpu/: amdgpu, nouveau), a kmod package's extra/
    ("package", re.compile(r"^(kernel/nvidia-[0-9]+(-[a-z]+)?/|kernel/drivers/gpu/|extra/)")),
)
DRIVER_LIBRARIES = ("libnvidia-ml.so.", "libcuda.so.")  # the userspace's versioned files (the .run installer's too)
# Where the loader finds them besides LD_LIBRARY_PATH and its cache: a container or cloud image's own folder, then
# the distribution's
DRIVER_LIBRARY_DIRS = ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
LDCONFIG = ["ldconfig", "-p"]
DRIVER_SMI = ("/usr/local/nvidia/bin/nvidia-smi",)  # nvidia-smi where a container or cloud image keeps it
MAX_DIRS = 64


def module_loaded(root, name):
    """True when the running kernel under ROOT has the module NAME loaded (/sys/module/NAME; its version,
    srcversion and /proc/driver text are the ladder's reads: collect/static_evidence.collect_nvidia)."""
    return os.path.isdir(files.path(root, "sys", "module", name))


def _same_module(a, b):
    return a.replace("-", "_") == b.replace("-", "_")


def parse_modules_dep(dep_text, name):
    """The path modules.dep lists for module NAME (as depmod wrote it: relative to /lib/modules/<release>, or
    absolute from old depmods), or None. - and _ in names alike, any compression suffix."""
    for line in (dep_text or "").splitlines():
        path = line.split(":", 1)[0].strip()
        base = os.path.basename(path)
        if ".ko" in base and _same_module(base.split(".ko", 1)[0], name):
            return text.line(path)
    return None


def module_file(root, release, name, run=None):
    """(path, where it was read) of the file module NAME loads from for RELEASE: the modules.dep entry under ROOT
    (what modprobe and modinfo read), else with RUN (a live box) `modinfo -n NAME`; (None, why) without one."""
    if not release:
        return None, "the running release is unknown"
    base = "/" + "/".join(MODULES + (release,))
    dep = files.read_text(files.path(root, *MODULES + (release, "modules.dep")), limit=32 << 20)
    found = parse_modules_dep(dep, name)
    if found:
        return (found if found.startswith("/") else base + "/" + found), base + "/modules.dep"
    if run is not None:
        rc, out = run(["modinfo", "-n", name])
        path = text.line(out) if rc == 0 else None
        if path and path.startswith("/"):
            return path, "modinfo -n " + name
    if dep is None:
        return None, "no %s/modules.dep" % base
    return None, "%s/modules.dep lists no %s module" % (base, name)


def installed_by(path, release):
    """How the module file PATH of RELEASE got there (INSTALL_WAYS): "dkms", "make modules_install", "package", or
    "unknown" (no file, or a place none of them uses)."""
    if not path or not release:
        return "unknown"
    prefix = "/lib/modules/%s/" % release
    for lead in ("", "/usr"):
        if path.startswith(lead + prefix):
            rel = path[len(lead + prefix):]
            for way, place in INSTALL_WAYS:
                if place.match(rel):
                    return way
    return "unknown"


def smi_userspace(root, run):
    """(driver version, the nvidia-smi that said it) of an nvidia-smi off the PATH (DRIVER_SMI: a container or cloud
    image's own, /usr/local/nvidia/bin) that RUN can run under ROOT (a live box), or (None, None)."""
    for path in DRIVER_SMI:
        if os.path.isfile(files.path(root, path.lstrip("/"))):
            rc, out = run([path, "--query-gpu=driver_version", "--format=csv,noheader"])
            version = parse_driver_version(out) if rc == 0 else None
            if version:
                return version, path
    return None, None


def parse_driver_version(output):
    """The driver version on the first line of OUTPUT (nvidia-smi --query-gpu=driver_version), or None."""
    return text.matching(text.line(output, 256), DRIVER_VERSION)


def parse_ldconfig(output):
    """The folders the loader's cache (ldconfig -p OUTPUT) has a driver library (DRIVER_LIBRARIES) in, in order."""
    found = []
    for line in (output or "").splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow and name.startswith(tuple(lib.rstrip(".") for lib in DRIVER_LIBRARIES)) and path.startswith("/"):
            folder = os.path.dirname(path.strip())
            if folder not in found:
                found.append(folder)
    return found[:MAX_DIRS]


def driver_userspace(root, folders):
    """{"version", "path"} of the first versioned driver library in FOLDERS (absolute folders on the box, in the
    loader's order) under ROOT (in each folder libnvidia-ml.so.VERSION, then libcuda.so.VERSION), or None."""
    for folder in list(folders)[:MAX_DIRS]:
        if not isinstance(folder, str) or not folder.startswith("/"):
            continue
        try:
            names = sorted(os.listdir(files.path(root, folder.lstrip("/"))))
        except OSError:
            continue
        for lib in DRIVER_LIBRARIES:
            for name in names:
                version = text.matching(name[len(lib):], DRIVER_VERSION) if name.startswith(lib) else None
                if version:
                    return {"version": version, "path": folder.rstrip("/") + "/" + name}
    return None


# --- how the box boots: whether rigbook can manage its kernel ------------------------------------------------------

GRUB_FILES = ("/etc/default/grub", "/boot/grub/grub.cfg", "/boot/grub2/grub.cfg")


def boot_facts(system, evidence_root, release):
    """{"modules_dir", "efi", "grub"}: whether /lib/modules/RELEASE is there (under SYSTEM or the EVIDENCE_ROOT the
    ladder reads), whether the box booted through EFI (/sys/firmware/efi), and the GRUB files it has. A box with
    none (a VM or cloud image its host boots directly) runs a kernel that is not on its disk."""
    modules = bool(release) and any(os.path.isdir(files.path(root, *MODULES + (release,)))
                                    for root in (system, evidence_root) if root)
    return {"modules_dir": modules,
            "efi": os.path.isdir(files.path(evidence_root or system, "sys", "firmware", "efi")),
            "grub": [name for name in GRUB_FILES if os.path.exists(files.path(system, name.lstrip("/")))]}
