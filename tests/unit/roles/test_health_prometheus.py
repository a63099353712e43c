"""The health role's Prometheus files (roles/health/files): the alert rules through promtool (`check rules`, and
`test rules` with tests/unit/roles/rigbook-alerts.test.yml: each alert firing and not firing), `promtool check
metrics` on what the health program writes for a recorded tree (the captured H200 VM; a lab rig with a fault), the
fleet dashboard (valid JSON; every query reads a metric the health program writes) and the role's task that installs
the rules (check mode, a change, none the second time, nothing where no folder is named), and a page node_exporter
serves read as the file it serves (as the lab tests read it). promtool is Debian's
(tests/helpers/prometheus.py: fetched once when missing; in CI a missing one fails)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import health
from helpers import prometheus
from helpers.modules import local_playbook

from rigbook.lab import faults, hardware_trees

REPO = Path(__file__).resolve().parents[3]
FILES = REPO / "roles" / "health" / "files"
RULES = FILES / "rigbook-alerts.yml"
DASHBOARD = FILES / "rigbook-fleet-dashboard.json"
RULE_TESTS = Path(__file__).resolve().parent / "rigbook-alerts.test.yml"
H200 = REPO / "tests" / "fixtures" / "evidence" / "h200-vm"
ALERTS = {"RigbookLayerFailing", "RigbookHardwareErrors", "RigbookHealthStale"}


def _run_health(tmp_path, name, model_vars, tree, interval_s=300) -> str:
    """What the health program writes for TREE: the config the health role writes for a host of MODEL_VARS (the
    timer's interval as health_timer adds it), the program's entry point, its textfile."""
    config = health.config_of(host_model.build(model_vars), name, state_dir=str(tmp_path / name / "state"))
    config.update(evidence_root=str(tree), textfile=str(tmp_path / name / "rigbook.prom"), interval_s=interval_s)
    path = tmp_path / name / "health.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    assert health.main(["--config", str(path)]) in (0, 1)  # 1: a layer failed
    return Path(config["textfile"]).read_text()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """{what: textfile} of real health runs: the captured H200 VM (one NVIDIA GPU) and the lab's x99-r9700 rig with
    its link halved (pcie_link fails, with its code)."""
    tmp = tmp_path_factory.mktemp("health")
    amd = hardware_trees.materialize("x99-r9700", tmp / "tree")
    faults.apply(faults.plan("link-x8", amd, hardware_trees.load_rig("x99-r9700")))
    return {
        "h200-vm": _run_health(tmp, "h200-vm", {"rigbook_gpu": {"vendor": "nvidia", "count": 1}}, H200),
        "x99-r9700 link-x8": _run_health(tmp, "lab-r9700", {"rigbook_gpu": {"vendor": "amd", "count": 2}}, amd,
                                         interval_s=20),
    }


@pytest.fixture(scope="module")
def written(outputs):
    """Every metric name the health program writes: the runs' and rigbook_layer_figure (a layer with a figure)."""
    result = {"layers": [{"layer": "serving", "status": "pass", "metrics": {"decode_tok_s": 70.0}}],
              "error_counters": {"status": "pass", "why": ""}, "time": 1.0, "duration_s": 0.1, "interval_s": 300}
    names = prometheus.health_names(health.prometheus_text(result))
    for text in outputs.values():
        names |= prometheus.health_names(text)
    return names


def test_the_alert_rules_ship_in_the_role_and_pass_promtool_check_rules(written):
    check = prometheus.run("check", "rules", str(RULES))
    assert check.returncode == 0 and "SUCCESS: 3 rules found" in check.stdout, check.stdout + check.stderr
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:  # each reads only what the health program writes
        assert prometheus.metric_names(rule["expr"]) and prometheus.metric_names(rule["expr"]) <= written, rule
    # docs/health.md points at the file and holds no copy of its own
    doc = (REPO / "docs" / "health.md").read_text()
    assert "roles/health/files/rigbook-alerts.yml" in doc and "alert: Rigbook" not in doc and "expr:" not in doc


def test_promtool_test_rules_each_alert_firing_and_not_firing():
    cases = yaml.safe_load(RULE_TESTS.read_text())
    assert [Path(RULE_TESTS.parent, f).resolve() for f in cases["rule_files"]] == [RULES]
    seen = {}
    for case in cases["tests"]:
        for check in case["alert_rule_test"]:
            seen.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    assert seen == {name: {True, False} for name in ALERTS}  # every alert: an evaluation with it and one without
    tested = prometheus.run("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@pytest.mark.parametrize("what", ["h200-vm", "x99-r9700 link-x8"])
def test_promtool_check_metrics_passes_what_the_health_program_writes(outputs, what):
    text = outputs[what]
    checked = prometheus.run("check", "metrics", stdin=text)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked.stdout + checked.stderr
    assert "rigbook_health_interval_seconds " in text and "rigbook_health_last_run_timestamp_seconds " in text
    if what == "x99-r9700 link-x8":
        assert re.search(r'^rigbook_layer_status\{layer="pcie_link",code="RB-PCIE-[A-Z-]+"\} 2$', text, re.M), text
        assert "rigbook_health_interval_seconds 20.0\n" in text


def _queries(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_the_fleet_dashboard_is_json_and_every_query_reads_what_the_health_program_writes(written, tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    queries = list(_queries(dashboard))
    read = {title: prometheus.metric_names(expr) for title, expr in queries}
    for title, names in read.items():
        assert names and names <= written, (title, names - written)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert re.fullmatch(r"label_values\((\w+), *\w+\)", variable["definition"]).group(1) in written
    # the fleet's layers per host, figures against the fleet, the last run's age
    every = set().union(*read.values())
    assert {"rigbook_layer_status", "rigbook_layer_figure", "rigbook_health_last_run_timestamp_seconds"} <= every
    # each query is PromQL promtool parses (as a recording rule; Grafana's $instance as any host)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"rigbook:dashboard_{i}", "expr": expr.replace("$instance", ".+")}
        for i, (_title, expr) in enumerate(queries)]}]}
    (tmp_path / "dashboard-rules.yml").write_text(yaml.safe_dump(rules))
    check = prometheus.run("check", "rules", str(tmp_path / "dashboard-rules.yml"))
    assert check.returncode == 0, check.stdout + check.stderr


def _install(tmp_path, rules_dir, check=False):
    tasks = [{"name": "rules", "ansible.builtin.include_role": {"name": "rigbook.homelab.health",
                                                                  "tasks_from": "prometheus_rules"},
              "vars": {"health_prometheus_rules_dir": rules_dir}}]
    proc = local_playbook(tmp_path, tasks, check=check)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    task = proc.stdout.split("Install the Prometheus alert rules (rigbook-alerts.yml)", 1)[1].split("PLAY RECAP")[0]
    return task.split("\n", 1)[1].strip().split(":")[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="the rules file is root's (owner root): the role runs as root")
def test_the_role_installs_the_rules_where_pointed_check_mode_first_then_once(tmp_path):
    rules_dir = tmp_path / "prometheus" / "rules.d"
    rules_dir.mkdir(parents=True)
    installed = rules_dir / "rigbook-alerts.yml"
    assert _install(tmp_path, str(rules_dir), check=True) == "changed" and not installed.exists()
    assert _install(tmp_path, str(rules_dir)) == "changed"
    assert installed.read_bytes() == RULES.read_bytes() and installed.stat().st_mode & 0o777 == 0o644
    assert _install(tmp_path, str(rules_dir)) == "ok"
    assert _install(tmp_path, "") == "skipping"  # unset: nothing installed anywhere


def test_a_served_page_reads_as_the_file_it_serves():
    """node_exporter serves a textfile's series with the labels sorted, every label of the family on each series
    (code="" on a pass) and its own number format: the lab tests read them as the file's series."""
    written = ('rigbook_layer_status{layer="pcie_link",code="RB-PCIE-LINK-WIDTH"} 2\n'
               'rigbook_layer_status{layer="firmware"} 0\n'
               'rigbook_layer_figure{layer="serving",figure="decode_tok_s"} 70.0\n'
               "rigbook_health_last_run_timestamp_seconds 1796490040.744681\n")
    served = ('# TYPE rigbook_layer_status gauge\n'
              'rigbook_layer_status{code="",layer="firmware"} 0\n'
              'rigbook_layer_status{code="RB-PCIE-LINK-WIDTH",layer="pcie_link"} 2\n'
              'rigbook_layer_figure{figure="decode_tok_s",layer="serving"} 70\n'
              "rigbook_health_last_run_timestamp_seconds 1.796490040744681e+09\n"
              "node_textfile_scrape_error 0\n")
    assert prometheus.series(served) == prometheus.series(written) == (
        {'rigbook_layer_status{layer="pcie_link"}': 2.0, 'rigbook_layer_status{layer="firmware"}': 0.0,
         'rigbook_layer_figure{figure="decode_tok_s",layer="serving"}': 70.0,
         "rigbook_health_last_run_timestamp_seconds": 1796490040.744681},
        {'rigbook_layer_status{layer="pcie_link"}': "RB-PCIE-LINK-WIDTH"})
