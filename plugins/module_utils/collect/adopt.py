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

What a box's local users can change is decided on before it is read, here and nowhere else: only the engines of root
and the serve user are kept (another user's is dropped, named in the notes, and nothing of it is read beyond its
command line and its status, the owner: engine_processes.engines asks adopt_facts before it reads more); an engine's
venv is read only when its folder and site-packages are reached without a link and are root's or the engine's user's
(venv_owner; the cuda_toolchain venv: root's only); then every file of it (direct_url.json, RECORD, the files RECORD
lists, the sglang sources, the venv stamp), the wheels of the wheels folders and a build stamp are read through
facts/files' no-follow reader (no link followed anywhere on the way, a regular file of bounded size, as the venv's
owner could read it), so what a link or a hard link leads to never reaches the facts.
"""

from __future__ import annotations

import base64
import csv
import difflib
import errno
import glob
import json
import os
import re
import stat
import zipfile

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import engine_processes, static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.manifest import parse_dkms_status
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, kernel, packages

KERNEL_PACKAGE = re.compile(r"^linux-(image|headers|modules|modules-extra)-")
APT_CACHE = "/var/cache/apt/archives"
DPKG_STATUS = "/var/lib/dpkg/status"
MAX_RECORD = 16 << 20  # bytes of a RECORD read
MAX_DIRECT_URL = 1 << 20  # bytes of a direct_url.json read
MAX_PATCHED_FILE = 4 << 20  # bytes of one locally changed file put into a diff
MAX_PATCH = 8 << 20  # characters of the whole diff
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
ROCM_TAGGED = re.compile(r"\.[0-9]{5,6}-")  # a ROCm package version: 7.1.0.70100-38~24.04 (its release tag 70100)
KEYRING_DIRS = ("/etc/apt/", "/usr/share/keyrings/")
MAX_KEYRING = 1 << 20
CUDA_VENV = "/opt/rigbook/cuda"  # the cuda_toolchain role's default venv (host_model.cuda_toolchain_pin)
SERVE_USER = "rigbook-serve"  # the serve role's default serve_user
UID_LINE = re.compile(r"^Uid:\s*(\d+)", re.M)
BEHIND_LINK = "outside site-packages or behind a link (not read)"


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


# --- whose engine, whose venv: decided before anything of an engine's venv is read ----------------------------------

def passwd(system):
    """{name: uid} of SYSTEM's /etc/passwd."""
    users = {}
    for line in (files.read_text(files.path(system, "etc/passwd"), strip=False) or "").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            users.setdefault(fields[0], int(fields[2]))
    return users


def process_uid(system, pid):
    """The real uid process PID runs as (its /proc/PID/status), or None."""
    found = UID_LINE.search(files.read_text(files.path(system, "proc", str(pid), "status"), strip=False) or "")
    return int(found.group(1)) if found else None


def _user(names, uid):
    return "an unknown user" if uid is None else names.get(uid, "uid %d" % uid)


def venv_owner(system, venv, uid):
    """(owner, None) when VENV and its site-packages are folders reached from SYSTEM without a link
    (files.stat_nofollow) and each is root's or UID's; OWNER is UID when one of them is UID's, else 0: the user
    whose view every file of the venv is read with (files.open_regular's owner). Else (None, why), why a uid of
    another owner (an int) or a text; nothing in the venv is read past its own folder then."""
    try:
        owners = [files.stat_nofollow(system, venv, directory=True).st_uid]
        if owners[0] in (0, uid):
            site = site_packages(system, venv)
            owners += [files.stat_nofollow(system, site, directory=True).st_uid] if site else []
    except OSError as exc:
        return None, ("reached through a symbolic link" if exc.errno == errno.ELOOP
                      else "unreadable (%s)" % (exc.strerror or exc))
    foreign = [number for number in owners if number not in (0, uid)]
    if foreign:
        return None, foreign[0]
    return (uid if uid in owners else 0), None


def site_packages(system, venv):
    """The site-packages folder (a path under SYSTEM) of VENV: the first lib/python*/site-packages, each folder
    reached without following a link; None without one."""
    lib = os.path.join(venv, "lib")
    try:
        names = [name for name, kind in files.list_nofollow(system, lib) if kind == "dir" and name.startswith("python")]
    except OSError:
        return None
    for name in names:
        site = os.path.join(lib, name, "site-packages")
        try:
            files.stat_nofollow(system, site, directory=True)
        except OSError:
            continue
        return site
    return None


# --- a venv's files: read through facts/files' no-follow reader, as the venv's OWNER could read them -----------------

def venv_packages(system, venv, owner):
    """[{name, version, install}] of a venv's distributions (dist-info folder names), install as _install_of (a
    direct_url.json that cannot be read as a file of the venv: {"local": "unreadable"}). No link is followed; every
    file is read as OWNER could read it (files.read_nofollow)."""
    site = site_packages(system, venv)
    found = []
    for folder, kind in files.list_nofollow(system, site) if site else ():
        if kind != "dir" or not folder.endswith(".dist-info"):
            continue
        name, _, version = folder[: -len(".dist-info")].partition("-")
        data, why = files.read_nofollow(system, os.path.join(site, folder, "direct_url.json"), MAX_DIRECT_URL, owner)
        install = ({"local": "unreadable", "url": None} if why
                   else _install_of(data.decode("utf-8", "replace") if data is not None else None))
        found.append({"name": name.lower().replace("_", "-"), "version": version, "install": install})
    return sorted(found, key=lambda p: p["name"])


def cuda_venv(system, names, unpinned):
    """{"venv", "packages"} of the cuda_toolchain role's default venv (CUDA_VENV) when it is a venv, else None; one
    not root's, or reached through a link, is not read (said in UNPINNED, NAMES {uid: name})."""
    try:
        files.stat_nofollow(system, CUDA_VENV, directory=True)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return None  # no such folder: nothing to say
    owner, why = venv_owner(system, CUDA_VENV, 0)
    if why is not None:
        unpinned.append("rigbook_pins.cuda_toolchain: %s is %s, not root's: adopt does not read it"
                        % (CUDA_VENV, "owned by %s" % _user(names, why) if isinstance(why, int) else why))
        return None
    try:
        files.stat_nofollow(system, os.path.join(CUDA_VENV, "pyvenv.cfg"))
    except OSError:
        return None  # root's folder, no venv
    return {"venv": CUDA_VENV, "packages": venv_packages(system, CUDA_VENV, owner)}


def _norm(name):
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_files(system, folder, packages):
    """PACKAGES (venv_packages), each given "wheels": [{"path", "sha256"}] of the .whl files of its name and version
    in FOLDER on the box (named by the inventory), added to what earlier folders gave (not recursive; several: one a
    platform). Only matching files are hashed, each opened without following a link (files.sha256_nofollow); a link
    or anything but a regular file is passed over."""
    wanted = dict(((_norm(p["name"]), p["version"]), p) for p in packages)
    for p in packages:
        p.setdefault("wheels", [])
    base = files.path(system, folder.lstrip("/"))
    try:
        names = files.list_nofollow(base, "")
    except OSError:
        return packages
    for name, kind in names:
        parts = name[:-len(".whl")].split("-") if name.endswith(".whl") else []
        p = wanted.get((_norm(parts[0]), parts[1])) if len(parts) in (5, 6) else None
        if p is None or kind != "file":
            continue
        try:
            digest = files.sha256_nofollow(base, name)
        except OSError:
            continue  # swapped for a link or a FIFO since it was listed: not a wheel of the folder
        p["wheels"].append({"path": os.path.join(folder, name), "sha256": digest})
    return packages


def _inside(rel):
    """REL (a RECORD path, relative to site-packages) normalised when it names something inside site-packages (not
    absolute, no leading ..), else None. Links on the way are the reader's to refuse (files.open_nofollow)."""
    norm = os.path.normpath(rel) if rel else "."
    if os.path.isabs(rel or "") or norm == "." or norm == ".." or norm.startswith("../"):
        return None
    return norm


def _record_digest(system, rel, owner):
    """sha256 of REL under SYSTEM (files.sha256_nofollow) as a wheel's RECORD writes it: urlsafe base64, no
    padding. Raises OSError."""
    return base64.urlsafe_b64encode(bytes.fromhex(files.sha256_nofollow(system, rel, owner))).rstrip(b"=").decode()


def record_changes(system, site, dist_info, owner):
    """[{"path", "state"}] of the files DIST_INFO's RECORD lists with a sha256 whose content now differs ("differs"),
    that are gone ("missing") or that cannot be read safely ("outside site-packages or behind a link (not read)", "not
    a regular file", or why): the local changes of an installed distribution. SITE and DIST_INFO are paths under
    SYSTEM, RECORD paths relative to SITE; every file is read with files' no-follow reader as OWNER could read it."""
    record = os.path.join(dist_info, "RECORD")
    data, why = files.read_nofollow(system, record, MAX_RECORD, owner)
    name = os.path.basename(dist_info) + "/RECORD"
    if data is None:
        # why_not's text is "RECORD's path: why (not read)"; the path is said once, as the other rows say theirs
        return [{"path": name, "state": why[len(record) + 2:] if why else "missing"}]
    try:
        rows = list(csv.reader(data.decode("utf-8", "replace").splitlines()))
    except csv.Error:
        return [{"path": name, "state": "not a RECORD (not read)"}]
    found = []
    for row in rows:
        if len(row) < 2 or not row[1].startswith("sha256="):
            continue
        rel = _inside(row[0])
        if rel is None:
            # a script in the venv's bin (../../../bin/NAME) is not sglang's package; anything else is named
            state = None if row[0].startswith("../") else BEHIND_LINK
        else:
            recorded = row[1][len("sha256="):]
            try:
                state = "differs" if _record_digest(system, os.path.join(site, rel), owner) != recorded else None
            except OSError as exc:
                state = {errno.ENOENT: "missing", errno.ELOOP: BEHIND_LINK,
                         errno.EINVAL: "not a regular file"}.get(exc.errno) or "%s (not read)" % (exc.strerror or exc)
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


def local_patch(system, site, wheel, changed, owner):
    """(patch text or None, problem or None): the unified diff from the files of WHEEL (a .whl on the box, a path
    under SYSTEM; the file opened without following a link) to the installed files of CHANGED (record_changes'
    "differs" entries, under SITE, read by files.read_nofollow as OWNER could read them), one patch for all; text
    files only, each and the whole diff capped."""
    out = []
    folder, name = os.path.split(wheel)
    try:
        with files.open_regular(files.path(system, folder.lstrip("/")), name) as handle, \
                zipfile.ZipFile(handle) as archive:
            for item in changed:
                rel = item["path"]
                try:
                    info = archive.getinfo(rel)
                except KeyError:
                    return None, "%s is not in %s" % (rel, wheel)
                if info.file_size > MAX_PATCHED_FILE:
                    return None, "%s is larger than %d bytes" % (rel, MAX_PATCHED_FILE)
                inside = _inside(rel)
                new, why = (files.read_nofollow(system, os.path.join(site, inside), MAX_PATCHED_FILE, owner)
                            if inside else (None, "%s: outside site-packages (not read)" % rel))
                if new is None:
                    return None, why or "%s: missing" % rel
                try:
                    out += _diff_lines(archive.read(info).decode("utf-8"), new.decode("utf-8"), rel)
                except UnicodeDecodeError:
                    return None, "%s is not UTF-8 text" % rel
    except OSError as exc:
        return None, files.why_not(wheel, exc)
    except (zipfile.BadZipFile, RuntimeError, EOFError) as exc:
        return None, "%s could not be read: %s" % (wheel, exc)
    text = "".join(out)
    if len(text) > MAX_PATCH:
        return None, "the diff is larger than %d bytes" % MAX_PATCH
    return text, None


def sglang_files(system, venv, packages, owner):
    """{"changed", "wheel", "patch", "problem"} of the sglang distribution of VENV: its files that differ from its
    RECORD and, when its wheel was found (PACKAGES' "wheels"), the diff from the wheel's files; None without sglang.
    Read as OWNER could read them, no link followed."""
    dist = [p for p in packages if p["name"] == "sglang"]
    site = site_packages(system, venv)
    if not dist or site is None:
        return None
    info = os.path.join(site, "sglang-%s.dist-info" % dist[0]["version"])
    changed = record_changes(system, site, info, owner)
    wheels = dist[0].get("wheels") or []
    found = {"changed": changed, "wheel": wheels[0]["path"] if wheels else None, "patch": None, "problem": None}
    differs = [c for c in changed if c["state"] == "differs"]
    if differs and wheels:
        found["patch"], found["problem"] = local_patch(system, site, wheels[0]["path"], differs, owner)
    return found


# Where an installed SGLang defines its command-line flags: add_argument("--flag", ...) calls and, in newer releases,
# dataclass fields `name: A[...]` that become --name (sglang/srt/arg_groups/arg_utils.py, _field_to_cli_name).
SGLANG_FLAG_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups")
FLAG_LITERAL = re.compile(r"[\"'](--[A-Za-z0-9][A-Za-z0-9_-]*)[\"']")
FLAG_FIELD = re.compile(r"^\s+([a-z][a-z0-9_]*)\s*:\s*A\[", re.M)
MAX_FLAG_SOURCE = 4 << 20  # bytes of one source file read
MAX_FLAG_SOURCES = 2000  # source files read for the flags
MAX_SOURCE_DEPTH = 8  # folders below a SGLANG_FLAG_FILES folder walked


def _sources(system, top, depth=0):
    """The .py files (paths under SYSTEM) that TOP is or holds, sorted; folders walked without following a link, at
    most MAX_SOURCE_DEPTH deep."""
    try:
        kind = stat.S_IFMT(files.stat_nofollow(system, top).st_mode)
    except OSError:
        return []
    if kind == stat.S_IFREG:
        return [top]
    if kind != stat.S_IFDIR or depth >= MAX_SOURCE_DEPTH:
        return []
    found = []
    try:
        entries = files.list_nofollow(system, top)
    except OSError:
        return []
    for name, entry in entries:
        if entry == "dir":
            found += _sources(system, os.path.join(top, name), depth + 1)
        elif entry == "file" and name.endswith(".py"):
            found.append(os.path.join(top, name))
    return found


def sglang_flags(system, venv, owner):
    """Sorted flags the sglang installed in VENV accepts, read from its sources (SGLANG_FLAG_FILES, at most
    MAX_FLAG_SOURCES files, each read as OWNER could read it, no link followed): a superset (a quoted "--word"
    anywhere there counts); None when the venv has no such sources (nothing to judge by)."""
    site = site_packages(system, venv)
    if site is None:
        return None
    sources = []
    for rel in SGLANG_FLAG_FILES:
        sources += _sources(system, os.path.join(site, rel))
    flags = set()
    for path in sources[:MAX_FLAG_SOURCES]:
        data, _why = files.read_nofollow(system, path, MAX_FLAG_SOURCE, owner)
        if data is None:
            continue
        text = data.decode("utf-8", "replace")
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


def build_stamp(system, library, owner):
    """{"path", "stamp"} of rigbook's source_build stamp (builds.BUILD_STAMP) in the prefix holding LIBRARY (a folder
    up to three levels above it), or None: read without following a link, as OWNER (the engine's user) could read it
    (builds.read_stamp_nofollow); "stamp" None when it is refused, garbled or not a JSON object."""
    folder = os.path.dirname(library)
    for _ in range(3):
        path = os.path.join(folder, builds.BUILD_STAMP)
        stamp, why = builds.read_stamp_nofollow(system, path, owner)
        if stamp is not None or why is not None:
            return {"path": path, "stamp": stamp}
        folder = os.path.dirname(folder)
    return None


def venv_stamp(system, venv, owner):
    """(stamp, why): the pinned_venv stamp (builds.VENV_STAMP: what rigbook installed there, its patch set by name
    and sha256) of a venv rigbook made, read as OWNER could read it with no link followed
    (builds.read_stamp_nofollow); (None, None) without one, (None, why) when refused, garbled or not a JSON object."""
    return builds.read_stamp_nofollow(system, os.path.join(venv, builds.VENV_STAMP), owner)


def env_file_values(system, path):
    """{name: value} of a KEY=value environment file rigbook writes (the GPU environment file), {} without it."""
    found = {}
    for line in (_read(system, path) or "").splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name and not name.startswith("#"):
            found[name] = value
    return found


def read_venv(system, engine, uid, names, wheels_dirs, notes, unpinned):
    """ENGINE's venv read into it (packages, with WHEELS_DIRS their wheels; venv_stamp, sglang_files, sglang_flags),
    once venv_owner found it root's or UID's (the engine's user) and reached without a link; else nothing of it is
    read: "venv_refused" says why, UNPINNED what that leaves unpinned. A venv that cannot be read whole (a folder of
    more names than facts/files reads) is refused the same way."""
    venv = engine.get("venv")
    engine.update(packages=[], venv_stamp=None, sglang_files=None, sglang_flags=None)
    if not venv:
        return
    owner, why = venv_owner(system, venv, uid)
    if isinstance(why, int):
        why = "owned by %s, neither root nor the engine's user %s" % (_user(names, why), _user(names, uid))
    if why is None:
        try:
            engine["packages"] = venv_packages(system, venv, owner)
            for folder in wheels_dirs:
                wheel_files(system, folder, engine["packages"])
            engine["venv_stamp"], stamp_why = venv_stamp(system, venv, owner)
            if stamp_why:
                notes.append("rigbook's venv stamp " + stamp_why)
            engine["sglang_files"] = sglang_files(system, venv, engine["packages"], owner)
            engine["sglang_flags"] = sglang_flags(system, venv, owner)
        except OSError as exc:
            why = "unreadable (%s)" % (exc.strerror or exc)
    if why is not None:
        engine.update(packages=[], venv_stamp=None, sglang_files=None, sglang_flags=None, venv_refused=why)
        unpinned.append("rigbook_pins.sglang: the venv %s of the engine /proc/%s is %s: adopt does not read it (its "
                        "packages, lock and patch are not pinned); make root its owner or pin it by hand"
                        % (venv, engine.get("pid"), why))


def adopt_facts(system, run, debs_dir=None, engine=None, evidence_root=None, wheels_dir=None, gpu_env_file=None,
                serve_user=SERVE_USER):
    """Everything adopt reads: {"kernel", "dkms", "nvidia_userspace", "engines", "cuda_venv", "rocm", "checks"}; the
    engines (ENGINE: the inventory's serve_engine, engine_processes.engines) of root and SERVE_USER only (another
    user's is dropped, named in checks' notes, once its command line and owner are read: engines() reads nothing
    else of it, neither its environment nor its exe, cgroup, maps or venv), each with its venv (read_venv:
    packages, with WHEELS_DIR the wheel files found there with their sha256, its sglang's local changes and flags,
    the venv stamp) and, for a mapped RCCL/NCCL library, the build stamp of the prefix it lies in (build_stamp).
    "checks": {"notes", "unpinned"} of what was skipped or refused."""
    notes, unpinned = [], []
    users = passwd(system)
    names = dict((number, name) for name, number in users.items())
    allowed = set([0] + ([users[serve_user]] if serve_user in users else []))
    wheels_dirs = [wheels_dir] if isinstance(wheels_dir, str) else list(wheels_dir or [])
    rigbooks_env = env_file_values(system, gpu_env_file) if gpu_env_file else {}
    engines, uids = [], {}

    def kept(pid):
        uids[pid] = uid = process_uid(system, pid)
        if uid in allowed:
            return True
        notes.append("the engine /proc/%s runs as %s: skipped, not read (adopt reads the engines of root and of the "
                     "serve user %s; to adopt this one, set serve_user to its user in the inventory)"
                     % (pid, "an unknown user" if uid is None else "user " + _user(names, uid), serve_user))
        return False

    for found in engine_processes.engines(system, engine, keep=kept):
        uid = uids[found["pid"]]
        engines.append(found)
        # what rigbook's GPU environment file gave the engine is the host model's, not the serve profile's
        found["env_from_rigbook"] = sorted(k for k, v in (found.get("env") or {}).items() if rigbooks_env.get(k) == v)
        for name in found["env_from_rigbook"]:
            found["env"].pop(name)
        read_venv(system, found, uid, names, wheels_dirs, notes, unpinned)
        for library in engine_processes.collectives(found.get("libraries")):
            library["build"] = build_stamp(system, library["path"], uid)
    cuda = cuda_venv(system, names, unpinned)
    for folder in wheels_dirs if cuda else ():
        wheel_files(system, folder, cuda["packages"])
    return {"kernel": kernel_facts(system, run, debs_dir, evidence_root), "dkms": dkms_facts(system, run),
            "nvidia_userspace": nvidia_userspace(system), "engines": engines, "cuda_venv": cuda,
            "uvm_disable_hmm": static_evidence.uvm_disable_hmm_configured(system),
            "gpus": static_evidence.collect_gpus(evidence_root or system)[0],
            "cpu": static_evidence.collect_cpu(evidence_root or system),
            "rocm": rocm_facts(system, run), "checks": {"notes": notes, "unpinned": unpinned}}
