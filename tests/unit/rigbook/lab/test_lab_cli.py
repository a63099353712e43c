"""`provision lab` argument handling, host planning and the rootfs recipe key (no containers here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rigbook.errors import UserError
from rigbook.lab import cli, rootfs, state


def lab(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rigbook", "lab", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    "args, message",
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["up", "--hosts", "two"], "invalid int value: 'two'"),
        (["up", "--hosts", "0"], "--hosts must be at least 1"),
        (["up", "--hosts", "1", "--rig", "x99-3080", "x99-r9700"], "fewer than the 2 rigs"),
        (["up", "--rig", "x99-9090"], "unknown lab rig 'x99-9090' (known: x99-3080, x99-r9700)"),
        (["up", "--hosts", "9", "--rig", "x99-3080"], "at most 8 hosts per rig"),
        (["break", "lab-3080", "gpu-on-fire"], "unknown fault 'gpu-on-fire' (known: "),
        (["break", "lab-3080"], "the following arguments are required: fault"),
        (["heal"], "the following arguments are required: host"),
        (["up", "--bogus"], "unrecognized arguments: --bogus"),
        (["up", "--address-block", "100"], "--address-block: not a whole number from 0 to 99: '100'"),
        (["up", "--address-block", "-1"], "--address-block: not a whole number from 0 to 99: '-1'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = lab(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""


def test_profile_is_a_hidden_deprecated_alias_of_rig(capsys):
    """Old scripts say `lab up --profile NAME`: still accepted (with a note on stderr), not shown in --help."""
    args = cli.parser().parse_args(["up", "--profile", "x99-3080", "--rig", "x99-r9700", "--profile", "x99-3080"])
    assert args.rigs == ["x99-3080", "x99-r9700", "x99-3080"]
    assert "--profile is deprecated, use --rig" in capsys.readouterr().err
    assert cli.parser().parse_args(["up", "--rig", "x99-3080"]).rigs == ["x99-3080"]
    assert capsys.readouterr().err == ""
    up_help = lab("up", "--help").stdout
    assert "--rig" in up_help and "--profile" not in up_help


def test_a_lab_json_from_before_the_rename_still_loads(tmp_path, monkeypatch):
    """A lab brought up before the lab rigs were renamed wrote each host's rig as "profile"."""
    import json

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    old = {"hosts": [{"name": "lab-3080", "profile": "x99-3080", "group": "x99_3080", "address": "127.0.11.1"}]}
    state.state_file().parent.mkdir(parents=True)
    state.state_file().write_text(json.dumps(old))
    assert state.load().host("lab-3080").rig == "x99-3080"


@pytest.mark.parametrize("command", [["up"], ["down"], ["break", "lab-3080", "link-x8"], ["heal", "lab-3080"]])
def test_not_root_is_said_clearly(command, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `provision lab ") and "needs root" in err and err.count("\n") == 1
    assert not (tmp_path / "lab" / "lab.json").exists()


def test_status_and_down_when_not_up(tmp_path):
    env = {"RIGBOOK_STATE_DIR": str(tmp_path)}
    proc = lab("status", env=env)
    assert proc.returncode == 0 and "the lab is not up" in proc.stdout
    if os.geteuid() == 0:
        proc = lab("down", env=env)
        assert proc.returncode == 0 and "nothing to stop" in proc.stdout


def test_break_when_not_up(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    proc = lab("break", "lab-3080", "link-x8", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 2 and "the lab is not up" in proc.stderr


def test_default_hosts():
    hosts = state.plan_hosts(None, None)
    assert [(h.name, h.group, h.rig, h.address, h.port) for h in hosts] == [
        ("lab-3080", "x99_3080", "x99-3080", "127.0.11.1", 2222),
        ("lab-r9700", "x99_r9700", "x99-r9700", "127.0.11.2", 2222),
    ]


def test_one_host_takes_the_first_default_rig():
    assert [h.name for h in state.plan_hosts(1, None)] == ["lab-3080"]


def test_more_hosts_cycle_rigs_and_keep_addresses_by_name():
    hosts = state.plan_hosts(5, ["x99-r9700", "x99-3080"])
    assert [(h.name, h.address) for h in hosts] == [
        ("lab-r9700", "127.0.11.2"), ("lab-3080", "127.0.11.1"), ("lab-r9700-2", "127.0.12.2"),
        ("lab-3080-2", "127.0.12.1"), ("lab-r9700-3", "127.0.13.2")]
    assert all(h.address.startswith("127.") for h in hosts)
    assert len({(h.address, h.port) for h in hosts}) == len(hosts)


def test_unknown_host_names_the_known_ones():
    lab_ = state.Lab(hosts=state.plan_hosts(None, None))
    with pytest.raises(UserError, match=r"no lab host 'lab-9090' \(hosts: lab-3080, lab-r9700\)"):
        lab_.host("lab-9090")


def test_static_inventory_matches_the_default_layout():
    from rigbook.lab import inventory

    assert inventory.is_default(state.plan_hosts(None, None))
    assert not inventory.is_default(state.plan_hosts(3, None))


def test_rootfs_key_follows_the_recipe_and_the_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("RIGBOOK_LAB_MIRROR", raising=False)
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("deb http://mirror.invalid/debian bookworm main\n")
    first = rootfs.plan(apt)
    assert first.key == rootfs.plan(apt).key  # stable
    assert first.mirror.uris == ["http://mirror.invalid/debian"]
    (apt / "sources.list.d/sec.list").write_text("deb http://security.invalid/debian-security bookworm-security main\n")
    second = rootfs.plan(apt)
    assert second.key != first.key
    assert [s for src in second.sources for s in src.suites] == ["bookworm", "bookworm-security"]
    recipe = rootfs.load_recipe()
    monkeypatch.setattr(rootfs, "load_recipe", lambda: {**recipe, "packages": recipe["packages"] + ["vim"]})
    assert rootfs.plan(apt).key != second.key


def test_rootfs_recipe_has_what_a_real_box_needs():
    recipe = rootfs.load_recipe()
    assert recipe["suite"] == "bookworm"
    assert {"systemd", "systemd-sysv", "openssh-server", "python3", "sudo", "apt"} <= set(recipe["packages"])
    assert recipe["user"] == state.USER


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("RIGBOOK_LAB_CACHE", str(tmp_path))
    assert rootfs.cache_dir() == tmp_path
    monkeypatch.delenv("RIGBOOK_LAB_CACHE")
    assert rootfs.cache_dir() == rootfs.DEFAULT_CACHE


def test_no_archive_urls_in_the_lab_code():
    """The mirror comes from this machine's apt sources at run time, never from the code."""
    import re
    from pathlib import Path

    base = Path(rootfs.__file__).parent
    for path in list(base.rglob("*.py")) + list(base.rglob("*.yml")):
        assert not re.findall(r"\b(?:https?|ftp)://", path.read_text()), path


def test_a_generated_inventory_shares_the_group_variables_and_the_locks(tmp_path, monkeypatch):
    from rigbook import validate
    from rigbook.lab import inventory

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    written = inventory.write(state.plan_hosts(3, None))
    assert sorted(p.name for p in written.iterdir()) == ["group_vars", "hosts.yml", "locks"]
    # rigbook_pins.sglang.lock is relative to the inventory directory: it must resolve in a generated one too
    lock = validate.validate(written).host_vars("lab-3080")["rigbook_pins"]["sglang"]["lock"]
    assert (written / lock).is_file()


def test_a_twin_serves_on_its_own_address(tmp_path, monkeypatch):
    """The lab's hosts share this machine's network: a second host of a lab rig binds its engine to its own
    (loopback) address; the serve profile is otherwise the group's, and the inventory stays valid."""
    from rigbook import validate
    from rigbook.lab import inventory

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    written = inventory.write(state.plan_hosts(3, ["x99-3080", "x99-r9700", "x99-3080"]))
    checked = validate.validate(written)
    first, twin = checked.host_vars("lab-3080")["rigbook_serve"], checked.host_vars("lab-3080-2")["rigbook_serve"]
    assert [p.get("bind") for p in first] == [None] and [p["bind"] for p in twin] == ["127.0.12.1"]
    assert [{k: v for k, v in p.items() if k != "bind"} for p in twin] == first
    ports = {(p.get("bind", "127.0.0.1"), p["port"]) for name in ("lab-3080", "lab-r9700", "lab-3080-2")
             for p in checked.host_vars(name)["rigbook_serve"]}
    assert len(ports) == 3


def test_an_address_block_moves_every_host_and_gets_its_own_inventory_and_binds(tmp_path, monkeypatch):
    """Two labs side by side (two state directories): the second in block 2 listens on 127.2.x.x; `-i lab` then means
    its generated inventory, in which every host serves on its own address (127.0.0.1 is the first lab's)."""
    from rigbook import paths, validate
    from rigbook.lab import inventory
    from rigbook.run import resolve_inventory

    hosts = state.plan_hosts(3, ["x99-3080", "x99-r9700"], block=2)
    assert [(h.name, h.address) for h in hosts] == [
        ("lab-3080", "127.2.11.1"), ("lab-r9700", "127.2.11.2"), ("lab-3080-2", "127.2.12.1")]
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    assert resolve_inventory("lab").name == "lab"  # no lab up: the repository's inventory/lab
    written = inventory.write(hosts)
    state.save(state.Lab(hosts=hosts))
    assert resolve_inventory("lab") == written
    checked = validate.validate(written)
    assert [checked.host_vars(h.name)["rigbook_serve"][0]["bind"] for h in hosts] == [h.address for h in hosts]
    # the default layout in block 0 is the repository's inventory
    state.save(state.Lab(hosts=state.plan_hosts(None, None)))
    assert resolve_inventory("lab") == paths.collection_root() / "inventory" / "lab"
    state.state_file().write_text("{not json")
    with pytest.raises(UserError, match="the lab's state file .* cannot be read"):
        resolve_inventory("lab")


@pytest.mark.parametrize("value, block", [("", 0), ("3", 3), (" 7 ", 7)])
def test_the_block_defaults_to_the_environment(monkeypatch, value, block):
    monkeypatch.setenv("RIGBOOK_LAB_ADDRESS_BLOCK", value)
    assert cli.default_block() == block


@pytest.mark.parametrize("value", ["x", "100", "-1", "1.5"])
def test_a_bad_block_in_the_environment_is_named(monkeypatch, value):
    monkeypatch.setenv("RIGBOOK_LAB_ADDRESS_BLOCK", value)
    with pytest.raises(UserError, match="RIGBOOK_LAB_ADDRESS_BLOCK: not a whole number from 0 to 99"):
        cli.default_block()
    with pytest.raises(UserError, match="--address-block must be a whole number"):
        state.plan_hosts(None, None, block=-1)


def test_one_lab_command_at_a_time_per_state_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom rigbook.lab import state\n"
                               "with state.locked():\n    print('held', flush=True)\n    time.sleep(3)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match=rf"another `provision lab` command \(pid {holder.pid}\) is running"):
        with state.locked():
            pass
    assert holder.wait(timeout=10) == 0
    with state.locked():  # free once the holder is gone
        pass
