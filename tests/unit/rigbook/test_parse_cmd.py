"""rigbook.parse_cmd: kind dispatch, stdin, JSON output and usage errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from helpers.parse_fixtures import FIXTURES

from rigbook import parse_cmd
from rigbook.errors import UserError


def test_kinds_cover_the_contract():
    assert set(parse_cmd.KINDS) == {
        "lspci", "nvidia-smi-q", "nvidia-smi-topo", "nccl-tests", "nccl-log", "p2p-bandwidth", "sglang-log",
        "kernel-log",
    }


def test_unknown_kind_is_a_user_error():
    with pytest.raises(UserError) as err:
        parse_cmd.main("dmesg", "-")
    assert "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_unreadable_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as err:
        parse_cmd.main("lspci", str(tmp_path / "missing.txt"))
    assert "\n" not in str(err.value)


def test_file_prints_one_json_object(capsys):
    path = FIXTURES / "lspci" / "rtx4090_v_32g_tinygrad28.txt"
    assert parse_cmd.main("lspci", str(path)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"][0]["regions"][1]["size_bytes"] == 32 << 30


def test_dash_reads_stdin_with_bad_bytes(monkeypatch, capsys):
    data = (FIXTURES / "nccl-log" / "nccl1817_shm_8gpu.txt").read_bytes() + b"\xff\xfe garbage\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert parse_cmd.main("nccl-log", "-") == 0
    assert json.loads(capsys.readouterr().out)["path"] == "shm"


@pytest.mark.parametrize("text", ["", "hello world\n", "\n\n\n", "x" * 5000])
def test_input_a_parser_does_not_recognise_is_said_on_stderr_with_exit_2(tmp_path, capsys, text):
    """Empty or unrelated input used to print empty results with exit 0: now a UserError (exit 2) naming the file
    and the kind, and nothing on stdout."""
    junk = tmp_path / "junk.txt"
    junk.write_text(text)
    for kind in parse_cmd.KINDS:
        with pytest.raises(UserError) as err:
            parse_cmd.main(kind, str(junk))
        assert str(err.value).startswith(f"{junk}: the {kind} parser found nothing it reads in it")
        assert err.value.exit_code == 2
        assert capsys.readouterr().out == ""


def test_unrecognised_stdin_through_provision():
    from helpers.cli import provision_argv

    proc = subprocess.run(provision_argv("parse", "nccl-log", "-"), input="hello\n", capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: stdin: the nccl-log parser found nothing it reads in it")


def test_a_clean_kernel_log_is_recognised_by_its_lines(tmp_path, capsys):
    """A kernel log with no error line is a fine result (all counts 0), recognised by its lines' prefixes."""
    for line in ("[    0.000000] Linux version 6.8.0", "[Fri Aug 30 11:11:22 2024] usb 1-1: new device",
                 "Sep 22 09:59:09 pve kernel: pcieport 0000:80:1b.4: enabled"):
        log = tmp_path / "k.txt"
        log.write_text(line + "\n")
        assert parse_cmd.main("kernel-log", str(log)) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["lines_read"] == 1 and out["xid"]["count"] == 0


KIND_OF_FIXTURES = {"sglang": "sglang-log"}


def _fixture_files():
    for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.txt")):
            yield pytest.param(KIND_OF_FIXTURES.get(folder.name, folder.name), path, id=f"{folder.name}/{path.stem}")


@pytest.mark.parametrize("kind,path", list(_fixture_files()))
def test_the_streamed_parse_is_the_parse_of_the_whole_text(kind, path, capsys):
    """provision parse hands the parser the file line by line: each fixture parses to what the whole text gives (or,
    when the parser finds nothing in it, exit 2)."""
    whole = json.loads(json.dumps(parse_cmd.KINDS[kind](path.read_bytes().decode("utf-8", errors="replace"))))
    try:
        assert parse_cmd.main(kind, str(path)) == 0
    except UserError as err:
        assert "found nothing it reads" in str(err)
        assert not parse_cmd.recognised(kind, whole)
        return
    assert json.loads(capsys.readouterr().out) == whole


def test_a_large_file_is_streamed_not_held(tmp_path, capsys):
    """A 16 MiB log: the parser is given the lines one at a time (it used to read the whole file, then hold copies
    of it: 3.7 GB at the peak for 200 MB); the peak of Python allocations stays a small part of the file."""
    import tracemalloc

    line = "[ 1234.567890] pcieport 0000:00:01.0: AER: Corrected error message received from 0000:01:00.0\n"
    path = tmp_path / "big.log"
    with path.open("w") as handle:
        for _ in range((16 << 20) // len(line)):
            handle.write(line)
    given = []
    real = parse_cmd.KINDS["kernel-log"]
    tracemalloc.start()
    try:
        parse_cmd.KINDS["kernel-log"] = lambda lines: given.append(type(lines).__name__) or real(lines)
        assert parse_cmd.main("kernel-log", str(path)) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        parse_cmd.KINDS["kernel-log"] = real
    assert given == ["generator"]
    assert peak < 4 << 20, peak
    out = json.loads(capsys.readouterr().out)
    assert out["aer_corrected"]["count"] == out["lines_read"] == (16 << 20) // len(line)


def test_a_line_longer_than_the_cap_reaches_the_parser_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(parse_cmd, "MAX_LINE", 10)
    path = tmp_path / "long.txt"
    path.write_text("a" * 25 + "\nb\n")
    with path.open() as handle:
        assert list(parse_cmd.bounded_lines(handle, {"kernel": 0})) == ["a" * 10, "a" * 10, "a" * 5 + "\n", "b\n"]


def test_sglang_log_kind(capsys):
    path = FIXTURES / "sglang" / "rocm_tp2_r9700_mattbucci_qwen36.txt"
    assert parse_cmd.main("sglang-log", str(path)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ready"] is True
    assert out["server_args"]["tp_size"] == 2
    assert out["load_weight_s"] == 12.03


def test_sglang_log_through_provision(tmp_path):
    from helpers.cli import provision

    log = tmp_path / "journal.txt"
    text = (FIXTURES / "sglang" / "nvidia_sglang8974_nccl_p2p_ipc.txt").read_text()
    log.write_text("".join("Dec 03 10:00:00 rig python3[4242]: " + line for line in text.splitlines(True)))
    result = provision("parse", "sglang-log", log)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["path"] == "p2p" and out["all_direct_p2p"] is True


def test_dev_zero_ends_with_exit_2_and_a_clear_message():
    """/dev/zero never ends (and has no line end): parse reads at most MAX_INPUT characters, then says so."""
    from helpers.cli import provision

    for kind in ("kernel-log", "nccl-log"):
        result = provision("parse", kind, "/dev/zero", timeout=60)
        assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("error: /dev/zero: more than 64 MiB or 1,000,000 lines: parse reads at most")


def test_more_lines_than_the_cap_is_refused_and_nothing_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(parse_cmd, "MAX_LINES", 100)
    path = tmp_path / "many.log"
    line = "[ 1.000000] pcieport 0000:00:01.0: AER: Corrected error message received from 0000:01:00.0\n"
    path.write_text(line * 100)
    assert parse_cmd.main("kernel-log", str(path)) == 0  # at the cap: read whole
    capsys.readouterr()
    path.write_text(line * 101)
    with pytest.raises(UserError, match=r"many.log: more than 64 MiB or 100 lines"):
        parse_cmd.main("kernel-log", str(path))
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(parse_cmd, "MAX_INPUT", 50)  # characters: one line of 51 is past it
    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 51))
    with pytest.raises(UserError, match="^stdin: more than "):
        parse_cmd.main("kernel-log", "-")
    assert capsys.readouterr().out == ""


def test_a_failed_runs_log_of_warn_lines_is_read_not_refused(tmp_path, capsys):
    # the WARN line and the trailer of aikitoria/open-gpu-kernel-modules#38 (tests/fixtures/diagnose/)
    text = (FIXTURES.parent / "diagnose" / "aikitoria38_map_failed_mixed.txt").read_text().splitlines()[:2]
    path = tmp_path / "failed.log"
    path.write_text("\n".join(text) + "\n")
    assert parse_cmd.main("nccl-log", str(path)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == "unknown" and out["channels"] == []
    assert [f["code"] for f in out["failures"]] == ["CUDA_ERROR_MAP_FAILED", "unhandled cuda error"]
    assert [f["by"] for f in out["failures"]] == ["library", "test"]
