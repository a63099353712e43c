"""The NVIDIA host roles for real on a lab host: apt, dpkg, DKMS, pip and systemd over SSH (marker: lab).

No GPU and no NVIDIA download: the driver fork and its userspace installer are the TEST STAND-INS of
tests/artifacts (a tiny real kernel module with the fork's DKMS layout, built by real DKMS against real Debian
kernel headers; a stand-in .run with the installer's flags), packed into /var/cache/rigbook/artifacts, which the
lab mounts read-only on each host. The CUDA wheels are the real pinned ones, downloaded once into
/var/cache/rigbook/artifacts/wheels/ (a cached step; later runs install offline from there). Kernel packages come
through the lab's shared apt cache (/var/cache/rigbook/lab-apt-archives), so they are fetched once per machine.
Tests run in file order against the session's lab while it is fresh (fixture `fresh_lab`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.cli import REPO, changed_tasks, provision
from helpers.lab_host import LAB_MARKS, LabHost

# The session's lab (tests/integration/conftest.py) while it is fresh: these tests run right after the `lab up`
# checks, before anything else converges or reboots a host, and converge lab-3080 themselves.
pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("fresh_lab")]
HEADERS_TASK = ("Install DKMS, the pinned kernel's headers and those of the other installed kernels the archive still "
                "has")
PINS = yaml.safe_load((REPO / "inventory/lab/group_vars/x99_3080.yml").read_text())["rigbook_pins"]
WHEEL_DIR = Path(PINS["cuda_toolchain"]["wheel_dir"])
UPGRADE_KERNEL = "6.1.0-50-amd64"
KERNEL = PINS["kernel"]["release"]
EVIDENCE = "/var/lib/rigbook-lab/evidence"


LAB = LabHost("lab-3080")
site = LAB.site
boots = LAB.boots
on_host = LAB.out


def host_state() -> str:
    """What the roles could change: packages and holds, the files they write, DKMS, the boot target."""
    return on_host("dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'; apt-mark showhold; "
                   "ls -la /etc/default/grub.d /etc/modprobe.d /etc/apt/preferences.d /usr/src /opt /etc/rigbook "
                   "/var/lib/rigbook /boot 2>&1; systemctl get-default; ls /var/lib/dkms 2>&1; true")


def test_check_diff_on_a_fresh_host_changes_nothing(lab_artifacts):
    before = host_state()
    proc, summary, changed, _ = site("--check", "--diff")
    # Every role runs in check mode; the ladder then judges the host as it really is (nothing was installed,
    # no reboot happened), so it fails at kernel_state - the only failure.
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["failed"] == 1 and "FAILED at task 'Ladder 1-5: " in proc.stderr, proc.stderr[-3000:]
    assert "kernel_state: fail:" in proc.stderr, proc.stderr[-3000:]
    for task in ("Install and hold the pinned kernel", "Put the command line and default entry in the GRUB drop-in",
                 "Reboot once into the new kernel, driver and boot target"):
        assert task in changed, changed
    run_dir = Path(proc.stderr.rsplit("run artifacts: ", 1)[1].split()[0])
    events = "".join(p.read_text() for p in run_dir.glob("artifacts/*/job_events/*.json"))
    assert "linux-image-6.1.0-47-amd64 (to install)" in events  # --diff names what would be installed
    assert host_state() == before
    assert boots() == 1


def test_bad_artifact_sha256_is_refused_before_anything_is_installed(lab_artifacts, tmp_path):
    before = host_state()
    pins = json.loads(json.dumps(PINS))
    pins["nvidia_driver"]["source"]["sha256"] = "0" * 64
    extra = tmp_path / "bad.yml"
    extra.write_text(yaml.safe_dump({"rigbook_pins": pins}))
    proc, summary, changed, _ = site("-e", f"@{extra}")
    assert proc.returncode == 1
    assert "refused artifact" in proc.stderr + proc.stdout and "0" * 64 in proc.stderr + proc.stdout
    assert "Verify every pinned artifact before anything is installed" in proc.stderr + proc.stdout
    assert changed == [] and host_state() == before


def test_mismatched_cuda_pins_fail_naming_both_versions(lab_artifacts, tmp_path):
    pins = json.loads(json.dumps(PINS))
    pins["cuda_toolchain"]["versions"] = {"nvidia-nvvm": "13.1.80"}
    extra = tmp_path / "mismatch.yml"
    extra.write_text(yaml.safe_dump({"rigbook_pins": pins}))
    proc, summary, changed, _ = site("-e", f"@{extra}", "--tags", "cuda_toolchain")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "nvidia-cuda-nvcc 13.0.88" in out and "nvidia-nvvm 13.1.80" in out, out[-3000:]


def test_converge_then_rerun_changes_nothing(lab_artifacts):
    proc, summary, changed, first = site()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Reboot once into the new kernel, driver and boot target" in changed
    assert boots() == 2
    ladder = {v["layer"]: v["status"] for v in summary["ladder"]}
    assert ladder["kernel_state"] == "pass" and ladder["driver_state"] == "pass", summary["ladder"]
    assert "nvidia/615.71.09, 6.1.0-47-amd64, x86_64: installed" in on_host("dkms status")
    assert on_host("modinfo -k 6.1.0-47-amd64 -n nvidia").strip() == \
        "/lib/modules/6.1.0-47-amd64/updates/dkms/nvidia.ko"
    assert "options nvidia-uvm uvm_disable_hmm=1" in on_host("cat /etc/modprobe.d/rigbook-nvidia-uvm.conf")
    assert "linux-image-6.1.0-47-amd64" in on_host("apt-mark showhold")
    assert on_host("systemctl get-default").strip() == "multi-user.target"
    home = "/opt/rigbook/cuda/lib/python3.11/site-packages/nvidia/cu13"
    assert f"CUDA_HOME={home}" in on_host("cat /etc/rigbook/gpu.env")
    assert on_host(f"readlink {home}/lib64").strip() == "lib"

    proc, summary, changed, again = site()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["changed"] == 0 and changed == [], changed
    assert boots() == 2
    # every role noted what it left after the handlers that write /boot (the initramfs, update-grub), and the ladder
    # judged the boot the converge made: this first re-run is one read with no role pending
    ran = dict(changed_tasks(json.loads(proc.stdout)["run_dir"], changed_only=False)[LAB.name])
    read = ran["Read which roles the box still holds as they last converged"]
    assert read["pending"] == [], {role: read["roles"][role]["why"] for role in read["pending"]}
    print(f"converge {first:.1f} s, converged re-run {again:.1f} s")


def test_kernel_upgrade_boots_without_the_fork_is_caught_and_repaired(lab_artifacts):
    """The seed 004 owner's worst fear, on the NVIDIA box, as a user meets it: a baseline recorded, an upgrade pulls
    a newer kernel image (without its headers, so DKMS cannot build the fork for it) and the box boots it; verify
    says the fork is not built for the running kernel; site.yml builds it for every installed kernel, puts the
    pinned kernel back as the default and reboots once; the ladder passes against the baseline; then changed=0."""
    record = provision("baseline", "record", "-i", "lab", "--limit", LAB.name, timeout=600)
    assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-2000:]

    on_host(f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            f"linux-image-{UPGRADE_KERNEL}")
    on_host(f"sed -i 's/with Linux {KERNEL}\"/with Linux {UPGRADE_KERNEL}\"/' /etc/default/grub.d/rigbook.cfg")
    LAB.reboot()
    assert on_host(f"cat {EVIDENCE}/proc/sys/kernel/osrelease").strip() == UPGRADE_KERNEL
    assert LAB.run(f"modinfo -k {UPGRADE_KERNEL} -n nvidia", check=False).returncode != 0

    verify = provision("verify", "-i", "lab", "--limit", LAB.name, "--json", timeout=600)
    assert verify.returncode == 1, verify.stdout[-2000:] + verify.stderr[-2000:]
    assert "kernel_state: fail:" in verify.stderr, verify.stderr[-3000:]
    assert (f"running kernel {UPGRADE_KERNEL}, pinned {KERNEL}; the P2P driver fork is not built for the running "
            f"kernel (no nvidia module under lib/modules/{UPGRADE_KERNEL})") in verify.stderr, verify.stderr[-3000:]

    before = boots()
    proc, summary, changed, _ = site()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert boots() == before + 1  # exactly one reboot
    repair = {HEADERS_TASK,
              "Check the fork's DKMS builds for every installed kernel", "Wait for the group's build",
              "Record which kernels carry the fork", "Put the command line and default entry in the GRUB drop-in",
              "Stop the serve units before the reboot", "Reboot once into the new kernel, driver and boot target"}
    # the headers' install lets DKMS build the fork for the new kernel (its autoinstall hook, or the role's build)
    assert {HEADERS_TASK, "Record which kernels carry the fork",
            "Put the command line and default entry in the GRUB drop-in"} <= set(changed) <= repair, changed
    assert on_host(f"cat {EVIDENCE}/proc/sys/kernel/osrelease").strip() == KERNEL
    assert f"nvidia/615.71.09, {UPGRADE_KERNEL}, x86_64: installed" in on_host("dkms status")
    ladder = {v["layer"]: v["status"] for v in summary["ladder"]}
    # no layer fails; the collectives layer runs the nccl_tests role's build (the stand-in over SHM at the rig's
    # host-staged rate, against the real NCCL wheel) and passes
    assert "fail" not in ladder.values() and ladder["collectives"] == "pass", summary["ladder"]
    assert {ladder[layer] for layer in ("kernel_state", "driver_state", "p2p_bandwidth")} == {"pass"}, ladder
    # the serving figures (TTFT, decode tok/s) move with this machine's load against the baseline: a warn is the
    # tolerance at work, a fail is not
    assert ladder["serving"] in ("pass", "warn"), summary["ladder"]
    assert summary.get("baseline_source") == f"host {LAB.name}", summary

    proc, summary, changed, _ = site()
    assert proc.returncode == 0 and summary["changed"] == 0 and changed == [], changed
    assert boots() == before + 1
