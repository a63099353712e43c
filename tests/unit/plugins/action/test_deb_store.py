"""The controller's store of a distribution kernel's .debs (action rigbook.homelab.deb_store), through its run() as the
kernel role calls it: plan (the packages per OS, the keep patterns, the records handed to a box), record (each file the
box kept hashed by the controller, stored under that sha256 only when it is the one the box's package index names;
a mismatch refused with nothing recorded), take (each stored file re-hashed before a box gets it). The .debs are
stand-in bytes written here: the store reads them as files, never as packages.
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible_collections.rigbook.homelab.plugins.action import deb_store as action
from ansible_collections.rigbook.homelab.plugins.module_utils import deb_store

R = "7.0.0-31-generic"
V = "7.0.0-31.31~24.04.1"
IMAGE, MODULES, COMMON = f"linux-image-{R}", f"linux-modules-{R}", "linux-hwe-7.0-headers-7.0.0-31"
DEBS = {IMAGE: b"!<arch>\nimage", MODULES: b"!<arch>\nmodules", COMMON: b"!<arch>\ncommon headers"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def act(step, host, store_dir, check=False, **args):
    """The action's run() for HOST as the kernel role calls it; returns its result."""
    task = SimpleNamespace(args={"step": step, "release": R, "store_dir": str(store_dir) if store_dir else "",
                                 **args}, async_val=0, check_mode=check, action="rigbook.homelab.deb_store")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/unused"))
    plugin = action.ActionModule(task, connection, None, None, None)
    return plugin.run(task_vars={"inventory_hostname": host, "rigbook_run_dir": "/state/runs/20250101-site"})


@pytest.fixture
def store(tmp_path):
    return tmp_path / "state" / "builds" / "debs"


def kept_entry(name, index=None, claimed=None, arch="amd64"):
    data = DEBS[name]
    return {"name": name, "version": V, "architecture": arch, "path": f"/var/cache/apt/archives/{name}_{V}_{arch}.deb",
            "sha256": claimed or sha(data), "index_sha256": [sha(data)] if index is None else index}


def keep(store, host, entries, data=None):
    """HOST's plan, its kept .debs fetched where the plan says (N.deb), then the record step."""
    plan = act("plan", host, store, os_id="ubuntu", packages=[IMAGE, f"linux-headers-{R}"])
    incoming = Path(plan["incoming"])
    incoming.mkdir(parents=True, exist_ok=True)
    for index, entry in enumerate(entries):
        (incoming / f"{index}.deb").write_bytes((data or DEBS)[entry["name"]])
    return act("record", host, store, architecture="amd64", kept=entries), incoming


def test_plan_without_a_store_keeps_nothing_and_names_the_packages_per_os():
    got = act("plan", "rig-a", "", os_id="ubuntu", packages=[IMAGE, f"linux-headers-{R}"])
    assert not got.get("failed"), got
    assert got["packages"] == [IMAGE, MODULES, f"linux-modules-extra-{R}", f"linux-headers-{R}"]
    assert got["keep"] == [] and got["records"] == [] and got["changed"] is False
    debian = act("plan", "rig-a", "", os_id="debian", release="6.1.0-47-amd64", packages=["linux-image-6.1.0-47-amd64"])
    assert debian["packages"] == ["linux-image-6.1.0-47-amd64"]


def test_the_first_box_s_debs_are_stored_under_the_controller_s_sha256_and_recorded(store):
    entries = [kept_entry(IMAGE), kept_entry(MODULES), kept_entry(COMMON)]
    got, incoming = keep(store, "rig-a", entries)
    assert not got.get("failed"), got
    assert got["stored"] == [IMAGE, MODULES, COMMON]
    for data in DEBS.values():
        target = store / f"{sha(data)}.deb"
        assert target.read_bytes() == data and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert list(incoming.iterdir()) == []  # nothing left behind
    record = json.loads((store / f"{R}_amd64.json").read_text())
    assert stat.S_IMODE((store / f"{R}_amd64.json").stat().st_mode) == 0o600
    assert record["packages"][IMAGE] | {"recorded": "-"} == {
        "version": V, "architecture": "amd64", "sha256": sha(DEBS[IMAGE]), "index_sha256": sha(DEBS[IMAGE]),
        "claimed_sha256": sha(DEBS[IMAGE]), "claim_matches": True, "size": len(DEBS[IMAGE]), "host": "rig-a",
        "run_dir": "/state/runs/20250101-site", "recorded": "-"}
    # what the box is handed back (to write its note): versions and sha256, nothing about who recorded it
    assert got["records"] == [{"release": R, "architecture": "amd64", "packages": {
        n: {"version": V, "architecture": "amd64", "sha256": sha(d)} for n, d in DEBS.items()}}]
    # a later box's plan hands it the same record
    plan = act("plan", "rig-b", store, os_id="ubuntu", packages=[IMAGE])
    assert plan["records"] == got["records"] and plan["why"] == []
    assert plan["keep"] == [IMAGE, MODULES, f"linux-modules-extra-{R}", "linux-*headers-7.0.0-31",
                            "linux-headers-7.0.0-31-common"]


def test_a_box_s_claim_is_only_recorded_the_controller_s_hash_decides(store):
    got, _ = keep(store, "rig-a", [kept_entry(IMAGE, claimed="cd" * 32)])
    assert not got.get("failed"), got
    entry = json.loads((store / f"{R}_amd64.json").read_text())["packages"][IMAGE]
    assert entry["sha256"] == sha(DEBS[IMAGE]) and entry["claimed_sha256"] == "cd" * 32
    assert entry["claim_matches"] is False


def test_a_file_whose_sha256_is_not_the_package_index_s_is_refused_and_nothing_recorded(store):
    tampered = dict(DEBS, **{MODULES: b"!<arch>\nmodules with a payload"})
    entries = [kept_entry(IMAGE), kept_entry(MODULES)]  # the index names the real modules .deb's sha256
    got, incoming = keep(store, "rig-a", entries, data=tampered)
    assert got["failed"] is True
    assert got["msg"] == (f"{MODULES} {V} from rig-a: refused: the controller got sha256 {sha(tampered[MODULES])} "
                          f"from the file, the package index apt read on the box names {sha(DEBS[MODULES])} (the file "
                          f"is kept at {incoming / '1.deb'})")
    assert not (store / f"{R}_amd64.json").exists()
    assert not any(p.suffix == ".deb" for p in store.iterdir())  # not even the good image: nothing stored


def test_a_version_no_index_lists_is_not_stored_and_said(store):
    got, _ = keep(store, "rig-a", [kept_entry(IMAGE), kept_entry(COMMON, index=[])])
    assert not got.get("failed"), got
    assert got["stored"] == [IMAGE]
    assert got["warnings"] == [f"rig-a: {COMMON} {V}: not stored: no package index on rig-a lists that version "
                               "(apt-cache show), so nothing vouches for the file; a later box can install it only "
                               "while the archive offers it"]
    assert list(json.loads((store / f"{R}_amd64.json").read_text())["packages"]) == [IMAGE]


def test_a_second_box_of_one_run_adds_nothing_and_one_with_other_bytes_is_refused(store):
    keep(store, "rig-a", [kept_entry(IMAGE)])
    before = (store / f"{R}_amd64.json").read_text()
    again, _ = keep(store, "rig-b", [kept_entry(IMAGE)])
    assert not again.get("failed") and again["stored"] == [] and again["msg"] == "rig-b: nothing new stored"
    assert (store / f"{R}_amd64.json").read_text() == before
    other = dict(DEBS, **{IMAGE: b"!<arch>\nanother build of the same version"})
    lying, _ = keep(store, "rig-c", [kept_entry(IMAGE, index=[sha(other[IMAGE])])], data=other)
    assert lying["failed"] is True and "two indexes disagree about one version" in lying["msg"]
    assert sha(DEBS[IMAGE]) in lying["msg"] and "recorded from rig-a" in lying["msg"]
    assert (store / f"{R}_amd64.json").read_text() == before


def test_a_kept_entry_of_another_shape_or_a_file_that_did_not_arrive_is_refused(store):
    bad = dict(kept_entry(IMAGE), version="1.0 $(reboot)")
    got, _ = keep(store, "rig-a", [bad])
    assert got["failed"] is True and got["msg"] == "rig-a's kept entry 0 is no package with a version and architecture"
    plan = act("plan", "rig-b", store, os_id="ubuntu", packages=[IMAGE])
    missing = act("record", "rig-b", store, architecture="amd64", kept=[kept_entry(IMAGE)])
    assert missing["failed"] is True
    assert missing["msg"] == (f"rig-b's .deb of {IMAGE} {V} did not reach the controller "
                              f"({Path(plan['incoming']) / '0.deb'})")


def test_check_mode_records_nothing(store):
    got = act("record", "rig-a", store, check=True, architecture="amd64", kept=[kept_entry(IMAGE)])
    assert not got.get("failed") and got["msg"] == "check mode: nothing recorded" and not store.exists()


def test_take_hands_out_each_stored_file_re_hashed_and_refuses_a_changed_one(store):
    keep(store, "rig-a", [kept_entry(IMAGE), kept_entry(MODULES)])
    got = act("take", "rig-b", store, architecture="amd64", names=[IMAGE, MODULES], dest_dir="/var/cache/rigbook/kd")
    assert not got.get("failed"), got
    assert got["files"][0] == {"name": IMAGE, "version": V, "sha256": sha(DEBS[IMAGE]),
                               "src": str(store / f"{sha(DEBS[IMAGE])}.deb"), "file": f"{IMAGE}_{V}_amd64.deb",
                               "path": f"/var/cache/rigbook/kd/{IMAGE}_{V}_amd64.deb"}
    assert got["artifacts"] == [{"path": f["path"], "sha256": f["sha256"]} for f in got["files"]]
    # the check mode of a converge runs it too: it only reads
    assert act("take", "rig-b", store, check=True, architecture="amd64", names=[IMAGE],
               dest_dir="/var/cache/rigbook/kd")["files"][0]["sha256"] == sha(DEBS[IMAGE])
    changed, swapped = store / f"{sha(DEBS[MODULES])}.deb", b"!<arch>\nswapped in the store"
    changed.write_bytes(swapped)
    refused = act("take", "rig-b", store, architecture="amd64", names=[IMAGE, MODULES], dest_dir="/x")
    assert refused["failed"] is True
    assert refused["msg"] == (f"{MODULES} {V}: the store's file {changed} has sha256 "
                              f"{sha(swapped)} now, its record says "
                              f"{sha(DEBS[MODULES])}")


def test_take_without_a_record_or_of_an_unrecorded_package_fails_naming_it(store):
    none = act("take", "rig-b", store, architecture="amd64", names=[IMAGE], dest_dir="/x")
    assert none["failed"] is True and none["msg"] == f"the store holds no record of {R} for amd64"
    keep(store, "rig-a", [kept_entry(IMAGE)])
    other = act("take", "rig-b", store, architecture="amd64", names=[MODULES], dest_dir="/x")
    assert other["failed"] is True and other["msg"] == f"the store's record of {R} for amd64 has no package {MODULES}"


def test_a_garbled_record_is_named_by_plan_and_refused_by_record(store):
    store.mkdir(parents=True)
    (store / f"{R}_amd64.json").write_text('{"format": 1, "release": "' + R + '"')
    plan = act("plan", "rig-a", store, os_id="ubuntu", packages=[IMAGE])
    assert plan["records"] == [] and len(plan["warnings"]) == 1
    assert plan["warnings"][0].startswith(f"rig-a: {R}_amd64.json: not used: the store's record ")
    got, _ = keep(store, "rig-a", [kept_entry(IMAGE)])
    assert got["failed"] is True and "cannot be read" in got["msg"]


@pytest.mark.parametrize("args,msg", [
    ({"step": "nosuch"}, "deb_store: step one of plan, record, take, a kernel release ('7.0.0-31-generic') and an "
                         "absolute store_dir or none"),
    ({"release": "../../etc"}, "deb_store: step one of plan, record, take, a kernel release ('../../etc') and an "
                               "absolute store_dir or none"),
    ({"step": "take", "store_dir": ""}, "deb_store take: no store_dir"),
    ({"step": "record", "architecture": "AMD 64"}, "deb_store record: no architecture ('AMD 64')"),
])
def test_bad_arguments_are_named_without_a_traceback(store, args, msg):
    step = args.pop("step", "plan")
    got = act(step, "rig-a", args.pop("store_dir", store), **args)
    assert got["failed"] is True and got["msg"] == msg


def test_the_store_names_no_file_after_a_box(store):
    """Where a box's files land is a name of the controller's: a host name cannot walk out of the store."""
    plan = act("plan", "../../../etc", store, os_id="ubuntu", packages=[IMAGE])
    assert Path(plan["incoming"]).parent == store / ".incoming"
    assert deb_store.deb_name(sha(b"x")) == sha(b"x") + ".deb"
