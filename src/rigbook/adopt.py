"""`provision adopt HOST -i INV`: a box that was set up by hand, written down as the pins and serve profiles that
reproduce it (issue 22, first part).

The host is read by playbooks/adopt.yml (module adopt_facts: read-only, changes nothing); this module turns what it
read into rigbook_* variables (`variables_of`), each value with a comment saying where it was read, and writes them
as one YAML file (`render`: host_vars/HOST.yml of the inventory, or -o FILE) that `provision validate` then checks.
What could not be pinned is listed with the reason, never guessed.

Read so far: the kernel (release, source: distro or debs with each .deb's sha256, the command line's own
parameters), each running SGLang engine's command line as a serve profile (flags the schema does not know in
extra_args, named; an API key on the command line never copied) and its GPU environment, the SGLang version of its
venv, the NVIDIA driver as DKMS built it, the CUDA toolchain wheels (the role's default venv, else the engine's),
the engine's venv as a requirements lock written beside the pins (hashes of the wheels found in --wheels-dir) and
sglang's local changes as a patch, ROCm (release, packages, apt repository and keyring sha256, amdgpu-dkms, HSA_*
environment), and the mapped RCCL from rigbook's build stamp. What cannot be pinned is listed with the reason.
"""

from __future__ import annotations

import json
import re

from rigbook.errors import UserError

PLAYBOOK = "adopt.yml"
FACTS_DIR = "adopted"
NOT_READ_YET = ()
UNIT_NAME = re.compile(r"[^a-z0-9-]+")
CUDA_VENV = "/opt/rigbook/cuda"  # the cuda_toolchain role's default venv
# What a lock line may hold of what the box said (anything else would be a pip option or a second requirement).
DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
DIST_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
VCS_URL = re.compile(r"^(https?|ssh|git|file)://[^\s#@]+$|^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s#@]+$")
HEX = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
SGLANG_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)+([a-z0-9.+]*)$")  # the schema's rigbook_pins.sglang.version
CUDA_WHEEL = re.compile(r"^(nvidia-cuda-nvcc|nvidia-cuda-crt|nvidia-nvvm|nvidia-cuda-runtime)(-cu[0-9]+)?$")
CUDA_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")  # the schema's rigbook_pins.cuda_toolchain.version


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


def _kernel(kernel: dict, comments: dict, unpinned: list, notes: list) -> dict | None:
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
    return pin


def _p2pdma_bridges(facts: dict) -> list:
    """What to say when the GPUs sit on different root ports behind a host bridge the upstream kernel does not allow
    for P2PDMA (the static layer's rule): whether this box's kernel was patched to allow it is not readable."""
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers

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


def _nvidia_driver(facts: dict, comments: dict, unpinned: list, notes: list) -> dict | None:
    """The NVIDIA driver pin from the DKMS module named nvidia (the P2P fork as DKMS builds it) and the userspace
    library's version; its source tarball and installer are files adopt cannot make, named as not pinned."""
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


def _cuda_wheels(packages: list) -> dict:
    """{base name: (installed name, version, install)} of the CUDA toolchain wheels among PACKAGES (nvcc, crt, nvvm,
    runtime; a -cuNN suffix kept in the installed name)."""
    found = {}
    for p in packages or []:
        match = CUDA_WHEEL.match(p.get("name") or "")
        if match:
            found[match.group(1)] = (p["name"], p.get("version") or "", p.get("install"))
    return found


def _cuda_venv(facts: dict) -> tuple:
    """(venv, packages, where) of the venv holding the CUDA toolchain: the role's default venv when it has nvcc,
    else the first engine's venv that has it; (None, [], None) when none has."""
    default = facts.get("cuda_venv") or {}
    if "nvidia-cuda-nvcc" in _cuda_wheels(default.get("packages")):
        return CUDA_VENV, default["packages"], f"{CUDA_VENV} (the cuda_toolchain role's default venv)"
    for engine in facts.get("engines") or []:
        if engine.get("venv") and "nvidia-cuda-nvcc" in _cuda_wheels(engine.get("packages")):
            return engine["venv"], engine["packages"], f"{engine['venv']} (the engine /proc/{engine['pid']}'s venv)"
    return None, [], None


def _one_wheel_folder(packages: list, names: list) -> str | None:
    """The one folder (given with --wheels-dir) holding a wheel file of the installed version of each of NAMES among
    PACKAGES ("wheels", collect.adopt.wheel_files), or None."""
    folders = None
    for p in packages:
        if p.get("name") in names:
            found = {w["path"].rsplit("/", 1)[0] for w in p.get("wheels") or []}
            folders = found if folders is None else folders & found
    return sorted(folders)[0] if folders else None


def _cuda_toolchain(facts: dict, comments: dict, unpinned: list, notes: list) -> dict | None:
    """The CUDA toolchain pin from the nvcc/crt/nvvm wheels of the venv that holds them: version (nvcc's), the
    packages found, the venv when not the role's default, the runtime's version when it differs. crt or nvvm at
    another release than nvcc is named as a problem (they must be one release); the pin puts them at nvcc's."""
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
    pin = {"version": version, "packages": [wheels[b][0] for b in ("nvidia-cuda-nvcc", "nvidia-cuda-crt",
                                                                    "nvidia-nvvm") if b in wheels]}
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
    archives = sorted(f"{w[0]} from {_redact(w[2]['archive'])}" for w in wheels.values()
                      if isinstance(w[2], dict) and w[2].get("archive"))
    if archives:
        unpinned.append("rigbook_pins.cuda_toolchain.wheel_dir: installed from files, not an index: "
                        + "; ".join(archives) + " (set wheel_dir to a folder of those wheels on the box if the "
                        "index does not have them)")
    return pin


def _nccl_build_wheels(packages: list) -> list:
    """[(name, version)] of the NCCL wheel (nvidia-nccl-cuNN) and the CCCL headers' among PACKAGES (host_model's
    names: what the nccl_tests role builds against)."""
    from ansible_collections.rigbook.homelab.plugins.module_utils.host_model import CCCL_WHEEL, NCCL_WHEEL

    return sorted((p["name"], p.get("version") or "") for p in packages or []
                  if NCCL_WHEEL.match(p.get("name") or "") or p.get("name") == CCCL_WHEEL)


def _nccl_tests(pins: dict, unpinned: list) -> None:
    """nccl-tests are files on the box that no process shows: named as not read when an NCCL is pinned."""
    versions = (pins.get("cuda_toolchain") or {}).get("versions") or {}
    if any(name.startswith("nvidia-nccl-cu") for name in versions):
        unpinned.append("rigbook_pins.nccl_tests: which nccl-tests the box runs is not read (set version and source: "
                        "{repo, commit} or a tarball {path or url, sha256}, and cuda_archs; without them the "
                        "collectives layer has no tool: rigbook_verify.allow_unknown: [collectives])")


ROCM_RELEASE = re.compile(r"^([0-9]+\.[0-9]+(\.[0-9]+)?)")
APT_WORD = re.compile(r"^[A-Za-z0-9._-]+$")  # the schema's suite and component
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _norm_uri(uri: str) -> str:
    """A source URI as apt-cache policy prints it: file:///x and file:/x alike, no trailing slash."""
    return re.sub(r"^file:/+", "file:/", uri or "").rstrip("/")


def _rocm_repo(rocm: dict, comments: dict, unpinned: list, notes: list) -> dict | None:
    """The ROCm repository pin: the source apt has the installed rocm-core from (apt-cache policy), its keyring's
    sha256 as key_sha256 and the keyring itself as key_url (file://)."""
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


def _rocm(facts: dict, comments: dict, unpinned: list, notes: list) -> dict | None:
    """The ROCm pin: the release (/opt/rocm/.info/version, else rocm-core's version), the packages of that release
    installed by name, the repository, amdgpu-dkms, the engine's HSA_* environment."""
    from ansible_collections.rigbook.homelab.plugins.module_utils.host_model import (
        ROCM_BUILD_PACKAGES,
        ROCM_PACKAGES,
        rocm_tag,
    )

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
    release = sorted(n for n, v in packages.items() if tag in v and n != "amdgpu-dkms")
    manual = [n for n in release if n in (rocm.get("manual") or [])]
    # what the RCCL build needs (the role's build_packages) is pinned apart from the runtime
    build = [n for n in ROCM_BUILD_PACKAGES if n in manual]
    if build != list(ROCM_BUILD_PACKAGES):
        pin_build = build
    manual = [n for n in manual if n not in ROCM_BUILD_PACKAGES]
    chosen = sorted(manual, key=lambda n: (ROCM_PACKAGES.index(n) if n in ROCM_PACKAGES else len(ROCM_PACKAGES), n)
                    ) or [n for n in ROCM_PACKAGES if n in release]  # the role's four first, in its order
    if chosen:
        pin["packages"] = chosen
        comments[key + ("packages",)] = f"dpkg-query and apt-mark showmanual: the {version} packages installed by name"
    else:
        unpinned.append(f"rigbook_pins.rocm.packages: no installed package of ROCm {version} (versions *{tag}*)")
    if build != list(ROCM_BUILD_PACKAGES):
        pin["build_packages"] = pin_build
        comments[key + ("build_packages",)] = (
            "dpkg-query and apt-mark showmanual: " + (f"of the RCCL build's packages only {', '.join(build)} are "
                                                      "installed by name" if build else "none of the RCCL build's "
                                                      "packages is installed by name (" + ", ".join(
                                                          ROCM_BUILD_PACKAGES) + ")"))
    repo = _rocm_repo(rocm, comments, unpinned, notes)
    if repo:
        pin["repo"] = repo
    pin["dkms"] = "amdgpu-dkms" in packages
    comments[key + ("dkms",)] = ("dpkg-query: amdgpu-dkms " + packages["amdgpu-dkms"] + " is installed"
                                 if pin["dkms"] else "dpkg-query: amdgpu-dkms is not installed")
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


STAMP_PATCH = re.compile(r"^([A-Za-z0-9._+-]+) -p([0-9]) ([0-9a-f]{64})$")  # source_build identity's patch entry


def _stamp_source(component: dict) -> tuple:
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


def _rccl(facts: dict, comments: dict, unpinned: list, notes: list) -> dict | None:
    """The RCCL pin from the build stamp of the prefix holding the librccl an engine has mapped (what the rccl role
    built: version, sources, patch set, GPU targets); any other mapped librccl/libnccl is named."""
    for engine in facts.get("engines") or []:
        for library in engine.get("libraries") or []:
            build = library.get("build") or {}
            stamp = build.get("stamp") if isinstance(build.get("stamp"), dict) else None
            if "build" not in library:
                continue
            if not stamp or stamp.get("name") != "rccl":
                notes.append(f"/proc/{engine.get('pid')}/maps: {library.get('path')} (sha256 "
                             f"{library.get('sha256')}): not a build of rigbook's source_build")
                continue
            return _rccl_pin(stamp, build["path"], comments, unpinned)
    return None


def _rccl_pin(stamp: dict, where: str, comments: dict, unpinned: list) -> dict | None:
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


def _redact(url):
    """URL without the user and password a URL may carry (https://user:token@host/...)."""
    return re.sub(r"//[^/@\s]*@", "//***@", url) if isinstance(url, str) else url


def _lock_line(p: dict) -> tuple:
    """(requirement line without hashes or None, [sha256 of the wheels found], why it cannot be written or None) of
    one venv distribution P (venv_packages with wheel_files)."""
    name, version, install = p.get("name") or "", p.get("version") or "", p.get("install")
    if not DIST_NAME.match(name) or not DIST_VERSION.match(version):
        return None, [], f"{name!r} {version!r} is no distribution name and version pip reads"
    # one wheel file may be in two --wheels-dir folders: each sha256 once
    hashes = sorted(set(w["sha256"] for w in p.get("wheels") or [] if SHA256.match(w.get("sha256") or "")))
    if install == "index":
        return f"{name}=={version}", hashes, None
    if isinstance(install, dict) and install.get("vcs"):
        url, commit = install.get("url") or "", install.get("commit") or ""
        if install["vcs"] != "git" or not VCS_URL.match(url) or not HEX.match(commit):
            return None, [], (f"{name} {version}: a {install['vcs']} install from {_redact(url)!r} at {commit!r} "
                              "(a lock line needs git, a URL without credentials and a full commit)")
        return f"{name} @ git+{url}@{commit}", [], None
    if isinstance(install, dict) and "archive" in install:
        return f"{name}=={version}", sorted(set(hashes + ([install["sha256"]] if install.get("sha256") else []))), None
    kind = install.get("local") if isinstance(install, dict) else install
    url = install.get("url") if isinstance(install, dict) else None
    return None, [], f"{name} {version}: an {kind} install from {_redact(url)!r}: it cannot be reproduced from a lock"


VENV_TOOLS = frozenset(("pip", "setuptools", "wheel", "distribute"))
DEFAULT_SGLANG_ROOT = "/opt/rigbook/sglang/"  # the sglang role's own venvs (sglang_root)


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
    head = [f"# Written by `provision adopt {_comment(host)}`: every distribution of {_comment(engine.get('venv'))} "
            f"(its dist-info name and version), the venv of SGLang {_comment(version)}.",
            "# --hash: the sha256 of each wheel found on the box" if hashed else
            "# No --hash lines: not every distribution's wheel was found on the box (pip checks hashes only when "
            "every line has one)."]
    head += [f"# left out: {_comment(text)}" for text in problems]
    body = [line + "".join(f" --hash=sha256:{h}" for h in hashes) if hashed else line for line, hashes in lines]
    return "\n".join(head + body) + "\n", problems, bare


def _sglang_extras(engine: dict, pin: dict, host: str, inventory_dir, wheels_dir, comments: dict, unpinned: list,
                   notes: list) -> dict:
    """The lock and the local patch of the engine's sglang beside the pins: {path relative to INVENTORY_DIR: text}
    to write, PIN given lock and patches."""
    from pathlib import Path
    from urllib.parse import quote

    from rigbook.paths import name_file

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
        import hashlib

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
    import hashlib

    from rigbook.paths import collection_root

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


def _from_venv_stamp(engine: dict, pin: dict, comments: dict, notes: list) -> None:
    """What rigbook's pinned_venv stamp in the engine's venv says of how it was made: the patch set by name and
    sha256 (the sglang role's own patches), --no-deps and the wheel folder (--no-index --find-links)."""
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
    links = stamp.get("find_links") or []
    if stamp.get("no_index") is True and len(links) == 1 and str(links[0]).startswith("/"):
        pin["wheel_dir"] = links[0]
        comments[key + ("wheel_dir",)] = where


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


def variables_of(facts: dict) -> tuple:
    """(variables, comments {path: where}, unpinned [text], notes [text]) of the facts adopt_facts read."""
    return adopt_of(facts)[:4]


def adopt_of(facts: dict, host: str = "HOST", inventory_dir=".", wheels_dir: str | None = None) -> tuple:
    """(variables, comments, unpinned, notes, files): variables_of's, and the files written beside the pins ({path
    relative to INVENTORY_DIR: text}: the venv's lock, the local patch of its sglang)."""
    from ansible_collections.rigbook.homelab.plugins.module_utils.serve.profile import profile_from_argv

    comments: dict = {}
    unpinned: list = []
    notes: list = []
    pins: dict = {}
    files: dict = {}
    kernel = _kernel(facts.get("kernel") or {}, comments, unpinned, notes)
    if kernel:
        pins["kernel"] = kernel
        unpinned += _p2pdma_bridges(facts)
    driver = _nvidia_driver(facts, comments, unpinned, notes)
    if driver:
        pins["nvidia_driver"] = driver
    cuda = _cuda_toolchain(facts, comments, unpinned, notes)
    if cuda:
        pins["cuda_toolchain"] = cuda
        _nccl_tests(pins, unpinned)
    rocm = _rocm(facts, comments, unpinned, notes)
    if rocm:
        pins["rocm"] = rocm
    rccl = _rccl(facts, comments, unpinned, notes)
    if rccl:
        pins["rccl"] = rccl
    profiles, taken = [], set()
    for engine in facts.get("engines") or []:
        name = _profile_name(engine, taken)
        profile, found = profile_from_argv(engine.get("args") or [], name)
        where = f"/proc/{engine['pid']}/cmdline" + (f" (unit {engine['unit']})" if engine.get("unit") else
                                                    " (started from a shell, no unit)")
        if engine.get("env"):
            profile["env"] = dict(engine["env"])
            comments[("rigbook_serve", len(profiles), "env")] = f"/proc/{engine['pid']}/environ (GPU variables only)"
        for secret in engine.get("secret_env") or []:
            notes.append(f"{name}: {secret} is in the engine's environment and looks like a secret: not copied")
        comments[("rigbook_serve", len(profiles))] = where
        notes += [f"{name}: {text}" for text in found]
        unpinned += _flags_sglang_lacks(engine, profile, len(profiles))
        profiles.append(profile)
        sglang = [p for p in engine.get("packages") or [] if p.get("name") == "sglang"]
        if engine.get("env_from_rigbook"):
            notes.append(f"{name}: {', '.join(engine['env_from_rigbook'])} came from rigbook's GPU environment "
                         "file (the host model's): not written into the profile")
        if sglang and "sglang" not in pins:
            pins["sglang"] = {"version": sglang[0]["version"]}
            install = sglang[0].get("install")
            comments[("rigbook_pins", "sglang", "version")] = (
                f"{engine.get('venv')}: sglang {sglang[0]['version']}"
                + ("" if install == "index" else " installed from " + _redact(json.dumps(install, sort_keys=True))))
            venv = engine.get("venv") or ""
            if venv and not venv.startswith(DEFAULT_SGLANG_ROOT):
                pins["sglang"]["venv"] = venv  # a venv made by hand: kept, never replaced (pinned_venv adopt)
                comments[("rigbook_pins", "sglang", "venv")] = f"/proc/{engine['pid']}: the engine's interpreter's venv"
            if engine.get("venv_stamp"):
                _from_venv_stamp(engine, pins["sglang"], comments, notes)
            if SGLANG_VERSION.match(sglang[0]["version"]):
                files = _sglang_extras(engine, pins["sglang"], host, inventory_dir, wheels_dir, comments, unpinned,
                                       notes)
    if not facts.get("engines"):
        unpinned.append("rigbook_serve: no running SGLang engine was found (no process runs sglang.launch_server)")
    unpinned += list(NOT_READ_YET)
    variables = {}
    if pins:
        variables["rigbook_pins"] = pins
    if profiles:
        variables["rigbook_serve"] = profiles
    return variables, comments, unpinned, notes, files


def _scalar(value) -> str:
    """VALUE as YAML reads it back unchanged (JSON is YAML: strings double-quoted, escapes and all)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return json.dumps(value)
    raise UserError(f"adopt: cannot write {type(value).__name__} {value!r}")


PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key(key) -> str:
    """A mapping key: plain when it is a plain name, else quoted (an environment variable's name comes from the box
    and may hold anything but '=')."""
    return key if isinstance(key, str) and PLAIN_KEY.match(key) else _scalar(key)


def _comment(text: str) -> str:
    """TEXT on one line: what the box said may hold control characters, never a line break into the YAML."""
    return json.dumps(str(text))[1:-1]


def _is_flat(value) -> bool:
    return isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value)


def _emit(value, comments: dict, path: tuple, indent: int, out: list, first_prefix: str | None = None) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            lead = first_prefix if (i == 0 and first_prefix is not None) else pad
            note = comments.get(path + (key,))
            tail = f"  # {_comment(note)}" if note else ""
            name = _key(key)
            if isinstance(item, dict) or (isinstance(item, list) and not _is_flat(item)):
                out.append(f"{lead}{name}:{tail}")
                _emit(item, comments, path + (key,), indent + 2, out)
            elif isinstance(item, list):
                out.append(f"{lead}{name}: [{', '.join(_scalar(v) for v in item)}]{tail}")
            else:
                out.append(f"{lead}{name}: {_scalar(item)}{tail}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            note = comments.get(path + (i,))
            if note:
                out.append(f"{pad}# {_comment(note)}")
            if isinstance(item, dict):
                _emit(item, comments, path + (i,), indent + 2, out, first_prefix=pad + "- ")
            else:
                out.append(f"{pad}- {_scalar(item)}")


def render(host: str, variables: dict, comments: dict, unpinned: list, notes: list) -> str:
    """The YAML file adopt writes: a header, every value with where it was read, then what was not pinned."""
    out = ["---", f"# Written by `provision adopt {host}` from what the box runs; each value says where it was read.",
           "# Review it, then: provision site.yml -i INV --limit HOST --check --diff"]
    for text in notes:
        out.append(f"# note: {_comment(text)}")
    _emit(variables, comments, (), 0, out)
    if unpinned:
        out.append("# Not pinned (adopt could not read or decide these; the roles keep their defaults):")
        out += [f"# - {_comment(text)}" for text in unpinned]
    text = "\n".join(out) + "\n"
    import yaml

    if yaml.safe_load(text) != variables:  # the file must say exactly what was read
        raise UserError("adopt: the written YAML does not read back as the adopted values (a bug: please report)")
    return text


def output_path(inventory_dir, host: str, group: str | None, given: str | None):
    """Where adopt writes: -o FILE, else the inventory's host_vars/HOST.yml (group_vars/GROUP.yml with --group)."""
    from pathlib import Path

    from rigbook.paths import name_file

    if given:
        out = Path(given)
        inv = Path(inventory_dir)
        if inv.is_dir() and out.parent.resolve() == inv.resolve():
            raise UserError(f"-o {given}: Ansible reads every file at the top of {inventory_dir} as an inventory of "
                            "its own; write it elsewhere (host_vars/ or group_vars/ of the inventory, or outside it)")
        return out
    folder = Path(inventory_dir) / ("group_vars" if group else "host_vars")
    if group and (_group_file(folder, group) or (folder / name_file(group, "")).is_dir()):
        # the group has variables of its own (its rig, GPUs, P2P): adopt's file goes in the group's folder, beside
        # them (group_file_to_folder moves a GROUP.yml in: Ansible reads a group's folder or its file, not both)
        return folder / name_file(group, "") / "adopted.yml"
    return folder / name_file(group or host, ".yml")


def _group_file(folder, group: str):
    """The group's own vars file (group_vars/GROUP.yml or .yaml), or None."""
    from rigbook.paths import name_file

    found = [folder / name_file(group, suffix) for suffix in (".yml", ".yaml")]
    return next((p for p in found if p.is_file()), None)


def group_file_to_folder(target):
    """Before adopt writes group_vars/GROUP/adopted.yml: move group_vars/GROUP.yml (or .yaml) into that folder,
    content unchanged, as Ansible reads a group's folder or its file, never both. The path moved to, or None."""
    if target.name != "adopted.yml":
        return None
    own = _group_file(target.parent.parent, target.parent.name)
    if own is None:
        return None
    target.parent.mkdir(exist_ok=True)
    moved = target.parent / own.name
    if moved.exists():
        raise UserError(f"adopt --group: {moved} exists beside {own}; merge them by hand (nothing was written)")
    own.rename(moved)
    return moved


def _group_of(inv, host: str, path) -> str:
    """The group `adopt --group` writes for HOST: its most specific group (the deepest), e.g. x99_3080 under lab."""
    groups = [g for g in inv.groups_of(host) if g not in ("all", "ungrouped")]
    if not groups:
        raise UserError(f"adopt --group: {host} is in no group of {path}")
    deepest = max(inv.group_depth(g) for g in groups)
    chosen = sorted(g for g in groups if inv.group_depth(g) == deepest)
    if len(chosen) > 1:
        raise UserError(f"adopt --group: {host} is in {', '.join(chosen)} alike; name the file with -o "
                        f"(e.g. -o group_vars/{chosen[0]}.yml)")
    return chosen[0]


def _already_set(inv, group: str, keys) -> list:
    """The adopted KEYS that GROUP's own files set already (a second file of the group would fight them)."""
    return sorted({key for source in inv.sources if source.owner == f"group {group}" for key in source.variables
                   if key in keys})


def write_together(files: dict) -> None:
    """Write every {path: text} of FILES or none: each to a temporary file in its folder first (the folders made),
    then all renamed into place; a failure before the renames leaves no file changed."""
    import os
    import tempfile

    temps = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temps.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)
    except BaseException:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    for tmp, path in temps:
        os.replace(tmp, path)


def adopt_command(host: str, inventory: str, output: str | None = None, group: bool = False, force: bool = False,
                  debs_dir: str | None = None, wheels_dir: str | None = None, stream=None) -> int:
    """`provision adopt HOST -i INV`: read HOST (adopt.yml, read-only), write its pins and serve profiles, then
    check the inventory with them. Exit 0 written and valid, 1 written but the check names problems, 2 bad input
    (nothing written), 3 the host could not be reached (nothing written)."""
    import sys
    from pathlib import Path

    from rigbook import runs, statefile
    from rigbook.run import RunOptions, resolve_inventory, resolve_playbook, run_playbook
    from rigbook.validate import InventoryInvalid, run_roles, validate

    stream = stream or sys.stdout
    path = resolve_inventory(inventory)
    inv = validate(path)
    if host not in inv.hosts:
        raise UserError(f"adopt: {host!r} is not a host of {path} (hosts: {', '.join(sorted(inv.hosts)) or 'none'})")
    chosen_group = _group_of(inv, host, path) if group else None
    if chosen_group and not output and _already_set(inv, chosen_group, ("rigbook_pins", "rigbook_serve")):
        raise UserError(f"adopt --group: group {chosen_group} sets "
                        f"{', '.join(_already_set(inv, chosen_group, ('rigbook_pins', 'rigbook_serve')))} already; "
                        "remove it there or write elsewhere with -o (nothing was read or written)")
    inventory_dir = path if path.is_dir() else path.parent
    target = output_path(inventory_dir, host, chosen_group, output)
    if target.exists() and not force:
        raise UserError(f"adopt: {target} exists; --force replaces it (nothing was read or written)")
    wheels_dirs = [wheels_dir] if isinstance(wheels_dir, str) else list(wheels_dir or [])
    for option, folder in [("--debs-dir", debs_dir)] + [("--wheels-dir", w) for w in wheels_dirs]:
        if folder is not None and (not folder.startswith("/") or "\n" in folder):
            raise UserError(f"adopt {option}: an absolute folder on the host, not {folder!r}")
    if output and not target.parent.is_dir():
        raise UserError(f"adopt: the folder {target.parent} does not exist")
    base = runs.runs_dir()
    before = set(base.iterdir()) if base.is_dir() else set()
    extra = [json.dumps({name: value}) for name, value in (("rigbook_adopt_debs_dir", debs_dir),
                                                            ("rigbook_adopt_wheels_dir", wheels_dirs)) if value]
    code = run_playbook(RunOptions(playbook=PLAYBOOK, inventory=inventory, limit=host, extra_vars=extra,
                                   baseline_mode="off"))
    if code != 0:
        print(f"adopt: {host} was not read (exit {code}); nothing was written", file=sys.stderr)
        return code
    after = set(base.iterdir()) if base.is_dir() else set()
    made = sorted(p for p in after - before if (p / FACTS_DIR / f"{host}.json").is_file())
    if not made:
        print(f"adopt: the run stored nothing for {host}; nothing was written", file=sys.stderr)
        return 1
    facts, problem = statefile.read_json(made[-1] / FACTS_DIR / f"{host}.json")
    if problem or not isinstance(facts, dict):
        print(f"adopt: what the run stored for {host} is unreadable ({problem}); nothing was written", file=sys.stderr)
        return 1
    variables, comments, unpinned, notes, files = adopt_of(facts, host, inventory_dir, ", ".join(wheels_dirs))
    text = render(host, variables, comments, unpinned, notes)
    beside = {inventory_dir / rel: content for rel, content in files.items()}
    taken = [str(p) for p in beside if p.exists() and not force]
    if taken:
        raise UserError(f"adopt: {', '.join(taken)} exists; --force replaces it (nothing was written)")
    target.parent.mkdir(exist_ok=True)  # the inventory's host_vars/ or group_vars/ (-o: checked above)
    moved = group_file_to_folder(target) if not output else None
    try:
        write_together({target: text, **beside})
    except BaseException:
        if moved is not None:  # nothing half: the group's file back where it was
            moved.rename(target.parent.parent / moved.name)
        raise
    if moved is not None:
        print(f"adopt: moved the group's own variables into {moved} (Ansible reads a group's folder or its file, "
              "not both)", file=stream)
    print(f"adopt: {host}: wrote {target}" + "".join(f", {p}" for p in beside), file=stream)
    for text in notes:
        print(f"  note: {text}", file=stream)
    for text in unpinned:
        print(f"  not pinned: {text}", file=stream)
    try:  # the readiness check site.yml makes before contacting the host: every input its roles need
        validate(Path(path), roles=run_roles(resolve_playbook("site.yml")), limit=host)
    except InventoryInvalid as err:
        print(f"adopt: the inventory with {target.name} does not validate yet:\n{err}", file=sys.stderr)
        return 1
    print(f"adopt: {path} validates with {target.name}; next: provision site.yml -i {inventory} --limit {host} "
          "--check --diff", file=stream)
    return 0
