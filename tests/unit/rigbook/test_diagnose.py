"""rigbook.diagnose (`provision diagnose`): pasted real outputs judged by the ladder's judges.

The table: each row a recorded real output (tests/fixtures/parse/KIND/NAME.txt, or tests/fixtures/diagnose/) and the
verdict its source thread reached, as tests/fixtures/parse/SOURCES.md's "What each thread concluded" table records it
(rows marked "output" there were read off the pasted text, the thread reaching no conclusion of its own).
"""

from __future__ import annotations

import io
import json

import pytest
from helpers.parse_fixtures import FIXTURES

from rigbook import cli, diagnose
from rigbook.errors import UserError

DIAGNOSE = FIXTURES.parent / "diagnose"

# (fixture, extra arguments, layer, status the thread reached, words the verdict must hold)
TABLE = [
    # NVIDIA/nccl-tests#307: 8x RTX 4090, every channel via SHM (sjeaugey elsewhere: "GeForce cards do not support
    # P2P"); eight GPUs counted from the channel lines, so P2P is expected and the SHM fallback fails.
    ("nccl-log/nccl_tests307_shm_and_ring_listing", [], "nccl_transport", "fail", "not P2P"),
    # tinygrad/open-gpu-kernel-modules#17: the patched driver's P2P/direct pointer, the thread's working case.
    ("nccl-log/tinygrad17_direct_pointer_blank_lines", [], "nccl_transport", "pass", "P2P/direct pointer"),
    ("nccl-log/nccl1817_direct_pointer_channel_1", [], "nccl_transport", "pass", "P2P/direct pointer"),
    # club-3090#1125: `nvidia-smi topo -p2p` says NS on the pair.
    ("nvidia-smi-topo/club3090_1125_indented_node_ns", [], "peer_access", "fail", "no peer access"),
    # aikitoria/open-gpu-kernel-modules#5: 4090<->4090 CAN, 4090<->5090 CANNOT ("P2P is not compatible between
    # different gens", #16): P2P is broken for the cross-generation pairs.
    ("p2p-bandwidth/aikitoria_pr5_mixed_cards_access_only", [], "peer_access", "fail", "GPU0->GPU2"),
    # NVIDIA/nccl#814 (RTX 4090s): the P2P=Enabled copy is slower than the host-staged one.
    ("p2p-bandwidth/nccl814_writes_and_reads", [], "p2p_bandwidth", "fail", "no real P2P"),
    # NVIDIA/nccl-tests#287 (closed, fixed: "Seems like it works."): the poster's alltoall run, #wrong 0
    ("nccl-tests/nccl_tests287_alltoall_none_na", [], "collectives", "pass", "#wrong 0"),
    # NVIDIA/NVSentinel#155/#195: Xid 79, the GPU fell off the bus, is fatal.
    ("kernel-log/xid79_nvsentinel_155", [], "kernel_log", "fail", "critical Xid 79"),
    # tinygrad/open-gpu-kernel-modules#28: "Notice how BAR1 is size 32G" (24 GB VRAM): the large BAR the fork needs.
    ("lspci/rtx4090_v_32g_tinygrad28", ["--vram-gib", "24"], "firmware", "pass", "above 4 GiB"),
    # geerlingguy/raspberry-pi-pcie-devices#504: a 4090 on a Pi CM4 with a 256M BAR1 (the driver did not start);
    # with the owner expecting P2P of it, no large BAR is a fail.
    ("lspci/rtx4090_vvvv_disabled_pi_cm4", ["--p2p", "yes"], "firmware", "fail", "no large BAR"),
    # mrirecon/bart#323: `nvidia-smi -q` BAR1 Total 256 MiB on a 48 GB A6000 (the 256 MiB BAR1 no peer can map,
    # seed 000's finding); held to P2P, no large BAR fails.
    ("nvidia-smi-q/bart323_bar1_256", ["--p2p", "yes"], "firmware", "fail", "BAR1 is only 256 MiB"),
    # aikitoria/open-gpu-kernel-modules#38: NCCL stops on "mapping of buffer object failed" (simpleP2P passed).
    ("diagnose/aikitoria38_map_failed_mixed", [], "peer_access", "fail", "CUDA_ERROR_MAP_FAILED"),
    ("diagnose/aikitoria38_map_failed_mixed", [], "collectives", "fail", "unhandled cuda error"),
    # this project's own capture of a one-H100 cloud VM (tests/fixtures/diagnose/SOURCES.md): BAR1 128 GiB over 80 GB
    # of VRAM, Gen5 x16, no hardware error line, one GPU
    ("diagnose/h100_vm_own_capture", [], "firmware", "pass", "128 GiB"),
    ("diagnose/h100_vm_own_capture", [], "pcie_link", "pass", "Gen5 x16"),
    ("diagnose/h100_vm_own_capture", [], "nccl_transport", "skip", "one GPU"),
    ("diagnose/h100_vm_own_capture", [], "kernel_log", "pass", "no hardware error line"),
    # ... and its BAR1 (64 GiB and 32 GiB, nvidia-smi -q through grep) are large: not the BAR this time
    ("diagnose/aikitoria38_map_failed_mixed", [], "firmware", "pass", "placement was read"),
]


def path_of(name):
    kind, stem = name.split("/")
    return (DIAGNOSE if kind == "diagnose" else FIXTURES / kind) / (stem + ".txt")


def run_json(capsys, *args):
    code = cli.main(["diagnose", "--json", *args])
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == code
    return out


def verdict_of(out, layer):
    if layer == "kernel_log":
        return out["kernel_log"]
    return next(v for v in out["ladder"] if v["layer"] == layer)


@pytest.mark.parametrize("name, extra, layer, status, words", TABLE, ids=[f"{r[0]}:{r[2]}" for r in TABLE])
def test_each_recorded_output_gets_its_threads_verdict(capsys, name, extra, layer, status, words):
    out = run_json(capsys, *extra, str(path_of(name)))
    verdict = verdict_of(out, layer)
    assert verdict["status"] == status, verdict
    assert words in verdict["why"] + json.dumps(verdict["measured"])
    if status in ("fail", "warn"):  # the finding's own stable code (docs/codes.md), not the layer's generic one
        assert verdict["code"].startswith("RB-") and not verdict["code"].endswith(("-FAIL", "-WARN")), verdict
    assert out["exit_code"] == (1 if status == "fail" else 0) or any(
        v["status"] == "fail" for v in out["ladder"] if v["layer"] != layer)


def test_a_mixed_thread_is_split_and_each_layer_read_from_its_own_part(capsys):
    text = "\n".join([
        "my box, 2x 3090:",
        "$ sudo lspci -vv",
        path_of("lspci/rtx4090_v_32g_tinygrad28").read_text(),
        "$ nvidia-smi topo -p2p r",
        path_of("nvidia-smi-topo/club3090_1125_indented_node_ns").read_text(),
        "--",
        "and NCCL_DEBUG=INFO of all_reduce_perf:",
        path_of("nccl-log/nccl_tests307_shm_and_ring_listing").read_text(),
    ])
    stdin = io.StringIO(text)
    stdin.buffer = None
    out = _with_stdin(capsys, stdin, "--p2p", "yes", "--vram-gib", "24")
    kinds = [p["kind"] for p in out["parts"]]
    assert kinds.count("lspci") == 1 and "nvidia-smi-topo" in kinds and "nccl-log" in kinds
    statuses = {v["layer"]: v["status"] for v in out["ladder"]}
    assert statuses["peer_access"] == "fail" and statuses["nccl_transport"] == "fail"
    assert statuses["kernel_state"] == "unknown" and verdict_of(out, "kernel_state")["why"] == diagnose.NOT_IN_PASTES
    assert statuses["serving"] == "unknown"
    assert verdict_of(out, "nccl_transport")["read_from"] and out["exit_code"] == 1


def _with_stdin(capsys, stdin, *args):
    import sys

    old = sys.stdin
    sys.stdin = stdin
    try:
        return run_json(capsys, *args, "-")
    finally:
        sys.stdin = old


def test_text_output_names_each_part_and_strips_control_characters(capsys, tmp_path):
    paste = tmp_path / "paste.txt"
    paste.write_text("$ nvidia-smi topo -p2p r\x1b]0;evil\x07\n"
                     + path_of("nvidia-smi-topo/club3090_1125_indented_node_ns").read_text())
    assert cli.main(["diagnose", str(paste)]) == 1
    out = capsys.readouterr().out
    assert "nvidia-smi topo -m / -p2p" in out and "peer_access" in out
    assert "\x1b" not in out and "\x07" not in out


def test_nothing_recognised_is_bad_input_and_prints_nothing(capsys, tmp_path):
    paste = tmp_path / "prose.txt"
    paste.write_text("it still does not work after the reboot\n")
    assert cli.main(["diagnose", str(paste)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "nothing judged" in captured.err


def test_bad_facts_are_user_errors():
    with pytest.raises(UserError):
        diagnose.pcie_of("gen9 x3")
    assert diagnose.pcie_of("3x16") == {"gen": 3, "width": 16}
    with pytest.raises(UserError):
        diagnose.ladder_view_of(diagnose.Facts(gpus=0), {})
    view = diagnose.ladder_view_of(diagnose.Facts(p2p="no", pcie="gen4:16"), {"vendor": "nvidia", "gpus": 2})
    assert view["gpu"] == {"vendor": "nvidia", "count": 2, "pcie": {"gen": 4, "width": 16}}
    assert view["p2p"]["expected"] is False


def test_a_missing_file_is_a_user_error(capsys, tmp_path):
    assert cli.main(["diagnose", str(tmp_path / "nope.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_every_verdict_that_is_not_a_pass_shows_its_code_in_json_and_text(capsys):
    """The failure codes (docs/codes.md): each layer's verdict carries its code in --json and beside its status in the
    text; a layer no paste covers shows its generic unknown code; the kernel log takes the error counters' code."""
    paste = str(path_of("diagnose/aikitoria38_map_failed_mixed"))
    out = run_json(capsys, paste)
    assert cli.main(["diagnose", paste]) == out["exit_code"] == 1
    text = capsys.readouterr().out
    for verdict in out["ladder"]:
        if verdict["status"] == "pass":
            assert "code" not in verdict
            continue
        assert verdict["code"].startswith("RB-"), verdict
        if verdict["why"] == diagnose.NOT_IN_PASTES:
            assert verdict["code"] == f"RB-{verdict['layer'].upper().replace('_', '-')}-UNKNOWN"
            assert f"  {verdict['layer']}: unknown [{verdict['code']}] ({diagnose.NOT_IN_PASTES}): " in text
        else:
            assert f"  {verdict['layer']}: {verdict['status']} [{verdict['code']}]" in text
    xid = run_json(capsys, str(path_of("kernel-log/xid79_nvsentinel_155")))["kernel_log"]
    assert xid["status"] == "fail" and xid["code"] == "RB-HW-XID-CRITICAL"
    assert "code" not in run_json(capsys, str(path_of("diagnose/h100_vm_own_capture")))["kernel_log"]
