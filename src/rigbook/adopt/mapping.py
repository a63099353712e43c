"""What adopt_facts read on a box set up by hand -> the rigbook_* variables that reproduce it (`adopt_of`), each value
with where it was read (comments), what could not be pinned (unpinned, with the reason) and notes.

The pins come from the one table of pins, plugins/module_utils/host_pins.PINS (each pin's inverse beside the forward
host_model.build uses: a new pin is added there, for both). Here: the serve profiles (each running engine's command
line and GPU environment), and the files written beside the pins (the SGLang venv's lock, its local patch).
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from urllib.parse import quote

from rigbook.adopt.emit import comment
from rigbook.paths import collection_root, name_file

NOT_READ_YET = ()
UNIT_NAME = re.compile(r"[^a-z0-9-]+")
# What a lock line may hold of what the box said (anything else would be a pip option or a second requirement).
DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
DIST_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
VCS_URL = re.compile(r"^(https?|ssh|git|file)://[^\s#@]+$|^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s#@]+$")
VENV_TOOLS = frozenset(("pip", "setuptools", "wheel", "distribute"))
DRIVER_VERSION = re.compile(r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$")  # the schema's driver_version
# AMD's apt repositories as amdgpu-install (and AMD's install guide) configures them: ROCm's
# (repo.radeon.com/rocm/apt/<version> <suite> main) and the graphics one amdgpu-dkms comes from
# (repo.radeon.com/amdgpu/<version>/ubuntu <suite> main)
AMD_REPOS = (("ROCm's repository", re.compile(r"^https?://repo\.radeon\.com/rocm/apt/[^/\s]+/?$")),
             ("AMD's graphics repository", re.compile(r"^https?://repo\.radeon\.com/amdgpu/[^/\s]+/ubuntu/?$")))
HOW_INSTALLED = {
    "dkms": "by DKMS (updates/dkms)",
    "make modules_install": "by hand, not by DKMS: kernel/drivers/video/ is where the driver's own `make "
                            "modules_install` (and NVIDIA's .run installer without DKMS) puts it",
    "package": "by a distribution package",
    "unknown": "in a way adopt cannot tell",
}


def _host_pins():
    """plugins/module_utils/host_pins (imported when used: the collection is on the import path by then)."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_pins

    return host_pins


def _kernel_facts():
    """plugins/module_utils/facts/kernel: the one list of the boot parameters a pin carries (p2p_words)."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import kernel

    return kernel


def _libraries():
    """plugins/module_utils/facts/libraries: the one decision of which file is NCCL or RCCL."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils.facts import libraries

    return libraries


def _hmm_rule():
    """plugins/module_utils/judges/static_layers.hmm_confines_host_memory: the one rule of when HMM must be off."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers

    return static_layers.hmm_confines_host_memory


def _box_rules():
    """plugins/modules/adopt_facts: the rules the module applies on the box to what it read (`typed`), applied here
    again to what the run stored."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.modules import adopt_facts

    return adopt_facts


def _finite(profile: dict) -> dict:
    """PROFILE with a number that is not finite (--mem-fraction-static nan) given back as the text the engine was
    given: the schema names it, instead of a NaN that never equals itself."""
    return {key: (str(value) if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in profile.items()}


def _profile_name(engine: dict, taken: set) -> str:
    """A serve profile name for ENGINE: its unit's name without .service (lowercase, [a-z0-9-]), else "engine";
    -2, -3, ... when taken."""
    base = UNIT_NAME.sub("-", (engine.get("unit") or "engine").removesuffix(".service").lower()).strip("-")
    base = base.removeprefix("rigbook-serve-") or "engine"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def _lock_line(p: dict) -> tuple:
    """(requirement line without hashes or None, [sha256 of the wheels found], why it cannot be written or None) of
    one venv distribution P (venv_packages with wheel_files)."""
    pins = _host_pins()
    name, version, install = p.get("name") or "", p.get("version") or "", p.get("install")
    if not DIST_NAME.match(name) or not DIST_VERSION.match(version):
        return None, [], f"{name!r} {version!r} is no distribution name and version pip reads"
    # one wheel file may be in two --wheels-dir folders: each sha256 once
    hashes = sorted(set(w["sha256"] for w in p.get("wheels") or [] if pins.SHA256.match(w.get("sha256") or "")))
    if install == "index":
        return f"{name}=={version}", hashes, None
    if isinstance(install, dict) and install.get("vcs"):
        url, commit = install.get("url") or "", install.get("commit") or ""
        if install["vcs"] != "git" or not VCS_URL.match(url) or not pins.HEX.match(commit):
            return None, [], (f"{name} {version}: a {install['vcs']} install from {pins.redact(url)!r} at {commit!r} "
                              "(a lock line needs git, a URL without credentials and a full commit)")
        return f"{name} @ git+{url}@{commit}", [], None
    if isinstance(install, dict) and "archive" in install:
        return f"{name}=={version}", sorted(set(hashes + ([install["sha256"]] if install.get("sha256") else []))), None
    kind = install.get("local") if isinstance(install, dict) else install
    url = install.get("url") if isinstance(install, dict) else None
    return None, [], (f"{name} {version}: an {kind} install from {pins.redact(url)!r}: it cannot be reproduced "
                      "from a lock")


def lock_of(engine: dict, host: str, version: str, wheels_dir: bool = True) -> tuple:
    """(lock text, problems [text], without hashes [text]) of ENGINE's venv: one requirement a distribution, sorted;
    `--hash=sha256:` of each wheel found on the box only when every line has one (pip checks hashes only when every
    requirement has one: a lock with some is refused by pip as a whole)."""
    lines, problems, bare = [], [], []
    for p in sorted(engine.get("packages") or [], key=lambda p: p.get("name") or ""):
        if p.get("name") in VENV_TOOLS:
            continue  # what `python -m venv` put there, left out as `pip freeze` leaves it out
        line, hashes, problem = _lock_line(p)
        if problem:
            problems.append(problem)
            continue
        lines.append((line, hashes))
        if not hashes:
            bare.append(line)
    hashed = bool(lines) and not bare
    head = [f"# Written by `provision adopt {comment(host)}`: every distribution of {comment(engine.get('venv'))} "
            f"(its dist-info name and version), the venv of SGLang {comment(version)}.",
            "# --hash: the sha256 of each wheel found on the box" if hashed else
            "# No --hash lines: not every distribution's wheel was found on the box (pip checks hashes only when "
            "every line has one)."]
    head += [f"# left out: {comment(text)}" for text in problems]
    body = [line + "".join(f" --hash=sha256:{h}" for h in hashes) if hashed else line for line, hashes in lines]
    return "\n".join(head + body) + "\n", problems, bare


def _sglang_extras(engine: dict, pin: dict, host: str, inventory_dir, wheels_dir, comments: dict, unpinned: list,
                   notes: list) -> dict:
    """The lock and the local patch of the engine's sglang beside the pins: {path relative to INVENTORY_DIR: text}
    to write, PIN given lock and patches."""
    files = {}
    version = pin["version"]
    stem = f"{name_file(host, '')}-sglang-{quote(version, safe='')}"
    text, problems, bare = lock_of(engine, host, version)
    lock = f"locks/{stem}.txt"
    files[lock] = text
    pin["lock"] = lock
    key = ("rigbook_pins", "sglang")
    comments[key + ("lock",)] = (f"written beside the pins: every dist-info of {engine.get('venv')}"
                                 + ("" if bare else ", with the sha256 of each wheel found in --wheels-dir"))
    notes += [f"problem: {engine.get('venv')}: {text}" for text in problems]
    if bare:
        where = f"--wheels-dir {wheels_dir}" if wheels_dir else "no --wheels-dir given"
        unpinned.append(f"rigbook_pins.sglang.lock: written without --hash: no wheel file found ({where}) for "
                        + ", ".join(bare[:20]) + (f" and {len(bare) - 20} more" if len(bare) > 20 else "")
                        + "; put those wheels in a folder on the box and adopt again with --wheels-dir")
    local = engine.get("sglang_files") or {}
    changed = local.get("changed") or []
    for item in changed:
        notes.append(f"{engine.get('venv')}: sglang's {item.get('path')} {item.get('state')} "
                     + ("(its sha256 is not the one its RECORD lists: a local change)"
                        if item.get("state") == "differs" else "(RECORD lists it)"))
    differs = {item.get("path") for item in changed if item.get("state") == "differs"}
    covered = _named_patch_files(pin.get("patches") or [])
    if differs and covered is not None:
        outside = sorted(differs - covered)
        if not outside:
            notes.append(f"{engine.get('venv')}: the files that differ from sglang's RECORD are the ones rigbook's "
                         "patches of its stamp change: pinned by name")
        else:
            unpinned.append(f"rigbook_pins.sglang.patches: {', '.join(outside)} changed outside rigbook's patches "
                            "of the venv's stamp: not pinned (a twin gets the named patches only); make that change "
                            "a patch of its own and add it")
    elif local.get("patch"):
        patch = f"patches/{stem}-local.patch"
        files[patch] = local["patch"]
        # An absolute path: the sglang role copies a patch's path with ansible.builtin.copy, which looks a relative
        # path up in the role's files/, not the inventory.
        pin["patches"] = [{"path": str(Path(inventory_dir).resolve() / patch),
                           "sha256": hashlib.sha256(local["patch"].encode()).hexdigest()}]
        comments[key + ("patches", 0)] = (f"written beside the pins: the diff from {local.get('wheel')} to the "
                                          f"installed files that differ from sglang's RECORD")
    elif differs:
        why = local.get("problem") or ("sglang's wheel is not in " + (f"--wheels-dir {wheels_dir}" if wheels_dir
                                                                        else "a --wheels-dir (none given)"))
        unpinned.append(f"rigbook_pins.sglang.patches: sglang's files differ from its RECORD and no patch was "
                        f"written: {why}")
    return files


def _named_patch_files(patches: list):
    """The files (relative to site-packages) that PATCHES change, when every one is a patch by name of the sglang
    role's files/patches/ with the sha256 given; else None (not rigbook's patch set: the local diff decides)."""
    if not patches or any("name" not in patch for patch in patches):
        return None
    files = set()
    for patch in patches:
        path = collection_root() / "roles/sglang/files/patches" / patch["name"]
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != patch.get("sha256"):
            return None
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith("+++ "):
                target = line[4:].split("\t")[0].strip()
                files.add(target[2:] if target.startswith(("a/", "b/")) else target)
    return files


def _flags_sglang_lacks(engine: dict, profile: dict, index: int) -> list:
    """What to say of each flag of PROFILE's extra_args that the engine's installed SGLang does not define (its
    "sglang_flags", read from its sources; a unique prefix counts, as the engine's argument parser reads it)."""
    known = engine.get("sglang_flags")
    if not known:
        return []
    version = next((p["version"] for p in engine.get("packages") or [] if p.get("name") == "sglang"), "?")
    lacking = []
    for word in profile.get("extra_args") or []:
        flag = word.partition("=")[0]
        if flag.startswith("--") and not any(k.startswith(flag) for k in known):
            lacking.append(f"rigbook_serve[{index}].extra_args ({profile['name']}): the engine was started with "
                           f"{flag}, which sglang {version} in {engine.get('venv')} does not define (its "
                           "server_args): an engine from these pins refuses it; remove it or pin the SGLang "
                           "that has it")
    return lacking


def _serve_profiles(facts: dict, comments: dict, unpinned: list, notes: list) -> list:
    """rigbook_serve: one profile of each running engine's command line (serve/profile.profile_from_argv) and GPU
    environment, with where it was read; an API key, the admin API key or a secret-looking variable never
    copied (serve/profile: SECRET_FILES)."""
    # deferred: ansible_collections.rigbook.homelab is importable only once link_collection() ran (validate runs it)
    from ansible_collections.rigbook.homelab.plugins.module_utils.serve.profile import profile_from_argv

    profiles, taken = [], set()
    for engine in facts.get("engines") or []:
        name = _profile_name(engine, taken)
        profile, found = profile_from_argv(engine.get("args") or [], name)  # a key (API, admin) never copied
        profile = _finite(profile)
        where = f"/proc/{engine['pid']}/cmdline" + (f" (unit {engine['unit']})" if engine.get("unit") else
                                                    " (started from a shell, no unit)")
        if engine.get("env"):
            profile["env"] = dict(engine["env"])
            comments[("rigbook_serve", len(profiles), "env")] = f"/proc/{engine['pid']}/environ (GPU variables only)"
            preloaded = [word for word in str(profile["env"].get("LD_PRELOAD", "")).replace(":", " ").split()
                         if _libraries().is_collectives(word)]
            if preloaded:
                notes.append(f"{name}: LD_PRELOAD puts {', '.join(preloaded)} in front of the engine's own NCCL/RCCL: "
                             "kept, so the engine runs what it runs today; once rigbook_pins.rccl (or the CUDA "
                             "toolchain's NCCL) is pinned, remove LD_PRELOAD from this profile's env so the engine "
                             "runs the library the roles build and verify")
        for secret in engine.get("secret_env") or []:
            notes.append(f"{name}: {secret} is in the engine's environment and looks like a secret: not copied")
        comments[("rigbook_serve", len(profiles))] = where
        notes += [f"{name}: {text}" for text in found]
        for flag, given, full in _relative_paths(engine):
            notes.append(f"{name}: {flag} {given} is relative to the folder the engine was started in: written as "
                         f"{full} (a unit starts elsewhere)")
        unpinned += _flags_sglang_lacks(engine, profile, len(profiles))
        profiles.append(profile)
        if engine.get("env_from_rigbook"):
            notes.append(f"{name}: {', '.join(engine['env_from_rigbook'])} came from rigbook's GPU environment "
                         "file (the host model's): not written into the profile")
    if not facts.get("engines"):
        unpinned.append("rigbook_serve: no running SGLang engine was found (no process runs `python -m "
                        "sglang.launch_server`, `sglang serve` or `python -m sglang.cli.main serve`)")
    return profiles


def _relative_paths(engine: dict) -> list:
    """The [(flag, given, absolute)] of ENGINE's path flags adopt_facts made absolute (engine_processes), well-typed."""
    found = engine.get("relative_paths")
    if not isinstance(found, list):
        return []
    return [tuple(str(x)[:4096] for x in item) for item in found if isinstance(item, (list, tuple)) and len(item) == 3]


def _boot_words(facts: dict) -> list:
    """The command line's own words as read (facts kernel.cmdline), returned; FACTS keeps of them only those the P2P
    stack reads (facts/kernel.p2p_words, the one list): what the kernel pin carries."""
    own = list(facts["kernel"].get("cmdline") or [])
    facts["kernel"]["cmdline"] = _kernel_facts().p2p_words(own)[0]
    return own


def _said_boot_words(own: list, pins: dict, comments: dict, notes: list) -> None:
    """Where the pinned words were read, and the words left alone, said."""
    pinned, left = _kernel_facts().p2p_words(own)
    if "kernel" in pins and pinned:
        comments[("rigbook_pins", "kernel", "cmdline")] = (
            "/proc/cmdline: the parameters the P2P stack reads (IOMMU, PCI/PCIe, the GPU drivers' and nouveau's "
            "module parameters, blacklists); the others left alone")
    if left and "kernel" in pins:
        notes.append("rigbook_pins.kernel.cmdline: left alone (not what the P2P stack reads; a twin keeps its own "
                     "boot loader's and owner's words): " + " ".join(left))


def _unmanaged_boot(facts: dict, reading, own: list):
    """{"kernel": False, "nvidia_driver": False} for a box whose running kernel is not on its disk (no
    /lib/modules/<release>, no EFI, no GRUB: a VM or a cloud image its host boots), with the kernel pin and what
    was said of it taken back; None for any other box (or facts without the boot reading)."""
    boot = facts.get("boot") or {}
    if not all(key in boot for key in ("modules_dir", "efi", "grub")) or boot["modules_dir"] or boot["efi"] or \
            boot["grub"]:
        return None
    release = (facts.get("kernel") or {}).get("release") or "the running kernel"
    reading.pins.pop("kernel", None)
    for key in [k for k in reading.comments if k[:2] == ("rigbook_pins", "kernel")]:
        del reading.comments[key]
    reading.unpinned[:] = [u for u in reading.unpinned if not u.startswith(
        ("rigbook_pins.kernel", "GRUB_DEFAULT=", "rigbook_pins.nvidia_driver.source and"))]
    why = (f"no /lib/modules/{release}, no EFI and no GRUB on this box: its host boots it (a VM or a cloud image); "
           "rigbook does not manage its kernel or driver (the ladder still judges them)")
    reading.comments[("rigbook_manage",)] = why
    reading.notes.append(f"rigbook_manage: {why}; the kernel {release} is not pinned"
                         + (" and its command line is left alone: " + " ".join(own) if own else ""))
    return {"kernel": False, "nvidia_driver": False}


def _module_said(driver: dict) -> str:
    kind = {True: "open", False: "proprietary"}.get(driver.get("open"), "open or proprietary unknown")
    where = (f"{driver['file']} ({driver.get('file_source')})" if driver.get("file") else
             f"no file on disk ({driver.get('file_source') or 'no modules.dep'})")
    way = HOW_INSTALLED.get(driver.get("installed_by"), HOW_INSTALLED["unknown"])
    return (f"the loaded nvidia module {driver.get('version')} ({kind}, srcversion "
            f"{driver.get('srcversion') or 'unknown'}) loads from {where}: installed {way}")


def _loaded_driver(facts: dict, reading, managed: bool) -> None:
    """The NVIDIA driver pin from the module the running kernel has loaded, whatever its file's place (DKMS, make
    modules_install, a package, none on disk): its version, the userspace version the loader finds; what the
    DKMS reading pinned is kept only when it is the loaded module. A box with an NVIDIA GPU and no driver to pin
    says so."""
    pins, comments, unpinned, notes = reading.pins, reading.comments, reading.unpinned, reading.notes
    driver = facts.get("nvidia_driver") or {}
    key = ("rigbook_pins", "nvidia_driver")
    nvidia_gpu = any(g.get("vendor") == "nvidia" for g in facts.get("gpus") or [])
    version = driver.get("version") if driver.get("loaded") else None
    if not version:
        if "nvidia_driver" in pins and driver:
            notes.append(f"no nvidia module is loaded: the pin is DKMS's nvidia/{pins['nvidia_driver'].get('version')}"
                         ", not a running driver's")
        elif nvidia_gpu or driver:
            unpinned.append("rigbook_pins.nvidia_driver: no nvidia module is loaded and DKMS has none "
                            "(/sys/module/nvidia, /proc/driver/nvidia/version, dkms status): not pinned")
        return
    notes.append(_module_said(driver))
    if not DRIVER_VERSION.match(str(version)):
        unpinned.append(f"rigbook_pins.nvidia_driver.version: the loaded module says {version!r}, no driver version "
                        "the schema accepts (NNN.N or NNN.N.N): not pinned")
        return
    userspace = driver.get("userspace") if isinstance(driver.get("userspace"), dict) else {}
    pin = pins.get("nvidia_driver")
    if pin is not None and pin.get("version") != version:
        notes.append(f"DKMS's nvidia/{pin.get('version')} is not the loaded module ({version}): the loaded one is "
                     "pinned, and nothing of the DKMS source (its repository, branch, commit)")
        for field in ("fork_repo", "branch", "commit"):
            pin.pop(field, None)
            comments.pop(key + (field,), None)
        unpinned[:] = [u for u in unpinned if not u.startswith("rigbook_pins.nvidia_driver.source and")]
    if pin is None or pin.get("version") != version:
        pin = pins.setdefault("nvidia_driver", {})
        pin["version"] = version
        comments[key + ("version",)] = f"{driver.get('version_source')}: the loaded module"
        if facts.get("uvm_disable_hmm"):
            pin["uvm_disable_hmm"] = True
            comments[key + ("uvm_disable_hmm",)] = "/etc/modprobe.d: options nvidia-uvm uvm_disable_hmm=1"
        elif _hmm_rule()(driver.get("open"), facts.get("cpu_address_bits")) is False:
            # left at the driver's default on a box where HMM cannot confine host memory: kept so (the converge
            # writes no modprobe option the box does not have; kernel_state judges the same rule)
            pin["uvm_disable_hmm"] = False
            comments[key + ("uvm_disable_hmm",)] = (
                f"HMM at the driver's default: this CPU's {facts.get('cpu_address_bits')}-bit physical addresses end "
                "within the GPUs' DMA mask (docs/evidence.md)" if driver.get("open") is not False else
                "HMM at the driver's default: the proprietary module (docs/evidence.md)")
        if managed:
            unpinned.append(
                "rigbook_pins.nvidia_driver: fork_repo and commit (or source: the fork's tarball) and "
                "userspace_installer (the .run, sha256): which source built the loaded module (" + (
                    f"{driver['file']}, installed by {driver.get('installed_by')}" if driver.get("file")
                    else "no file on disk") + f", srcversion {driver.get('srcversion') or 'unknown'}) cannot be "
                "read; name them, or the nvidia_p2p_driver role has no fork to build")
    if userspace.get("version") and DRIVER_VERSION.match(str(userspace["version"])):
        pin["userspace_version"] = userspace["version"]
        comments[key + ("userspace_version",)] = (
            f"{userspace.get('where')}: the versioned library the loader finds first" if userspace.get("from") ==
            "library" else f"{userspace.get('where')} --query-gpu=driver_version")
    elif "userspace_version" not in pin:
        unpinned.append("rigbook_pins.nvidia_driver.userspace_version: no libnvidia-ml.so.VERSION or "
                        "libcuda.so.VERSION where the loader looks (LD_LIBRARY_PATH, ldconfig -p, "
                        "/usr/local/nvidia/lib64, /usr/lib*) and no nvidia-smi answered")
    smi = driver.get("userspace_smi")
    if smi and pin.get("userspace_version") and smi != pin["userspace_version"]:
        notes.append(f"nvidia-smi says driver {smi}, the library the loader finds is {pin['userspace_version']}: "
                     "two userspaces on the box")


def _nvidia_not_pinned(facts: dict, reading) -> None:
    """An NVIDIA box (a GPU, the module or its userspace) whose CUDA toolchain could not be pinned: said."""
    nvidia = (any(g.get("vendor") == "nvidia" for g in facts.get("gpus") or []) or facts.get("nvidia_userspace")
              or (facts.get("nvidia_driver") or {}).get("loaded"))
    if nvidia and "cuda_toolchain" not in reading.pins and not any(
            u.startswith("rigbook_pins.cuda_toolchain") for u in reading.unpinned):
        reading.unpinned.append(f"rigbook_pins.cuda_toolchain: no nvidia-cuda-nvcc wheel in "
                                f"{_host_pins().CUDA_VENV} nor in a running engine's venv (dist-info)")


def _graphics_repo(entry: dict, uri: str, keyrings: dict, reading) -> None:
    """rigbook_pins.rocm.amdgpu_repo (where amdgpu-dkms comes from) of ENTRY, AMD's graphics repository as the box
    has it: URL, suite, components, its keyring as key_url (file://) with that file's sha256; or why not."""
    host_pins = _host_pins()
    key = ("rigbook_pins", "rocm", "amdgpu_repo")
    suites, components = _strings(entry.get("suites")), _strings(entry.get("components")) or ["main"]
    signed = _strings(entry.get("signed_by"))
    digest = keyrings.get(signed[0]) if len(signed) == 1 else None
    problem = ("its suite or components are not plain words" if len(suites) != 1 or not all(
                   host_pins.APT_WORD.match(w) for w in suites + components) else
               f"its Signed-By names {signed!r}, not one keyring file adopt read" if not host_pins.SHA256.match(
                   digest or "") else None)
    if problem:
        reading.unpinned.append(f"rigbook_pins.rocm.amdgpu_repo: AMD's graphics repository {uri} (where amdgpu-dkms "
                                f"comes from), read from {entry.get('file')}: {problem}: not pinned")
        return
    reading.pins["rocm"]["amdgpu_repo"] = {"url": uri, "suite": suites[0], "components": components,
                                           "key_url": "file://" + signed[0], "key_sha256": digest}
    for field in ("url", "suite", "components"):
        reading.comments[key + (field,)] = f"{entry.get('file')} (AMD's graphics repository, amdgpu-dkms's)"
    reading.comments[key + ("key_url",)] = "this box's keyring (its Signed-By)"
    reading.comments[key + ("key_sha256",)] = f"sha256 of {signed[0]}"


def _amd_sources(facts: dict, reading) -> None:
    """AMD's apt repositories the box has configured (amdgpu-install's rocm.list, amdgpu.list and their keyring),
    named with each file, keyring and its sha256: the amd_rocm role replaces those entries with its own. AMD's
    graphics repository (amdgpu-dkms's) is pinned beside ROCm's (rigbook_pins.rocm.amdgpu_repo)."""
    keyrings = facts.get("apt_keyrings") or {}
    for entry in facts.get("apt_sources") or []:
        for name, pattern in AMD_REPOS:
            uri = next((u for u in _strings(entry.get("uris")) if pattern.match(u)), None)
            if uri is None:
                continue
            signed = ", ".join(f"{k} (sha256 {keyrings.get(k) or 'not read'})"
                               for k in _strings(entry.get("signed_by")))
            line = (f"{' '.join(_strings(entry.get('types')))} {uri} {' '.join(_strings(entry.get('suites')))} "
                    f"{' '.join(_strings(entry.get('components')))}").strip()
            state = "" if entry.get("enabled") else ", disabled"
            reading.notes.append(f"existing apt source {entry.get('file')} ({entry.get('format')}{state}): {name} "
                                 f"{line}, Signed-By {signed or 'none'}: the amd_rocm role replaces it with its "
                                 "own entry for the pinned repository")
            if name.startswith("AMD's graphics") and entry.get("enabled") and "rocm" in reading.pins and \
                    "amdgpu_repo" not in reading.pins["rocm"]:
                _graphics_repo(entry, uri, keyrings, reading)


def _strings(value) -> list:
    """VALUE's strings when it is a list (what the run stored may be of any shape), else []."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _in_pin_order(pins: dict) -> dict:
    order = [pin.name for pin in _host_pins().PINS]
    return dict(sorted(pins.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))


def variables_of(facts: dict) -> tuple:
    """(variables, comments {path: where}, unpinned [text], notes [text]) of the facts adopt_facts read."""
    return adopt_of(facts)[:4]


def adopt_of(facts: dict, host: str = "HOST", inventory_dir=".", wheels_dir: str | None = None) -> tuple:
    """(variables, comments, unpinned, notes, files): variables_of's, and the files written beside the pins ({path
    relative to INVENTORY_DIR: text}: the venv's lock, the local patch of its sglang)."""
    host_pins = _host_pins()
    # what the run stored is what the box said: typed and bounded again, as the module did on the box
    facts, said, not_copied = _box_rules().typed(facts)
    checks = facts.get("checks") if isinstance(facts.get("checks"), dict) else {}
    own = _boot_words(facts)  # the kernel pin carries only the boot parameters the P2P stack reads
    reading = host_pins.read_pins(facts)  # every pin of the table, in its order
    manage = _unmanaged_boot(facts, reading, own)
    if manage is None:
        _said_boot_words(own, reading.pins, reading.comments, reading.notes)
    _loaded_driver(facts, reading, manage is None)
    _nvidia_not_pinned(facts, reading)
    _amd_sources(facts, reading)
    reading.pins = _in_pin_order(reading.pins)
    pins, comments, unpinned, notes = reading.pins, reading.comments, reading.unpinned, reading.notes
    notes[:0] = [str(text) for text in checks.get("notes") or []] + said
    unpinned[:0] = [str(text) for text in checks.get("unpinned") or []] + not_copied
    files: dict = {}
    engine, _ = host_pins.sglang_engine(facts)
    if "sglang" in pins and host_pins.SGLANG_VERSION.match(pins["sglang"]["version"]):
        files = _sglang_extras(engine, pins["sglang"], host, inventory_dir, wheels_dir, comments, unpinned, notes)
    profiles = _serve_profiles(facts, comments, unpinned, notes)
    unpinned += list(NOT_READ_YET)
    variables = {}
    if manage is not None:
        variables["rigbook_manage"] = manage
    if pins:
        variables["rigbook_pins"] = pins
    if profiles:
        variables["rigbook_serve"] = profiles
    return variables, comments, unpinned, notes, files
