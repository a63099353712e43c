"""lspci parser: table-driven from tests/fixtures/parse/lspci/expected.yml, plus the format rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import lspci as parse_lspci
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "parse"
KIND = "lspci"


def lookup(result, path: str):
    """Resolve 'a.b[2].c' (trailing '#' = length) against a parsed result."""
    want_len = path.endswith("#")
    if want_len:
        path = path[:-1]
    value = result
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            value = value[int(part[1:-1])]
        else:
            value = value[part]
    return len(value) if want_len else value


def cases(kind: str):
    expected = yaml.safe_load((FIXTURES / kind / "expected.yml").read_text())
    return [(name, facts) for name, facts in expected.items()]


def read(kind: str, name: str) -> str:
    return (FIXTURES / kind / (name + ".txt")).read_text(encoding="utf-8")


def check(parse, kind, name, facts):
    result = parse(read(kind, name))
    for path, want in facts.items():
        got = lookup(result, path)
        assert got == want, f"{name}: {path} = {got!r}, expected {want!r}"
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            assert isinstance(got, (int, float)) and not isinstance(got, bool), path


@pytest.mark.parametrize("name,facts", cases(KIND), ids=[c[0] for c in cases(KIND)])
def test_fixture(name, facts):
    check(parse_lspci.parse, KIND, name, facts)


def test_every_fixture_has_expectations():
    names = {p.stem for p in (FIXTURES / KIND).glob("*.txt")}
    assert names == {n for n, _ in cases(KIND)}


def test_crlf_ansi_and_tabs_do_not_change_the_result():
    text = read(KIND, "rtx_a6000_vv_ok_markers_rebar256")
    want = parse_lspci.parse(text)
    assert parse_lspci.parse(text.replace("\n", "\r\n")) == want
    coloured = re.sub(r"(LnkSta:|Region \d+:|BAR \d+:)", "\x1b[1;32m\\1\x1b[0m", text)
    assert parse_lspci.parse(coloured) == want
    assert parse_lspci.parse(text.replace("        ", "\t")) == want


def test_unparseable_input_gives_empty_devices():
    assert parse_lspci.parse("") == {"devices": []}
    assert parse_lspci.parse("bash: lspci: command not found\n") == {"devices": []}


def test_downgrade_without_markers_compares_with_capability():
    text = (
        "03:00.0 VGA compatible controller: NVIDIA Corporation Device 2204 (rev a1)\n"
        "\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM L0s L1\n"
        "\t\tLnkSta:\tSpeed 8GT/s, Width x16, TrErr- Train- SlotClk+\n"
    )
    sta = parse_lspci.parse(text)["devices"][0]["link_sta"]
    assert sta == {"speed_gts": 8.0, "width": 16, "speed_downgraded": True, "width_downgraded": False}


@pytest.mark.parametrize(
    "raw,want",
    [
        ("03:00.0", "0000:03:00.0"),
        ("0000:0A:00.1", "0000:0a:00.1"),
        ("00000000:B1:00.0", "0000:b1:00.0"),
        ("0000000F:01:00.0", "000f:01:00.0"),
        ("10000:e1:00.0", "10000:e1:00.0"),
        ("not a slot", None),
    ],
)
def test_slot_normalisation(raw, want):
    assert parse_text.normalise_slot(raw) == want


def test_vmd_domain_header_is_a_device():
    text = "10000:e1:00.0 Non-Volatile memory controller: Sandisk Corp WD Blue SN550 NVMe SSD (rev 01)\n"
    assert parse_lspci.parse(text)["devices"][0]["slot"] == "10000:e1:00.0"
