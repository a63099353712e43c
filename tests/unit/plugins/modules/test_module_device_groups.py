"""device_groups in-process: the group and user databases faked (SIMULATED: grp/pwd entries), the exact commands."""

from __future__ import annotations

import grp
import pwd
from unittest import mock

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import account
from ansible_collections.rigbook.homelab.plugins.modules import device_groups
from helpers.modules import fail, ok, run_module


def databases(groups: dict, users=("rigbook",)):
    """Patch account's grp/pwd with GROUPS {name: [members]} and USERS (primary group = their own name)."""
    entries = {name: grp.struct_group((name, "x", 100 + i, members))
               for i, (name, members) in enumerate(groups.items())}

    def getgrnam(name):
        return entries[name]

    def getpwnam(name):
        if name not in users:
            raise KeyError(name)
        return pwd.struct_passwd((name, "x", 1000, 1000, "", "/home/" + name, "/bin/sh"))

    def getgrgid(gid):
        raise KeyError(gid)

    fake_grp = mock.Mock(getgrnam=getgrnam, getgrall=lambda: list(entries.values()), getgrgid=getgrgid)
    return mock.patch.multiple(account, grp=fake_grp, pwd=mock.Mock(getpwnam=getpwnam))


def test_in_place_runs_nothing():
    with databases({"render": ["rigbook"], "video": ["rigbook"]}):
        run = run_module(device_groups, {"user": "rigbook"})
    assert not run.failed and run.result["changed"] is False and run.commands == []


def test_a_missing_group_is_made_then_the_user_added_to_what_it_lacks():
    with databases({"video": []}):
        run = run_module(device_groups, {"user": "rigbook"}, [
            (["groupadd", "--system", "render"], ok()),
            (["usermod", "-aG", "render,video", "rigbook"], ok()),
        ])
    assert not run.failed and run.result["changed"] is True
    assert run.result["done"] == ["group render", "rigbook in render,video"]


def test_a_failing_command_is_named_with_what_was_planned():
    with databases({"video": []}):
        run = run_module(device_groups, {"user": "rigbook"}, [
            (["groupadd", "--system", "render"], fail(9, "groupadd: group 'render' already exists\n")),
        ])
    assert run.failed and run.msg == "groupadd --system render failed (rc 9): groupadd: group 'render' already exists"
    assert run.result["done"] == ["group render", "rigbook in render,video"]


def test_check_mode_reports_and_runs_nothing():
    with databases({"render": [], "video": ["rigbook"]}):
        run = run_module(device_groups, {"user": "rigbook"}, check_mode=True)
    assert run.result["changed"] is True and run.result["done"] == ["rigbook in render"] and run.commands == []


@pytest.mark.parametrize("groups", [{"render": [], "video": []}])
def test_an_absent_user_is_an_error_not_created(groups):
    with databases(groups, users=()):
        run = run_module(device_groups, {"user": "ghost"})
    assert run.failed and "user ghost does not exist" in run.msg and run.commands == []
