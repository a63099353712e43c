"""module_utils/ladder/health.py: one health run over a lab rig's recorded tree (the same climb the ladder runs, static
layers only), its node_exporter textfile and journal lines, the error counters against the last run's reading, and
the entry point's bad input. Recorded hardware trees only (src/rigbook/lab/rigs); no GPU, nothing live."""

from __future__ import annotations

import itertools
import json
import os
import tempfile

import pytest

from rigbook.lab import faults, hardware_trees
from rigbook.paths import link_collection
from rigbook.snapshots import judge_tree, ladder_view_of
from rigbook.validate import validate

link_collection()
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import health  # noqa: E402

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
    statuses = _statuses(health.prometheus_text(health.check(config)))
    assert statuses["pcie_link"] == health.STATUS_VALUE["fail"]
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
    assert "pcie_link: fail: " in capsys.readouterr().out


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
