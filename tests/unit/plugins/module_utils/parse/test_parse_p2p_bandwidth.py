"""p2pBandwidthLatencyTest parser: table-driven from expected.yml, plus the format rules."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import p2p_bandwidth as parse_p2p_bandwidth
from helpers.parse_fixtures import cases, check, expected, fixture_names, read

KIND = "p2p-bandwidth"


@pytest.mark.parametrize("name,facts", cases(KIND))
def test_fixture(name, facts):
    check(parse_p2p_bandwidth.parse, KIND, name, facts)


def test_every_fixture_has_expectations():
    assert fixture_names(KIND) == set(expected(KIND))


def test_crlf_ansi():
    text = read(KIND, "tinygrad44_4090_pair_truncated")
    want = parse_p2p_bandwidth.parse(text)
    assert parse_p2p_bandwidth.parse(text.replace("\n", "\r\n")) == want
    assert parse_p2p_bandwidth.parse(text.replace("Matrix", "\x1b[1mMatrix\x1b[0m")) == want


def test_unparseable():
    result = parse_p2p_bandwidth.parse("no such file")
    assert result["matrices"] == {
        "unidirectional_p2p_disabled": None,
        "unidirectional_p2p_enabled": None,
        "bidirectional_p2p_disabled": None,
        "bidirectional_p2p_enabled": None,
    }
    assert result["p2p_connectivity"] is None
