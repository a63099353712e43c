"""Every role site.yml converges with (host_model.ROLES, the ladder apart) is one include skipped while its converged
state holds, and notes that state as its last task with what its own vars say it watches (docs/converged.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

ROLES = Path(__file__).resolve().parents[3] / "roles"
CONVERGING = [name for name, _, _ in host_model.ROLES if name != "p2p_verify"]


def tasks(role: str, name: str) -> list:
    return yaml.safe_load((ROLES / role / "tasks" / name).read_text())


@pytest.mark.parametrize("role", CONVERGING)
def test_the_role_is_one_include_skipped_while_converged(role):
    [include] = [t for t in tasks(role, "main.yml") if "ansible.builtin.include_tasks" in t]
    assert include["ansible.builtin.include_tasks"] == "converge.yml"
    assert f"rigbook_converged.roles.{role}.converged" in include["when"]
    assert include["when"].lstrip(">- \n").startswith("not (")


@pytest.mark.parametrize("role", CONVERGING)
def test_the_last_task_notes_what_the_role_watches(role):
    last = tasks(role, "converge.yml")[-1]
    args = last["rigbook.homelab.converged"]
    assert args["role"] == role
    assert args["watch"] == "{{ " + role + "_watch }}"
    assert "not ansible_check_mode" in last["when"]
    watch = yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text())[f"{role}_watch"]
    assert watch and set(watch) <= {"files", "trees", "packages", "units", "groups", "blocks", "default_target", "boot"}


def test_the_site_play_reads_every_state_once_before_the_roles():
    site = yaml.safe_load((ROLES.parent / "playbooks" / "site.yml").read_text())
    calls = [(play["name"], task) for play in site for task in play.get("post_tasks", []) + play.get("tasks", [])
             if "rigbook.homelab.converged" in task]
    reads = [(name, task) for name, task in calls if "restamp_boot" not in task["rigbook.homelab.converged"]]
    assert [name for name, _ in reads] == ["Preflight"]
    assert reads[0][1]["register"] == "rigbook_converged"
    # the one other call: after the ladder, the boot-watching states carried over the reboot it judged
    [(name, carry)] = [(name, task) for name, task in calls if (name, task) not in reads]
    names = [play["name"] for play in site]
    assert names.index(name) == names.index("P2P ladder") + 1
    assert carry["rigbook.homelab.converged"]["restamp_boot"] == "{{ rigbook_converged.boot }}"
    assert "not ansible_check_mode" in carry["when"]
