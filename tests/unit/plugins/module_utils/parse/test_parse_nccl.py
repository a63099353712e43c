"""nccl-tests and NCCL INFO log parsers: table-driven from expected.yml, plus the format rules."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import nccl as parse_nccl
from helpers.parse_fixtures import cases, check, expected, fixture_names, read


@pytest.mark.parametrize("name,facts", cases("nccl-tests"))
def test_tests_fixture(name, facts):
    check(parse_nccl.parse_tests, "nccl-tests", name, facts)


@pytest.mark.parametrize("name,facts", cases("nccl-log"))
def test_log_fixture(name, facts):
    check(parse_nccl.parse_log, "nccl-log", name, facts)


@pytest.mark.parametrize("kind", ["nccl-tests", "nccl-log"])
def test_every_fixture_has_expectations(kind):
    assert fixture_names(kind) == set(expected(kind))


def test_out_of_bounds_failed_line():
    # Derived from the real nccl340 fixture: its OK line rewritten to the FAILED form.
    text = read("nccl-tests", "nccl340_old_error_column").replace(
        "# Out of bounds values : 0 OK", "# Out of bounds values : 248 FAILED"
    )
    result = parse_nccl.parse_tests(text)
    assert result["out_of_bounds"] == 248
    assert result["out_of_bounds_status"] == "FAILED"


def test_tests_mpi_tags_crlf_ansi():
    text = read("nccl-tests", "nccl_tests287_alltoall_none_na")
    want = parse_nccl.parse_tests(text)
    tagged = "".join("[1,0]<stdout>:" + line for line in text.splitlines(True))
    assert parse_nccl.parse_tests(tagged) == want
    assert parse_nccl.parse_tests(text.replace("\n", "\r\n")) == want
    assert parse_nccl.parse_tests("\x1b[32m" + text + "\x1b[0m") == want


def test_tests_unparseable():
    assert parse_nccl.parse_tests("")["rows"] == []
    assert parse_nccl.parse_tests("Segmentation fault (core dumped)")["avg_busbw_gbs"] is None


def test_log_all_direct_p2p():
    # The "Check P2P Type" line as NCCL 2.28.7+ prints it (NVIDIA/nccl src/transport.cc, ncclTransportCheckP2pType).
    base = read("nccl-log", "nccl1817_shm_8gpu")
    line = "host:1:1 [0] NCCL INFO Check P2P Type isAllDirectP2p {} directMode 0 isAllCudaP2p 1\n"
    assert parse_nccl.parse_log(line.format(0) + base)["all_direct_p2p"] is False
    assert parse_nccl.parse_log(line.format(1) + base)["all_direct_p2p"] is True
    assert parse_nccl.parse_log(base)["all_direct_p2p"] is None
    assert parse_nccl.parse_log(line.format(1) + base)["all_cuda_p2p"] is True
    assert parse_nccl.parse_log(base)["all_cuda_p2p"] is None


def test_log_direct_p2p_line_of_rccl_and_older_rccl():
    # RCCL 2.27 prints the line without isAllCudaP2p (the lab's x99-r9700 rig records it so, seed 004's "isAllDirectP2p
    # 1"); older RCCL names the same flag intraNodeP2pSupport (ROCm/rccl src/transport.cc@47da6731,
    # ncclTransportCheckP2pType: "Check P2P Type intraNodeP2pSupport %d directMode %d").
    rccl = "rig:3120:3154 [0] NCCL INFO Check P2P Type isAllDirectP2p {} directMode 0\n"
    older = "rig:3120:3154 [0] NCCL INFO Check P2P Type intraNodeP2pSupport {} directMode 0\n"
    for line in (rccl, older):
        assert parse_nccl.parse_log(line.format(0))["all_direct_p2p"] is False
        assert parse_nccl.parse_log(line.format(1))["all_direct_p2p"] is True
        assert parse_nccl.parse_log(line.format(1))["all_cuda_p2p"] is None
    # one communicator of several without direct P2P is no direct P2P
    assert parse_nccl.parse_log(rccl.format(1) + rccl.format(0))["all_direct_p2p"] is False


def test_log_crlf_ansi_tabs():
    text = read("nccl-log", "nccl1453_cumem_and_net_ibext")
    want = parse_nccl.parse_log(text)
    assert parse_nccl.parse_log(text.replace("\n", "\r\n")) == want
    assert parse_nccl.parse_log(text.replace("NCCL INFO", "\x1b[33mNCCL INFO\x1b[0m")) == want
    assert parse_nccl.parse_log(text.replace(" : ", "\t:\t")) == want


def test_log_unparseable():
    result = parse_nccl.parse_log("hello\n")
    assert result == {"nccl_version": None, "library": None, "channels": [], "transports": [],
                      "all_direct_p2p": None, "all_cuda_p2p": None, "path": "unknown", "failures": []}
