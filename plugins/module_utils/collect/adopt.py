# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What `provision adopt` reads of a box that was set up by hand (standard library only; read-only).

- The kernel: the running release (/proc/sys/kernel/osrelease), the command line's own parameters (/proc/cmdline
  without what every boot has: BOOT_IMAGE, root, ro, quiet, ...), the GRUB default (/etc/default/grub and its
  grub.d drop-ins, the last one read winning, as grub-mkconfig sources them), and the installed kernel packages of
  the running release (dpkg-query through facts/packages.py, the one reader) with where each came from
  (`apt-cache policy`: an archive with its release, or only /var/lib/dpkg/status: a local .deb), and for a local
  .deb the file found in the apt cache or DEBS_DIR with its sha256.
- The running engines: collect/engine_processes.py; each engine's venv packages (dist-info name and version, a VCS,
  archive or local install from direct_url.json).
- The cuda_toolchain role's default venv /opt/rigbook/cuda when it is one: its packages (the CUDA wheels).
- ROCm: /opt/rocm/.info/version, the installed packages of a ROCm release (dpkg-query), which were installed by name
  (apt-mark showmanual), where apt has rocm-core from (apt-cache policy), the apt sources (one-line and deb822) and
  the sha256 of the keyrings they are signed by.
- The RCCL/NCCL an engine has mapped: the build stamp rigbook's source_build left in its prefix (.rigbook-build.json).

Commands go through RUN(argv) -> (rc, stdout) (facts/runner.rc_output on a box, recorded outputs in tests); files
are read under SYSTEM through facts/ (files, kernel, builds).
"""

from __future__ import annotations

import base64
import csv
import difflib
import glob
import json
import os
import re
import zipfile

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import engine_processes, static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.manifest import parse_dkms_status
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, kernel, packages

KERNEL_PACKAGE = re.compile(r"^linux-(image|headers|modules|modules-extra)-")
APT_CACHE = "/var/cache/apt/archives"
DPKG_STATUS = "/var/lib/dpkg/status"
MAX_RECORD = 16 << 20  # characters of a RECORD read
MAX_PATCHED_FILE = 4 << 20  # bytes of one locally changed file put into a diff
MAX_PATCH = 8 << 20  # characters of the whole diff
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
ROCM_TAGGED = re.compile(r"\.[0-9]{5,6}-")  # a ROCm package version: 7.1.0.70100-38~24.04 (its release tag 70100)
KEYRING_DIRS = ("/etc/apt/", "/usr/share/keyrings/")
MAX_KEYRING = 1 << 20
CUDA_VENV = "/opt/rigbook/cuda"  # the cuda_toolchain role's default venv (host_model.cuda_toolchain_pin)


def _read(system, rel):
    """The text of the file REL under SYSTEM (facts/files.read_text, unstripped), or None."""
    return files.read_text(files.path(system, rel.lstrip("/")), strip=False)


def grub_default(system):
    """(GRUB_DEFAULT's value, the file that set it) from /etc/default/grub then /etc/default/grub.d/*.cfg, or
    (None, None)."""
    value, where = None, None
    names = ["/etc/default/grub"] + sorted("/" + os.path.relpath(p, system) for p in
                                           glob.glob(os.path.join(system, "etc/default/grub.d/*.cfg")))
    for rel in names:
        for line in (_read(system, rel) or "").splitlines():
            found = re.match(r"""^\s*GRUB_DEFAULT=(["']?)(.*)\1\s*$""", line)
            if found:
                value, where = found.group(2), rel
    return value, where


def origin(sources):
    """"archive" when a configured archive offers the installed version, else "local": only the dpkg status lists
    it (a .deb installed by hand, or a version the archive has dropped since: Ubuntu drops superseded kernels)."""
    return "archive" if any(not s.endswith(DPKG_STATUS) for s in sources) else "local"


def find_deb(system, package, version, folders):
    """The .deb file of PACKAGE at VERSION in FOLDERS (on the box), with its sha256: {"path", "sha256"} or None."""
    stem = "%s_%s_" % (package, version.replace(":", "%3a"))
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(system, folder.lstrip("/"), stem + "*.deb"))):
            return {"path": "/" + os.path.relpath(path, system), "sha256": files.sha256_of(path)}
    return None


def kernel_facts(system, run, debs_dir=None, evidence_root=None):
    """The kernel as the box runs and boots it, and where its packages came from. The running release and command
    line are read as the P2P ladder reads them, under EVIDENCE_ROOT (static_evidence.collect_kernel: "/" on a box,
    the recorded tree of a lab host, whose boot hook records the kernel it booted there)."""
    running = static_evidence.collect_kernel(evidence_root or system)
    release = (running["release"] or "").strip() or None
    default, default_file = grub_default(system)
    facts = {"release": release, "cmdline": kernel.own_words(running["cmdline"]),
             "grub_default": default, "grub_default_file": default_file, "packages": []}
    _rc, out = run(packages.DPKG_QUERY + ["linux-*"])
    installed = packages.parse_installed(out)
    mine = sorted(p for p in installed if KERNEL_PACKAGE.match(p) and release and
                  (p.endswith("-" + release) or installed[p] == installed.get("linux-image-" + release)))
    if not mine:
        return facts
    rc, out = run(packages.POLICY + mine)
    policy = packages.parse_policy(out if rc == 0 else "")
    folders = [APT_CACHE] + ([debs_dir] if debs_dir else [])
    for name in mine:
        sources = (policy.get(name) or {}).get("sources") or []
        entry = {"name": name, "version": installed[name], "origin": origin(sources), "sources": sources}
        if entry["origin"] == "local":
            entry["deb"] = find_deb(system, name, installed[name], folders)
        elif debs_dir:  # the owner's own copy of an archive package: named, so the pins can say the bits are equal
            entry["deb"] = find_deb(system, name, installed[name], [debs_dir])
        facts["packages"].append(entry)
    return facts


def _install_of(direct):
    """How a distribution was installed, from its direct_url.json text (PEP 610): "index" (none: a plain resolution,
    from an index or --find-links), a VCS install {"vcs", "url", "commit"}, an archive {"archive": url, "sha256"}
    (pip install FILE.whl or a URL: the hash pip recorded, None without one), or an editable or local directory
    {"local": "editable"|"directory", "url"}."""
    if not direct:
        return "index"
    try:
        data = json.loads(direct)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"local": "unreadable", "url": None}
    url = data.get("url") if isinstance(data.get("url"), str) else None
    if isinstance(data.get("vcs_info"), dict):
        return {"vcs": data["vcs_info"].get("vcs"), "url": url, "commit": data["vcs_info"].get("commit_id")}
    if isinstance(data.get("archive_info"), dict):
        info = data["archive_info"]
        hashes = info.get("hashes") if isinstance(info.get("hashes"), dict) else {}
        digest = hashes.get("sha256") or (info.get("hash") or "").partition("sha256=")[2] or None
        return {"archive": url, "sha256": digest if re.match(r"^[0-9a-f]{64}$", digest or "") else None}
    return {"local": "editable" if (data.get("dir_info") or {}).get("editable") else "directory", "url": url}


def venv_packages(system, venv):
    """[{name, version, install}] of a venv's distributions (dist-info folder names), install as _install_of."""
    found = []
    pattern = os.path.join(system, venv.lstrip("/"), "lib", "python*", "site-packages", "*.dist-info")
    for info in sorted(glob.glob(pattern)):
        stem = os.path.basename(info)[: -len(".dist-info")]
        name, _, version = stem.partition("-")
        direct = _read(system, os.path.relpath(os.path.join(info, "direct_url.json"), system))
        found.append({"name": name.lower().replace("_", "-"), "version": version, "install": _install_of(direct)})
    return sorted(found, key=lambda p: p["name"])


def cuda_venv(system):
    """{"venv", "packages"} of the cuda_toolchain role's default venv (CUDA_VENV) when it is a venv, else None."""
    if not os.path.isfile(os.path.join(system, CUDA_VENV.lstrip("/"), "pyvenv.cfg")):
        return None
    return {"venv": CUDA_VENV, "packages": venv_packages(system, CUDA_VENV)}


def _norm(name):
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_files(system, folder, packages):
    """PACKAGES (venv_packages), each given "wheels": [{"path", "sha256"}] of the .whl files of its name and version
    in FOLDER on the box, added to what earlier folders gave (not recursive; several: one a platform). Only matching
    files are hashed; a link or anything but a regular file is passed over."""
    wanted = dict(((_norm(p["name"]), p["version"]), p) for p in packages)
    for p in packages:
        p.setdefault("wheels", [])
    base = os.path.join(system, folder.lstrip("/"))
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return packages
    for name in names:
        parts = name[:-len(".whl")].split("-") if name.endswith(".whl") else []
        p = wanted.get((_norm(parts[0]), parts[1])) if len(parts) in (5, 6) else None
        path = os.path.join(base, name)
        if p is None or os.path.islink(path) or not os.path.isfile(path):
            continue
        p["wheels"].append({"path": os.path.join(folder, name), "sha256": files.sha256_of(path)})
    return packages


def site_packages(system, venv):
    """The site-packages folder of VENV under SYSTEM (the first lib/python*), or None."""
    found = sorted(glob.glob(os.path.join(system, venv.lstrip("/"), "lib", "python*", "site-packages")))
    return found[0] if found else None


def _inside(site, rel):
    """SITE joined with REL when that stays inside SITE (no .., no absolute path, no link on the way), else None."""
    full = os.path.normpath(os.path.join(site, rel))
    if os.path.isabs(rel) or not full.startswith(site.rstrip("/") + "/"):
        return None
    if os.path.realpath(full) != os.path.join(os.path.realpath(site), os.path.relpath(full, site)):
        return None  # a link somewhere on the way: not read (it could lead anywhere on the box)
    return full


def _record_digest(path):
    """sha256 of PATH (facts/files.sha256_of) as a wheel's RECORD writes it: urlsafe base64, no padding."""
    return base64.urlsafe_b64encode(bytes.fromhex(files.sha256_of(path))).rstrip(b"=").decode()


def record_changes(site, dist_info):
    """[{"path", "state"}] of the files DIST_INFO's RECORD lists with a sha256 whose content now differs ("differs"),
    that are gone ("missing") or that cannot be read safely ("outside site-packages", "not a regular file"): the local
    changes of an installed distribution. RECORD paths are relative to SITE."""
    text = files.read_text(os.path.join(dist_info, "RECORD"), limit=MAX_RECORD, strip=False)
    try:
        rows = list(csv.reader(text.splitlines())) if text is not None else None
    except csv.Error:
        rows = None
    if rows is None:
        return [{"path": os.path.basename(dist_info) + "/RECORD", "state": "missing"}]
    found = []
    for row in rows:
        if len(row) < 2 or not row[1].startswith("sha256="):
            continue
        full = _inside(site, row[0])
        if full is None:
            # a script in the venv's bin (../../../bin/NAME) is not sglang's package; anything else is named
            state = None if row[0].startswith("../") else "outside site-packages or behind a link (not read)"
        elif not os.path.lexists(full):
            state = "missing"
        elif os.path.islink(full) or not os.path.isfile(full):
            state = "not a regular file"
        else:
            state = "differs" if _record_digest(full) != row[1][len("sha256="):] else None
        if state:
            found.append({"path": row[0], "state": state})
    return found


def _diff_lines(old, new, rel):
    """A unified diff of one file (a/REL, b/REL; patch -p1 in site-packages), with patch's marker for a last line
    without a newline."""
    out = []
    for line in difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/" + rel, "b/" + rel):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return out


def local_patch(site, wheel, changed):
    """(patch text or None, problem or None): the unified diff from the files of WHEEL (a .whl on the box) to the
    installed files of CHANGED (record_changes' "differs" entries), one patch for all; text files only, each and the
    whole diff capped."""
    out = []
    try:
        with zipfile.ZipFile(wheel) as archive:
            for item in changed:
                rel = item["path"]
                try:
                    info = archive.getinfo(rel)
                except KeyError:
                    return None, "%s is not in %s" % (rel, wheel)
                full = _inside(site, rel)
                if info.file_size > MAX_PATCHED_FILE or full is None or os.path.getsize(full) > MAX_PATCHED_FILE:
                    return None, "%s is larger than %d bytes" % (rel, MAX_PATCHED_FILE)
                with open(full, "rb") as handle:
                    new = handle.read()
                try:
                    out += _diff_lines(archive.read(info).decode("utf-8"), new.decode("utf-8"), rel)
                except UnicodeDecodeError:
                    return None, "%s is not UTF-8 text" % rel
    except (OSError, zipfile.BadZipFile, RuntimeError) as exc:
        return None, "%s could not be read: %s" % (wheel, exc)
    text = "".join(out)
    if len(text) > MAX_PATCH:
        return None, "the diff is larger than %d bytes" % MAX_PATCH
    return text, None


def sglang_files(system, venv, packages):
    """{"changed", "wheel", "patch", "problem"} of the sglang distribution of VENV: its files that differ from its
    RECORD and, when its wheel was found (PACKAGES' "wheels"), the diff from the wheel's files; None without sglang."""
    dist = [p for p in packages if p["name"] == "sglang"]
    site = site_packages(system, venv)
    if not dist or site is None:
        return None
    info = os.path.join(site, "sglang-%s.dist-info" % dist[0]["version"])
    changed = record_changes(site, info)
    wheels = dist[0].get("wheels") or []
    found = {"changed": changed, "wheel": wheels[0]["path"] if wheels else None, "patch": None, "problem": None}
    differs = [c for c in changed if c["state"] == "differs"]
    if differs and wheels:
        found["patch"], found["problem"] = local_patch(site, os.path.join(system, wheels[0]["path"].lstrip("/")),
                                                       differs)
    return found


# Where an installed SGLang defines its command-line flags: add_argument("--flag", ...) calls and, in newer releases,
# dataclass fields `name: A[...]` that become --name (sglang/srt/arg_groups/arg_utils.py, _field_to_cli_name).
SGLANG_FLAG_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups")
FLAG_LITERAL = re.compile(r"[\"'](--[A-Za-z0-9][A-Za-z0-9_-]*)[\"']")
FLAG_FIELD = re.compile(r"^\s+([a-z][a-z0-9_]*)\s*:\s*A\[", re.M)
MAX_FLAG_SOURCE = 4 << 20  # characters of one source file read


def sglang_flags(system, venv):
    """Sorted flags the sglang installed in VENV accepts, read from its sources (SGLANG_FLAG_FILES): a superset (a
    quoted "--word" anywhere there counts); None when the venv has no such sources (nothing to judge by)."""
    site = site_packages(system, venv)
    if site is None:
        return None
    sources = []
    for rel in SGLANG_FLAG_FILES:
        path = _inside(site, rel)
        if path is None:
            continue
        if os.path.isfile(path):
            sources.append(path)
        for top, dirs, names in os.walk(path) if os.path.isdir(path) else ():
            dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(top, d)))
            sources += [os.path.join(top, n) for n in sorted(names) if n.endswith(".py")]
    flags = set()
    for path in sources:
        if os.path.islink(path):
            continue
        text = files.read_text(path, limit=MAX_FLAG_SOURCE, strip=False)
        if text is None:
            continue
        flags.update(FLAG_LITERAL.findall(text))
        flags.update("--" + name.replace("_", "-") for name in FLAG_FIELD.findall(text))
    return sorted(flags) or None


def git_origin(system, folder):
    """{"repo", "branch", "commit"} of a git work tree FOLDER read from its .git files (no git needed), or None."""
    git = os.path.join(folder, ".git")
    head = (_read(system, os.path.join(git, "HEAD")) or "").strip()
    if not head:
        return None
    branch, commit = None, head
    if head.startswith("ref: "):
        ref = head[5:].strip()
        branch = ref.rsplit("refs/heads/", 1)[-1] if ref.startswith("refs/heads/") else None
        commit = (_read(system, os.path.join(git, ref)) or "").strip()
        if not commit:
            for line in (_read(system, os.path.join(git, "packed-refs")) or "").splitlines():
                if line.endswith(" " + ref):
                    commit = line.split()[0]
    config = _read(system, os.path.join(git, "config")) or ""
    found = re.search(r'\[remote "origin"\][^\[]*?^\s*url\s*=\s*(\S+)', config, re.M)
    return {"repo": found.group(1) if found else None, "branch": branch,
            "commit": commit if re.match(r"^[0-9a-f]{7,40}$", commit or "") else None}


def dkms_facts(system, run):
    """[{module, version, kernels: {kernel: state}, source, git}] of `dkms status`, with each module's source folder
    (/usr/src/MODULE-VERSION) and, when that is a git work tree, its origin and commit."""
    rc, out = run(["dkms", "status"])
    modules = {}
    for release, entries in parse_dkms_status(out if rc == 0 else "").items():
        for entry in entries:
            ident, _, state = entry.partition(": ")
            module, _, version = ident.partition("/")
            item = modules.setdefault((module, version), {"module": module, "version": version, "kernels": {}})
            item["kernels"][release] = state
    found = []
    for (module, version), item in sorted(modules.items()):
        folder = "/usr/src/%s-%s" % (module, version)
        item["source"] = folder if os.path.isdir(os.path.join(system, folder.lstrip("/"))) else None
        item["git"] = git_origin(system, folder) if item["source"] else None
        found.append(item)
    return found


def nvidia_userspace(system):
    """The NVIDIA userspace version, from the versioned file name of libnvidia-ml.so or libcuda.so (both the .run
    installer's; libcuda's is what the nvidia_p2p_driver role checks), or None."""
    for lib in ("libnvidia-ml.so.", "libcuda.so."):
        for folder in ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib"):
            for path in sorted(glob.glob(os.path.join(system, folder, lib + "*.*"))):
                version = os.path.basename(path)[len(lib):]
                if re.match(r"^[0-9]+(\.[0-9]+)+$", version):
                    return version
    return None


def _list_entry(line):
    """One-line-style source ("deb [opt=value ...] URI SUITE [COMPONENT ...]") as a deb822-like dict, or None."""
    line = line.split("#", 1)[0].strip()
    found = re.match(r"^(deb|deb-src)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)((?:\s+\S+)*)$", line)
    if not found:
        return None
    options = dict(o.partition("=")[::2] for o in (found.group(2) or "").split())
    signed = options.get("signed-by", "")
    return {"types": [found.group(1)], "uris": [found.group(3)], "suites": [found.group(4)],
            "components": found.group(5).split(), "signed_by": [p for p in signed.split(",") if p]}


def _deb822_entries(text):
    """The stanzas of a .sources file (deb822) as dicts; Signed-By holding the key itself is "inline"."""
    found = []
    for stanza in re.split(r"\n\s*\n", text or ""):
        fields, name = {}, None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and name:
                fields[name] += "\n" + line.strip()
            elif ":" in line:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                fields[name] = value.strip()
        if "uris" not in fields or fields.get("enabled", "yes").lower() == "no":
            continue
        signed = fields.get("signed-by", "")
        found.append({"types": fields.get("types", "").split(), "uris": fields["uris"].split(),
                      "suites": fields.get("suites", "").split(), "components": fields.get("components", "").split(),
                      "signed_by": "inline" if "BEGIN PGP" in signed else signed.split()})
    return found


def apt_sources(system):
    """[{file, types, uris, suites, components, signed_by}] of sources.list, sources.list.d/*.list and *.sources."""
    found = []
    names = ["/etc/apt/sources.list"] + sorted("/" + os.path.relpath(p, system) for p in
                                               glob.glob(os.path.join(system, "etc/apt/sources.list.d/*.list"))
                                               + glob.glob(os.path.join(system, "etc/apt/sources.list.d/*.sources")))
    for rel in names:
        text = _read(system, rel) or ""
        entries = _deb822_entries(text) if rel.endswith(".sources") else [
            e for e in (_list_entry(line) for line in text.splitlines()) if e]
        found += [dict(e, file=rel) for e in entries]
    return found


def keyring_digests(system, sources):
    """{path: sha256 or why not} of the keyrings SOURCES' Signed-By name; only files under KEYRING_DIRS are read (a
    Signed-By may name anything on the box)."""
    found = {}
    real_system = os.path.realpath(system)
    for entry in sources:
        for path in entry["signed_by"] if isinstance(entry["signed_by"], list) else []:
            full = os.path.realpath(os.path.join(system, path.lstrip("/")))
            inside = os.path.relpath(full, real_system)
            if not path.startswith("/") or not ("/" + inside).startswith(KEYRING_DIRS):
                found[path] = "not read: a keyring outside %s" % " and ".join(KEYRING_DIRS)
            elif not os.path.isfile(full) or os.path.getsize(full) > MAX_KEYRING:
                found[path] = "not read: no file of at most %d bytes" % MAX_KEYRING
            else:
                found[path] = files.sha256_of(full)
    return found


def rocm_facts(system, run):
    """ROCm as the box runs it, or None without ROCm: {version_file, packages {name: version} (versions with a ROCm
    release tag, amdgpu-dkms), manual [names], policy (apt-cache policy rocm-core), sources, keyrings}."""
    version_file = (_read(system, ROCM_VERSION_FILE) or "").strip() or None
    _rc, out = run(packages.DPKG_QUERY)
    installed = packages.parse_installed(out)
    if version_file is None and "rocm-core" not in installed:
        return None
    rocm = dict((n, v) for n, v in installed.items() if ROCM_TAGGED.search(v) or n == "amdgpu-dkms")
    _rc, manual = run(["apt-mark", "showmanual"])
    _rc, policy = run(packages.POLICY + ["rocm-core"])
    sources = apt_sources(system)
    return {"version_file": version_file, "packages": rocm,
            "manual": sorted(set(manual.split()) & set(rocm)),
            "policy": (packages.parse_policy(policy).get("rocm-core") or {}).get("sources") or [],
            "sources": sources, "keyrings": keyring_digests(system, sources)}


def _stamp_file(full):
    """True when FULL is a stamp to read: a regular file (a link is not followed) of at most builds.MAX_STAMP bytes."""
    return os.path.isfile(full) and not os.path.islink(full) and os.path.getsize(full) <= builds.MAX_STAMP


def build_stamp(system, library):
    """{"path", "stamp"} of rigbook's source_build stamp (builds.BUILD_STAMP) in the prefix holding LIBRARY (a folder
    up to three levels above it), or None: the stamp is read by builds.read_stamp (a JSON object, at most MAX_STAMP
    bytes; None when garbled), a link not followed."""
    folder = os.path.dirname(library)
    for _ in range(3):
        path = os.path.join(folder, builds.BUILD_STAMP)
        full = files.path(system, path.lstrip("/"))
        if _stamp_file(full):
            return {"path": path, "stamp": builds.read_stamp(full)[0]}
        folder = os.path.dirname(folder)
    return None


def venv_stamp(system, venv):
    """The pinned_venv stamp (builds.VENV_STAMP: what rigbook installed there, its patch set by name and sha256) of a
    venv rigbook made, or None (also when garbled)."""
    full = files.path(system, venv.lstrip("/"), builds.VENV_STAMP)
    return builds.read_stamp(full)[0] if _stamp_file(full) else None


def env_file_values(system, path):
    """{name: value} of a KEY=value environment file rigbook writes (the GPU environment file), {} without it."""
    found = {}
    for line in (_read(system, path) or "").splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name and not name.startswith("#"):
            found[name] = value
    return found


def adopt_facts(system, run, debs_dir=None, engine=None, evidence_root=None, wheels_dir=None, gpu_env_file=None):
    """Everything adopt reads: {"kernel", "dkms", "nvidia_userspace", "engines", "cuda_venv", "rocm"}; each engine
    (ENGINE: the inventory's serve_engine, engine_processes.engines) with its venv's packages (and, with WHEELS_DIR,
    the wheel files found there with their sha256), its sglang's local changes (sglang_files) and, for a mapped
    RCCL/NCCL library, the build stamp of the prefix it lies in (build_stamp)."""
    engines = engine_processes.engines(system, engine)
    rigbooks_env = env_file_values(system, gpu_env_file) if gpu_env_file else {}
    for engine in engines:
        engine["packages"] = venv_packages(system, engine["venv"]) if engine["venv"] else []
        engine["venv_stamp"] = venv_stamp(system, engine["venv"]) if engine["venv"] else None
        # what rigbook's GPU environment file gave the engine is the host model's, not the serve profile's
        engine["env_from_rigbook"] = sorted(k for k, v in (engine.get("env") or {}).items() if rigbooks_env.get(k) == v)
        for name in engine["env_from_rigbook"]:
            engine["env"].pop(name)
        for folder in ([wheels_dir] if isinstance(wheels_dir, str) else wheels_dir or []):
            wheel_files(system, folder, engine["packages"])
        engine["sglang_files"] = sglang_files(system, engine["venv"], engine["packages"]) if engine["venv"] else None
        engine["sglang_flags"] = sglang_flags(system, engine["venv"]) if engine["venv"] else None
        for library in engine_processes.collectives(engine.get("libraries")):
            library["build"] = build_stamp(system, library["path"])
    cuda = cuda_venv(system)
    for folder in ([wheels_dir] if isinstance(wheels_dir, str) else wheels_dir or []) if cuda else ():
        wheel_files(system, folder, cuda["packages"])
    return {"kernel": kernel_facts(system, run, debs_dir, evidence_root), "dkms": dkms_facts(system, run),
            "nvidia_userspace": nvidia_userspace(system), "engines": engines, "cuda_venv": cuda,
            "uvm_disable_hmm": static_evidence.uvm_disable_hmm_configured(system),
            "gpus": static_evidence.collect_gpus(evidence_root or system)[0],
            "cpu": static_evidence.collect_cpu(evidence_root or system),
            "rocm": rocm_facts(system, run)}
