"""The preflight role's first task (action rigbook.homelab.host_model): the rigbook_* host variables checked
against meta/host_vars.schema.json on the controller, with the same verdicts and wording as `provision validate`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.action import host_model as host_model_action
from ansible_collections.rigbook.homelab.plugins.plugin_utils import host_vars_schema

from rigbook import paths

REPO = Path(__file__).resolve().parents[4]
BIN = Path(sys.executable).parent
G3080 = "group_vars/x99_3080.yml"
G9700 = "group_vars/x99_r9700.yml"


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "homelab", dest)
    return dest


def _edit(inv: Path, rel: str, path: str, value=None, delete=False) -> None:
    """Set (or delete) the dotted PATH in the YAML file REL of inventory INV."""
    file = inv / rel
    data = yaml.safe_load(file.read_text()) if file.exists() else {}
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if delete:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump(data, sort_keys=False))


# Bad values `provision validate` names (tests/unit/rigbook/test_validate.py has the full list), one per kind of check:
# (case id, file edited, key set, value (None with delete), delete, key path named, words expected).
BAD = [
    ("typo-in-pin-key", G3080, "rigbook_pins.cuda_toolchain.verison", "13.0.88", False,
     "rigbook_pins.cuda_toolchain.verison", "did you mean 'version'"),
    ("unknown-top-variable", G3080, "rigbook_gpus", {"count": 2}, False, "rigbook_gpus", "unknown variable"),
    ("bad-vendor", G3080, "rigbook_gpu.vendor", "intel", False, "rigbook_gpu.vendor", '"nvidia", "amd"'),
    ("count-as-string", G3080, "rigbook_gpu.count", "two", False, "rigbook_gpu.count",
     'bad value "two" (str): must be an integer'),
    ("count-too-large", G3080, "rigbook_gpu.count", 64, False, "rigbook_gpu.count", "at most 16"),
    ("p2p-false-without-reason", G3080, "rigbook_p2p.reason", None, True, "rigbook_p2p",
     "missing required key 'reason'"),
    ("driver-version-garbled", G3080, "rigbook_pins.nvidia_driver.version", "615-p2p", False,
     "rigbook_pins.nvidia_driver.version", "must match"),
    ("artifact-url-and-path", G9700, "rigbook_pins.kernel.debs",
     [{"path": "/a", "url": "https://x.invalid/a", "sha256": "0" * 64}], False, "rigbook_pins.kernel.debs[0]",
     "exactly one of"),
    ("sglang-neither-version-nor-repo", G9700, "rigbook_pins.sglang", {"lock": "locks/sglang.txt"}, False,
     "rigbook_pins.sglang", "exactly one of"),
    ("env-bad-name", G9700, "rigbook_serve", [{"name": "a", "model_path": "/srv/m", "env": {"1BAD": "x"}}], False,
     "rigbook_serve[0].env", "bad key"),
    ("serve-custom-all-reduce-without-p2p", G3080, "rigbook_serve", [{"name": "a", "model_path": "/srv/m",
                                                                      "tp_size": 2}], False,
     "rigbook_serve[0].custom_all_reduce", "club-3090 #922"),
    ("tolerance-above-one", "group_vars/all.yml", "rigbook_tolerance", {"fail_below": 1.2}, False,
     "rigbook_tolerance.fail_below", "at most 1"),
    ("evidence-root-relative", "host_vars/rig-3080.yml", "rigbook_evidence_root", "evidence", False,
     "rigbook_evidence_root", "must match"),
    ("rocm-pinned-on-nvidia-box", G3080, "rigbook_pins.rocm", {"version": "7.2"}, False, "rigbook_pins.rocm",
     "vendor is nvidia"),
    ("p2p-expected-with-one-gpu", G9700, "rigbook_gpu.count", 1, False, "rigbook_p2p.expected", "P2P needs 2 GPUs"),
]


def merged_host_vars(inventory: Path) -> dict:
    """{host: rigbook_* variables} as ansible-playbook merges them (the task_vars the action gets)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(inventory)])
    manager = VariableManager(loader=loader, inventory=inv)
    found = {}
    for host in inv.get_hosts():
        variables = manager.get_vars(host=host, include_hostvars=False)
        found[host.name] = {k: host_model_action.plain(variables[k])
                            for k in host_model_action.host_var_names(variables)}
    return found


def test_the_schema_file_is_the_collections():
    assert Path(host_vars_schema.SCHEMA_FILE) == (paths.collection_root() / "meta" / "host_vars.schema.json").resolve()
    from rigbook import validate

    assert validate.schema_file().resolve() == Path(host_vars_schema.SCHEMA_FILE)
    assert validate.schema()["title"] == "rigbook host variables"


@pytest.mark.parametrize("name", ["lab", "homelab"])
def test_shipped_inventories_pass(name):
    merged = merged_host_vars(REPO / "inventory" / name)
    assert len(merged) == 2
    for host, host_vars in merged.items():
        assert {"rigbook_gpu", "rigbook_p2p", "rigbook_pins"} <= set(host_vars), host
        assert host_model_action.check(host_vars) == [], host


@pytest.mark.parametrize("case,rel,key,value,delete,key_path,words", BAD, ids=[c[0] for c in BAD])
def test_same_verdict_as_provision_validate(tmp_path, case, rel, key, value, delete, key_path, words):
    """A bad value fails the task at the key path `provision validate` names, in the same words."""
    inv = _copy(tmp_path)
    _edit(inv, rel, key, value, delete)
    from rigbook.validate import InventoryInvalid, validate

    with pytest.raises(InventoryInvalid) as info:
        validate(inv)
    cli = [f"{p.key_path}: {p.message}" for p in info.value.problems]
    found = [f"{where}: {message}" for host_vars in merged_host_vars(inv).values()
             for where, message in host_model_action.check(host_vars)]
    matching = [line for line in found if line.startswith(f"{key_path}: ")]
    assert matching, f"no problem names {key_path}: {found}"
    assert any(words in line for line in matching), matching
    assert set(matching) <= set(cli), (matching, cli)


def test_failure_message_names_host_key_value_and_what_is_allowed():
    host_vars = {"rigbook_gpu": {"vendor": "intel", "count": 2}, "rigbook_gpus": {}}
    problems = host_model_action.check(host_vars)
    message = host_model_action.failure_message("rig1", problems)
    assert message.startswith("rig1: the rigbook_* variables are invalid (2 problems, schema ")
    assert 'rigbook_gpu.vendor: bad value "intel": allowed values are "nvidia", "amd"' in message
    assert "rigbook_gpus: unknown variable 'rigbook_gpus'" in message and "did you mean 'rigbook_gpu'?" in message


def test_runtime_and_extra_variables_are_not_host_variables():
    variables = {"rigbook_gpu": {}, "rigbook_reboot_required": True, "rigbook_baselines": {}, "rigbook_x": 1,
                 "ansible_host": "h", "rigbook_sglang_venv": "/opt/rigbook/sglang/v0.5.18"}
    assert host_model_action.host_var_names(variables, skip={"rigbook_x"}) == ["rigbook_gpu"]


def test_plain_drops_ansible_tags():
    class Tagged(str):
        pass

    assert type(host_model_action.plain({"a": [Tagged("x")]})["a"][0]) is str


def test_missing_jsonschema_is_named(monkeypatch):
    monkeypatch.setattr(host_vars_schema, "_CACHE", {})
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    with pytest.raises(host_vars_schema.SchemaUnavailable, match="needs the Python package jsonschema"):
        host_model_action.check({"rigbook_gpu": {"vendor": "nvidia"}})


def test_preflight_runs_it_first():
    tasks = yaml.safe_load((REPO / "roles" / "preflight" / "tasks" / "main.yml").read_text())
    assert tasks[0]["ansible.builtin.import_tasks"] == "host_model.yml"
    model_tasks = yaml.safe_load((REPO / "roles" / "preflight" / "tasks" / "host_model.yml").read_text())
    assert "rigbook.homelab.host_model" in model_tasks[0] and "always" in model_tasks[0]["tags"]
    assert model_tasks[1]["ansible.builtin.set_fact"] == {
        "rigbook_host": "{{ preflight_model.host_model }}",
        "rigbook_inputs": "{{ preflight_model.inputs_digest | default('') }}"}
    assert "always" in model_tasks[1]["tags"]


def _play(tmp_path: Path, inventory: Path, *extra):
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - rigbook.homelab.host_model:\n"
                    "      tags: [always]\n")
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(paths.link_collection()), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(play), *extra],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_task_in_check_mode_without_contacting_the_hosts(tmp_path):
    """The homelab hosts' addresses never resolve: the task judges without a connection, in check mode, leaving out
    the variables the CLI passes as extra variables. The homelab inventory lacks what only its owners have: the task
    names it (readiness of site.yml's roles); a run that applies only the ladder (--tags ladder) needs none of it."""
    proc = _play(tmp_path, REPO / "inventory" / "homelab", "--check", "-e", '{"rigbook_baselines": {}}')
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rig-r9700: not ready:" in proc.stdout
    assert "rigbook_pins.kernel.debs: needed by the kernel role" in proc.stdout
    assert "unreachable=0" in proc.stdout
    proc = _play(tmp_path, REPO / "inventory" / "homelab", "--check", "-e", '{"rigbook_baselines": {}}',
                 "--tags", "ladder")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok=1" in proc.stdout and "unreachable=0" in proc.stdout
    inv = _copy(tmp_path)
    _edit(inv, G3080, "rigbook_gpu.pcie.width", 12)
    proc = _play(tmp_path, inv, "--check")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rigbook_gpu.pcie.width: bad value 12: allowed values are 1, 2, 4, 8, 16" in proc.stdout
    assert "rig-r9700" in proc.stdout and "failed=1" in proc.stdout
    shutil.rmtree(inv)


@pytest.mark.parametrize("pattern,text,matches", [
    ("^[a-z]+$", "name", True),
    ("^[a-z]+$", "name\n", False),  # Python's $ alone matches before that newline: the schema's does not
    ("^[^\\u0000-\\u001f\\u007f]*$", "value\n", False),
    ("^[^\\u0000-\\u001f\\u007f]*$", "value", True),
    ("^[$]+$", "$$", True),  # a $ in a class is a dollar sign
    ("^a\\$$", "a$", True),  # so is an escaped one
    ("^(https?|file)://", "https://x\n", True),  # no end anchor: nothing changes
])
def test_an_end_anchor_is_the_end_of_the_text(pattern, text, matches):
    import re

    assert bool(re.search(host_vars_schema.end_anchored(pattern), text)) is matches
    errors = list(host_vars_schema.validator().evolve(schema={"type": "string", "pattern": pattern}).iter_errors(text))
    assert (not errors) is matches
