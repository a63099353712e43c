#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: pinned_venv
short_description: A venv holding pinned Python packages, with a checked patch set applied to their installed files
description:
  - Checks the whole state in one run - the venv's interpreter, the stamp (C(.rigbook-venv.json) in the venv - the
    requirements, the lock file's sha256, the pip options, the patch set), every expected distribution's installed
    version (read from its dist-info, no pip call) and pinned commit (its C(direct_url.json)), and the sha256 of
    every file the patch set changed. When all match nothing runs and nothing is reported changed.
  - Otherwise the venv is made afresh (a venv that does not match its stamp is removed first - the venv path names
    the pin, so another pin is another venv and an older one stays usable), the requirements are installed with
    pip (with O(lock) as a requirements file - pip checks its hashes when it has any), each patch is tried with
    C(patch --dry-run) in the site-packages directory and then applied, the stamp is written and O(import_check)
    runs. On any failure the venv made by this call is removed again - nothing half-done is left.
  - Every patch file is checked against its pinned sha256 before anything is touched. A patch that no longer
    applies (a version bump) fails naming the patch and the files it could not patch.
  - Supports check mode (reports what would change and why) and diff mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  path:
    description: The venv directory; C({patch_set}) in it is replaced by the patch set hash (so the path names the
      whole pin).
    type: path
    required: true
  adopt:
    description:
      - O(path) is a venv made by hand (a box adopted by C(provision adopt)). Without rigbook's stamp it is kept and
        only stamped when it holds every expected version and every version the lock pins and no patches are
        pinned; otherwise pip installs into it. It is never removed.
    type: bool
    default: false
  python:
    description: The interpreter that creates the venv.
    type: path
    default: /usr/bin/python3
  requirements:
    description: pip requirement specifiers installed into the venv (an exact version, or a VCS URL at a commit).
    type: list
    elements: str
    required: true
  lock:
    description: A requirements file on the host pinning every package (C(==), optionally with C(--hash)), installed
      with C(-r) instead of O(requirements) (it must list them; O(expect) checks what came in) so a second box
      resolves the same versions. pip checks the hashes when the lock has any.
    type: path
  find_links:
    description: Directories or URLs of wheels (C(--find-links)).
    type: list
    elements: str
    default: []
  no_index:
    description: Install only from O(find_links) (offline).
    type: bool
    default: false
  no_deps:
    description: Install without dependencies (C(--no-deps)).
    type: bool
    default: false
  byte_compile:
    description: Let pip write the installed files' bytecode (its default). Off (C(--no-compile)), Python compiles
      what it imports when it imports it; what is installed is the same, so the stamp records it (adopt reads it
      back) but a change of it alone installs nothing.
    type: bool
    default: true
  expect:
    description: Distribution name to the version that must be installed.
    type: dict
    default: {}
  expect_commit:
    description: Distribution name to the commit (a prefix of at least 7 hex digits) it must be installed from.
    type: dict
    default: {}
  patches:
    description: Patches applied in order in the venv's site-packages directory, each a file with its pinned sha256.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The patch file on the host; with O(patch_dir) only its file name counts.
        type: path
      name:
        description: The patch's file name in O(patch_dir).
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
    description: The directory on the host holding the patches.
    type: path
  import_check:
    description: Python code run with the venv's interpreter after a change (e.g. an import that prints the version);
      empty for none.
    type: str
    default: ""
  environment:
    description: Extra environment for pip and the import check (e.g. C(CUDA_HOME)).
    type: dict
    default: {}
  env_files:
    description: Environment files (systemd C(KEY=value) lines) read into the environment of pip and the import
      check, before O(environment); files that do not exist are skipped.
    type: list
    elements: path
    default: []
  log:
    description: The pip log, appended as it runs (default C(<path>.pip.log) beside the venv).
    type: path
  libraries:
    description:
      - Shared libraries a wheel bundles that must resolve to another file, checked on every run and after every
        install - torch's wheel finds its bundled NCCL/RCCL through a DT_RPATH before LD_LIBRARY_PATH, so the
        engine runs the library the collectives were verified with only when the bundled file is that library.
      - Each O(libraries[].bundled) file present in site-packages is made a link to O(libraries[].target), the
        wheel's own file kept beside it as C(<bundled>.rigbook-bundled); an absent one is left absent (the loader
        then finds the target through the environment). Only the links change; the venv is not made again.
    type: list
    elements: dict
    default: []
    suboptions:
      bundled:
        description: The file's path relative to site-packages (e.g. C(torch/lib/librccl.so.1)).
        type: str
        required: true
      target:
        description: The absolute path of the verified library.
        type: path
        required: true
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: SGLang 0.5.23 with its lock and one patch
  rigbook.homelab.pinned_venv:
    path: /opt/rigbook/sglang/0.5.23-1a2b3c4d5e6f
    requirements: [sglang==0.5.23]
    lock: /opt/rigbook/sglang/locks/sglang-0.5.23.txt
    expect: {sglang: 0.5.23}
    patch_dir: /var/lib/rigbook/sglang/patches
    patches:
      - {name: symm-mem-logits-gather-sm90.patch, sha256: "{{ patch_sha256 }}"}
    import_check: "import sglang; print(sglang.__version__)"
"""

RETURN = r"""
linked:
  description: The bundled library files this call made (or would make) links to their O(libraries[].target).
  returned: always
  type: list
  elements: str
adopted:
  description: True when O(adopt) kept a venv made by hand that holds the pin and (would have) only stamped it.
  returned: always
  type: bool
lock_waited_s:
  description: Seconds this run waited for another build of the same path to finish (one a run cut short left
    running on the host); 0 when none held the lock, and in check mode.
  returned: always
  type: float
path:
  description: The venv directory (C({patch_set}) replaced).
  returned: always
  type: str
versions:
  description: Installed version of each expected distribution (null when absent).
  returned: always
  type: dict
commits:
  description: The VCS commit each expected distribution was installed from (null for an index or wheel install).
  returned: always
  type: dict
reasons:
  description: Why the venv is (or would be) made again; empty when it matches.
  returned: always
  type: list
  elements: str
patches_applied:
  description: The patches applied by this call.
  returned: always
  type: list
  elements: str
patch_set:
  description: The patch set hash (C(stock) without patches).
  returned: always
  type: str
import_output:
  description: What O(import_check) printed (after a change only).
  returned: always
  type: str
stamp:
  description: The stamp after the call.
  returned: always
  type: dict
"""

import glob
import json
import os
import re
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import build_lock, patch_set
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, runner

MAX_METADATA = 1 << 20  # a dist-info's METADATA: its Name and Version head it


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages(venv):
    found = sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages")))
    return found[0] if found else None


def installed(site):
    """{normalized name: (version, commit or None)} of the distributions in SITE, read from their dist-info."""
    out = {}
    for info in glob.glob(os.path.join(site or "/nonexistent", "*.dist-info")):
        metadata = files.read_text(os.path.join(info, "METADATA"), limit=MAX_METADATA, strip=False)
        if metadata is None:
            continue
        name = version = None
        for line in metadata.splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line.strip():
                break
        # no direct_url.json, or an unreadable one: not a VCS install (no commit to match a pin)
        direct, _error = files.read_json(os.path.join(info, "direct_url.json"))
        vcs = direct.get("vcs_info") if isinstance(direct, dict) else None
        commit = vcs.get("commit_id") if isinstance(vcs, dict) else None
        if name:
            out[normalize(name)] = (version, commit)
    return out


def read_env_files(paths):
    """KEY=value lines of the environment files that exist (comments and blank lines skipped, quotes removed)."""
    env = {}
    for path in paths:
        text = files.read_text(path, strip=False)
        for line in (text or "").splitlines():
            m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
            if m:
                env[m.group(1)] = m.group(2).strip().strip("'\"")
    return env


def stamp_path(venv):
    return os.path.join(venv, builds.VENV_STAMP)


def not_ours(venv):
    """Why VENV, an existing folder, may not be run or written as this module's user (root), or None: the venv
    itself, its bin/ and site-packages folders and pyvenv.cfg must be no link, owned by this user and writable by
    nobody else. Its python runs as root here and rigbook's stamp is written into it: a venv another user can write
    (one made by hand as that user, then adopted) would be their code run as root."""
    site = site_packages(venv)
    for path in [venv, os.path.join(venv, "bin"), os.path.join(venv, "pyvenv.cfg")] + ([site] if site else []):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return "%s cannot be read: %s" % (path, exc.strerror)
        if os.path.islink(path):
            return "%s is a symbolic link" % path
        if info.st_uid != os.geteuid():
            return "%s is owned by uid %d, not by uid %d" % (path, info.st_uid, os.geteuid())
        if info.st_mode & 0o022:
            return "%s is writable by its group or others (mode %04o)" % (path, info.st_mode & 0o7777)
    return None


def mismatches(p, dists):
    """What differs between the expected versions/commits and DISTS."""
    out = []
    for name, version in sorted(p["expect"].items()):
        have = dists.get(normalize(name))
        if have is None:
            out.append("%s is not installed" % name)
        elif have[0] != str(version):
            out.append("%s is %s, pinned %s" % (name, have[0], version))
    for name, commit in sorted(p["expect_commit"].items()):
        have = dists.get(normalize(name))
        got = (have or (None, None))[1]
        if not got or not got.startswith(str(commit).lower()):
            out.append("%s was installed from commit %s, pinned %s" % (name, got or "(none: not a VCS install)", commit))
    return out


def lock_versions(path):
    """{normalized name: version} of the `name==version` lines of a requirements lock (comments, options, hashes and
    other specifiers ignored)."""
    found = {}
    text = files.read_text(path, strip=False) or ""
    for line in text.replace("\\\n", " ").splitlines():
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)", line)
        if m:
            found[normalize(m.group(1))] = m.group(2)
    return found


def adopt_gaps(p, dists):
    """Why a venv made by hand cannot be kept as it is ([]: it can): a pinned version it lacks, a lock version it
    differs from, a patch set (whether it is applied cannot be told without rigbook's stamp)."""
    gaps = mismatches(p, dists)
    for name, version in sorted(lock_versions(p["lock"]).items() if p["lock"] else []):
        have = dists.get(name)
        if have is None or have[0] != version:
            gaps.append("%s is %s, the lock pins %s" % (name, have[0] if have else "not installed", version))
    if p["patches"]:
        gaps.append("a patch set is pinned")
    return gaps


def reasons_for(p, venv, wanted, stamp, dists, stamp_error=None):
    if not os.path.isfile(os.path.join(venv, "bin", "python")):
        return ["no venv at %s" % venv]
    if stamp is None:
        return [stamp_error or "no stamp in %s" % venv]
    have = dict((k, v) for k, v in stamp.items() if k in wanted)
    if have != wanted:
        return ["the stamp differs in %s" % ", ".join(sorted(k for k in wanted if have.get(k) != wanted[k]))]
    out = mismatches(p, dists)
    site = site_packages(venv)
    for rel, digest in sorted((stamp.get("files") or {}).items()):
        path = os.path.join(site or venv, rel)
        if not os.path.isfile(path):
            out.append("%s is missing" % path)
        elif files.sha256_of(path) != digest:
            out.append("%s changed since it was patched" % path)
    return out


KEPT = builds.KEPT_SUFFIX  # a wheel's own copy of a library, kept beside the link that replaced it


def library_links(site, libraries):
    """[(path, target)] of the LIBRARIES' bundled files present in SITE that are not links to their target yet."""
    out = []
    for lib in libraries:
        path = os.path.join(site or "", lib["bundled"])
        if site and os.path.lexists(path) and not (os.path.islink(path) and os.readlink(path) == lib["target"]):
            out.append((path, lib["target"]))
    return out


def link_library(path, target):
    """PATH (a wheel's bundled library) made a link to TARGET, atomically; the wheel's file kept as PATH + KEPT."""
    if not os.path.isfile(target):
        raise RuntimeError("%s: the library to link it to, %s, is not there (the role that builds it runs first)"
                           % (path, target))
    if not os.path.islink(path) and not os.path.lexists(path + KEPT):
        files.move_atomic(path, path + KEPT)
    files.link_atomic(target, path)


class Venv(object):
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.log = self.p["log"] or self.p["path"].rstrip("/") + ".pip.log"
        self.progress = []

    def note(self, line):
        try:
            with open(self.log, "a") as handle:
                handle.write("[rigbook %s] %s\n" % (time.strftime("%H:%M:%S"), line))
        except OSError:
            pass

    def run(self, what, argv, logged=True):
        started = time.time()
        env = read_env_files(self.p["env_files"])
        env.update(self.p["environment"], LC_ALL="C", PIP_DISABLE_PIP_VERSION_CHECK="1")
        if logged:
            self.note("%s: %s" % (what, " ".join(argv)))
            argv = ["sh", "-c", 'exec "$@" >>"$0" 2>&1', self.log] + argv
        result = runner.run(argv, env=env)
        self.progress.append("%s (%.1f s)" % (what, time.time() - started))
        if result.rc is None:  # it could not start: the reason is what it said
            return None, result.stdout, result.error
        return result.rc, result.stdout, result.stderr

    def tail(self, chars=2500):
        try:
            with open(self.log) as handle:
                return handle.read()[-chars:]
        except OSError:
            return ""

    def pip_argv(self):
        p = self.p
        argv = [os.path.join(p["path"], "bin", "python"), "-m", "pip", "install", "--no-input"]
        argv += ["--no-index"] if p["no_index"] else []
        argv += ["--no-deps"] if p["no_deps"] else []
        argv += [] if p["byte_compile"] else ["--no-compile"]
        for link in p["find_links"]:
            argv += ["--find-links", link]
        # a lock lists the requirements too (pip's hash-checking mode wants a hash for every one)
        return argv + (["-r", p["lock"]] if p["lock"] else list(p["requirements"]))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            python=dict(type="path", default="/usr/bin/python3"),
            requirements=dict(type="list", elements="str", required=True),
            lock=dict(type="path"),
            find_links=dict(type="list", elements="str", default=[]),
            no_index=dict(type="bool", default=False),
            no_deps=dict(type="bool", default=False),
            byte_compile=dict(type="bool", default=True),
            expect=dict(type="dict", default={}),
            expect_commit=dict(type="dict", default={}),
            patches=dict(type="list", elements="dict", default=[], options=dict(
                path=dict(type="path"),
                name=dict(type="str"),
                sha256=dict(type="str", required=True),
                strip=dict(type="int", default=1),
            )),
            patch_dir=dict(type="path"),
            import_check=dict(type="str", default=""),
            adopt=dict(type="bool", default=False),
            environment=dict(type="dict", default={}),
            env_files=dict(type="list", elements="path", default=[]),
            log=dict(type="path"),
            libraries=dict(type="list", elements="dict", default=[], options=dict(
                bundled=dict(type="str", required=True),
                target=dict(type="path", required=True),
            )),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for lib in p["libraries"]:
        parts = lib["bundled"].split("/")
        if lib["bundled"].startswith("/") or ".." in parts or not lib["bundled"].strip("/"):
            module.fail_json(msg="libraries: bundled %r is no path inside site-packages" % lib["bundled"])
        if not lib["target"].startswith("/"):
            module.fail_json(msg="libraries: target %r is no absolute path" % lib["target"])
    if not p["requirements"]:
        module.fail_json(msg="requirements: nothing to install")
    for name, commit in p["expect_commit"].items():
        if not re.match(r"^[0-9a-f]{7,40}$", str(commit).lower()):
            module.fail_json(msg="expect_commit %s: %r is not a commit (7 to 40 hex digits; a branch is not a pin)"
                             % (name, commit))
    owner = ", ".join(p["requirements"])
    error = patch_set.resolve_paths(p["patches"], p["patch_dir"], owner)
    missing, error, _ = (None, error, None) if error else patch_set.verify(p["patches"], module.check_mode, owner)
    if error:
        module.fail_json(msg=error)
    if p["lock"] and not os.path.isfile(p["lock"]) and not module.check_mode:
        module.fail_json(msg="lock file %s does not exist" % p["lock"])
    lock_sha = files.sha256_of(p["lock"]) if p["lock"] and os.path.isfile(p["lock"]) else None
    wanted = dict(requirements=list(p["requirements"]), lock_sha256=lock_sha, no_deps=p["no_deps"],
                  no_index=p["no_index"], find_links=list(p["find_links"]),
                  patches=["%s -p%d %s" % (os.path.basename(x["path"]), x["strip"], x["sha256"].lower())
                           for x in p["patches"]])
    set_id = patch_set.set_id(["%s:%s" % (os.path.basename(x["path"]), x["sha256"].lower()) for x in p["patches"]])
    venv = p["path"] = p["path"].replace("{patch_set}", set_id).rstrip("/")
    foreign = not_ours(venv) if os.path.lexists(venv) else None
    if foreign:
        module.fail_json(msg="refused the venv %s: %s. rigbook runs its python as root and writes its stamp into it; "
                         "give it to root (chown -R root: %s; chmod -R go-w %s) or pin another path and rigbook "
                         "makes its own; nothing was changed" % (venv, foreign, venv, venv), path=venv)
    # an install a cut-short run left running finishes first; then its stamp is read
    waited = 0.0 if module.check_mode else build_lock.hold(venv)
    stamp, stamp_error = builds.read_stamp(stamp_path(venv))
    old_stamp = stamp
    site = site_packages(venv)
    dists = installed(site)
    reasons = reasons_for(p, venv, wanted, stamp, dists, stamp_error)
    result = dict(changed=bool(reasons), path=venv, reasons=reasons, patch_set=set_id, patches_applied=[], import_output="",
                  stamp=stamp or {}, lock_waited_s=waited, adopted=False)
    by_hand = p["adopt"] and stamp is None and os.path.isfile(os.path.join(venv, "bin", "python"))
    if by_hand and not adopt_gaps(p, dists):
        # a venv made by hand that holds the pin: kept as it is, only rigbook's stamp is written
        result.update(adopted=True, reasons=["%s was made by hand and holds the pin: stamped, nothing installed" % venv])
        reasons = []
        stamp = dict(wanted, patch_set=set_id, files={}, adopted=True,
                     versions=dict((n, dists.get(normalize(n), (None, None))[0]) for n in p["expect"]))
        error = None if module.check_mode else builds.write_stamp(stamp_path(venv), stamp)
        if error:
            module.fail_json(msg="%s holds the pin, but rigbook's stamp cannot be written: %s" % (venv, error))
        result["stamp"] = stamp
    elif by_hand:
        result["reasons"] = reasons = ["%s was made by hand: %s; pip installs into it" % (venv, "; ".join(
            adopt_gaps(p, dists)))]
    if missing:
        result["msg"] = "not on the host yet (check mode): %s" % ", ".join(missing)
    if reasons and not module.check_mode:
        v = Venv(module)
        result["progress"] = v.progress
        made = False
        try:
            if os.path.lexists(venv) and not by_hand:
                shutil.rmtree(venv)  # it does not match the pin its path names: start clean
            os.makedirs(os.path.dirname(venv) or "/", 0o755, exist_ok=True)
            with open(v.log, "a") as handle:
                handle.write("\n")
            v.note("%s %s: %s" % ("install into" if by_hand else "make", venv, "; ".join(reasons)))
            made = not by_hand  # a venv made by hand is never removed, not even when the install fails
            if not by_hand:
                rc, out, err = v.run("create the venv", [p["python"], "-m", "venv", venv])
                if rc != 0:
                    raise RuntimeError("creating the venv with %s failed (rc %d):\n%s" % (p["python"], rc, v.tail()))
            rc, out, err = v.run("pip install", v.pip_argv())
            if rc != 0:
                raise RuntimeError("pip install into %s failed (rc %d); the end of %s:\n%s" % (venv, rc, v.log, v.tail()))
            site = site_packages(venv)
            dists = installed(site)
            wrong = mismatches(p, dists)
            if wrong:
                raise RuntimeError("after pip install into %s: %s" % (venv, "; ".join(wrong)))
            for dry_run in (True, False):
                names, touched, failure = patch_set.apply(p["patches"], site, dry_run)
                if failure:
                    result.update(patch=failure["path"], failing_files=failure["files"])
                    raise RuntimeError("%s. The venv %s was %s." % (patch_set.failure_message(
                        failure, "%s in %s" % (", ".join(p["requirements"]), site)), venv,
                        "kept (made by hand)" if by_hand else "removed again"))
            result["patches_applied"] = names
            if p["import_check"]:
                rc, out, err = v.run("import check", [os.path.join(venv, "bin", "python"), "-c", p["import_check"]],
                                     logged=False)
                if rc != 0:
                    raise RuntimeError("the import check failed in %s (rc %d): %s" % (venv, rc, (err or out)[-1500:]))
                result["import_output"] = out.strip()
            # byte_compile is recorded (adopt reads it back), not compared: the files installed are the same
            stamp = dict(wanted, byte_compile=p["byte_compile"], patch_set=set_id,
                         files=dict((rel, files.sha256_of(os.path.join(site, rel))) for rel in touched),
                         versions=dict((n, dists.get(normalize(n), (None, None))[0]) for n in p["expect"]))
            error = builds.write_stamp(stamp_path(venv), stamp)
            if error:
                raise RuntimeError(error)
            result["stamp"] = stamp
            v.note("made %s" % venv)
        except (RuntimeError, OSError) as exc:
            if made:
                shutil.rmtree(venv, ignore_errors=True)
            module.fail_json(msg=str(exc), progress=v.progress, **dict((k, result[k]) for k in result
                                                                       if k in ("patch", "failing_files")))
    links = library_links(site_packages(venv), p["libraries"])
    result["linked"] = [path for path, _ in links]
    if links and not module.check_mode:
        try:
            for path, target in links:
                link_library(path, target)
        except (RuntimeError, OSError) as exc:
            module.fail_json(msg=str(exc), linked=[])
    result["versions"] = dict((n, dists.get(normalize(n), (None, None))[0]) for n in p["expect"])
    result["commits"] = dict((n, dists.get(normalize(n), (None, None))[1]) for n in p["expect"])
    result["changed"] = bool(reasons) or result["adopted"] or bool(links)
    if module._diff and result["changed"]:
        result["diff"] = dict(before=json.dumps(dict((k, (old_stamp or {}).get(k)) for k in wanted), indent=1) + "\n",
                              after=json.dumps(wanted, indent=1) + "\n", before_header=venv, after_header=venv)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
