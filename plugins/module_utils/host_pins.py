# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pins (rigbook_pins), each defined once and both ways (standard library only).

- forward, for host_model.build: the pin as an inventory writes it -> the pin of the host model, defaulted and
  normalised (kernel_pin, nvidia_driver_pin, ...; see host_model's docstring).
- inverse, for `provision adopt` (src/rigbook/adopt/mapping.py): what the adopt_facts module read on a box set up
  by hand (plugins/module_utils/collect/adopt.py) -> the pin that reproduces it, each value with where it was read
  (Reading.comments), what could not be pinned with the reason (Reading.unpinned, never guessed) and what else is
  worth saying (Reading.notes).

PINS is the one table: each Pin names its key path (rigbook_pins.NAME), its forward and its inverse, in the order
of the host model's pins. host_model.build walks it forward (forward_pins), adopt walks it backward (read_pins), and
tests/unit/plugins/module_utils/test_host_pins.py checks that every pin round-trips (the host model of what adopt
wrote holds every value adopt read). A new pin is one Pin(...) entry here, with both its functions beside the
constants they share.
"""

from __future__ import annotations

import json
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers

NCCL_WHEEL = re.compile(r"^nvidia-nccl-cu([0-9]+)$")
CCCL_WHEEL = "nvidia-cuda-cccl"
CUDA_VENV = "/opt/rigbook/cuda"  # the cuda_toolchain role's default venv
SGLANG_ROOT = "/opt/rigbook/sglang/"  # the sglang role's own venvs (sglang_root)
KERNEL_FLAVOURS = ("generic", "lowlatency", "amd64", "cloud-amd64", "rt-amd64", "generic-64k", "nvidia",
                   "nvidia-lowlatency", "realtime", "oem", "aws", "azure", "gcp", "gke", "kvm", "oracle", "ibm")
# A release a distribution archive carries: 6.8.0-90-generic (Ubuntu), 6.1.0-47-amd64 (Debian).
DISTRO_KERNEL = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+(\.[0-9]+)?-(%s)$" % "|".join(
    re.escape(f) for f in KERNEL_FLAVOURS))
CUDA_ALIGNED = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm")
ROCM_PACKAGES = ("rocm-core", "rocminfo", "rocm-smi-lib", "hip-runtime-amd")
# What the rccl role's build needs from AMD's repository (projects/rccl/CMakeLists.txt: hipcc or amdclang++ as the
# compiler, find_package(hip) and find_package(hsa-runtime64), rocm-cmake's modules; docs/amd.md cites them).
ROCM_BUILD_PACKAGES = ("hipcc", "hip-dev", "hsa-rocr-dev", "rocm-cmake", "rocm-llvm", "rocm-device-libs")
# Stock NVIDIA kernel module and driver packages that must not sit beside the P2P fork (purged, then pinned away
# with Pin-Priority -1). dpkg-query and apt preferences both read these as fnmatch globs. Debian's names:
NVIDIA_STOCK_DEBIAN = ("nvidia-kernel-dkms", "nvidia-open-kernel-dkms", "nvidia-kernel-open-dkms")
# Ubuntu's (24.04 archive naming: a branch number in every name, e.g. nvidia-driver-570, libnvidia-compute-570,
# linux-modules-nvidia-570-6.8.0-90-generic): the prebuilt modules for each kernel, DKMS sources of every branch,
# the driver metapackages and the branch-numbered userspace libraries that the .run userspace replaces.
# libnvidia-*-[0-9]* leaves the branch-free libnvidia-egl-wayland1 / libnvidia-container* alone (the desktop and
# container tooling depend on them).
NVIDIA_STOCK_UBUNTU = ("linux-modules-nvidia-*", "linux-objects-nvidia-*", "linux-signatures-nvidia-*",
                       "nvidia-dkms-*", "nvidia-kernel-source-*", "nvidia-kernel-common-*", "nvidia-driver-*",
                       "nvidia-headless-*", "nvidia-utils-*", "nvidia-compute-utils-*", "nvidia-firmware-*",
                       "xserver-xorg-video-nvidia-*", "libnvidia-*-[0-9]*")
ROCM_DKMS_PACKAGE = "amdgpu-dkms"
# The keys of rigbook_pins.nvidia_driver that ask the nvidia_p2p_driver role to build or install a driver: a pin
# without any of them is the stock driver the box already has (host_model.manage_of).
NVIDIA_DRIVER_BUILD = ("source", "fork_repo", "branch", "commit", "userspace_installer", "userspace_flags")


def as_dict(value):
    """An inventory value as a dict; anything of another type reads as absent (the host model's rule)."""
    return dict(value) if isinstance(value, dict) else {}


def as_list(value):
    """An inventory value as a list; anything of another type reads as absent."""
    return list(value) if isinstance(value, list) else []


def as_str(value):
    """An inventory value as text: "" for None, str() of a number."""
    return value if isinstance(value, str) else ("" if value is None else str(value))


# --- forward: the pins of the host model, defaulted ---------------------------------------------------------------

def kernel_pin(pins):
    raw = as_dict(pins.get("kernel"))
    release = as_str(raw.get("release"))
    debs = as_list(raw.get("debs"))
    # One decision: declared; else .debs when any are listed or the release is no distribution kernel.
    source = raw.get("source") or ("debs" if debs or (release and not DISTRO_KERNEL.match(release)) else "distro")
    return {
        "pinned": bool(raw),
        "release": release,
        "source": source,
        "packages": as_list(raw.get("packages")) or (["linux-image-" + release, "linux-headers-" + release]
                                                     if release else []),
        "debs": debs,
        "cmdline": as_list(raw.get("cmdline")),
        "keep_previous": raw.get("keep_previous", True) is not False,
        # unattended-upgrades leaves every package of the pinned release alone (its .debs' too: linux-*-RELEASE).
        "unattended_blacklist": unattended_blacklist(list(dict.fromkeys(
            (["linux-*-" + release] if release else []) + as_list(raw.get("packages"))))),
        "p2pdma_allow": as_list(raw.get("p2pdma_allow")),
    }


def nvidia_stock_packages(os_id, major):
    """The stock NVIDIA package names and globs to purge and pin away on OS_ID: Debian's on debian; on ubuntu, a
    derivative or an unknown OS ("") Ubuntu's as well (a glob that matches nothing installs and removes nothing)."""
    names = list(NVIDIA_STOCK_DEBIAN) + (["nvidia-dkms-%s" % major, "nvidia-dkms-%s-open" % major] if major else [])
    if os_id != "debian":
        names += [n for n in NVIDIA_STOCK_UBUNTU if n not in names]
    return names


def unattended_blacklist(names):
    """Unattended-Upgrade::Package-Blacklist entries for package NAMES and fnmatch globs: Python regexes matched from
    the start of the name, so each is anchored with $ and its regex characters escaped (apt_regex)."""
    return ["%s$" % apt_regex(name) for name in names]


def nvidia_driver_pin(pins, kernel, os_id=""):
    raw = as_dict(pins.get("nvidia_driver"))
    version = as_str(raw.get("version"))
    major = version.split(".")[0] if version else ""
    return {
        "pinned": bool(raw),
        # the pin asks for what the nvidia_p2p_driver role builds or installs (NVIDIA_DRIVER_BUILD: the fork, its
        # userspace installer); a version (and userspace_version) alone pins the stock driver the ladder judges
        "installs": any(name in raw for name in NVIDIA_DRIVER_BUILD),
        "version": version,
        "source": as_dict(raw.get("source")),
        "fork_repo": as_str(raw.get("fork_repo")),
        "branch": as_str(raw.get("branch")),
        "commit": as_str(raw.get("commit")),
        "userspace_version": as_str(raw.get("userspace_version")) or version,
        "userspace_installer": as_dict(raw.get("userspace_installer")),
        "userspace_flags": as_list(raw.get("userspace_flags")) or ["--no-kernel-modules"],
        # HMM with iommu=pt breaks NCCL's SHM transport: off whenever the command line pins iommu=pt.
        "uvm_disable_hmm": raw.get("uvm_disable_hmm", True) is not False and "iommu=pt" in kernel["cmdline"],
        "stock_packages": nvidia_stock_packages(os_id, major),
        "unattended_blacklist": unattended_blacklist(nvidia_stock_packages(os_id, major)),
    }


def cuda_toolchain_pin(pins, python=""):
    """The CUDA toolchain venv's pins; with PYTHON ("3.12", from the facts) where its CUDA home and, when an NCCL
    wheel is pinned among its versions, its NCCL are."""
    raw = as_dict(pins.get("cuda_toolchain"))
    version = as_str(raw.get("version"))
    packages = as_list(raw.get("packages")) or list(CUDA_ALIGNED)
    wanted = {name: version for name in packages + ["nvidia-cuda-runtime"]}
    wanted.update({str(k): as_str(v) for k, v in as_dict(raw.get("versions")).items()})
    venv = as_str(raw.get("venv")) or CUDA_VENV
    site = "%s/lib/python%s/site-packages" % (venv, python) if python else ""
    nccl = [name for name in sorted(wanted) if NCCL_WHEEL.match(name)]
    return {
        "pinned": bool(raw),
        "version": version,
        "packages": packages,
        "wanted": wanted,
        "venv": venv,
        "wheel_dir": as_str(raw.get("wheel_dir")),
        # nvcc.profile and nccl-tests' CUDA_HOME: the wheels' nvidia/cuMAJOR tree ("" without the python fact)
        "home": "%s/nvidia/cu%s" % (site, version.split(".")[0]) if site and version else "",
        "nccl": {"package": nccl[0], "version": wanted[nccl[0]],
                 "home": "%s/nvidia/nccl" % site if site else ""} if nccl else {},
    }


def nccl_tests_pin(pins):
    raw = as_dict(pins.get("nccl_tests"))
    source = as_dict(raw.get("source"))
    return {
        "pinned": bool(raw),
        "version": as_str(raw.get("version")),
        "source": source,
        "repo": as_str(source.get("repo")),
        "commit": as_str(source.get("commit")),
        # nvcc's -gencode list: the GPUs' compute capability (86 for the RTX 3080); empty: nccl-tests' own list
        "cuda_archs": [as_str(a) for a in as_list(raw.get("cuda_archs"))],
    }


def rocm_tag(version):
    """ROCm's package version tag: 7.1.0 -> 70100 (every ROCm package version ends in .<tag>-<build>)."""
    parts = (version.split(".") + ["0", "0"])[:3]
    if not all(p.isdigit() for p in parts):
        return ""
    return str(int(parts[0]) * 10000 + int(parts[1]) * 100 + int(parts[2]))


def apt_regex(glob):
    """An fnmatch glob of package versions as apt's preferences regex body: . and + escaped, * and ? as .* and ."""
    return glob.replace(".", "\\.").replace("+", "\\+").replace("*", ".*").replace("?", ".")


def amdgpu_repo(raw, rocm_repo):
    """AMD's graphics repository, where amdgpu-dkms is published (repo.radeon.com/amdgpu/<release>/ubuntu, not the
    ROCm repository): {url, suite, components, key_url, key_sha256} of RAW (rigbook_pins.rocm.amdgpu_repo), the key
    the ROCm repository's (ROCM_REPO) unless RAW pins its own: AMD signs both with one key (docs/amd.md); {} unset."""
    raw = as_dict(raw)
    if not raw:
        return {}
    key = raw if raw.get("key_url") or raw.get("key_sha256") else as_dict(rocm_repo)
    return {"url": as_str(raw.get("url")), "suite": as_str(raw.get("suite")),
            "components": as_list(raw.get("components")) or ["main"],
            "key_url": as_str(key.get("key_url")), "key_sha256": as_str(key.get("key_sha256"))}


def rocm_pin(pins, p2p):
    raw = as_dict(pins.get("rocm"))
    version = as_str(raw.get("version"))
    glob = as_str(raw.get("version_glob")) or ("*.%s-*" % rocm_tag(version) if rocm_tag(version) else "")
    env = {"HSA_ENABLE_IPC_MODE_LEGACY": "0"}
    env.update({str(k): as_str(v) for k, v in as_dict(raw.get("hsa_env")).items()})
    if p2p["nccl_p2p_level"]:
        env["NCCL_P2P_LEVEL"] = p2p["nccl_p2p_level"]
    packages = as_list(raw.get("packages")) or list(ROCM_PACKAGES)
    build_packages = as_list(raw["build_packages"]) if "build_packages" in raw else list(ROCM_BUILD_PACKAGES)
    return {
        "pinned": bool(raw),
        "version": version,
        "version_glob": glob,
        # apt matches a glob only as a prefix (a trailing *): the preferences pin is an anchored regex instead.
        "apt_version_pin": "/^%s$/" % apt_regex(glob) if glob else "",
        "repo": as_dict(raw.get("repo")),
        "debs": as_list(raw.get("debs")),
        "packages": packages,
        # installed, pinned and held with the runtime by the amd_rocm role: the rccl role's build uses them
        "build_packages": build_packages,
        "dkms": raw.get("dkms") is True,
        "dkms_declared": isinstance(raw.get("dkms"), bool),
        "dkms_package": ROCM_DKMS_PACKAGE,
        # where amdgpu-dkms comes from when dkms is true (the amd_rocm role configures it then, and only then)
        "amdgpu_repo": amdgpu_repo(raw.get("amdgpu_repo"), raw.get("repo")),
        "unattended_blacklist": unattended_blacklist(list(dict.fromkeys(packages + build_packages
                                                                        + [ROCM_DKMS_PACKAGE]))),
        "prefix": "/opt/rocm-%s" % version if version else "/opt/rocm",
        "env": env,
    }


def rccl_pin(pins):
    raw = as_dict(pins.get("rccl"))
    source = as_dict(raw.get("source"))
    repo = as_str(source.get("repo"))
    tests = as_dict(as_dict(raw.get("tests")).get("source"))
    return {
        "pinned": bool(raw),
        "version": as_str(raw.get("version")),
        "source": source,
        "repo": repo,
        "commit": as_str(source.get("commit")),
        # RCCL lives in ROCm/rocm-systems under projects/rccl; a ROCm/rccl tree or tarball has it at the top.
        "subdir": (as_str(source["subdir"]) if "subdir" in source
                   else ("projects/rccl" if "rocm-systems" in repo else "")),
        "patches": as_list(raw.get("patches")),
        "gpu_targets": as_list(raw.get("gpu_targets")),
        "tests_source": tests,
    }


def sglang_pin(pins):
    raw = as_dict(pins.get("sglang"))
    version = as_str(raw.get("version"))
    repo = as_dict(raw.get("repo"))
    commit = as_str(repo.get("commit"))
    if version:
        pin_name, requirement = version, "sglang==" + version
    elif repo:
        pin_name = "commit-" + commit[:12]
        requirement = "sglang @ git+%s@%s#subdirectory=%s" % (as_str(repo.get("url")), commit,
                                                              as_str(repo.get("subdirectory")) or "python")
    else:
        pin_name, requirement = "", ""
    return {
        "pinned": bool(raw),
        "version": version,
        "repo": repo,
        "commit": commit,
        "pin_name": pin_name,
        "requirement": requirement,
        "venv": as_str(raw.get("venv")),
        "lock": as_str(raw.get("lock")),
        "wheel_dir": as_str(raw.get("wheel_dir")),
        "patches": as_list(raw.get("patches")),
        "no_deps": raw.get("no_deps") is True,
        "byte_compile": raw.get("byte_compile", True) is not False,
        "import_check": raw.get("import_check", True) is not False,
    }


# --- inverse: what adopt read on a box, as the pins that reproduce it ------------------------------------------------

HEX = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
SGLANG_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)+([a-z0-9.+]*)$")  # the schema's rigbook_pins.sglang.version
CUDA_WHEEL = re.compile(r"^(nvidia-cuda-nvcc|nvidia-cuda-crt|nvidia-nvvm|nvidia-cuda-runtime)(-cu[0-9]+)?$")
CUDA_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")  # the schema's rigbook_pins.cuda_toolchain.version
ROCM_RELEASE = re.compile(r"^([0-9]+\.[0-9]+(\.[0-9]+)?)")
APT_WORD = re.compile(r"^[A-Za-z0-9._-]+$")  # the schema's suite and component
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STAMP_PATCH = re.compile(r"^([A-Za-z0-9._+-]+) -p([0-9]) ([0-9a-f]{64})$")  # source_build identity's patch entry


class Reading:
    """What one adopt read says besides the values: PINS read so far ({name: pin}; an inverse may read an earlier
    pin's), COMMENTS {key path tuple: where it was read} (the YAML's comments), UNPINNED [text] (what could not be
    pinned, with the reason) and NOTES [text]."""

    def __init__(self):
        self.pins = {}
        self.comments = {}
        self.unpinned = []
        self.notes = []


def redact(url):
    """URL without the user and password a URL may carry (https://user:token@host/...)."""
    return re.sub(r"//[^/@\s]*@", "//***@", url) if isinstance(url, str) else url


def read_kernel(facts, reading):
    """The kernel pin: the running release, where its packages came from (distro, or debs with each .deb's sha256),
    the command line's own parameters; the GRUB default and P2PDMA host bridges are said, not pinned."""
    comments, unpinned, notes = reading.comments, reading.unpinned, reading.notes
    kernel = facts.get("kernel") or {}
    release = kernel.get("release")
    if not release:
        unpinned.append("rigbook_pins.kernel: the running kernel release could not be read "
                        "(/proc/sys/kernel/osrelease)")
        return None
    pin = {"release": release}
    comments[("rigbook_pins", "kernel", "release")] = "/proc/sys/kernel/osrelease (the running kernel)"
    packages = kernel.get("packages") or []
    local = [p for p in packages if p.get("origin") == "local"]
    if packages and not local:
        pin["source"] = "distro"
        comments[("rigbook_pins", "kernel", "source")] = "apt-cache policy: " + "; ".join(
            f"{p['name']} {p['version']} from {(p.get('sources') or ['?'])[0]}" for p in packages)
        # the release's own image and headers (what apt then pulls in with them, e.g. headers-common, follows)
        own = [p["name"] for p in packages
               if p["name"].startswith(("linux-image-", "linux-headers-")) and p["name"].endswith("-" + release)]
        pin["packages"] = sorted(own, key=lambda n: not n.startswith("linux-image-"))
        comments[("rigbook_pins", "kernel", "packages")] = "dpkg-query: the installed image and headers of " + release
        for p in packages:
            if p.get("deb"):
                notes.append(f"{p['deb']['path']} (sha256 {p['deb']['sha256']}) is {p['name']} {p['version']}, the "
                             "version the archive offers: pinned by name from the archive; to install that file "
                             "instead, set source: debs and list it under debs")
    elif local:
        pin["source"] = "debs"
        comments[("rigbook_pins", "kernel", "source")] = ("apt-cache policy: no archive offers "
                                                          + ", ".join(f"{p['name']} {p['version']}" for p in local))
        debs = []
        for p in local:
            if p.get("deb"):
                debs.append({"path": p["deb"]["path"], "sha256": p["deb"]["sha256"]})
                comments[("rigbook_pins", "kernel", "debs", len(debs) - 1)] = (
                    f"{p['name']} {p['version']}: the .deb found on the box, sha256 of that file")
            else:
                unpinned.append(f"rigbook_pins.kernel.debs: {p['name']} {p['version']} is installed, no archive "
                                f"offers it and its .deb is in neither /var/cache/apt/archives nor --debs-dir: put "
                                f"{p['name']}_{p['version']}_<arch>.deb in one of them and adopt again")
        pin["debs"] = debs
    else:
        unpinned.append(f"rigbook_pins.kernel.source: no installed package of {release} was found (dpkg-query)")
    if kernel.get("cmdline"):
        pin["cmdline"] = list(kernel["cmdline"])
        comments[("rigbook_pins", "kernel", "cmdline")] = ("/proc/cmdline (its own parameters; root, ro, quiet, "
                                                           "... left out)")
    default = kernel.get("grub_default")
    if default and release not in default:
        unpinned.append(f"GRUB_DEFAULT={default!r} ({kernel.get('grub_default_file')}) does not name the running "
                        f"kernel {release}: the kernel role will make the pinned one the default")
    unpinned += _p2pdma_bridges(facts)
    return pin


def _p2pdma_bridges(facts):
    """What to say when the GPUs sit on different root ports behind a host bridge the upstream kernel does not allow
    for P2PDMA (the static layer's rule): whether this box's kernel was patched to allow it is not readable."""
    bridges = static_layers.p2pdma_host_bridges({"gpus": facts.get("gpus"), "cpu": facts.get("cpu")})
    if not isinstance(bridges, list):
        return []
    foreign = [ids for ids in bridges if ids not in static_layers.P2PDMA_HOST_BRIDGES]
    if not foreign:
        return []
    return [f"rigbook_pins.kernel.p2pdma_allow: the GPUs sit on different root ports behind host bridge "
            f"{', '.join(foreign)}, which the upstream kernel does not allow for P2PDMA (drivers/pci/p2pdma.c); "
            "whether this kernel was patched to allow it cannot be read: if it was (seed 004's X99 box patches "
            "8086:6f00 in), list it in p2pdma_allow, or the ladder's static layer fails"]


def read_nvidia_driver(facts, reading):
    """The NVIDIA driver pin from the DKMS module named nvidia (the P2P fork as DKMS builds it) and the userspace
    library's version; its source tarball and installer are files adopt cannot make, named as not pinned."""
    comments, unpinned, notes = reading.comments, reading.unpinned, reading.notes
    found = [m for m in facts.get("dkms") or [] if m.get("module") == "nvidia"]
    for other in (m for m in facts.get("dkms") or [] if m.get("module") != "nvidia"):
        notes.append(f"DKMS module {other['module']}/{other['version']} ({', '.join(sorted(other['kernels']))}): "
                     "no pin of rigbook's names it")
    if not found:
        return None
    module = found[-1]
    key = ("rigbook_pins", "nvidia_driver")
    pin = {"version": module["version"]}
    states = ", ".join(f"{k}: {v}" for k, v in sorted(module["kernels"].items()))
    comments[key + ("version",)] = f"dkms status: nvidia/{module['version']} ({states})"
    git = module.get("git") or {}
    for field, value in (("fork_repo", git.get("repo")), ("branch", git.get("branch")),
                         ("commit", git.get("commit"))):
        if value:
            pin[field] = value
            comments[key + (field,)] = f"{module['source']}/.git"
    if facts.get("nvidia_userspace"):
        pin["userspace_version"] = facts["nvidia_userspace"]
        comments[key + ("userspace_version",)] = "the libnvidia-ml.so.VERSION file the userspace installed"
    if facts.get("uvm_disable_hmm"):
        pin["uvm_disable_hmm"] = True
        comments[key + ("uvm_disable_hmm",)] = "/etc/modprobe.d: options nvidia-uvm uvm_disable_hmm=1"
    unpinned.append("rigbook_pins.nvidia_driver.source and userspace_installer: the fork's source tarball and the "
                    "userspace .run (sha256) are files on your side"
                    + (f"; the source DKMS built is {module['source']}" if module.get("source") else ""))
    return pin


def _cuda_wheels(packages):
    """{base name: (installed name, version, install)} of the CUDA toolchain wheels among PACKAGES (nvcc, crt, nvvm,
    runtime; a -cuNN suffix kept in the installed name)."""
    found = {}
    for p in packages or []:
        match = CUDA_WHEEL.match(p.get("name") or "")
        if match:
            found[match.group(1)] = (p["name"], p.get("version") or "", p.get("install"))
    return found


def _cuda_venv(facts):
    """(venv, packages, where) of the venv holding the CUDA toolchain: the role's default venv when it has nvcc,
    else the first engine's venv that has it; (None, [], None) when none has."""
    default = facts.get("cuda_venv") or {}
    if "nvidia-cuda-nvcc" in _cuda_wheels(default.get("packages")):
        return CUDA_VENV, default["packages"], f"{CUDA_VENV} (the cuda_toolchain role's default venv)"
    for engine in facts.get("engines") or []:
        if engine.get("venv") and "nvidia-cuda-nvcc" in _cuda_wheels(engine.get("packages")):
            return engine["venv"], engine["packages"], f"{engine['venv']} (the engine /proc/{engine['pid']}'s venv)"
    return None, [], None


def _one_wheel_folder(packages, names):
    """The one folder (given with --wheels-dir) holding a wheel file of the installed version of each of NAMES among
    PACKAGES ("wheels", collect.adopt.wheel_files), or None."""
    folders = None
    for p in packages:
        if p.get("name") in names:
            found = {w["path"].rsplit("/", 1)[0] for w in p.get("wheels") or []}
            folders = found if folders is None else folders & found
    return sorted(folders)[0] if folders else None


def _nccl_build_wheels(packages):
    """[(name, version)] of the NCCL wheel (nvidia-nccl-cuNN) and the CCCL headers' among PACKAGES (what the
    nccl_tests role builds against)."""
    return sorted((p["name"], p.get("version") or "") for p in packages or []
                  if NCCL_WHEEL.match(p.get("name") or "") or p.get("name") == CCCL_WHEEL)


def read_cuda_toolchain(facts, reading):
    """The CUDA toolchain pin from the nvcc/crt/nvvm wheels of the venv that holds them: version (nvcc's), the
    packages found, the venv when not the role's default, the runtime's version when it differs. crt or nvvm at
    another release than nvcc is named as a problem (they must be one release); the pin puts them at nvcc's."""
    comments, unpinned, notes = reading.comments, reading.unpinned, reading.notes
    venv, packages, where = _cuda_venv(facts)
    nvidia = bool(facts.get("nvidia_userspace")) or any(m.get("module") == "nvidia" for m in facts.get("dkms") or [])
    if venv is None:
        if nvidia:
            unpinned.append(f"rigbook_pins.cuda_toolchain: no nvidia-cuda-nvcc wheel in {CUDA_VENV} nor in a running "
                            "engine's venv (dist-info)")
        return None
    wheels = _cuda_wheels(packages)
    key = ("rigbook_pins", "cuda_toolchain")
    name, version, _ = wheels["nvidia-cuda-nvcc"]
    if not CUDA_VERSION.match(version):
        unpinned.append(f"rigbook_pins.cuda_toolchain.version: {name} {version!r} in {venv} is no x.y.z release "
                        "the role can pin")
        return None
    pin = {"version": version, "packages": [wheels[b][0] for b in CUDA_ALIGNED if b in wheels]}
    comments[key + ("version",)] = f"{where}: {name}-{version}.dist-info"
    comments[key + ("packages",)] = f"{where}: the nvcc, crt and nvvm wheels installed there"
    if venv != CUDA_VENV:
        pin["venv"] = venv
        comments[key + ("venv",)] = where
    for base in ("nvidia-cuda-crt", "nvidia-nvvm"):
        if base in wheels and wheels[base][1] != version:
            notes.append(f"problem: {venv}: {wheels[base][0]} {wheels[base][1]} and {name} {version} differ; nvcc, "
                         f"crt and nvvm must be one release (a mix gives CCCL #error and PTX .version failures): the "
                         f"pin puts all at {version}")
    runtime = wheels.get("nvidia-cuda-runtime")
    versions, read_from = {}, []
    if runtime and runtime[1] != version:
        if CUDA_VERSION.match(runtime[1]):
            versions["nvidia-cuda-runtime"] = runtime[1]
            read_from.append(f"{runtime[0]}-{runtime[1]}.dist-info")
        else:
            unpinned.append(f"rigbook_pins.cuda_toolchain.versions: {runtime[0]} {runtime[1]!r} is no x.y.z release")
    for name_, version_ in _nccl_build_wheels(packages):  # what an nccl-tests build there compiles and links with
        if CUDA_VERSION.match(version_):
            versions[name_] = version_
            read_from.append(f"{name_}-{version_}.dist-info")
    if versions:
        pin["versions"] = versions
        comments[key + ("versions",)] = f"{where}: " + ", ".join(read_from)
    if name != "nvidia-cuda-nvcc":
        notes.append(f"{venv}: {name} is a suffixed (CUDA 12 style) wheel; the cuda_toolchain role installs "
                     "nvidia-cuda-runtime by that name and looks for nvcc under site-packages/nvidia/cuNN (CUDA 13's "
                     "layout): check what it would change with --check --diff")
    folder = _one_wheel_folder(packages, pin["packages"] + (["nvidia-cuda-runtime"] if runtime else [])
                               + [name for name in versions if name != "nvidia-cuda-runtime"])
    if folder:
        pin["wheel_dir"] = folder
        comments[key + ("wheel_dir",)] = ("--wheels-dir: the folder with the wheel of each of "
                                          + ", ".join(pin["packages"]))
    archives = sorted(f"{w[0]} from {redact(w[2]['archive'])}" for w in wheels.values()
                      if isinstance(w[2], dict) and w[2].get("archive"))
    if archives:
        unpinned.append("rigbook_pins.cuda_toolchain.wheel_dir: installed from files, not an index: "
                        + "; ".join(archives) + " (set wheel_dir to a folder of those wheels on the box if the "
                        "index does not have them)")
    return pin


def read_nccl_tests(facts, reading):
    """nccl-tests are files on the box that no process shows: never pinned; named as not read when an NCCL is
    pinned (the CUDA toolchain pin read just before)."""
    versions = (reading.pins.get("cuda_toolchain") or {}).get("versions") or {}
    if any(NCCL_WHEEL.match(name) for name in versions):
        reading.unpinned.append("rigbook_pins.nccl_tests: which nccl-tests the box runs is not read (set version and "
                                "source: {repo, commit} or a tarball {path or url, sha256}, and cuda_archs; without "
                                "them the collectives layer has no tool: rigbook_verify.allow_unknown: "
                                "[collectives])")
    return None


def _norm_uri(uri):
    """A source URI as apt-cache policy prints it: file:///x and file:/x alike, no trailing slash."""
    return re.sub(r"^file:/+", "file:/", uri or "").rstrip("/")


def _rocm_repo(rocm, reading):
    """The ROCm repository pin: the source apt has the installed rocm-core from (apt-cache policy), its keyring's
    sha256 as key_sha256 and the keyring itself as key_url (file://)."""
    comments, unpinned, notes = reading.comments, reading.unpinned, reading.notes
    key = ("rigbook_pins", "rocm", "repo")
    offered = []
    for line in rocm.get("policy") or []:
        words = line.split()
        if len(words) >= 3 and not words[1].endswith("/var/lib/dpkg/status"):
            offered.append((_norm_uri(words[1]), words[2].split("/")[0]))
    entries = [e for e in rocm.get("sources") or [] if any(
        (_norm_uri(u), s) in offered for u in e.get("uris") or [] for s in e.get("suites") or [])]
    if not entries:
        unpinned.append("rigbook_pins.rocm.repo: no configured apt source offers the installed rocm-core (apt-cache "
                        "policy): installed from .debs? list them as rigbook_pins.rocm.debs {path, sha256}")
        return None
    entry = entries[0]
    url = next(u for u in entry["uris"] if any(_norm_uri(u) == o[0] for o in offered))
    suite = next(s for s in entry["suites"] if (_norm_uri(url), s) in offered)
    components = entry.get("components") or []
    if not re.match(r"^(https?|file)://", url) or not APT_WORD.match(suite) or not all(map(APT_WORD.match,
                                                                                           components)):
        unpinned.append(f"rigbook_pins.rocm.repo: {entry['file']}: {url!r} {suite!r} {components!r} is no https, http "
                        "or file:// URL with plain suite and components")
        return None
    signed = entry.get("signed_by")
    digest = (rocm.get("keyrings") or {}).get(signed[0]) if isinstance(signed, list) and len(signed) == 1 else None
    if not SHA256.match(digest or ""):
        why = ("its Signed-By holds the key itself" if signed == "inline" else
               f"its Signed-By names {signed!r}" + (f" ({digest})" if digest else ""))
        unpinned.append(f"rigbook_pins.rocm.repo.key_sha256: {entry['file']}: {why}; the role needs one keyring "
                        "file: key_url and the sha256 of what it serves")
        return None
    where = f"{entry['file']} (the source apt-cache policy has rocm-core from)"
    repo = {"url": url, "suite": suite, "components": components or ["main"], "key_url": "file://" + signed[0],
            "key_sha256": digest}
    for field in ("url", "suite", "components"):
        comments[key + (field,)] = where
    comments[key + ("key_sha256",)] = f"sha256 of {signed[0]}, the keyring its Signed-By names"
    # apt_source fetches key_url on the host (file:// too), checks this sha256 and stores the file as it is: the
    # keyring on this box is exactly what the role would store. Another box needs the same file at that path, or
    # AMD's key URL with the sha256 of what it serves.
    comments[key + ("key_url",)] = ("this box's keyring (apt_source reads file:// on the host and keeps the file as "
                                    "it is)")
    notes.append(f"rigbook_pins.rocm.repo.key_url is {signed[0]} on this box: for another box copy that file there, "
                 "or set key_url to AMD's key (https://repo.radeon.com/rocm/rocm.gpg.key) and key_sha256 to the "
                 "sha256 of what it serves (a keyring made with gpg --dearmor has another sha256)")
    return repo


def read_rocm(facts, reading):
    """The ROCm pin: the release (/opt/rocm/.info/version, else rocm-core's version), the packages of that release
    installed by name, the repository, amdgpu-dkms, the engine's HSA_* environment."""
    comments, unpinned, notes = reading.comments, reading.unpinned, reading.notes
    rocm = facts.get("rocm")
    if not rocm:
        return None
    key = ("rigbook_pins", "rocm")
    packages = rocm.get("packages") or {}
    found = ROCM_RELEASE.match(rocm.get("version_file") or "")
    where = "/opt/rocm/.info/version"
    if not found and packages.get("rocm-core"):
        found, where = ROCM_RELEASE.match(packages["rocm-core"]), f"dpkg-query: rocm-core {packages['rocm-core']}"
    if not found:
        unpinned.append("rigbook_pins.rocm: the ROCm release could not be read (/opt/rocm/.info/version, rocm-core)")
        return None
    version = ".".join((found.group(1).split(".") + ["0"])[:3])
    pin = {"version": version}
    comments[key + ("version",)] = where
    tag = f".{rocm_tag(version)}-"
    release = sorted(n for n, v in packages.items() if tag in v and n != ROCM_DKMS_PACKAGE)
    manual = [n for n in release if n in (rocm.get("manual") or [])]
    # what the RCCL build needs (the role's build_packages) is pinned apart from the runtime
    build = [n for n in ROCM_BUILD_PACKAGES if n in manual]
    manual = [n for n in manual if n not in ROCM_BUILD_PACKAGES]
    chosen = sorted(manual, key=lambda n: (ROCM_PACKAGES.index(n) if n in ROCM_PACKAGES else len(ROCM_PACKAGES), n)
                    ) or [n for n in ROCM_PACKAGES if n in release]  # the role's four first, in its order
    if chosen:
        pin["packages"] = chosen
        comments[key + ("packages",)] = f"dpkg-query and apt-mark showmanual: the {version} packages installed by name"
    else:
        unpinned.append(f"rigbook_pins.rocm.packages: no installed package of ROCm {version} (versions *{tag}*)")
    if build != list(ROCM_BUILD_PACKAGES):
        pin["build_packages"] = build
        comments[key + ("build_packages",)] = (
            "dpkg-query and apt-mark showmanual: " + (f"of the RCCL build's packages only {', '.join(build)} are "
                                                      "installed by name" if build else "none of the RCCL build's "
                                                      "packages is installed by name (" + ", ".join(
                                                          ROCM_BUILD_PACKAGES) + ")"))
    repo = _rocm_repo(rocm, reading)
    if repo:
        pin["repo"] = repo
    pin["dkms"] = ROCM_DKMS_PACKAGE in packages
    comments[key + ("dkms",)] = (f"dpkg-query: {ROCM_DKMS_PACKAGE} " + packages[ROCM_DKMS_PACKAGE] + " is installed"
                                 if pin["dkms"] else f"dpkg-query: {ROCM_DKMS_PACKAGE} is not installed")
    for engine in facts.get("engines") or []:
        hsa = {k: v for k, v in (engine.get("env") or {}).items() if k.startswith("HSA_")}
        bad = [k for k, v in hsa.items() if not ENV_NAME.match(k) or re.search(r"[\x00-\x1f\x7f]", str(v))]
        notes += [f"rigbook_pins.rocm.hsa_env: {k!r} from /proc/{engine.get('pid')}/environ is no one-line "
                  "variable: not copied" for k in bad]
        hsa = {k: v for k, v in hsa.items() if k not in bad}
        if hsa:
            pin["hsa_env"] = hsa
            comments[key + ("hsa_env",)] = f"/proc/{engine.get('pid')}/environ (its HSA_* variables)"
            break
    return pin


def _stamp_source(component):
    """(pinned source or None, why not) of one component of a source_build stamp: "dir:REPO@COMMIT" is a repository
    at a commit; a sha256 is a tarball whose path or url the stamp does not keep."""
    source = str(component.get("source") or "")
    if source.startswith("dir:") and "@" in source:
        repo, _, commit = source[4:].rpartition("@")
        if HEX.match(commit) and len(commit) == 40 and repo and not re.search(r"\s", repo):
            found = {"repo": repo, "commit": commit}
            if component.get("subdir"):
                found["subdir"] = str(component["subdir"])
            return found, None
    if SHA256.match(source):
        return None, f"the tarball of sha256 {source} (the stamp keeps no path or url: add path or url with it)"
    return None, f"{source!r} is no repository at a 40-hex commit"


def read_rccl(facts, reading):
    """The RCCL pin from the build stamp of the prefix holding the librccl an engine has mapped (what the rccl role
    built: version, sources, patch set, GPU targets); any other mapped librccl/libnccl is named."""
    for engine in facts.get("engines") or []:
        for library in engine.get("libraries") or []:
            build = library.get("build") or {}
            stamp = build.get("stamp") if isinstance(build.get("stamp"), dict) else None
            if "build" not in library:
                continue
            if not stamp or stamp.get("name") != "rccl":
                reading.notes.append(f"/proc/{engine.get('pid')}/maps: {library.get('path')} (sha256 "
                                     f"{library.get('sha256')}): not a build of rigbook's source_build")
                continue
            return _rccl_of_stamp(stamp, build["path"], reading)
    return None


def _rccl_of_stamp(stamp, where, reading):
    comments, unpinned = reading.comments, reading.unpinned
    key, said = ("rigbook_pins", "rccl"), f"the build stamp {where}"
    if not CUDA_VERSION.match(str(stamp.get("version") or "")):
        unpinned.append(f"rigbook_pins.rccl: {said} has version {stamp.get('version')!r}, no x.y.z release")
        return None
    pin = {"version": stamp["version"]}
    comments[key + ("version",)] = said
    components = {c.get("name"): c for c in stamp.get("components") or [] if isinstance(c, dict)}
    for name, path in (("rccl", ("source",)), ("rccl-tests", ("tests",))):
        if name not in components:
            continue
        source, why = _stamp_source(components[name])
        if source and name == "rccl":
            pin["source"] = source
            comments[key + path] = said
        elif source:
            pin["tests"] = {"source": source}
            comments[key + path] = said
        else:
            unpinned.append(f"rigbook_pins.rccl.{'.'.join(path)}{'.source' if name != 'rccl' else ''}: {said}: {why}")
    rccl = components.get("rccl") or {}
    patches = []
    for entry in rccl.get("patches") or []:
        found = STAMP_PATCH.match(str(entry))
        if not found:
            unpinned.append(f"rigbook_pins.rccl.patches: {said}: {str(entry)!r} is no NAME -pN SHA256 entry")
            continue
        patch = {"name": found.group(1), "sha256": found.group(3)}
        if found.group(2) != "1":
            patch["strip"] = int(found.group(2))
        patches.append(patch)
    if patches:
        pin["patches"] = patches
        comments[key + ("patches",)] = said + " (names of the rccl role's files/patches/)"
    for arg in rccl.get("cmake_args") or []:
        if str(arg).startswith("-DGPU_TARGETS="):
            targets = [t for t in str(arg).split("=", 1)[1].split(";") if re.match(r"^gfx[0-9a-f]{3,5}$", t)]
            if targets:
                pin["gpu_targets"] = targets
                comments[key + ("gpu_targets",)] = said + " (-DGPU_TARGETS)"
    return pin


def sglang_engine(facts):
    """(engine, its sglang distribution) of the first running engine whose venv has sglang, or (None, None): the
    engine the SGLang pin is read from (adopt writes that engine's lock and local patch beside the pins)."""
    for engine in facts.get("engines") or []:
        found = [p for p in engine.get("packages") or [] if p.get("name") == "sglang"]
        if found:
            return engine, found[0]
    return None, None


def read_sglang(facts, reading):
    """The SGLang pin: the version of the engine's sglang, its venv when made by hand (not the sglang role's), and
    what rigbook's pinned_venv stamp there says of how it was made."""
    engine, sglang = sglang_engine(facts)
    if engine is None:
        return None
    comments = reading.comments
    pin = {"version": sglang["version"]}
    install = sglang.get("install")
    comments[("rigbook_pins", "sglang", "version")] = (
        f"{engine.get('venv')}: sglang {sglang['version']}"
        + ("" if install == "index" else " installed from " + redact(json.dumps(install, sort_keys=True))))
    venv = engine.get("venv") or ""
    if venv and not venv.startswith(SGLANG_ROOT):
        pin["venv"] = venv  # a venv made by hand: kept, never replaced (pinned_venv adopt)
        comments[("rigbook_pins", "sglang", "venv")] = f"/proc/{engine['pid']}: the engine's interpreter's venv"
    if engine.get("venv_stamp"):
        _from_venv_stamp(engine, pin, reading)
    return pin


def _from_venv_stamp(engine, pin, reading):
    """What rigbook's pinned_venv stamp in the engine's venv says of how it was made: the patch set by name and
    sha256 (the sglang role's own patches), --no-deps and the wheel folder (--no-index --find-links)."""
    comments, notes = reading.comments, reading.notes
    stamp = engine["venv_stamp"]
    where = f"{engine.get('venv')}/.rigbook-venv.json (rigbook's stamp)"
    key = ("rigbook_pins", "sglang")
    patches = []
    for entry in stamp.get("patches") or []:
        found = re.match(r"^([A-Za-z0-9._+-]+\.patch) -p\d+ ([0-9a-f]{64})$", str(entry))
        if not found:
            notes.append(f"{where}: patch entry {entry!r} is not one adopt reads: not pinned")
            continue
        patches.append({"name": found.group(1), "sha256": found.group(2)})
    if patches:
        pin["patches"] = patches
        comments[key + ("patches",)] = where
    if stamp.get("no_deps") is True:
        pin["no_deps"] = True
        comments[key + ("no_deps",)] = where
    if stamp.get("byte_compile") is False:
        pin["byte_compile"] = False
        comments[key + ("byte_compile",)] = where
    links = stamp.get("find_links") or []
    if stamp.get("no_index") is True and len(links) == 1 and str(links[0]).startswith("/"):
        pin["wheel_dir"] = links[0]
        comments[key + ("wheel_dir",)] = where


# --- the table ----------------------------------------------------------------------------------------------------

class Pin:
    """One pin: NAME (its key under rigbook_pins; KEY is the whole path), FORWARD(raw pins, ctx) -> its pin of the
    host model (CTX: {"pins": the model's pins built so far, "os_id", "python", "p2p"}: what build decided before),
    INVERSE(facts, reading) -> the pin adopt writes of what adopt_facts read, or None (the reason in
    reading.unpinned when there is one)."""

    def __init__(self, name, forward, inverse):
        self.name = name
        self.key = "rigbook_pins." + name
        self.forward = forward
        self.inverse = inverse

    def __repr__(self):
        return "Pin(%s)" % self.name


# In the host model's order; each forward may read the pins before it (nvidia_driver: the kernel's command line).
PINS = [
    Pin("kernel", lambda raw, ctx: kernel_pin(raw), read_kernel),
    Pin("nvidia_driver", lambda raw, ctx: nvidia_driver_pin(raw, ctx["pins"]["kernel"], ctx["os_id"]),
        read_nvidia_driver),
    Pin("cuda_toolchain", lambda raw, ctx: cuda_toolchain_pin(raw, ctx["python"]), read_cuda_toolchain),
    Pin("nccl_tests", lambda raw, ctx: nccl_tests_pin(raw), read_nccl_tests),
    Pin("rocm", lambda raw, ctx: rocm_pin(raw, ctx["p2p"]), read_rocm),
    Pin("rccl", lambda raw, ctx: rccl_pin(raw), read_rccl),
    Pin("sglang", lambda raw, ctx: sglang_pin(raw), read_sglang),
]
BY_NAME = {pin.name: pin for pin in PINS}


def forward_pins(raw_pins, os_id="", python="", p2p=None):
    """{name: pin of the host model} of every pin of PINS, in order, from the inventory's rigbook_pins RAW_PINS (a
    dict), the OS decision's id, the venvs' Python ("3.12") and the model's p2p (its nccl_p2p_level)."""
    raw_pins = as_dict(raw_pins)
    ctx = {"pins": {}, "os_id": os_id, "python": python, "p2p": p2p or {"nccl_p2p_level": ""}}
    for pin in PINS:
        ctx["pins"][pin.name] = pin.forward(raw_pins, ctx)
    return ctx["pins"]


def read_pins(facts, reading=None):
    """The Reading of every pin of PINS, in order, from FACTS (what adopt_facts read): reading.pins holds the pins
    adopt writes ({name: pin}, only those read)."""
    reading = reading or Reading()
    for pin in PINS:
        found = pin.inverse(facts, reading)
        if found:
            reading.pins[pin.name] = found
    return reading
