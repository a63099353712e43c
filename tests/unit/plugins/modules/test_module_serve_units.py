"""serve_units in-process: the unit text, systemd quoting, and a check-mode run whose systemctl answers are faked
(the profile checks, the files compared, what would restart); the real runs are tests/integration/test_serving_lab.py.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import serve_units
from helpers.modules import fail, ok, run_module

ENGINE = ["/opt/rigbook/sglang/0.5.23-abc/bin/python", "-m", "sglang.launch_server"]


@pytest.fixture(autouse=True)
def none_of_this_machines_engines(monkeypatch, tmp_path):
    """The module stops an engine started by hand on a profile's port: it looks for one in /proc. This machine's
    /proc shows every lab container's processes (a hand-made seed box's `sglang serve` on port 30000, while the lab
    tests run beside these), none of which is this test's to stop: the module reads an empty proc tree here, and the
    tests of finding engines give theirs explicitly."""
    real = serve_units.engines_by_hand
    empty = tmp_path / "no-engines"
    empty.mkdir()
    monkeypatch.setattr(serve_units, "engines_by_hand",
                        lambda profiles, engine, root=str(empty): real(profiles, engine, root))


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
                     modules_load_dir=str(tmp_path / "modules-load.d"),
                     supplementary_groups=["root"],
                     host={"gpu_count": 2, "vendor": "nvidia", "p2p_expected": False}), **extra)


def show(*blocks):
    return "\n\n".join("\n".join(f"{k}={v}" for k, v in block.items()) for block in blocks) + "\n"


def test_systemd_quoting_keeps_words_and_escapes_specifiers():
    assert serve_units.systemd_quote("--tp-size") == "--tp-size"
    assert serve_units.systemd_quote('{"a": "b c"}') == '"{\\"a\\": \\"b c\\"}"'
    assert serve_units.systemd_quote("50%") == '"50%%"'
    assert serve_units.systemd_quote("$HOME") == '"$$HOME"'
    assert serve_units.systemd_quote("%d/api-key.yaml") == '"%%d/api-key.yaml"'
    assert serve_units.systemd_quote("%d/api-key.yaml", ("%d/api-key.yaml",)) == "%d/api-key.yaml"


def keyed_unit(tmp_path, **changes):
    p = args(tmp_path, [])
    files = {"unit": "/u", "env": "/etc/rigbook/serve/qwen.env", "key": "/etc/rigbook/serve/qwen.key.yaml"}
    return serve_units.unit_text(profile(tmp_path, api_key_file="/etc/k", **changes),
                                 dict(p, env_files=["/etc/rigbook/cuda.env"]), files)


def test_the_unit_runs_the_profile_without_a_shell_and_without_the_key(tmp_path):
    text = keyed_unit(tmp_path)
    lines = text.splitlines()
    [exec_start] = [line for line in lines if line.startswith("ExecStart=")]
    assert exec_start.startswith("ExecStart=/opt/rigbook/sglang/0.5.23-abc/bin/python -m sglang.launch_server "
                                 "--model-path ")
    # the key reaches the engine as a file: systemd's credential (%d: the unit's credentials directory), --config
    assert "--disable-custom-all-reduce" in exec_start and exec_start.endswith("--config %d/api-key.yaml")
    assert "--api-key" not in text and "RIGBOOK_SERVE_API_KEY" not in text
    assert "LoadCredential=api-key.yaml:/etc/rigbook/serve/qwen.key.yaml" in lines
    assert '"--default-chat-template-kwargs={\\"reasoning_effort\\": \\"medium\\"}"' in exec_start
    assert [line for line in lines if line.startswith("EnvironmentFile=")] == [
        "EnvironmentFile=/etc/rigbook/cuda.env", "EnvironmentFile=/etc/rigbook/serve/qwen.env"]
    for line in ("Restart=on-failure", "TimeoutStartSec=900", "LimitMEMLOCK=infinity", "User=root",
                 "WantedBy=multi-user.target", "StartLimitBurst=5"):
        assert line in lines
    assert "sh -c" not in text


def test_the_unit_is_sandboxed_as_far_as_a_gpu_engine_allows(tmp_path):
    lines = keyed_unit(tmp_path).splitlines()
    for line in ("ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "UMask=0077", "CapabilityBoundingSet=",
                 "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
                 "ProtectControlGroups=yes", "RestrictSUIDSGID=yes", "RestrictNamespaces=yes", "LockPersonality=yes",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "SystemCallArchitectures=native",
                 "DevicePolicy=closed", "NoNewPrivileges=yes", f"ReadWritePaths={tmp_path / 'home'}"):
        assert line in lines, line
    settings = [line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("#")]
    for left_out in ("PrivateDevices", "MemoryDenyWriteExecute", "PrivateNetwork", "PrivateUsers", "RemoveIPC",
                     "ProcSubset"):
        assert left_out not in settings
        assert any(line.startswith(f"# - {left_out}=") for line in lines), left_out  # and says why


@pytest.mark.parametrize("vendor, groups", [
    ("nvidia", ["char-nvidia*"]), ("amd", ["char-kfd", "char-drm"]), (None, ["char-nvidia*", "char-kfd", "char-drm"])])
def test_only_the_vendors_gpu_nodes_are_allowed(tmp_path, vendor, groups):
    p = dict(args(tmp_path, []), host={"vendor": vendor} if vendor else {})
    text = serve_units.unit_text(profile(tmp_path), p, {"unit": "/u", "env": "/e"})
    assert [line for line in text.splitlines() if line.startswith("DeviceAllow=")] == [
        f"DeviceAllow={group} rw" for group in groups]


def test_a_model_under_home_is_read_only_and_cache_variables_are_writable(tmp_path):
    prof = dict(profile(tmp_path), model_path="/home/ann/models/qwen",
                env={"HF_HOME": "/srv/hf", "TRITON_CACHE_DIR": "/var/cache/triton", "NCCL_DEBUG": "INFO",
                     "XDG_CACHE_HOME": "relative/path", "TORCHINDUCTOR_CACHE_DIR": "/a b"})
    lines = serve_units.unit_text(prof, args(tmp_path, []), {"unit": "/u", "env": "/e"}).splitlines()
    assert "ProtectHome=read-only" in lines
    assert f"ReadWritePaths={tmp_path / 'home'} -/srv/hf -/var/cache/triton" in lines


SCORE = re.compile(r"Overall exposure level for \S+: ([0-9.]+) ")


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
@pytest.mark.parametrize("vendor, model", [("nvidia", "/srv/models/q"), ("amd", "/home/ann/q"), (None, "/srv/q")])
def test_systemd_analyze_security_rates_the_unit_4_5_or_lower(tmp_path, vendor, model):
    """The issue's measure: 8.7 EXPOSED before; the target is 4.5 or lower (the lab checks the running unit too)."""
    p = dict(args(tmp_path, []), user="rigbook-serve", supplementary_groups=["video", "render"],
             host={"vendor": vendor} if vendor else {}, home="/var/lib/rigbook-serve")
    prof = dict(profile(tmp_path), model_path=model, api_key_file="/etc/k")
    path = tmp_path / "rigbook-serve-qwen.service"
    path.write_text(serve_units.unit_text(prof, p, {"unit": str(path), "env": "/etc/rigbook/serve/qwen.env",
                                                    "key": "/etc/rigbook/serve/qwen.key.yaml"}))
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", path.name],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    found = SCORE.search(proc.stdout)
    assert found, proc.stdout + proc.stderr
    assert float(found.group(1)) <= 4.5, proc.stdout


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
          "Id,ActiveState,SubState,UnitFileState,ExecMainStartTimestamp,NRestarts,Result,ControlGroup"],
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


def test_a_kv_scales_file_missing_here_is_refused_and_one_present_is_not(tmp_path):
    """Seed 000 serves FP8 KV with a per-head scales file (--quantization-param-path); read on the box like the model
    directory."""
    scales = tmp_path / "qwen38-fp8-kv-scales-per-head.json"
    prof = profile(tmp_path, extra_args=["--kv-cache-dtype=fp8_e4m3", "--quantization-param-path", str(scales)])
    run = run_module(serve_units, args(tmp_path, [prof]), [(["systemctl", "get-default"], ok("multi-user.target\n"))])
    assert run.failed and "nothing was written or restarted" in run.msg
    assert f"rigbook_serve[0].extra_args[1]: --quantization-param-path {scales} does not exist on the box" in run.msg
    scales.write_text('{"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {}}}\n')
    assert serve_units.profile_facts({}, prof)["quantization_param_path_exists"] is True
    assert "quantization_param_path_exists" not in serve_units.profile_facts({}, profile(tmp_path))


MEMINFO_32G = "MemTotal:       33554432 kB\nMemFree:        30000000 kB\nMemAvailable:   31000000 kB\n"


@pytest.mark.parametrize("text,total", [(MEMINFO_32G, 32 * 1024 ** 3), ("MemFree: 1 kB\n", None), (None, None),
                                        ("MemTotal: lots kB\n", None)])
def test_mem_total_is_read_from_meminfo_in_bytes(text, total):
    assert serve_units.mem_total_bytes(text) == total


def test_hierarchical_cache_pools_the_box_cannot_hold_are_refused(tmp_path, monkeypatch):
    """Seed 000's --hicache-size 15 at tp_size 2 (30 GB pinned) on a box of 32 GiB: 10 GiB must stay free."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO_32G)
    monkeypatch.setattr(serve_units, "MEMINFO", str(meminfo))
    prof = profile(tmp_path, extra_args=["--enable-hierarchical-cache", "--hicache-size", "15"])
    get_default = (["systemctl", "get-default"], ok("multi-user.target\n"))
    run = run_module(serve_units, args(tmp_path, [prof]), [get_default])
    assert run.failed and "nothing was written or restarted" in run.msg
    assert "rigbook_serve[0].extra_args[1]: --hicache-size 15 is GB for each rank: 2 ranks pin 30.0 GB" in run.msg
    fits = profile(tmp_path, extra_args=["--enable-hierarchical-cache", "--hicache-size", "11"])
    run = run_module(serve_units, args(tmp_path, [fits]), [get_default, running("inactive")], check_mode=True)
    assert not run.failed, run.msg


def test_an_unreadable_meminfo_is_said_when_a_host_pool_needs_it(tmp_path, monkeypatch):
    monkeypatch.setattr(serve_units, "MEMINFO", str(tmp_path / "absent"))
    prof = profile(tmp_path, extra_args=["--enable-hierarchical-cache", "--hicache-size", "15"])
    run = run_module(serve_units, args(tmp_path, [prof]), [(["systemctl", "get-default"], ok("multi-user.target\n")),
                                                            running("inactive")], check_mode=True)
    assert not run.failed, run.msg
    assert run.result["warnings_found"] == [f"{tmp_path / 'absent'} has no readable MemTotal line: the hierarchical "
                                            "cache's host memory (--hicache-size) is not checked against the box's "
                                            "RAM"]
    run = run_module(serve_units, args(tmp_path, [profile(tmp_path)]), [
        (["systemctl", "get-default"], ok("multi-user.target\n")), running("inactive")], check_mode=True)
    assert run.result["warnings_found"] == []  # no host pool: nothing to say


SHOW = ["systemctl", "show", "rigbook-serve-qwen.service", "-p",
        "Id,ActiveState,SubState,UnitFileState,ExecMainStartTimestamp,NRestarts,Result,ControlGroup"]


def running(state="active"):
    return (SHOW, ok(show({"Id": "rigbook-serve-qwen.service", "ActiveState": state,
                           "UnitFileState": "enabled" if state == "active" else ""})))


def converge(tmp_path, prof, key=None):
    """The files of PROF as a converged host has them; returns the module args."""
    a = args(tmp_path, [prof])
    serve, units, loads = tmp_path / "serve", tmp_path / "units", tmp_path / "modules-load.d"
    for folder in (serve, tmp_path / "home", loads):
        folder.mkdir(exist_ok=True)
    files = {"unit": str(units / "rigbook-serve-qwen.service"), "env": str(serve / "qwen.env")}
    if key is not None:
        files["key"] = str(serve / "qwen.key.yaml")
        (serve / "qwen.key.yaml").write_text(serve_units.serve_profile.api_key_config(key, "qwen"))
        os.chmod(serve / "qwen.key.yaml", 0o600)
    (units / "rigbook-serve-qwen.service").write_text(serve_units.unit_text(prof, a, files))
    (serve / "qwen.env").write_text(serve_units.env_text(prof))
    os.chmod(serve / "qwen.env", 0o600)
    (loads / "rigbook-serve.conf").write_text(serve_units.modules_text())
    return a


# an API key is printable ASCII without spaces (facts/api_key.py); these characters are YAML's own
KEY = "s3cr#t:'x\"{{"


def key_file(tmp_path, key=KEY):
    path = tmp_path / "api.key"
    path.write_text(key + "\n")
    os.chmod(path, 0o600)
    return str(path)


def test_a_converged_host_changes_nothing(tmp_path):
    prof = profile(tmp_path, api_key_file=key_file(tmp_path))
    run = run_module(serve_units, converge(tmp_path, prof, KEY), [
        (["systemctl", "get-default"], ok("multi-user.target\n")), running()])
    assert not run.failed, run.msg
    assert run.result["changed"] is False and run.result["units"]["qwen"]["changed"] == []


def test_an_env_file_left_world_readable_is_made_root_only_without_a_restart(tmp_path):
    prof = profile(tmp_path)
    a = converge(tmp_path, prof)
    os.chmod(tmp_path / "serve/qwen.env", 0o644)
    run = run_module(serve_units, a, [(["systemctl", "get-default"], ok("multi-user.target\n")), running()])
    assert not run.failed, run.msg
    unit = run.result["units"]["qwen"]
    assert run.result["changed"] and unit["changed"] == [] and unit["restarted"] is False
    assert unit["modes_fixed"] == [str(tmp_path / "serve/qwen.env")]
    assert os.stat(tmp_path / "serve/qwen.env").st_mode & 0o777 == 0o600


def test_the_key_moves_from_the_old_env_file_to_a_credential_and_never_shows(tmp_path):
    """A host converged by the rigbook before: the key in <name>.key.env, the unit's argv expanding it."""
    key = KEY
    prof = profile(tmp_path, api_key_file=key_file(tmp_path, key))
    a = args(tmp_path, [prof])
    for folder in ("serve", "home"):
        (tmp_path / folder).mkdir()
    (tmp_path / "serve/qwen.key.env").write_text(f"RIGBOOK_SERVE_API_KEY={key}\n")
    (tmp_path / "units/rigbook-serve-qwen.service").write_text("old unit\n")
    run = run_module(serve_units, dict(a, wait=False), [
        (["systemctl", "get-default"], ok("multi-user.target\n")), running(),
        (["systemctl", "daemon-reload"], ok()),
        (["systemctl", "reset-failed", "rigbook-serve-qwen.service"], ok()),
        (["systemctl", "restart", "rigbook-serve-qwen.service"], ok()),
    ], diff=True)
    assert not run.failed, run.msg
    unit = run.result["units"]["qwen"]
    assert unit["changed"] == ["unit", "env", "key"] and unit["restarted"] is True
    assert unit["files_removed"] == [str(tmp_path / "serve/qwen.key.env")]
    assert not (tmp_path / "serve/qwen.key.env").exists()
    written = tmp_path / "serve/qwen.key.yaml"
    assert os.stat(written).st_mode & 0o777 == 0o600 and os.stat(tmp_path / "serve/qwen.env").st_mode & 0o777 == 0o600
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(written.read_text()) == {"api-key": key}  # as SGLang's --config reads it
    assert key not in repr(run.result) and "s3cr#t" not in repr(run.result)  # result and diff
    assert f"LoadCredential=api-key.yaml:{written}" in (tmp_path / "units/rigbook-serve-qwen.service").read_text()
    assert (tmp_path / "modules-load.d/rigbook-serve.conf").read_text().splitlines()[-1] == "nvidia-uvm"


def test_a_file_of_the_unit_that_is_a_link_is_never_written_through(tmp_path):
    prof = profile(tmp_path)
    a = converge(tmp_path, prof)
    elsewhere = tmp_path / "elsewhere.env"
    elsewhere.write_text("someone else's\n")
    (tmp_path / "serve/qwen.env").unlink()
    (tmp_path / "serve/qwen.env").symlink_to(elsewhere)
    run = run_module(serve_units, a, [(["systemctl", "get-default"], ok("multi-user.target\n")), running()])
    assert run.failed and run.msg.startswith(f"cannot write {tmp_path / 'serve/qwen.env'}: ")
    assert "symbolic link" in run.msg and elsewhere.read_text() == "someone else's\n"


def test_a_failed_systemctl_show_fails_the_run_instead_of_guessing_the_units_state(tmp_path):
    run = run_module(serve_units, args(tmp_path, [profile(tmp_path)]), [
        (["systemctl", "get-default"], ok("multi-user.target\n")),
        (SHOW, fail(1, "Failed to connect to bus: No such file or directory"))], check_mode=True)
    assert run.failed and run.msg == (" ".join(SHOW) + " failed (rc 1): Failed to connect to bus: No such file or "
                                      "directory")


def test_a_profile_that_drops_its_key_loses_the_key_file(tmp_path):
    prof = profile(tmp_path)
    a = converge(tmp_path, prof)
    (tmp_path / "serve/qwen.key.yaml").write_text('api-key: "old"\n')
    run = run_module(serve_units, a, [(["systemctl", "get-default"], ok("multi-user.target\n")), running()],
                     check_mode=True)
    assert run.result["changed"] and run.result["units"]["qwen"]["files_removed"] == [
        str(tmp_path / "serve/qwen.key.yaml")]
    assert (tmp_path / "serve/qwen.key.yaml").exists()  # check mode


def test_a_world_readable_key_file_is_refused(tmp_path):
    path = key_file(tmp_path)
    os.chmod(path, 0o644)
    run = run_module(serve_units, args(tmp_path, [profile(tmp_path, api_key_file=path)]),
                     [(["systemctl", "get-default"], ok("multi-user.target\n"))], check_mode=True)
    assert run.failed and "is mode 0644; make it 0600" in run.msg


@pytest.mark.parametrize("key, why", [
    ("two words", "holds no key of printable characters without spaces (at most 512)"), ("", "is empty")])
def test_a_key_file_without_a_key_is_refused_and_never_shown(tmp_path, key, why):
    path = key_file(tmp_path, key)
    run = run_module(serve_units, args(tmp_path, [profile(tmp_path, api_key_file=path)]),
                     [(["systemctl", "get-default"], ok("multi-user.target\n"))], check_mode=True)
    assert run.failed and run.msg == f"serve profile qwen: api_key_file {path} {why}"
    assert "two words" not in repr(run.result)


ADMIN = "adm-s3cr3t-%7b"


def admin_file(tmp_path, key=ADMIN, mode=0o600):
    path = tmp_path / "admin.key"
    path.write_text(key + "\n")
    os.chmod(path, mode)
    return str(path)


@pytest.mark.parametrize("with_api_key", [True, False], ids=["both-keys", "admin-key-only"])
def test_the_admin_key_reaches_the_engine_as_a_credential_never_in_the_unit(tmp_path, with_api_key):
    keys = dict(api_key_file=key_file(tmp_path)) if with_api_key else {}
    prof = profile(tmp_path, admin_api_key_file=admin_file(tmp_path), **keys)
    run = run_module(serve_units, dict(args(tmp_path, [prof]), wait=False), [
        (["systemctl", "get-default"], ok("multi-user.target\n")), running("inactive"),
        (["systemctl", "daemon-reload"], ok()),
        (["systemctl", "enable", "rigbook-serve-qwen.service"], ok()),
        (["systemctl", "reset-failed", "rigbook-serve-qwen.service"], ok()),
        (["systemctl", "restart", "rigbook-serve-qwen.service"], ok()),
    ], diff=True)
    assert not run.failed, run.msg
    unit = (tmp_path / "units/rigbook-serve-qwen.service").read_text()
    written = tmp_path / "serve/qwen.key.yaml"
    assert ADMIN not in unit and "--admin-api-key" not in unit and "%%7b" not in unit
    [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start.endswith("--config %d/api-key.yaml") and f"LoadCredential=api-key.yaml:{written}" in unit
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(written.read_text()) == dict({"admin-api-key": ADMIN}, **({"api-key": KEY} if with_api_key
                                                                                     else {}))
    assert os.stat(written).st_mode & 0o777 == 0o600
    assert ADMIN not in repr(run.result) and KEY not in repr(run.result)  # result and diff


def test_a_world_readable_admin_key_file_is_refused(tmp_path):
    path = admin_file(tmp_path, mode=0o640)
    run = run_module(serve_units, args(tmp_path, [profile(tmp_path, admin_api_key_file=path)]),
                     [(["systemctl", "get-default"], ok("multi-user.target\n"))], check_mode=True)
    assert run.failed and run.msg == (f"serve profile qwen: admin_api_key_file {path} is mode 0640; make it 0600 "
                                      "(readable by root only)")


def test_the_admin_key_in_extra_args_is_refused_on_the_box_and_never_shown(tmp_path):
    prof = profile(tmp_path, extra_args=["--admin-api-key", ADMIN])
    run = run_module(serve_units, args(tmp_path, [prof]),
                     [(["systemctl", "get-default"], ok("multi-user.target\n"))], check_mode=True)
    assert run.failed and "extra_args[0]: --admin-api-key: never put the admin API key on the command line" in run.msg
    assert ADMIN not in repr(run.result) and not (tmp_path / "units/rigbook-serve-qwen.service").exists()


# --- an engine started by hand, taken over by its unit --------------------------------------------------------

def _proc(root, pid, argv, cgroup):
    folder = root / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "status").write_text("Name:\tpython3\nPPid:\t1\n")
    (folder / "cgroup").write_text(cgroup)


def test_an_engine_started_by_hand_on_a_profiles_port_is_found_and_rigbooks_own_units_are_not(tmp_path):
    # a recorded /proc: the engine an owner started with nohup (lab handmade's), one of rigbook's units, another port
    standin = ["/opt/sglang/bin/python", "/var/cache/rigbook/artifacts/sglang-standin.py"]
    _proc(tmp_path, 68, standin + ["--model-path", "/m", "--port", "30000"], "0::/system.slice/ssh.service\n")
    _proc(tmp_path, 90, ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--port", "30001"],
          "0::/system.slice/rigbook-serve-other.service\n")
    _proc(tmp_path, 95, ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m"],
          "0::/user.slice/session-3.scope\n")
    profiles = [{"name": "engine", "port": 30000}, {"name": "other", "port": 30001}]
    found = serve_units.engines_by_hand(profiles, ["/usr/bin/python3", standin[1]], root=str(tmp_path))
    # 95 gave no --port: it serves the default, 30000, the profile's port too
    assert list(found) == ["engine"] and [p["pid"] for p in found["engine"]] == [68, 95]
    assert found["engine"][0]["argv"][:2] == standin
    # without the inventory's engine command only `-m sglang.launch_server` is an engine
    assert [p["pid"] for p in serve_units.engines_by_hand(profiles, [], root=str(tmp_path))["engine"]] == [95]


def test_an_engine_started_by_hand_is_stopped_with_its_process_group(tmp_path):
    import subprocess
    import sys

    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                               "time.sleep(60)"], start_new_session=True)
    try:
        assert serve_units.stop_by_hand(leader.pid, timeout_s=10) in ("exited", "gone")
        leader.wait(timeout=10)
        assert leader.returncode == -15
        assert serve_units.stop_by_hand(leader.pid, timeout_s=1) == "gone"
    finally:
        if leader.poll() is None:
            leader.kill()


def test_a_port_taken_by_a_process_outside_the_unit_gets_no_key_and_fails_the_task(tmp_path):
    """Live on loopback: while the engine loads, a local user (here: this test's own process, in no serve unit's
    control group) listens on the profile's port. The readiness wait sends nothing and says why."""
    catcher = socket.socket()
    catcher.bind(("127.0.0.1", 0))
    catcher.listen()
    catcher.settimeout(0.3)
    port = catcher.getsockname()[1]
    prof = profile(tmp_path, api_key_file=key_file(tmp_path), port=port, bind="127.0.0.1", startup_timeout_s=60)
    state = show({"Id": "rigbook-serve-qwen.service", "ActiveState": "activating", "UnitFileState": "enabled",
                  "ControlGroup": "/system.slice/rigbook-serve-qwen.service"})
    try:
        run = run_module(serve_units, args(tmp_path, [prof]), [
            (["systemctl", "get-default"], ok("multi-user.target\n")), running("inactive"),
            (["systemctl", "daemon-reload"], ok()),
            (["systemctl", "enable", "rigbook-serve-qwen.service"], ok()),
            (["systemctl", "reset-failed", "rigbook-serve-qwen.service"], ok()),
            (["systemctl", "restart", "rigbook-serve-qwen.service"], ok()),
            (SHOW, ok(state)), (SHOW, ok(state)),
            (["journalctl", "-u", "rigbook-serve-qwen.service", "-n", "30", "--no-pager", "-o", "cat"], ok("")),
        ])
        with pytest.raises(socket.timeout):
            catcher.accept()  # no connection was made, so no key could be read
    finally:
        catcher.close()
    assert run.failed
    assert run.msg.startswith(f"rigbook-serve-qwen.service is not ready: a process outside rigbook-serve-qwen.service "
                              f"listens on 127.0.0.1:{port} (pid {os.getpid()}): the API key was not sent")
    assert KEY not in repr(run.result)
