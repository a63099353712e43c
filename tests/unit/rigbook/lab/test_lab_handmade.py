"""src/rigbook/lab/handmade.py: its root scripts and the reboot go through facts/runner (replaced here: no host)."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

from rigbook.lab import handmade
from rigbook.lab.state import Host
from rigbook.lab.system import LabFailure

HOST = Host("lab-3080", "x99-3080", "x99_3080", "127.0.11.1")


def test_a_root_script_runs_over_ssh_and_its_failure_or_hang_is_named(monkeypatch):
    calls = []
    monkeypatch.setattr(runner, "run", lambda argv, **kw: calls.append((argv, kw)) or runner.Result(
        argv, 2, "", "dkms: build failed\n", "exited 2", False))
    with pytest.raises(LabFailure, match=r"lab-3080: setting it up failed \(rc 2\): dkms: build failed"):
        handmade._as_root(HOST, "dkms autoinstall", "setting it up")
    (argv, kwargs), = calls
    assert argv[0] == "ssh" and argv[-1] == "sudo -n sh -c 'dkms autoinstall'" and kwargs == {"timeout": 900}
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, None, "", "", "ssh did not finish in "
                                                                        "900 s", True))
    with pytest.raises(LabFailure, match="lab-3080: setting it up failed: ssh did not finish in 900 s"):
        handmade._as_root(HOST, "dkms autoinstall", "setting it up")


def test_asking_for_a_reboot_that_cannot_be_sent_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, None, "", "", "ssh: No such file or "
                                                                        "directory", False))
    with pytest.raises(LabFailure, match="lab-3080: asking it to reboot: ssh: No such file"):
        handmade._reboot(HOST)
