"""The AMD host roles for real on a lab host: apt, dpkg, holds, apt preferences, GRUB drop-in, groups, reboots.

No AMD GPU and no AMD repository here. The pinned "custom" kernel is a real Debian kernel .deb set (image with
its modules, headers, headers-common) checked by sha256 from /var/cache/rigbook/artifacts/kernel/; ROCm comes
from a local signed apt repository of TEST STAND-IN packages (tests/artifacts/rocm_repo.py: ROCm's package names
at 7.1.0 and a newer 7.2.0, a test key) read as file:// through the lab's read-only artifact mount. Both are
prepared once per machine by the `lab_artifacts` fixture, as `lab up` does. GPU facts (rocminfo, rocm-smi, the
booted kernel's P2P config) stay at the evidence boundary: the host's recorded tree. The session's lab is shared
(tests/integration/conftest.py); these tests run while it is fresh and converge lab-r9700 themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.cli import REPO, changed_tasks, provision
from helpers.lab_host import LAB_MARKS, LabHost

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("fresh_lab")]
HOST = "lab-r9700"
PINS = yaml.safe_load((REPO / "inventory/lab/group_vars/x99_r9700.yml").read_text())["rigbook_pins"]
KERNEL = PINS["kernel"]["release"]
UPGRADE_KERNEL = "6.1.0-50-amd64"
ROCM_CORE = "7.1.0.70100-38~24.04"
REBOOT_TASK = "Reboot once into the new kernel, driver and boot target"
EVIDENCE = "/var/lib/rigbook-lab/evidence"


LAB = LabHost(HOST)


def on_host(command: str, check: bool = True) -> str:
    proc = LAB.run(command, check)
    return proc.stdout if check else proc


def host_state() -> str:
    """What the roles could change: packages and holds, apt's sources/keys/pins, the files they write, groups."""
    return on_host("dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'; apt-mark showhold; "
                   "ls -la /etc/default/grub.d /etc/apt/sources.list.d /etc/apt/keyrings /etc/apt/preferences.d "
                   "/etc/rigbook /opt /boot 2>&1; find /var/cache/rigbook -type f 2>&1; "
                   "cat /etc/apt/preferences.d/* 2>&1; "
                   "id rigbook; cat /etc/group; true")


site = LAB.site
boots = LAB.boots
reboot_host = LAB.reboot


def ladder(summary) -> dict:
    return {v["layer"]: v["status"] for v in summary.get("ladder", [])}


def test_check_diff_on_a_fresh_host_changes_nothing(lab_artifacts):
    before = host_state()
    proc, summary, changed, _ = site("--check", "--diff")
    # Every role runs in check mode; the ladder then judges the host as it is (nothing installed, no reboot):
    # running 6.8.12-r9700-p2p-dma44 (the recorded tree), pinned 6.1.0-47-amd64 - the only failure.
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["failed"] == 1 and "FAILED at task 'Ladder 1-5: " in proc.stderr, proc.stderr[-3000:]
    assert "kernel_state: fail:" in proc.stderr, proc.stderr[-3000:]
    for task in ("Install and hold the pinned kernel", "Put the command line and default entry in the GRUB drop-in",
                 "Pin the ROCm repository, its signing key and version (apt preferences)",
                 "Install and hold the pinned ROCm packages", "Write ROCm's block of the GPU environment file",
                 REBOOT_TASK):
        assert task in changed, changed
    run_dir = Path(proc.stderr.rsplit("run artifacts: ", 1)[1].split()[0])
    events = "".join(p.read_text() for p in run_dir.glob("artifacts/*/job_events/*.json"))
    assert "linux-image-6.1.0-47-amd64 6.1.170-3 (to install)" in events  # --diff names the pinned .debs
    assert "Pin: version /^.*\\\\.70100-.*$/" in events and "Signed-By: /etc/apt/keyrings/rigbook-rocm.asc" in events
    assert "HSA_ENABLE_IPC_MODE_LEGACY=0" in events
    assert host_state() == before
    assert boots() == 1


@pytest.mark.parametrize("what", ["kernel-deb", "rocm-key"])
def test_bad_sha256_is_refused_before_anything_is_installed(lab_artifacts, tmp_path, what):
    before = host_state()
    pins = json.loads(json.dumps(PINS))
    if what == "kernel-deb":
        pins["kernel"]["debs"][2]["sha256"] = "0" * 64
    else:
        pins["rocm"]["repo"]["key_sha256"] = "0" * 64
    extra = tmp_path / "bad.yml"
    extra.write_text(yaml.safe_dump({"rigbook_pins": pins}))
    proc, summary, changed, _ = site("-e", f"@{extra}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "refused artifact" in out and "0" * 64 in out, out[-3000:]
    assert "FAILED at task 'Verify every pinned artifact before anything is installed (sha256)'" in out, out[-3000:]
    assert changed == [] and host_state() == before


def test_converge_then_rerun_changes_nothing(lab_artifacts):
    proc, summary, changed, first = site()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert REBOOT_TASK in changed and boots() == 2
    layers = ladder(summary)
    assert layers["kernel_state"] == "pass" and layers["driver_state"] == "pass", summary["ladder"]
    assert set(layers.values()) <= {"pass", "warn"}, summary["ladder"]
    # the boot hook "booted" the pinned kernel: the recorded tree shows its release
    assert on_host(f"cat {EVIDENCE}/proc/sys/kernel/osrelease").strip() == KERNEL
    versions = on_host("dpkg-query -W -f='${Package} ${Version}\\n' rocm-core rocminfo rocm-smi-lib hip-runtime-amd "
                       f"linux-image-{KERNEL} linux-headers-{KERNEL}")
    assert f"rocm-core {ROCM_CORE}" in versions and "rocminfo 1.0.0.70100-38~24.04" in versions, versions
    assert f"linux-image-{KERNEL} 6.1.170-3" in versions, versions
    holds = on_host("apt-mark showhold").split()
    assert {"rocm-core", "rocminfo", "rocm-smi-lib", "hip-runtime-amd", f"linux-image-{KERNEL}",
            f"linux-headers-{KERNEL}", "linux-headers-6.1.0-47-common"} <= set(holds), holds
    assert "amdgpu-dkms" not in on_host("dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' 2>/dev/null; true")
    source = on_host("cat /etc/apt/sources.list.d/rigbook-rocm.sources")
    assert "Signed-By: /etc/apt/keyrings/rigbook-rocm.asc" in source, source
    env = on_host("stat -c '%U:%G %a' /etc/rigbook/gpu.env; cat /etc/rigbook/gpu.env")
    assert env.startswith("root:root 644\n"), env
    assert "# BEGIN amd_rocm\nHSA_ENABLE_IPC_MODE_LEGACY=0\nNCCL_P2P_LEVEL=PHB\n# END amd_rocm" in env, env
    groups = on_host("id -nG rigbook").split()
    assert "render" in groups and "video" in groups, groups
    assert f'with Linux {KERNEL}"' in on_host("cat /etc/default/grub.d/rigbook.cfg")

    # Every role noted what it left, and the ladder judged the boot the converge made (kernel and driver state pass):
    # the roles that watch the boot carried their states over to it. So the re-run is one read and no role's task,
    # and changes nothing.
    pending, ran = read_and_ran()
    assert pending == {}, pending
    assert [task for task, result in ran.items() if result.get("changed")] == [], ran
    assert boots() == 2
    assert "Install and hold the pinned ROCm packages" not in ran, ran
    assert "Check the RCCL build (sources, patches, stamp, prefix)" not in ran, ran
    print(f"converge {first:.1f} s")
    # A hand edit of one role's file runs that role alone, which puts the file back.
    blacklist = "/etc/apt/apt.conf.d/51rigbook-unattended-rocm"
    on_host(f"echo '// edited by hand' >> {blacklist}")
    pending, ran = read_and_ran()
    assert pending == {"amd_rocm": f"changed since it converged: file:{blacklist}"}, pending
    assert ran["Keep unattended-upgrades from replacing the pinned ROCm release"]["changed"], ran
    assert "Check the RCCL build (sources, patches, stamp, prefix)" not in ran
    assert "edited by hand" not in on_host(f"cat {blacklist}")
    assert read_and_ran()[0] == {}


def read_and_ran() -> tuple:
    """One site.yml run on HOST: ({role: why} of the roles its one read found not converged, {task: result} of every
    task that ran)."""
    proc = provision("site.yml", "-i", "lab", "--limit", HOST, "--json", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = dict(changed_tasks(json.loads(proc.stdout)["run_dir"], changed_only=False)[HOST])
    read = ran["Read which roles the box still holds as they last converged"]
    return {role: read["roles"][role]["why"] for role in read["pending"]}, ran


def test_apt_upgrade_does_not_move_the_pinned_rocm():
    before = on_host("dpkg-query -W -f='${Package} ${Version}\\n' rocm-core rocminfo rocm-smi-lib hip-runtime-amd")
    policy = on_host("apt-cache policy rocm-core")
    assert "7.2.0.70200-43~24.04" in policy and f"Candidate: {ROCM_CORE}" in policy, policy  # newer one is there
    on_host("DEBIAN_FRONTEND=noninteractive apt-get -q update >/dev/null && "
            "DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade")
    # even asked by name, apt keeps the pinned version (pin + hold), and never offers amdgpu-dkms
    on_host("DEBIAN_FRONTEND=noninteractive apt-get -y -q install rocm-core rocminfo")
    after = on_host("dpkg-query -W -f='${Package} ${Version}\\n' rocm-core rocminfo rocm-smi-lib hip-runtime-amd")
    assert after == before and f"rocm-core {ROCM_CORE}" in after, after
    refused = on_host("DEBIAN_FRONTEND=noninteractive apt-get -y -q install amdgpu-dkms", check=False)
    assert refused.returncode != 0 and "amdgpu-dkms" in refused.stderr + refused.stdout, refused.stdout


def test_kernel_upgrade_made_default_is_caught_and_restored(lab_artifacts):
    record = provision("baseline", "record", "-i", "lab", "--limit", HOST, timeout=600)
    assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-2000:]
    # A distro kernel arrives (apt) and becomes the default entry (an edited default, as after a grub-set-default
    # or an installer that rewrote it); the host reboots into it.
    on_host("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            f"linux-image-{UPGRADE_KERNEL}")
    on_host(f"sed -i 's/with Linux {KERNEL}\"/with Linux {UPGRADE_KERNEL}\"/' /etc/default/grub.d/rigbook.cfg")
    reboot_host()
    assert on_host(f"cat {EVIDENCE}/proc/sys/kernel/osrelease").strip() == UPGRADE_KERNEL

    verify = provision("verify", "-i", "lab", "--limit", HOST, "--json", timeout=600)
    out = verify.stdout + verify.stderr
    assert verify.returncode == 1, out[-3000:]
    assert "kernel_state: fail:" in verify.stderr, verify.stderr[-3000:]
    assert (f"running kernel {UPGRADE_KERNEL}, pinned {KERNEL}; the running kernel is not the pinned P2P-patched "
            "one") in out, out[-3000:]

    before = boots()
    proc, summary, changed, _ = site()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert boots() == before + 1  # exactly one reboot
    grub = "Put the command line and default entry in the GRUB drop-in"
    # a serving box's engines are stopped before its reboot (site.yml's reboot play)
    assert {grub, REBOOT_TASK} <= set(changed) <= {grub, "Stop the serve units before the reboot", REBOOT_TASK}, changed
    assert on_host(f"cat {EVIDENCE}/proc/sys/kernel/osrelease").strip() == KERNEL
    assert set(ladder(summary).values()) <= {"pass", "warn"} and ladder(summary)["kernel_state"] == "pass"
    assert summary.get("baseline_source") == f"host {HOST}", summary  # judged against the recorded baseline
    assert f"linux-image-{UPGRADE_KERNEL}" in on_host("ls /boot; dpkg-query -W -f='${Package}\\n'")  # kept

    proc, summary, changed, _ = site()
    assert proc.returncode == 0 and summary["changed"] == 0 and changed == [], changed
    assert boots() == before + 1
