"""The lab fault secure-boot-on: the lab 3080 host's recorded tree says Secure Boot is on and DKMS's signing key is not
enrolled, and the play stops at preflight, before any package changes, naming `mokutil --import` and the console.

No lab: the fault is applied to the rig's recorded tree, the preflight role's own two Secure Boot tasks run against it
(boot_state on the tree, then the host_model action with what it read), in-process and through ansible-playbook on
localhost. The ladder does not judge Secure Boot (tests/unit/rigbook/lab/test_lab_ladder.py leaves this fault out).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.modules import local_playbook, run_module

from rigbook.errors import UserError
from rigbook.lab import faults, hardware_trees
from rigbook.paths import link_collection
from rigbook.validate import validate

link_collection()
from ansible_collections.rigbook.homelab.plugins.action import host_model as host_model_action  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.modules import boot_state  # noqa: E402

REPO = Path(__file__).resolve().parents[4]
DEBIAN = {"distribution": "Debian", "distribution_version": "12", "distribution_release": "bookworm"}
ENROL = "mokutil --import /var/lib/dkms/mok.pub, then reboot and confirm at the console (MokManager"
SECURE_BOOT_TASKS = ("Read Secure Boot and the DKMS signing key", "Check what this run's roles need of Secure Boot")


@pytest.fixture(scope="module")
def model():
    """The lab 3080 host's model as the preflight play computes it (its facts say Debian)."""
    return host_model.build(validate("inventory/lab").host_vars("lab-3080"), DEBIAN)


def _tree(tmp_path, fault=None) -> Path:
    tree = hardware_trees.materialize("x99-3080", tmp_path / (fault or "healthy"))
    if fault:
        changes = faults.plan(fault, tree, hardware_trees.load_rig("x99-3080"))
        assert changes, f"{fault} changed nothing"
        faults.apply(changes)
    return tree


def _preflight(tree, model, task_vars=None):
    """The role's two tasks in-process: boot_state on TREE, then the action's Secure Boot check of what it read."""
    read = run_module(boot_state, {"root": str(tree), "secure_boot": True, "os_id": model["os"]["id"]})
    assert not read.failed, read.msg
    return read.result, host_model_action.secure_boot_result(
        "lab-3080", model, task_vars or {}, {"secure_boot": read.result["secure_boot"],
                                              "running_kernel": read.result["running"] or ""})


def test_the_fault_stops_the_play_at_preflight_naming_the_enrolment(tmp_path, model):
    read, checked = _preflight(_tree(tmp_path, "secure-boot-on"), model)
    assert read["secure_boot"]["state"] == "on"
    assert read["secure_boot"]["dkms_key"] == {"path": "/var/lib/dkms/mok.pub", "state": "not-enrolled",
                                               "why": "mokutil --test-key: /var/lib/dkms/mok.pub is not enrolled"}
    assert checked["failed"] is True
    assert checked["msg"].startswith("lab-3080: not ready: 1 thing only the owner can do at the box (nothing was "
                                     "changed): Secure Boot: needed by the nvidia_p2p_driver role: ")
    assert "enrol it: " + ENROL in checked["msg"]
    assert checked["problems"] == [{"key_path": "Secure Boot", "message": checked["msg"].split("Secure Boot: ", 1)[1]}]


def test_the_healthy_rig_records_secure_boot_off_and_the_play_goes_on(tmp_path, model):
    read, checked = _preflight(_tree(tmp_path), model)
    assert read["secure_boot"] == {"state": "off", "why": "EFI variables: SecureBoot is 0", "dkms_key": None}
    assert "failed" not in checked and checked["notes"] == ["Secure Boot is off (EFI variables: SecureBoot is 0)"]


def test_a_run_without_the_driver_role_is_not_stopped(tmp_path, model):
    _, checked = _preflight(_tree(tmp_path, "secure-boot-on"), model, {"ansible_run_tags": ["cuda_toolchain"]})
    assert "failed" not in checked and "no role of this run builds a kernel module" in checked["msg"]


def test_the_fault_is_for_the_nvidia_rig_only(tmp_path):
    """The lab R9700 host pins a Debian kernel and builds no DKMS module (rocm.dkms: false): Secure Boot on stops
    nothing there (tests/unit/plugins/plugin_utils/test_secure_boot_needs.py), so the fault is not offered."""
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "r9700")
    with pytest.raises(UserError):
        faults.plan("secure-boot-on", tree, hardware_trees.load_rig("x99-r9700"))


def _role_tasks():
    return yaml.safe_load((REPO / "roles/preflight/tasks/main.yml").read_text())


def test_preflight_reads_secure_boot_before_any_role_changes_anything():
    """site.yml's first play is preflight; its tasks change nothing (reads and asserts only), and the Secure Boot
    check runs in every run, whatever --tags / --skip-tags leave out."""
    site = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    assert [r["role"] for r in site[0]["roles"]] == ["rigbook.homelab.preflight"]
    tasks = _role_tasks()
    modules = {key for task in tasks for key in task if "." in key}
    assert modules <= {"ansible.builtin.import_tasks", "ansible.builtin.command", "ansible.builtin.assert",
                       "rigbook.homelab.boot_state", "rigbook.homelab.host_model", "rigbook.homelab.gpu_inventory",
                       "ansible.builtin.stat"}, modules
    by_name = {task.get("name"): task for task in tasks}
    read, check = (by_name[name] for name in SECURE_BOOT_TASKS)
    assert read["rigbook.homelab.boot_state"]["secure_boot"] is True and read["register"] == "preflight_boot"
    assert check["rigbook.homelab.host_model"]["secure_boot"] == "{{ preflight_boot.secure_boot }}"
    for task in (read, check):  # every run reads it; the check asks only for the roles the run applies
        assert task["tags"] == ["always"]


def test_the_role_tasks_through_ansible_playbook(tmp_path, model):
    """The preflight role's two Secure Boot tasks as written, run by ansible-playbook on localhost against the faulted
    tree (become left out: the test runs as whoever runs it), after rigbook_host is set as the role sets it."""
    tasks = [{"name": "Set the host model", "ansible.builtin.set_fact": {"rigbook_host": model}}]
    for task in _role_tasks():
        if task.get("name") in SECURE_BOOT_TASKS:
            tasks.append({k: v for k, v in task.items() if k != "become"})
    tasks[1]["vars"] = {"preflight_evidence_root": str(_tree(tmp_path, "secure-boot-on"))}
    proc = local_playbook(tmp_path, tasks, check=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not ready: 1 thing only the owner can do at the box (nothing was changed)" in proc.stdout
    assert ENROL in proc.stdout
    tasks[1]["vars"] = {"preflight_evidence_root": str(_tree(tmp_path, None))}
    proc = local_playbook(tmp_path, tasks, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
