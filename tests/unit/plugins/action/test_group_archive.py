"""The controller's side of a group build (action rigbook.homelab.group_archive), through its run() as a play calls
it: a fetched archive hashed and listed by the controller and recorded beside it in builds/ (0600); which box
builds, verifies or installs; an archive installed only on a box of its builder's inventory and group while its
record matches it; builds/ pruned. Each attack: an archive whose sha256 the box misstates, an unsafe one, a record of
another group or inventory, a record whose sha256 differs, a missing or unreadable record, a build that does not
reproduce. The archives are real .tar.gz files made here (facts/builds.pack, as the modules make them).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible_collections.rigbook.homelab.plugins.action import group_archive
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import builds

NAME = "rccl"
ID, OTHER_ID = "0123456789abcdef", "fedcba9876543210"
INV, OTHER_INV = "/home/owner/rigbook/inventory/homelab", "/tmp/copied-inventory"
GROUP_NAMES = ["rigs", "x99_r9700"]
GROUP = "rigs,x99_r9700"
FILES = {"lib/librccl.so.1.0": b"\x7fELF rccl", "bin/all_reduce_perf": b"\x7fELF test",
         ".rigbook-build.json": b'{"name": "rccl"}\n'}


def archive_bytes(files=FILES, links=None) -> bytes:
    entries = [(rel, "bytes", data) for rel, data in files.items()]
    entries += [(rel, "symlink", target) for rel, target in (links or {}).items()]
    return builds.pack(entries)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state(identity=ID, changed=True):
    return {"changed": changed, "identity_id": identity, "archive_glob": f"{NAME}-{identity}-*.tar.gz"}


def hostvars(**hosts):
    """{host: its variables}: each HOSTS value a dict of the check result and overrides."""
    out = {}
    for host, spec in hosts.items():
        out[host] = {"rccl_state": spec.get("state", state()), "group_names": spec.get("groups", GROUP_NAMES)}
        out[host].update(spec.get("vars", {}))
    return out


def act(step, host, hvars, builds_dir, check=False, inventory=INV, **args):
    """The action's run() for HOST as the play calls it; returns its result."""
    task = SimpleNamespace(args={"step": step, "name": NAME, "builds_dir": str(builds_dir), "state_var": "rccl_state",
                                 **args}, async_val=0, check_mode=check, action="rigbook.homelab.group_archive")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/unused"))
    action = group_archive.ActionModule(task, connection, None, None, None)
    task_vars = {"inventory_hostname": host, "ansible_play_hosts": list(hvars), "hostvars": hvars,
                 "group_names": hvars[host]["group_names"], "ansible_inventory_sources": [inventory],
                 "rigbook_run_dir": "/state/runs/20250101-site"}
    return action.run(task_vars=task_vars)


@pytest.fixture
def builds_dir(tmp_path):
    folder = tmp_path / "state" / "builds"
    folder.mkdir(parents=True)
    return folder


def build_and_record(builds_dir, hvars, host="a", data=None, claimed=None, inventory=INV):
    """HOST builds (its plan says so), its archive lands where the plan says, the controller records it."""
    data = archive_bytes() if data is None else data
    plan = act("plan", host, hvars, builds_dir, inventory=inventory)
    assert plan["part"] == "build", plan
    Path(plan["incoming"]).parent.mkdir(exist_ok=True)
    Path(plan["incoming"]).write_bytes(data)
    recorded = act("record", host, hvars, builds_dir, plan=plan, inventory=inventory,
                   claimed_sha256=sha(data) if claimed is None else claimed)
    return plan, recorded


def record_file(builds_dir, data=None, identity=ID, inventory=INV, group=GROUP) -> Path:
    archive = builds.archive_name(NAME, identity, sha(archive_bytes() if data is None else data))
    return builds_dir / builds.provenance_name(archive, builds.provenance_key(inventory, group))


# --- the record: the controller's hash and listing, beside the archive ------------------------------------------

def test_the_builder_s_archive_is_hashed_listed_and_recorded_by_the_controller(builds_dir):
    hvars = hostvars(a={}, b={})
    data = archive_bytes(links={"lib/librccl.so": "librccl.so.1.0"})
    plan, recorded = build_and_record(builds_dir, hvars, data=data)
    assert not recorded.get("failed"), recorded
    archive = builds_dir / f"{NAME}-{ID}-{sha(data)}.tar.gz"
    assert archive.read_bytes() == data and not Path(plan["incoming"]).exists()
    assert recorded["archive"] == archive.name and recorded["sha256"] == sha(data)
    path = record_file(builds_dir, data)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(archive.stat().st_mode) == 0o600
    record = json.loads(path.read_text())
    assert {k: record[k] for k in ("host", "group", "inventory", "run_dir", "identity_id", "build", "sha256")} == {
        "host": "a", "group": GROUP, "inventory": INV, "run_dir": "/state/runs/20250101-site", "identity_id": ID,
        "build": NAME, "sha256": sha(data)}
    assert record["manifest"] == {rel: {"size": len(body), "sha256": sha(body)} for rel, body in FILES.items()}
    assert record["links"] == {"lib/librccl.so": "librccl.so.1.0"}
    assert recorded["install_files"] == {rel: sha(body) for rel, body in FILES.items()}
    assert not [p for p in builds_dir.iterdir() if p.name.startswith(".") and p.is_file()]  # no temporary left


def test_a_box_that_misstates_its_archive_s_sha256_is_refused_and_nothing_is_recorded(builds_dir):
    hvars = hostvars(a={}, b={})
    plan, recorded = build_and_record(builds_dir, hvars, claimed="ab" * 32)
    assert recorded["failed"] and recorded["msg"] == (
        f"a says its archive's sha256 is {'ab' * 32}, the controller got {sha(archive_bytes())} from what it fetched")
    assert sorted(p.name for p in builds_dir.rglob("*") if p.is_file()) == []


def test_an_unsafe_archive_is_refused_by_the_controller_naming_the_member(builds_dir):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, target in (("x", "."), ("x/y", "../../outside")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    _plan, recorded = build_and_record(builds_dir, hostvars(a={}), data=raw.getvalue())
    assert recorded["failed"] and recorded["msg"] == (
        "a's archive is refused: unsafe archive, member 'x/y' lies under the symlink 'x'")
    assert [p for p in builds_dir.rglob("*") if p.is_file()] == []


def test_an_archive_that_did_not_arrive_fails_the_record(builds_dir):
    plan = act("plan", "a", hostvars(a={}), builds_dir)
    recorded = act("record", "a", hostvars(a={}), builds_dir, plan=plan)
    assert recorded["failed"] and "a's archive did not reach the controller" in recorded["msg"]


# --- the plan: who builds, who verifies, who installs -------------------------------------------------------------

def test_the_first_due_box_of_each_group_builds_and_the_others_install(builds_dir):
    hvars = hostvars(a={}, b={}, c={"groups": ["rigs", "x99_3080"]}, d={"state": state(changed=False)},
                     e={"state": state(OTHER_ID)})
    parts = {h: act("plan", h, hvars, builds_dir) for h in hvars if h != "d"}
    assert {h: p["part"] for h, p in parts.items()} == {"a": "build", "b": "install", "c": "build", "e": "build"}
    assert parts["b"]["builder"] == "a" and parts["c"]["group"] == "rigs,x99_3080"
    assert len({p["incoming"] for p in parts.values()}) == 4  # each fetch lands in a place of its own


def test_a_change_that_builds_nothing_is_built_on_its_own(builds_dir):
    plan = act("plan", "a", hostvars(a={"state": {"changed": True, "identity_id": ""}}), builds_dir)
    assert plan["part"] == "own" and not plan.get("failed")


def test_with_a_usable_archive_nobody_builds_and_with_verify_the_first_due_box_builds_again(builds_dir):
    hvars = hostvars(a={}, b={}, c={})
    build_and_record(builds_dir, hvars)
    plain = {h: act("plan", h, hvars, builds_dir)["part"] for h in hvars}
    assert plain == {"a": "install", "b": "install", "c": "install"}
    verified = {h: act("plan", h, hvars, builds_dir, verify=True) for h in hvars}
    assert {h: p["part"] for h, p in verified.items()} == {"a": "verify", "b": "install", "c": "install"}
    assert verified["b"]["archive"] == f"{NAME}-{ID}-{sha(archive_bytes())}.tar.gz"


def test_verify_with_one_box_says_it_is_not_verified(builds_dir):
    plan = act("plan", "a", hostvars(a={}), builds_dir, verify=True)
    assert plan["part"] == "build" and plan["verifier"] is None
    assert plan["warnings"] == ["a: not verified: no other box of group rigs,x99_r9700 needs this build in this run"]


# --- take: which archive an installing box gets, and when none -----------------------------------------------------

def test_a_twin_takes_the_recorded_archive_with_the_controller_s_manifest(builds_dir):
    hvars = hostvars(a={}, b={})
    _plan, recorded = build_and_record(builds_dir, hvars)
    hvars["a"]["group_build_recorded"] = recorded
    plan = act("plan", "b", hvars, builds_dir)
    assert plan["part"] == "install" and plan["archive"] == recorded["archive"]  # recorded: usable at once
    took = act("take", "b", hvars, builds_dir, plan=plan)
    assert took["use"] is True and took["archive"] == str(builds_dir / recorded["archive"])
    assert took["install_files"] == {rel: sha(body) for rel, body in FILES.items()} and took["builder"] == "a"


def test_a_record_of_another_group_or_inventory_is_not_used(builds_dir):
    hvars = hostvars(a={}, b={})
    build_and_record(builds_dir, hvars)
    # a box of another group finds no record for its group: it builds its own
    other = hostvars(a={"groups": ["rigs", "x99_3080"]}, b={"groups": ["rigs", "x99_3080"]})
    plan = act("plan", "b", other, builds_dir)
    archive = f"{NAME}-{ID}-{sha(archive_bytes())}.tar.gz"
    assert (plan["part"], plan["builder"], plan["archive"]) == ("install", "a", "")  # a builds for that group
    assert plan["warnings"] == [f"b: {archive}: not used: it has no provenance record for this inventory and group "
                                f"({builds.provenance_name(archive, builds.provenance_key(INV, 'rigs,x99_3080'))})"]
    # the record copied to where that group's would be: its words still name the group it was made for
    os.link(record_file(builds_dir), record_file(builds_dir, group="rigs,x99_3080"))
    plan = act("plan", "b", other, builds_dir)
    assert plan["builder"] == "a" and plan["warnings"] == [
        f"b: {archive}: not used: its provenance record is of group {GROUP}, this box's is rigs,x99_3080"]
    # and one of another inventory (a copy of the inventory elsewhere)
    os.link(record_file(builds_dir), record_file(builds_dir, inventory=OTHER_INV))
    plan = act("plan", "b", hvars, builds_dir, inventory=OTHER_INV)
    assert plan["builder"] == "a" and plan["warnings"] == [
        f"b: {archive}: not used: its provenance record is of inventory {INV}, this box's is {OTHER_INV}"]


def test_an_archive_changed_in_builds_is_not_used_and_the_twin_builds_its_own(builds_dir):
    hvars = hostvars(a={}, b={})
    _plan, recorded = build_and_record(builds_dir, hvars)
    hvars["a"]["group_build_recorded"] = recorded
    archive = builds_dir / recorded["archive"]
    changed = archive_bytes({**FILES, "lib/librccl.so.1.0": b"\x7fELF changed"})
    archive.write_bytes(changed)  # a changed .so, under the old name
    plan = act("plan", "b", hvars, builds_dir)
    assert (plan["part"], plan["builder"], plan["archive"]) == ("install", "a", "")  # nothing usable: a builds again
    message = f"its sha256 is now {sha(changed)}, its provenance record says {recorded['sha256']}"
    assert plan["warnings"] == [f"b: {archive.name}: not used: {message}"]
    # the twin, when its builder's archive changed between the record and the copy: it builds its own, saying why
    took = act("take", "b", hvars, builds_dir, plan=plan)
    assert took["use"] is False and took["warnings"] == [
        f"b: {archive.name}: not used: {message}; this box builds its own"]


@pytest.mark.parametrize("damage, why", [
    ("missing", "it has no provenance record for this inventory and group"),
    ("garbled", "its provenance record cannot be read ("),
    ("not-an-object", "is not a JSON object"),
    ("other-sha256", "its provenance record is of another archive (sha256 " + "0" * 64 + ")"),
    ("manifest-out", "its provenance record's manifest entry '../../etc/passwd' is no relative path"),
    ("link", "is a link"),
])
def test_a_record_that_is_missing_unreadable_or_of_other_bytes_means_the_archive_is_not_used(builds_dir, damage, why):
    hvars = hostvars(a={}, b={})
    _plan, recorded = build_and_record(builds_dir, hvars)
    hvars["a"]["group_build_recorded"] = recorded
    path = record_file(builds_dir)
    record = json.loads(path.read_text())
    if damage == "missing":
        path.unlink()
    elif damage == "garbled":
        path.write_bytes(b"\x00{not json")
    elif damage == "not-an-object":
        path.write_text("[1, 2]")
    elif damage == "other-sha256":
        path.write_text(json.dumps({**record, "sha256": "0" * 64}))
    elif damage == "manifest-out":
        path.write_text(json.dumps({**record, "manifest": {"../../etc/passwd": {"size": 1, "sha256": "0" * 64}}}))
    else:
        moved = path.with_name("elsewhere.json")
        path.rename(moved)
        path.symlink_to(moved)
    plan = act("plan", "b", hvars, builds_dir)
    assert plan["archive"] == "" and len(plan["warnings"]) == 1 and why in plan["warnings"][0], plan
    took = act("take", "b", hvars, builds_dir, plan=plan)  # its builder's record, read again
    assert took["use"] is False and "install_files" not in took and why in took["warnings"][0], took
    assert "\x00" not in took["warnings"][0]


# --- verify: a second box's build must be the same bytes ---------------------------------------------------------

def verified_run(builds_dir, other_data):
    hvars = hostvars(a={}, b={}, c={})
    plans = {h: act("plan", h, hvars, builds_dir, verify=True) for h in hvars}
    assert {h: p["part"] for h, p in plans.items()} == {"a": "build", "b": "verify", "c": "install"}
    for host, data in (("a", archive_bytes()), ("b", other_data)):
        Path(plans[host]["incoming"]).parent.mkdir(exist_ok=True)
        Path(plans[host]["incoming"]).write_bytes(data)
    hvars["a"]["group_build_recorded"] = act("record", "a", hvars, builds_dir, plan=plans["a"])
    hvars["b"]["group_build_verified"] = act("verify", "b", hvars, builds_dir, plan=plans["b"])
    return hvars, plans, act("take", "c", hvars, builds_dir, plan=plans["c"])


def test_a_build_that_reproduces_is_added_to_the_record_and_installed_on_the_others(builds_dir):
    hvars, plans, took = verified_run(builds_dir, archive_bytes())
    assert hvars["b"]["group_build_verified"]["reproduced"] is True
    record = json.loads(record_file(builds_dir).read_text())
    assert record["host"] == "a" and [v["host"] for v in record["verified_by"]] == ["b"]
    assert took["use"] is True and not Path(plans["b"]["incoming"]).exists()


def test_a_build_that_does_not_reproduce_fails_naming_both_boxes_and_digests_and_nobody_installs_it(builds_dir):
    other = archive_bytes({**FILES, "bin/all_reduce_perf": b"\x7fELF test, built elsewhere"})
    hvars, plans, took = verified_run(builds_dir, other)
    verified = hvars["b"]["group_build_verified"]
    message = (f"the build rccl of group {GROUP} did not reproduce: a built sha256 {sha(archive_bytes())}, b built "
               f"sha256 {sha(other)} (its archive is kept at {plans['b']['incoming']})")
    assert verified["failed"] and verified["reproduced"] is False and verified["msg"] == message
    assert took["failed"] and took["msg"] == f"not installed: {message}" and "install_files" not in took


def test_a_verifier_that_did_not_finish_means_the_others_build_their_own(builds_dir):
    hvars = hostvars(a={}, b={}, c={})
    plans = {h: act("plan", h, hvars, builds_dir, verify=True) for h in hvars}
    Path(plans["a"]["incoming"]).parent.mkdir(exist_ok=True)
    Path(plans["a"]["incoming"]).write_bytes(archive_bytes())
    hvars["a"]["group_build_recorded"] = act("record", "a", hvars, builds_dir, plan=plans["a"])
    took = act("take", "c", hvars, builds_dir, plan=plans["c"])  # b's build failed: nothing registered
    assert took["use"] is False and took["warnings"] == ["c: b did not finish the verifying build: this box builds "
                                                         "its own"]


# --- pruning: builds/ holds what the inventory still pins -----------------------------------------------------------

def test_builds_keeps_what_the_boxes_are_at_and_drops_older_identities_of_this_inventory_and_group(builds_dir):
    old = archive_bytes({**FILES, "lib/librccl.so.1.0": b"\x7fELF old"})
    build_and_record(builds_dir, hostvars(a={"state": state(OTHER_ID)}), data=old)  # an earlier pin
    kept_elsewhere = archive_bytes({**FILES, "lib/librccl.so.1.0": b"\x7fELF copied inventory"})
    build_and_record(builds_dir, hostvars(a={"state": state(OTHER_ID)}), data=kept_elsewhere, inventory=OTHER_INV)
    other_group = hostvars(a={"state": state(OTHER_ID), "groups": ["x99_3080"]})
    build_and_record(builds_dir, other_group, data=old)  # the same archive, recorded for another group too
    stray = builds_dir / builds.archive_name(NAME, "1" * 16, "2" * 64)
    stray.write_bytes(b"an archive no record names")
    unrelated = builds_dir / builds.archive_name("nccl-tests", OTHER_ID, "3" * 64)
    unrelated.write_bytes(b"another build")
    before = sorted(p.name for p in builds_dir.iterdir() if p.is_file())
    _plan, recorded = build_and_record(builds_dir, hostvars(a={}, b={}))  # the new pin, in this inventory and group
    after = sorted(p.name for p in builds_dir.iterdir() if p.is_file())
    old_record = record_file(builds_dir, old, OTHER_ID).name
    assert sorted(recorded["pruned"]) == sorted([old_record, stray.name])
    assert sorted(set(before) - set(after)) == sorted([old_record, stray.name])
    # kept: the old archive (another group's record names it), the copied inventory's, the other build's
    assert record_file(builds_dir, old, OTHER_ID, group="x99_3080").exists()
    assert record_file(builds_dir, kept_elsewhere, OTHER_ID, inventory=OTHER_INV).exists() and unrelated.exists()


def test_an_identity_a_box_of_the_group_is_still_at_is_kept(builds_dir):
    build_and_record(builds_dir, hostvars(a={"state": state(OTHER_ID)}))
    hvars = hostvars(a={}, b={"state": state(OTHER_ID, changed=False)})  # b is at the older build
    _plan, recorded = build_and_record(builds_dir, hvars, data=archive_bytes({**FILES, "x": b"new"}))
    assert recorded["pruned"] == [] and record_file(builds_dir, identity=OTHER_ID).exists()


# --- the action's own arguments ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [{"step": "delete"}, {"name": "../x"}, {"builds_dir": "relative/builds"}])
def test_bad_arguments_fail_with_one_line(builds_dir, args):
    task = SimpleNamespace(args={"step": "plan", "name": NAME, "builds_dir": str(builds_dir), **args}, async_val=0,
                           check_mode=False, action="rigbook.homelab.group_archive")
    action = group_archive.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/")), None, None, None)
    result = action.run(task_vars={"inventory_hostname": "a"})
    assert result["failed"] and result["msg"] == ("group_archive: step one of plan, record, verify, take, a build "
                                                  "name and an absolute builds_dir")


def test_check_mode_records_nothing(builds_dir):
    plan = act("plan", "a", hostvars(a={}), builds_dir)
    Path(plan["incoming"]).parent.mkdir()
    Path(plan["incoming"]).write_bytes(archive_bytes())
    result = act("record", "a", hostvars(a={}), builds_dir, check=True, plan=plan)
    assert not result.get("failed") and result["msg"] == "check mode: nothing recorded"
    assert [p.name for p in builds_dir.iterdir() if p.is_file()] == []
