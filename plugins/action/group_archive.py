# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action rigbook.homelab.group_archive: the controller's side of a group build (roles/group_build), the one place
that decides which box builds, which archive a box may install, and what the controller knows of each archive.

A box's word is never the record: the controller hashes every archive it fetches itself, lists its members itself
(module_utils/safe_untar.listing, the unpacking rules, nothing written) and keeps a provenance record beside it in
builds/ (facts/builds.provenance_name: JSON, 0600, written atomically): the box that built it, its group (the
inventory groups it is in, joined) and inventory, the run, the identity, the build, the sha256 and the manifest
(every regular file with its size and sha256; the relative links). An archive is installed only on a box of the same
inventory and group as its builder, only while its record can be read and the archive still has the sha256 the
record names, and only the files of the manifest, each checked on the box (the modules' install_files).

Steps (`step`), each run for one host on the controller, no connection:
- plan: this box's part for its build (`name`, the check result in `state_var`): "build" (the first due box of its
  group and identity, when no usable archive is in `builds_dir`), "verify" (with `verify`: the next due box, or the
  first when a usable archive exists: it builds too, and its archive must have the same sha256), or "install"; with
  `why`, each archive of this build in builds/ that is not used and why, and `incoming`, where its fetch lands.
- record: the builder's fetched archive hashed, listed, moved into builds/ under its name and recorded; then builds/
  is pruned: the records of this inventory, group and build of another identity (one no box of the group in the
  play is at) or of the same identity but other bytes go, and every archive of this build no record names.
- verify: the verifying box's fetched archive hashed and compared with the recorded one; equal adds it to the record
  (`verified_by`), a difference fails naming both boxes and both digests (its archive kept in builds/.incoming).
- take: for an installing box, the archive to install (re-checked against its record) and its `install_files`, or
  `use: false` and why (it then builds its own); a failed verification fails it too.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import tarfile
import time

from ansible.plugins.action import ActionBase
from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds, files, text

STEPS = ("plan", "record", "verify", "take")
PARTS = ("build", "verify", "install", "own")
FORMAT = 1
MAX_RECORD = 64 << 20
NOT_GROUPS = ("all", "ungrouped")
HEX64 = re.compile(r"[0-9a-f]{64}\Z")
INCOMING = ".incoming"
# What roles/group_build registers the builder's record step and the verifier's verify step as (read from hostvars).
RECORDED_VAR, VERIFIED_VAR = "group_build_recorded", "group_build_verified"


class Refused(Exception):
    """The step fails for this host: the message says why."""


def shown(value, limit=200):
    """VALUE as one bounded line for a message (control characters dropped)."""
    return text.line(value, limit) or ""


def group_of(group_names):
    """The group a box builds for: the inventory groups it is in (all and ungrouped aside), sorted, joined by ','."""
    return ",".join(sorted(str(g) for g in (group_names or ()) if str(g) not in NOT_GROUPS))


def inventory_of(sources):
    """The inventory a run reads (Ansible's inventory sources, joined by ',')."""
    if isinstance(sources, (str, bytes)):
        sources = [sources]
    return ",".join(str(s) for s in (sources or ()))


def identity_of(state):
    """The identity_id a box's check result names (16 hex digits), or '' for anything else."""
    value = state.get("identity_id") if isinstance(state, dict) else None
    return (text.matching(value, r"[0-9a-f]{16}", 16) if isinstance(value, str) else None) or ""


def incoming_path(builds_dir, host):
    """Where the fetch of HOST's exported archive lands (a name of the controller's: never the box's)."""
    key = hashlib.sha256(str(host).encode("utf-8", "replace")).hexdigest()[:16]
    return os.path.join(builds_dir, INCOMING, "%s.tar.gz" % key)


def _inside(rel):
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts and "." not in parts


# --- the records ---------------------------------------------------------------------------------------------------

def manifest_of(archive):
    """({path: {size, sha256}} of ARCHIVE's regular files, {path: target} of its links), as safe_untar.listing reads
    them (every member checked; nothing written). Raises Refused naming the member a listing refuses."""
    try:
        found = safe_untar.listing(archive)
    except safe_untar.UnsafeArchive as exc:
        raise Refused("unsafe archive, %s" % exc) from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Refused("cannot read the archive: %s" % exc) from None
    manifest = dict((rel, {"size": entry["size"], "sha256": entry["sha256"]})
                    for rel, entry in found.items() if entry["kind"] == "file")
    links = dict((rel, entry["target"]) for rel, entry in found.items() if entry["kind"] == "symlink")
    if not manifest:
        raise Refused("the archive holds no file")
    return manifest, links


def read_record(builds_dir, archive_file, key):
    """(record, why): the provenance record of ARCHIVE_FILE (a name in BUILDS_DIR) for the boxes KEY names, read and
    its shape checked; (None, why) when missing, unreadable or malformed."""
    path = os.path.join(builds_dir, builds.provenance_name(archive_file, key))
    if os.path.islink(path):
        return None, "its provenance record %s is a link" % path
    record, error = files.read_json(path, limit=MAX_RECORD)
    if error:
        return None, "its provenance record cannot be read (%s)" % shown(error)
    if record is None:
        return None, "it has no provenance record for this inventory and group (%s)" % os.path.basename(path)
    if not isinstance(record, dict):
        return None, "its provenance record %s is not a JSON object" % os.path.basename(path)
    for field in ("build", "identity_id", "sha256", "host", "group", "inventory", "run_dir", "archive"):
        if not isinstance(record.get(field), str):
            return None, "its provenance record has no %s" % field
    manifest = record.get("manifest")
    if not isinstance(manifest, dict) or not manifest:
        return None, "its provenance record has no manifest"
    for rel, entry in manifest.items():
        if not _inside(str(rel)) or not isinstance(entry, dict) or not HEX64.match(str(entry.get("sha256"))) \
                or not isinstance(entry.get("size"), int) or isinstance(entry.get("size"), bool):
            return None, "its provenance record's manifest entry %r is no relative path with a size and sha256" % (
                shown(rel),)
    return record, None


def check_record(builds_dir, archive_file, expect):
    """(record, why) for installing ARCHIVE_FILE (a name in BUILDS_DIR) on a box: its record for EXPECT's inventory and
    group is there and readable, names EXPECT (build, identity_id, inventory, group) and the sha256 the archive's name
    carries, and the controller still gets that sha256 from the archive; else (None, why)."""
    named = builds.parse_archive_name(archive_file)
    if not named or named["name"] != expect["build"] or named["identity_id"] != expect["identity_id"]:
        return None, "not an archive of this build"
    record, why = read_record(builds_dir, archive_file, builds.provenance_key(expect["inventory"], expect["group"]))
    if why:
        return None, why
    for field in ("build", "identity_id", "inventory", "group"):
        if record[field] != expect[field]:
            return None, "its provenance record is of %s %s, this box's is %s" % (
                field, shown(record[field]), shown(expect[field]))
    if record["sha256"] != named["sha256"] or record["archive"] != archive_file:
        return None, "its provenance record is of another archive (sha256 %s)" % shown(record["sha256"], 64)
    path = os.path.join(builds_dir, archive_file)
    try:
        got = files.sha256_of(path)
    except OSError as exc:
        return None, "the controller cannot read it (%s)" % shown(exc)
    if got != record["sha256"]:
        return None, "its sha256 is now %s, its provenance record says %s" % (got, record["sha256"])
    return record, None


def usable(builds_dir, expect):
    """(the newest usable archive's record, or None; [why each other archive of this build is not used])."""
    found, whys = [], []
    pattern = builds.archive_glob(expect["build"], expect["identity_id"])
    for path in sorted(glob.glob(os.path.join(glob.escape(builds_dir), pattern))):
        archive_file = os.path.basename(path)
        record, why = check_record(builds_dir, archive_file, expect)
        if why:
            whys.append("%s: not used: %s" % (archive_file, why))
        else:
            found.append(record)
    found.sort(key=lambda r: (str(r.get("recorded")), r["archive"]))
    for older in found[:-1]:
        whys.append("%s: not used: %s is newer" % (older["archive"], found[-1]["archive"]))
    return (found[-1] if found else None), whys


def install_files(record):
    """{path: sha256} of a record's manifest: what the installing module checks and installs."""
    return dict((rel, entry["sha256"]) for rel, entry in sorted(record["manifest"].items()))


def prune(builds_dir, build, key, keep_identities, keep_archive):
    """Remove the records of BUILD for the boxes KEY names other than KEEP_ARCHIVE's whose identity no box is at
    (KEEP_IDENTITIES) or that are of KEEP_ARCHIVE's identity (superseded), then every archive of BUILD no record
    names. Returns the file names removed."""
    removed = []
    keep = builds.parse_archive_name(keep_archive)
    records = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(builds_dir), builds.provenance_glob(build)))):
        named = builds.parse_provenance_name(os.path.basename(path))
        if not named or named["name"] != build:
            continue
        mine = named["key"] == key and named["archive"] != keep_archive
        if mine and (named["identity_id"] not in keep_identities or named["identity_id"] == keep["identity_id"]):
            os.unlink(path)
            removed.append(os.path.basename(path))
        else:
            records[named["archive"]] = True
    for path in sorted(glob.glob(os.path.join(glob.escape(builds_dir), builds.archive_glob(build, "*")))):
        named = builds.parse_archive_name(os.path.basename(path))
        if named and named["name"] == build and os.path.basename(path) not in records \
                and os.path.basename(path) != keep_archive:
            os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


# --- the steps -------------------------------------------------------------------------------------------------------

def plan(host, peers, builds_dir, build, inventory, verify):
    """This HOST's part in the build. PEERS: [(host, group, identity_id, due)] of every host of the play, in play
    order."""
    me = next((p for p in peers if p[0] == host), None)
    if me is None or not me[2]:  # a change that builds nothing (DKMS: a stamp, another version removed)
        return dict(part="own", builder=None, verifier=None, archive="", why=[], incoming="",
                    group=me[1] if me else "", identity_id="", inventory=inventory)
    _host, group, identity, _due = me
    expect = dict(build=build, identity_id=identity, inventory=inventory, group=group)
    due = [p[0] for p in peers if p[3] and p[1] == group and p[2] == identity]
    if host not in due:
        due.append(host)
    record, whys = usable(builds_dir, expect)
    builder = None if record else due[0]
    verifier = None
    if verify:
        rest = due if record else due[1:]
        verifier = rest[0] if rest else None
        if verifier is None:
            whys.append("not verified: no other box of group %s needs this build in this run" % group)
    part = "build" if host == builder else "verify" if host == verifier else "install"
    return dict(part=part, builder=builder, verifier=verifier, archive=record["archive"] if record else "",
                group=group, identity_id=identity, inventory=inventory, why=whys,
                incoming=incoming_path(builds_dir, host))


def record_build(host, the_plan, builds_dir, build, run_dir, claimed, keep_identities):
    """The builder's fetched archive into builds/ with its provenance record; builds/ pruned."""
    incoming = the_plan["incoming"]
    try:
        if not os.path.isfile(incoming) or os.path.islink(incoming):
            raise Refused("%s's archive did not reach the controller (%s)" % (host, incoming))
        sha256 = files.sha256_of(incoming)
        if claimed and claimed != sha256:
            raise Refused("%s says its archive's sha256 is %s, the controller got %s from what it fetched"
                          % (host, shown(claimed, 64), sha256))
        try:
            manifest, links = manifest_of(incoming)
        except Refused as exc:
            raise Refused("%s's archive is refused: %s" % (host, exc)) from None
        archive_file = builds.archive_name(build, the_plan["identity_id"], sha256)
    except Refused:
        if os.path.isfile(incoming) and not os.path.islink(incoming):
            os.unlink(incoming)
        raise
    target = os.path.join(builds_dir, archive_file)
    os.chmod(incoming, 0o600)
    files.move_atomic(incoming, target)
    record = dict(format=FORMAT, build=build, identity_id=the_plan["identity_id"], sha256=sha256, archive=archive_file,
                  host=host, group=the_plan["group"], inventory=the_plan["inventory"], run_dir=run_dir,
                  recorded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), manifest=manifest, links=links,
                  verified_by=[])
    key = builds.provenance_key(the_plan["inventory"], the_plan["group"])
    error = files.write_json(os.path.join(builds_dir, builds.provenance_name(archive_file, key)), record, mode=0o600)
    if error:
        raise Refused("%s's archive %s: its provenance record cannot be written: %s" % (host, archive_file, error))
    pruned = prune(builds_dir, build, key, set(keep_identities) | {the_plan["identity_id"]}, archive_file)
    return dict(archive=archive_file, sha256=sha256, install_files=install_files(record), pruned=pruned,
                msg="%s: built %s, recorded by the controller (sha256 %s, %d files)%s" % (
                    host, archive_file, sha256, len(manifest),
                    "; removed from builds/: %s" % ", ".join(pruned) if pruned else ""))


def reference(the_plan, builder_result):
    """The archive file name a verifying or installing box compares with or installs: the usable one the plan found,
    else the one its builder recorded in this run (None when that builder recorded none)."""
    if the_plan.get("archive"):
        return the_plan["archive"]
    archive = builder_result.get("archive") if isinstance(builder_result, dict) else None
    return archive if isinstance(archive, str) and builds.parse_archive_name(archive) else None


def verify_build(host, the_plan, builds_dir, build, run_dir, builder_result):
    """The verifying box's fetched archive against the recorded one: equal -> added to its record; else Refused
    naming both boxes and both digests."""
    expect = dict(build=build, identity_id=the_plan["identity_id"], inventory=the_plan["inventory"],
                  group=the_plan["group"])
    archive_file = reference(the_plan, builder_result)
    incoming = the_plan["incoming"]
    # nothing to compare (the builder's build or this one did not reach the controller: that box failed): said
    if archive_file is None:
        why = "%s's build did not reach the controller" % the_plan.get("builder")
    elif not os.path.isfile(incoming) or os.path.islink(incoming):
        why = "%s's archive did not reach the controller" % host
    else:
        record, why = check_record(builds_dir, archive_file, expect)
        why = why and "%s: %s" % (archive_file, why)
    if why:
        return dict(reproduced=None, why=["not verified: %s" % why], msg="not verified: %s" % why)
    sha256 = files.sha256_of(incoming)
    if sha256 != record["sha256"]:
        raise Refused("the build %s of group %s did not reproduce: %s built sha256 %s, %s built sha256 %s (its archive "
                      "is kept at %s)" % (build, the_plan["group"], shown(record["host"]), record["sha256"], host,
                                          sha256, incoming))
    os.unlink(incoming)
    record["verified_by"] = [v for v in record.get("verified_by") or [] if isinstance(v, dict)] + [
        dict(host=host, run_dir=run_dir, sha256=sha256)]
    key = builds.provenance_key(the_plan["inventory"], the_plan["group"])
    error = files.write_json(os.path.join(builds_dir, builds.provenance_name(archive_file, key)), record, mode=0o600)
    if error:
        raise Refused("%s: its provenance record cannot be written: %s" % (archive_file, error))
    return dict(reproduced=True, archive=archive_file, sha256=sha256, builder=record["host"],
                msg="%s reproduced %s built by %s (sha256 %s)" % (host, archive_file, shown(record["host"]), sha256))


def take(host, the_plan, builds_dir, build, builder_result, verifier_result):
    """The archive an installing box installs and its install_files, or use false and why."""
    verifier = the_plan.get("verifier")
    if verifier:
        if isinstance(verifier_result, dict) and verifier_result.get("reproduced") is False:
            raise Refused("not installed: %s" % shown(verifier_result.get("msg"), 2000))
        if not isinstance(verifier_result, dict) or verifier_result.get("reproduced") is not True:
            return dict(use=False, why=["%s did not finish the verifying build: this box builds its own" % verifier])
    archive_file = reference(the_plan, builder_result)
    if archive_file is None:
        return dict(use=False, why=["%s's build did not reach the controller: this box builds its own"
                                    % the_plan.get("builder")])
    expect = dict(build=build, identity_id=the_plan["identity_id"], inventory=the_plan["inventory"],
                  group=the_plan["group"])
    record, why = check_record(builds_dir, archive_file, expect)
    if why:
        return dict(use=False, why=["%s: not used: %s; this box builds its own" % (archive_file, why)])
    return dict(use=True, archive=os.path.join(builds_dir, archive_file), sha256=record["sha256"],
                builder=record["host"], install_files=install_files(record), why=[],
                msg="%s installs %s, built by %s (sha256 %s)" % (host, archive_file, shown(record["host"]),
                                                                 record["sha256"]))


class ActionModule(ActionBase):
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("step", "name", "state_var", "builds_dir", "verify", "plan", "claimed_sha256"))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result["changed"] = False
        args = self._task.args
        host = str(task_vars.get("inventory_hostname", "?"))
        step = args.get("step")
        build = str(args.get("name") or "")
        builds_dir = str(args.get("builds_dir") or "")
        if step not in STEPS or not re.match(r"(?:%s)\Z" % builds.NAME, build) or not os.path.isabs(builds_dir):
            return dict(result, failed=True, msg="group_archive: step one of %s, a build name and an absolute "
                        "builds_dir" % ", ".join(STEPS))
        if self._task.check_mode and step in ("record", "verify"):
            return dict(result, msg="check mode: nothing recorded")
        hostvars = task_vars.get("hostvars") or {}
        the_plan = args.get("plan") if isinstance(args.get("plan"), dict) else {}

        def of(name, var):
            found = hostvars.get(name) if name else None
            return found.get(var) if found is not None and hasattr(found, "get") else None

        try:
            if step == "plan":
                state_var = str(args.get("state_var") or "")
                peers = []
                for name in task_vars.get("ansible_play_hosts") or [host]:
                    state = of(str(name), state_var)
                    peers.append((str(name), group_of(of(str(name), "group_names")), identity_of(state),
                                  isinstance(state, dict) and state.get("changed") is True))
                out = plan(host, peers, builds_dir, build, inventory_of(task_vars.get("ansible_inventory_sources")),
                           bool(args.get("verify")))
            elif step == "record":
                keep = [identity_of(of(str(name), str(args.get("state_var") or "")))
                        for name in task_vars.get("ansible_play_hosts") or []
                        if group_of(of(str(name), "group_names")) == the_plan.get("group")]
                out = record_build(host, the_plan, builds_dir, build, str(task_vars.get("rigbook_run_dir") or ""),
                                   str(args.get("claimed_sha256") or ""), [k for k in keep if k])
            elif step == "verify":
                out = verify_build(host, the_plan, builds_dir, build, str(task_vars.get("rigbook_run_dir") or ""),
                                   of(the_plan.get("builder"), RECORDED_VAR))
            else:
                out = take(host, the_plan, builds_dir, build, of(the_plan.get("builder"), RECORDED_VAR),
                           of(the_plan.get("verifier"), VERIFIED_VAR))
            if out.get("why"):
                result["warnings"] = ["%s: %s" % (host, why) for why in out["why"]]
        except Refused as exc:
            return dict(result, failed=True, msg=str(exc), **({"reproduced": False} if step == "verify" else {}))
        except (OSError, ValueError) as exc:
            return dict(result, failed=True, msg="group_archive %s for %s: %s" % (step, host, exc))
        return dict(result, **out)
