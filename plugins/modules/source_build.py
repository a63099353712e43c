#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: source_build
short_description: Build pinned CMake or Make sources with a checked patch set into a prefix named by version and patch set
description:
  - Checks the whole state in one run, before anything is built or installed. Every component's source (a tarball
    whose sha256 must equal its pin, or a directory checked out at a pinned commit, named by O(components[].source_id))
    and every patch (its sha256) are verified first; a mismatch is refused and nothing is touched.
  - The install prefix is C(<prefix_root>/<version>-<patch set hash>) (C(<version>-stock) without patches), so builds
    of two versions or two patch sets coexist. A build stamp (C(.rigbook-build.json) in the prefix) records what was
    built (sources, patches, CMake arguments) and the sha256 of every file it installed (O(check_files) among them);
    when it matches and those files are unchanged nothing is rebuilt and nothing is reported changed. The O(link) symlink in O(prefix_root) is switched
    to the prefix only after a successful build (switching back to an older build is a link change, no rebuild).
  - When a build is needed, each component is unpacked (or copied) into a fresh tree under O(build_root) and each of
    its patches is tried with C(patch --dry-run) first (in check mode too); a patch that no longer applies (a
    version bump) fails naming the patch and the files it could not patch, before anything is built. Then C(cmake)
    configures, builds and installs each component in order into the prefix (C({prefix}) in O(components[].cmake_args)
    names it, so a later component builds against an earlier one); a component with O(components[].build=make) is
    built with C(make) in its tree and the files O(components[].install) names are copied into C(<prefix>/bin) (as
    nccl-tests, which has no install target). O(components[].links) are made in the prefix before the component
    builds (e.g. an C(NCCL_HOME) layout over a pip wheel's NCCL) and checked on every run. Build output goes to
    O(log) as it happens (C(tail -f) it; run the task with C(async) for long builds).
  - Supports check mode and diff mode. In check mode a source not on the host yet is reported as a change to come.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  name:
    description: What is built (messages, stamp, default log name).
    type: str
    required: true
  version:
    description: The version of what is built (the first part of the prefix name).
    type: str
    required: true
  prefix_root:
    description: Directory holding the prefixes and the O(link) symlink.
    type: path
    required: true
  link:
    description: Name of the symlink in O(prefix_root) pointing at the prefix of this build; empty for none.
    type: str
    default: current
  components:
    description: What to build, in order, into the one prefix.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Component name.
        type: str
        required: true
      src:
        description: Source tarball (one top directory) or source directory on the host.
        type: path
        required: true
      sha256:
        description: SHA-256 of O(components[].src) when it is a tarball (required then).
        type: str
      source_id:
        description: What identifies a directory O(components[].src) (its pinned commit).
        type: str
      subdir:
        description: The directory inside the source tree holding the top CMakeLists.txt (e.g. C(projects/rccl)).
        type: str
        default: ""
      patches:
        description: Patches applied in order inside O(components[].subdir), each a file with its pinned sha256.
        type: list
        elements: dict
        default: []
        suboptions:
          path:
            description: The patch file on the host; with O(components[].patch_dir), only its file name counts.
            type: path
          name:
            description: The patch's file name in O(components[].patch_dir) (instead of O(components[].patches[].path)).
            type: str
          sha256:
            description: Its SHA-256.
            type: str
            required: true
          strip:
            description: C(patch -p) level.
            type: int
            default: 1
      patch_dir:
        description: The directory on the host holding the patches (each named by its O(components[].patches[].path)
          or O(components[].patches[].name) file name).
        type: path
      cmake_args:
        description: Extra C(cmake) configure arguments; C({prefix}) is replaced by the install prefix.
        type: list
        elements: str
        default: []
      build:
        description: How the component builds (C(cmake) configure/build/install, or C(make) in its tree).
        type: str
        choices: [cmake, make]
        default: cmake
      make_args:
        description: C(make) arguments (variables such as C(CUDA_HOME=...)); C({prefix}) is replaced by the prefix.
        type: list
        elements: str
        default: []
      make_env:
        description: Environment for C(make) (e.g. C(LD_RUN_PATH)); C({prefix}) in a value is replaced by the prefix.
        type: dict
        default: {}
      install:
        description: Files (globs relative to the source tree) a C(make) build leaves, copied into C(<prefix>/bin);
          each must match.
        type: list
        elements: str
        default: []
      links:
        description: Symlinks made in the prefix before the component builds (relative path in the prefix -> absolute target).
        type: dict
        default: {}
  export_dir:
    description: After a build, write the prefix (its files and relative links, the stamp included; not the
      O(components[].links), which the installing host makes itself) as C(<name>-<identity_id>-<sha256>.tar.gz) into
      this folder, byte for byte reproducibly (sorted names, no times, owner root, modes 0755 or 0644), so the other
      boxes of a group install it instead of building (RV(export_path), RV(export_sha256)). Builds run in a folder
      named by the build (C(<build_root>/.rigbook-<name>-<identity_id>)), so paths a compiler records are the same on
      every box.
    type: path
  install_from:
    description: When a build is due, install this archive (an O(export_dir) archive of a group's build host)
      instead of building - its name must be this build's (O(name), RV(identity_id)) and carry its sha256; its
      regular files must be exactly those of O(install_files), each with that sha256; its stamp must be this build's
      identity (sources, patches, arguments, prefix) and name every one of its files with the sha256 the file has.
      Anything else refuses the archive with nothing installed. Then the links are made and the O(link) switched.
      Nothing is compiled and no build log is written.
    type: path
  install_files:
    description: With O(install_from) (required then), the controller's manifest of the archive - every regular file
      in it (a relative path) with its sha256, as the controller computed them from the archive it holds
      (rigbook.homelab.group_archive).
    type: dict
  check_files:
    description: Files under the prefix that must exist after the install. Their sha256, and that of every other file
      the build installed, is stamped and checked on every run (a file changed since the build means it is rebuilt).
    type: list
    elements: str
    default: []
  build_root:
    description: Where build trees are made (removed after a successful build).
    type: path
    default: /var/cache/rigbook/build
  jobs:
    description: Parallel build jobs (default the CPU count).
    type: int
  log:
    description: Build log, appended as the build runs (default C(<prefix_root>/.<name>-build.log)).
    type: path
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: Build RCCL with the P2P-level patch, and rccl-tests against it
  rigbook.homelab.source_build:
    name: rccl
    version: 2.27.7
    prefix_root: /opt/rigbook/rccl
    components:
      - name: rccl
        src: /var/cache/rigbook/artifacts/rccl-2.27.7.tar.gz
        sha256: "{{ rigbook_pins.rccl.source.sha256 }}"
        patches:
          - {path: /var/lib/rigbook/rccl/patches/p2p-level-user-last.patch, sha256: "{{ patch_sha256 }}"}
        cmake_args: [-DAMDGPU_TARGETS=gfx1201, -DGPU_TARGETS=gfx1201]
      - name: rccl-tests
        src: /var/cache/rigbook/artifacts/rccl-tests.tar.gz
        sha256: "{{ rigbook_pins.rccl.tests.source.sha256 }}"
        cmake_args: ["-DNCCL_HOME={prefix}"]
    check_files: [lib/librccl.so, bin/sendrecv_perf, bin/all_reduce_perf]

- name: Build nccl-tests (make) against a pip wheel's NCCL, laid out as an NCCL_HOME in the prefix
  rigbook.homelab.source_build:
    name: nccl-tests
    version: 2.19.6
    prefix_root: /opt/rigbook/nccl-tests
    components:
      - name: nccl-tests
        src: /var/cache/rigbook/src/nccl-tests-a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
        source_id: https://github.com/NVIDIA/nccl-tests.git@a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
        build: make
        links:
          nccl/include: /opt/rigbook/cuda/lib/python3.12/site-packages/nvidia/nccl/include
          nccl/lib/libnccl.so: /opt/rigbook/cuda/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
          nccl/lib/libnccl.so.2: /opt/rigbook/cuda/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
        make_args: [MPI=0, "NCCL_HOME={prefix}/nccl", CUDA_HOME=/opt/rigbook/cuda/lib/python3.12/site-packages/nvidia/cu13]
        make_env: {LD_RUN_PATH: "{prefix}/nccl/lib"}
        install: [build/*_perf]
    check_files: [bin/sendrecv_perf, bin/all_reduce_perf]
"""

RETURN = r"""
identity_id:
  description: The first 16 hex digits of the sha256 of what is built (sources, patches, arguments, prefix); boxes
    with equal ones can share one build.
  type: str
  returned: always
archive_glob:
  description: The file name pattern of this build's group archives (C(<name>-<identity_id>-*.tar.gz), whatever
    their sha256), also in check mode - what roles/group_build looks for on the controller.
  type: str
  returned: always
export_path:
  description: The archive written into O(export_dir) after a build.
  type: str
  returned: when a build wrote one
export_sha256:
  description: Its sha256 (also in its name).
  type: str
  returned: when a build wrote one
installed_from:
  description: The archive installed instead of a build (O(install_from)).
  type: str
  returned: when one was installed
lock_waited_s:
  description: Seconds this run waited for another build of the same path to finish (one a run cut short left
    running on the host); 0 when none held the lock, and in check mode.
  returned: always
  type: float
prefix:
  description: The install prefix of this build.
  returned: always
  type: str
  sample: /opt/rigbook/rccl/2.27.7-1a2b3c4d5e6f
patch_set:
  description: The patch set hash in the prefix name (C(stock) without patches).
  returned: always
  type: str
built:
  description: Whether the components were (or in check mode would be) built and installed by this call.
  returned: always
  type: bool
reasons:
  description: Why a build is needed (empty when the stamp matches).
  returned: always
  type: list
  elements: str
link_changed:
  description: Whether the O(link) symlink was (or would be) switched to the prefix.
  returned: always
  type: bool
patches_checked:
  description: The patches tried with C(patch --dry-run) by this call (empty when no build was needed).
  returned: always
  type: list
  elements: str
progress:
  description: The build's steps with their seconds.
  returned: always
  type: list
  elements: str
stamp:
  description: The build stamp after the call.
  returned: always
  type: dict
"""

import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import build_lock, patch_set, safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, runner


class Build(object):
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.progress = []
        self.log = self.p["log"] or os.path.join(self.p["prefix_root"], ".%s-build.log" % self.p["name"])

    def fail(self, msg, **extra):
        self.module.fail_json(msg=msg, progress=self.progress, **extra)

    # --- what is wanted ---------------------------------------------------------------------------------------

    def verify_inputs(self):
        """sha256 of every source tarball and patch against its pin (nothing is touched before this passes).

        Returns the list of sources not on the host yet (allowed in check mode only)."""
        missing = []
        for comp in self.p["components"]:
            src = comp["src"]
            if not os.path.exists(src):
                if self.module.check_mode:
                    missing.append(src)
                    continue
                self.fail("%s: source %s does not exist" % (comp["name"], src))
            if os.path.isfile(src):
                pin = (comp.get("sha256") or "").lower()
                got = files.sha256_of(src)
                if got != pin:
                    self.fail("refused %s (%s): its sha256 is %s, pinned %s; nothing was built or installed"
                              % (src, comp["name"], got, pin or "(no sha256 given)"), sha256=got)
            elif not comp.get("source_id"):
                self.fail("%s: source directory %s needs a source_id (the pinned commit it is checked out at)"
                          % (comp["name"], src))
            absent, error, got = patch_set.verify(comp["patches"], self.module.check_mode, comp["name"])
            missing += absent
            if error:
                self.fail(error.replace("nothing was changed", "nothing was built or installed"),
                          **(dict(sha256=got) if got else {}))
        return missing

    def patch_set(self):
        return patch_set.set_id(["%s:%s" % (c["name"], p["sha256"].lower())
                                 for c in self.p["components"] for p in c["patches"]])

    def identity(self, prefix):
        comps = []
        for comp in self.p["components"]:
            comps.append(dict(
                name=comp["name"],
                source=(comp.get("sha256") or "").lower() if comp.get("sha256") else "dir:%s" % comp.get("source_id"),
                subdir=comp.get("subdir") or "",
                patches=["%s -p%d %s" % (os.path.basename(p["path"]), p["strip"], p["sha256"].lower())
                         for p in comp["patches"]],
                cmake_args=[a.replace("{prefix}", prefix) for a in comp["cmake_args"]]))
            if comp["build"] == "make":  # only then: a CMake build's stamp stays what it was before make existed
                comps[-1].update(build="make", make_args=[a.replace("{prefix}", prefix) for a in comp["make_args"]],
                                 make_env=dict((k, v.replace("{prefix}", prefix)) for k, v in comp["make_env"].items()),
                                 install=list(comp["install"]))
            if comp["links"]:
                comps[-1]["links"] = dict(comp["links"])
        return dict(name=self.p["name"], version=self.p["version"], prefix=prefix, components=comps)

    # --- what is there ----------------------------------------------------------------------------------------

    @staticmethod
    def read_stamp(prefix):
        """(the build stamp in PREFIX, error): (None, None) without one (facts/builds.py)."""
        return builds.read_stamp(os.path.join(prefix, builds.BUILD_STAMP))

    def reasons(self, prefix, wanted, stamp, stamp_error=None):
        if stamp is None:
            return [stamp_error or "no build stamp in %s" % prefix]
        changed = _differs(stamp, wanted)
        if changed is not None:
            return ["the build stamp differs in %s" % ", ".join(changed)]
        out = []
        for rel, digest in sorted((stamp.get("files") or {}).items()):
            path = os.path.join(prefix, rel)
            if not os.path.isfile(path):
                out.append("%s is missing" % path)
            elif files.sha256_of(path) != digest:
                out.append("%s changed since it was built" % path)
        for rel in self.p["check_files"]:
            if rel not in (stamp.get("files") or {}):
                out.append("%s is not in the build stamp" % rel)
        for comp in self.p["components"]:
            for rel, target in sorted(comp["links"].items()):
                path = os.path.join(prefix, rel)
                if not os.path.islink(path) or os.readlink(path) != target:
                    out.append("%s is no link to %s" % (path, target))
        return out

    # --- doing it ---------------------------------------------------------------------------------------------

    def step(self, what, argv, cwd=None, env=None):
        """Run ARGV (with ENV added) with its output appended to the log as it runs; fail naming WHAT with the log's
        tail."""
        started = time.time()
        self.note("%s: %s%s" % (what, "".join("%s=%s " % kv for kv in sorted((env or {}).items())), " ".join(argv)))
        result = runner.run(["sh", "-c", 'exec "$@" >>"$0" 2>&1', self.log] + argv, cwd=cwd,
                            env=dict(env or {}, LC_ALL="C"))
        self.progress.append("%s (%.1f s)" % (what, time.time() - started))
        if result.rc is None:
            self.fail("%s could not run: %s" % (what, result.error))
        if result.rc != 0:
            self.fail("%s failed (rc %d); the end of %s:\n%s" % (what, result.rc, self.log,
                                                                 self.log_tail() or result.stderr or result.stdout))

    def note(self, line):
        try:
            with open(self.log, "a") as handle:
                handle.write("[rigbook %s] %s\n" % (time.strftime("%H:%M:%S"), line))
        except OSError:
            pass

    def log_tail(self, chars=3000):
        try:
            with open(self.log) as handle:
                return handle.read()[-chars:]
        except OSError:
            return ""

    def untar(self, archive, dest, nothing_done):
        """ARCHIVE unpacked into the empty folder DEST (module_utils/safe_untar.py), or the run failed naming it."""
        safe_untar.unpack_or_fail(self.fail, archive, dest, nothing_done)

    def unpack(self, comp, dest):
        """The component's source tree (its subdir) as a fresh copy under DEST."""
        src = comp["src"]
        tree = os.path.join(dest, comp["name"])
        if os.path.isdir(src):
            shutil.copytree(src, tree, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        else:
            os.makedirs(tree)
            self.untar(src, tree, "nothing was built")
            entries = os.listdir(tree)
            if len(entries) == 1 and os.path.isdir(os.path.join(tree, entries[0])):
                tree = os.path.join(tree, entries[0])
        top = os.path.join(tree, comp["subdir"]) if comp.get("subdir") else tree
        wanted = "Makefile" if comp["build"] == "make" else "CMakeLists.txt"
        if not os.path.isfile(os.path.join(top, wanted)):
            self.fail("%s: no %s in %s of %s" % (comp["name"], wanted, comp.get("subdir") or "the top", src))
        return top

    def make_links(self, comp, prefix):
        for rel, target in sorted(comp["links"].items()):
            path = os.path.join(prefix, rel)
            if not os.path.isdir(os.path.dirname(path)):
                os.makedirs(os.path.dirname(path), 0o755)
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(target, path)

    def build_component(self, comp, top, work, prefix, jobs):
        """Configure, build and install COMP (its tree at TOP) into PREFIX."""
        self.make_links(comp, prefix)
        if comp["build"] == "make":
            env = dict((k, v.replace("{prefix}", prefix)) for k, v in comp["make_env"].items())
            self.step("build %s" % comp["name"], ["make", "-C", top, "-j", jobs]
                      + [a.replace("{prefix}", prefix) for a in comp["make_args"]], env=env)
            bindir = os.path.join(prefix, "bin")
            if not os.path.isdir(bindir):
                os.makedirs(bindir, 0o755)
            for pattern in comp["install"]:
                found = sorted(glob.glob(os.path.join(top, pattern)))
                if not found:
                    self.fail("%s: the build left nothing matching %s in %s" % (comp["name"], pattern, top))
                for path in found:
                    shutil.copy2(path, os.path.join(bindir, os.path.basename(path)))
            self.progress.append("install %s: %d files into %s" % (comp["name"], len(os.listdir(bindir)), bindir))
            return
        build = os.path.join(work, "build-" + comp["name"])
        args = [a.replace("{prefix}", prefix) for a in comp["cmake_args"]]
        self.step("configure %s" % comp["name"], ["cmake", "-S", top, "-B", build, "-DCMAKE_INSTALL_PREFIX=" + prefix,
                                                  "-DCMAKE_BUILD_TYPE=Release"] + args)
        self.step("build %s" % comp["name"], ["cmake", "--build", build, "--parallel", jobs])
        self.step("install %s" % comp["name"], ["cmake", "--install", build])

    def apply_patches(self, comp, top, dry_run):
        names, _, failure = patch_set.apply(comp["patches"], top, dry_run)
        for name in names:
            self.progress.append("%s %s: %s" % ("checked" if dry_run else "applied", comp["name"], name))
        if failure:
            self.fail("%s. Nothing was built." % patch_set.failure_message(
                failure, "%s %s (%s)" % (comp["name"], self.p["version"], comp["src"])),
                patch=failure["path"], failing_files=failure["files"], patch_output=failure["text"][-2000:])
        return names

    # --- one build for a group ------------------------------------------------------------------------------

    def export(self, prefix, identity_id, folder):
        """(path, sha256) of the prefix as a reproducible .tar.gz in FOLDER (facts/builds.archive_name), written
        through the one atomic write."""
        data = self.tarball(prefix)
        digest = hashlib.sha256(data).hexdigest()
        try:
            name = builds.archive_name(self.p["name"], identity_id, digest)
        except ValueError:
            self.fail("export_dir: %r cannot name a build archive (letters, digits and ._+, parts joined by -)"
                      % self.p["name"])
        if not os.path.isdir(folder):
            os.makedirs(folder, 0o755)
        path = files.write_atomic(os.path.join(folder, name), data, mode=0o644)
        return path, digest

    def tarball(self, prefix):
        """The prefix as reproducible .tar.gz bytes (facts/builds.pack: files, folders and relative links; the
        components' links are left out: each host makes its own)."""
        made = set(rel for comp in self.p["components"] for rel in comp["links"])
        entries = []
        for top, dirs, names in os.walk(prefix):
            for name in dirs + names:
                path = os.path.join(top, name)
                rel = os.path.relpath(path, prefix)
                if rel in made:
                    continue
                if os.path.islink(path):
                    if not os.readlink(path).startswith("/"):
                        entries.append((rel, "symlink", os.readlink(path)))
                elif os.path.isdir(path):
                    entries.append((rel, "folder", None))
                elif os.path.isfile(path):
                    entries.append((rel, "file", path))
        return builds.pack(entries)

    def install_checked(self, archive, work, wanted, install_files):
        """Why ARCHIVE, unpacked in WORK, is not to be installed, or None. Its regular files must be exactly the
        controller's manifest INSTALL_FILES ({path: sha256}), each with that sha256; its stamp must be WANTED, and
        name every file of it (a stamped check file may be a link to one) with the sha256 the file has."""
        found = _regular_files(work)
        problem = builds.manifest_problem(work, found, install_files)
        if problem:
            return problem
        stamp, error = self.read_stamp(work)
        if error or stamp is None:
            return error or "it has no build stamp"
        changed = _differs(stamp, wanted)
        if changed is not None:
            return "it is another build (its stamp differs in %s)" % (", ".join(changed) or "everything")
        stamped = stamp.get("files")
        if not isinstance(stamped, dict):
            return "its stamp lists no files"
        unstamped = sorted(rel for rel in found if rel != builds.BUILD_STAMP and rel not in stamped)
        if unstamped:
            return "%s is in it but not in its stamp" % unstamped[0]
        made = [rel for comp in self.p["components"] for rel in comp["links"]]  # this host's own, made after
        for rel, digest in sorted(stamped.items()):
            if any(str(rel) == link or str(rel).startswith(link + "/") for link in made):
                continue
            path = os.path.join(work, str(rel))
            if not _inside(str(rel)) or not os.path.isfile(path) or not safe_untar.resolves_inside(path, work) \
                    or files.sha256_of(path) != digest:
                return "%s is not the file its stamp names" % rel
        return None

    def install(self, prefix, wanted, archive, identity_id, install_files):
        """ARCHIVE (another host's export of this very build) into PREFIX instead of a build: its sha256 is the one
        its name carries (facts/builds.parse_archive_name), its files exactly the controller's manifest INSTALL_FILES
        and its stamp WANTED, naming each of them (install_checked); then this host's links."""
        named = builds.parse_archive_name(archive)
        if not named or named["name"] != self.p["name"] or named["identity_id"] != identity_id:
            self.fail("install_from %s: not an archive of this build (%s); nothing was installed"
                      % (archive, builds.archive_glob(self.p["name"], identity_id)))
        got = files.sha256_of(archive)
        if got != named["sha256"]:
            self.fail("refused %s: its sha256 is %s, its name says %s; nothing was installed"
                      % (archive, got, named["sha256"]), sha256=got)
        parent = os.path.dirname(prefix)
        work = tempfile.mkdtemp(prefix=".rigbook-install-", dir=parent)
        try:
            self.untar(archive, work, "nothing was installed")
            why = self.install_checked(archive, work, wanted, install_files)
            if why:
                self.fail("refused %s: %s; nothing was installed" % (archive, why))
            stamp = self.read_stamp(work)[0]
            for comp in self.p["components"]:
                self.make_links(comp, work)
            os.chmod(work, 0o755)
            if os.path.isdir(prefix):
                shutil.rmtree(prefix)
            files.move_atomic(work, prefix)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self.progress.append("installed %s from %s (sha256 %s): nothing built" % (self.p["name"], archive, got[:12]))
        return stamp


failing_files = patch_set.failing_files


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            version=dict(type="str", required=True),
            prefix_root=dict(type="path", required=True),
            link=dict(type="str", default="current"),
            components=dict(type="list", elements="dict", required=True, options=dict(
                name=dict(type="str", required=True),
                src=dict(type="path", required=True),
                sha256=dict(type="str"),
                source_id=dict(type="str"),
                subdir=dict(type="str", default=""),
                patch_dir=dict(type="path"),
                patches=dict(type="list", elements="dict", default=[], options=dict(
                    path=dict(type="path"),
                    name=dict(type="str"),
                    sha256=dict(type="str", required=True),
                    strip=dict(type="int", default=1),
                )),
                cmake_args=dict(type="list", elements="str", default=[]),
                build=dict(type="str", choices=["cmake", "make"], default="cmake"),
                make_args=dict(type="list", elements="str", default=[]),
                make_env=dict(type="dict", default={}),
                install=dict(type="list", elements="str", default=[]),
                links=dict(type="dict", default={}),
            )),
            check_files=dict(type="list", elements="str", default=[]),
            export_dir=dict(type="path"),
            install_from=dict(type="path"),
            install_files=dict(type="dict"),
            build_root=dict(type="path", default="/var/cache/rigbook/build"),
            jobs=dict(type="int"),
            log=dict(type="path"),
        ),
        required_by={"install_from": ("install_files",)},
        mutually_exclusive=[("export_dir", "install_from")],
        supports_check_mode=True,
    )
    p = module.params
    check = module.check_mode
    error = _manifest_error(p["install_files"])
    if error:
        module.fail_json(msg="install_files: %s; nothing was installed" % error)
    for comp in p["components"]:
        error = patch_set.resolve_paths(comp["patches"], comp.get("patch_dir"), comp["name"]) or _layout_error(comp)
        if error:
            module.fail_json(msg=error)
    b = Build(module)
    if not p["components"]:
        module.fail_json(msg="components: nothing to build")
    if not re.match(r"^[A-Za-z0-9._+-]+$", p["version"]):
        module.fail_json(msg="version %r: only letters, digits and ._+- (it names the prefix)" % p["version"])
    missing = b.verify_inputs()
    patches_id = b.patch_set()
    prefix = os.path.join(p["prefix_root"], "%s-%s" % (p["version"], patches_id))
    wanted = b.identity(prefix)
    identity_id = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    if not check:  # a build a cut-short run left running finishes first; then its stamp is read
        result_waited = build_lock.hold(prefix, b.note)
    stamp, stamp_error = b.read_stamp(prefix)
    old_stamp = stamp
    reasons = b.reasons(prefix, wanted, stamp, stamp_error)
    link_path = os.path.join(p["prefix_root"], p["link"]) if p["link"] else None
    link_target = os.path.basename(prefix)
    link_now = os.readlink(link_path) if link_path and os.path.islink(link_path) else None
    if link_path and os.path.exists(link_path) and not os.path.islink(link_path):
        module.fail_json(msg="%s exists and is not a symlink: move it away (it would be replaced by a link to %s)"
                         % (link_path, prefix))
    link_changed = bool(link_path) and link_now != link_target
    result = dict(changed=False, prefix=prefix, patch_set=patches_id, built=bool(reasons), reasons=reasons,
                  lock_waited_s=0.0 if check else result_waited,
                  link_changed=link_changed, patches_checked=[], progress=b.progress, stamp=stamp or {},
                  identity_id=identity_id, archive_glob=builds.archive_glob(p["name"], identity_id))
    if missing:  # check mode only: the tasks before this one did not fetch them
        result.update(changed=True, built=True, link_changed=bool(link_path),
                      msg="not on the host yet (check mode): %s" % ", ".join(missing))
        module.exit_json(**result)
    if reasons and p["install_from"]:
        result.update(built=False, installed_from=p["install_from"])
        if not check:
            if not os.path.isdir(p["prefix_root"]):
                os.makedirs(p["prefix_root"], 0o755)
            result["stamp"] = b.install(prefix, wanted, p["install_from"], identity_id, p["install_files"])
    elif reasons:
        if not check:
            for path in (p["build_root"], p["prefix_root"]):
                if not os.path.isdir(path):
                    os.makedirs(path, 0o755)
            with open(b.log, "a") as handle:
                handle.write("\n")
            b.note("build %s %s into %s: %s" % (p["name"], p["version"], prefix, "; ".join(reasons)))
        if check:  # no lock held: a folder of its own
            work = tempfile.mkdtemp(prefix=".rigbook-%s-" % p["name"],
                                    dir=p["build_root"] if os.path.isdir(p["build_root"]) else None)
        else:  # one path per build (its lock held): what a compiler writes of its paths is the same on every box
            work = os.path.join(p["build_root"], ".rigbook-%s-%s" % (p["name"], identity_id))
            if os.path.lexists(work):
                shutil.rmtree(work)  # a cut-short build's
            os.makedirs(work, 0o755)
        try:
            tops = []
            # every patch of every component is tried before anything is built
            for comp in p["components"]:
                top = b.unpack(comp, work)
                result["patches_checked"] += b.apply_patches(comp, top, dry_run=True)
                tops.append(top)
            if not check:
                if os.path.isdir(prefix):  # a stale or partial build of the same name: start clean
                    shutil.rmtree(prefix)
                os.makedirs(prefix, 0o755)
                jobs = str(p["jobs"] or os.cpu_count() or 1)
                for comp, top in zip(p["components"], tops):
                    b.apply_patches(comp, top, dry_run=False)
                    b.build_component(comp, top, work, prefix, jobs)
                # every file the build installed, and each check file (a link, maybe), with its sha256
                digests = dict((rel, files.sha256_of(os.path.join(prefix, rel))) for rel in _regular_files(prefix))
                for rel in p["check_files"]:
                    path = os.path.join(prefix, rel)
                    if not os.path.isfile(path):
                        module.fail_json(msg="after installing %s %s, %s is missing" % (p["name"], p["version"], path),
                                         progress=b.progress)
                    digests[rel] = files.sha256_of(path)
                digests.pop(builds.BUILD_STAMP, None)
                stamp = dict(wanted, files=digests)  # what was built, not when: a rebuild of the same is equal
                error = builds.write_stamp(os.path.join(prefix, builds.BUILD_STAMP), stamp)
                if error:
                    b.fail("built %s %s into %s, but its stamp cannot be written: %s"
                           % (p["name"], p["version"], prefix, error))
                result["stamp"] = stamp
                b.note("built %s %s into %s" % (p["name"], p["version"], prefix))
                if p["export_dir"]:
                    result["export_path"], result["export_sha256"] = b.export(prefix, identity_id, p["export_dir"])
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if link_changed and not check:
        files.link_atomic(link_target, link_path)  # a reader sees the old build or the new one
    result["changed"] = bool(reasons) or link_changed
    if module._diff and result["changed"]:
        before = "%s -> %s\n" % (link_path, link_now) if link_path else ""
        before += "".join("%s\n" % line for line in (_stamp_lines(old_stamp)))
        after = "%s -> %s\n" % (link_path, link_target) if link_path else ""
        after += "".join("%s\n" % line for line in _stamp_lines(wanted))
        result["diff"] = dict(before=before, after=after, before_header="%s (before)" % prefix,
                              after_header="%s (after)" % prefix)
    module.exit_json(**result)


def _differs(stamp, wanted):
    """The sorted keys in which STAMP (less its files) differs from the WANTED identity, or None when equal."""
    have = dict((k, v) for k, v in (stamp or {}).items() if k != "files")
    if have == wanted:
        return None
    return sorted(k for k in set(have) | set(wanted) if have.get(k) != wanted.get(k))


def _regular_files(root):
    """The relative paths of the regular files under ROOT (links are not followed, nor listed)."""
    found = []
    for top, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.relpath(path, root))
    return sorted(found)


def _manifest_error(manifest):
    """Why MANIFEST (install_files: {relative path: sha256}) is not one, or None (None for no manifest)."""
    for rel, digest in sorted((manifest or {}).items()):
        if not _inside(str(rel)):
            return "%r is no relative path inside the prefix" % (rel,)
        if not isinstance(digest, str) or not re.match(r"[0-9a-f]{64}\Z", digest):
            return "%s: %r is no sha256" % (rel, digest)
    return None


def _inside(rel):
    """REL is a plain relative path that stays inside the directory it is joined to."""
    parts = rel.replace("\\", "/").split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts


def _layout_error(comp):
    """Why COMP's links / install / make_env cannot be used as given (refused before anything is touched), or None."""
    name = comp["name"]
    for rel, target in comp["links"].items():
        if not _inside(str(rel)):
            return "%s: link %r is no relative path inside the prefix" % (name, rel)
        if not isinstance(target, str) or not target.startswith("/"):
            return "%s: link %s -> %r: the target must be an absolute path" % (name, rel, target)
    for pattern in comp["install"]:
        if not _inside(pattern):
            return "%s: install %r is no relative path inside the source tree" % (name, pattern)
    for key, value in comp["make_env"].items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(key)) or not isinstance(value, str):
            return "%s: make_env %r: a variable name and a string value" % (name, key)
    if comp["build"] != "make" and (comp["make_args"] or comp["install"] or comp["make_env"]):
        return "%s: make_args, make_env and install are for build: make" % name
    return None


def _stamp_lines(stamp):
    if not stamp:
        return ["(no build)"]
    lines = []
    for comp in stamp.get("components") or []:
        lines.append("%s: source %s" % (comp["name"], comp["source"]))
        lines += ["%s: patch %s" % (comp["name"], patch) for patch in comp["patches"]]
        if comp.get("build") == "make":
            lines.append("%s: make %s" % (comp["name"], " ".join(comp.get("make_args") or [])))
        else:
            lines.append("%s: cmake %s" % (comp["name"], " ".join(comp["cmake_args"])))
        lines += ["%s: link %s -> %s" % (comp["name"], k, v) for k, v in sorted((comp.get("links") or {}).items())]
    return lines


if __name__ == "__main__":
    main()
