"""serve_units in-process: the unit text, systemd quoting, and a check-mode run whose systemctl answers are faked
(the profile checks, the files compared, what would restart); the real runs are tests/integration/test_serving_lab.py.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.modules import serve_units
from helpers import ok, run_module

ENGINE = ["/opt/rigbook/sglang/0.5.23-abc/bin/python", "-m", "sglang.launch_server"]


def profile(tmp_path, **changes):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return dict({"name": "qwen", "model_path": str(model), "served_model_name": "qwen", "tp_size": 2,
                 "port": 30000, "custom_all_reduce": False,
                 "extra_args": ['--default-chat-template-kwargs={"reasoning_effort": "medium"}', "--page-size", "64"],
                 "env": {"NCCL_DEBUG": "INFO"}}, **changes)


def args(tmp_path, profiles, **extra):
    (tmp_path / "units").mkdir(exist_ok=True)
    return dict(dict(profiles=profiles, engine=ENGINE, env_files=[], unit_dir=str(tmp_path / "units"),
                     config_dir=str(tmp_path / "serve"), home=str(tmp_path / "home"), user="root",
                     supplementary_groups=["root"],
                     host={"gpu_count": 2, "vendor": "nvidia", "p2p_expected": False}), **extra)


def show(*blocks):
    return "\n\n".join("\n".join(f"{k}={v}" for k, v in block.items()) for block in blocks) + "\n"


def test_systemd_quoting_keeps_words_and_escapes_specifiers():
    assert serve_units.systemd_quote("--tp-size") == "--tp-size"
    assert serve_units.systemd_quote('{"a": "b c"}') == '"{\\"a\\": \\"b c\\"}"'
    assert serve_units.systemd_quote("50%") == '"50%%"'
    assert serve_units.systemd_quote("$HOME") == '"$$HOME"'
    assert serve_units.systemd_quote("${RIGBOOK_SERVE_API_KEY}", ("${RIGBOOK_SERVE_API_KEY}",)) == \
        "${RIGBOOK_SERVE_API_KEY}"


def test_the_unit_runs_the_profile_without_a_shell_and_without_the_key(tmp_path):
    p = args(tmp_path, [])
    files = {"unit": "/u", "env": "/etc/rigbook/serve/qwen.env", "key": "/etc/rigbook/serve/qwen.key.env"}
    text = serve_units.unit_text(profile(tmp_path, api_key_file="/etc/k"), dict(p, env_files=["/etc/rigbook/cuda.env"]),
                                 files)
    lines = text.splitlines()
    [exec_start] = [line for line in lines if line.startswith("ExecStart=")]
    assert exec_start.startswith("ExecStart=/opt/rigbook/sglang/0.5.23-abc/bin/python -m sglang.launch_server "
                                 "--model-path ")
    assert "--disable-custom-all-reduce" in exec_start and exec_start.endswith("--api-key ${RIGBOOK_SERVE_API_KEY}")
    assert '"--default-chat-template-kwargs={\\"reasoning_effort\\": \\"medium\\"}"' in exec_start
    assert [line for line in lines if line.startswith("EnvironmentFile=")] == [
        "EnvironmentFile=/etc/rigbook/cuda.env", "EnvironmentFile=/etc/rigbook/serve/qwen.env",
        "EnvironmentFile=/etc/rigbook/serve/qwen.key.env"]
    for line in ("Restart=on-failure", "TimeoutStartSec=900", "LimitMEMLOCK=infinity", "User=root",
                 "WantedBy=multi-user.target", "StartLimitBurst=5"):
        assert line in lines
    assert "sh -c" not in text


def test_a_percent_in_the_description_is_no_specifier(tmp_path):
    text = serve_units.unit_text(profile(tmp_path, served_model_name="qwen-100%"), args(tmp_path, []),
                                 {"unit": "/u", "env": "/etc/rigbook/serve/qwen.env"})
    [description] = [line for line in text.splitlines() if line.startswith("Description=")]
    assert "(SGLang qwen-100%% on port" in description


def test_check_mode_on_a_fresh_host_lists_every_file_and_a_start(tmp_path):
    a = args(tmp_path, [profile(tmp_path)])
    run = run_module(serve_units, a, [
        (["systemctl", "get-default"], ok("multi-user.target\n")),
        (["systemctl", "show", "rigbook-serve-qwen.service", "-p",
          "Id,ActiveState,SubState,UnitFileState,ExecMainStartTimestamp,NRestarts,Result"],
         ok(show({"Id": "rigbook-serve-qwen.service", "ActiveState": "inactive", "UnitFileState": ""}))),
    ], check_mode=True)
    assert not run.failed, run.msg
    unit = run.result["units"]["qwen"]
    assert run.result["changed"] and unit["changed"] == ["unit", "env"] and unit["started"] is True
    assert not (tmp_path / "units" / "rigbook-serve-qwen.service").exists()  # check mode wrote nothing


def test_a_profile_the_host_refuses_runs_nothing_but_the_facts(tmp_path):
    bad = profile(tmp_path, model_path=str(tmp_path / "absent"), tp_size=4)
    run = run_module(serve_units, args(tmp_path, [bad]), [(["systemctl", "get-default"], ok("graphical.target\n"))])
    assert run.failed and "nothing was written or restarted" in run.msg
    assert "rigbook_serve[0].tp_size" in run.msg and "rigbook_serve[0].model_path" in run.msg


def test_a_converged_host_changes_nothing(tmp_path):
    prof = profile(tmp_path)
    a = args(tmp_path, [prof])
    files = {"unit": str(tmp_path / "units" / "rigbook-serve-qwen.service"), "env": str(tmp_path / "serve/qwen.env")}
    (tmp_path / "serve").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "units" / "rigbook-serve-qwen.service").write_text(serve_units.unit_text(prof, a, files))
    (tmp_path / "serve/qwen.env").write_text(serve_units.env_text(prof))
    run = run_module(serve_units, a, [
        (["systemctl", "get-default"], ok("multi-user.target\n")),
        (["systemctl", "show", "rigbook-serve-qwen.service", "-p",
          "Id,ActiveState,SubState,UnitFileState,ExecMainStartTimestamp,NRestarts,Result"],
         ok(show({"Id": "rigbook-serve-qwen.service", "ActiveState": "active", "UnitFileState": "enabled"}))),
    ])
    assert not run.failed, run.msg
    assert run.result["changed"] is False and run.result["units"]["qwen"]["changed"] == []
