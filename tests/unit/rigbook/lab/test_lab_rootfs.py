"""src/rigbook/lab/rootfs.py: this machine's architecture and debootstrap's streamed output, through facts/runner
(debootstrap here is a stand-in script first on PATH: no root, no download)."""

from __future__ import annotations

import io
import os

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

from rigbook.lab import aptsources, rootfs
from rigbook.lab.system import LabFailure

RECIPE = {"variant": "minbase", "packages": ["openssh-server", "sudo"], "suite": "bookworm"}
MIRROR = aptsources.Source(["deb"], ["http://deb.example/debian"], ["bookworm"], ["main"])


def test_architecture_is_what_dpkg_prints_or_else_uname_says(monkeypatch):
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, 0, "arm64\n", "", None, False))
    assert rootfs.architecture() == "arm64"
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, None, "", "", "dpkg: not found", False))
    machine = os.uname().machine
    assert rootfs.architecture() == {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _standin(tmp_path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "debootstrap"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_debootstraps_output_is_logged_and_summed_up_as_it_comes(tmp_path, monkeypatch, capsys):
    _standin(tmp_path, monkeypatch, 'echo "I: Retrieving Release"\necho "I: Retrieving libc6 2.36"\n'
                                    'echo "I: Retrieving sudo 1.9"\necho "I: Extracting libc6..." >&2\n'
                                    'echo "W: locale $LC_ALL $*"\n')
    log = io.StringIO()
    rootfs._debootstrap(rootfs.Plan(RECIPE, MIRROR, [MIRROR], "amd64", "k"), tmp_path / "target", log)
    out = capsys.readouterr().out
    assert "debootstrap: downloaded 3 packages" in out and "debootstrap: extracted 1 packages" in out
    assert "lab: debootstrap: locale C --variant=minbase --arch=amd64 --include=openssh-server,sudo " \
           f"--components=main bookworm {tmp_path / 'target'} http://deb.example/debian" in out
    assert log.getvalue().startswith("I: Retrieving Release\nI: Retrieving libc6 2.36\n")


def test_a_failed_debootstrap_is_a_labfailure_with_its_last_line(tmp_path, monkeypatch):
    _standin(tmp_path, monkeypatch, 'echo "E: Couldn\'t download release file"\nexit 1\n')
    with pytest.raises(LabFailure, match=r"debootstrap failed \(exit 1\): E: Couldn't download release file"):
        rootfs._debootstrap(rootfs.Plan(RECIPE, MIRROR, [MIRROR], "amd64", "k"), tmp_path / "target", io.StringIO())
