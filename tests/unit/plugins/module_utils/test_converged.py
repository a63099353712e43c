"""A role's converged state (plugins/module_utils/converged.py): what its tasks check, read from real files, folders
and the group database of this machine; the judgement as data; the state file as hostile input."""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import converged

INPUTS = "a" * 64
OTHER = "b" * 64


def spec(**kinds) -> dict:
    return converged.watch_of(kinds)


def test_a_file_reads_its_content_and_mode_and_an_edit_or_chmod_changes_it(tmp_path):
    target = tmp_path / "51rigbook-unattended-kernel"
    target.write_text("Unattended-Upgrade::Package-Blacklist { };\n")
    watch = spec(files=[str(target)])
    before = converged.read_items(watch)
    assert before == converged.read_items(watch)
    target.write_text("Unattended-Upgrade::Package-Blacklist { \"linux-\"; };\n")
    edited = converged.read_items(watch)
    assert edited != before
    target.chmod(0o600)
    assert converged.read_items(watch) != edited
    target.unlink()
    assert converged.read_items(watch) == {"file:" + str(target): "absent"}


def test_a_link_is_read_as_its_target_never_followed(tmp_path):
    (tmp_path / "real").write_text("x")
    link = tmp_path / "lib64"
    link.symlink_to("lib")
    assert converged.read_items(spec(files=[str(link)])) == {"file:" + str(link): "link lib"}


def test_a_tree_changes_with_any_entry_below_it(tmp_path):
    venv = tmp_path / "venv"
    (venv / "lib" / "site-packages").mkdir(parents=True)
    module = venv / "lib" / "site-packages" / "sglang.py"
    module.write_text("VERSION = '0.5.23'\n")
    watch = spec(trees=[str(venv)])
    first = converged.read_items(watch)
    assert first == converged.read_items(watch)
    assert first["tree:" + str(venv)].startswith("tree ")
    (venv / "lib" / "site-packages" / "extra.pth").write_text("/tmp\n")
    second = converged.read_items(watch)
    assert second != first
    os.utime(module, ns=(1, 1))
    assert converged.read_items(watch) != second
    (venv / "lib" / "bundled.so").symlink_to("/nonexistent")
    assert converged.read_items(watch)["tree:" + str(venv)] is not None  # a dangling link is read as a link


def test_a_tree_too_large_to_walk_has_no_value(tmp_path, monkeypatch):
    folder = tmp_path / "big"
    folder.mkdir()
    for index in range(5):
        (folder / str(index)).write_text("")
    monkeypatch.setattr(converged, "MAX_TREE", 3)
    assert converged.read_items(spec(trees=[str(folder)])) == {"tree:" + str(folder): None}


def test_groups_of_a_user_and_of_no_such_user():
    items = converged.read_items(spec(groups=["root", "no-such-user-here"]))
    assert "root" in items["groups:root"].split()
    assert items["groups:no-such-user-here"] == "absent"


def test_a_package_pattern_lists_every_installed_match():
    listing = {"nvidia-dkms-550": {"version": "550.1", "held": True}, "nvidia-utils-550": {"version": "550.1",
               "held": False}, "nvidia-dkms-*": None, "dkms": None}
    assert converged._package_item(listing, "nvidia-dkms-*") == "nvidia-dkms-550=550.1 held"
    assert converged._package_item(listing, "nvidia-*") == "nvidia-dkms-550=550.1 held, nvidia-utils-550=550.1"
    assert converged._package_item(listing, "dkms") == "absent"
    assert converged._package_item({"dkms": {"version": "3.0.10-8", "held": False}}, "dkms") == "3.0.10-8"


def test_the_watch_keeps_only_absolute_paths_and_names_of_their_shape():
    watch = converged.watch_of({"files": ["/etc/x", "relative", "/etc/../shadow", 7, "/a\nb"],
                                "packages": ["linux-image-6.8.0-45-generic", "bad name", "nvidia-dkms-*"],
                                "units": ["rigbook-serve-qwen.service", "a b"], "groups": ["rigbook", "Bad!"],
                                "boot": "no", "default_target": "True"})
    assert watch["files"] == ["/etc/x"]
    assert watch["packages"] == ["linux-image-6.8.0-45-generic", "nvidia-dkms-*"]
    assert watch["units"] == ["rigbook-serve-qwen.service"]
    assert watch["groups"] == ["rigbook"]
    assert watch["boot"] is False and watch["default_target"] is True
    assert converged.watch_of("not a dict")["files"] == []


def test_the_keys_of_a_state_read_back_as_the_watch_that_made_them(tmp_path):
    watch = spec(files=[str(tmp_path / "a")], trees=[str(tmp_path)], packages=["dkms"], units=["x.service"],
                 groups=["root"], boot=True, default_target=True)
    keys = dict.fromkeys([f"file:{tmp_path / 'a'}", f"tree:{tmp_path}", "package:dkms", "unit:x.service",
                          "groups:root", "boot", "default_target"], "v")
    assert converged.spec_of_items(keys) == watch


@pytest.mark.parametrize("state, inputs, current, converged_, why", [
    (None, INPUTS, {}, False, "no converged state on the box"),
    ({"inputs": OTHER, "items": {}}, INPUTS, {}, False, "the inputs changed"),
    ({"inputs": INPUTS, "items": {"file:/a": "x", "file:/b": "y"}}, INPUTS, {"file:/a": "x", "file:/b": "z"}, False,
     "changed since it converged: file:/b"),
    ({"inputs": INPUTS, "items": {"file:/a": "x"}}, INPUTS, {"file:/a": None}, False, "file:/a"),
    ({"inputs": INPUTS, "items": {"file:/a": "x", "boot": "1"}}, INPUTS, {"file:/a": "x", "boot": "1"}, True,
     "converged: 2 things as the role left them"),
])
def test_the_judgement(state, inputs, current, converged_, why):
    verdict = converged.judge(state, inputs, current)
    assert verdict[0] is converged_
    assert why in verdict[1]


def test_many_changes_are_named_up_to_three():
    items = {f"file:/{n}": "x" for n in range(6)}
    _, why = converged.judge({"inputs": INPUTS, "items": items}, INPUTS, {})
    assert why == "changed since it converged: file:/0, file:/1, file:/2 and 3 more"


def test_a_state_written_is_root_only_and_reads_back(tmp_path):
    target = tmp_path / "grub.cfg"
    target.write_text("GRUB_CMDLINE_LINUX_DEFAULT=iommu=pt\n")
    items = converged.read_items(spec(files=[str(target)]))
    assert converged.write_state("kernel", INPUTS, items, str(tmp_path / "states"), {"venv": "/opt/v"}) is None
    path = tmp_path / "states" / "kernel.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    state = converged.read_state("kernel", str(tmp_path / "states"))
    assert state == {"role": "kernel", "inputs": INPUTS, "items": items, "outputs": {"venv": "/opt/v"}}
    assert converged.judge(state, INPUTS, converged.read_items(converged.spec_of_items(state["items"])))[0]


def test_a_thing_that_could_not_be_read_never_matches_again(tmp_path):
    converged.write_state("rccl", INPUTS, {"file:/a": "x", "tree:/b": None}, str(tmp_path))
    state = converged.read_state("rccl", str(tmp_path))
    assert state["items"]["unread"] == "tree:/b"
    verdict = converged.judge(state, INPUTS, {"file:/a": "x"})
    assert verdict == (False, "changed since it converged: unread")


@pytest.mark.parametrize("data", [
    "not json", [1], {"role": "kernel", "inputs": "short", "items": {}},
    {"role": "../etc", "inputs": INPUTS, "items": {}},
    {"role": "kernel", "inputs": INPUTS, "items": {"k": 3}},
    {"role": "kernel", "inputs": INPUTS, "items": {"k": "x" * 5000}},
    {"role": "kernel", "inputs": INPUTS, "items": dict((f"k{n}", "v") for n in range(converged.MAX_ITEMS + 1))},
    {"role": "kernel", "inputs": INPUTS, "items": {}, "outputs": {"venv": 5}},
    {"role": "kernel", "inputs": INPUTS, "items": {}, "outputs": ["venv"]},
])
def test_a_state_file_of_another_shape_is_no_state(tmp_path, data):
    (tmp_path / "kernel.json").write_text(data if isinstance(data, str) else json.dumps(data))
    assert converged.read_state("kernel", str(tmp_path)) is None


def test_an_output_keeps_one_line_without_control_characters(tmp_path):
    data = {"role": "sglang", "inputs": INPUTS, "items": {},
            "outputs": {"venv": "/opt/rigbook/sglang/v\x1b[31m\nsecond line"}}
    (tmp_path / "sglang.json").write_text(json.dumps(data))
    venv = converged.read_state("sglang", str(tmp_path))["outputs"]["venv"]
    assert "\n" not in venv and "\x1b" not in venv and venv.startswith("/opt/rigbook/sglang/v")


def test_a_state_larger_than_the_bound_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(converged, "MAX_STATE", 64)
    converged.write_state("health", INPUTS, {"file:/a": "x" * 100}, str(tmp_path))
    assert converged.read_state("health", str(tmp_path)) is None


B0, B1 = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


def _booted(root, boot_id):
    """A root whose /proc says BOOT_ID is this boot (a recorded tree, as the evidence root is one)."""
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    return str(root)


def test_after_the_reboot_a_run_made_the_states_its_ladder_vouches_for_hold_for_the_new_boot(tmp_path):
    folder = tmp_path / "converged"
    written = {"kernel": INPUTS, "amd_rocm": INPUTS, "bios_checklist": INPUTS, "rccl": INPUTS,
               "nvidia_p2p_driver": OTHER}
    for role, inputs in written.items():
        items = {"file:/etc/default/grub.d/rigbook.cfg": "sha 644 0 0"}
        if role != "rccl":
            items["boot"] = B0
        assert converged.write_state(role, inputs, items, str(folder), {"venv": "/opt/x"}) is None
    layers = {"firmware": "warn", "kernel_state": "pass", "driver_state": "unknown"}
    carried, left = converged.restamp(list(written), INPUTS, B0, layers, str(folder), _booted(tmp_path / "root", B1))
    assert carried == {"kernel": "kernel_state pass after the reboot",
                       "bios_checklist": "firmware warn after the reboot"}
    assert left == {"amd_rocm": "the ladder judged driver_state unknown after the reboot",
                    "nvidia_p2p_driver": "its state is not this run's (inputs or boot)"}  # rccl watches no boot
    kept = converged.read_state("kernel", str(folder))
    assert kept["items"] == {"file:/etc/default/grub.d/rigbook.cfg": "sha 644 0 0", "boot": B1}
    assert kept["outputs"] == {"venv": "/opt/x"} and kept["inputs"] == INPUTS
    assert converged.read_state("amd_rocm", str(folder))["items"]["boot"] == B0  # runs again at the next run


def test_no_reboot_or_check_mode_carries_nothing(tmp_path):
    folder = tmp_path / "converged"
    converged.write_state("kernel", INPUTS, {"boot": B0}, str(folder))
    same = converged.restamp(["kernel"], INPUTS, B0, {"kernel_state": "pass"}, str(folder),
                             _booted(tmp_path / "root", B0))
    assert same == ({}, {"kernel": "no reboot since this run began"})
    checked = converged.restamp(["kernel"], INPUTS, B0, {"kernel_state": "pass"}, str(folder),
                                _booted(tmp_path / "other", B1), check_mode=True)
    assert checked[0] == {"kernel": "kernel_state pass after the reboot"}
    assert converged.read_state("kernel", str(folder))["items"]["boot"] == B0  # check mode wrote nothing


def test_a_role_s_block_of_a_shared_file_changes_only_with_its_own_lines(tmp_path):
    env = tmp_path / "gpu.env"
    env.write_text("# BEGIN amd_rocm\nHSA_ENABLE_IPC_MODE_LEGACY=0\n# END amd_rocm\n")
    watch = spec(blocks=[f"{env}#amd_rocm", f"{env}#rccl", "relative#rccl", f"{env}#Bad Owner"])
    assert watch["blocks"] == [f"{env}#amd_rocm", f"{env}#rccl"]
    before = converged.read_items(watch)
    assert before[f"block:{env}#rccl"] == "absent"
    env.write_text(env.read_text() + "# BEGIN rccl\nNCCL_P2P_LEVEL=PHB\n# END rccl\n")  # the next role's block
    after = converged.read_items(watch)
    assert after[f"block:{env}#amd_rocm"] == before[f"block:{env}#amd_rocm"]
    assert after[f"block:{env}#rccl"] not in ("absent", None)
    env.write_text(env.read_text().replace("LEGACY=0", "LEGACY=1"))  # a hand edit of amd_rocm's block
    assert converged.read_items(watch)[f"block:{env}#amd_rocm"] != before[f"block:{env}#amd_rocm"]
    env.unlink()
    assert converged.read_items(watch)[f"block:{env}#amd_rocm"] == "absent"
    assert converged.spec_of_items(after)["blocks"] == [f"{env}#amd_rocm", f"{env}#rccl"]
