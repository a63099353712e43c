"""parse/paste.py: a paste split into the tool outputs it holds, each with its kind.

Pastes built here are joined from real fixture text (tests/fixtures/parse/SOURCES.md says where each came from) the
way people paste: `$ command` lines, `--` separators, prose between, NCCL INFO lines inside nccl-tests output.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.parse import paste
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import text as parse_text
from helpers.parse_fixtures import FIXTURES


def fixture(kind, name):
    return (FIXTURES / kind / (name + ".txt")).read_text()


def split(text):
    return paste.split(list(parse_text.lines(text)))


def kinds(parts):
    return [part["kind"] for part in parts]


def test_a_thread_of_several_outputs_is_split_at_its_prompts():
    text = "\n".join([
        "Here is what I see on my box:",
        "$ sudo lspci -vv -s 01:00.0",
        fixture("lspci", "rtx4090_v_32g_tinygrad28"),
        "user@rig:~$ nvidia-smi topo -p2p r",
        fixture("nvidia-smi-topo", "club3090_1125_indented_node_ns"),
        "```",
        fixture("nccl-log", "nccl_tests307_shm_and_ring_listing"),
        "```",
    ])
    parts = split(text)
    assert kinds(parts) == ["unrecognised", "lspci", "nvidia-smi-topo", "nccl-log"]
    assert parts[1]["command"] == "lspci -s 01:00.0 -v"  # the fixture's own prompt line, the last one before it
    assert parts[2]["command"] == "nvidia-smi topo -p2p r"
    assert parts[0]["first"] == parts[0]["last"] == 1
    # every line of the paste is in at most one part
    numbers = [n for part in parts for n in range(part["first"], part["last"] + 1)]
    assert len(numbers) == len(set(numbers))


def test_nccl_info_lines_inside_an_nccl_tests_run_are_the_log_and_the_table_stays_whole():
    tests = fixture("nccl-tests", "nccl340_old_error_column").splitlines()
    log = fixture("nccl-log", "nccl1817_direct_pointer_channel_1").splitlines()
    text = "\n".join(tests[:3] + log + tests[3:])
    parts = split(text)
    assert sorted(set(kinds(parts))) == ["nccl-log", "nccl-tests"]
    log_parts = [p for p in parts if p["kind"] == "nccl-log"]
    assert len(log_parts) == 1 and log_parts[0]["lines"] == log


def test_a_second_nccl_tests_run_without_a_separator_is_a_second_part():
    one = fixture("nccl-tests", "nccl_tests287_alltoall_none_na")
    parts = split(one + "\n" + one)
    runs = [p for p in parts if p["kind"] == "nccl-tests"]
    assert len(runs) >= 2
    assert runs[0]["last"] < runs[-1]["first"]


def test_grep_context_separators_continue_the_kind_before_them():
    # `nvidia-smi -q | grep -A 4 "BAR1 Memory Usage"` of two GPUs prints `--` between the matches
    # (aikitoria/open-gpu-kernel-modules#38, tests/fixtures/diagnose/aikitoria38_map_failed_mixed.txt)
    text = (FIXTURES.parent / "diagnose" / "aikitoria38_map_failed_mixed.txt").read_text()
    parts = split(text)
    assert kinds(parts) == ["nccl-log", "unrecognised", "nvidia-smi-q", "nvidia-smi-q"]
    assert parts[2]["command"].startswith("nvidia-smi -q | grep")
    assert parts[3]["command"] is None


def test_a_kernel_log_is_read_by_its_prefix_and_a_dmesg_command_by_its_name():
    xid = fixture("kernel-log", "xid79_nvsentinel_155")
    assert kinds(split(xid)) == ["kernel-log"]
    plain = "NVRM: Xid (PCI:0000:44:00): 79, pid=1, GPU has fallen off the bus.\nsome other kernel words"
    parts = split("$ dmesg -t | tail\n" + plain)
    assert kinds(parts) == ["kernel-log"] and parts[0]["lines"] == plain.splitlines()


def test_hash_comment_lines_are_no_prompt_but_a_root_prompt_with_a_tool_is():
    assert paste.boundary("# nThread 1 nGpus 2 minBytes 8")[0] is False
    assert paste.boundary("#  Rank  0 Group  0 Pid 1 on host device 0 [0x01] GPU")[0] is False
    assert paste.boundary("# nvidia-smi topo -m") == (True, "nvidia-smi topo -m")
    assert paste.boundary("root@x99:~# lspci -tv") == (True, "lspci -tv")
    assert paste.boundary("==================== ROCm System Management Interface") == (False, None)


def test_every_kind_has_a_title_and_nothing_recognised_in_prose():
    assert set(paste.KINDS) | {paste.UNRECOGNISED} == set(paste.TITLES)
    assert kinds(split("I rebooted and it still does not work.\nAny idea?")) == ["unrecognised"]
    assert split("") == []


def test_each_kind_with_a_real_fixture_is_detected_alone():
    for kind, name in (("lspci", "rtx_a6000_vv_ok_markers_rebar256"), ("nvidia-smi-q", "bart323_a6000_pci_gen1"),
                       ("nvidia-smi-topo", "cuda_samples284_l4_sys"), ("nccl-tests", "nccl_tests167_max_min_redops"),
                       ("nccl-log", "nccl1453_cumem_and_net_ibext"), ("p2p-bandwidth", "nccl814_writes_and_reads"),
                       ("kernel-log", "aer_nonfatal_ms02_10")):
        found = [k for k in kinds(split(fixture(kind, name))) if k != "unrecognised"]
        assert found and set(found) == {kind}, (kind, name, found)
