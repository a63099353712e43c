"""rigbook/run.py's rolling runs (`provision site.yml --rolling N|N%`): the batches (a canary first), each batch one
whole run, the first failing batch stopping the roll with the hosts after it untouched, and the summary saying where
and why. The runs themselves are replaced here (a fake run_playbook records its options); the lab runs them for real
(tests/integration/test_rolling_lab.py)."""

from __future__ import annotations

import json

import pytest

from rigbook import run
from rigbook.cli import main
from rigbook.errors import UserError

HOSTS = ["box-1", "box-2", "box-3", "box-4", "box-5"]


@pytest.mark.parametrize("spec, batches", [
    ("1", [["box-1"], ["box-2"], ["box-3"], ["box-4"], ["box-5"]]),
    ("2", [["box-1"], ["box-2", "box-3"], ["box-4", "box-5"]]),
    ("50%", [["box-1"], ["box-2", "box-3", "box-4"], ["box-5"]]),  # 50% of 5, rounded up: 3
    ("1%", [["box-1"], ["box-2"], ["box-3"], ["box-4"], ["box-5"]]),
    ("100%", [["box-1"], ["box-2", "box-3", "box-4", "box-5"]]),
])
def test_a_canary_then_batches_of_n_or_n_percent(spec, batches):
    assert run.rolling_batches(HOSTS, spec) == batches


@pytest.mark.parametrize("spec", ["0", "-1", "x", "101%", "2.5", "", "%"])
def test_a_bad_batch_size_is_refused(spec):
    with pytest.raises(UserError, match="a number of hosts per batch"):
        run.rolling_batches(HOSTS, spec)


class FakeInventory:
    hosts = {h: {} for h in HOSTS}

    def limited(self, limit):
        return sorted(HOSTS) if not limit else [h for h in HOSTS if h in limit.split(",")]


@pytest.fixture
def fake_runs(monkeypatch, tmp_path):
    """Each run's options, recorded; box-3's run fails (exit 1) with a failure in its JSON summary. The roll's
    record goes to a state directory of the test's own."""
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    ran = []

    def run_playbook(opts):
        ran.append(opts)
        code = 1 if "box-3" in opts.limit.split(",") else 0
        if opts.summaries is not None:
            failures = [{"task": "Ladder 1-5: pcie_link", "msg": "pcie_link: fail: x8 of x16\nmore"}] if code else []
            opts.summaries.append({"exit_code": code, "hosts": {h: {"failures": failures if h == "box-3" else []}
                                                                for h in opts.limit.split(",")}})
        return code

    monkeypatch.setattr(run, "run_playbook", run_playbook)
    monkeypatch.setattr(run, "validate", lambda *a, **k: FakeInventory())  # as rigbook.run imported them
    monkeypatch.setattr(run, "run_roles", lambda *a, **k: None)
    return ran


def test_the_first_failing_batch_stops_the_roll_and_the_rest_is_untouched(fake_runs, capsys):
    code = run.run_rolling(run.RunOptions(playbook="site.yml", inventory="lab", extra_vars=["k=v"]), "2")
    assert code == 1
    assert [o.limit for o in fake_runs] == ["box-1", "box-2,box-3"]  # box-4 and box-5 never ran
    assert all(o.extra_vars == ["k=v"] and o.playbook == "site.yml" for o in fake_runs)
    out = capsys.readouterr().out
    assert "rolling: batch 1/3 (canary): box-1\n" in out and "rolling: batch 2/3: box-2, box-3\n" in out
    assert ("rolling: stopped at batch 2/3 (box-2, box-3): exit 1: box-3 at 'Ladder 1-5: pcie_link': pcie_link: fail: "
            "x8 of x16; not reached, untouched: box-4, box-5") in out
    roll = run.last_roll(str(run.resolve_inventory("lab")))  # what `provision report` shows as the last roll
    assert roll["stopped_at_batch"] == 2 and roll["untouched"] == ["box-4", "box-5"] and roll["spec"] == "2"
    assert roll["why"].startswith("exit 1: box-3 at 'Ladder 1-5: pcie_link'") and roll["exit_code"] == 1


def test_json_is_one_document_with_every_run_and_the_reason(fake_runs, capsys):
    code = run.run_rolling(run.RunOptions(playbook="site.yml", inventory="lab", json=True), "1")
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # one JSON document on stdout; progress on stderr
    assert code == 1 and data["exit_code"] == 1
    assert data["rolling"] == {"spec": "1", "stopped_at_batch": 3, "untouched": ["box-4", "box-5"], "batches": [
        {"batch": 1, "hosts": ["box-1"], "exit_code": 0}, {"batch": 2, "hosts": ["box-2"], "exit_code": 0},
        {"batch": 3, "hosts": ["box-3"], "exit_code": 1}]}
    assert len(data["runs"]) == 3
    assert ("rolling: stopped at batch 3/5 (box-3): exit 1: box-3 at 'Ladder 1-5: pcie_link': pcie_link: fail: x8 of "
            "x16; not reached, untouched: box-4, box-5") in captured.err  # the failure's first line only


def test_every_batch_passing_says_so(fake_runs, capsys):
    code = run.run_rolling(run.RunOptions(playbook="site.yml", inventory="lab", limit="box-1,box-2"), "1")
    assert code == 0 and [o.limit for o in fake_runs] == ["box-1", "box-2"]
    assert "rolling: all 2 batches passed (2 hosts)" in capsys.readouterr().out


def test_a_limit_pattern_and_a_bad_size_are_exit_2_before_anything_runs(fake_runs, capsys):
    assert main(["site.yml", "-i", "lab", "--rolling", "0"]) == 2
    assert "--rolling '0': a number of hosts per batch" in capsys.readouterr().err
    assert main(["site.yml", "-i", "lab", "--rolling", "--limit", "box-*"]) == 2
    assert "name hosts or groups (no patterns)" in capsys.readouterr().err
    assert fake_runs == []
