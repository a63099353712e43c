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
        "lspci", "nvidia-smi-q", "nvidia-smi-topo", "nccl-tests", "nccl-log", "p2p-bandwidth",
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
