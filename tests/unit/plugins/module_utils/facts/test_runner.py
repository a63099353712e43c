"""facts/runner.py: the one command runner - argv only, LC_ALL=C, timeouts, bounded output, live or recorded."""

from __future__ import annotations

import sys

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner


def test_a_command_runs_with_lc_all_c_over_the_callers_environment(monkeypatch):
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("RIGBOOK_PROBE", "kept")
    result = runner.run([sys.executable, "-c", "import os; print(os.environ['LC_ALL'], os.environ['RIGBOOK_PROBE'])"])
    assert result.rc == 0 and result.error is None and not result.timed_out
    assert result.stdout.split() == ["C", "kept"]


def test_clean_env_replaces_the_environment_and_env_adds_to_it(monkeypatch):
    monkeypatch.setenv("RIGBOOK_PROBE", "leaked")
    code = "import os; print(os.environ.get('RIGBOOK_PROBE'), os.environ.get('HIP_VISIBLE_DEVICES'))"
    result = runner.run([sys.executable, "-c", code], env={"HIP_VISIBLE_DEVICES": "0,1"}, clean_env=True)
    assert result.stdout.split() == ["None", "0,1"]


def test_a_failing_command_says_its_exit_code_and_last_words():
    result = runner.run([sys.executable, "-c", "import sys; sys.stderr.write('no such unit'); sys.exit(4)"])
    assert result.rc == 4
    assert "exited 4" in result.error and "no such unit" in result.error


def test_a_command_that_cannot_start_is_a_result_never_an_exception():
    result = runner.run(["/nonexistent/rigbook-tool", "--x"])
    assert result.rc is None and not result.timed_out
    assert "/nonexistent/rigbook-tool" in result.error


def test_a_timeout_kills_the_command_and_keeps_what_it_printed():
    result = runner.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"],
                        timeout=1)
    assert result.timed_out and result.rc is None
    assert "did not finish in 1 s" in result.error


def test_stdin_data_and_cwd_reach_the_command(tmp_path):
    result = runner.run([sys.executable, "-c", "import os, sys; print(sys.stdin.read().upper(), os.getcwd())"],
                        data="key", cwd=str(tmp_path))
    assert result.stdout.split() == ["KEY", str(tmp_path)]


def test_lines_keeps_the_head_and_tail_of_a_long_output_and_counts_the_rest():
    result = runner.run([sys.executable, "-c", "print('\\n'.join(str(i) for i in range(1, 101)))"], lines=(2, 3))
    assert result.rc == 0
    assert result.stdout.splitlines() == ["1", "2", "[... 95 lines skipped ...]", "98", "99", "100"]
    assert runner.lines_printed(result.stdout, (2, 3)) == 100


def test_lines_printed_counts_a_short_output_and_no_output():
    code = "print('a'); print('b'); print('[... 7 lines skipped ...]'); print('c')"
    short = runner.run([sys.executable, "-c", code], lines=(2, 3))
    assert runner.lines_printed(short.stdout, (2, 3)) == 4  # a line that looks like the mark, printed by the command
    assert runner.lines_printed("", (2, 3)) == 0 and runner.lines_printed("x", (0, 1)) == 1


def test_spawn_starts_a_child_under_the_same_environment_and_hands_back_its_process(monkeypatch, tmp_path):
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    code = ("import os, sys; print(os.environ['LC_ALL'], os.environ['RIGBOOK_PROBE'], os.getcwd(), "
            "os.getsid(0) == os.getpid(), sys.stdin.read() == '', flush=True); sys.stderr.write('to stdout')")
    proc = runner.spawn([sys.executable, "-c", code], env={"RIGBOOK_PROBE": "added"}, cwd=str(tmp_path),
                        stdout=runner.PIPE, stderr=runner.STDOUT, text=True, new_session=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.split() == ["C", "added", str(tmp_path), "True", "True", "to", "stdout"]


def test_spawn_raises_when_the_command_cannot_start():
    with pytest.raises(OSError):
        runner.spawn(["/nonexistent/rigbook-tool"])


def test_output_and_rc_output_are_the_shapes_readers_take():
    assert runner.output([sys.executable, "-c", "print('ok')"]) == ("ok\n", None)
    text, error = runner.output([sys.executable, "-c", "raise SystemExit(2)"])
    assert text is None and "exited 2" in error
    assert runner.rc_output([sys.executable, "-c", "print('x'); raise SystemExit(1)"]) == (1, "x\n")
    assert runner.rc_output(["/nonexistent/rigbook-tool"]) == (-1, "")


def test_recorded_or_live_reads_the_recording_under_a_recorded_tree(tmp_path):
    folder = tmp_path / "var" / "lib" / "rigbook" / "commands"
    folder.mkdir(parents=True)
    (folder / "nvidia-smi-topo.txt").write_text("\tGPU0\tGPU1\nGPU0\t X \tPIX\n")
    text, source = runner.recorded_or_live(str(tmp_path), "nvidia-smi-topo", ["nvidia-smi", "topo", "-m"])
    assert text.startswith("GPU0\tGPU1") and source == "recorded var/lib/rigbook/commands/nvidia-smi-topo.txt"
    text, source = runner.recorded_or_live(str(tmp_path), "lspci-vvv", ["lspci", "-vvv"])
    assert text is None and source == "no recording at var/lib/rigbook/commands/lspci-vvv.txt"


def test_recorded_or_live_runs_the_command_under_slash():
    text, source = runner.recorded_or_live("/", "python", [sys.executable, "-c", "print('live')"])
    assert text == "live\n" and source.endswith("-c print('live')")
    text, source = runner.recorded_or_live("/", "missing", ["/nonexistent/rigbook-tool"])
    assert text is None and "/nonexistent/rigbook-tool" in source
