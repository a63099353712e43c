"""nvidia-smi -q and topo parsers: table-driven from the expected.yml files, plus the format rules."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nvidia_smi as parse_nvidia_smi
from helpers.parse_fixtures import cases, check, expected, fixture_names, read


@pytest.mark.parametrize("name,facts", cases("nvidia-smi-q"))
def test_q_fixture(name, facts):
    check(parse_nvidia_smi.parse_q, "nvidia-smi-q", name, facts)


@pytest.mark.parametrize("name,facts", cases("nvidia-smi-topo"))
def test_topo_fixture(name, facts):
    check(parse_nvidia_smi.parse_topo, "nvidia-smi-topo", name, facts)


@pytest.mark.parametrize("kind", ["nvidia-smi-q", "nvidia-smi-topo"])
def test_every_fixture_has_expectations(kind):
    assert fixture_names(kind) == set(expected(kind))


def test_q_crlf_and_ansi():
    text = read("nvidia-smi-q", "rtx4070_laptop_566_device_host_max")
    want = parse_nvidia_smi.parse_q(text)
    assert parse_nvidia_smi.parse_q(text.replace("\n", "\r\n")) == want
    assert parse_nvidia_smi.parse_q("\x1b[0m" + text.replace("Total", "\x1b[1mTotal\x1b[0m")) == want
    assert parse_nvidia_smi.parse_q(text.replace("    ", "\t")) == want


def test_q_device_max_rows_are_not_max():
    text = read("nvidia-smi-q", "rtx4070_laptop_566_device_host_max").replace(
        "                Host Max                  : 4", "                Host Max                  : 5"
    )
    assert parse_nvidia_smi.parse_q(text)["gpus"][0]["pcie_gen_max"] == 4


def test_q_unparseable():
    assert parse_nvidia_smi.parse_q("") == {"driver_version": None, "cuda_version": None, "gpus": []}
    assert parse_nvidia_smi.parse_q("NVIDIA-SMI has failed because it couldn't communicate")["gpus"] == []


def test_topo_unparseable_and_crlf():
    assert parse_nvidia_smi.parse_topo("nothing here")["links"] == {}
    text = read("nvidia-smi-topo", "club3090_1229_tabs_matrix_and_p2p")
    assert parse_nvidia_smi.parse_topo(text.replace("\n", "\r\n")) == parse_nvidia_smi.parse_topo(text)
