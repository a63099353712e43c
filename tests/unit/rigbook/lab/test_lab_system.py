"""src/rigbook/lab/system.py: the lab's commands go through facts/runner; `run` raises LabFailure for a command
that fails, cannot start or hangs, with sbin on PATH and ENV, when given, as the whole environment."""

from __future__ import annotations

import sys

import pytest

from rigbook.lab import system
from rigbook.lab.system import LabFailure

SHOW_ENV = "import os; print(os.environ.get('RIGBOOK_PROBE'), os.environ['LC_ALL'], os.environ['PATH'])"


def test_run_returns_the_result_with_sbin_on_path_over_this_environment(monkeypatch):
    monkeypatch.setenv("RIGBOOK_PROBE", "inherited")
    result = system.run([sys.executable, "-c", SHOW_ENV])
    probe, lc_all, path = result.stdout.split()
    assert result.rc == 0 and probe == "inherited" and lc_all == "C"
    assert path.endswith(":/usr/local/sbin:/usr/sbin:/sbin")


def test_run_with_env_gives_the_command_that_environment_alone(monkeypatch):
    monkeypatch.setenv("RIGBOOK_PROBE", "leaked")
    result = system.run([sys.executable, "-c", SHOW_ENV], env={"HOME": "/root"})
    assert result.stdout.split()[:2] == ["None", "C"]


def test_run_raises_labfailure_with_the_last_line_a_failed_command_printed():
    with pytest.raises(LabFailure, match=r"failed: mount: no such device$"):
        system.run([sys.executable, "-c", "import sys; sys.stderr.write('starting\\nmount: no such device\\n'); "
                                          "sys.exit(32)"])


def test_run_raises_labfailure_for_a_command_that_cannot_start_or_hangs():
    with pytest.raises(LabFailure, match="/nonexistent/rigbook-tool"):
        system.run(["/nonexistent/rigbook-tool", "-q"])
    with pytest.raises(LabFailure, match="did not finish in 1 s"):
        system.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
