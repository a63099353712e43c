"""facts/systemd.py: the one `systemctl show` parser and reader, typed and bounded."""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner, systemd

# Two units shown at once (systemd 252, Debian 12; the lab's serve unit and ssh), reconstructed in the shape
# `systemctl show A B -p Id,ActiveState,...` prints: one block per unit, blank lines between.
TWO_UNITS = """Id=rigbook-serve-qwen.service
LoadState=loaded
ActiveState=active
SubState=running
NRestarts=2
MainPID=4242
ExecMainStartTimestamp=@1764876000.123456

Id=ssh.service
LoadState=loaded
ActiveState=inactive
SubState=dead
NRestarts=0
MainPID=0
ExecMainStartTimestamp=
"""


def test_parse_show_reads_each_block_in_order():
    blocks = systemd.parse_show(TWO_UNITS)
    assert [b["Id"] for b in blocks] == ["rigbook-serve-qwen.service", "ssh.service"]
    assert blocks[1]["ExecMainStartTimestamp"] == ""
    assert systemd.parse_show("") == [] and systemd.parse_show(None) == []


def test_unit_state_types_a_block():
    state = systemd.unit_state(systemd.by_unit(TWO_UNITS)["rigbook-serve-qwen.service"])
    assert state["active_state"] == "active" and state["sub_state"] == "running"
    assert state["n_restarts"] == 2 and state["main_pid"] == 4242
    assert state["started_at"] == "@1764876000.123456" and state["started_epoch"] == 1764876000.123456
    printed = systemd.unit_state({"ExecMainStartTimestamp": "Thu 2026-12-04 10:00:00 UTC"})
    assert printed["started_epoch"] is None and printed["started_at"].startswith("Thu")


def test_a_value_of_the_wrong_shape_is_none_not_text():
    state = systemd.unit_state({"Id": "x.service", "ActiveState": "active{{ lookup('pipe','id') }}",
                                "NRestarts": "lots", "SubState": "\x1b[2Jrunning"})
    assert state["active_state"] is None and state["n_restarts"] is None
    assert state["sub_state"] is None  # "[2Jrunning" is outside the word set once the escape is dropped
    assert "\x1b" not in str(systemd.parse_show("Id=a\nSubState=\x1b[2Jx\n"))


def _fake(outputs, calls):
    def run(argv, timeout=None):
        calls.append(argv)
        rc, out = outputs.pop(0)
        return runner.Result(argv, rc, out, "", None if rc == 0 else f"exited {rc}", False)
    return run


def test_show_runs_one_command_for_every_unit_and_falls_back_without_unix_timestamps():
    calls = []
    found, error = systemd.show(["rigbook-serve-qwen.service", "ssh.service"], ["ActiveState", "NRestarts"],
                                run=_fake([(1, ""), (0, TWO_UNITS)], calls))
    assert error is None and set(found) == {"rigbook-serve-qwen.service", "ssh.service"}
    assert found["ssh.service"]["active_state"] == "inactive"
    assert calls[0] == ["systemctl", "show", "rigbook-serve-qwen.service", "ssh.service", "-p",
                        "Id,ActiveState,NRestarts", "--timestamp=unix"]
    assert calls[1] == calls[0][:-1]  # systemd before 248 has no --timestamp
    assert systemd.show([], ["ActiveState"], run=_fake([], calls)) == ({}, None) and len(calls) == 2


def test_show_says_why_when_systemctl_fails():
    found, error = systemd.show(["a.service"], ["ActiveState"], run=_fake([(1, ""), (1, "")], []))
    assert found == {} and "exited 1" in error


def test_default_target_is_a_unit_name_or_none():
    assert systemd.default_target(run=_fake([(0, "multi-user.target\n")], [])) == ("multi-user.target", None)
    assert systemd.default_target(run=_fake([(0, "graphical.target; reboot\n")], []))[0] is None
