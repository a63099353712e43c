# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action rigbook.homelab.deb_store: the controller's store of a pinned distribution kernel's .debs (roles/kernel),
the one place that decides what the store holds and which files a box may install from it.

Ubuntu's archive drops a kernel's packages once a newer ABI of its series is published (module_utils/deb_store.py
says why and holds the rules). The first box that installs the pinned kernel keeps the .debs apt downloaded; a box
that comes later installs those exact files when the archive no longer offers the recorded version.

A box's word is never the record: the controller fetches each kept .deb under a name of its own, hashes it itself and
stores it as SHA256.deb (0600) only when that sha256 is one the package index names for the package's version, as
apt-cache show read it on the box: the hash apt checked the download against. So the first box is trusted for the
index it read (apt verified that index's signature on the box), not for the bytes it hands over. The record beside
the files (RELEASE_ARCH.json, 0600, written atomically under a lock: two boxes of one run may record at once) names,
per package, its version, architecture, the controller's sha256, the index's, what the box claimed, the box and the
run. A second box that hands over the same version with other bytes, its own index agreeing, fails naming both.

Steps (`step`), each for one host on the controller, no connection:
- plan: the packages the release is installed as on the box's OS (deb_store.distro_kernel_packages), the patterns of
  the installed packages whose .debs are kept, the store's records of the release (each architecture, as a box is
  handed them: versions, architectures and sha256 only) and where this box's fetched .debs land (`incoming`, a name
  of the controller's). Without `store_dir` (a plain ansible-playbook run) no records and nothing kept.
- record: the .debs a box kept (deb_packages' `kept`), fetched to `incoming`/N.deb: every file hashed and checked
  first, then stored and recorded; a file another sha256 than its index names is refused with nothing recorded (it
  stays in .incoming); a version no index on the box lists is not stored (said: a warning).
- take: the stored files of the named packages for a box whose archive no longer offers them, each re-hashed against
  the record before it is handed out; a mismatch fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import time

from ansible.plugins.action import ActionBase
from ansible_collections.rigbook.homelab.plugins.module_utils import deb_store
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, packages, text

STEPS = ("plan", "record", "take")
INCOMING = ".incoming"
LOCK = ".lock"


class Refused(Exception):
    """The step fails for this host: the message says why."""


def shown(value, limit=200):
    """VALUE as one bounded line for a message (control characters dropped)."""
    return text.line(value, limit) or ""


def incoming_dir(store_dir, host):
    """Where HOST's fetched .debs land (a name of the controller's: never the box's)."""
    key = hashlib.sha256(str(host).encode("utf-8", "replace")).hexdigest()[:16]
    return os.path.join(store_dir, INCOMING, key)


@contextlib.contextmanager
def locked(store_dir):
    """The store's lock, held while a record is read, changed and written (the boxes of one run record at once)."""
    os.makedirs(store_dir, 0o700, exist_ok=True)
    handle = os.open(os.path.join(store_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def read_record(store_dir, release, arch):
    """The store's record of RELEASE for ARCH, or None when there is none; Refused naming it when it is unreadable
    or of another shape (the controller's own file: edited by hand, or damaged)."""
    path = os.path.join(store_dir, deb_store.record_name(release, arch))
    if os.path.islink(path):
        raise Refused("the store's record %s is a link" % path)
    data, error = files.read_json(path, limit=deb_store.MAX_RECORD)
    if error:
        raise Refused("the store's record %s cannot be read: %s" % (path, shown(error)))
    if data is None:
        return None
    record, why = deb_store.check_record(data, release, arch)
    if why:
        raise Refused("the store's record %s: %s; move it aside to let a box record the release again" % (path, why))
    return record


def plan(store_dir, release, os_id, names, host):
    """This box's packages, keep patterns, the store's records of RELEASE and where its fetched .debs land."""
    wanted = deb_store.distro_kernel_packages(release, os_id, names)
    if not store_dir:
        return dict(packages=wanted, keep=[], records=[], incoming="", why=[])
    records, why = [], []
    pattern = glob.escape(release) + "_*.json"
    for path in sorted(glob.glob(os.path.join(glob.escape(store_dir), pattern))):
        arch = os.path.basename(path)[len(release) + 1:-len(".json")]
        if not text.matching(arch, deb_store.ARCH):
            continue
        try:
            record = read_record(store_dir, release, arch)
        except Refused as exc:
            why.append("%s: not used: %s" % (os.path.basename(path), exc))
            continue
        if record:
            records.append(deb_store.shown_to_box(record))
    return dict(packages=wanted, keep=deb_store.keep_patterns(release, wanted), records=records,
                incoming=incoming_dir(store_dir, host), why=why)


def _kept_item(host, index, item):
    """One entry of a box's kept list, typed: (name, version, architecture, claimed sha256 or None, [index sha256])."""
    item = item if isinstance(item, dict) else {}
    name = text.matching(item.get("name"), packages.PACKAGE)
    version = text.matching(item.get("version"), packages.VERSION)
    arch = text.matching(item.get("architecture"), deb_store.ARCH)
    if not name or not version or not arch:
        raise Refused("%s's kept entry %d is no package with a version and architecture" % (host, index))
    claimed = text.matching(item.get("sha256"), deb_store.SHA256)
    listed = item.get("index_sha256") if isinstance(item.get("index_sha256"), list) else []
    index_sha256 = sorted(set(h for h in listed[:16] if text.matching(h, deb_store.SHA256)))
    return name, version, arch, claimed, index_sha256


def record_kept(store_dir, release, arch, kept, host, run_dir):
    """The .debs HOST kept, fetched to its incoming folder: checked, then stored and recorded. Returns the records
    (as a box is handed them), the packages stored and why any was not."""
    if not isinstance(kept, list) or not kept or len(kept) > deb_store.MAX_PACKAGES:
        raise Refused("%s kept no list of at most %d packages" % (host, deb_store.MAX_PACKAGES))
    incoming = incoming_dir(store_dir, host)
    # first every file checked: a refused one leaves nothing stored and nothing recorded
    checked, why = [], []
    for index, item in enumerate(kept):
        name, version, item_arch, claimed, index_sha256 = _kept_item(host, index, item)
        path = os.path.join(incoming, "%d.deb" % index)
        if os.path.islink(path) or not os.path.isfile(path):
            raise Refused("%s's .deb of %s %s did not reach the controller (%s)" % (host, name, version, path))
        sha256 = files.sha256_of(path)
        if not index_sha256:
            why.append("%s %s: not stored: no package index on %s lists that version (apt-cache show), so nothing "
                       "vouches for the file; a later box can install it only while the archive offers it"
                       % (name, version, host))
            os.unlink(path)
            continue
        if sha256 not in index_sha256:
            raise Refused("%s %s from %s: refused: the controller got sha256 %s from the file, the package index apt "
                          "read on the box names %s (the file is kept at %s)" % (
                              name, version, host, sha256, ", ".join(index_sha256), path))
        checked.append((path, name, version, item_arch, claimed, sha256))
    with locked(store_dir):
        record = read_record(store_dir, release, arch) or dict(
            format=deb_store.FORMAT, release=release, architecture=arch, packages={})
        stored = []
        for path, name, version, item_arch, claimed, sha256 in checked:
            existing = record["packages"].get(name)
            if existing and existing["version"] == version and existing["sha256"] != sha256:
                raise Refused("%s %s: %s's file has sha256 %s, its package index agreeing; the store holds sha256 %s "
                              "recorded from %s: two indexes disagree about one version" % (
                                  name, version, host, sha256, existing["sha256"], shown(existing.get("host"))))
            target = os.path.join(store_dir, deb_store.deb_name(sha256))
            if existing:
                if existing["version"] != version:
                    why.append("%s %s: not stored: the store holds %s %s (recorded from %s); twins install that one"
                               % (name, version, name, existing["version"], shown(existing.get("host"))))
                os.unlink(path)
                continue
            if os.path.isfile(target) and not os.path.islink(target) and files.sha256_of(target) == sha256:
                os.unlink(path)  # the same bytes stored already (another release's package of the same file)
            else:
                os.chmod(path, 0o600)
                files.move_atomic(path, target)
            record["packages"][name] = dict(
                version=version, architecture=item_arch, sha256=sha256, index_sha256=sha256,
                claimed_sha256=claimed, claim_matches=claimed == sha256, size=os.path.getsize(target), host=host,
                run_dir=run_dir, recorded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            stored.append(name)
        if stored:
            error = files.write_json(os.path.join(store_dir, deb_store.record_name(release, arch)), record, mode=0o600)
            if error:
                raise Refused("the store's record of %s cannot be written: %s" % (release, error))
    records = [deb_store.shown_to_box(record)] if record["packages"] else []
    msg = ("%s: stored %s (sha256 as the controller computed it, each the one the package index names)"
           % (host, ", ".join(stored)) if stored else "%s: nothing new stored" % host)
    return dict(records=records, stored=stored, why=why, msg=msg)


def take(store_dir, release, arch, names, dest_dir):
    """The stored files of NAMES for a box of ARCH: files [{name, version, sha256, src (on the controller), file, path
    (on the box, in DEST_DIR)}] and artifacts [{path, sha256}] (what the box checks), each re-hashed against the
    record; Refused naming what does not match."""
    if not isinstance(names, list) or not names or len(names) > deb_store.MAX_PACKAGES:
        raise Refused("take needs the names of the packages to install from the store")
    record = read_record(store_dir, release, arch)
    if record is None:
        raise Refused("the store holds no record of %s for %s" % (release, arch))
    out = []
    for name in names:
        entry = record["packages"].get(name) if isinstance(name, str) else None
        if entry is None:
            raise Refused("the store's record of %s for %s has no package %s" % (release, arch, shown(name, 140)))
        src = os.path.join(store_dir, deb_store.deb_name(entry["sha256"]))
        if os.path.islink(src) or not os.path.isfile(src):
            raise Refused("%s %s: the store's file %s is missing" % (name, entry["version"], src))
        got = files.sha256_of(src)
        if got != entry["sha256"]:
            raise Refused("%s %s: the store's file %s has sha256 %s now, its record says %s" % (
                name, entry["version"], src, got, entry["sha256"]))
        file_name = deb_store.cache_name(name, entry["version"], entry["architecture"])
        out.append(dict(name=name, version=entry["version"], sha256=got, src=src, file=file_name,
                        path=os.path.join(dest_dir, file_name)))
    return dict(files=out, artifacts=[dict(path=f["path"], sha256=f["sha256"]) for f in out],
                msg="from the controller's store: %s" % ", ".join(
        "%s %s (sha256 %s)" % (f["name"], f["version"], f["sha256"]) for f in out))


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("step", "release", "os_id", "packages", "store_dir", "architecture", "kept", "names",
                             "dest_dir"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result["changed"] = False
        args = self._task.args
        host = str(task_vars.get("inventory_hostname", "?"))
        step = args.get("step")
        release = text.matching(args.get("release"), deb_store.RELEASE)
        store_dir = str(args.get("store_dir") or "")
        if step not in STEPS or not release or (store_dir and not os.path.isabs(store_dir)):
            return dict(result, failed=True, msg="deb_store: step one of %s, a kernel release (%r) and an absolute "
                        "store_dir or none" % (", ".join(STEPS), shown(args.get("release"), 140)))
        if step != "plan" and not store_dir:
            return dict(result, failed=True, msg="deb_store %s: no store_dir" % step)
        arch = text.matching(args.get("architecture"), deb_store.ARCH)
        if step != "plan" and not arch:
            return dict(result, failed=True, msg="deb_store %s: no architecture (%r)" % (
                step, shown(args.get("architecture"), 40)))
        if self._task.check_mode and step == "record":
            return dict(result, msg="check mode: nothing recorded")
        try:
            if step == "plan":
                names = args.get("packages") if isinstance(args.get("packages"), list) else []
                out = plan(store_dir, release, str(args.get("os_id") or ""), [str(n) for n in names], host)
            elif step == "record":
                out = record_kept(store_dir, release, arch, args.get("kept"), host,
                                  str(task_vars.get("rigbook_run_dir") or ""))
            else:
                dest_dir = str(args.get("dest_dir") or "")
                if not os.path.isabs(dest_dir):
                    raise Refused("take needs an absolute dest_dir (where the box keeps the files)")
                out = take(store_dir, release, arch, args.get("names"), dest_dir)
        except Refused as exc:
            return dict(result, failed=True, msg=str(exc))
        except (OSError, ValueError) as exc:
            return dict(result, failed=True, msg="deb_store %s for %s: %s" % (step, host, exc))
        if out.get("why"):
            result["warnings"] = ["%s: %s" % (host, why) for why in out["why"]]
        return dict(result, **out)
