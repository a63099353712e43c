"""src/rigbook/lab/handmade.py: its root scripts and the reboot go through facts/runner (replaced here: no host)."""

from __future__ import annotations

import subprocess

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner

from rigbook.errors import UserError
from rigbook.lab import handmade
from rigbook.lab.state import Host
from rigbook.lab.system import LabFailure

HOST = Host("lab-3080", "x99-3080", "x99_3080", "127.0.11.1")


def test_a_root_script_runs_over_ssh_and_its_failure_or_hang_is_named(monkeypatch):
    calls = []
    monkeypatch.setattr(runner, "run", lambda argv, **kw: calls.append((argv, kw)) or runner.Result(
        argv, 2, "", "dkms: build failed\n", "exited 2", False))
    with pytest.raises(LabFailure, match=r"lab-3080: setting it up failed \(rc 2\): dkms: build failed"):
        handmade._as_root(HOST, "dkms autoinstall", "setting it up")
    (argv, kwargs), = calls
    assert argv[0] == "ssh" and argv[-1] == "sudo -n sh -c 'dkms autoinstall'" and kwargs == {"timeout": 900}
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, None, "", "", "ssh did not finish in "
                                                                        "900 s", True))
    with pytest.raises(LabFailure, match="lab-3080: setting it up failed: ssh did not finish in 900 s"):
        handmade._as_root(HOST, "dkms autoinstall", "setting it up")


def test_asking_for_a_reboot_that_cannot_be_sent_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(runner, "run", lambda argv, **kw: runner.Result(argv, None, "", "", "ssh: No such file or "
                                                                        "directory", False))
    with pytest.raises(LabFailure, match="lab-3080: asking it to reboot: ssh: No such file"):
        handmade._reboot(HOST)


@pytest.mark.parametrize("script", ["nvidia", "amd", "start"])
def test_each_seeds_script_is_valid_shell(script):
    """The scripts are generated text with here-documents inside: sh -n must read each to its end."""
    text = {"nvidia": handmade.nvidia_script, "amd": handmade.amd_script, "start": handmade.start_script}[script](
        "127.0.11.1")
    checked = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert text.count(f"<<'{handmade.END}'") == text.count(f"\n{handmade.END}\n")  # every here-document closed


def test_seed_000_is_set_up_the_forks_way_and_keeps_its_desktop():
    text = handmade.nvidia_script("127.0.11.1")
    assert "dkms add" not in text and "dkms build" not in text and "dkms install" not in text
    assert f"INSTALL_MOD_DIR={handmade.FORK_INSTALL_DIR} modules_install" in text and "depmod 6.1.0-47" in text
    assert "uvm_disable_hmm" not in text  # HMM left at the driver's default
    assert "systemctl set-default graphical.target" in text and "Alias=display-manager.service" in text
    # the engine: `sglang serve` with the seed's flags, from the owner's shell, not root's
    assert "exec sglang serve --model-path /srv/models/standin-model --tp-size 2" in text
    assert "--mem-fraction-static 0.88" in text and "'{\"reasoning_effort\": \"medium\"}'" in text
    assert f"su -s /bin/sh {handmade.OWNER} -c 'cd {handmade.HOME} && setsid nohup ./serve.sh" in (
        handmade.start_script("127.0.11.1"))


def test_seed_004_uses_amdgpu_installs_sources_and_builds_rccl_in_the_owners_home():
    text = handmade.amd_script("127.0.11.2")
    assert "signed-by=/etc/apt/keyrings/rocm.gpg] file:///var/cache/rigbook/artifacts/rocm-repo noble main" in text
    assert "> /etc/apt/sources.list.d/rocm.list" in text and "> /etc/apt/sources.list.d/amdgpu.list" in text
    assert f"patch -s -p1 < {handmade.RCCL_PATCH}" in text and f"cmake --build {handmade.RCCL_DIR}/build" in text
    assert "export HSA_ENABLE_IPC_MODE_LEGACY=0" in text and "export NCCL_P2P_LEVEL=PHB" in text
    assert f"export LD_PRELOAD={handmade.RCCL_LIBRARY}" in text


def test_the_seed_000_tree_has_hmm_at_the_drivers_default_and_the_seeds_cpu(tmp_path):
    hmm = tmp_path / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
    hmm.parent.mkdir(parents=True)
    hmm.write_text("Y\n")
    handmade.seed_000_tree(tmp_path)
    assert hmm.read_text() == "N\n"
    assert "address sizes\t: 46 bits physical" in (tmp_path / "proc/cpuinfo").read_text()


def test_a_seed_that_does_not_match_the_hosts_rig_is_refused(tmp_path, monkeypatch):
    class Lab:
        def host(self, name):
            return HOST

    monkeypatch.setattr(handmade.state, "load", lambda: Lab())
    with pytest.raises(UserError, match=r"lab-3080 is rig x99-3080 \(nvidia\); --as-seed 000 needs an nvidia rig"):
        handmade.handmade("lab-3080", "004")
