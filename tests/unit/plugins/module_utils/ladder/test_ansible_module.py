"""The ladder module's body (module_utils/ladder/ansible_module.py): the task passes the host model and what is the
run's own; where the evidence is read, the tolerance, the GPU environment file, the collectives tests and their
Python, the benchmark's environment and the serve profiles are read from the model, an option given overriding one.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import ansible_module

ROLE = Path(__file__).resolve().parents[5] / "roles" / "p2p_verify"
# What a task of the role may pass besides the model: the run's own choices.
RUNS_OWN = {"phase", "run_tags", "layers", "allow_unknown", "baseline", "python", "ab", "unit", "serving",
            "serving_when", "changes", "engine", "serving_figures"}


def params(**given):
    """The module's params as AnsibleModule fills them: every option's default, then GIVEN."""
    found = {name: spec.get("default") for name, spec in ansible_module.ARGUMENT_SPEC.items()}
    found.update(given)
    return found


def model():
    return host_model.build({
        "rigbook_gpu": {"vendor": "nvidia", "count": 2},
        "rigbook_evidence_root": "/var/lib/rigbook-lab/evidence",
        "rigbook_tolerance": {"fail_below": 0.7},
        "rigbook_verify": {"collectives_python": "/opt/torch/.venv"},
        "rigbook_pins": {"nccl_tests": {"version": "2.19.6"}},
        "rigbook_serve": [{"name": "qwen", "model_path": "/srv/models/q", "env": {"NCCL_P2P_LEVEL": "PHB"}},
                          {"name": "small", "model_path": "/srv/models/s", "port": 30001}],
    })


def test_the_role_passes_the_host_model_and_only_what_is_the_runs_own():
    entries = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    tasks = [task for entry in entries for task in entry.get("block", [entry]) + entry.get("always", [])]
    assert len(tasks) == 4  # one per phase, and the runtime phase's always task
    for task in tasks:
        args = task["rigbook.homelab.ladder"]
        assert args["host"] == "{{ rigbook_host }}", task["name"]
        assert set(args) - {"host"} <= RUNS_OWN, (task["name"], set(args) - {"host"} - RUNS_OWN)
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    # no role variable is a piece of the model handed on (the phases are chosen by it, not passed)
    assert [name for name, value in defaults.items()
            if name != "p2p_verify_phases" and "rigbook_host" in str(value)] == []


def test_the_module_reads_the_rest_from_the_host_model():
    host = model()
    ctx = ansible_module.context_of(params(host=host))
    assert ctx.root == "/var/lib/rigbook-lab/evidence"
    assert ctx.ladder_view == host_model.ladder_view(host)
    assert ctx.tolerance["fail_below"] == 0.7 and ctx.tolerance == host["tolerance"]
    assert ctx.options["python"] == "/opt/torch/.venv/bin/python"
    assert ctx.options["nccl_tests_dir"] == host["collectives_tests_dir"] == "/opt/rigbook/nccl-tests/current/bin"
    assert ctx.options["env_file"] == host["gpu_env_file"] == "/etc/rigbook/gpu.env"
    assert ctx.options["env"] == {"NCCL_P2P_LEVEL": "PHB"}  # the first serve profile's: the serving unit's
    # the serve profiles as the model normalised them, not read again
    assert ctx.options["serve"] is host["serve"]
    assert [(p["unit"], p["port"], p["bind"]) for p in ctx.options["serve"]] == [
        ("rigbook-serve-qwen.service", 30000, "127.0.0.1"), ("rigbook-serve-small.service", 30001, "127.0.0.1")]
    assert ctx.options["serve_errors"] == [] and ctx.options["check_mode"] is False


def test_an_option_given_overrides_the_models():
    ctx = ansible_module.context_of(params(host=model(), root="/tree", python="/opt/other/bin/python", env={},
                                           env_file="/tmp/gpu.env", nccl_tests_dir="/opt/t",
                                           tolerance={"fail_below": 0.9}), check_mode=True)
    assert ctx.root == "/tree" and ctx.tolerance["fail_below"] == 0.9
    assert (ctx.options["python"], ctx.options["env"], ctx.options["env_file"], ctx.options["nccl_tests_dir"]) == (
        "/opt/other/bin/python", {}, "/tmp/gpu.env", "/opt/t")
    assert ctx.options["check_mode"] is True


def test_without_a_model_the_defaults_hold():
    ctx = ansible_module.context_of(params(root="/tree"))
    assert ctx.root == "/tree" and ctx.ladder_view == {}
    assert (ctx.options["python"], ctx.options["nccl_tests_dir"], ctx.options["env_file"]) == (None, None, None)
    assert ctx.options["env"] == {} and ctx.options["serve"] == []
    assert ansible_module.context_of(params()).root == "/"


def test_a_serve_profile_the_model_could_not_read_reaches_the_serving_layer():
    host = host_model.build({"rigbook_serve": [{"name": "q", "port": "x"}]})
    assert host["serve"] == []
    ctx = ansible_module.context_of(params(host=host))
    assert ctx.options["serve_errors"] == ["rigbook_serve[0].port: 'x' is not a port number (1-65535)"]
