"""src/rigbook/lab/lab.py: a fault's script and the boot hook go through facts/runner (replaced here: no host)."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

from rigbook.lab import lab
from rigbook.lab.state import Host
from rigbook.lab.system import LabFailure

HOST = Host("lab-3080", "x99-3080", "x99_3080", "127.0.11.1")


def _replace_run(monkeypatch, rc, stderr="", error=None, timed_out=False) -> list:
    calls = []

    def fake_run(argv, **kwargs):
        calls.append((argv, kwargs))
        return runner.Result(argv, rc, "", stderr, error, timed_out)

    monkeypatch.setattr(runner, "run", fake_run)
    return calls


def test_a_faults_script_runs_as_root_over_ssh_and_its_failure_is_named(monkeypatch):
    calls = _replace_run(monkeypatch, 0)
    lab._run_in_host(HOST, "rm -f /etc/x")
    (argv, kwargs), = calls
    assert argv[0] == "ssh" and argv[-1] == "sudo -n sh -c 'rm -f /etc/x'" and kwargs == {"timeout": 600}
    _replace_run(monkeypatch, 1, stderr="rm: cannot remove\n")
    with pytest.raises(LabFailure, match=r"lab-3080: the fault's script failed \(rc 1\): rm: cannot remove"):
        lab._run_in_host(HOST, "rm -f /etc/x")
    _replace_run(monkeypatch, None, error="ssh did not finish in 600 s", timed_out=True)
    with pytest.raises(LabFailure, match="lab-3080: the fault's script failed: ssh did not finish in 600 s"):
        lab._run_in_host(HOST, "rm -f /etc/x")


def test_the_boot_hook_on_a_healed_tree_notes_a_failure_and_raises_when_it_could_not_run(tmp_path, monkeypatch,
                                                                                          capsys):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    hook = HOST.root / "usr/local/sbin/rigbook-lab-boot-kernel"
    hook.parent.mkdir(parents=True)
    hook.write_text("#!/bin/sh\n")
    calls = _replace_run(monkeypatch, 1, stderr="no kernel\n")
    lab._record_booted_kernel(HOST)
    assert calls[0][0] == ["chroot", str(HOST.root), "/usr/local/sbin/rigbook-lab-boot-kernel"]
    assert "the boot hook failed on the healed tree: no kernel" in capsys.readouterr().out
    _replace_run(monkeypatch, None, error="chroot: No such file or directory")
    with pytest.raises(LabFailure, match="the boot hook on the healed tree: chroot: No such file"):
        lab._record_booted_kernel(HOST)
