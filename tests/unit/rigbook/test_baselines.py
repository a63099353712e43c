"""Host and group baselines: which baseline judges a host, recording a group's from its first box, and the twin
built later held to it (issue 14: a twin at half the busbw used to pass for want of a baseline of its own)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import ansible_runner
import pytest
import yaml
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.collective_layers import judge_collectives
from helpers.cli import provision

from rigbook import baselines, runs, statefile
from rigbook.cli import main
from rigbook.errors import UserError
from rigbook.inventory import load
from rigbook.paths import inventory_key, name_file

REPO = Path(__file__).resolve().parents[3]
# Seed 004 (X99 + 2x R9700): RCCL SendRecv 1 GB 9.75 GB/s, AllReduce busbw 9.51 GB/s.
SEED_004 = {"sendrecv_busbw_gbs": 9.75, "all_reduce_busbw_gbs": 9.51}
P2P = {"gpu": {"count": 2}, "p2p": {"expected": True, "nccl_p2p_level": "PHB"}}
INVENTORY = """---
all:
  children:
    lab:
      children:
        x99_r9700:
          hosts:
            box-a: {}
            box-b: {}
        serving:
          hosts:
            box-b: {}
            box-c: {}
        x99_3080:
          hosts:
            rig-3080: {}
"""


@pytest.fixture
def inv(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return load(path)


def ladder(metrics: dict) -> list:
    return [{"layer": "collectives", "status": "pass", "metrics": metrics}]


def collectives(factor: float) -> dict:
    return {"available": True, "source": "recorded",
            "results": [{"op": "sendrecv", "size_bytes": 1 << 30, "busbw_gbs": 9.75 * factor, "wrong": 0},
                        {"op": "all_reduce", "size_bytes": 1 << 30, "busbw_gbs": 9.51 * factor, "wrong": 0}]}


def record_first_box(inv, host="box-a", only="*") -> str:
    recorded = baselines.record(host, ladder(SEED_004), "/runs/x", inv)
    return baselines.record_groups(inv, {host: recorded}, only)[host]


def test_a_hosts_groups_are_those_listing_it_in_inventory_order(inv):
    assert baselines.host_groups(inv, "box-b") == ["x99_r9700", "serving"]
    assert baselines.host_groups(inv, "rig-3080") == ["x99_3080"]  # not its parent lab, not all
    assert baselines.inventory_order(inv, ["rig-3080", "box-b", "box-a", "zz"]) == ["box-a", "box-b", "rig-3080", "zz"]


def test_recording_with_group_records_the_hosts_groups_only(inv):
    assert record_first_box(inv) == "group x99_r9700: recorded, the mean of box-a"
    group = baselines.load_group("x99_r9700", inv)["recorded"]
    assert group["metrics"] == SEED_004 and group["from_hosts"] == ["box-a"]
    assert baselines.load_group("lab", inv)["recorded"] is None


def test_a_twin_without_a_baseline_is_judged_by_its_group_and_fails_at_half_the_busbw(inv):
    record_first_box(inv)
    given = baselines.extra_vars(["box-a", "box-b", "rig-3080"], inv)["rigbook_baselines"]
    assert given["box-a"]["source"] == "host box-a"
    assert given["box-b"]["source"] == "group x99_r9700" and given["box-b"]["metrics"] == SEED_004
    assert "rig-3080" not in given
    verdict = judge_collectives(collectives(0.5), P2P, given["box-b"]["metrics"])
    assert verdict["status"] == "fail"
    assert "all_reduce_busbw_gbs 4.75 vs baseline 9.51 (0.50x), below 0.80x" in verdict["why"]
    assert judge_collectives(collectives(1.0), P2P, given["box-b"]["metrics"])["status"] == "pass"


def test_without_the_inventory_there_is_no_group_baseline(inv):
    record_first_box(inv)
    assert baselines.extra_vars(["box-b"])["rigbook_baselines"] == {}
    assert baselines.resolve("box-b") == ("none", None)


def test_a_baseline_of_its_own_wins_over_the_groups(inv):
    record_first_box(inv)
    baselines.record("box-b", ladder({"sendrecv_busbw_gbs": 5.0}), "/runs/y", inv)
    label, recorded = baselines.resolve("box-b", inv)
    assert label == "host box-b" and recorded["metrics"] == {"sendrecv_busbw_gbs": 5.0}


def test_the_first_group_in_inventory_order_that_has_one_judges(inv):
    record_first_box(inv, "box-c")  # box-c records serving only
    assert baselines.resolve("box-b", inv)[0] == "group serving"
    record_first_box(inv, "box-a")  # x99_r9700 comes first in the inventory
    assert baselines.resolve("box-b", inv)[0] == "group x99_r9700"


def test_a_groups_baseline_is_the_mean_of_its_boxes_with_the_outliers_dropped_and_named(inv):
    """Three boxes of x99_r9700/serving recorded in one run: box-c at half the busbw is dropped (below 0.8x the
    mean of the three), the group's figures are the mean of the others, and the run says which box went and why."""
    recorded = {host: baselines.record(host, ladder({k: v * factor for k, v in SEED_004.items()}), "/runs/x", inv)
                for host, factor in (("box-a", 1.0), ("box-b", 0.98), ("box-c", 0.5))}
    said = baselines.record_groups(inv, recorded, "*")
    group = baselines.load_group("x99_r9700", inv)["recorded"]
    assert group["from_hosts"] == ["box-a", "box-b"] and group["dropped"] == []
    assert group["metrics"]["sendrecv_busbw_gbs"] == round(9.75 * 0.99, 4)
    serving = baselines.load_group("serving", inv)["recorded"]
    assert serving["from_hosts"] == ["box-b"] and [d["host"] for d in serving["dropped"]] == ["box-c"]
    assert said["box-c"] == ("group serving: recorded, the mean of box-b; dropped box-c "
                             "(sendrecv_busbw_gbs 0.68x the mean)")
    assert said["box-a"] == "group x99_r9700: recorded, the mean of box-a, box-b"


def test_group_figures_drop_again_until_none_is_below_the_line_and_keep_the_best():
    figures, kept, dropped = baselines.group_figures(
        {"a": {"x": 10.0, "s_ttft_s": 0.10}, "b": {"x": 9.8, "s_ttft_s": 0.11}, "c": {"x": 5.0, "s_ttft_s": 0.10},
         "d": {"x": 10.1, "s_ttft_s": 0.50}}, fail_below=0.8)
    assert kept == ["a", "b"] and figures == {"x": 9.9, "s_ttft_s": 0.105}
    assert [(d["host"], d["figure"]) for d in dropped] == [("c", "x"), ("d", "s_ttft_s")]  # a time: worse when higher
    assert baselines.group_figures({"a": {"x": 1.0}, "b": {"x": 0.1}}, 0.8)[1] == ["a"]
    assert baselines.group_figures({"a": {"x": 1.0}}, 0.8) == ({"x": 1.0}, ["a"], [])


def test_recording_one_named_group(inv):
    assert record_first_box(inv, "box-b", only="serving") == "group serving: recorded, the mean of box-b"
    assert baselines.load_group("x99_r9700", inv)["recorded"] is None
    assert record_first_box(inv, "box-a", only="serving") == "group serving: not recorded, box-a is not listed in it"


def test_check_group_names_the_groups_that_can_hold_one(inv):
    baselines.check_group(inv, "*")
    baselines.check_group(inv, "serving")
    for bad in ("lab", "all", "nope"):
        with pytest.raises(UserError, match="groups: serving, x99_3080, x99_r9700"):
            baselines.check_group(inv, bad)


def test_the_summary_and_text_say_which_baseline_judged(inv):
    record_first_box(inv)
    hosts = ["box-a", "box-b", "rig-3080"]
    judged = baselines.judged_by(hosts, baselines.extra_vars(hosts, inv))
    assert judged == {"box-a": "host box-a", "box-b": "group x99_r9700", "rig-3080": "none"}
    summary = {"box-b": {"state": "ok", "ladder": [{"layer": "pcie_link", "status": "pass"},
                                                   {"layer": "collectives", "status": "fail", "metrics": SEED_004}]},
               "rig-3080": {"state": "ok"}}
    baselines.annotate(summary, judged, inv.path)
    assert summary["box-b"]["baseline_source"] == "group x99_r9700"
    assert summary["box-b"]["baseline_inventory"] == str(inv.path)
    assert summary["box-b"]["ladder"][1]["baseline"] == f"group x99_r9700 of inventory {inv.path}"
    assert "baseline" not in summary["box-b"]["ladder"][0]
    assert summary["rig-3080"]["baseline_source"] == "none" and "baseline_inventory" not in summary["rig-3080"]
    out = io.StringIO()
    baselines.print_judged(judged, out, inv.path)
    assert out.getvalue() == (f"baselines: box-a judged by host box-a of inventory {inv.path}; box-b judged by "
                              f"group x99_r9700 of inventory {inv.path}; rig-3080 judged by none\n")


def test_show_lists_group_baselines(inv):
    record_first_box(inv)
    out = io.StringIO()
    baselines.show([], out)
    assert "group x99_r9700: baseline of" in out.getvalue() and "from host(s) box-a" in out.getvalue()


def test_cli_record_group_of_a_parent_group_exits_2_before_any_host(tmp_path):
    proc = provision("baseline", "record", "--group", "lab", "-i", "lab", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert "--group lab: not a group that lists hosts" in proc.stderr and "x99_3080" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = provision("baseline", "show", "--group", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 2 and "--group is for record" in proc.stderr


def test_show_prints_brackets_in_host_names_and_the_state_path_as_they_are(tmp_path):
    """`provision baseline show` with `[/x]` / `[bold]` in a host name and in the state directory's path: printed
    as text (rich markup used to raise MarkupError, a traceback)."""
    state = tmp_path / "state[/x]"
    env = {"RIGBOOK_STATE_DIR": str(state)}
    proc = provision("baseline", "show", env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"no baselines yet under {state / 'baselines'}" in proc.stdout
    host = "rig[bold]"
    data = {"host": host, "recorded": {"at": "2024-01-01 00:00:00", "metrics": {"m[/x]": 1.5, "peer_gbs": 2.5},
                                       "versions": {"kernel": "6.8[/bold]"}}, "history": []}
    (state / "baselines").mkdir(parents=True)
    (state / "baselines" / name_file(host)).write_text(json.dumps(data))
    proc = provision("baseline", "show", env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{host}: baseline of 2024-01-01 00:00:00 (kernel 6.8[/bold])" in proc.stdout
    assert "peer_gbs" in proc.stdout and "2.50" in proc.stdout
    # a figure's name is a-z 0-9 _ -: one with brackets is left out, and the warning prints its name as text
    assert "m[/x]" not in proc.stdout and "figure 'm[/x]' left out (its name is not" in proc.stderr
    proc = provision("baseline", "show", "other[/x]", env=env)
    assert proc.returncode == 0 and "other[/x]: no baseline recorded" in proc.stdout, proc.stderr


@pytest.mark.parametrize("data,problem", [
    ({"host": "box-a", "history": [{"metrics": ["x"]}]}, "history entry 1: metrics is not an object but list"),
    ({"host": "box-a", "history": [{}, {"versions": "6.8"}]}, "history entry 2: versions is not an object but str"),
    ({"host": "box-a", "history": [{"statuses": 1}]}, "history entry 1: statuses is not an object but int"),
    ({"host": "box-a", "history": [{"run_dir": ["/r"]}]}, "history entry 1: run_dir is not a string but list"),
    ({"host": "box-a", "recorded": {"metrics": {}, "versions": []}},
     "its recorded baseline's versions is not an object but list"),
    ({"host": "box-a", "recorded": {"metrics": [1]}}, "its recorded baseline is not an object with metrics"),
    ({"host": "box-a", "history": "none"}, "its history is not a list of objects"),
    (["box-a"], "not a JSON object but list"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_baselines_file_of_the_wrong_shape_is_named_by_show(tmp_path, data, problem):
    """Every reader gets a file whose shape baselines._problem checked: one of the wrong shape is named with what is
    wrong (show: exit 2, moves nothing), never a traceback further on."""
    path = tmp_path / "baselines" / "box-a.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    proc = provision("baseline", "show", env={"RIGBOOK_STATE_DIR": str(tmp_path)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: baselines file {path} is corrupt ({problem})" in proc.stderr
    assert json.loads(path.read_text()) == data


@pytest.mark.parametrize("name,file", [
    ("rig-3080", "rig-3080.json"), ("box.lan", "box.lan.json"), ("127.0.0.7", "127.0.0.7.json"),
    ("../../victim/package", "%2E.%2F..%2Fvictim%2Fpackage.json"), (".hidden", "%2Ehidden.json"),
    ("..", "%2E..json"), ("a\\b", "a%5Cb.json"), ("a\nb", "a%0Ab.json"),
])
def test_a_name_becomes_one_file_name_inside_its_folder(tmp_path, monkeypatch, name, file):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    path = baselines._file(name)
    assert path.name == file and path.parent == tmp_path / "state" / "baselines"
    baselines.record(name, [{"layer": "p2p_bandwidth", "status": "pass", "metrics": {"gbps": 20.0}}], "run",
                     SimpleNamespace(path=tmp_path))
    assert baselines.hosts_with_data() == [name]
    assert sorted(p.name for p in (tmp_path / "state").rglob("*.json")) == [file]


def test_each_write_is_a_new_file_renamed_over_the_old_one(inv):
    """A baseline write never rewrites the file in place (a crash mid-write would leave half a file, a reader could
    see one): every record and history entry is a new file, written whole, then renamed over the old one."""
    baselines.record("box-a", ladder(SEED_004), "/runs/x", inv)
    path = baselines._file("box-a")
    first = path.stat()
    baselines.append_history("box-a", ladder(SEED_004), {"collectives": "pass"}, "/runs/y", inv)
    second = path.stat()
    assert second.st_ino != first.st_ino  # renamed over, not truncated and rewritten
    assert (second.st_mode & 0o777) == 0o600
    # no temporary file left beside it (the lock file is the writers' fcntl lock, kept)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, f".{path.name}.lock"])
    assert [e["run_dir"] for e in baselines.load("box-a", inv)["history"]] == ["/runs/x", "/runs/y"]


# --- per inventory (issue 36): two inventories that name a host alike never mix -----------------------------------

@pytest.fixture
def fork(tmp_path, inv):
    """A copy of the inventory in another folder (as the real run's `inv_fork` was `inv` with one pin more): the
    same host and group names."""
    path = tmp_path / "fork" / "hosts.yml"
    path.parent.mkdir()
    path.write_text(INVENTORY)
    return load(path)


def test_two_inventories_that_name_a_host_alike_never_share_its_baseline_or_history(inv, fork, tmp_path):
    record_first_box(inv)  # box-a's own baseline and its groups', recorded with inv
    assert baselines.resolve("box-a", fork) == ("none", None)
    assert baselines.resolve("box-b", fork) == ("none", None)  # nor the group's
    assert baselines.extra_vars(["box-a", "box-b"], fork) == {"rigbook_baselines": {}}
    baselines.record("box-a", ladder({"sendrecv_busbw_gbs": 5.0}), "/runs/fork", fork)
    baselines.append_history("box-a", ladder({"sendrecv_busbw_gbs": 4.9}), {"collectives": "pass"}, "/runs/fork2",
                             fork)
    assert baselines.resolve("box-a", inv)[1]["metrics"] == SEED_004
    assert baselines.resolve("box-a", fork)[1]["metrics"] == {"sendrecv_busbw_gbs": 5.0}
    assert baselines.resolve("box-b", inv)[0] == "group x99_r9700" and baselines.resolve("box-b", fork)[0] == "none"
    assert [e["run_dir"] for e in baselines.load("box-a", inv)["history"]] == ["/runs/x"]
    assert [e["run_dir"] for e in baselines.load("box-a", fork)["history"]] == ["/runs/fork", "/runs/fork2"]
    assert baselines.load("box-a", fork)["inventory"] == str(fork.path.resolve())
    link = tmp_path / "link.yml"  # another way to the same file is the same inventory
    link.symlink_to(inv.path)
    assert baselines.resolve("box-a", load(link))[1]["metrics"] == SEED_004
    out = io.StringIO()
    assert baselines.show(["box-a"], out) == 0
    assert f"box-a: the baseline of inventory {inv.path.resolve()}\n" in out.getvalue()
    assert f"box-a: the baseline of inventory {fork.path.resolve()}\n" in out.getvalue()
    out = io.StringIO()
    baselines.show([], out)
    assert f"group x99_r9700: baseline of {baselines.load_group('x99_r9700', inv)['recorded']['at']} from host(s) " \
           f"box-a, inventory {inv.path.resolve()} (" in out.getvalue()


def test_a_file_keeps_the_inventories_written_last(tmp_path, monkeypatch, capsys):
    """A host name used by more inventories than a file keeps (each a folder of its own, as tests and forks make
    them): the section written longest ago goes, named on stderr; the others are kept as they were."""
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    invs = []
    for number in range(baselines.INVENTORY_LIMIT + 1):
        path = tmp_path / f"inv{number}" / "hosts.yml"
        path.parent.mkdir()
        path.write_text(INVENTORY)
        invs.append(load(path))
    for number, inv in enumerate(invs):
        baselines.record("box-a", ladder({"sendrecv_busbw_gbs": float(number)}), f"/runs/{number}", inv)
    sections = json.loads(baselines._file("box-a").read_text())["inventories"]
    assert len(sections) == baselines.INVENTORY_LIMIT and inventory_key(invs[0].path) not in sections
    assert baselines.resolve("box-a", invs[0]) == ("none", None)
    assert baselines.resolve("box-a", invs[1])[1]["metrics"] == {"sendrecv_busbw_gbs": 1.0}
    assert (f"the baseline and history of inventory {invs[0].path} left out (a file keeps the "
            f"{baselines.INVENTORY_LIMIT} inventories written last)") in capsys.readouterr().err


def _old_run(name: str, inventory) -> str:
    """A run folder with the record an older rigbook wrote: its inventory's path, no inventory_key."""
    folder = runs.runs_dir() / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"playbook": "verify.yml", "inventory": str(inventory),
                                                 "started": "2026-01-01 00:00:00", "exit_code": 0, "hosts": {}}))
    return str(folder)


def test_a_file_written_before_baselines_were_kept_per_inventory_judges_only_its_own_inventory(inv, fork):
    """An older rigbook's file: its baseline and history at the top level, of no inventory said. Each belongs to the
    inventory its run's record names: the baseline judges that inventory's runs (until it has one of its own) and
    no other's, the history is split by run, a group's the same; the old part of the file is never rewritten."""
    recorded_run = _old_run("20260101-000000-verify-aaaaaa", inv.path)
    fork_run = _old_run("20260102-000000-verify-bbbbbb", fork.path)
    inv_run = _old_run("20260103-000000-verify-cccccc", inv.path)
    old = {"host": "box-a", "recorded": {"at": "2026-01-01 00:00:00", "metrics": SEED_004, "run_dir": recorded_run},
           "history": [{"metrics": SEED_004, "recorded": True, "run_dir": recorded_run},
                       {"metrics": {"sendrecv_busbw_gbs": 1.0}, "run_dir": fork_run},
                       {"metrics": {"sendrecv_busbw_gbs": 9.7}, "run_dir": inv_run},
                       {"metrics": {"sendrecv_busbw_gbs": 2.0}}]}  # no run named: no inventory's
    path = baselines._file("box-a")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    (path.parent / "groups").mkdir()
    baselines._group_file("x99_r9700").write_text(json.dumps(
        {"group": "x99_r9700", "recorded": {**old["recorded"], "from_host": "box-a"}}))

    label, recorded = baselines.resolve("box-a", inv)
    assert label == "host box-a" and recorded["metrics"] == SEED_004 and recorded["legacy"] is True
    assert baselines.resolve("box-b", inv)[0] == "group x99_r9700"
    assert baselines.resolve("box-a", fork) == ("none", None) and baselines.resolve("box-b", fork) == ("none", None)
    assert [e["run_dir"] for e in baselines.load("box-a", inv)["history"]] == [recorded_run, inv_run]
    assert [e["run_dir"] for e in baselines.load("box-a", fork)["history"]] == [fork_run]
    out = io.StringIO()
    assert baselines.show(["box-a"], out) == 0
    assert (f"box-a: the baseline of inventory {inv.path} (recorded before baselines were kept per inventory, by a "
            "run of it: it judges that inventory's runs while it has no baseline of its own)\n") in out.getvalue()

    baselines.record("box-a", ladder({"sendrecv_busbw_gbs": 5.0}), "/runs/new", inv)  # a baseline of its own wins
    assert baselines.resolve("box-a", inv)[1]["metrics"] == {"sendrecv_busbw_gbs": 5.0}
    assert [e["run_dir"] for e in baselines.load("box-a", inv)["history"]] == [recorded_run, inv_run, "/runs/new"]
    data = json.loads(path.read_text())
    assert data["recorded"] == old["recorded"] and data["history"] == old["history"]


@pytest.mark.parametrize("run_dir", [
    None, "/elsewhere/20250101-000000-verify-dddddd", "..", "/runs/..", "", "a\0b", "x" * 4096, "bad-record",
    "bad-key", "relative-inventory",
], ids=repr)
def test_an_old_baseline_whose_run_is_gone_or_unusable_is_inventory_unknown_and_judges_no_run(inv, run_dir):
    """Its run's record gone, unreadable, or naming no inventory (or a run_dir that could lead out of the runs
    folder): `baseline show` says "inventory unknown", no run is judged by it, nothing raises."""
    folder = runs.runs_dir()
    folder.mkdir(parents=True, exist_ok=True)
    records = {"bad-record": "[1, 2]", "bad-key": json.dumps({"inventory": str(inv.path), "inventory_key": "{{x}}"}),
               "relative-inventory": json.dumps({"inventory": "hosts.yml"})}
    if run_dir in records:
        (folder / run_dir).mkdir()
        (folder / run_dir / "run.json").write_text(records[run_dir])
    old = {"host": "box-a", "recorded": {"at": "2026-01-01 00:00:00", "metrics": SEED_004, "run_dir": run_dir},
           "history": [{"metrics": SEED_004, "run_dir": run_dir}]}
    baselines._file("box-a").parent.mkdir(parents=True, exist_ok=True)
    baselines._file("box-a").write_text(json.dumps(old))
    assert baselines.resolve("box-a", inv) == ("none", None)
    assert baselines.load("box-a", inv)["history"] == []
    out = io.StringIO()
    assert baselines.show(["box-a"], out) == 0
    assert ("box-a: the baseline of inventory unknown (recorded before baselines were kept per inventory, and the run "
            "that recorded it is gone): it judges no run; record again with `provision baseline record -i INV`\n"
            ) in out.getvalue()


def _runner_with_figures(figures: dict):
    """ansible_runner.run as a verify run on box-a reports it: one ladder task whose layer measured FIGURES."""
    def run(**kwargs):
        for event in ({"event": "playbook_on_play_start", "event_data": {"play": "verify", "hosts": ["box-a"]}},
                      {"event": "runner_on_ok", "event_data": {"host": "box-a", "task": "ladder",
                                                               "res": {"ladder": ladder(figures)}}},
                      {"event": "playbook_on_stats", "event_data": {"ok": {"box-a": 1}}}):
            kwargs["event_handler"](event)
        return SimpleNamespace(status="successful", rc=0, stdout=None)
    return run


def test_a_verify_of_one_inventory_is_never_judged_by_the_baseline_recorded_with_another(tmp_path, monkeypatch,
                                                                                          capsys):
    """The real run's defect 11 through run.py (ansible_runner stood in): `baseline record -i inv`, then `verify -i
    inv_fork` (a copy naming the same host) is judged by none, `verify -i inv` by inv's baseline; each run.json
    records its inventory's key, and the run summary says which inventory the baseline was recorded with."""
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    paths = {}
    for name in ("inv", "inv_fork"):
        paths[name] = tmp_path / name / "hosts.yml"
        paths[name].parent.mkdir()
        paths[name].write_text("all:\n  hosts:\n    box-a: {ansible_host: 192.0.2.1}\n")
    monkeypatch.setattr(ansible_runner, "run", _runner_with_figures(SEED_004))
    assert main(["baseline", "record", "-i", str(paths["inv"])]) == 0
    capsys.readouterr()
    summaries = {}
    for name in ("inv_fork", "inv"):
        assert main(["verify", "-i", str(paths[name]), "--json"]) == 0
        out, err = capsys.readouterr()
        summaries[name] = json.loads(out)
        record = json.loads((Path(summaries[name]["run_dir"]) / "run.json").read_text())
        assert record["inventory_key"] == inventory_key(paths[name]) and runs.inventory_key_of(record)
    assert summaries["inv_fork"]["hosts"]["box-a"]["baseline_source"] == "none"
    assert "baseline_inventory" not in summaries["inv_fork"]["hosts"]["box-a"]
    assert summaries["inv"]["hosts"]["box-a"]["baseline_source"] == "host box-a"
    assert summaries["inv"]["hosts"]["box-a"]["baseline_inventory"] == str(paths["inv"])
    assert summaries["inv"]["hosts"]["box-a"]["ladder"][0]["baseline"] == f"host box-a of inventory {paths['inv']}"
    assert f"baselines: box-a judged by host box-a of inventory {paths['inv']}" in err
    assert inventory_key(paths["inv"]) != inventory_key(paths["inv_fork"])


# --- figures are data, never code (issue 34) ----------------------------------------------------------------------

TEMPLATE = "{{ lookup('pipe', 'touch %s') }}"
P2P_DEFAULTS = REPO / "roles" / "p2p_verify" / "defaults" / "main.yml"


def _templated_by_ansible(tmp_path, var_files: list) -> subprocess.CompletedProcess:
    """REAL ansible-playbook (this venv's) on 127.0.0.1 over a local connection, given VAR_FILES as `-e @FILE` the way
    provision hands a run its baselines: it templates the whole of rigbook_baselines and the p2p_verify role's own
    expression that reads it (p2p_verify_baseline, from the role's defaults), and `control` when given."""
    role_default = yaml.safe_load(P2P_DEFAULTS.read_text())["p2p_verify_baseline"]
    play = [{"hosts": "all", "gather_facts": False, "vars": {"p2p_verify_baseline": role_default},
             "tasks": [{"name": "all of it", "ansible.builtin.debug": {"msg": "{{ rigbook_baselines }}"}},
                       {"name": "the role's view", "ansible.builtin.debug": {"msg": "{{ p2p_verify_baseline }}"}},
                       {"name": "control", "ansible.builtin.debug": {"msg": "{{ control | default('') }}"}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    home = tmp_path / "ansible-home"
    env = {**os.environ, "ANSIBLE_HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "127.0.0.1,", "-c", "local"]
    for path in var_files:
        argv += ["-e", f"@{path}"]
    return subprocess.run(argv + [str(tmp_path / "play.yml")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def test_a_string_figure_from_a_box_or_a_file_never_reaches_ansible_as_a_template(inv, tmp_path, capsys):
    """The attack: a ladder result (module output) whose figure is a Jinja2 expression, and a baselines file (edited,
    or written by an older rigbook) holding one as a figure and as its time. Recorded, read back and handed to a
    run through the path run.py takes (extra_vars, written as baselines.json, `-e @baselines.json`), real Ansible
    templates it all: the command never runs. The control file shows the same Ansible does run one given to it."""
    marker, control = tmp_path / "MARKER", tmp_path / "CONTROL"
    evil = TEMPLATE % marker
    recorded = baselines.record("127.0.0.1", ladder({"peer_gbs": 9.5, "evil_gbs": evil}), "/runs/x", inv)
    assert recorded["metrics"] == {"peer_gbs": 9.5}
    assert "evil_gbs" not in baselines._file("127.0.0.1").read_text()
    assert "figure 'evil_gbs' left out (not a finite number but str)" in capsys.readouterr().err
    hand_edited = {"host": "127.0.0.2", "inventories": {inventory_key(inv.path): {
        "inventory": str(inv.path), "history": [],
        "recorded": {"at": evil, "metrics": {"peer_gbs": evil, "bus_gbs": 3.5, evil: 1.0}}}}}
    baselines._file("127.0.0.2").write_text(json.dumps(hand_edited))
    given = baselines.extra_vars(["127.0.0.1", "127.0.0.2"], inv)
    assert given["rigbook_baselines"] == {
        "127.0.0.1": {"metrics": {"peer_gbs": 9.5}, "at": recorded["at"], "source": "host 127.0.0.1"},
        "127.0.0.2": {"metrics": {"bus_gbs": 3.5}, "at": None, "source": "host 127.0.0.2"}}
    err = capsys.readouterr().err
    assert f"baselines file {baselines._file('127.0.0.2')}: figure 'peer_gbs' left out" in err
    assert "figure \"{{ lookup('pipe', " in err and "left out (its name is not 1-64 of a-z 0-9 _ -)" in err
    run_file = tmp_path / "run" / "baselines.json"
    statefile.write_json_atomic(run_file, given)  # as run.py writes it for `-e @`
    control_file = tmp_path / "control.json"
    control_file.write_text(json.dumps({"control": TEMPLATE % control}))
    proc = _templated_by_ansible(tmp_path, [run_file, control_file])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert control.exists(), "the control: this Ansible templates a string of an -e file"
    assert not marker.exists()
    assert '"msg": {\n        "peer_gbs": 9.5\n    }' in proc.stdout  # the role's view of 127.0.0.1's figures


def test_the_same_attack_as_a_file_older_rigbook_wrote_is_what_ansible_would_run(tmp_path):
    """Without the guard: the hand-edited file's figure handed to Ansible as it was read makes the MARKER, so the
    test above would catch a guard that let it through."""
    marker = tmp_path / "MARKER"
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"rigbook_baselines": {"127.0.0.1": {"metrics": {"peer_gbs": TEMPLATE % marker}}}}))
    proc = _templated_by_ansible(tmp_path, [raw])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert marker.exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), True, False, "9.5", None, [1.0],
                                   {"x": 1.0}, 10 ** 400], ids=lambda value: repr(value)[:12])
def test_only_a_finite_number_is_a_figure(inv, capsys, value):
    recorded = baselines.record("box-a", ladder({"peer_gbs": 9.5, "odd_gbs": value}), "/runs/x", inv)
    assert recorded["metrics"] == {"peer_gbs": 9.5}
    assert baselines.load("box-a", inv)["history"][-1]["metrics"] == {"peer_gbs": 9.5}
    assert ("odd_gbs" in capsys.readouterr().err) == (value is not None)  # None: not measured, said nowhere


@pytest.mark.parametrize("name", ["Peer", "a b", "x" * 65, "", "a{{b", "a.b", "m\x1b[2K"], ids=repr)
def test_a_figure_s_name_is_1_to_64_of_a_z_0_9_underscore_dash(inv, capsys, name):
    recorded = baselines.record("box-a", ladder({"serve_qwen-2_ttft_s": 0.25, name: 1.0}), "/runs/x", inv)
    assert recorded["metrics"] == {"serve_qwen-2_ttft_s": 0.25}
    err = capsys.readouterr().err
    assert "left out (its name is not 1-64" in err and "\x1b" not in err


def test_a_host_or_group_name_that_is_not_plain_is_never_handed_to_ansible(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  children:\n    '{{g}}':\n      hosts:\n        twin: {}\n        first: {}\n")
    inv = load(path)
    recorded = baselines.record("first", ladder(SEED_004), "/runs/x", inv)
    baselines.record_groups(inv, {"first": recorded}, "*")
    baselines.record("{{h}}", ladder(SEED_004), "/runs/x", inv)
    given = baselines.extra_vars(["first", "twin", "{{h}}"], inv)["rigbook_baselines"]
    assert list(given) == ["first"]
    err = capsys.readouterr().err
    assert "'twin': its baseline (group {{g}}) is not handed to the run" in err
    assert "'{{h}}': its baseline (host {{h}}) is not handed to the run" in err


def test_show_and_the_judged_line_print_no_escape_sequence(inv, capsys):
    """Text a box gave (a version) or a file holds (the time): ESC[2K ESC[1A would erase the line above, OSC 52
    write the clipboard; shown as visible escapes instead."""
    data = {"host": "box-a", "recorded": {"at": "2024-01-01\x1b[1A\x1b[2K", "metrics": {"peer_gbs": 1.5},
                                          "versions": {"kernel": "6.8\x1b]52;c;ZXZpbA==\x07\u202e"}}, "history": []}
    baselines._file("box-a").parent.mkdir(parents=True)
    baselines._file("box-a").write_text(json.dumps(data))
    out = io.StringIO()
    assert baselines.show(["box-a"], out) == 0
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue() and "\u202e" not in out.getvalue()
    assert "2024-01-01\\x1b[1A\\x1b[2K" in out.getvalue() and "6.8\\x1b]52;c;ZXZpbA==\\x07\\u202e" in out.getvalue()
    out = io.StringIO()
    baselines.print_judged({"box-a": "host box-a\x1b[2K"}, out, "/inv\x07")
    assert out.getvalue() == "baselines: box-a judged by host box-a\\x1b[2K of inventory /inv\\x07\n"
