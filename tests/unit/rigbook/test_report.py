"""`provision report`: one self-contained HTML page of a lab run history, checked from its DOM.

The history (helpers.report.lab_report_history): `provision baseline record -i lab` then four verify runs written
through rigbook's own writers, every ladder the real climb over the lab's recorded hardware trees, the fourth with the
`busbw-half` fault on the R9700 twin. The manifests are the real H200 capture's (tests/fixtures/evidence/
h200-vm.manifest.json), one item changed for the second host. The same page in headless Chromium:
tests/integration/test_report_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from helpers.cli import provision
from helpers.report import html_elements, lab_report_history

from rigbook import baselines, report, runs
from rigbook.baselines import metrics_of
from rigbook.inventory import load
from rigbook.paths import inventory_key
from rigbook.run import resolve_inventory

HOSTS = ("lab-3080", "lab-r9700")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The history, written once (about 10 s of real climbs) into a state directory each test copies."""
    base = tmp_path_factory.mktemp("history")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RIGBOOK_STATE_DIR", str(base / "state"))
        return base / "state", lab_report_history(base / "trees")


@pytest.fixture
def history(built, tmp_path, monkeypatch):
    state, info = built
    shutil.copytree(state, tmp_path / "state", symlinks=True)
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    return info


def _lab():
    """The lab inventory the history was written for (the page's -i lab)."""
    return load(resolve_inventory("lab"))


def _section(data: dict) -> dict:
    """The one inventory section of a baselines file the history wrote (the lab inventory's)."""
    (section,) = data["inventories"].values()
    return section


def _manifest_run(name: str, inventory=None) -> Path:
    """The manifests folder of a run NAME as `provision manifest -i lab` leaves it: its run record names the
    inventory (INVENTORY, default the lab's), the report's manifests are that inventory's runs' only."""
    folder = runs.runs_dir() / name
    (folder / "manifests").mkdir(parents=True)
    inventory = inventory or resolve_inventory("lab")
    runs.save_record(folder, {"playbook": "manifest.yml", "inventory": str(inventory),
                              "inventory_key": inventory_key(inventory), "exit_code": 0})
    return folder / "manifests"


def _page(tmp_path):
    path, data = report.write_report("lab", str(tmp_path / "report.html"))
    text = path.read_text()
    elements, problems = html_elements(text)
    return text, elements, problems, data


def _find(elements, tag=None, **attrs):
    return [e for e in elements if (tag is None or e["tag"] == tag)
            and all(e.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items())]


def test_every_host_layer_and_point_is_on_the_page(history, tmp_path):
    text, elements, problems, _ = _page(tmp_path)
    assert problems == []
    for host in HOSTS:
        assert _find(elements, "section", class_="host", data_host=host)
        latest = history["hosts"][host][history["runs"][-1]]
        layers = [e["data-layer"] for e in _find(elements, "tr", data_host=host) if "data-layer" in e]
        assert layers == [v["layer"] for v in latest] and len(layers) == 10
        for run in history["runs"]:
            for metric, value in metrics_of(history["hosts"][host][run]).items():
                points = _find(elements, "circle", data_host=host, data_metric=metric, data_run=run)
                assert len(points) == 1, (host, metric, run)
                assert float(points[0]["data-value"]) == value
        # every run's artifact folder is linked (a file:// URL), and the snapshot command is given
        for run in history["runs"]:
            assert any(e.get("href", "").startswith("file:///") and e["href"].endswith(run)
                       for e in _find(elements, "a"))
        assert f"provision snapshot -i lab --limit {host}" in text
    points = _find(elements, "circle")
    assert len(points) == sum(len(metrics_of(ladder)) for runs in history["hosts"].values()
                              for ladder in runs.values())  # 5 runs x (4 + 9) figures = 65
    assert len(points) == 65


def test_each_ladder_row_shows_its_failure_code_escaped(history, tmp_path):
    """A verdict that is not a pass shows its code (docs/codes.md) under its status and as the row's data-code; a
    pass none. The latest lab ladders hold skips and unknowns, each with its code."""
    text, elements, problems, _ = _page(tmp_path)
    assert problems == []
    coded = 0
    for host in HOSTS:
        latest = history["hosts"][host][history["runs"][-1]]
        rows = [e for e in _find(elements, "tr", data_host=host) if "data-layer" in e]
        for row, verdict in zip(rows, latest):
            if verdict["status"] == "pass":
                assert "data-code" not in row, row
            else:
                assert row["data-code"] == verdict["code"] and f'<code class="rb-code">{verdict["code"]}</code>' in text
                coded += 1
    assert coded
    odd = report.ladder_table(report.HostData(name="rig-a"), [
        {"layer": "serving", "status": "fail", "code": 'RB-<b>"x"</b>&', "why": "w"},
        {"layer": "firmware", "status": "pass", "code": "RB-NEVER-SHOWN", "why": "ok"}])
    assert 'data-code="RB-&lt;b&gt;&quot;x&quot;&lt;/b&gt;&amp;"' in odd
    assert '<code class="rb-code">RB-&lt;b&gt;&quot;x&quot;&lt;/b&gt;&amp;</code>' in odd
    assert "<b>\"x\"</b>" not in odd and "RB-NEVER-SHOWN" not in odd


def test_the_faulted_run_is_drawn_in_the_fail_band(history, tmp_path):
    _, elements, _, _ = _page(tmp_path)
    faulted = history["faulted"]
    for metric, recorded in (("sendrecv_busbw_gbs", 9.75), ("all_reduce_busbw_gbs", 9.51)):
        (band,) = _find(elements, "rect", data_band="fail", data_host="lab-r9700", data_metric=metric)
        assert float(band["data-to"]) == pytest.approx(0.8 * recorded, abs=1e-3)
        for point in _find(elements, "circle", data_host="lab-r9700", data_metric=metric):
            top, bottom = float(band["y"]), float(band["y"]) + float(band["height"])
            inside = top < float(point["cy"]) <= bottom  # SVG y grows downward: below the fail line
            if point["data-run"] == faulted:
                assert point["data-status"] == "fail" and inside
                assert float(point["data-value"]) == pytest.approx(recorded / 2, abs=0.01)
            else:
                assert point["data-status"] == "pass" and not inside
    # the faulted run's ladder failed at collectives, as `lab break lab-r9700 busbw-half` must
    statuses = {v["layer"]: v["status"] for v in history["hosts"]["lab-r9700"][faulted]}
    assert statuses["collectives"] == "fail"


def test_no_external_url_no_script(history, tmp_path):
    text, elements, _, _ = _page(tmp_path)
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text.lower() and "@import" not in text and "url(" not in text
    for element in elements:
        for key in ("src", "href", "xlink:href", "action"):
            value = element.get(key)
            if value is not None:
                assert value.startswith(("file:///", "#")), (element["tag"], key, value)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?//""", text)


def test_group_side_by_side_with_manifest_differences(history, tmp_path):
    """Manifests as `provision manifest -i lab` stores them: the real collector on the two lab hosts' recorded
    trees (the 3080 twin's and the R9700 twin's), so what differs is a real difference of the two builds."""
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import manifest as collector

    from rigbook import manifests
    from rigbook.lab.hardware_trees import materialize

    folder = _manifest_run("20260306-100000-manifest-abcdef")
    collected = {}
    for host, rig in (("lab-3080", "x99-3080"), ("lab-r9700", "x99-r9700")):
        root = materialize(rig, tmp_path / "manifest" / host)
        collected[host] = collector.collect_manifest(str(root), str(root))
        (folder / f"{host}.json").write_text(json.dumps(collected[host]))
    want = manifests.diff(collected["lab-3080"], collected["lab-r9700"])
    pinned = sorted(row["item"] for rows in want["pinned"].values() for row in rows)
    assert pinned  # a 3080 box and an R9700 box differ in pinned items (GPUs, driver, ...)
    text, elements, problems, data = _page(tmp_path)
    assert problems == []
    assert [title for title, _ in data.groups] == ["group lab"]
    (section,) = _find(elements, "section", class_="group")
    assert section["data-group"] == "group lab"
    rows = [e for e in elements if e["tag"] == "tr" and "data-item" in e]
    assert sorted(e["data-item"] for e in rows if "differs" in e.get("class", "")) == pinned
    assert sorted(e["data-item"] for e in rows if "differs" not in e.get("class", "")) == \
        sorted(row["item"] for row in want["unique"])
    assert f"{len(pinned)} pinned item(s) differ" in text


def test_a_run_and_a_baseline_of_another_inventory_naming_the_same_host_stay_that_inventory_s(history, tmp_path):
    """The real run's defect 11: `provision report -i inv` showed as a host's latest run one made with `inv_fork` (a
    copy of inv naming the same host). A newer run and a baseline recorded with a copy of the lab inventory: the
    lab's page shows neither, and says its baseline is the lab inventory's; the copy's page shows them."""
    lab = resolve_inventory("lab")
    fork_path = tmp_path / "inv_fork"
    shutil.copytree(lab, fork_path)
    ladder = json.loads(json.dumps(history["hosts"]["lab-r9700"][history["runs"][-1]]))
    run_dir = runs.runs_dir() / "20990101-000000-verify-f0f0f0"  # newer than every run of the lab
    run_dir.mkdir()
    baselines.record("lab-r9700", ladder, str(run_dir), load(fork_path))
    runs.save_record(run_dir, {"playbook": "verify.yml", "inventory": str(fork_path),
                               "inventory_key": inventory_key(fork_path), "started": "2099-01-01 00:00:00",
                               "exit_code": 0, "hosts": {"lab-r9700": {"state": "ok", "ladder": ladder,
                                                                       "baseline_source": "none"}}})
    manifest = {"schema": 1, "items": {"kernel.release": {"value": "6.8-fork"}}}
    (_manifest_run("20990101-000001-manifest-f1f1f1", fork_path) / "lab-r9700.json").write_text(json.dumps(manifest))
    text, elements, _, data = _page(tmp_path)
    host = next(h for h in data.hosts if h.name == "lab-r9700")
    assert Path(host.runs[0]["dir"]).name == history["runs"][-1]
    assert run_dir.name not in [Path(r["dir"]).name for r in host.runs]
    assert not _find(elements, "tr", class_="run", data_run=run_dir.name)
    assert str(run_dir) not in [entry.get("run_dir") for entry in host.history]
    assert host.baseline_label == "host lab-r9700" and host.baseline["run_dir"] != str(run_dir)
    assert f"judged by baseline: <b>host lab-r9700 of inventory {lab}</b>" in text
    assert f"baseline that judges it now: <b>host lab-r9700 of inventory {lab}</b>" in text
    assert host.manifest is None and data.manifest_run is None and "6.8-fork" not in text

    path, fork = report.write_report(str(fork_path), str(tmp_path / "fork.html"))
    host = next(h for h in fork.hosts if h.name == "lab-r9700")
    assert [Path(r["dir"]).name for r in host.runs] == [run_dir.name]
    assert host.baseline["run_dir"] == str(run_dir) and [e["run_dir"] for e in host.history] == [str(run_dir)]
    assert f"baseline that judges it now: <b>host lab-r9700 of inventory {fork_path}</b>" in path.read_text()
    assert host.manifest == manifest and fork.manifest_run.endswith("20990101-000001-manifest-f1f1f1")


def test_a_kernel_change_is_marked_on_the_time_axis(history, tmp_path):
    ladder = json.loads(json.dumps(history["hosts"]["lab-r9700"][history["runs"][-1]]))
    for verdict in ladder:
        if verdict["layer"] == "kernel_state":
            verdict["measured"]["release"] = "6.1.0-50-amd64"  # the next kernel, as a kernel upgrade run reads it
    baselines.append_history("lab-r9700", ladder, {v["layer"]: v["status"] for v in ladder}, "upgrade-run", _lab())
    _, elements, _, _ = _page(tmp_path)
    changes = _find(elements, "line", class_="change", data_host="lab-r9700", data_metric="peer_gbs_0_1")
    assert [c["data-change"] for c in changes] == ["kernel 6.1.0-47-amd64 → 6.1.0-50-amd64"]
    assert not _find(elements, "line", class_="change", data_host="lab-3080")


def test_a_state_without_runs_still_gives_a_page(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "empty"))
    text, elements, problems, _ = _page(tmp_path)
    assert problems == [] and "no saved run with a ladder for lab-3080" in text
    assert not _find(elements, "circle")


def test_provision_report_command(history, tmp_path):
    env = {"RIGBOOK_STATE_DIR": str(tmp_path / "state")}
    proc = provision("report", "-i", "lab", "--from-runs", env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = proc.stdout.strip().rsplit(": ", 1)[1]
    assert path.startswith(str(tmp_path / "state" / "reports" / "lab-")) and path.endswith("Z.html")
    assert "65 charted point(s)" in proc.stdout
    out = tmp_path / "mine.html"
    proc = provision("report", "-i", "lab", "-o", out, env=env, timeout=120)
    assert proc.returncode == 0 and out.is_file(), proc.stderr
    proc = provision("report", "-i", "no-such-inventory", env=env, timeout=120)
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_bad_run_records_baselines_and_manifests_are_named_and_left_out(history, tmp_path):
    """A run record, baselines file or manifest of the wrong shape (a string or list where an object belongs, not
    JSON, not UTF-8) is named with its problem on stderr and on the page, and left out: the page is still made,
    with no traceback."""
    state = tmp_path / "state"
    runs_dir = state / "runs"
    bad_runs = {"20990101-000000-verify-aaaaaa": b'"a string"', "20990101-000000-verify-bbbbbb": b'{"hosts": [1]}',
                "20990101-000000-verify-cccccc": b'{"hosts": {"lab-3080": {"ladder": "fine"}}}',
                "20990101-000000-verify-dddddd": b"\xff\xfe{}", "20990101-000000-verify-eeeeee": b"{not json"}
    for name, raw in bad_runs.items():
        (runs_dir / name).mkdir(parents=True)
        (runs_dir / name / "run.json").write_bytes(raw)
    host_file = state / "baselines" / "lab-r9700.json"
    data = json.loads(host_file.read_text())
    _section(data)["history"][0]["metrics"] = ["peer_gbs_0_1"]
    host_file.write_text(json.dumps(data))
    manifest_file = _manifest_run("20990102-000000-manifest-ffffff") / "lab-3080.json"
    manifest_file.write_text(json.dumps({"host": "lab-3080", "items": {"kernel.release": "6.8"}}))
    out = tmp_path / "page.html"
    proc = provision("report", "-i", "lab", "-o", out, env={"RIGBOOK_STATE_DIR": str(state)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and out.is_file()
    runs = runs_dir
    said = [f"run record {runs}/20990101-000000-verify-aaaaaa/run.json is unusable: not a JSON object but str",
            f"run record {runs}/20990101-000000-verify-bbbbbb/run.json is unusable: hosts is not an object but list",
            f"{runs}/20990101-000000-verify-cccccc/run.json is unusable: hosts.lab-3080.ladder is not a list of "
            "objects", f"{runs}/20990101-000000-verify-dddddd/run.json is unusable: not UTF-8 text",
            f"{runs}/20990101-000000-verify-eeeeee/run.json is unusable: not valid JSON",
            f"baselines file {host_file} is corrupt (inventory section {next(iter(data['inventories']))!r}: history "
            "entry 1: metrics is not an object but list)",
            f"manifest of lab-3080: {manifest_file}: not a manifest (item 'kernel.release' is not an object but str"]
    page = out.read_text()
    for words in said:
        assert words in proc.stderr, words
        assert report._e(words) in page, words
    assert proc.stderr.count("warning: ") == len(said)
    assert "65 charted point(s)" not in proc.stdout  # lab-r9700's history is left out with its file
    # The report only reads: the corrupt baselines file is where it was, as it was, and nothing was kept aside.
    assert json.loads(host_file.read_text()) == data
    assert not [p.name for p in host_file.parent.iterdir() if ".corrupt-" in p.name]


def test_report_to_a_folder_or_a_missing_one_exits_2_and_leaves_nothing(tmp_path):
    env = {"RIGBOOK_STATE_DIR": str(tmp_path / "state")}
    out = tmp_path / "out"
    out.mkdir()
    (out / "a-file").write_text("")
    for target, words in ((out, f"report -o {out}: is a directory; give the HTML file to write"),
                          (out / "nowhere" / "r.html", f"report -o {out / 'nowhere' / 'r.html'}: {out / 'nowhere'} "
                                                       "does not exist"),
                          (out / "a-file" / "r.html", f"{out / 'a-file'} is not a folder")):
        proc = provision("report", "-i", "lab", "-o", target, env=env, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith("error: report -o ") and words in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a-file"]
    assert [p.name for p in tmp_path.iterdir() if p.name != "state"] == ["out"]  # none beside the folder either


@pytest.mark.parametrize("failing", ["tempfile.mkstemp", "os.replace"])
def test_a_failed_write_is_one_clear_error_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys, failing):
    """An unwritable folder (as root, simulated: mkstemp refused) or a failed rename: exit 2 naming the path, no
    temporary file left; the page's temporary file is mkstemp's (no predictable name)."""
    import os
    import tempfile

    from rigbook.cli import main

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "out"
    out.mkdir()
    made = []
    real_mkstemp, real_replace = tempfile.mkstemp, os.replace

    def mkstemp(*args, **kwargs):
        if failing == "tempfile.mkstemp" and Path(kwargs["dir"]) == out:
            raise PermissionError(13, "Permission denied")
        made.append(real_mkstemp(*args, **kwargs))
        return made[-1]

    def replace(src, dst):
        if Path(dst) == out / "r.html":
            raise PermissionError(13, "Permission denied")
        return real_replace(src, dst)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    if failing == "os.replace":
        monkeypatch.setattr(os, "replace", replace)
    assert main(["report", "-i", "lab", "-o", str(out / "r.html")]) == 2
    assert capsys.readouterr().err == f"error: report: cannot write {out / 'r.html'}: Permission denied\n"
    assert list(out.iterdir()) == []
    assert len(made) == (1 if failing == "os.replace" else 0)
    assert all(Path(name).parent == out and not Path(name).exists() for _, name in made)


def test_a_report_file_that_is_a_symbolic_link_is_refused_not_written_through(tmp_path, monkeypatch, capsys):
    from rigbook.cli import main

    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "r.html").symlink_to(victim)
    assert main(["report", "-i", "lab", "-o", str(tmp_path / "r.html")]) == 2
    assert f"error: report: cannot write {tmp_path / 'r.html'}: " in capsys.readouterr().err
    assert victim.read_text() == "keep" and (tmp_path / "r.html").is_symlink()


def test_report_files_written_by_default_are_the_users_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    path, _ = report.write_report("lab")
    assert path.parent == tmp_path / "state" / "reports"
    assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0


def test_the_fleet_table_holds_every_box_s_layers_and_the_last_roll_is_shown(history, tmp_path):
    from rigbook import run

    run.save_roll({"inventory": str(run.resolve_inventory("lab")), "playbook": "site.yml", "spec": "1",
                   "check": False, "exit_code": 1, "batches": [{"batch": 1, "hosts": ["lab-3080"], "exit_code": 0},
                                                              {"batch": 2, "hosts": ["lab-r9700"], "exit_code": 1}],
                   "stopped_at_batch": 2, "untouched": [], "why": "exit 1: lab-r9700 at 'Ladder 6-9: collectives'"})
    run.save_roll({"inventory": "/another/inventory", "spec": "9", "batches": []})  # not this inventory's
    text, elements, problems, data = _page(tmp_path)
    assert problems == []
    for host in data.hosts:  # one row per box, one cell per layer with its newest run's status, in ladder order
        record, entry = report._latest(host)
        assert host.group in ("x99_3080", "x99_r9700")
        (row,) = re.findall(rf'<tr data-host="{host.name}" data-group="{host.group}">(.*?)</tr>', text)
        cells = re.findall(r'<td data-layer="([a-z_0-9]+)" data-status="([a-z]*)">', row)
        assert [layer for layer, _ in cells] == report.fleet_layers()
        assert {layer: status for layer, status in cells if status} == {v["layer"]: v["status"]
                                                                        for v in entry["ladder"]}
    (roll,) = _find(elements, "section", class_="roll")
    assert roll["data-stopped"] == "2"
    assert "stopped at batch 2: exit 1: lab-r9700 at &#x27;Ladder 6-9: collectives&#x27;" in text
    assert [e["data-batch"] for e in _find(elements, "tr") if e.get("data-batch")] == ["1", "2"]
    assert "--rolling 9" not in text


# --- box data is data (issue 34) -----------------------------------------------------------------------------------

def test_a_string_or_nan_figure_in_a_baselines_file_is_left_out_with_a_warning_not_a_traceback(history, tmp_path):
    """A baselines file edited by hand, or written before figures were checked: a Jinja2 expression as the recorded
    baseline's figure and as history figures, and NaN (`provision report` ended in a TypeError on the string). Each
    is named on stderr and left out of the charts; the page is made; the file is not touched."""
    state = tmp_path / "state"
    host_file = state / "baselines" / "lab-r9700.json"
    data = json.loads(host_file.read_text())
    section = _section(data)
    metric = sorted(section["recorded"]["metrics"])[0]
    section["recorded"]["metrics"][metric] = "{{ lookup('pipe', 'id') }}"
    section["history"][0]["metrics"][metric] = "quick-as-ever"
    section["history"][1]["metrics"][metric] = float("nan")
    host_file.write_text(json.dumps(data))
    before = host_file.read_bytes()
    out = tmp_path / "page.html"
    proc = provision("report", "-i", "lab", "-o", out, env={"RIGBOOK_STATE_DIR": str(state)}, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"warning: baselines file {host_file}: figure '{metric}' left out (not a finite number but str)"
            in proc.stderr)
    assert "65 charted point(s)" not in proc.stdout and "charted point(s)" in proc.stdout
    page = out.read_text()
    assert "lookup(" not in page and "quick-as-ever" not in page
    assert host_file.read_bytes() == before


def test_report_notes_print_no_escape_sequence(history, tmp_path):
    """A run record whose host name holds ESC[1A ESC[2K (erase the warning line above) and OSC 52: the warning that
    names it is printed with visible escapes."""
    state = tmp_path / "state"
    bad = state / "runs" / "20990101-000000-verify-aaaaaa" / "run.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"hosts": {"lab\x1b[1A\x1b[2K\x1b]52;c;ZXZpbA==\x07": "x"}}))
    proc = provision("report", "-i", "lab", "-o", tmp_path / "page.html", env={"RIGBOOK_STATE_DIR": str(state)},
                     timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stderr
    assert "hosts.lab\\x1b[1A\\x1b[2K\\x1b]52;c;ZXZpbA==\\x07 is not an object but str" in proc.stderr


def test_report_o_writes_a_new_page_0600_and_leaves_an_existing_file_s_mode(tmp_path, monkeypatch):
    """The page names the hosts, their versions and run folders: a new one is the user's alone whatever the umask
    (it was 0644); a file the user made keeps the mode they gave it."""
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    old = os.umask(0o022)
    try:
        path, _ = report.write_report("lab", str(tmp_path / "new.html"))
        assert path.stat().st_mode & 0o777 == 0o600
        mine = tmp_path / "mine.html"
        mine.write_text("")
        mine.chmod(0o640)
        report.write_report("lab", str(mine))
        assert mine.stat().st_mode & 0o777 == 0o640 and mine.read_text().startswith("<!DOCTYPE html>")
    finally:
        os.umask(old)


def test_the_page_labels_manifest_items_itself_not_as_a_box_says(history, tmp_path):
    """The R9700 box's manifest calls every item it differs in host-unique: the page still highlights each pinned
    difference (manifests.label_of decides, as `provision diff` does)."""
    from ansible_collections.rigbook.homelab.plugins.module_utils.collect import manifest as collector

    from rigbook import manifests
    from rigbook.lab.hardware_trees import materialize

    folder = _manifest_run("20260306-100000-manifest-abcdef")
    collected = {host: collector.collect_manifest(str(root), str(root)) for host, root in (
        (host, materialize(rig, tmp_path / "manifest" / host))
        for host, rig in (("lab-3080", "x99-3080"), ("lab-r9700", "x99-r9700")))}
    want = manifests.diff(collected["lab-3080"], collected["lab-r9700"])
    pinned = sorted(row["item"] for rows in want["pinned"].values() for row in rows)
    assert pinned
    for item in collected["lab-r9700"]["items"].values():
        item.update(unique=True, group="host", bits=True)
    for host, manifest in collected.items():
        (folder / f"{host}.json").write_text(json.dumps(manifest))
    text, elements, problems, _ = _page(tmp_path)
    assert problems == []
    rows = [e for e in elements if e["tag"] == "tr" and "data-item" in e]
    assert sorted(e["data-item"] for e in rows if "differs" in e.get("class", "")) == pinned
    assert f"{len(pinned)} pinned item(s) differ" in text
