"""The rccl role for real on the lab's AMD host, and the ladder running what it built.

Real: apt (cmake, g++ through the lab's apt cache), `patch`, cmake builds, the async build, the stamp, the prefix
and its `current` link, the GPU environment file. TEST STAND-INS (tests/artifacts/rccl_standin.py, packed by
`lab up`): the RCCL source (a small C++ tree laid out like RCCL, to which the shipped patch applies) and rccl-tests
(figures from the host's recorded evidence, picked by the transport the installed librccl chooses). The session's
lab is shared (tests/integration/conftest.py); tests/integration/rccl_lab.yml runs the role alone until site.yml's
AMD play runs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from helpers.cli import REPO, provision
from helpers.lab_host import LAB_MARKS

from rigbook.lab import machine, state
from rigbook.paths import state_dir

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("lab")]
HOST = "lab-r9700"
PLAYBOOK = REPO / "tests/integration/rccl_lab.yml"
PINS = yaml.safe_load((REPO / "inventory/lab/group_vars/x99_r9700.yml").read_text())["rigbook_pins"]["rccl"]
ROOT = "/opt/rigbook/rccl"
LOG = f"{ROOT}/.rccl-build.log"


def on_host(command: str, check: bool = True):
    host = state.load().host(HOST)
    proc = subprocess.run(machine.ssh_command(host, f"sudo -n sh -c {json.dumps(command)}"), capture_output=True,
                          text=True, timeout=600)
    assert not check or proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout if check else proc


def play(*args, timeout=900):
    """(process, changed task names) of the test playbook on the AMD host."""
    proc = provision(PLAYBOOK, "-i", "lab", "--limit", HOST, "--json", *args, timeout=timeout)
    changed = [line.split(": ", 2)[2] for line in proc.stderr.splitlines() if line.strip().startswith("changed: ")]
    return proc, changed


def verify(*args):
    proc = provision("verify", "-i", "lab", "--limit", HOST, "--json", "--tags", "collectives,nccl_transport", *args)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["hosts"][HOST]


def host_state() -> str:
    return on_host(f"ls -la {ROOT} /opt/rigbook 2>&1; cat {LOG} 2>&1 | grep -c configure; "
                   "dpkg-query -W -f='${Package} ${Version}\\n' cmake g++ 2>&1; true")


def override(tmp_path, **variables):
    extra = tmp_path / "extra.yml"
    extra.write_text(yaml.safe_dump(variables))
    return f"@{extra}"


def lab_artifacts_sha(name: str) -> str:
    import hashlib

    from rigbook.lab import artifacts

    return hashlib.sha256((artifacts.source_dir() / name).read_bytes()).hexdigest()


def test_bad_sha256_is_refused_before_anything_is_installed(lab_artifacts, tmp_path):
    before = host_state()
    bad = dict(PINS["source"], sha256="0" * 64)
    proc, changed = play("-e", override(tmp_path, rccl_source=bad))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "FAILED at task 'Verify the RCCL and rccl-tests sources (sha256)'" in out and "0" * 64 in out, out[-3000:]
    assert [c for c in changed if c != "The amd_rocm role's block of the GPU environment file"] == []
    assert host_state() == before


def test_bumped_source_fails_before_building_naming_the_patch_and_file(lab_artifacts, tmp_path):
    bumped = {"path": "/var/cache/rigbook/artifacts/rccl-standin-2.27.8-bumped.tar.gz",
              "sha256": lab_artifacts_sha("rccl-standin-2.27.8-bumped.tar.gz")}
    log_before = on_host(f"cat {LOG} 2>/dev/null; true")
    proc, changed = play("-e", override(tmp_path, rccl_source=bumped, rccl_version="2.27.8"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "FAILED at task 'Check the RCCL build (sources, patches, stamp, prefix)'" in out, out[-3000:]
    assert "patch p2p-level-user-last.patch no longer applies to rccl 2.27.8" in out, out[-3000:]
    assert "failed on src/graph/paths.cc" in out
    assert on_host(f"ls -d {ROOT}/2.27.8-* 2>/dev/null; true").strip() == ""  # nothing built or installed
    assert on_host(f"cat {LOG} 2>/dev/null; true") == log_before  # no build started


def test_build_then_a_rerun_changes_nothing_and_rebuilds_nothing(lab_artifacts):
    on_host(f"rm -rf {ROOT}")  # as on a fresh host (the session's converged lab may have built it already)
    shutil.rmtree(state_dir() / "builds", ignore_errors=True)  # no group build on the controller to install
    proc, changed = play()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Wait for the group's build" in changed, changed
    prefix = on_host(f"readlink -f {ROOT}/current").strip()
    assert prefix.startswith(f"{ROOT}/2.27.7-") and not prefix.endswith("-stock")
    listing = on_host(f"ls {prefix}/lib {prefix}/bin")
    assert "librccl.so" in listing and "sendrecv_perf" in listing and "all_reduce_perf" in listing
    env = on_host("cat /etc/rigbook/gpu.env")
    assert f"LD_LIBRARY_PATH={prefix}/lib" in env and "NCCL_P2P_LEVEL=PHB" in env
    assert "-DGPU_TARGETS=gfx1201" in on_host(f"cat {prefix}/.rigbook-build.json")
    stamp = on_host(f"stat -c %Y {prefix}/.rigbook-build.json {prefix}/lib/librccl.so.1.0; wc -l < {LOG}")
    again, changed = play()
    assert again.returncode == 0, again.stderr[-3000:]
    assert changed == [], changed
    assert on_host(f"stat -c %Y {prefix}/.rigbook-build.json {prefix}/lib/librccl.so.1.0; wc -l < {LOG}") == stamp
    check, changed = play("--check", "--diff")
    assert check.returncode == 0 and changed == [], changed


def test_the_ladder_runs_the_built_rccl_tests(lab_artifacts):
    code, host = verify()
    assert code == 0, host
    layers = {v["layer"]: v for v in host["ladder"]}
    assert layers["collectives"]["status"] == "pass" and layers["nccl_transport"]["status"] == "pass", layers
    assert layers["collectives"]["measured"]["source"].startswith("rccl-tests/nccl-tests in /opt/rigbook/rccl/current")
    assert layers["collectives"]["measured"]["p2p_gain"].startswith("1.41x")
    assert "9.75" in layers["collectives"]["measured"]["sendrecv"]
    assert layers["nccl_transport"]["measured"]["path"] == "p2p"


@pytest.mark.parametrize("fault, role, tag", [("rccl-unpatched", "rccl", "rccl"),
                                              ("p2p-level-unset", "amd_rocm", "amd_rocm")])
def test_fault_fails_at_collectives_and_rerunning_the_named_role_fixes_it(lab_artifacts, fault, role, tag):
    broke = provision("lab", "break", HOST, fault, timeout=600)
    assert broke.returncode == 0, broke.stderr
    try:
        code, host = verify()
        assert code == 1, host
        assert [v["layer"] for v in host["ladder"] if v["status"] == "fail"] == ["collectives"], host["ladder"]
        verdict = host["ladder"][-1]
        assert verdict["layer"] == "collectives" and "P2P gain 1.00x" in verdict["why"], verdict
        assert f"re-run the {role} role" in verdict["remedy"], verdict["remedy"]
        fixed, changed = play("--tags", tag)
        assert fixed.returncode == 0 and changed, fixed.stderr[-3000:]
        code, host = verify()
        assert code == 0, host["ladder"]
    finally:
        healed = provision("lab", "heal", HOST)
        assert healed.returncode == 0, healed.stderr


def test_an_evidence_fault_the_built_tests_would_overwrite_is_refused(lab_artifacts):
    assert on_host(f"ls {ROOT}/current/bin/sendrecv_perf").strip()
    broke = provision("lab", "break", HOST, "nccl-shm-fallback")
    assert broke.returncode == 2, broke.stdout + broke.stderr
    assert "would change nothing this host's verify reads" in broke.stderr and "rccl-unpatched" in broke.stderr
    assert "Traceback" not in broke.stderr
