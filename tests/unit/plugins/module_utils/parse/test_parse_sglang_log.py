"""SGLang server log parser: table-driven from expected.yml, plus the prefix, server_args and NCCL rules."""

from __future__ import annotations

import re

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import sglang_log
from helpers.parse_fixtures import cases, check, expected, fixture_names, read

ROCM = "rocm_tp2_r9700_mattbucci_qwen36"


@pytest.mark.parametrize("name,facts", cases("sglang"))
def test_sglang_fixture(name, facts):
    check(sglang_log.parse, "sglang", name, facts)


def test_every_fixture_has_expectations():
    assert fixture_names("sglang") == set(expected("sglang"))


def test_journald_prefixes_change_nothing():
    # Derived from a real fixture: each line as `journalctl -o short` and `-o short-iso` print it.
    text = read("sglang", ROCM) + read("sglang", "nvidia_sglang8974_nccl_p2p_ipc")
    want = sglang_log.parse(text)
    for prefix in ("Dec 03 10:00:00 rig python3[4242]: ", "2025-12-03T10:00:00+0000 rig sglang[4242]: "):
        got = sglang_log.parse("".join(prefix + line for line in text.splitlines(True)))
        assert got == want
        assert got["ready"] and got["path"] == "p2p" and got["server_args"]["tp_size"] == 2


def test_crlf_and_ansi_change_nothing():
    text = read("sglang", "cuda_eagle3_sglang11948_decode")
    want = sglang_log.parse(text)
    assert sglang_log.parse(text.replace("\n", "\r\n")) == want
    assert sglang_log.parse("\x1b[32m" + text.replace("Decode", "\x1b[1mDecode\x1b[0m")) == want


def test_level_and_file_after_the_sglang_prefix():
    # Newer releases log "[ts] INFO file.py:123: message" (seen in SGLang's docs notebooks).
    text = read("sglang", ROCM).replace("] The server is fired", "] INFO http_server.py:1490: The server is fired")
    assert sglang_log.parse(text)["ready"] is True


def test_not_ready_without_the_marker():
    text = read("sglang", ROCM).replace("The server is fired up and ready to roll!", "")
    assert sglang_log.parse(text)["ready"] is False


def test_api_key_in_server_args_is_reported():
    # Derived: the same line with a key, as SGLang logs it unredacted (sgl-project/sglang#37457;
    # MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks#12 reproduced it with API_KEY=sk-test-123).
    text = read("sglang", ROCM)
    assert sglang_log.parse(text.replace("api_key=None,", "api_key='sk-test-123',", 1))["api_key_logged"] is True
    assert sglang_log.parse(text.replace("admin_api_key=None", "admin_api_key='adm'"))["api_key_logged"] is True
    for redacted in ("''", "'[REDACTED]'", "'****'"):
        assert sglang_log.parse(text.replace("api_key=None,", f"api_key={redacted},", 1))["api_key_logged"] is False


@pytest.mark.parametrize("line, shown", [
    ("server_args=ServerArgs(model_path='/m', api_key='s3c,r)e\\'t', admin_api_key=None, port=1)",
     "server_args=ServerArgs(model_path='/m', api_key='<redacted>', admin_api_key=None, port=1)"),
    ("server_args={'api_key': 's3cret', 'admin_api_key': \"a'b\", 'port': 1}",
     "server_args={'api_key': '<redacted>', 'admin_api_key': '<redacted>', 'port': 1}"),
    ("launch_command: python -m sglang.launch_server --api-key s3cret --port 1 --admin-api-key=adm",
     "launch_command: python -m sglang.launch_server --api-key <redacted> --port 1 --admin-api-key=<redacted>"),
    ("argv ['--api-key', 's3cret', '--port', '1']", "argv ['--api-key', '<redacted>', '--port', '1']"),
    ('api-key: "s3cret"', "api-key: '<redacted>'"),
    ("x_api_key='kept' --my-api-key kept --api-key --port 1", "x_api_key='kept' --my-api-key kept --api-key --port 1"),
])
def test_redact_hides_the_api_keys_values(line, shown):
    assert sglang_log.redact(line) == shown


def test_redact_hides_given_secrets_and_parse_keeps_none_in_its_errors():
    assert sglang_log.redact("token=abc; again abc", ["abc", ""]) == "token=<redacted>; again <redacted>"
    text = "RuntimeError: launch failed: python -m sglang.launch_server --api-key s3cret\n"
    assert sglang_log.parse(text)["errors"] == [
        "RuntimeError: launch failed: python -m sglang.launch_server --api-key <redacted>"]
    logged = sglang_log.parse(sglang_log.redact("server_args=ServerArgs(api_key='s3cret', port=1)"))
    assert logged["api_key_logged"] is False  # <redacted> is what the collection's SGLang patch logs too


def test_server_args_dict_form_of_newer_releases():
    # engine.py logs f"server_args={server_args.resolved_dict()}" in newer releases (a dict, not the dataclass repr).
    line = ("[2026-09-12 10:00:00] server_args={'model_path': '/m', 'tp_size': 2, 'port': 30000, "
            "'api_key': 'k', 'disable_custom_all_reduce': True, 'cuda_graph_bs': [1, 2, 4], 'host': '0.0.0.0'}\n")
    result = sglang_log.parse(line)
    assert result["server_args"] == {"model_path": "/m", "tp_size": 2, "port": 30000,
                                     "disable_custom_all_reduce": True, "host": "0.0.0.0"}
    assert result["api_key_logged"] is True
    assert result["custom_all_reduce"] is False


def test_server_args_values_with_commas_quotes_and_brackets():
    args = sglang_log.parse_server_args(
        "server_args=ServerArgs(chat_template=\"it's, odd\", cuda_graph_bs=[1, 2], "
        "json_model_override_args='{\"a\": 1, \"b\": 2}', tp_size=2)")
    assert args == {"chat_template": "it's, odd", "cuda_graph_bs": [1, 2],
                    "json_model_override_args": '{"a": 1, "b": 2}', "tp_size": 2}


def test_custom_all_reduce_sources():
    text = read("sglang", ROCM)
    no_ar_lines = re.sub(r".*\[AR\].*\n", "", text)
    assert sglang_log.parse(no_ar_lines)["custom_all_reduce"] is False  # server_args alone
    flag_off = no_ar_lines.replace("disable_custom_all_reduce=True", "disable_custom_all_reduce=False")
    assert sglang_log.parse(flag_off)["custom_all_reduce"] is None      # nothing says either way
    on = flag_off + "[2026-05-25 17:43:35 TP0] Registering 2464 cuda graph addresses\n"
    assert sglang_log.parse(on)["custom_all_reduce"] is True
    warning = ("[2026-05-25 17:43:20 TP1] Custom allreduce is disabled because your platform lacks GPU P2P "
               "capability or P2P test failed. To silence this warning, specify disable_custom_all_reduce=True "
               "explicitly.\n")  # custom_all_reduce.py's warning text
    assert sglang_log.parse(on + warning)["custom_all_reduce"] is False


def test_shm_lines_inside_an_sglang_log():
    # Derived: the real SHM NCCL lines appended to the real ROCm SGLang log (NCCL's format does not depend on the
    # program that loads it; no stored public SGLang log with SHM channel lines was found).
    result = sglang_log.parse(read("sglang", ROCM) + read("sglang", "nccl_shm_2gpu_tp2_vllm9920"))
    assert result["path"] == "shm" and result["ready"] is True
    mixed = read("sglang", "nvidia_sglang8974_nccl_p2p_ipc") + read("sglang", "nccl_shm_2gpu_tp2_vllm9920")
    assert sglang_log.parse(mixed)["path"] is None   # P2P on some channels, SHM on others: not "p2p"
    assert sglang_log.parse(mixed)["transports"] == ["P2P/IPC", "SHM/direct/direct"]


def test_is_all_direct_p2p_zero():
    text = read("sglang", "nvidia_sglang8974_nccl_p2p_ipc").replace("isAllDirectP2p 1", "isAllDirectP2p 0")
    assert sglang_log.parse(text)["all_direct_p2p"] is False


def test_phases_add_up_within_a_rank_and_overlap_across_ranks():
    # Load/capture line formats of two real releases (target then draft model; newer "CUDA graph end. elapsed=").
    text = (
        "[2026-08-28 21:32:38] Load weight end. elapsed=787.55 s, type=Qwen4ExpForConditionalGeneration\n"
        "[2026-08-28 21:34:13] Load weight end. elapsed=94.49 s, type=Qwen4ExpForCausalLMMTP\n"
        "[2026-02-04 11:30:30 TP0] Capture cuda graph end. Time elapsed: 1.01 s. mem usage=0.07 GB.\n"
        "[2026-02-04 11:30:31 TP1] Capture cuda graph end. Time elapsed: 1.79 s\n"
        "[2026-02-04 11:30:52 TP1] Capture target decode CUDA graph end. elapsed=22.18 s, mem usage=1.91 GB,\n"
    )
    result = sglang_log.parse(text)
    assert result["load_weight_s"] == 882.04
    assert result["cuda_graph_s"] == 23.97


def test_version_lines():
    assert sglang_log.parse("sglang version: 0.5.18\ngit revision: 4cb5aeb\n")["version"] == "0.5.18"
    assert sglang_log.parse("sglang: 0.5.6.post3.dev979+g3d51ae18a\n")["version"] == "0.5.6.post3.dev979+g3d51ae18a"
    assert sglang_log.parse(read("sglang", ROCM))["version"] is None  # the server log itself carries none


def test_health_check_failure_and_oom_are_errors():
    text = ("[2025-06-01 10:00:00] Health check failed. Server couldn't get a response from detokenizer for last "
            "20 seconds. tic start time: 10:00:00. last_heartbeat time: 09:59:40\n"
            "[2025-06-01 10:00:01 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n"
            "[2025-06-01 10:00:01 TP0] Using FP8 KV cache but no scaling factors provided.\n")
    result = sglang_log.parse(text)
    assert result["error_count"] == 2
    assert result["errors"][0].startswith("[2025-06-01 10:00:00] Health check failed.")


def test_errors_are_capped_but_counted():
    result = sglang_log.parse("RuntimeError: boom\n" * (sglang_log.MAX_ERRORS + 5))
    assert len(result["errors"]) == sglang_log.MAX_ERRORS
    assert result["error_count"] == sglang_log.MAX_ERRORS + 5


@pytest.mark.parametrize("junk", ["", "\x00\x00", "server_args=ServerArgs(", "server_args={'tp_size': ",
                                  "Decode batch, gen throughput (token/s): n/a", "\ufeff\n\n"])
def test_garbage_gives_empty_results_not_exceptions(junk):
    result = sglang_log.parse(junk)
    assert result["ready"] is False and result["gen_throughput_tok_s"] == [] and result["path"] is None
    assert result["server_args"] == {}
