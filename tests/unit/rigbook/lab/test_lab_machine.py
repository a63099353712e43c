"""src/rigbook/lab/machine.py: what it runs goes through facts/runner (no root, no container here: runner's run
and spawn are replaced, and what they were given is looked at)."""

from __future__ import annotations

import json
import sys

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

from rigbook.lab import machine
from rigbook.lab.state import Host
from rigbook.lab.system import LabFailure
from rigbook.paths import link_collection


def test_chroot_gives_stdin_as_data_in_its_own_environment_and_raises_for_a_failure(tmp_path, monkeypatch):
    calls = []

    def fake_run(argv, **kwargs):
        calls.append((argv, kwargs))
        return runner.Result(argv, 1, "", "chpasswd: (user admin) pam_chauthtok() failed\n", "exited 1", False)

    monkeypatch.setattr(runner, "run", fake_run)
    with pytest.raises(LabFailure, match=r"`chroot .* chpasswd` failed: chpasswd: \(user admin\) pam_chauthtok"):
        machine._chroot(tmp_path, "chpasswd", stdin="admin:secret\n")
    (argv, kwargs), = calls
    assert argv == ["chroot", str(tmp_path), "chpasswd"]
    assert kwargs["data"] == "admin:secret\n" and kwargs["clean_env"] is True and kwargs["timeout"] == 60
    assert kwargs["env"] == {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root"}


def test_chroot_names_why_a_command_did_not_finish(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, None, "", "", "chroot did not finish "
                                                                        "in 60 s", True))
    with pytest.raises(LabFailure, match="did not finish in 60 s"):
        machine._chroot(tmp_path, "useradd", "admin")


def test_start_spawns_the_supervisor_detached_and_names_the_collections_it_imports_from(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # link_collection puts this state's collections on it
    monkeypatch.setenv("RIGBOOK_LAB_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("RIGBOOK_LAB_APT_CACHE", str(tmp_path / "apt"))
    spawned = []

    class Started:
        pid = 4242

    monkeypatch.setattr(runner, "spawn", lambda argv, **kw: spawned.append((argv, kw)) or Started())
    host = Host("lab-3080", "x99-3080", "x99_3080", "127.0.11.1")
    host.dir.mkdir(parents=True)  # prepare_root made it
    machine.start(host, systemd_host=True)
    (argv, kwargs), = spawned
    spec_path = host.dir / "supervisor.json"
    assert argv[1:] == ["-I", str(machine.SUPERVISOR), str(spec_path)]
    assert kwargs["new_session"] is True and kwargs["env"]["PATH"].endswith(":/usr/sbin:/sbin")
    spec = json.loads(spec_path.read_text())
    assert spec["collections"] == str(link_collection()) == str(tmp_path / "state" / "collections")
    assert spec["cgroups"] == []
    assert spec["nspawn"][0] == "systemd-nspawn" and "--keep-unit" not in spec["nspawn"]
    assert host.supervisor_pid == 4242 and (host.dir / "supervisor.pid").read_text() == "4242\n"
