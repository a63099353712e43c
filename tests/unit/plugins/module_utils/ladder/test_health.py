"""module_utils/ladder/health.py: one health run over a lab rig's recorded tree (the same climb the ladder runs, static
layers only), its node_exporter textfile and journal lines, the error counters against the last run's reading, and
the entry point's bad input. Recorded hardware trees only (src/rigbook/lab/rigs); no GPU, nothing live."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import tempfile
import threading

import pytest

from rigbook.lab import faults, hardware_trees
from rigbook.paths import link_collection
from rigbook.snapshots import judge_tree, ladder_view_of
from rigbook.validate import validate

link_collection()
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner  # noqa: E402
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import health, registry  # noqa: E402

INV = validate("inventory/lab")


def _config(tmp_path, tree):
    return {"host": "lab-r9700", "ladder_view": ladder_view_of(INV, "lab-r9700"), "evidence_root": str(tree),
            "serve": [], "textfile": str(tmp_path / "prom/rigbook.prom"), "state_dir": str(tmp_path / "state")}


def _statuses(text):
    return {line.split('"')[1]: int(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("rigbook_layer_status{")}


def test_a_run_judges_the_static_layers_as_the_ladder_does_and_writes_them_as_metrics(tmp_path):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    config = _config(tmp_path, tree)
    result = health.check(config, now=iter([100.0, 100.5]).__next__)
    ladder = {v["layer"]: v["status"] for v in judge_tree(str(tree), config["ladder_view"])}
    assert [v["layer"] for v in result["layers"]] == ["firmware", "pcie_link", "dma_window", "kernel_state",
                                                      "driver_state"]
    assert {v["layer"]: v["status"] for v in result["layers"]} == {k: ladder[k] for k in health.layers_of(config)}
    text = health.prometheus_text(result)
    assert _statuses(text) == {v["layer"]: health.STATUS_VALUE[v["status"]] for v in result["layers"]}
    assert "rigbook_health_last_run_timestamp_seconds 100.5\n" in text
    assert "rigbook_health_run_duration_seconds 0.5\n" in text
    assert "rigbook_error_counters_status 0\n" in text
    assert all(line.startswith(("# HELP ", "# TYPE ", "rigbook_")) for line in text.splitlines())
    lines = health.journal_lines(result)
    assert lines[0].startswith("firmware: ") and lines[-1] == "error_counters: pass: no error rose"
    # the reading this run took is the next run's "before"
    assert json.loads((tmp_path / "state" / health.ERROR_COUNTERS_STATE).read_text())


def test_a_fault_shows_in_the_metrics_at_its_layer_and_a_serve_profile_adds_the_serving_layer(tmp_path):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    faults.apply(faults.plan("link-x8", tree, hardware_trees.load_rig("x99-r9700")))
    config = _config(tmp_path, tree)
    result = health.check(config)
    text = health.prometheus_text(result)
    statuses = _statuses(text)
    assert statuses["pcie_link"] == health.STATUS_VALUE["fail"]
    # the failing layer's series carries its failure code; the passing layers' the layer alone
    (link,) = [v for v in result["layers"] if v["layer"] == "pcie_link"]
    assert link["code"].startswith("RB-PCIE-")
    assert f'rigbook_layer_status{{layer="pcie_link",code="{link["code"]}"}} 2\n' in text
    assert 'rigbook_layer_status{layer="firmware"} 0\n' in text
    config["serve"] = [{"name": "standin", "model_path": "/srv/m", "tp_size": 2, "port": 30000}]
    assert health.layers_of(config)[-1] == "serving"


def test_figures_and_labels_are_written_in_the_text_format():
    result = {"layers": [{"layer": 'od"d\\', "status": "warn", "metrics": {"decode_tok_s": 70, "flag": True,
                                                                              "missing": None}}],
              "error_counters": {"status": "fail", "why": "x"}, "time": 1.0, "duration_s": 0.25}
    text = health.prometheus_text(result)
    assert 'rigbook_layer_status{layer="od\\"d\\\\"} 1\n' in text
    assert 'rigbook_layer_figure{layer="od\\"d\\\\",figure="decode_tok_s"} 70.0\n' in text
    assert "flag" not in text and "missing" not in text  # figures are numbers only
    assert "rigbook_error_counters_status 2\n" in text


def test_a_failing_or_warning_layer_s_series_carries_its_code_escaped_and_the_journal_line_names_it():
    result = {"layers": [{"layer": "serving", "status": "fail", "code": "RB-SERVING-SHM-TRANSPORT", "why": "shm"},
                         {"layer": "odd", "status": "warn", "code": 'RB-"x\\\n', "why": "w"},
                         {"layer": "collectives", "status": "skip", "code": "RB-COLLECTIVES-SKIP", "why": "one GPU"},
                         {"layer": "firmware", "status": "unknown", "code": "RB-FIRMWARE-UNKNOWN", "why": "?"},
                         {"layer": "pcie_link", "status": "pass", "why": "ok"}],
              "error_counters": {"status": "fail", "why": "Xid 79", "code": "RB-HW-XID-CRITICAL"},
              "time": 1.0, "duration_s": 0.25}
    text = health.prometheus_text(result)
    assert 'rigbook_layer_status{layer="serving",code="RB-SERVING-SHM-TRANSPORT"} 2\n' in text
    assert 'rigbook_layer_status{layer="odd",code="RB-\\"x\\\\\\n"} 1\n' in text  # escaped as every label
    # skip, unknown and pass keep the layer label alone (series names and their labels stay as they were)
    assert 'rigbook_layer_status{layer="collectives"} 4\n' in text
    assert 'rigbook_layer_status{layer="firmware"} 3\n' in text
    assert 'rigbook_layer_status{layer="pcie_link"} 0\n' in text
    assert 'rigbook_error_counters_status{code="RB-HW-XID-CRITICAL"} 2\n' in text
    lines = health.journal_lines(result)
    assert lines[0] == "serving: fail: [RB-SERVING-SHM-TRANSPORT] shm"
    assert lines[2] == "collectives: skip: [RB-COLLECTIVES-SKIP] one GPU" and lines[4] == "pcie_link: pass: ok"
    assert lines[-1] == "error_counters: fail: [RB-HW-XID-CRITICAL] Xid 79"


@pytest.mark.parametrize("argv, content, words", [
    (["--config"], None, "usage: rigbook-health --config FILE"),
    (["--config", "{path}"], "not json", "cannot read"),
    (["--config", "{path}"], json.dumps({"host": "x"}), "names no textfile"),
])
def test_bad_config_is_exit_2_with_the_reason(tmp_path, capsys, argv, content, words):
    path = tmp_path / "health.json"
    if content is not None:
        path.write_text(content)
    assert health.main([a.format(path=path) for a in argv]) == 2
    assert words in capsys.readouterr().err


def test_main_writes_the_textfile_atomically_and_exits_1_when_a_layer_fails(tmp_path, capsys):
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    faults.apply(faults.plan("link-x8", tree, hardware_trees.load_rig("x99-r9700")))
    path = tmp_path / "health.json"
    path.write_text(json.dumps(_config(tmp_path, tree)))
    assert health.main(["--config", str(path)]) == 1
    text = (tmp_path / "prom/rigbook.prom").read_text()
    assert _statuses(text)["pcie_link"] == 2 and not list((tmp_path / "prom").glob("*.tmp"))
    assert "pcie_link: fail: [RB-PCIE-" in capsys.readouterr().out


def _planted_run(tmp_path, monkeypatch, names, planted):
    """health.main over a recorded tree with the temporary names of the metrics writer fixed to NAMES (cycled) and a
    link to a victim file planted at each of PLANTED (names under the textfile folder): (exit code, victim, the
    flags each temporary file in the textfile folder was opened with)."""
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    config = tmp_path / "health.json"
    config.write_text(json.dumps(_config(tmp_path, tree)))
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    prom = tmp_path / "prom"
    prom.mkdir()
    for name in planted:
        (prom / name).symlink_to(victim)
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: itertools.cycle(names))
    opened, real_open = [], os.open

    def recording_open(path, flags, *args, **kwargs):
        if os.path.dirname(str(path)) == str(prom) and os.path.basename(str(path)).startswith(".rigbook-"):
            opened.append(flags)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    return health.main(["--config", str(config)]), victim, opened


def test_a_link_planted_at_a_temporary_name_of_the_metrics_writer_is_skipped_never_followed(tmp_path, monkeypatch,
                                                                                            capsys):
    code, victim, opened = _planted_run(tmp_path, monkeypatch, ["aaaa", "bbbb", "cccc"],
                                        [".rigbook-aaaa", ".rigbook-bbbb"])
    assert code in (0, 1), capsys.readouterr().err
    assert victim.read_text() == "root's file\n" and victim.stat().st_mode & 0o777 == 0o600
    prom = tmp_path / "prom/rigbook.prom"
    assert not prom.is_symlink() and "rigbook_layer_status" in prom.read_text()
    assert prom.stat().st_mode & 0o777 == 0o644
    assert len(opened) == 3 and all(f & os.O_EXCL and f & os.O_NOFOLLOW and f & os.O_CREAT for f in opened)


def test_links_at_every_name_the_writer_could_use_leave_the_victim_untouched(tmp_path, monkeypatch, capsys):
    names = ["aaaa", "bbbb"]
    code, victim, _opened = _planted_run(tmp_path, monkeypatch, names,
                                         [".rigbook-" + n for n in names] + ["rigbook.prom"])
    assert code == 2 and "cannot write" in capsys.readouterr().err
    assert victim.read_text() == "root's file\n"
    assert sorted(p.name for p in (tmp_path / "prom").iterdir()) == [".rigbook-aaaa", ".rigbook-bbbb", "rigbook.prom"]
    assert all((tmp_path / "prom" / name).is_symlink() for name in (".rigbook-aaaa", "rigbook.prom"))


def test_a_link_at_the_metrics_file_itself_is_replaced_never_written_through(tmp_path, monkeypatch, capsys):
    code, victim, _opened = _planted_run(tmp_path, monkeypatch, ["aaaa"], ["rigbook.prom"])
    assert code == 2 and "symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "root's file\n" and (tmp_path / "prom/rigbook.prom").is_symlink()


# --- the health timer beside a serving engine: request-free, never stops it ------------------------------------------

class _Engine(http.server.BaseHTTPRequestHandler):
    """A serving engine on loopback that keeps every request it gets."""

    requests = []

    def _answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Engine.requests.append(("GET", self.path))
        self._answer({"data": [{"id": "standin"}]} if self.path == "/v1/models" else {})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Engine.requests.append(("POST", self.path))
        self._answer({"usage": {"completion_tokens": 8}})

    def log_message(self, *args):
        pass


@pytest.fixture
def serving(tmp_path, monkeypatch):
    """(config, commands): a health run's config whose serve profile is an engine of this test on loopback, and every
    command the run asks the runner for (systemctl answering that the unit runs, journalctl with the engine's log)."""
    _Engine.requests = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    commands = []

    def run(argv, timeout=None, **kwargs):
        argv = [str(a) for a in argv]
        commands.append(argv)
        if argv[:2] == ["systemctl", "show"]:
            return runner.Result(argv, 0, "Id=rigbook-serve-standin.service\nLoadState=loaded\nActiveState=active\n"
                                          "SubState=running\nNRestarts=0\nMainPID=0\n", "", None, False)
        return runner.Result(argv, 0, "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n", "", None, False)

    monkeypatch.setattr(runner, "run", run)
    tree = hardware_trees.materialize("x99-r9700", tmp_path / "tree")
    config = _config(tmp_path, tree)
    config["serve"] = [{"name": "standin", "unit": "rigbook-serve-standin.service", "bind": "127.0.0.1",
                        "port": server.server_address[1], "startup_timeout_s": 900, "served_model_name": "standin"}]
    config["hold_state"] = str(tmp_path / "hold.json")
    yield config, commands
    server.shutdown()
    server.server_close()


def test_a_health_run_sends_no_chat_request_and_never_stops_starts_or_measures_the_gpus(serving):
    config, commands = serving
    result = health.check(config)
    assert [v["layer"] for v in result["layers"]] == registry.names(registry.STATIC) + ["serving"]
    # one readiness poll and the model list: no chat completion, nothing that generates beyond the health check
    assert _Engine.requests == [("GET", "/health_generate"), ("GET", "/v1/models")]
    assert not any(a[0] == "systemctl" and a[1] in ("stop", "start", "restart", "kill", "reset-failed")
                   for a in commands), commands
    assert {a[0] for a in commands} <= {"systemctl", "journalctl"}  # no probe, no collectives test, no benchmark
    assert not os.path.exists(config["hold_state"])


def test_while_a_ladder_run_holds_the_units_the_serving_layer_is_a_skip_that_says_so(serving):
    config, commands = serving
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import serving_hold

    # the hold of a run that still runs (this process stands in for it)
    record = {"units": ["rigbook-serve-standin.service"], "pid": os.getpid(),
              "started": serving_hold.process_start(os.getpid()), "boot_id": serving_hold.boot_id(),
              "since": "2025-12-05T01:00:00+0000"}
    with open(config["hold_state"], "w") as handle:
        json.dump(record, handle)
    result = health.check(config)
    serving_verdict = result["layers"][-1]
    assert serving_verdict["layer"] == "serving" and serving_verdict["status"] == "skip"
    assert serving_verdict["code"] == "RB-SERVING-HELD"
    assert serving_verdict["why"] == (f"a ladder run (pid {os.getpid()}) stopped rigbook-serve-standin.service at "
                                      "2025-12-05T01:00:00+0000 for its runtime layers and starts them again after "
                                      "them: not judged this run")
    assert _Engine.requests == [] and commands == []
    assert 'rigbook_layer_status{layer="serving"} 4' in health.prometheus_text(result)
    # a holder that has ended (killed mid-run, its pid since reused): the serving layer is judged again as usual
    with open(config["hold_state"], "w") as handle:
        json.dump(dict(record, started=record["started"] + 1), handle)
    again = health.check(config)["layers"][-1]
    assert again["layer"] == "serving" and again["status"] != "skip"
    assert _Engine.requests == [("GET", "/health_generate"), ("GET", "/v1/models")]
