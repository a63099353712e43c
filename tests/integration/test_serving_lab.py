"""SGLang and the serve units for real on both lab hosts, and the serving layer against what runs.

Real: the venv with the pinned SGLang 0.5.23 wheel (installed without its GPU dependencies: see
inventory/lab/group_vars), the shipped patches applied to it, the lock, the rigbook-serve user, the unit and env
files, systemd (enable, restart, reboot), HTTP over loopback. TEST STAND-IN: the engine process
(tests/artifacts/sglang_standin.py: SGLang's flags, log format and endpoints, figures from the host's recorded tree).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers.cli import REPO, provision
from helpers.lab_host import LAB_MARKS

from rigbook import paths
from rigbook.lab import machine, state
from rigbook.run import resolve_inventory
from rigbook.validate import validate

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("lab")]
UNIT = "rigbook-serve-standin.service"
HOSTS = ("lab-3080", "lab-r9700")


SCORE = re.compile(r"Overall exposure level for \S+: ([0-9.]+) ")


def on_host(host: str, command: str, stdin: str | None = None) -> str:
    """COMMAND's output, run as root on HOST over its SSH; STDIN (a script, a secret) goes on standard input, never
    on a command line."""
    proc = subprocess.run(machine.ssh_command(state.load().host(host), f"sudo -n sh -c {json.dumps(command)}"),
                          capture_output=True, text=True, timeout=300, input=stdin)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def exposure(host: str, unit_name: str) -> float:
    """`systemd-analyze security` of the running UNIT_NAME on HOST: its overall exposure (0 best, 10 worst)."""
    out = on_host(host, f"systemd-analyze security --no-pager {unit_name}")
    found = SCORE.search(out)
    assert found, out
    return float(found.group(1))


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
    """The host's serve profile in the running lab's inventory (`-i lab`: in an address block other than 0 it binds
    the host's own address) with CHANGES, as a one-item rigbook_serve."""
    served = validate(resolve_inventory("lab")).host_vars(host)["rigbook_serve"]
    return [dict(served[0], **changes)]


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
    for host in HOSTS:  # the sandbox, measured on the running unit: 8.7 EXPOSED before (roles/serve/README.md)
        assert exposure(host, UNIT) <= 4.5
    env = on_host("lab-r9700", f"systemctl cat {UNIT}")
    assert "EnvironmentFile=/etc/rigbook/gpu.env" in env and "EnvironmentFile=/etc/rigbook/serve/standin.env" in env
    assert "--disable-custom-all-reduce" in on_host("lab-3080", f"systemctl cat {UNIT}")  # no P2P on the 3080 box
    bound = re.search(r"--host[= ](\S+)", on_host("lab-r9700", f"systemctl cat {UNIT}")).group(1)
    models = on_host("lab-r9700", "python3 -c \"import urllib.request; "
                                  f"print(urllib.request.urlopen('http://{bound}:30001/v1/models').read().decode())\"")
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


# The key-protected profile of the test below: on the host's second loopback address (its own lab address), its port.
KEYED_PORT = 30021
KEY_FILE = "/etc/rigbook/lab-serve-api.key"
SCAN_PROC = """
import json, os
key = KEY.encode()
found, scanned = [], 0
for pid in os.listdir("/proc"):
    for part in ("cmdline", "environ"):
        try:
            with open("/proc/%s/%s" % (pid, part), "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        scanned += 1
        if key in data:
            found.append([pid, part, data.split(b"\\0")[0].decode(errors="replace")])
print(json.dumps({"scanned": scanned, "found": found}))
"""


KEY_IN_JOURNAL = """
import json, subprocess
out = subprocess.run(["journalctl", "-u", "rigbook-serve-keyed.service", "-b", "-o", "cat", "--no-pager"],
                     capture_output=True, text=True).stdout
print(json.dumps([line for line in out.splitlines() if KEY in line]))
"""


def local_processes_with(key: bytes) -> tuple:
    """(files read, [(pid, part)] holding KEY) of every process's cmdline and environ on this machine: the lab
    hosts' processes are this machine's too (their PID namespaces are children of this one)."""
    found, scanned = [], 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{pid}/{part}").read_bytes()
            except OSError:
                continue
            scanned += 1
            if key in data:
                found.append((pid, part))
    return scanned, found


def state_files_with(key: bytes) -> tuple:
    """(files read, [paths holding KEY]) under the controller's state directory: run records, the run lock, logs,
    ansible-runner artifacts, reports; not the lab hosts' own disks (their root, upper and work directories)."""
    top = paths.state_dir().resolve()
    disks = {top / "lab" / "hosts" / name / part for name in os.listdir(top / "lab" / "hosts")
             for part in ("root", "upper", "work")} if (top / "lab" / "hosts").is_dir() else set()
    found, scanned = [], 0
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if Path(folder, d) not in disks and not Path(folder, d).is_symlink()]
        for name in files:
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            scanned += 1
            if key in path.read_bytes():
                found.append(str(path))
    return scanned, found


def http_status(url: str, key: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def test_changing_the_serve_profiles_restarts_only_what_changed_and_a_key_shows_nowhere(converged_lab, tmp_path):
    """One serve arg changed: that unit restarts exactly once. A key-protected profile added on the host's second
    loopback address: it starts, refuses requests without the key and answers with it, and its key is in no
    process's argv or environment on the host, in no file of the controller's state (run records, lock, logs,
    `provision report`) although the engine's journal shows it (the stand-in logs as an unpatched SGLang does);
    its unit rates 4.5 or better in `systemd-analyze security`. Back to the inventory's profile, the keyed unit and
    its files are gone."""
    host = "lab-r9700"
    address = state.load().host(host).address  # this host's own loopback address (127.0.11.2 in block 0)
    key = "lab-" + secrets.token_urlsafe(24)
    on_host(host, f"umask 077; cat > {KEY_FILE}", stdin=key + "\n")
    # custom_all_reduce set: -e gives this list to every host of the inventory, the P2P-less lab-3080 too
    keyed = dict(profile(host)[0], name="keyed", served_model_name="keyed", bind=address, port=KEYED_PORT,
                 api_key_file=KEY_FILE, custom_all_reduce=False)
    changed = extra(tmp_path, rigbook_serve=profile(host, extra_args=["--log-level", "info"],
                                                    custom_all_reduce=False) + [keyed])
    args = ("--limit", host, "--tags", "serve,serving")
    before = unit(host, "ExecMainStartTimestamp")
    keyed_unit = "rigbook-serve-keyed.service"
    try:
        proc, summary = site("-e", changed, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        first = unit(host, "ExecMainStartTimestamp")
        assert first != before and "--log-level info" in on_host(host, f"systemctl cat {UNIT}")
        # The stand-in logs its server_args line as an unpatched SGLang does, the key included (the lab's SGLang
        # venv has api-key-out-of-logs.patch, the stand-in does not model it): the serving layer says so, once.
        verdict = serving(summary["hosts"], host)
        assert verdict["status"] == "warn", verdict
        assert "keyed: the API key appears in the engine's log" in verdict["why"] and "standin:" not in verdict["why"]
        logged = json.loads(on_host(host, "python3 -", stdin=f"KEY = {key!r}\n" + KEY_IN_JOURNAL))
        assert logged and all("server_args=" in line for line in logged), logged  # that line alone

        # the key: in the root-only credential the unit hands over, nowhere else
        text = on_host(host, f"systemctl cat {keyed_unit}")
        assert "LoadCredential=api-key.yaml:/etc/rigbook/serve/keyed.key.yaml" in text
        assert "--config %d/api-key.yaml" in text and key not in text
        assert on_host(host, "stat -c '%a %U' /etc/rigbook/serve/keyed.key.yaml /etc/rigbook/serve/keyed.env "
                             "/etc/rigbook/serve/standin.env").split("\n")[:3] == ["600 root"] * 3
        remote = json.loads(on_host(host, "python3 -", stdin=f"KEY = {key!r}\n" + SCAN_PROC))
        assert remote["scanned"] > 20 and remote["found"] == [], remote
        scanned, found = local_processes_with(key.encode())
        assert scanned > 20 and found == [], found

        # the endpoint, on the second address only
        url = f"http://{address}:{KEYED_PORT}/v1/models"
        assert http_status(url) == 401 and http_status(url, "wrong-" + key) == 401
        assert http_status(url, key) == 200
        with pytest.raises(urllib.error.URLError):
            http_status(f"http://127.0.0.1:{KEYED_PORT}/v1/models", key)
        assert exposure(host, keyed_unit) <= 4.5

        proc, summary = site("-e", changed, *args)
        assert proc.returncode == 0 and summary["hosts"][host]["changed"] == 0, summary["hosts"][host]
        assert unit(host, "ExecMainStartTimestamp") == first

        report = provision("report", "-i", "lab", "-o", tmp_path / "report.html")
        assert report.returncode == 0, report.stderr
        assert key not in (tmp_path / "report.html").read_text() and key not in report.stdout + report.stderr
        scanned, found = state_files_with(key.encode())
        assert scanned > 10 and found == [], found
    finally:
        proc, _ = site(*args)  # back to the inventory's profile
        assert proc.returncode == 0, proc.stderr[-3000:]
        on_host(host, f"rm -f {KEY_FILE}")
    assert on_host(host, f"systemctl show {keyed_unit} -p LoadState --value").strip() == "not-found"
    assert on_host(host, "ls /etc/rigbook/serve").split() == ["standin.env"]


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


def serving_failure(host: str) -> dict:
    """The serving verdict of `verify` on HOST, which must fail at the serving layer and only there, its message
    with measured and expected values."""
    code, hosts = verify("--limit", host)
    assert code == 1, hosts
    ladder = hosts[host]["ladder"]
    assert [v["layer"] for v in ladder if v["status"] == "fail"] == ["serving"], ladder
    msg = hosts[host]["failures"][0]["msg"]
    assert msg.startswith("serving: fail:") and "measured" in msg and "expected" in msg
    assert ladder[-1]["layer"] == "serving"
    return ladder[-1]


# Over SSH, one engine fault (the running engine's own log shows SHM). The serving judge's other faults (a crash loop
# from NRestarts, not ready within the timeout, decode below the baseline) are checked in
# tests/unit/plugins/module_utils/judges/test_ladder_serving.py: the judge, and the collectors against an HTTP
# engine stand-in and recorded `systemctl show` and journal output.
@pytest.mark.parametrize("fault,host", [("serve-shm", "lab-r9700")])
def test_a_serve_fault_fails_the_serving_layer_and_only_it(converged_lab, fault, host):
    recorded = provision("baseline", "record", "-i", "lab", "--limit", host, "--json", timeout=900)
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    broke = provision("lab", "break", host, fault, timeout=600)
    assert broke.returncode == 0, broke.stderr
    try:
        verdict = serving_failure(host)
        assert verdict["measured"] is not None and verdict["remedy"], verdict
    finally:
        healed = provision("lab", "heal", host, timeout=600)
        assert healed.returncode == 0, healed.stderr
    code, hosts = verify("--limit", host, "--tags", "serving")
    assert code == 0, hosts  # healed: the restarted engine serves as recorded again


def test_an_engine_on_torchs_bundled_rccl_fails_serving_and_the_sglang_role_makes_it_run_the_verified_one(
        converged_lab):
    """Fault engine-bundled-rccl: a stock RCCL where a ROCm torch wheel keeps its own (torch/lib/librccl.so.1) in the
    SGLang venv. The engine stand-in loads it as libtorch would (its DT_RPATH before LD_LIBRARY_PATH) and, being
    stock, it picks SHM; the collectives layer, which ran rccl-tests on the patched build, still passes."""
    host = "lab-r9700"
    broke = provision("lab", "break", host, "engine-bundled-rccl", timeout=600)
    assert broke.returncode == 0, broke.stderr
    try:
        verdict = serving_failure(host)
        assert "torch/lib/librccl.so.1" in verdict["why"] and "DT_RPATH" in verdict["why"], verdict["why"]
        assert "shows SHM" in verdict["why"]  # what the stock build picked on this host
        measured = verdict["measured"]["standin"]
        assert measured["collectives_library"].split(" ")[0].endswith("/torch/lib/librccl.so.1")
        # the sglang role (tagged serve with the serve role) links the bundled copy to the verified build and the
        # engine restarts on it
        fixed, _ = site("--limit", host, "--tags", "serve", timeout=900)
        assert fixed.returncode == 0, fixed.stderr[-3000:]
        code, hosts = verify("--limit", host, "--tags", "serving")
        assert code == 0, hosts
        verdict = hosts[host]["ladder"][-1]
        assert verdict["measured"]["standin"]["collectives_library"].startswith("/opt/rigbook/rccl/"), verdict
        bundled = on_host(host, "readlink /opt/rigbook/sglang/*/lib/python3*/site-packages/torch/lib/librccl.so.1")
        assert bundled.strip() == "/opt/rigbook/rccl/current/lib/librccl.so.1"
    finally:
        healed = provision("lab", "heal", host, timeout=600)
        assert healed.returncode == 0, healed.stderr
    code, hosts = verify("--limit", host, "--tags", "serving")
    assert code == 0, hosts
