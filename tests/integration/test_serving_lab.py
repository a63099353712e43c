"""SGLang and the serve units for real on both lab hosts, and the serving layer against what runs.

Real: the venv with the pinned SGLang 0.5.23 wheel (installed without its GPU dependencies: see
inventory/lab/group_vars), the shipped patches applied to it, the lock, the rigbook-serve user, the unit and env
files, systemd (enable, restart, reboot), HTTP over loopback. TEST STAND-IN: the engine process
(tests/artifacts/sglang_standin.py: SGLang's flags, log format and endpoints, figures from the host's recorded tree).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from helpers import LAB_MARKS, REPO, provision

from rigbook.lab import machine, state

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("lab")]
UNIT = "rigbook-serve-standin.service"
HOSTS = ("lab-3080", "lab-r9700")
GROUP = {"lab-3080": "x99_3080", "lab-r9700": "x99_r9700"}


def on_host(host: str, command: str) -> str:
    proc = subprocess.run(machine.ssh_command(state.load().host(host), f"sudo -n sh -c {json.dumps(command)}"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def unit(host: str, prop: str) -> str:
    return on_host(host, f"systemctl show {UNIT} -p {prop} --value").strip()


def site(*args, timeout=1800):
    proc = provision("site.yml", "-i", "lab", "--json", *args, timeout=timeout)
    assert proc.stdout, proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


def verify(*args):
    proc = provision("verify", "-i", "lab", "--json", *args)
    assert proc.stdout, proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)["hosts"]


def profile(host: str, **changes) -> list:
    """The host's lab serve profile with CHANGES, as a one-item rigbook_serve."""
    data = yaml.safe_load((REPO / "inventory/lab/group_vars" / f"{GROUP[host]}.yml").read_text())
    return [dict(data["rigbook_serve"][0], **changes)]


def extra(tmp_path, **variables) -> str:
    path = tmp_path / "extra.yml"
    path.write_text(yaml.safe_dump(variables))
    return f"@{path}"


def serving(hosts: dict, host: str) -> dict:
    [verdict] = [v for v in hosts[host]["ladder"] if v["layer"] == "serving"]
    return verdict


def test_site_converged_both_hosts_to_a_ready_server(converged_lab):
    summary = json.loads(converged_lab.stdout)
    for host in HOSTS:
        assert summary["hosts"][host]["failed"] == 0, summary["hosts"][host]
        verdict = serving(summary["hosts"], host)
        assert verdict["status"] == "pass", verdict
        assert unit(host, "ActiveState") == "active" and unit(host, "UnitFileState") == "enabled"
        assert unit(host, "User") == "rigbook-serve"
        venv = on_host(host, "ls -d /opt/rigbook/sglang/0.5.23-*/").split()
        assert len(venv) == 1
        stamp = json.loads(on_host(host, f"cat {venv[0]}.rigbook-venv.json"))
        assert stamp["versions"] == {"sglang": "0.5.23"}
        assert set(stamp["files"]) == {"sglang/srt/layers/logits_processor.py", "sglang/srt/entrypoints/engine.py",
                                       "sglang/srt/server_args.py"}
        assert "get_device_capability()[0] >= 9" in on_host(
            host, f"cat {venv[0]}lib/python3*/site-packages/sglang/srt/layers/logits_processor.py")
    env = on_host("lab-r9700", f"systemctl cat {UNIT}")
    assert "EnvironmentFile=/etc/rigbook/gpu.env" in env and "EnvironmentFile=/etc/rigbook/serve/standin.env" in env
    assert "--disable-custom-all-reduce" in on_host("lab-3080", f"systemctl cat {UNIT}")  # no P2P on the 3080 box
    models = on_host("lab-r9700", "python3 -c \"import urllib.request; "
                                  "print(urllib.request.urlopen('http://127.0.0.1:30001/v1/models').read().decode())\"")
    assert json.loads(models)["data"][0]["id"] == "standin"
    measured = serving(summary["hosts"], "lab-r9700")["measured"]
    assert "isAllDirectP2p" in json.dumps(measured) or "p2p" in json.dumps(measured), measured


def test_a_rerun_changes_nothing_and_restarts_nothing(converged_lab):
    started = {host: unit(host, "ExecMainStartTimestamp") for host in HOSTS}
    proc, summary = site()
    assert proc.returncode == 0, proc.stderr[-3000:]
    for host in HOSTS:
        assert summary["hosts"][host]["changed"] == 0, summary["hosts"][host]
        assert unit(host, "ExecMainStartTimestamp") == started[host]
        assert serving(summary["hosts"], host)["status"] == "pass"


def test_changing_one_serve_arg_restarts_the_unit_exactly_once(converged_lab, tmp_path):
    host = "lab-r9700"
    changed = extra(tmp_path, rigbook_serve=profile(host, extra_args=["--log-level", "info"]))
    args = ("--limit", host, "--tags", "serve,serving")
    before = unit(host, "ExecMainStartTimestamp")
    try:
        proc, summary = site("-e", changed, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        first = unit(host, "ExecMainStartTimestamp")
        assert first != before and "--log-level info" in on_host(host, f"systemctl cat {UNIT}")
        assert serving(summary["hosts"], host)["status"] == "pass"
        proc, summary = site("-e", changed, *args)
        assert proc.returncode == 0 and summary["hosts"][host]["changed"] == 0, summary["hosts"][host]
        assert unit(host, "ExecMainStartTimestamp") == first
    finally:
        proc, _ = site(*args)  # back to the inventory's profile
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_profile_the_host_refuses_writes_and_restarts_nothing(converged_lab, tmp_path):
    host = "lab-3080"
    before = (unit(host, "ExecMainStartTimestamp"), on_host(host, f"systemctl cat {UNIT}"))
    bad = extra(tmp_path, rigbook_serve=profile(host, model_path="/srv/models/not-here"))
    proc, summary = site("-e", bad, "--limit", host, "--tags", "serve")
    assert proc.returncode == 1
    [failure] = summary["hosts"][host]["failures"]
    assert failure["task"] == "Check the serve units (profiles, files, unit states)", failure
    assert "rigbook_serve[0].model_path" in failure["msg"] and "/srv/models/not-here" in failure["msg"]
    assert "nothing was written or restarted" in failure["msg"] and "Traceback" not in proc.stderr
    assert (unit(host, "ExecMainStartTimestamp"), on_host(host, f"systemctl cat {UNIT}")) == before


def test_the_unit_comes_back_after_a_reboot_and_serving_passes(converged_lab):
    host = "lab-3080"
    proc = provision(REPO / "tests/integration/reboot.yml", "-i", "lab", "--limit", host, "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, hosts = verify("--limit", host, "--tags", "serving")
    assert code == 0, hosts
    assert [v["layer"] for v in hosts[host]["ladder"]] == ["serving"]
    assert unit(host, "ActiveState") == "active"


@pytest.mark.parametrize("fault,host", [("serve-shm", "lab-r9700"), ("decode-half", "lab-r9700"),
                                        ("serve-slow-start", "lab-3080"), ("serve-crashloop", "lab-3080")])
def test_each_serve_fault_fails_the_serving_layer_and_only_it(converged_lab, fault, host):
    recorded = provision("baseline", "record", "-i", "lab", "--limit", host, "--json", timeout=900)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    broke = provision("lab", "break", host, fault, timeout=600)
    assert broke.returncode == 0, broke.stderr
    try:
        code, hosts = verify("--limit", host)
        assert code == 1, hosts
        ladder = hosts[host]["ladder"]
        assert [v["layer"] for v in ladder if v["status"] == "fail"] == ["serving"], ladder
        verdict = ladder[-1]
        assert verdict["layer"] == "serving" and verdict["measured"] is not None and verdict["remedy"], verdict
        msg = hosts[host]["failures"][0]["msg"]
        assert msg.startswith("serving: fail:") and "measured" in msg and "expected" in msg
    finally:
        healed = provision("lab", "heal", host, timeout=600)
        assert healed.returncode == 0, healed.stderr
    code, hosts = verify("--limit", host, "--tags", "serving")
    assert code == 0, hosts  # healed: the restarted engine serves as recorded again
