"""The layer registry is the one place a layer is defined: the role, the module, replay and the lab's faults follow it.

A dummy layer added through the registry alone (one Layer entry and the collector of its evidence part) is
judged by the climb, selected by its tags, accepted by the ladder module's layer selection and the lab's fault
table, and replayed from a recorded tree by `provision verify --replay`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import make
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import ansible_module, climb, registry

from rigbook import snapshots
from rigbook.lab import faults

H200 = {"gpu": {"vendor": "nvidia", "count": 1, "vram_gib": 141, "pcie": {"gen": 5, "width": 16}},
        "pins": {"nvidia_driver": {"version": "580.159.04"}}}
ROLE = Path(__file__).resolve().parents[5] / "roles" / "p2p_verify"


def _phase_tasks(tasks):
    """(phase, the entry that carries its tags and when, its ladder task) of the role's tasks: a task, or a block
    around its phase's ladder task (the runtime phase's, with the serve units around it: its always task, which
    climbs nothing, is not a phase's)."""
    for entry in tasks:
        for task in entry.get("block", [entry]):
            args = task.get("rigbook.homelab.ladder")
            if args:
                yield args["phase"], entry, task


def test_the_role_tags_each_task_with_the_layers_of_its_phase():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    by_phase = {phase: (entry, task) for phase, entry, task in _phase_tasks(tasks)}
    assert set(by_phase) == set(registry.PHASES) and len(list(_phase_tasks(tasks))) == len(registry.PHASES)
    for phase, (entry, task) in by_phase.items():
        assert entry["tags"] == registry.names(phase), phase
        assert task["rigbook.homelab.ladder"]["run_tags"] == "{{ ansible_run_tags }}"
        assert entry["when"] == f"'{phase}' in p2p_verify_phases"  # each phase runs only when named
    # the always task that starts again what a cut-short runtime phase left stopped carries the block's tags and when
    [block] = [entry for entry in tasks if "block" in entry]
    assert [t["rigbook.homelab.ladder"]["serving"] for t in block["always"]] == ["resume"]


def test_the_role_runs_serving_by_default_only_where_serve_profiles_exist():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    # serving joins the default phases only on a host with serve profiles (rendered as Ansible renders it)
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    for serve, phases in (([], ["static", "runtime"]), ([{"name": "q"}], ["static", "runtime", "serving"])):
        templar = Templar(DataLoader(), variables={"rigbook_host": {"serve": serve}})
        assert templar.template(trust_as_template(defaults["p2p_verify_phases"])) == phases
    assert spec["p2p_verify_phases"]["choices"] == list(registry.PHASES)
    assert registry.names(registry.SERVING) == ["serving"] and registry.names()[-1] == "serving"


def test_the_role_docs_list_the_layers_in_ladder_order():
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    assert ", ".join(registry.names()[:-1]) + " and " + registry.names()[-1] in spec["description"][0]
    readme = (ROLE / "README.md").read_text()
    rows = [line.split("|")[2].strip() for line in readme.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()]
    assert rows == registry.names()


def test_every_part_a_layer_needs_has_one_collector_and_every_layer_a_judge():
    for layer in registry.LAYERS:
        assert layer.needs and all(part in registry.PARTS for part in layer.needs), layer
        assert callable(layer.judge) and layer.tags[0] == layer.name
    assert len(set(registry.names())) == len(registry.LAYERS)


def test_selection_by_name_tag_and_run_tags():
    static = registry.of_phase(registry.STATIC)
    assert registry.select(registry.STATIC, None) == (static, [])
    layers, unknown = registry.select(registry.STATIC, ["kernel_state", "pcie_link", "no_such"])
    assert [layer.name for layer in layers] == ["pcie_link", "kernel_state"] and unknown == ["no_such"]
    # a layer of the other phase is unknown to this phase's selection
    assert registry.select(registry.STATIC, ["peer_access"]) == ([], ["peer_access"])
    assert registry.select(None, ["peer_access", "bogus"]) == ([registry.get("peer_access")], ["bogus"])
    # run tags: role and play tags are not layers and select every layer of the phase
    assert registry.select_by_run_tags(registry.STATIC, ["kernel", "all"]) == static
    assert [layer.name for layer in registry.select_by_run_tags(registry.RUNTIME, ["collectives", "kernel"])] == \
        ["collectives"]


# ------------------------------------------------------------------ a dummy layer, through the registry alone

DUMMY_FILE = ("var", "lib", "rigbook", "commands", "dummy-gauge.txt")


def _dummy_part(ctx, evidence):
    """The dummy layer's collector: a number recorded in the tree (None when missing)."""
    text = files.read_text(files.path(ctx.root, *DUMMY_FILE))
    return {"dummy": {"gauge": float(text) if text else None}}


def _dummy_judge(evidence, ctx):
    gauge = evidence["dummy"]["gauge"]
    if gauge is None:
        return make("dummy_gauge", "unknown", None, ">= 1", "no gauge recorded")
    status = "pass" if gauge >= 1 else "fail"
    return make("dummy_gauge", status, gauge, ">= 1", f"gauge {gauge:.1f}", "" if status == "pass" else "raise it")


@pytest.fixture
def dummy(monkeypatch):
    """Layer 'dummy_gauge' between p2p_bandwidth and collectives, tagged 'gauges'."""
    layer = registry.Layer("dummy_gauge", registry.RUNTIME, ("dummy",), _dummy_judge, tags=("gauges",))
    at = registry.names().index("collectives")
    monkeypatch.setattr(registry, "LAYERS", registry.LAYERS[:at] + [layer] + registry.LAYERS[at:])
    monkeypatch.setitem(registry.PARTS, "dummy", _dummy_part)
    return layer


def _tree(tmp_path, gauge):
    tree = tmp_path / "h1" / "tree"
    tree.joinpath(*DUMMY_FILE[:-1]).mkdir(parents=True, exist_ok=True)
    tree.joinpath(*DUMMY_FILE).write_text(gauge)
    return tree


def test_a_dummy_layer_is_judged_in_its_place_and_stops_the_climb(dummy, tmp_path):
    ctx = climb.Context(str(_tree(tmp_path, "0.5")), {"gpu": {"vendor": "nvidia", "count": 1}})
    verdicts, evidence = climb.climb(registry.of_phase(registry.RUNTIME), ctx)
    assert [v["layer"] for v in verdicts] == ["peer_access", "p2p_bandwidth", "dummy_gauge"]
    assert verdicts[-1]["status"] == "fail" and evidence["dummy"] == {"gauge": 0.5}
    assert "collectives" not in evidence  # nothing above the failing layer was collected


def test_a_dummy_layer_is_selected_by_its_name_and_tags(dummy):
    assert registry.select(registry.RUNTIME, ["gauges"]) == ([dummy], [])
    assert registry.select_by_run_tags(registry.RUNTIME, ["dummy_gauge"]) == [dummy]
    assert "dummy_gauge" in registry.names(registry.RUNTIME) and "dummy_gauge" not in registry.names(registry.STATIC)

    class Module:
        params = {"phase": "all", "layers": ["gauges", "pcie_link"], "run_tags": []}

        def fail_json(self, **kwargs):
            raise AssertionError(kwargs)

    assert [layer.name for layer in ansible_module.selected_layers(Module())] == ["pcie_link", "dummy_gauge"]


def test_a_dummy_layer_is_accepted_by_the_lab_fault_table(dummy):
    edit = {"scope": "tree", "set": "/".join(DUMMY_FILE), "content": "0.1\n"}
    doc = {"faults": {"gauge-low": {"layer": "dummy_gauge", "description": "the dummy gauge reads low",
                                    "edits": [edit]}}}
    assert faults.validate(doc) is doc
    with pytest.raises(ValueError, match="no layer of the ladder"):
        faults.validate({"faults": {"x": {**doc["faults"]["gauge-low"], "layer": "no_such_layer"}}})


def test_a_dummy_layer_is_replayed_from_a_recorded_tree(dummy, tmp_path, capsys, fixtures):
    """The real H200 capture (tests/fixtures/evidence/h200-vm) plus the dummy gauge's recording."""
    shutil.copytree(fixtures / "evidence" / "h200-vm", tmp_path / "h1" / "tree", symlinks=True)
    _tree(tmp_path, "2.0")
    (tmp_path / "h1" / "ladder_view.json").write_text(json.dumps(H200))
    assert snapshots.replay(str(tmp_path), as_json=True) == 0
    ladder = json.loads(capsys.readouterr().out)["hosts"]["h1"]["ladder"]
    # no serve profile and no serving recorded: the layers a live verify shows (no serving layer)
    assert [v["layer"] for v in ladder] == [name for name in registry.names() if name != "serving"]
    gauge = next(v for v in ladder if v["layer"] == "dummy_gauge")
    assert gauge["status"] == "pass" and gauge["measured"] == 2.0
    _tree(tmp_path, "0.2")
    assert snapshots.replay(str(tmp_path), as_json=True) == 1  # a failing dummy layer fails the replay
    capsys.readouterr()


def test_an_unknown_layer_the_box_should_measure_fails_unless_allowed(dummy, tmp_path):
    tree = str(_tree(tmp_path, ""))  # no gauge recorded: the judge says unknown
    view = {"gpu": {"vendor": "nvidia", "count": 1}, "measure": {"layers": True}, "allow_unknown": []}

    def judged(view, **options):
        verdicts, _ = climb.climb(["dummy_gauge", "collectives"], climb.Context(tree, view, options=options))
        return verdicts

    failed = judged(view)
    assert [v["layer"] for v in failed] == ["dummy_gauge"]  # the climb stopped there
    assert failed[0]["status"] == "fail" and failed[0]["why"] == "unknown on a box that should measure it: " \
        "no gauge recorded"
    assert "--allow-unknown dummy_gauge" in failed[0]["remedy"]
    by_inventory = judged(dict(view, allow_unknown=["dummy_gauge"]))[0]
    assert by_inventory["status"] == "unknown" and by_inventory["allowed_unknown"] is True
    assert by_inventory["why"].endswith("(allowed unknown: rigbook_verify.allow_unknown)")
    by_run = judged(view, allow_unknown=["dummy_gauge"])[0]
    assert by_run["status"] == "unknown" and by_run["why"].endswith("(allowed unknown: --allow-unknown)")
    not_expected = judged(dict(view, measure={"layers": False}))[0]  # no GPUs declared: nothing is expected
    assert not_expected["status"] == "unknown" and "allowed_unknown" not in not_expected
