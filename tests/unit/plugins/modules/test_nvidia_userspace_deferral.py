"""nvidia_p2p_driver's tasks/userspace.yml through real ansible-playbook on localhost: the NVIDIA userspace installer
never runs while a display server holds the GPU. `systemctl` is a stand-in on PATH that prints the Ubuntu 24.04
outputs of tests/fixtures/ubuntu (reconstructed, SOURCES.md); the installer is a stand-in script that writes the
marker file the role checks, so whether it ran is read from the disk."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.modules import local_playbook

UBUNTU = Path(__file__).resolve().parents[3] / "fixtures" / "ubuntu"


def _box(tmp_path, monkeypatch, default, manager):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    show = (UBUNTU / f"systemctl-show-display-manager-{manager}.txt").read_text()
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = get-default ]; then echo {default}; exit 0; fi\n'
        f"if [ \"$1\" = show ]; then printf '%s' '{show}'; exit 0; fi\n"
        "exit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    marker = tmp_path / "libcuda.so.615.71.09"
    installer = tmp_path / "NVIDIA-Linux-x86_64-615.71.09.run"
    installer.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/installer.args\ntouch {marker}\n')
    return marker, installer


def _play(tmp_path, marker, installer, after_reboot, check=False):
    out = tmp_path / "facts.json"
    tasks = [
        {"name": "userspace", "ansible.builtin.include_role": {
            "name": "rigbook.homelab.nvidia_p2p_driver", "tasks_from": "userspace"},
         "vars": {"nvidia_p2p_driver_userspace_marker": str(marker), "nvidia_p2p_driver_installer": str(installer),
                  "nvidia_p2p_driver_userspace_flags": ["--no-kernel-modules"],
                  "nvidia_p2p_driver_after_reboot": after_reboot}},
        {"name": "facts", "ansible.builtin.copy": {
            "dest": str(out), "content": "{{ {'deferred': nvidia_p2p_driver_userspace_deferred | default(None), "
                                         "'reboot': rigbook_reboot_required | default(false), "
                                         "'reasons': rigbook_reboot_reasons | default([])} | to_json }}"},
         "check_mode": False},
    ]
    proc = local_playbook(tmp_path, tasks, check=check)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_gdm_active_defers_the_installer_and_asks_for_the_reboot(tmp_path, monkeypatch):
    marker, installer = _box(tmp_path, monkeypatch, "graphical.target", "gdm")
    proc, facts = _play(tmp_path, marker, installer, after_reboot=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists()  # the installer did not run
    assert facts["deferred"] is True and facts["reboot"] is True
    assert facts["reasons"] == ["nvidia_p2p_driver: userspace installer deferred (display manager gdm.service is "
                                "active (it holds the GPU; it is never stopped on a live box))"]


def test_after_the_reboot_into_multi_user_the_deferred_installer_runs(tmp_path, monkeypatch):
    marker, installer = _box(tmp_path, monkeypatch, "multi-user.target", "none")
    proc, facts = _play(tmp_path, marker, installer, after_reboot=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert marker.exists() and (tmp_path / "installer.args").read_text().split() == ["--silent", "--no-kernel-modules"]
    assert facts["deferred"] is False and facts["reboot"] is False  # after the reboot: no second reboot asked for


def test_a_display_server_still_there_after_the_reboot_fails_and_never_runs_the_installer(tmp_path, monkeypatch):
    marker, installer = _box(tmp_path, monkeypatch, "graphical.target", "gdm")
    proc, _facts = _play(tmp_path, marker, installer, after_reboot=True)
    assert proc.returncode != 0 and not marker.exists()
    assert "does not run under a display server" in proc.stdout and "never stop the display manager" in proc.stdout


def test_a_server_without_a_display_manager_runs_it_at_once_and_check_mode_changes_nothing(tmp_path, monkeypatch):
    marker, installer = _box(tmp_path, monkeypatch, "graphical.target", "none")
    proc, facts = _play(tmp_path, marker, installer, after_reboot=False, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists() and facts["deferred"] is None
    installer_task = proc.stdout.split("Run the userspace installer (--no-kernel-modules)]", 1)[1].split("TASK [", 1)[0]
    assert "changed: [localhost]" in installer_task  # check mode says it would run
    proc, facts = _play(tmp_path, marker, installer, after_reboot=False)
    assert proc.returncode == 0 and marker.exists() and facts["deferred"] is None
