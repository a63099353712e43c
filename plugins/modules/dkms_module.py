#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: dkms_module
short_description: Build and install one pinned DKMS module for every given kernel, and make it win
description:
  - Verifies the source tarball O(src) against O(sha256) before anything else (a mismatch is refused and nothing
    is touched), unpacks it to C(/usr/src/<name>-<version>), removes every other registered version of O(name),
    then C(dkms install)s O(name)/O(version) for each of O(kernels) that lacks it. A source tree there without
    rigbook's stamp that holds exactly the tarball's files (a C(.git) folder aside), as on a box set up by hand, is
    kept with its builds and stamped.
  - A fork installed by hand for one of O(kernels) - its own C(make modules_install), which puts NVIDIA's open modules
    in C(/lib/modules/<kernel>/kernel/drivers/video) (seed 000's way) - is said with the reason, in check mode too
    (RV(hand_installed), C(msg), the diff). Before building, those files of the package's modules (its dkms.conf's
    C(BUILT_MODULE_NAME)) are moved aside to C(/var/lib/rigbook/hand-installed/<name>-<version>/<kernel>) (kept, never
    deleted; an earlier move is never overwritten) and C(depmod) re-run, so that C(dkms install) finds no module of the
    same version in the kernel's tree; a failure after that puts them back.
  - Afterwards C(modinfo -k <kernel> -n <module>) must resolve each of O(modules) to the DKMS build (C(updates/dkms));
    stock copies that shadow it are deleted and C(depmod) re-run, and the task fails when the DKMS build still loses.
  - After a build, rigbook's build stamp of each kernel's build (C(.rigbook-build.json) beside it in dkms's tree) holds
    the source's sha256, the identity and each module's file and C(srcversion) (C(modinfo -F srcversion)), which the
    ladder's driver_state layer holds the loaded module to.
  - Reads both C(dkms status) formats (dkms 2 C(name, version, kernel, arch) and dkms 3 C(name/version, kernel, arch)).
  - Supports check mode and diff mode. In check mode a missing O(src), C(dkms) or kernel headers (which earlier
    tasks would have installed) are reported as changes to come, not as failures.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  name:
    description: DKMS package name (PACKAGE_NAME of dkms.conf).
    type: str
    required: true
  version:
    description: DKMS package version (PACKAGE_VERSION of dkms.conf).
    type: str
    required: true
  src:
    description: Source tarball on the target (a top-level directory holding dkms.conf), or a directory.
    type: path
    required: true
  sha256:
    description: SHA-256 of O(src) when it is a tarball.
    type: str
  kernels:
    description: Kernel releases to build for (each needs its headers).
    type: list
    elements: str
    required: true
  modules:
    description: Module names that must resolve to the DKMS build (default O(name)).
    type: list
    elements: str
  export_dir:
    description:
      - After building for the kernels that lacked the module, write the builds as one binaries-only archive named
        C(<name>-<identity_id>-<sha256>.tar.gz) into this folder, for the group's other boxes (RV(export_path)). Its
        layout is C(dkms mktarball --binaries-only)'s (C(dkms_binaries_only/) with PACKAGE_NAME, PACKAGE_VERSION and
        the source's dkms.conf; C(dkms_main_tree/<kernel>/<arch>/module/) with the modules) less the build logs, which
        hold times, plus a stamp naming every file with its sha256; written byte for byte reproducibly (sorted names,
        no times, owner root). Read from dkms's tree (C(/var/lib/dkms)).
    type: path
  install_from:
    description:
      - When kernels lack the module, install this archive (an O(export_dir) archive of a group's build host)
        instead of building - its name must carry this call's RV(identity_id) (the same source, version, kernels,
        their headers' C(Module.symvers) and architecture) and its sha256; every member is checked by safe_untar; its
        regular files must be exactly those of O(install_files), each with that sha256, named by its stamp, and
        nothing but the package's name, version and dkms.conf and those kernels' modules for this architecture; its
        dkms.conf must be byte for byte the pinned source's (dkms runs a dkms.conf as a shell script, as root).
        Anything else refuses it with no module installed.
      - No dkms command reads the archive (C(dkms ldtarball) would run its dkms.conf and copy it over the source
        tree); its checked modules are put where dkms keeps its builds, then C(dkms install) for each kernel installs
        them, nothing compiled.
    type: path
  install_files:
    description: With O(install_from) (required then), the controller's manifest of the archive - every regular file
      in it (a relative path) with its sha256, as the controller computed them from the archive it holds
      (rigbook.homelab.group_archive).
    type: dict
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: Build the P2P fork for every kernel
  rigbook.homelab.dkms_module:
    name: nvidia
    version: 615.71.09
    src: /var/cache/rigbook/artifacts/open-gpu-kernel-modules-615.71.09-p2p.tar.gz
    sha256: "{{ rigbook_pins.nvidia_driver.source.sha256 }}"
    kernels: [6.1.0-47-amd64]
"""

RETURN = r"""
stamped:
  description:
    - True when C(/usr/src/<name>-<version>) had no stamp but held exactly the pinned tarball's files (put there by
      hand, then adopted), so only the stamp was written (or would be) and its DKMS builds were kept.
  returned: always
  type: bool
built:
  description: Kernels the module was built and installed for by this call (or would be in check mode).
  returned: always
  type: list
  elements: str
removed:
  description: Other versions of the package removed from DKMS (name/version).
  returned: always
  type: list
  elements: str
shadowing_removed:
  description: Stock module files deleted because modinfo resolved to them instead of the DKMS build.
  returned: always
  type: list
  elements: str
hand_installed:
  description: "Kernel -> the module files installed by hand (make modules_install) that were (in check mode: would be)
    moved aside."
  returned: when there were any
  type: dict
moved_aside_to:
  description: "Kernel -> the folder its hand-installed files were (would be) moved to."
  returned: when there were any
  type: dict
build_stamps:
  description: The build stamps written (one per kernel built, in dkms's tree beside the build).
  returned: when modules were built
  type: list
  elements: str
modinfo:
  description: "Kernel -> module -> the file C(modinfo -k <kernel> -n <module>) resolves to."
  returned: always
  type: dict
unpacked:
  description: Whether O(src) was (or in check mode would be) unpacked anew into C(/usr/src/<name>-<version>).
  returned: always
  type: bool
identity_id:
  description: What the kernels of RV(built) need built (sha256 of the source, the version, each kernel with its
    headers' C(Module.symvers) sha256, the architecture; 16 hex digits), also in check mode; empty when nothing is.
  returned: always
  type: str
archive_glob:
  description: The file name pattern of the group archives of RV(identity_id) (C(<name>-<identity_id>-*.tar.gz),
    whatever their sha256), also in check mode - what roles/group_build looks for on the controller; empty when
    nothing is built.
  returned: always
  type: str
export_path:
  description: The archive written into O(export_dir) after a build.
  returned: when a build was exported
  type: str
export_sha256:
  description: Its sha256.
  returned: when a build was exported
  type: str
installed_from:
  description: The O(install_from) archive installed instead of a build.
  returned: when one was installed
  type: str
status:
  description: The parsed dkms status of O(name) after the call.
  returned: always
  type: list
  elements: dict
"""

import hashlib
import json
import os
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import kernel as kernel_facts

# Where sources are unpacked and where kernel headers live (module-level so unit tests can point them elsewhere).
SRC_ROOT = "/usr/src"
MODULES_ROOT = "/lib/modules"
DKMS_TREE = "/var/lib/dkms"  # dkms's default dkms_tree (framework.conf)


def parse_status(text):
    """dkms status lines (dkms 2 and 3 formats) -> [{name, version, kernel, arch, state}]."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^([^,/\s]+)[/,]\s*([^,:\s]+)(?:,\s*([^,:\s]+))?(?:,\s*([^,:\s]+))?\s*:\s*(\w+)", line.strip())
        if m:
            rows.append(dict(name=m.group(1), version=m.group(2), kernel=m.group(3), arch=m.group(4),
                             state=m.group(5)))
    return rows


class Dkms(object):
    def __init__(self, module):
        self.module = module

    def run(self, argv, what, check=True):
        """(rc, stdout) of ARGV (facts/runner.py; rc None when it could not start); with CHECK a failure fails the
        module naming WHAT."""
        result = runner.run(argv)
        if check and result.rc is None:
            self.module.fail_json(msg="%s could not run: %s" % (what, result.error), cmd=argv)
        if check and result.rc != 0:
            self.module.fail_json(msg="%s failed (rc %d): %s" % (what, result.rc,
                                                                 (result.stderr + result.stdout).strip()[-3000:]),
                                  cmd=argv)
        return result.rc, result.stdout

    def status(self, name):
        _rc, out = self.run(["dkms", "status", "-m", name], "dkms status", check=False)
        return parse_status(out)

    def modinfo(self, kernel, module_name):
        rc, out = self.run(["modinfo", "-k", kernel, "-n", module_name], "modinfo", check=False)
        return out.strip() if rc == 0 else None


def extract(module, src, tmp):
    """The source tree of SRC (a tarball with one top directory, or a directory), checked to hold dkms.conf.

    A tarball is unpacked into TMP (an empty folder) by safe_untar, every member checked first. Fails the module,
    before anything on the host was changed, when SRC is not a readable tarball, is unsafe (a member that would
    land or point outside TMP, a device, over the size caps), or has no dkms.conf at its top level."""
    if os.path.isdir(src):
        top = src
    else:
        safe_untar.unpack_or_fail(lambda msg: module.fail_json(msg=msg), src, tmp, "nothing was installed")
        entries = os.listdir(tmp)
        top = os.path.join(tmp, entries[0]) if len(entries) == 1 and os.path.isdir(
            os.path.join(tmp, entries[0])) else tmp
    if not os.path.isfile(os.path.join(top, "dkms.conf")):
        module.fail_json(msg="%s has no dkms.conf at its top level" % src)
    return top


def tree_files(root):
    """{relative path: link target, or None for a file} of a source folder (its .git and rigbook's stamp aside)."""
    found = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not (dirpath == root and d == ".git"))
        for n in names:
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, root)
            if rel != builds.SOURCE_STAMP:
                found[rel] = os.readlink(full) if os.path.islink(full) else None
    return found


def same_tree(top, dest):
    """Whether DEST holds exactly the files of TOP, byte for byte (a work tree's .git and rigbook's stamp aside): a
    source tree put there by hand from the pinned source (a box set up by hand, then adopted)."""
    mine, theirs = tree_files(top), tree_files(dest)
    if set(mine) != set(theirs):
        return False
    for rel, link in mine.items():
        if link is not None or theirs[rel] is not None:
            if link != theirs[rel]:
                return False
        elif files.sha256_of(os.path.join(top, rel)) != files.sha256_of(os.path.join(dest, rel)):
            return False
    return True


def write_stamp(dest, sha):
    """The unpacked source's stamp: its tarball's sha256 (facts/builds.SOURCE_STAMP), through the one atomic write."""
    files.write_atomic(os.path.join(dest, builds.SOURCE_STAMP), sha + "\n")


def read_stamp(dest):
    """The sha256 the unpacked source in DEST was stamped with, or None."""
    return files.read_text(os.path.join(dest, builds.SOURCE_STAMP))


def install_tree(top, dest, sha):
    """Copy the source tree TOP to DEST (replacing it) and stamp it with SHA."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(top, dest, symlinks=True)
    write_stamp(dest, sha)


def symvers_sha256(kernel):
    """The sha256 of KERNEL's headers' Module.symvers (its exported symbols and their CRCs: what a module built
    against it must match), or None without one."""
    path = os.path.join(MODULES_ROOT, kernel, "build", "Module.symvers")
    return files.sha256_of(path) if os.path.isfile(path) else None


def tree_digest(root):
    """The sha256 of a source folder's files and links (its .git and rigbook's stamp aside)."""
    digest = hashlib.sha256()
    for rel, link in sorted(tree_files(root).items()):
        digest.update(("%s\0%s\n" % (rel, link if link is not None else files.sha256_of(os.path.join(root, rel))))
                      .encode())
    return digest.hexdigest()


def identity_of(name, version, source, kernels):
    """identity_id: what KERNELS need built from SOURCE (its sha256), for this architecture."""
    wanted = dict(name=name, version=version, source=source, arch=os.uname()[4],
                  kernels=dict((k, symvers_sha256(k)) for k in sorted(kernels)))
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]


MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
META = ("dkms_binaries_only/PACKAGE_NAME", "dkms_binaries_only/PACKAGE_VERSION", "dkms_binaries_only/dkms.conf")


def built_dir(name, version, kernel):
    """Where DKMS keeps the build of NAME/VERSION for KERNEL on this architecture (its module/ holds the modules)."""
    return os.path.join(DKMS_TREE, name, version, kernel, os.uname()[4])


# Where a module built outside DKMS by its own `make modules_install` lands: NVIDIA's open kernel modules (and so the
# P2P fork) install to kernel/drivers/video (NVIDIA/open-gpu-kernel-modules kernel-open/Makefile: INSTALL_MOD_DIR ?=
# kernel/drivers/video), as NVIDIA's .run installer does; seed 000 installed its fork so ("the old DKMS module cleared,
# then depmod"). No distribution package puts NVIDIA modules there (Ubuntu: kernel/nvidia-<branch>, DKMS: updates/dkms).
HAND_INSTALL_DIR = "kernel/drivers/video"
# Where hand-installed module files are moved aside to, one folder per package version and kernel: kept, never deleted,
# and outside /lib/modules, so depmod no longer sees them (module-level so unit tests can point it elsewhere).
BACKUP_ROOT = "/var/lib/rigbook/hand-installed"
# The running system's root, for /sys/module and /proc (module-level so unit tests can point it elsewhere).
LIVE_ROOT = "/"


def built_module_names(conf_text):
    """The BUILT_MODULE_NAME[] entries of a dkms.conf's text (the fork's: nvidia, nvidia-modeset, nvidia-drm,
    nvidia-uvm, nvidia-peermem)."""
    return re.findall(r"""^\s*BUILT_MODULE_NAME\[\d+\]\s*=\s*["']?([A-Za-z0-9_-]+)""", conf_text or "", re.M)


def package_modules(module, name, modules, src, tree):
    """The module names the package installs: BUILT_MODULE_NAME[] of the pinned source's dkms.conf (TREE: the
    unpacked pinned source, or None to read it from SRC), and NAME and MODULES."""
    if tree is None and os.path.isdir(src):
        tree = src
    if tree is not None:
        conf = files.read_text(os.path.join(tree, "dkms.conf"), limit=1 << 16)
    else:
        # only read (check mode too): unpacked in the temporary folder, never beside the box's sources (/usr/src)
        tmp = tempfile.mkdtemp(prefix=".rigbook-")
        try:
            conf = files.read_text(os.path.join(extract(module, src, tmp), "dkms.conf"), limit=1 << 16)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(set(built_module_names(conf)) | set([name]) | set(modules or []))


def _stem(file_name):
    """A module file's module name in the kernel's spelling (nvidia-uvm.ko.zst -> nvidia_uvm), or None."""
    for suffix in MODULE_SUFFIXES:
        if file_name.endswith(suffix):
            return file_name[:-len(suffix)].replace("-", "_")
    return None


def hand_installed(kernels, names=None, package=None):
    """{kernel: [absolute paths]} of the module files a `make modules_install` put in each of KERNELS'
    HAND_INSTALL_DIR: those of NAMES (the package's modules), or without them (its source not on the host yet, check
    mode) those named PACKAGE or PACKAGE-<part> (the fork's nvidia, nvidia-uvm, ...; the kernel's own nvidiafb is not)."""
    wanted = set(n.replace("-", "_") for n in names or [])
    prefix = (package or "").replace("-", "_") + "_"

    def ours(stem):
        return stem in wanted if names else stem is not None and (stem + "_").startswith(prefix)

    out = {}
    for kernel in kernels:
        found = []
        for dirpath, _dirs, file_names in os.walk(os.path.join(MODULES_ROOT, kernel, HAND_INSTALL_DIR)):
            found.extend(os.path.join(dirpath, f) for f in file_names if ours(_stem(f)))
        if found:
            out[kernel] = sorted(found)
    return out


def hand_installed_result(name, version, hand, kernels, check):
    """The result keys and the message of HAND ({kernel: [paths]}), with the backup folder of each kernel."""
    backups = dict((k, backup_folder(name, version, k)) for k in hand)
    return (dict(hand_installed=hand, moved_aside_to=backups),
            hand_installed_message(name, version, hand, backups, kernels, moved=not check))


def backup_folder(name, version, kernel):
    """Where KERNEL's hand-installed files of NAME/VERSION go: BACKUP_ROOT/NAME-VERSION/KERNEL, or the first of
    KERNEL-2, KERNEL-3, ... that does not exist yet (an earlier move is never overwritten)."""
    base = os.path.join(BACKUP_ROOT, "%s-%s" % (name, version), kernel)
    folder, n = base, 1
    while os.path.lexists(folder):
        n += 1
        folder = "%s-%d" % (base, n)
    return folder


def loaded_version(module_name):
    """The version of MODULE_NAME loaded in the running kernel (/sys/module), or None."""
    return files.read_text(os.path.join(LIVE_ROOT, "sys", "module", module_name.replace("-", "_"), "version"),
                           limit=256)


def hand_installed_message(name, version, hand, backups, kernels, moved):
    """What the converge does (MOVED: did) about the hand-installed files HAND ({kernel: [paths]}), and why."""
    running = kernel_facts.release(LIVE_ROOT)
    where = []
    for kernel in sorted(hand):
        folder = os.path.join(MODULES_ROOT, kernel, HAND_INSTALL_DIR)
        text = "%s (%s)" % (folder, ", ".join(os.path.relpath(f, folder) for f in hand[kernel]))
        if kernel == running and loaded_version(name) == version:
            text += ", the pinned %s %s loaded from there" % (name, version)
        where.append(text)
    return ("the fork is installed by hand (make modules_install) in %s; %s builds %s/%s with DKMS for every "
            "installed kernel (%s) so that a kernel upgrade rebuilds it, and %s the hand-installed files aside to %s "
            "(kept, not deleted)" % ("; ".join(where), "the converge" if not moved else "this run",
                                     name, version, ", ".join(kernels), "moved" if moved else "moves",
                                     ", ".join(backups[k] for k in sorted(hand))))


def move_aside(module, dkms, hand, backups, moved):
    """Move HAND's files ({kernel: [paths]}) into BACKUPS ({kernel: folder}), keeping their paths below
    /lib/modules/<kernel>, and re-run depmod for each kernel; each move is added to MOVED [(from, to)] as it is made
    (a failure puts back what MOVED holds)."""
    for kernel in sorted(hand):
        base = os.path.join(MODULES_ROOT, kernel)
        for path in hand[kernel]:
            target = os.path.join(backups[kernel], os.path.relpath(path, base))
            try:
                if not os.path.isdir(os.path.dirname(target)):
                    os.makedirs(os.path.dirname(target), 0o700)
                shutil.move(path, target)
            except OSError as exc:
                module.fail_json(msg="cannot move %s aside to %s: %s" % (path, target, exc))
            moved.append((path, target))
        dkms.run(["depmod", "-a", kernel], "depmod -a %s" % kernel)


def put_back(moved):
    """Move the files of MOVED back where they were (a later step failed) and re-run depmod; what happened, in words."""
    if not moved:
        return ""
    kernels = set()
    try:
        for path, target in reversed(moved):
            if not os.path.lexists(path):
                shutil.move(target, path)
            kernels.add(os.path.relpath(path, MODULES_ROOT).split(os.sep)[0])
    except OSError as exc:
        return "; putting the hand-installed files back failed (%s): they are in %s" % (
            exc, ", ".join(sorted(set(os.path.dirname(t) for _p, t in moved))))
    errors = [r.error for r in (runner.run(["depmod", "-a", k]) for k in sorted(kernels)) if r.rc != 0]
    return "; the hand-installed files were put back%s" % (
        " (depmod failed: %s)" % "; ".join(errors) if errors else " and depmod re-run")


def srcversion_of(dkms, path):
    """The srcversion `modinfo -F srcversion` reads from the module file PATH, or None."""
    rc, out = dkms.run(["modinfo", "-F", "srcversion", path], "modinfo -F srcversion", check=False)
    value = out.strip() if rc == 0 else ""
    return value if re.match(r"[0-9A-F]{8,40}\Z", value) else None


def write_build_stamps(dkms, name, version, kernels, modinfo, source, identity):
    """rigbook's build stamp of each of KERNELS' builds (built by this call), in DKMS's tree beside the build
    (built_dir/.rigbook-build.json): the package, the source's sha256, the identity and each module's file and
    srcversion, which the ladder's driver_state layer holds the loaded module to. [paths written], [notes]."""
    written, notes = [], []
    for kernel in sorted(kernels):
        folder = built_dir(name, version, kernel)
        if not os.path.isdir(folder):
            notes.append("no build stamp for %s: no build of %s/%s in %s (dkms's tree is expected there)"
                         % (kernel, name, version, folder))
            continue
        stamp = dict(name=name, version=version, kernel=kernel, arch=os.uname()[4], source=source,
                     identity_id=identity, modules=dict(
                         (mod, dict(path=path, srcversion=srcversion_of(dkms, path)))
                         for mod, path in sorted((modinfo.get(kernel) or {}).items()) if path))
        path = os.path.join(folder, builds.BUILD_STAMP)
        error = builds.write_stamp(path, stamp)
        if error:
            notes.append("no build stamp for %s: %s" % (kernel, error))
        else:
            written.append(path)
    return written, notes


def export(module, name, version, kernels, identity, folder, source):
    """(path, sha256) of the builds of KERNELS as one binaries-only archive in FOLDER, in the layout of `dkms mktarball
    --binaries-only` (dkms_binaries_only/ with the source's dkms.conf, dkms_main_tree/<kernel>/<arch>/module/), less
    the build logs (they hold times), with a stamp naming every file: reproducible (facts/builds.pack)."""
    arch = os.uname()[4]
    conf = os.path.join(source, "dkms.conf")
    entries = [(META[0], "bytes", (name + "\n").encode()), (META[1], "bytes", (version + "\n").encode()),
               (META[2], "file", conf)]
    digests = {META[2]: files.sha256_of(conf)}
    for kernel in sorted(kernels):
        folder_of = os.path.join(built_dir(name, version, kernel), "module")
        found = sorted(f for f in (os.listdir(folder_of) if os.path.isdir(folder_of) else [])
                       if f.endswith(MODULE_SUFFIXES) and os.path.isfile(os.path.join(folder_of, f)))
        if not found:
            module.fail_json(msg="export_dir: no built module of %s/%s for %s in %s (dkms's tree is expected at %s)"
                             % (name, version, kernel, folder_of, DKMS_TREE))
        for f in found:
            rel = "dkms_main_tree/%s/%s/module/%s" % (kernel, arch, f)
            entries.append((rel, "file", os.path.join(folder_of, f)))
            digests[rel] = files.sha256_of(os.path.join(folder_of, f))
    for rel, data in ((META[0], name + "\n"), (META[1], version + "\n")):
        digests[rel] = hashlib.sha256(data.encode()).hexdigest()
    stamp = dict(name=name, version=version, identity_id=identity, kernels=sorted(kernels), arch=arch, files=digests)
    entries.append((builds.BUILD_STAMP, "bytes", (json.dumps(stamp, indent=2, sort_keys=True) + "\n").encode()))
    data = builds.pack(entries)
    digest = hashlib.sha256(data).hexdigest()
    try:
        path = os.path.join(folder, builds.archive_name(name, identity, digest))
    except ValueError:
        module.fail_json(msg="export_dir: the DKMS package name %r cannot name a build archive" % name)
    if not os.path.isdir(folder):
        os.makedirs(folder, 0o755)
    files.write_atomic(path, data, mode=0o644)
    return path, digest


def _read_bytes(path, limit=1 << 20):
    """The bytes of the file PATH (at most LIMIT and one), or None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit + 1)
    except OSError:
        return None


def archive_problem(work, name, version, kernels, install_files, source):
    """Why the binaries-only archive unpacked in WORK is not the build of NAME/VERSION for KERNELS to install here,
    or None. Its regular files must be exactly the controller's manifest INSTALL_FILES, each with that sha256; its
    stamp this build's, naming every other file with the sha256 it has; nothing but the package's name, version and
    dkms.conf and each kernel's modules (this architecture's); no link; its dkms.conf byte for byte the pinned
    SOURCE's (dkms runs a dkms.conf as a shell script, as root)."""
    arch = os.uname()[4]
    found, links = [], []
    for top, _dirs, names in os.walk(work):
        for n in names:
            path = os.path.join(top, n)
            (links if os.path.islink(path) else found).append(os.path.relpath(path, work))
    if links:
        return "it holds the link %s (a binaries-only build has none)" % sorted(links)[0]
    problem = builds.manifest_problem(work, found, install_files)
    if problem:
        return problem
    held = {}
    for rel in found:
        if rel in META or rel == builds.BUILD_STAMP:
            continue
        parts = rel.split("/")
        if len(parts) != 5 or parts[0] != "dkms_main_tree" or parts[2] != arch or parts[3] != "module" \
                or not parts[4].endswith(MODULE_SUFFIXES):
            return "%s is no part of a binaries-only build of this architecture (%s)" % (rel, arch)
        held.setdefault(parts[1], []).append(parts[4])
    meta = (files.read_text(os.path.join(work, META[0]), limit=4096),
            files.read_text(os.path.join(work, META[1]), limit=4096))
    if meta != (name, version) or sorted(held) != sorted(kernels):
        return "it is not the build of %s/%s for %s (it holds %s/%s for %s)" % (
            name, version, ", ".join(sorted(kernels)), meta[0], meta[1], ", ".join(sorted(held)) or "no kernel")
    pinned = _read_bytes(os.path.join(source, "dkms.conf"))
    if pinned is None or _read_bytes(os.path.join(work, META[2])) != pinned:
        return "its %s is not the pinned source's %s byte for byte (dkms would run it as root)" % (
            META[2], os.path.join(source, "dkms.conf"))
    stamp, error = builds.read_stamp(os.path.join(work, builds.BUILD_STAMP))
    if error or not isinstance(stamp, dict):
        return error or "it has no build stamp"
    stamped = stamp.get("files") if isinstance(stamp.get("files"), dict) else {}
    for rel in sorted(found):
        if rel != builds.BUILD_STAMP and stamped.get(rel) != install_files[rel]:
            return "%s is in it but not in its stamp, or not as its stamp names it" % rel
    if sorted(stamped) != sorted(r for r in found if r != builds.BUILD_STAMP):
        return "its stamp names files it does not hold"
    if (stamp.get("name"), stamp.get("version"), stamp.get("kernels")) != (name, version, sorted(kernels)):
        return "its stamp is of another build"
    return None


def install_archive(module, archive, name, version, kernels, identity, install_files, source):
    """The modules of ARCHIVE (a group build host's export) put where DKMS keeps its builds of KERNELS, with nothing
    else of it and no dkms command reading it: its name must be this build's (IDENTITY) and carry its sha256, every
    member checked by safe_untar, then archive_problem. Fails, with no module loaded, otherwise. Returns its sha256."""
    named = builds.parse_archive_name(archive)
    if not named or named["name"] != name:
        module.fail_json(msg="install_from %s: not a DKMS build archive (%s); no module was installed"
                         % (archive, builds.archive_glob(name, identity)))
    if named["identity_id"] != identity:
        module.fail_json(msg="refused %s: it is another build (identity %s; the kernels %s here need %s); no "
                         "module was installed" % (archive, named["identity_id"], ", ".join(kernels), identity))
    got = files.sha256_of(archive)
    if got != named["sha256"]:
        module.fail_json(msg="refused %s: its sha256 is %s, its name says %s; no module was installed"
                         % (archive, got, named["sha256"]), sha256=got)
    package = os.path.join(DKMS_TREE, name, version)
    if not os.path.isdir(package):
        module.fail_json(msg="%s/%s is not registered in %s (dkms's tree): no module was installed"
                         % (name, version, DKMS_TREE))
    tmp = tempfile.mkdtemp(prefix=".rigbook-load-", dir=DKMS_TREE)  # beside the builds it fills: one file system
    try:
        safe_untar.unpack_or_fail(lambda msg: module.fail_json(msg=msg), archive, tmp, "no module was installed")
        why = archive_problem(tmp, name, version, kernels, install_files, source)
        if why:
            module.fail_json(msg="refused %s: %s; no module was installed" % (archive, why))
        for kernel in sorted(kernels):
            built = os.path.join(tmp, "dkms_main_tree", kernel, os.uname()[4])
            for top, dirs, names in os.walk(built):
                for n in dirs + names:
                    os.chmod(os.path.join(top, n), 0o755 if n in dirs else 0o644)
            os.chmod(built, 0o755)
            target = built_dir(name, version, kernel)
            if os.path.lexists(target):
                shutil.rmtree(target)  # a build dkms left unfinished here
            if not os.path.isdir(os.path.dirname(target)):
                os.makedirs(os.path.dirname(target), 0o755)
            files.move_atomic(built, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return got


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            version=dict(type="str", required=True),
            src=dict(type="path", required=True),
            sha256=dict(type="str"),
            kernels=dict(type="list", elements="str", required=True),
            modules=dict(type="list", elements="str"),
            export_dir=dict(type="path"),
            install_from=dict(type="path"),
            install_files=dict(type="dict"),
        ),
        mutually_exclusive=[("export_dir", "install_from")],
        required_by={"install_from": ("install_files",)},
        supports_check_mode=True,
    )
    p = module.params
    for rel, digest in sorted((p["install_files"] or {}).items()):
        parts = str(rel).split("/")
        if str(rel).startswith("/") or ".." in parts or "" in parts or not isinstance(digest, str) \
                or not re.match(r"[0-9a-f]{64}\Z", digest):
            module.fail_json(msg="install_files: %r: a relative path inside the archive and its sha256; no module was "
                             "installed" % (rel,))
    name, version, src = p["name"], p["version"], p["src"]
    check = module.check_mode
    if not os.path.exists(src):
        if check:  # the fetch before this task did not copy it in check mode
            hand = hand_installed(p["kernels"], package=name)
            keys, said = hand_installed_result(name, version, hand, p["kernels"], check) if hand else ({}, None)
            module.exit_json(changed=True, built=list(p["kernels"]), removed=[], shadowing_removed=[], modinfo={},
                             status=[], identity_id="", archive_glob="",
                             msg="; ".join(filter(None, ["%s is not on the host yet (check mode)" % src, said])),
                             **keys)
        module.fail_json(msg="DKMS source %s does not exist" % src)
    sha = "directory"
    if os.path.isfile(src):
        sha = files.sha256_of(src)
        if not p["sha256"] or sha != p["sha256"].lower():
            module.fail_json(msg="refused %s: its sha256 is %s, pinned %s; nothing was installed"
                             % (src, sha, p["sha256"] or "(no sha256 given)"), sha256=sha)
    if not module.get_bin_path("dkms"):
        if check:
            tree = os.path.join(SRC_ROOT, "%s-%s" % (name, version))
            hand = hand_installed(p["kernels"], package_modules(module, name, p["modules"], src, tree if read_stamp(
                tree) == sha else None))
            keys, said = hand_installed_result(name, version, hand, p["kernels"], check) if hand else ({}, None)
            module.exit_json(changed=True, built=list(p["kernels"]), removed=[], shadowing_removed=[], modinfo={},
                             status=[], identity_id="", archive_glob="",
                             msg="; ".join(filter(None, ["dkms is not installed yet (check mode)", said])), **keys)
        module.fail_json(msg="dkms is not installed")
    dkms = Dkms(module)
    dest = os.path.join(SRC_ROOT, "%s-%s" % (name, version))
    have = read_stamp(dest)
    result = dict(changed=False, built=[], removed=[], shadowing_removed=[], modinfo={}, unpacked=False,
                  stamped=False, identity_id="", archive_glob="")
    notes = []
    initial = before = dkms.status(name)
    if have is None and sha != "directory" and os.path.isdir(dest):
        # no stamp: a tree put there by hand (a box set up by hand, then adopted). When it holds exactly the pinned
        # tarball's files, its DKMS builds are kept and only the stamp is written (no rebuild, no module change).
        # Only read: unpacked in the temporary folder (check mode changes nothing under /usr/src).
        tmp = tempfile.mkdtemp(prefix=".rigbook-")
        try:
            if same_tree(extract(module, src, tmp), dest):
                result["stamped"] = True
                have = sha
                notes.append("%s holds the pinned source (put there by hand): stamped, its builds kept" % dest)
                if not check:
                    write_stamp(dest, sha)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if have != sha:
        result["unpacked"] = True
        if not check:
            tmp = tempfile.mkdtemp(prefix=".rigbook-", dir=SRC_ROOT)
            try:
                top = extract(module, src, tmp)  # checked before the old build is touched
                if any(r["version"] == version for r in before):  # same version, other source: drop the old build
                    dkms.run(["dkms", "remove", "%s/%s" % (name, version), "--all"], "dkms remove")
                    before = dkms.status(name)
                install_tree(top, dest, sha)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    for other in sorted(set(r["version"] for r in before if r["version"] != version)):
        result["removed"].append("%s/%s" % (name, other))
        if not check:
            dkms.run(["dkms", "remove", "%s/%s" % (name, other), "--all"], "dkms remove")
    # `dkms status` is a slow script (about 0.3 s): asked again only when something above changed the tree
    now = dkms.status(name) if not check and result["removed"] else before
    if not check and not any(r["version"] == version for r in now):
        dkms.run(["dkms", "add", "%s/%s" % (name, version)], "dkms add")
        now = None  # the tree changed
    # A fork installed by hand (its own `make modules_install`, seed 000's way) for the kernels to build for: said, with
    # the reason, in check mode too; moved aside (kept under BACKUP_ROOT) before DKMS builds, so that dkms install finds
    # no module of the same version in the kernel's tree and the DKMS build is the one modprobe loads.
    hand = hand_installed(p["kernels"], package_modules(module, name, p["modules"], src,
                                                        None if check and result["unpacked"] else dest))
    if hand:
        keys, said = hand_installed_result(name, version, hand, p["kernels"], check)
        result.update(keys)
        notes.append(said)
        if not check:
            moved, real_fail = [], module.fail_json

            def fail_put_back(msg, **kwargs):
                """Every failure from here on puts the hand-installed files back first: the box keeps the driver it
                ran with until a converge succeeds."""
                module.fail_json = real_fail
                real_fail(msg=msg + put_back(moved), **kwargs)

            module.fail_json = fail_put_back
            move_aside(module, dkms, hand, result["moved_aside_to"], moved)
    installed = set(r["kernel"] for r in (now or []) if r["version"] == version and r["state"] == "installed"
                    and not result["unpacked"])
    for kernel in p["kernels"]:
        if kernel in installed:
            continue
        if not os.path.isdir(os.path.join(MODULES_ROOT, kernel, "build")):
            if not check:
                module.fail_json(msg="cannot build %s/%s for %s: its headers are not installed (%s)"
                                 % (name, version, kernel, os.path.join(MODULES_ROOT, kernel, "build")))
            # in check mode the task that installs the headers did not run
            notes.append("the headers of %s are not installed yet (check mode)" % kernel)
        result["built"].append(kernel)
    if result["built"]:
        source = sha if sha != "directory" else tree_digest(src)
        result["identity_id"] = identity_of(name, version, source, result["built"])
        result["archive_glob"] = builds.archive_glob(name, result["identity_id"])
    if result["built"] and not check and p["install_from"]:
        # a group's build host built these very kernels' modules: load its binaries, compile nothing
        install_archive(module, p["install_from"], name, version, result["built"], result["identity_id"],
                        p["install_files"], dest)
        loaded = set(r["kernel"] for r in dkms.status(name) if r["version"] == version
                     and r["state"] in ("built", "installed"))
        if not set(result["built"]) <= loaded:  # `dkms install` would compile what it does not see built
            module.fail_json(msg="dkms does not see the build of %s loaded from %s for %s (its tree is expected at "
                             "%s): nothing installed, nothing compiled" % (
                                 name, p["install_from"], ", ".join(k for k in result["built"] if k not in loaded),
                                 DKMS_TREE))
        for kernel in result["built"]:
            dkms.run(["dkms", "install", "%s/%s" % (name, version), "-k", kernel],
                     "dkms install %s/%s -k %s" % (name, version, kernel))
        result["installed_from"] = p["install_from"]
    elif result["built"] and not check:
        for kernel in result["built"]:
            dkms.run(["dkms", "install", "%s/%s" % (name, version), "-k", kernel, "--force"],
                     "dkms install %s/%s -k %s" % (name, version, kernel))
        if p["export_dir"]:
            result["export_path"], result["export_sha256"] = export(
                module, name, version, result["built"], result["identity_id"], p["export_dir"], dest)
    for kernel in p["kernels"]:
        result["modinfo"][kernel] = {}
        for mod in p["modules"] or [name]:
            path = dkms.modinfo(kernel, mod)
            stock = path is not None and path.startswith("/") and "/updates/dkms/" not in path
            if stock and check and kernel not in result["built"]:
                result["shadowing_removed"].append(path)  # what a real run would delete
            elif stock and not check:
                # a stock copy wins over the DKMS build: delete it (the fork must win) and re-index
                result["shadowing_removed"].append(path)
                try:
                    os.remove(path)
                except OSError as exc:
                    module.fail_json(msg="cannot remove %s, which shadows the DKMS build of %s/%s for %s: %s"
                                     % (path, name, version, kernel, exc), **result)
                dkms.run(["depmod", "-a", kernel], "depmod -a %s" % kernel)
                path = dkms.modinfo(kernel, mod)
            result["modinfo"][kernel][mod] = path
            if not check and (path is None or "/updates/dkms/" not in path):
                module.fail_json(msg="after installing %s/%s for %s, modinfo -n %s resolves to %s, not the DKMS build"
                                 % (name, version, kernel, mod, path), **result)
    if result["built"] and not check:
        result["build_stamps"], stamp_notes = write_build_stamps(
            dkms, name, version, result["built"], result["modinfo"], sha if sha != "directory" else tree_digest(src),
            result["identity_id"])
        notes.extend(stamp_notes)
    touched = now is None or result["built"] or result["removed"] or result["shadowing_removed"] or hand
    result["status"] = dkms.status(name) if touched and not check else now
    result["changed"] = bool(result["built"] or result["removed"] or result["shadowing_removed"] or result["unpacked"]
                             or result["stamped"] or hand)
    if notes:
        result["msg"] = "; ".join(notes)
    if module._diff and (result["built"] or result["removed"] or result["shadowing_removed"] or result["unpacked"]
                         or hand):
        result["diff"] = dict(
            before="".join("%s/%s %s: %s\n" % (r["name"], r["version"], r["kernel"], r["state"]) for r in initial)
            + "".join("%s (installed by hand)\n" % f for k in sorted(hand) for f in hand[k]),
            after="".join("%s/%s %s: installed\n" % (name, version, k) for k in p["kernels"])
            + "".join("%s (moved aside)\n" % os.path.join(result["moved_aside_to"][k], os.path.relpath(
                f, os.path.join(MODULES_ROOT, k))) for k in sorted(hand) for f in hand[k]),
            before_header="dkms status", after_header="dkms status")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
