# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host model: what one host is, decided once from its merged rigbook_* variables.

Pure; standard library only. The preflight role computes it on the controller (action rigbook.homelab.host_model,
plugins/action/host_model.py) and sets it as the one fact `rigbook_host`; `provision validate`, report, manifest and
baselines call the same build().
Roles, modules and judges read the model and nothing else, so every default, the P2P-expected rule, the GPU
environment file and each serve profile's unit, port and timeouts are decided here and nowhere else.

- build(variables, facts): the complete, defaulted model (see MODEL_KEYS). VARIABLES are the host's merged rigbook_*
  variables after the schema check; a value of the wrong type is read as absent, never a traceback. FACTS are the
  host's gathered Ansible facts (the preflight play gathers them): the one OS decision (os_of) is made from them;
  without them (`provision validate` on the controller) the OS is unknown and what depends on it is the union of
  what every supported distribution needs.
- readiness(model, roles, ...): every input a role of the play needs and the inventory lacks, each with the key
  path, the role, why the role needs it and how to get it. The roles' own asserts check exactly this list
  (rigbook_host.readiness), so an assert can never catch what `provision validate` did not.

The pins (model["pins"]) are defaulted by host_pins.PINS, the one table of rigbook_pins: each pin's forward (used
here) beside its inverse (what `provision adopt` reads on a box -> that pin).

Names: the "host model" is this; a "serve profile" is one rigbook_serve item; the lab's recorded hardware is a
"lab rig"; the JSON Schema checks the "host variables".
"""

from __future__ import annotations

import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils import host_pins
from ansible_collections.rigbook.homelab.plugins.module_utils.host_pins import (  # noqa: F401 (host_model.kernel_pin, ...)
    CCCL_WHEEL,
    CUDA_ALIGNED,
    DISTRO_KERNEL,
    apt_regex,
    as_dict,
    as_list,
    as_str,
    cuda_toolchain_pin,
    kernel_pin,
    nccl_tests_pin,
    nvidia_driver_pin,
    nvidia_stock_packages,
    rccl_pin,
    rocm_pin,
    rocm_tag,
    sglang_pin,
    unattended_blacklist,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import expectations
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve_profile

MODEL_VERSION = 1
# The GPU stack's one environment file (systemd EnvironmentFile= format), on both vendors: each role owns a block
# (gpu_env module); the collectives layer runs its tests with it and every serve unit reads it first, so what was
# verified is what serves.
GPU_ENV_FILE = "/etc/rigbook/gpu.env"
EVIDENCE_ROOT = "/"
ARTIFACT_DIR = "/var/cache/rigbook/artifacts"
# The rccl role's active prefix (rccl_install_root/current) and the file in a ROCm torch wheel that its libtorch's
# DT_RPATH finds before LD_LIBRARY_PATH: the engine runs the verified RCCL only when that file is the prefix's.
RCCL_ROOT = "/opt/rigbook/rccl"
RCCL_CURRENT = RCCL_ROOT + "/current"
BUNDLED_RCCL = "torch/lib/librccl.so.1"
# NVIDIA: the nccl_tests role builds nccl-tests into NCCL_TESTS_ROOT/<version>-stock against the NCCL wheel pinned in
# the CUDA toolchain venv, laid out there as an NCCL_HOME (nccl/include, nccl/lib); the engine's torch finds its
# NCCL through its RPATH in the venv's nvidia/nccl/lib, which the sglang role links to that same file.
NCCL_TESTS_ROOT = "/opt/rigbook/nccl-tests"
NCCL_TESTS_CURRENT = NCCL_TESTS_ROOT + "/current"
BUNDLED_NCCL = "nvidia/nccl/lib/libnccl.so.2"
KEY_DIR = "/var/cache/rigbook/keys"
# node_exporter's textfile directory as Debian and Ubuntu package it (prometheus-node-exporter's built-in
# --collector.textfile.directory default; its /etc/default file passes no other): the health timer's metrics go there.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
HEALTH_INTERVAL_S = 300

# The roles of site.yml, in order, with the tags site.yml gives them and the hosts they run on. ("vendor" roles run
# on hosts of that rigbook_gpu.vendor; "pin" roles where that pin is set; "serve" where rigbook_serve has profiles.)
ROLES = (
    ("bios_checklist", ("bios_checklist",), ("nvidia", "amd")),
    ("kernel", ("kernel",), ("nvidia", "amd")),
    ("nvidia_p2p_driver", ("nvidia_p2p_driver",), ("nvidia",)),
    ("cuda_toolchain", ("cuda_toolchain",), ("nvidia",)),
    ("nccl_tests", ("nccl_tests",), "pin:nccl_tests"),
    ("multi_user_target", ("multi_user_target",), ("nvidia",)),
    ("amd_rocm", ("amd_rocm",), ("amd",)),
    ("rccl", ("rccl",), ("amd",)),
    ("p2p_verify", ("ladder", "serving"), ("nvidia", "amd", "")),
    ("sglang", ("sglang", "serve"), "pin:sglang"),
    ("serve", ("serve",), "serve"),
    ("health", ("health",), "health"),
)
ROLE_TAGS = {name: tags for name, tags, _ in ROLES}
# The roles that change what rigbook_manage can leave to the box's owner (a cloud VM, a cloud image): role -> the
# rigbook_manage key. Left alone, readiness asks nothing of them and site.yml skips them; the ladder still judges.
MANAGED = {"kernel": "kernel", "nvidia_p2p_driver": "nvidia_driver"}

# RDNA4 (GC 12.0.x: gfx1200/gfx1201; the R9700 and RX 9070/9060) is driven by mainline amdgpu from Linux 6.11 (the
# drm-next pull for 6.11-rc1: "GC 12.0 support"); a kernel series before that needs AMD's amdgpu-dkms or a kernel
# carrying those patches (docs/amd.md, "amdgpu-dkms and RDNA4", with the sources).
RDNA4_TARGET = re.compile(r"^gfx120[0-9a-f]$")
RDNA4_MODEL = re.compile(r"\b(R9700|RX ?90[67]0( ?XT| ?GRE)?)\b", re.I)
GFX12_IN_TREE = (6, 11)
HEX40 = re.compile(r"^[0-9a-f]{40}$")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- the facts the model reads ---------------------------------------------------------------------------------
# (The pins, defaulted: host_pins.PINS, each pin's forward beside adopt's inverse of it.)

OS_FACTS = ("distribution", "distribution_version", "distribution_release")
# The facts the model reads: the OS decision's, and the Python a venv on the box is made with (its site-packages).
MODEL_FACTS = OS_FACTS + ("python",)


def python_of(facts):
    """"MAJOR.MINOR" of the Python the roles make venvs with (Ansible's python fact), or "" without facts."""
    version = as_dict(as_dict(as_dict(facts).get("python")).get("version"))
    major, minor = version.get("major"), version.get("minor")
    return "%s.%s" % (major, minor) if isinstance(major, int) and isinstance(minor, int) else ""


def os_of(facts):
    """The one OS decision: {"id" ("ubuntu", "debian", another lowercased name, or "" unknown), "version",
    "codename"} from the host's Ansible facts (distribution, distribution_version, distribution_release: what Ansible
    reads from /etc/os-release). No facts: unknown."""
    facts = as_dict(facts)
    return {"id": as_str(facts.get("distribution")).strip().lower(),
            "version": as_str(facts.get("distribution_version")),
            "codename": as_str(facts.get("distribution_release"))}


def manage_of(raw, vendor, pins, p2p):
    """What rigbook manages on the box, decided once: {"kernel", "nvidia_driver"} (bools). RAW is rigbook_manage (a
    VM or cloud image whose kernel or driver is the provider's says false). The NVIDIA driver is also left alone where
    no P2P is expected and the pin asks for nothing to build or install (a one-GPU box, or one declared without P2P, on
    its stock driver: no pin, or its version alone, which the ladder judges); a pin of a fork or an installer
    (host_pins.NVIDIA_DRIVER_BUILD) is managed either way (seed 000 runs the fork without working P2P, for its
    speed)."""
    raw = as_dict(raw)
    driver = raw.get("nvidia_driver") is not False and vendor == "nvidia" and (
        p2p["expected"] or pins["nvidia_driver"]["installs"])
    return {"kernel": raw.get("kernel") is not False, "nvidia_driver": driver}


def _artifacts(vendor, pins, manage):
    """The artifacts site.yml checks by sha256 before anything is installed (each {url or path, sha256[, dest_dir]}):
    only those of what rigbook manages (MANAGE)."""
    found = list(pins["kernel"]["debs"]) if manage["kernel"] else []
    if vendor == "nvidia" and manage["nvidia_driver"]:
        driver = pins["nvidia_driver"]
        found += [driver["source"]] if driver["source"].get("sha256") else []
        found += [driver["userspace_installer"]] if driver["userspace_installer"] else []
    if vendor == "nvidia":
        found += [pins["nccl_tests"]["source"]] if pins["nccl_tests"]["source"].get("sha256") else []
    elif vendor == "amd":
        rocm, rccl = pins["rocm"], pins["rccl"]
        found += rocm["debs"]
        if rocm["repo"].get("key_url") and rocm["repo"].get("key_sha256"):
            found.append({"url": rocm["repo"]["key_url"], "sha256": rocm["repo"]["key_sha256"], "dest_dir": KEY_DIR})
        amdgpu = rocm["amdgpu_repo"]
        key = {"url": amdgpu.get("key_url"), "sha256": amdgpu.get("key_sha256"), "dest_dir": KEY_DIR}
        if rocm["dkms"] and key["url"] and key["sha256"] and key not in found:
            found.append(key)
        found += [rccl["source"]] if rccl["source"].get("sha256") else []
        found += [rccl["tests_source"]] if rccl["tests_source"].get("sha256") else []
    return found


def _roles(vendor, pins, serve, manage, health_on=False):
    roles = []
    for name, _tags, hosts in ROLES:
        if name in MANAGED and not manage[MANAGED[name]]:
            continue
        if isinstance(hosts, str) and hosts.startswith("pin:"):
            wanted = pins[hosts[len("pin:"):]]["pinned"]
        elif hosts == "serve":
            wanted = bool(serve)
        elif hosts == "health":
            wanted = health_on
        else:
            wanted = vendor in hosts
        if wanted:
            roles.append(name)
    return roles


def build(variables, facts=None):
    """The host model of one host's merged rigbook_* variables (a dict; see the module docstring) and, where they
    were gathered, its Ansible FACTS (the OS decision)."""
    variables = as_dict(variables)
    host_os = os_of(facts)
    python = python_of(facts)
    gpu = as_dict(variables.get("rigbook_gpu"))
    declared_p2p = as_dict(variables.get("rigbook_p2p"))
    raw_pins = as_dict(variables.get("rigbook_pins"))
    vendor = as_str(gpu.get("vendor"))
    p2p = {
        "expected": expectations.p2p_expected({"gpu": gpu, "p2p": declared_p2p}),
        "declared": "expected" in declared_p2p,
        "reason": " ".join(as_str(declared_p2p.get("reason")).split()),
        "nccl_p2p_level": as_str(declared_p2p.get("nccl_p2p_level")),
    }
    pins = host_pins.forward_pins(raw_pins, host_os["id"], python, p2p)  # every pin of host_pins.PINS, defaulted
    serve, serve_errors = serve_profile.normalize_all(variables.get("rigbook_serve"))
    health = health_settings(variables.get("rigbook_health"), bool(vendor))
    manage = manage_of(variables.get("rigbook_manage"), vendor, pins, p2p)
    model = {
        "version": MODEL_VERSION,
        "vendor": vendor,
        "gpu": {
            "vendor": vendor,
            "model": as_str(gpu.get("model")),
            "count": _int(gpu.get("count")),
            "vram_gib": gpu.get("vram_gib"),
            "pcie": as_dict(gpu.get("pcie")),
            "per_gpu": as_list(gpu.get("per_gpu")),
        },
        "p2p": p2p,
        "os": host_os,
        "gpu_env_file": GPU_ENV_FILE,
        "evidence_root": as_str(variables.get("rigbook_evidence_root")) or EVIDENCE_ROOT,
        "tolerance": expectations.tolerance(None, as_dict(variables.get("rigbook_tolerance"))),
        # the shipped per-hardware-class figures (references/NAME.yml) that judge the box until it has a baseline
        "reference": as_str(variables.get("rigbook_reference")),
        "pins": pins,
        # what rigbook changes on the box (rigbook_manage, manage_of); the ladder judges the pins either way
        "manage": manage,
        "artifacts": _artifacts(vendor, pins, manage),
        "serve": serve,
        "serve_errors": serve_errors,
        "roles": _roles(vendor, pins, serve, manage, health["enabled"]),
        # where the collectives layer finds the tests the roles built (rccl-tests / nccl-tests), "" for none
        "collectives_tests_dir": collectives_tests_dir(vendor, pins),
        # where the rccl and nccl_tests roles keep their prefixes (<root>/<version>-<patch set>, <root>/current)
        "install_roots": {"rccl": RCCL_ROOT, "nccl_tests": NCCL_TESTS_ROOT},
        # what the SGLang venv must resolve its bundled collectives library to (pinned_venv libraries): the library
        # the collectives tests load and the collectives layer measured; none without rigbook-built tests
        "engine_libraries": engine_libraries(vendor, pins),
        "verify": verify_settings(variables.get("rigbook_verify"), bool(vendor), bool(serve)),
        "health": health,
    }
    model["box_facts"] = box_facts(model)
    model["box_paths"] = box_paths(model)
    return model


def health_settings(raw, gpus):
    """The health timer (rigbook_health): on by default on a box whose rigbook_gpu names its vendor; its interval and
    where node_exporter's textfile collector reads its metrics; where the alert rules go, if set (docs/health.md)."""
    raw = as_dict(raw)
    interval = raw.get("interval_s")
    folder = as_str(raw.get("textfile_dir")) or TEXTFILE_DIR
    return {
        "enabled": gpus and raw.get("enabled", True) is not False,
        "interval_s": interval if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0
        else HEALTH_INTERVAL_S,
        "textfile": folder.rstrip("/") + "/rigbook.prom",
        # where the health role installs the Prometheus alert rules (roles/health/files/rigbook-alerts.yml); "" none
        "prometheus_rules_dir": as_str(raw.get("prometheus_rules_dir")).rstrip("/"),
    }


def collectives_tests_dir(vendor, pins):
    if vendor == "amd" and pins["rccl"]["pinned"]:
        return RCCL_CURRENT + "/bin"
    if vendor == "nvidia" and pins["nccl_tests"]["pinned"]:
        return NCCL_TESTS_CURRENT + "/bin"
    return ""


def engine_libraries(vendor, pins):
    if vendor == "amd" and pins["rccl"]["pinned"]:
        return [{"bundled": BUNDLED_RCCL, "target": RCCL_CURRENT + "/lib/librccl.so.1"}]
    if vendor == "nvidia" and pins["nccl_tests"]["pinned"] and pins["cuda_toolchain"]["nccl"]:
        return [{"bundled": BUNDLED_NCCL, "target": NCCL_TESTS_CURRENT + "/nccl/lib/libnccl.so.2"}]
    return []


def verify_settings(raw, gpus, serving):
    """How the ladder runs on the host (rigbook_verify): what it must measure (`measure`: on a box whose rigbook_gpu
    names its GPUs' vendor every layer, the serving layer only with serve profiles - the ladder's registry turns this
    into layer names, ladder/registry.expected_layers; an unknown one fails the play), the layers allowed to stay
    unknown, and the venv with PyTorch for the bundled collectives benchmark."""
    raw = as_dict(raw)
    return {
        "measure": {"layers": bool(gpus), "serving": bool(gpus and serving)},
        "allow_unknown": [str(name) for name in as_list(raw.get("allow_unknown"))],
        "collectives_python": as_str(raw.get("collectives_python")),
    }


def ladder_view(model):
    """What the ladder's judges read of the model: {gpu, p2p, pins, tolerance, measure, allow_unknown}. p2p carries
    `expected` only when the inventory declared it: undeclared, the judges apply the one rule
    (judges/expectations.p2p_expected) to the GPUs they saw."""
    if not isinstance(model, dict) or "pins" not in model:
        return {}
    p2p = {"reason": model["p2p"]["reason"], "nccl_p2p_level": model["p2p"]["nccl_p2p_level"]}
    if model["p2p"]["declared"]:
        p2p["expected"] = model["p2p"]["expected"]
    pins = {name: pin for name, pin in model["pins"].items() if pin.get("pinned")}
    verify = model.get("verify") or {}
    return {"gpu": model["gpu"], "p2p": p2p, "pins": pins, "tolerance": model["tolerance"],
            "measure": verify.get("measure") or {}, "allow_unknown": verify.get("allow_unknown") or []}


def box_facts(model):
    """What the inventory tells about the box, as the serve profile checks read it (serve/profile.check_all)."""
    facts = {"p2p_expected": model["p2p"]["expected"]}
    if model["gpu"]["count"] is not None:
        facts["gpu_count"] = model["gpu"]["count"]
    if model["vendor"]:
        facts["vendor"] = model["vendor"]
    return facts


# --- readiness -----------------------------------------------------------------------------------------------

# The inputs each role needs that have no default: removing any one from a converging inventory makes readiness
# name it (tests/unit/plugins/module_utils/test_host_model.py removes each from the lab inventory, role by role).
# NAMED: every key path a readiness rule of the role may name (alternatives such as a fork's commit for its source,
# and bad values).
INPUTS = {
    "kernel": ("rigbook_pins.kernel.release", "rigbook_pins.kernel.debs"),
    "nvidia_p2p_driver": ("rigbook_pins.nvidia_driver.version", "rigbook_pins.nvidia_driver.source",
                          "rigbook_pins.nvidia_driver.userspace_installer"),
    "cuda_toolchain": ("rigbook_pins.cuda_toolchain.version",),
    "amd_rocm": ("rigbook_pins.rocm.version", "rigbook_pins.rocm.repo"),
    "rccl": ("rigbook_pins.rccl.version", "rigbook_pins.rccl.source", "rigbook_pins.rccl.tests.source",
             "rigbook_pins.rccl.gpu_targets"),
    "nccl_tests": ("rigbook_pins.nccl_tests.version", "rigbook_pins.nccl_tests.source"),
    "sglang": ("rigbook_pins.sglang.version",),
    "serve": ("rigbook_pins.sglang",),
}
NAMED = {
    "kernel": INPUTS["kernel"],
    "nvidia_p2p_driver": INPUTS["nvidia_p2p_driver"] + ("rigbook_pins.nvidia_driver.commit",
                                                        "rigbook_pins.nvidia_driver.userspace_flags"),
    "cuda_toolchain": INPUTS["cuda_toolchain"] + ("rigbook_pins.cuda_toolchain.versions",),
    "amd_rocm": INPUTS["amd_rocm"] + ("rigbook_pins.rocm.debs", "rigbook_pins.rocm.packages", "rigbook_pins.rocm.dkms",
                                      "rigbook_pins.rocm.build_packages", "rigbook_pins.rocm.amdgpu_repo",
                                      "rigbook_pins.rocm.amdgpu_repo.key_sha256"),
    "rccl": INPUTS["rccl"] + ("rigbook_pins.rccl.patches[].path", "rigbook_pins.rccl.patches[].sha256"),
    "nccl_tests": INPUTS["nccl_tests"] + ("rigbook_pins.cuda_toolchain.versions",),
    "sglang": INPUTS["sglang"] + ("rigbook_pins.sglang.repo.commit", "rigbook_pins.sglang.lock",
                                  "rigbook_pins.sglang.patches[].path", "rigbook_pins.sglang.patches[].sha256"),
    "serve": INPUTS["serve"],
}


def _need(role, key, why, how):
    """One missing input: its key path, the role that needs it, why, how to get it; text says all of it."""
    need = {"role": role, "key": key, "why": why, "how": how}
    need["text"] = "%s: %s" % (key, need_text(need))
    return need


def _kernel_needs(model):
    pin = model["pins"]["kernel"]
    if not pin["release"]:
        return [_need("kernel", "rigbook_pins.kernel.release",
                      "the kernel role installs, holds and boots the pinned kernel",
                      "the release the box should boot (`uname -r` on the box that works), e.g. 6.8.0-90-generic")]
    if pin["source"] == "debs" and not pin["debs"]:
        custom = "" if DISTRO_KERNEL.match(pin["release"]) else (
            "%s is no distribution kernel (no archive has linux-image-%s), so " % (pin["release"], pin["release"]))
        return [_need("kernel", "rigbook_pins.kernel.debs",
                      "%sthe kernel role installs it from its .deb files" % custom,
                      "list each .deb of the build (linux-image-*, linux-headers-*, and linux-modules-* if split; "
                      "`make bindeb-pkg` writes them beside the source tree) as {path: /abs/file.deb or url: ..., "
                      "sha256: ...}; the sha256 is `sha256sum FILE`")]
    return []


def _nvidia_driver_needs(model):
    pin = model["pins"]["nvidia_driver"]
    role = "nvidia_p2p_driver"
    if not pin["version"]:
        return [_need(role, "rigbook_pins.nvidia_driver.version",
                      "the nvidia_p2p_driver role builds the P2P driver fork through DKMS at this version",
                      "the fork's driver version (its branch name, e.g. 595.58.03-p2p -> 595.58.03)")]
    needs = []
    if not pin["source"].get("sha256") and not (pin["fork_repo"] and pin["commit"]):
        if pin["fork_repo"]:
            branch = pin["branch"] or "BRANCH"
            needs.append(_need(role, "rigbook_pins.nvidia_driver.commit",
                               "the fork is built from a pinned commit (a branch moves: it is not a pin)",
                               "`git ls-remote %s refs/heads/%s` prints the branch's commit: set commit to it"
                               % (pin["fork_repo"], branch)))
        else:
            needs.append(_need(role, "rigbook_pins.nvidia_driver.source",
                               "the role needs the fork's source: an artifact with sha256, or fork_repo and commit",
                               "a tarball of the fork ({url or path, sha256}), or fork_repo + the commit "
                               "`git ls-remote REPO refs/heads/BRANCH` prints"))
    if not pin["userspace_installer"]:
        version = pin["userspace_version"]
        needs.append(_need(role, "rigbook_pins.nvidia_driver.userspace_installer",
                           "the userspace (libcuda, nvidia-smi) of the same version is installed from NVIDIA's .run "
                           "installer with --no-kernel-modules",
                           "{url: https://download.nvidia.com/XFree86/Linux-x86_64/%s/NVIDIA-Linux-x86_64-%s.run, "
                           "sha256: ...}: download it once and `sha256sum` it" % (version, version)))
    if "--no-kernel-modules" not in [str(f) for f in pin["userspace_flags"]]:
        needs.append(_need(role, "rigbook_pins.nvidia_driver.userspace_flags",
                           "the kernel modules come from the fork through DKMS; the .run installer must not "
                           "install its own", "add --no-kernel-modules to userspace_flags"))
    return needs


def _cuda_toolchain_needs(model):
    pin = model["pins"]["cuda_toolchain"]
    if not pin["version"]:
        return [_need("cuda_toolchain", "rigbook_pins.cuda_toolchain.version",
                      "the cuda_toolchain role installs nvcc, crt and nvvm at one release",
                      "the release of the nvidia-cuda-nvcc wheel the box uses (`pip show nvidia-cuda-nvcc`), "
                      "e.g. 13.0.88")]
    aligned = [(name, pin["wanted"].get(name, "")) for name in pin["packages"] if name in CUDA_ALIGNED]
    if len(set(version for _, version in aligned)) > 1:
        return [_need("cuda_toolchain", "rigbook_pins.cuda_toolchain.versions",
                      "nvcc, crt and nvvm must be one release (a mix gives CCCL #error and PTX .version failures): "
                      + ", ".join("%s %s" % pair for pair in aligned),
                      "pin the three to one version (drop them from versions)")]
    return []


def _rocm_needs(model):
    pin = model["pins"]["rocm"]
    needs = []
    if not pin["version"]:
        needs.append(_need("amd_rocm", "rigbook_pins.rocm.version",
                           "the amd_rocm role installs and holds ROCm at this release",
                           "the release the box runs: `cat /opt/rocm/.info/version` (e.g. 7.1.0)"))
    if not pin["repo"] and not pin["debs"]:
        release = pin["version"] or "VERSION"
        needs.append(_need("amd_rocm", "rigbook_pins.rocm.repo",
                           "ROCm's packages come from AMD's signed apt repository (or .debs listed under debs)",
                           "repo: {url: https://repo.radeon.com/rocm/apt/%s, suite: noble, components: [main], "
                           "key_url: https://repo.radeon.com/rocm/rocm.gpg.key, key_sha256: `curl -fsSL KEY_URL | "
                           "sha256sum`}" % release))
    elif pin["repo"] and pin["debs"]:
        needs.append(_need("amd_rocm", "rigbook_pins.rocm.debs",
                           "set only one of repo or debs: the role installs from one of them",
                           "remove debs, or remove repo"))
    if pin["debs"] and not pin["repo"]:
        files = [os.path.basename(as_str(d.get("path") or d.get("url"))) for d in pin["debs"] if isinstance(d, dict)]
        lacking = [n for n in pin["build_packages"] if not any(f.startswith(n + "_") for f in files)]
        if lacking:
            needs.append(_need("amd_rocm", "rigbook_pins.rocm.build_packages",
                               "the rccl role's build needs %s from the same ROCm release; offline, their .debs come "
                               "from debs" % ", ".join(lacking),
                               "add their .debs (NAME_VERSION_amd64.deb from AMD's repository pool) to debs, or set "
                               "build_packages: [] on a box that never builds RCCL"))
    needs += _rdna4_driver_needs(model)
    needs += _amdgpu_repo_needs(pin)
    if not pin["dkms"] and pin["dkms_package"] in pin["packages"]:
        needs.append(_need("amd_rocm", "rigbook_pins.rocm.packages",
                           "%s replaces the kernel's in-tree amdgpu (which carries the pinned kernel's P2P fixes)"
                           % pin["dkms_package"], "remove it from packages, or set dkms: true"))
    return needs


def _amdgpu_repo_needs(pin):
    """dkms: true: where amdgpu-dkms comes from. AMD publishes it in its graphics repository, not in the ROCm one; from
    .debs, its own file among them."""
    if not pin["dkms"]:
        return []
    files = [os.path.basename(as_str(d.get("path") or d.get("url"))) for d in pin["debs"] if isinstance(d, dict)]
    if pin["debs"] and any(f.startswith(pin["dkms_package"] + "_") for f in files):
        return []
    repo = pin["amdgpu_repo"]
    if not repo:
        return [_need("amd_rocm", "rigbook_pins.rocm.amdgpu_repo",
                      "dkms: true installs %s, which AMD publishes in its graphics repository "
                      "(repo.radeon.com/amdgpu/<release>/ubuntu), not in the ROCm repository" % pin["dkms_package"],
                      "amdgpu_repo: {url: https://repo.radeon.com/amdgpu/RELEASE/ubuntu, suite: noble, components: "
                      "[main]}, RELEASE the driver release of your ROCm (amdgpu-install's "
                      "/etc/apt/sources.list.d/amdgpu.list names it); AMD signs it with the ROCm repository's key, "
                      "which it shares unless you give key_url and key_sha256%s"
                      % ("" if pin["repo"] else "; offline, list %s_*.deb (and its firmware .deb) under debs instead"
                         % pin["dkms_package"]))]
    if not repo["key_url"] or not repo["key_sha256"]:
        return [_need("amd_rocm", "rigbook_pins.rocm.amdgpu_repo.key_sha256",
                      "the graphics repository's signing key is pinned by sha256, and there is no ROCm repository "
                      "key to share (ROCm comes from .debs)",
                      "key_url: https://repo.radeon.com/rocm/rocm.gpg.key (AMD signs both repositories with it), "
                      "key_sha256: `curl -fsSL KEY_URL | sha256sum`")]
    return []


def kernel_series(release):
    """(major, minor) of a kernel release such as 6.8.12-r9700-p2p-dma44, or None."""
    found = re.match(r"^([0-9]+)\.([0-9]+)", release or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def rdna4(model):
    """The GPUs are RDNA4 (GC 12.0.x): by the RCCL pin's gfx targets, else by rigbook_gpu.model."""
    targets = [str(t) for t in model["pins"]["rccl"]["gpu_targets"]]
    return any(RDNA4_TARGET.match(t) for t in targets) or bool(RDNA4_MODEL.search(model["gpu"]["model"] or ""))


def _rdna4_driver_needs(model):
    """An RDNA4 box on a kernel series before 6.11: whether amdgpu-dkms drives the GPUs must be said (rocm.dkms),
    never defaulted: the in-tree amdgpu of such a kernel does not know GC 12.0 unless the kernel carries it."""
    pin, release = model["pins"]["rocm"], model["pins"]["kernel"]["release"]
    series = kernel_series(release)
    if pin["dkms_declared"] or not series or series >= GFX12_IN_TREE or not rdna4(model):
        return []
    return [_need("amd_rocm", "rigbook_pins.rocm.dkms",
                  "the GPUs are RDNA4 (GC 12.0.1) and the pinned kernel %s is a %d.%d kernel: mainline amdgpu drives "
                  "GC 12.0 from Linux 6.11 on (drm-next pull for 6.11-rc1), so its in-tree amdgpu cannot, unless "
                  "the kernel carries those patches; AMD's ROCm install for Ubuntu 24.04 (6.8 GA kernel) installs "
                  "amdgpu-dkms (docs/amd.md)" % (release, series[0], series[1]),
                  "on the box: `modinfo -F firmware amdgpu | grep gc_12_0_1` (the module names GC 12.0.1 firmware: "
                  "it drives the card) and `dkms status` (amdgpu listed: amdgpu-dkms is in use); set dkms: true to "
                  "have the role install and hold amdgpu-dkms, or dkms: false when the kernel's own amdgpu names "
                  "gc_12_0_1")]


def _rccl_needs(model):
    pin = model["pins"]["rccl"]
    needs = []
    if not pin["version"]:
        needs.append(_need("rccl", "rigbook_pins.rccl.version", "the rccl role builds this RCCL release",
                           "the RCCL version the box runs (e.g. 2.27.7)"))
    if not pin["source"].get("sha256") and not (pin["repo"] and HEX40.match(pin["commit"])):
        needs.append(_need("rccl", "rigbook_pins.rccl.source",
                           "the rccl role builds RCCL from a pinned source (a branch or tag moves: not a pin)",
                           "{repo: https://github.com/ROCm/rocm-systems, commit: the 40-hex commit of the ROCm "
                           "release's tag (`git ls-remote https://github.com/ROCm/rocm-systems "
                           "refs/tags/rocm-%s`), subdir: projects/rccl}, or a release tarball {url or path, sha256}"
                           % (model["pins"]["rocm"]["version"] or "VERSION")))
    tests = pin["tests_source"]
    if not tests.get("sha256") and not HEX40.match(as_str(tests.get("commit"))):
        needs.append(_need("rccl", "rigbook_pins.rccl.tests.source",
                           "the collectives layer runs rccl-tests built against the patched RCCL",
                           "{repo: https://github.com/ROCm/rccl-tests, commit: `git ls-remote "
                           "https://github.com/ROCm/rccl-tests refs/heads/develop`}, or a tarball {url or path, "
                           "sha256}"))
    if not pin["gpu_targets"]:
        needs.append(_need("rccl", "rigbook_pins.rccl.gpu_targets",
                           "RCCL builds every default target without it (hours) or none that matches",
                           "the GPUs' gfx target: `rocminfo | grep -m1 gfx` (gfx1201 for the R9700)"))
    return needs


def _nccl_tests_needs(model):
    pin, toolchain = model["pins"]["nccl_tests"], model["pins"]["cuda_toolchain"]
    needs = []
    if not pin["version"]:
        needs.append(_need("nccl_tests", "rigbook_pins.nccl_tests.version", "the nccl_tests role builds this release",
                           "the nccl-tests release the source is (its src/common.mk NCCL_TESTS_VERSION, e.g. 2.19.6)"))
    if not pin["source"].get("sha256") and not (pin["repo"] and HEX40.match(pin["commit"])):
        needs.append(_need("nccl_tests", "rigbook_pins.nccl_tests.source",
                           "the collectives layer runs nccl-tests built from a pinned source (a tag moves: not a pin)",
                           "{repo: https://github.com/NVIDIA/nccl-tests.git, commit: the 40-hex commit of a release "
                           "tag (`git ls-remote https://github.com/NVIDIA/nccl-tests refs/tags/v2.19.6`)}, or a "
                           "tarball {url or path, sha256}"))
    major = toolchain["version"].split(".")[0] if toolchain["version"] else "MAJOR"
    if not toolchain["nccl"]:
        needs.append(_need("nccl_tests", "rigbook_pins.cuda_toolchain.versions",
                           "nccl-tests are built against the NCCL wheel pinned in the CUDA toolchain venv, and the "
                           "engine's venv is linked to that same library, so what was measured is what serves",
                           "add nvidia-nccl-cu%s: VERSION to cuda_toolchain.versions, the version the engine's torch "
                           "requires (`pip show nvidia-nccl-cu%s` in the SGLang venv)" % (major, major)))
    if CCCL_WHEEL not in toolchain["wanted"]:
        needs.append(_need("nccl_tests", "rigbook_pins.cuda_toolchain.versions",
                           "nccl.h includes cuda_fp16.h, which needs CCCL's headers (without them nvcc stops at "
                           "\"fatal error: nv/target: No such file or directory\")",
                           "add %s: VERSION to cuda_toolchain.versions, the CCCL of the same CUDA release (13.0.85 "
                           "for 13.0.88)" % CCCL_WHEEL))
    return needs


def _sglang_needs(model, inventory_dir, exists):
    pin = model["pins"]["sglang"]
    needs = []
    if bool(pin["version"]) == bool(pin["repo"]):
        needs.append(_need("sglang", "rigbook_pins.sglang.version",
                           "SGLang is pinned to exactly one of an exact release (version) or a fork's commit (repo)",
                           "set version (e.g. 0.5.23), or repo {url, commit} - not both"))
    if pin["repo"] and not COMMIT.match(pin["commit"]):
        needs.append(_need("sglang", "rigbook_pins.sglang.repo.commit",
                           "the fork is installed at a pinned commit (a branch moves: it is not a pin)",
                           "`git ls-remote %s refs/heads/BRANCH`" % (as_str(pin["repo"].get("url")) or "URL")))
    if pin["lock"] and inventory_dir is not None:
        path = pin["lock"] if os.path.isabs(pin["lock"]) else os.path.join(inventory_dir, pin["lock"])
        if not exists(path):
            needs.append(_need("sglang", "rigbook_pins.sglang.lock",
                               "the lock (%s) is not there: pip installs exactly its versions" % path,
                               "on a box where the venv works: `VENV/bin/pip freeze > %s`, or remove lock" % path))
    return needs


def _serve_needs(model):
    if model["pins"]["sglang"]["pinned"]:
        return []
    return [_need("serve", "rigbook_pins.sglang",
                  "the serve units run SGLang from the sglang role's venv",
                  "pin SGLang: rigbook_pins.sglang {version} or {repo: {url, commit}}")]


def _patch_needs(model, inventory_dir, exists):
    """Each patch: its file on the controller (a path; INVENTORY_DIR None skips the look) and its sha256 (every patch
    is checked against it before it is applied). A patch the owner supplies (seed 004's SGLang changes) is listed by
    path before the file and its sha256 exist: one need says both."""
    needs = []
    for role in ("rccl", "sglang"):
        for index, patch in enumerate(model["pins"][role]["patches"]):
            patch = as_dict(patch)
            path, sha256 = as_str(patch.get("path")), as_str(patch.get("sha256"))
            key = "rigbook_pins.%s.patches[%d]" % (role, index)
            full = (path if not path or os.path.isabs(path) or inventory_dir is None
                    else os.path.join(inventory_dir, path))
            missing = bool(path) and inventory_dir is not None and not exists(full)
            if missing:
                what = "the patch %s is not on the controller%s" % (
                    full, "" if sha256 else ", and it has no sha256 (every patch is checked against it before it is "
                                            "applied)")
                fix = "put the patch file there, or fix the path" + (
                    "" if sha256 else "; then set sha256: `sha256sum %s`" % full)
                needs.append(_need(role, key + ".path", what, fix))
            elif not sha256:
                needs.append(_need(role, key + ".sha256",
                                   "every patch is checked against its sha256 before it is applied",
                                   "`sha256sum %s`" % (full or "PATCH")))
    return needs


def readiness(model, roles=None, inventory_dir=None, exists=os.path.exists):
    """[need]: each input a role in ROLES (default: the model's roles) needs and the inventory lacks, as
    {role, key, why, how}. INVENTORY_DIR: where relative lock and patch paths are looked up (EXISTS(path)); None
    skips those file checks (on the box)."""
    wanted = [r for r in model["roles"] if roles is None or r in roles]
    needs = []
    for role in wanted:
        if role == "kernel":
            needs += _kernel_needs(model)
        elif role == "nvidia_p2p_driver":
            needs += _nvidia_driver_needs(model)
        elif role == "cuda_toolchain":
            needs += _cuda_toolchain_needs(model)
        elif role == "amd_rocm":
            needs += _rocm_needs(model)
        elif role == "rccl":
            needs += _rccl_needs(model)
        elif role == "nccl_tests":
            needs += _nccl_tests_needs(model)
        elif role == "sglang":
            needs += _sglang_needs(model, inventory_dir, exists)
        elif role == "serve":
            needs += _serve_needs(model)
    needs += [n for n in _patch_needs(model, inventory_dir, exists) if n["role"] in wanted]
    return needs


def by_role(needs):
    """{role: [need]} for every role of ROLES (empty lists included): what each role's assert reads."""
    found = {name: [] for name, _, _ in ROLES}
    for need in needs:
        found[need["role"]].append(need)
    return found


def roles_for_tags(run_tags, skip_tags=()):
    """The roles of ROLES that a run with --tags RUN_TAGS / --skip-tags SKIP_TAGS runs (tags as Ansible has them:
    ["all"] when none were given)."""
    run, skip = set(run_tags or ["all"]), set(skip_tags or ())
    chosen = []
    for name, tags, _ in ROLES:
        if not ("all" in run or run & set(tags)):
            continue
        if skip & set(tags):
            continue
        chosen.append(name)
    return chosen


def roles_named_by_tags(run_tags):
    """The roles of ROLES that --tags RUN_TAGS names by one of their own tags ("all" names none): they run whatever
    their converged state says (docs/converged.md)."""
    named = set(run_tags or ()) - {"all"}
    return [name for name, tags, _ in ROLES if named & set(tags)]


def need_text(need):
    return "needed by the %s role: %s; how: %s" % (need["role"], need["why"], need["how"])


# --- on the box ------------------------------------------------------------------------------------------------

def box_paths(model):
    """[(path, key, why)]: what must already be on the box before site.yml changes anything there (the preflight
    role checks them with stat): the serve profiles' models and their FP8 KV scales files, the SGLang wheel
    directory."""
    found = []
    if model["pins"]["sglang"]["wheel_dir"] and "sglang" in model["roles"]:
        found.append((model["pins"]["sglang"]["wheel_dir"], "rigbook_pins.sglang.wheel_dir",
                      "the sglang role installs SGLang offline from this directory of wheels (build them once: "
                      "`pip wheel` of sglang and sgl-kernel for the GPUs' target)"))
    for index, profile in enumerate(model["serve"]):
        found.append((profile["model_path"], "rigbook_serve[%d].model_path" % index,
                      "the serve unit loads this model directory"))
        draft = as_dict(profile.get("speculative")).get("draft_model_path")
        if draft:
            found.append((draft, "rigbook_serve[%d].speculative.draft_model_path" % index,
                          "the engine loads this draft model"))
        scales = serve_profile.extra_value(profile, serve_profile.KV_SCALES_FLAG)
        if scales and scales.startswith("/"):  # a relative one is an error of the profile's checks
            at = [i for i, arg in enumerate(profile.get("extra_args") or [])
                  if isinstance(arg, str) and arg.partition("=")[0] == serve_profile.KV_SCALES_FLAG][-1]
            found.append((scales, "rigbook_serve[%d].extra_args[%d]" % (index, at),
                          "the engine reads its FP8 KV cache scales from this file; without it every scale is 1.0, "
                          "silently"))
    return [{"path": p, "key": k, "why": w} for p, k, w in found]
