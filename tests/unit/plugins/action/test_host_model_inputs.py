"""The digest of a run's inputs (action rigbook.homelab.host_model): what a role's converged state on the box must
carry for the role to be skipped - the host model, the role variables, the controller's files the roles copy and
the collection's own files (plugin_utils/collection_files)."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible_collections.rigbook.homelab.plugins.action import host_model as action
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

REPO = Path(__file__).resolve().parents[4]

MODEL = {"vendor": "amd", "roles": ["kernel", "rccl"], "pins": {"rccl": {"version": "2.27.7"}},
         "readiness": {"kernel": []}}


def test_the_digest_follows_the_model_the_role_variables_and_the_collection():
    base = action.inputs_digest(MODEL, {}, "c1")
    assert base == action.inputs_digest(dict(MODEL), {}, "c1")
    assert len(base) == 64
    assert action.inputs_digest({**MODEL, "pins": {"rccl": {"version": "2.27.8"}}}, {}, "c1") != base
    assert action.inputs_digest(MODEL, {"rccl_jobs": 4}, "c1") != base
    assert action.inputs_digest(MODEL, {}, "c2") != base
    # readiness is derived from the model: it changes nothing by itself
    assert action.inputs_digest({**MODEL, "readiness": {"kernel": ["x"]}}, {}, "c1") == base


def test_role_variables_are_those_of_a_roles_prefix_and_the_connection_user():
    names = action.role_var_names({"rccl_jobs": 4, "kernel_hold": False, "group_build_poll_s": 1,
                                   "ansible_user": "rigbook", "ansible_host": "127.0.0.2", "rigbook_gpu": {},
                                   "preflight_min_python": "3.9", "inventory_hostname": "x"})
    assert names == ["ansible_user", "group_build_poll_s", "kernel_hold", "rccl_jobs"]


def test_a_file_the_pins_name_on_the_controller_is_hashed_where_the_inventory_is(tmp_path):
    (tmp_path / "locks").mkdir()
    lock = tmp_path / "locks" / "sglang.lock"
    lock.write_text("sglang==0.5.23\n")
    pins = {"sglang": {"lock": "locks/sglang.lock", "patches": [{"name": "a.patch", "path": str(tmp_path / "p")}]},
            "rccl": {"patches": [{"name": "in-the-collection.patch"}]}}
    first = action.controller_files(pins, str(tmp_path))
    assert set(first) == {"locks/sglang.lock"}  # the patch path names no file here
    lock.write_text("sglang==0.5.24\n")
    assert action.controller_files(pins, str(tmp_path)) != first


def test_the_serve_checks_read_the_model_the_run_builds_and_an_invalid_inventory_builds_none():
    merged = yaml.safe_load((REPO / "inventory" / "homelab" / "group_vars" / "x99_3080.yml").read_text())
    calls = []

    def model_once():
        calls.append(1)
        return host_model.build(merged)

    assert action.findings(merged, model_once) == action.findings(merged)
    assert calls == [1]
    assert action.findings({**merged, "rigbook_gpu": "not a mapping"}, model_once)[0]
    assert calls == [1]
