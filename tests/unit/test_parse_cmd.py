"""rigbook.parse_cmd: kind dispatch, stdin, JSON output and usage errors."""

from __future__ import annotations

import io
import json
import sys

import pytest
from helpers import FIXTURES

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


def test_empty_input_exits_zero_with_empty_results(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for kind in parse_cmd.KINDS:
        assert parse_cmd.main(kind, str(empty)) == 0
        json.loads(capsys.readouterr().out)


def test_sglang_log_kind(capsys):
    path = FIXTURES / "sglang" / "rocm_tp2_r9700_mattbucci_qwen36.txt"
    assert parse_cmd.main("sglang-log", str(path)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ready"] is True
    assert out["server_args"]["tp_size"] == 2
    assert out["load_weight_s"] == 12.03


def test_sglang_log_through_provision(tmp_path):
    from helpers import provision

    log = tmp_path / "journal.txt"
    text = (FIXTURES / "sglang" / "nvidia_sglang8974_nccl_p2p_ipc.txt").read_text()
    log.write_text("".join("Dec 03 10:00:00 rig python3[4242]: " + line for line in text.splitlines(True)))
    result = provision("parse", "sglang-log", log)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["path"] == "p2p" and out["all_direct_p2p"] is True
