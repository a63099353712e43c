"""rigbook.homelab.health_timer: the health run's config from the host model, the oneshot service and the timer,
written only when they differ, systemd told exactly what changed (exact commands, faked), check mode and removal."""

from __future__ import annotations

import json

import pytest
from helpers.modules import fail, ok, run_module

from rigbook.paths import link_collection

link_collection()
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.modules import health_timer  # noqa: E402

MODEL = host_model.build({"rigbook_gpu": {"vendor": "amd", "count": 2}, "rigbook_health": {"interval_s": 20},
                          "rigbook_serve": [{"name": "m", "model_path": "/srv/m", "tp_size": 2,
                                             "env": {"HF_TOKEN": "hf_secret_value"}}]})
IS_ENABLED = ["systemctl", "is-enabled", "rigbook-health.timer"]
IS_ACTIVE = ["systemctl", "is-active", "rigbook-health.timer"]
START = [(["systemctl", "enable", "rigbook-health.timer"], ok()),
         (["systemctl", "start", "rigbook-health.timer"], ok())]


@pytest.fixture(autouse=True)
def booted(tmp_path, monkeypatch):
    """systemd as the init system (sd_booted: its run folder exists), unless a test says otherwise."""
    folder = tmp_path / "run-systemd-system"
    folder.mkdir()
    monkeypatch.setattr(health_timer, "SYSTEMD_RUN", str(folder))
    return folder


def _args(tmp_path, **extra):
    return dict({"host": MODEL, "name": "box-1", "config_path": str(tmp_path / "etc/health.json"),
                 "unit_dir": str(tmp_path / "units"), "interval_s": MODEL["health"]["interval_s"]}, **extra)


def test_a_fresh_box_gets_the_three_files_and_a_started_timer_then_a_rerun_changes_nothing(tmp_path):
    first = run_module(health_timer, _args(tmp_path), [
        (IS_ENABLED, (1, "disabled\n", "")), (IS_ACTIVE, (3, "inactive\n", "")),
        (["systemctl", "daemon-reload"], ok()),
        *START])
    assert not first.failed, first.msg
    assert first.result["changed"] and first.result["timer"] == ["enabled", "started"]
    config = json.loads((tmp_path / "etc/health.json").read_text())
    assert config["host"] == "box-1" and config["textfile"] == "/var/lib/prometheus/node-exporter/rigbook.prom"
    # the serve profiles without their environment (a token there stays out), the file root's alone
    assert [p["name"] for p in config["serve"]] == ["m"] and "env" not in config["serve"][0]
    assert "hf_secret_value" not in (tmp_path / "etc/health.json").read_text()
    assert (tmp_path / "etc/health.json").stat().st_mode & 0o777 == 0o600
    assert config["ladder_view"] == host_model.ladder_view(MODEL) and config["evidence_root"] == "/"
    assert config["interval_s"] == 20  # the timer's, written as rigbook_health_interval_seconds (the stale alert)
    service = (tmp_path / "units/rigbook-health.service").read_text()
    assert "Type=oneshot" in service
    assert f"ExecStart=/usr/bin/python3 /usr/local/lib/rigbook-health.pyz --config {tmp_path}/etc/health.json" \
        in service
    assert "OnUnitActiveSec=20s" in (tmp_path / "units/rigbook-health.timer").read_text()
    again = run_module(health_timer, _args(tmp_path), [(IS_ENABLED, ok("enabled\n")), (IS_ACTIVE, ok("active\n"))])
    assert not again.failed and not again.result["changed"] and again.result["files_changed"] == []


def test_a_new_interval_rewrites_the_timer_and_restarts_it_check_mode_touches_nothing(tmp_path):
    run_module(health_timer, _args(tmp_path), [
        (IS_ENABLED, ok("disabled\n")), (IS_ACTIVE, ok("inactive\n")), (["systemctl", "daemon-reload"], ok()),
        *START])
    timer = tmp_path / "units/rigbook-health.timer"
    before = timer.read_text()
    checked = run_module(health_timer, _args(tmp_path, interval_s=60), [
        (IS_ENABLED, ok("enabled\n")), (IS_ACTIVE, ok("active\n"))], check_mode=True, diff=True)
    # the config names the interval too (the metric the stale alert divides by)
    assert checked.result["changed"] and checked.result["files_changed"] == [str(tmp_path / "etc/health.json"),
                                                                             str(timer)]
    assert "OnUnitActiveSec=60s" in checked.result["diff"]["after"] and timer.read_text() == before
    done = run_module(health_timer, _args(tmp_path, interval_s=60), [
        (IS_ENABLED, ok("enabled\n")), (IS_ACTIVE, ok("active\n")), (["systemctl", "daemon-reload"], ok()),
        (["systemctl", "restart", "rigbook-health.timer"], ok())])
    assert done.result["timer"] == ["restarted"] and "OnUnitActiveSec=60s" in timer.read_text()
    assert json.loads((tmp_path / "etc/health.json").read_text())["interval_s"] == 60


def test_absent_stops_the_timer_and_removes_the_files_and_bad_input_is_refused(tmp_path):
    run_module(health_timer, _args(tmp_path), [
        (IS_ENABLED, ok("disabled\n")), (IS_ACTIVE, ok("inactive\n")), (["systemctl", "daemon-reload"], ok()),
        *START])
    gone = run_module(health_timer, _args(tmp_path, state="absent"), [
        (["systemctl", "disable", "--now", "rigbook-health.timer"], ok()), (["systemctl", "daemon-reload"], ok())])
    assert gone.result["changed"] and not list((tmp_path / "units").iterdir())
    assert not (tmp_path / "etc/health.json").exists()
    assert run_module(health_timer, _args(tmp_path, state="absent")).result["changed"] is False
    bad = run_module(health_timer, _args(tmp_path, interval_s=0))
    assert bad.failed and "interval_s 0: at least 1 second" in bad.msg
    not_a_model = run_module(health_timer, _args(tmp_path, host={"vendor": "amd"}))
    assert not_a_model.failed and "not a host model" in not_a_model.msg


def test_a_failed_systemctl_fails_the_run_and_a_link_is_never_written_through(tmp_path):
    failed = run_module(health_timer, _args(tmp_path), [
        (IS_ENABLED, ok("disabled\n")), (IS_ACTIVE, ok("inactive\n")), (["systemctl", "daemon-reload"], ok()),
        (["systemctl", "enable", "rigbook-health.timer"], fail(1, "Access denied"))])
    assert failed.failed and failed.msg == "systemctl enable rigbook-health.timer exited 1: Access denied"
    config = tmp_path / "etc/health.json"
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}\n")
    config.unlink()
    config.symlink_to(elsewhere)
    refused = run_module(health_timer, _args(tmp_path), [(IS_ENABLED, ok("enabled\n")), (IS_ACTIVE, ok("active\n"))])
    assert refused.failed and refused.msg.startswith(f"cannot write {config}: ") and "symbolic link" in refused.msg
    assert elsewhere.read_text() == "{}\n"


def test_without_systemd_as_init_the_files_are_written_and_no_systemctl_runs(tmp_path, booted):
    booted.rmdir()  # a container or a chroot: systemctl cannot talk to systemd
    first = run_module(health_timer, _args(tmp_path))
    assert not first.failed and first.result["changed"] and first.result["timer"] == []
    assert first.result["systemd"] is False  # said in a warning too
    assert len(first.result["files_changed"]) == 3 and (tmp_path / "units/rigbook-health.timer").is_file()
    again = run_module(health_timer, _args(tmp_path))
    assert not again.failed and not again.result["changed"]
