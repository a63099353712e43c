"""`provision adopt` of seed 004's box as its owner built it, on a two-host lab of its own (marker: lab): lab-r9700 set
up by hand (`provision lab handmade --as-seed 004`: the kernel .debs with dpkg -i, ROCm from amdgpu-install's own
apt sources - rocm.list, amdgpu.list, /etc/apt/keyrings/rocm.gpg -, the patched RCCL built in the owner's home, the
engine started as `sglang serve` from the owner's shell with HSA_ENABLE_IPC_MODE_LEGACY=0, NCCL_P2P_LEVEL=PHB and the
patched RCCL preloaded). In order, each test building on the one before:

1. adopt reads it and changes nothing on it: the ROCm and graphics repositories from amdgpu-install's sources (with
   the keyring's sha256), the engine's profile and environment; what it cannot pin (the RCCL source) is listed and
   filled in here from the lab's artifacts.
2. check mode says what the converge changes beyond rigbook's own files, with the reason: amdgpu-install's sources
   disabled (apt refuses two entries for one repository with different keys); no package installed. The converge
   then leaves one source per repository (apt-get update works), keeps the owner's files as backups, runs the
   engine as rigbook's unit, passes the ladder (P2P expected: isAllDirectP2p 1), and a re-run changes nothing.
3. lab-r9700-2, a fresh host, converged from the adopted pins (the ROCm key as the adopt note says: the box's own
   keyring is a file of that box), and `provision diff` of the two is clean apart from host-unique items.

Only 127.0.0.0/8 is contacted.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from helpers.cli import REPO, changed_tasks, provision, tree_listing
from helpers.handmade_box import ENGINES, VOLATILE
from helpers.lab_host import LAB_MARKS, LabHost
from helpers.owner_inventory import owner_inventory

from rigbook.adopt import emit
from rigbook.lab import handmade

pytestmark = LAB_MARKS
BOX, TWIN, GROUP = "lab-r9700", "lab-r9700-2", "x99_r9700"
SOURCES = "/etc/apt/sources.list.d"


def _inventory(generated: str) -> Path:
    """The inventory seed 004's owner writes: the lab's host and connection, the group's rig, GPUs and P2P
    (inventory/lab's x99_r9700.yml without its pins and serve profile: adopt writes those), the owner as serve_user."""
    return owner_inventory(generated, GROUP, {"serve_user": handmade.OWNER})


def _adopted(inv: Path) -> Path:
    return inv / f"group_vars/{GROUP}/adopted.yml"


def test_adopt_reads_seed_004s_box_and_changes_nothing_on_it(seed_004_box):
    inv = _inventory(seed_004_box)
    box = LabHost(BOX)
    made = provision("lab", "handmade", BOX, "--as-seed", "004", timeout=900)
    assert made.returncode == 0, made.stdout + made.stderr
    by_hand = int(box.out(ENGINES).strip())

    before = tree_listing(box.host.root, skip=[box.host.root / p for p in VOLATILE])
    adopt = provision("adopt", BOX, "-i", inv, "--group", "--debs-dir", "/root/kernel-debs", timeout=600)
    after = tree_listing(box.host.root, skip=[box.host.root / p for p in VOLATILE])
    assert adopt.returncode in (0, 1), adopt.stdout[-3000:] + adopt.stderr[-3000:]
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert changed == [], changed[:20]
    assert int(box.out(ENGINES).strip()) == by_hand

    data = emit.load(_adopted(inv).read_text())
    rocm = data["rigbook_pins"]["rocm"]
    # amdgpu-install's sources: both repositories, the keyring on the box with its sha256
    keyring = box.out("sha256sum /etc/apt/keyrings/rocm.gpg").split()[0]
    assert rocm["version"] == "7.1.0"
    assert (rocm["repo"]["url"], rocm["repo"]["suite"], rocm["repo"]["key_sha256"]) == (
        handmade.ROCM_REPO, "noble", keyring)
    assert rocm["dkms"] is False and "amdgpu_repo" not in rocm  # no amdgpu-dkms here: its repository not needed
    assert "/etc/apt/sources.list.d/rocm.list" in _adopted(inv).read_text()
    [profile] = data["rigbook_serve"]
    assert profile["tp_size"] == 2 and profile["env"]["NCCL_P2P_LEVEL"] == "PHB"
    assert profile["env"]["HSA_ENABLE_IPC_MODE_LEGACY"] == "0"
    assert "p2pdma_allow" in adopt.stdout  # the custom kernel's P2PDMA allow list: not readable, named
    assert profile["env"]["LD_PRELOAD"] == handmade.RCCL_LIBRARY  # the owner's RCCL in front: kept, and said
    assert f"LD_PRELOAD puts {handmade.RCCL_LIBRARY} in front of the engine's own NCCL/RCCL" in adopt.stdout
    assert profile["speculative"] == {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}

    # The owner fills in what the list names, as inventory/lab has it: the RCCL source the build in their home came
    # from (its tarball and the collection's patch), where the wheels are, the lab's compiler.
    lab = yaml.safe_load((REPO / f"inventory/lab/group_vars/{GROUP}.yml").read_text())
    pins = data["rigbook_pins"]
    pins["rccl"] = lab["rigbook_pins"]["rccl"]
    pins["kernel"]["p2pdma_allow"] = lab["rigbook_pins"]["kernel"]["p2pdma_allow"]
    pins["sglang"].update(wheel_dir=lab["rigbook_pins"]["sglang"]["wheel_dir"], no_deps=True, import_check=False)
    data["rccl_cxx_compiler"] = lab["rccl_cxx_compiler"]
    # RCCL pinned: as the note says, the engine no longer preloads the hand-built one (it runs the verified build)
    del data["rigbook_serve"][0]["env"]["LD_PRELOAD"]
    _adopted(inv).write_text(yaml.safe_dump(data, sort_keys=False))
    ready = provision("validate", "-i", inv)
    assert ready.returncode == 0, ready.stdout + ready.stderr


def test_the_converge_replaces_amdgpu_installs_sources_cleanly_and_serves(seed_004_box):
    inv = _inventory(seed_004_box)
    box = LabHost(BOX)
    by_hand = int(box.out(ENGINES).strip())

    check = provision("site.yml", "-i", inv, "--limit", BOX, "--check", "--diff", "--json", timeout=900)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    tasks = dict(changed_tasks(json.loads(check.stdout)["run_dir"])[BOX])
    said = json.dumps(tasks)
    assert f"would disable {SOURCES}/rocm.list" in said and "apt refuses two" in said
    assert {"rocm.list", "amdgpu.list"} <= set(box.out(f"ls {SOURCES}").split())  # check mode changed no source

    site = provision("site.yml", "-i", inv, "--limit", BOX, "--json", timeout=1800)
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]
    listing = box.out(f"ls {SOURCES}").split()
    assert "rocm.list" not in listing and "rocm.list.rigbook.disabled" in listing
    box.run("apt-get update -q")  # one source per repository: apt accepts them
    ladder = json.loads(site.stdout)["hosts"][BOX]["ladder"]
    assert not [v for v in ladder if v["status"] == "fail"], ladder
    assert {v["layer"]: v["status"] for v in ladder}["serving"] == "pass", ladder
    assert box.run(f"test -d /proc/{by_hand}", check=False).returncode != 0
    [engine] = box.out(ENGINES).split()
    assert box.out("systemctl show -p MainPID --value rigbook-serve-engine.service").strip() == engine
    maps = box.out(f"cat /proc/{engine}/maps")
    assert "librccl" in maps and handmade.RCCL_DIR not in maps  # the roles' RCCL, not the one built by hand

    again = provision("site.yml", "-i", inv, "--limit", BOX, "--json", timeout=900)
    assert again.returncode == 0 and json.loads(again.stdout)["hosts"][BOX]["changed"] == 0, again.stdout[-3000:]


def test_a_twin_from_the_adopted_pins_diffs_clean(seed_004_box):
    inv = _inventory(seed_004_box)
    twin = LabHost(TWIN)
    data = emit.load(_adopted(inv).read_text())
    # as adopt's note says: the box's keyring (/etc/apt/keyrings/rocm.gpg) is a file of that box; a twin gets the key
    # from where it is published (here the lab's repository, as inventory/lab pins it)
    lab = yaml.safe_load((REPO / f"inventory/lab/group_vars/{GROUP}.yml").read_text())["rigbook_pins"]["rocm"]["repo"]
    data["rigbook_pins"]["rocm"]["repo"].update(key_url=lab["key_url"], key_sha256=lab["key_sha256"])
    _adopted(inv).write_text(yaml.safe_dump(data, sort_keys=False))
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["lab"]["children"][GROUP]["hosts"][TWIN]["rigbook_serve"] = [
        {**p, "bind": twin.host.address} for p in data["rigbook_serve"]]  # its serve address is its own
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    site = provision("site.yml", "-i", inv, "--limit", TWIN, "--json", timeout=1800)
    assert site.returncode == 0, site.stdout[-3000:] + site.stderr[-3000:]

    manifest = provision("manifest", "-i", inv, "--limit", GROUP, timeout=600)
    assert manifest.returncode == 0, manifest.stdout[-2000:] + manifest.stderr[-2000:]
    diff = provision("diff", BOX, TWIN, "--json")
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
    result = json.loads(diff.stdout)
    assert result["pinned"] == {}, result["pinned"]
    assert {"host.hostname", "host.machine_id"} <= {row["item"] for row in result["unique"]}
