"""lspci parser: table-driven from tests/fixtures/parse/lspci/expected.yml, plus the format rules."""

from __future__ import annotations

import re

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import lspci as parse_lspci
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text
from helpers.parse_fixtures import cases, check, expected, fixture_names, read

KIND = "lspci"


@pytest.mark.parametrize("name,facts", cases(KIND))
def test_fixture(name, facts):
    check(parse_lspci.parse, KIND, name, facts)


def test_every_fixture_has_expectations():
    assert fixture_names(KIND) == set(expected(KIND))


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
