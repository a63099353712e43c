"""`provision report -i INV`: one self-contained HTML page per inventory, built from the saved state.

What it reads (nothing else; no host is contacted, so fresh figures mean running `provision verify -i INV` first):
- the baselines files (<state>/baselines/<host>.json: the recorded baseline and the history of every run that
  measured figures; <state>/baselines/groups/<group>.json: group baselines), through rigbook.baselines: this
  inventory's only (baselines.resolve, baselines.history: a section per inventory);
- the run records (<state>/runs/*/run.json: each run's per-host ladder, which baseline judged it, its artifact
  folder), through rigbook.runs: the runs of this inventory only (runs.inventory_key_of), never another
  inventory's run of a host of the same name;
- each host's newest manifest from a manifest run of this inventory (<state>/runs/*/manifests/<host>.json), through
  rigbook.manifests (latest_of_inventory, as `provision diff -i` compares them).

What it writes: one HTML string, inline CSS and inline SVG, no JavaScript, no external URL (links point only at
the run folders on this machine, as file:// URLs). Per host: the latest ladder in full, which baseline judged it,
the run's time, kernel / driver / NCCL versions, its runs' folders and the snapshot command for a bug report; per
metric a line chart of every recorded run against the baseline with the fail and warn bands, version changes
marked on the axis. Per group (and the fleet): the hosts side by side, differing versions and manifest items
highlighted. Chart points and bands carry data-* attributes so a test (or a person with the DOM) can read them.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from rigbook import baselines, manifests, runs, statefile
from rigbook.baselines import versions_of
from rigbook.display import nested_text, terminal_safe
from rigbook.errors import UserError
from rigbook.paths import inventory_key, link_collection, state_dir
from rigbook.run import last_roll, resolve_inventory
from rigbook.validate import host_model_of, validate

VERSION_KEYS = ("kernel", "nvidia_driver", "rocm", "nccl", "sglang")
NO_GROUP = ("all", "ungrouped")
RUN_LINKS = 20


# --- gathering ---------------------------------------------------------------------------------------------------

@dataclass
class HostData:
    name: str
    baseline_label: str = "none"  # which baseline judges the host now: "host NAME", "group NAME", "none"
    baseline: dict | None = None  # {"at", "metrics", "versions", ...}
    history: list = field(default_factory=list)  # the baselines file's history, oldest first
    runs: list = field(default_factory=list)  # run records with a ladder for this host, newest first
    tolerance: dict = field(default_factory=dict)  # the ladder's merge (expectations.tolerance) for this host
    manifest: dict | None = None
    group: str = ""  # the narrowest group that holds it (the fleet table's grouping)


@dataclass
class ReportData:
    inventory: str
    inventory_path: str
    generated: str
    hosts: list  # HostData, in inventory order
    groups: list  # (title, [host names])
    manifest_run: str | None = None
    notes: list = field(default_factory=list)
    last_roll: dict | None = None  # the newest `--rolling` run of this inventory (run.save_roll)


def lower_is_better(metric: str) -> bool:
    """A latency (the serving layer's TTFT): the judges hold baseline / measured to the tolerance instead."""
    return metric.endswith("_ttft_s")


@functools.lru_cache(maxsize=None)
def _ladder_utils():
    """The collection's own comparison code (the judges' thresholds and rules), importable on the controller."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges import (
        baseline_compare,
        expectations,
        serving_layer,
    )

    return expectations, baseline_compare, serving_layer


@functools.lru_cache(maxsize=None)
def _verdict():
    """The collection's verdict module: the one severity order of the statuses (worst layer of a run)."""
    link_collection()
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (above)
    from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict

    return verdict


def _rank(verdict: dict) -> int:
    """How bad VERDICT's status is (judges/verdict.SEVERITY; a missing or odd status ranks as unknown)."""
    return _verdict().rank(verdict.get("status"))


def _tolerance(inv, host: str) -> dict:
    """The thresholds the ladder judged HOST with: its host model's tolerance (the defaults merged with its
    rigbook_tolerance); the defaults for a host the inventory no longer has."""
    expectations = _ladder_utils()[0]
    if inv is None or host not in inv.hosts:
        return expectations.tolerance()
    return host_model_of(inv, host)["tolerance"]


def _run_records(notes: list) -> list:
    """Every saved run record, newest first (by start time, then folder name); a bad one is left out and named in
    NOTES."""
    found, bad = runs.read_records()
    notes += [f"{exc}: left out" for exc in bad]
    return sorted(found, key=lambda r: (str(r.get("started") or ""), Path(r["dir"]).name), reverse=True)


def group_members(inv) -> dict:
    """{group: [hosts]} for every group of INV (hosts of its child groups included), inventory host order."""
    parents = {}
    for group, kids in inv.children.items():
        for kid in kids:
            parents.setdefault(kid, set()).add(group)

    def ancestors(group, seen=()):
        out = {group}
        for parent in parents.get(group, ()):
            if parent not in seen:
                out |= ancestors(parent, (*seen, group))
        return out

    members = {}
    for host in inv.hosts:
        for group in inv.groups_of(host):
            for owner in ancestors(group):
                members.setdefault(owner, [])
                if host not in members[owner]:
                    members[owner].append(host)
    return members


def _narrowest(members: dict, host: str) -> str:
    """The group with the fewest hosts that holds HOST ("" when only all/ungrouped do)."""
    owners = [g for g, names in members.items() if host in names and g not in NO_GROUP]
    return min(owners, key=lambda g: (len(members[g]), g)) if owners else ""


def _groups(inv, hosts: list) -> list:
    """(title, hosts) of each group with two or more hosts (one entry per distinct set of hosts, the narrowest
    group first); the whole inventory as "fleet" when no group holds it all."""
    members = group_members(inv)
    seen, out = set(), []
    for group in sorted(members, key=lambda g: (len(members[g]), g)):
        names = [h for h in hosts if h in members[group]]
        if group in NO_GROUP or len(names) < 2 or tuple(names) in seen:
            continue
        seen.add(tuple(names))
        out.append((f"group {group}", names))
    if len(hosts) >= 2 and tuple(hosts) not in seen:
        out.append(("fleet (every host of the inventory)", list(hosts)))
    return out


def gather(inventory: str) -> ReportData:
    """Everything the page shows, read from the state directory for the hosts of INVENTORY (a name or a path)."""
    path = resolve_inventory(inventory)
    inv = validate(path)
    names = list(inv.hosts)
    # each host's newest manifest from a manifest run of this inventory, as `provision diff -i` compares them (a bad
    # run record is named once, by _run_records below)
    stored = manifests.latest_of_inventory(path, warn=lambda line: None)
    data = ReportData(inventory=path.name, inventory_path=str(path),
                      generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"), hosts=[], groups=_groups(inv, names),
                      manifest_run=", ".join(sorted({str(f.parent.parent) for f in stored.values()}, reverse=True))
                      or None)
    key = inventory_key(path)
    records = [r for r in _run_records(data.notes) if runs.inventory_key_of(r) == key]
    data.last_roll = last_roll(str(path))
    members = group_members(inv)
    for name in names:
        host = HostData(name, tolerance=_tolerance(inv, name), group=_narrowest(members, name))
        # The report only reads: a corrupt baselines file is named in the notes and left out, never moved.
        host.baseline_label, host.baseline = baselines.resolve(name, inv, notes=data.notes)
        host.history = baselines.history(name, inv, [])  # a corrupt file: named once, by resolve above
        host.runs = [r for r in records if ((r.get("hosts") or {}).get(name) or {}).get("ladder")]
        manifest_file = stored.get(name)
        if manifest_file and manifest_file.is_file():  # names validated: the playbook named the file after the host
            try:
                host.manifest = manifests.read_manifest(manifest_file)
            except UserError as exc:  # a bad manifest file is named (on the page and stderr), the page still made
                data.notes.append(f"manifest of {name}: {exc}: left out")
        data.hosts.append(host)
    return data


# --- figures -----------------------------------------------------------------------------------------------------

def point_status(metric: str, value, baseline, tolerance: dict) -> str:
    """pass / warn / fail of one figure against BASELINE (the judges' rule), skip without a baseline."""
    if not isinstance(value, (int, float)) or not isinstance(baseline, (int, float)) or baseline <= 0:
        return "skip"
    _expectations, baseline_compare, serving_layer = _ladder_utils()
    if lower_is_better(metric):
        return serving_layer.compare_lower_is_better(metric, value, baseline, tolerance)[0]
    return baseline_compare.compare(metric, value, baseline, tolerance)[0]


def host_metrics(host: HostData) -> list:
    """Every metric the host's history or baseline holds, in first-seen order."""
    names = []
    for entry in [*host.history, {"metrics": (host.baseline or {}).get("metrics") or {}}]:
        for name, value in (entry.get("metrics") or {}).items():
            if isinstance(value, (int, float)) and name not in names:
                names.append(name)
    return names


def _run_id(entry: dict) -> str:
    return Path(entry["run_dir"]).name if entry.get("run_dir") else str(entry.get("at") or "?")


def series(host: HostData, metric: str) -> list:
    """[{"at", "value", "status", "run", "run_dir", "recorded", "versions"}] of METRIC, oldest first."""
    base = ((host.baseline or {}).get("metrics") or {}).get(metric)
    out = []
    for entry in host.history:
        value = (entry.get("metrics") or {}).get(metric)
        if not isinstance(value, (int, float)):
            continue
        out.append({"at": str(entry.get("at") or "?"), "value": float(value), "run": _run_id(entry),
                    "run_dir": entry.get("run_dir"), "recorded": bool(entry.get("recorded")),
                    "versions": entry.get("versions") or {},
                    "status": point_status(metric, value, base, host.tolerance)})
    return out


def version_changes(points: list) -> list:
    """[(index, "kernel a -> b; ...")] where a point's versions differ from the one before it."""
    changes = []
    for index in range(1, len(points)):
        before, now = points[index - 1]["versions"], points[index]["versions"]
        said = [f"{key} {before.get(key) or '-'} → {now.get(key) or '-'}" for key in VERSION_KEYS
                if before.get(key) != now.get(key) and (before.get(key) or now.get(key))]
        if said:
            changes.append((index, "; ".join(said)))
    return changes


# --- HTML --------------------------------------------------------------------------------------------------------

def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _file_url(path: str) -> str:
    return "file://" + quote(str(Path(path).resolve()))


def _cell(value) -> str:
    """A measured / expected value in full: a mapping as one line per key."""
    if value is None or value == "":
        return "<span class=dim>-</span>"
    if isinstance(value, dict):
        return "<br>".join(f"<b>{_e(k)}</b> {_e(nested_text(v))}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return _e(", ".join(nested_text(v) for v in value))
    return _e(value)


def _fmt(value) -> str:
    if not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"


CSS = """
:root{--fail:#c62828;--warn:#b26a00;--pass:#2e7d32;--skip:#777;--unknown:#7b1fa2;--line:#ccc}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
 padding:12px;color:#222;background:#fff}
h1{font-size:1.5em;margin:.3em 0}h2{font-size:1.25em;margin:1.2em 0 .4em;border-bottom:2px solid #333}
h3{font-size:1.05em;margin:1em 0 .3em}
.meta{color:#555;font-size:.9em}.dim{color:#888}
table{border-collapse:collapse;width:100%;margin:.4em 0}
th,td{border:1px solid var(--line);padding:4px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f3f3f3}
.status{font-weight:600;text-transform:uppercase;font-size:.85em;white-space:nowrap}
.s-fail{color:var(--fail)}.s-warn{color:var(--warn)}.s-pass{color:var(--pass)}.s-skip{color:var(--skip)}
.s-unknown{color:var(--unknown)}
tr.row-fail td{background:#fdecea}tr.row-warn td{background:#fff4e0}
td.differs{background:#fff3b0;font-weight:600}
table.ladder{table-layout:fixed;font-size:.92em}table.ladder td:first-child{overflow-wrap:normal}
col.c-layer{width:9.5em}col.c-status{width:7em}col.c-measured{width:27%}col.c-expected{width:19%}
col.c-why{width:26%}
code{font:.9em ui-monospace,Menlo,Consolas,monospace;background:#f5f5f5;padding:1px 3px;overflow-wrap:anywhere}
code.rb-code{font-size:.75em}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:10px}
figure{margin:0;border:1px solid var(--line);padding:6px;break-inside:avoid}
figcaption{font-size:.9em;margin-bottom:4px}
svg.chart{width:100%;height:auto;display:block}
svg .band-fail{fill:#c62828;fill-opacity:.14}svg .band-warn{fill:#f9a825;fill-opacity:.18}
svg .baseline{stroke:#1565c0;stroke-width:1.5;stroke-dasharray:5 3}
svg .axis{stroke:#999;stroke-width:1}svg .trend{fill:none;stroke:#444;stroke-width:1.5}
svg .change{stroke:#6a1b9a;stroke-width:1.2;stroke-dasharray:2 2}
svg text{font:13px system-ui,sans-serif;fill:#444}svg text.change-label{fill:#6a1b9a}
svg circle.p-pass{fill:#2e7d32}svg circle.p-warn{fill:#f9a825}svg circle.p-fail{fill:#c62828}
svg circle.p-skip,svg circle.p-unknown{fill:#777}svg circle.recorded{stroke:#1565c0;stroke-width:2}
.legend span{margin-right:1.2em;font-size:.85em;white-space:nowrap}
.sw{display:inline-block;width:1.4em;height:.8em;vertical-align:middle;margin-right:.3em}
.sw-fail{background:rgba(198,40,40,.25)}.sw-warn{background:rgba(249,168,37,.35)}
.sw-base{border-top:2px dashed #1565c0;height:0}.sw-change{border-left:2px dotted #6a1b9a;width:0;height:1em}
.sw-rec{width:.8em;border-radius:50%;border:2px solid #1565c0;background:#2e7d32}
section.host,section.group{break-before:auto}
@media (max-width:700px){
 body{padding:6px;font-size:14px}
 table.ladder thead{display:none}
 table.ladder,table.ladder tbody{display:block}table.ladder colgroup{display:none}
 table.ladder tr{display:block;border:1px solid var(--line);margin-bottom:6px}
 table.ladder td{display:block;border:0;border-top:1px solid #eee}
 table.ladder td::before{content:attr(data-label) ": ";font-weight:600;color:#555}
 .charts{grid-template-columns:1fr}
}
@media print{body{max-width:none;font-size:11px}a{color:inherit}figure,tr{break-inside:avoid}
 *{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""

W, H = 480, 230
LEFT, RIGHT, TOP, BOTTOM = 54, 10, 14, 42


def chart_svg(host: HostData, metric: str) -> str:
    """One metric's runs as an inline SVG: bands (fail, warn), the baseline, the points, version changes."""
    points = series(host, metric)
    base = ((host.baseline or {}).get("metrics") or {}).get(metric)
    tol = host.tolerance
    lower = lower_is_better(metric)
    values = [p["value"] for p in points]
    top_value = max(values + ([base / tol["fail_below"] * 1.1 if lower else base] if base else []) + [1e-9])
    ymax = top_value * 1.15
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM

    def y(value: float) -> float:
        return round(TOP + plot_h * (1 - max(0.0, min(value, ymax)) / ymax), 2)

    def x(index: int) -> float:
        if len(points) <= 1:
            return round(LEFT + plot_w / 2, 2)
        return round(LEFT + plot_w * (0.04 + 0.92 * index / (len(points) - 1)), 2)

    attrs = f'data-host="{_e(host.name)}" data-metric="{_e(metric)}"'
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" {attrs} '
             f'aria-label="{_e(metric)} of {_e(host.name)} over {len(points)} run(s)">']
    if base:
        fail_at, warn_at = ((base / tol["fail_below"], base / tol["warn_below"]) if lower
                            else (base * tol["fail_below"], base * tol["warn_below"]))
        bands = ((("fail", fail_at, ymax), ("warn", warn_at, fail_at)) if lower
                 else (("fail", 0.0, fail_at), ("warn", fail_at, warn_at)))
        for kind, low, high in bands:
            y_top, y_bottom = y(high), y(low)
            parts.append(f'<rect class="band-{kind}" data-band="{kind}" {attrs} data-from="{low:.4f}" '
                         f'data-to="{high:.4f}" x="{LEFT}" y="{y_top}" width="{plot_w}" '
                         f'height="{round(y_bottom - y_top, 2)}"><title>{kind} band: {_fmt(low)} to {_fmt(high)}'
                         f"</title></rect>")
        parts.append(f'<line class="baseline" data-baseline="{base}" {attrs} x1="{LEFT}" x2="{W - RIGHT}" '
                     f'y1="{y(base)}" y2="{y(base)}"><title>baseline {_fmt(base)}</title></line>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}"/>'
                 f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}"/>')
    for fraction in (0, 0.5, 1):
        tick = ymax / 1.15 * fraction
        parts.append(f'<text x="{LEFT - 4}" y="{y(tick) + 4}" text-anchor="end">{_fmt(tick)}</text>')
    for index, text in version_changes(points):
        at = round((x(index - 1) + x(index)) / 2, 2)
        parts.append(f'<line class="change" data-change="{_e(text)}" {attrs} x1="{at}" x2="{at}" y1="{TOP}" '
                     f'y2="{TOP + plot_h}"><title>{_e(text)}</title></line>'
                     f'<text class="change-label" x="{at + 3}" y="{TOP + 10}">{_e(text.split(" ")[0])} changed</text>')
    if len(points) > 1:
        line = " ".join(f"{x(i)},{y(p['value'])}" for i, p in enumerate(points))
        parts.append(f'<polyline class="trend" points="{line}"/>')
    step = max(1, (len(points) + 5) // 6)
    for index, point in enumerate(points):
        cx, cy = x(index), y(point["value"])
        css = f"p-{point['status']}" + (" recorded" if point["recorded"] else "")
        what = "baseline record" if point["recorded"] else "run"
        ratio = f", {point['value'] / base:.2f}x baseline" if base else ""
        parts.append(f'<circle class="point {css}" {attrs} data-run="{_e(point["run"])}" '
                     f'data-at="{_e(point["at"])}" data-value="{point["value"]}" data-status="{point["status"]}" '
                     f'cx="{cx}" cy="{cy}" r="4.5"><title>{_e(point["at"])} ({what}): {_fmt(point["value"])}'
                     f'{ratio}, {point["status"]}</title></circle>')
        if index % step == 0 or index == len(points) - 1:
            anchor = "end" if index == len(points) - 1 and len(points) > 1 else "middle"
            parts.append(f'<text x="{cx}" y="{TOP + plot_h + 14}" text-anchor="{anchor}">'
                         f'{_e(point["at"][5:16])}</text>')
    if not points:
        parts.append(f'<text x="{LEFT + 10}" y="{TOP + 20}">no run recorded this figure</text>')
    parts.append(f'<text x="{LEFT + plot_w / 2}" y="{H - 6}" text-anchor="middle">runs, oldest first '
                 "(evenly spaced; date under each)</text></svg>")
    return "".join(parts)


def _status(status) -> str:
    status = str(status or "unknown")
    return f'<span class="status s-{_e(status)}">{_e(status)}</span>'


def _code(code: str) -> str:
    """A verdict's failure code under its status (docs/codes.md), "" for none."""
    return f'<br><code class="rb-code">{_e(code)}</code>' if code else ""


def _judged(entry: dict) -> str:
    """Which baseline judged a run's host entry, and of which inventory (baselines.judged_text)."""
    return baselines.judged_text(str(entry.get("baseline_source") or "none"), entry.get("baseline_inventory"))


def _latest(host: HostData) -> tuple:
    """(run record, host entry) of the newest run with a ladder for HOST, or (None, {})."""
    if not host.runs:
        return None, {}
    record = host.runs[0]
    return record, record["hosts"][host.name]


def _versions(host: HostData) -> dict:
    record, entry = _latest(host)
    if entry.get("ladder"):
        found = versions_of(entry["ladder"])
        if found:
            return found
    for item in reversed(host.history):
        if item.get("versions"):
            return item["versions"]
    return {}


def ladder_table(host: HostData, ladder: list) -> str:
    rows = []
    for verdict in ladder:
        status = str(verdict.get("status") or "unknown")
        layer = str(verdict.get("layer"))
        code = str(verdict.get("code") or "") if status != "pass" else ""
        coded = f' data-code="{_e(code)}"' if code else ""
        rows.append(f'<tr class="layer row-{_e(status)}" data-host="{_e(host.name)}" data-layer="{_e(layer)}" '
                    f'data-status="{_e(status)}"{coded}><td data-label="layer"><b>{_e(layer)}</b></td>'
                    f'<td data-label="status">{_status(status)}{_code(code)}</td>'
                    f'<td data-label="measured">{_cell(verdict.get("measured"))}</td>'
                    f'<td data-label="expected">{_cell(verdict.get("expected"))}</td>'
                    f'<td data-label="why">{_cell(verdict.get("why"))}</td>'
                    f'<td data-label="what to do">{_cell(verdict.get("remedy"))}</td></tr>')
    return ('<table class="ladder"><colgroup><col class="c-layer"><col class="c-status"><col class="c-measured">'
            '<col class="c-expected"><col class="c-why"><col class="c-remedy"></colgroup><thead><tr><th>layer</th>'
            "<th>status</th><th>measured</th><th>expected</th><th>why</th><th>what to do</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def host_section(host: HostData, data: ReportData) -> str:
    record, entry = _latest(host)
    out = [f'<section class="host" id="host-{_e(host.name)}" data-host="{_e(host.name)}">',
           f"<h2>{_e(host.name)}</h2>"]
    versions = _versions(host)
    version_text = ", ".join(f"{k} {v}" for k, v in versions.items()) or "versions unknown"
    if record:
        judged = _judged(entry) if entry.get("baseline_source") else "not recorded in this run"
        out.append(f'<p class="meta">latest run <b>{_e(record.get("started", "?"))}</b> '
                   f"({_e(Path(str(record.get('playbook', '?'))).name)}, host {_e(entry.get('state', '?'))}); "
                   f"judged by baseline: <b>{_e(judged)}</b>; {_e(version_text)}; "
                   f'artifacts: <a href="{_e(_file_url(record["dir"]))}">{_e(record["dir"])}</a></p>')
    else:
        out.append(f'<p class="meta">no saved run with a ladder for {_e(host.name)} (run '
                   f"<code>provision verify -i {_e(data.inventory)}</code>); {_e(version_text)}</p>")
    if host.baseline:
        base_versions = ", ".join(f"{k} {v}" for k, v in (host.baseline.get("versions") or {}).items())
        legacy = (" (recorded before baselines were kept per inventory, by a run of it)"
                  if host.baseline.get("legacy") else "")
        now = baselines.judged_text(host.baseline_label, data.inventory_path)
        out.append(f'<p class="meta">baseline that judges it now: <b>{_e(now)}</b>{_e(legacy)}, recorded '
                   f"{_e(host.baseline.get('at', '?'))} ({_e(base_versions or 'versions unknown')}); fail below "
                   f"{host.tolerance['fail_below']:.2f}x, warn below {host.tolerance['warn_below']:.2f}x</p>")
    else:
        out.append(f'<p class="meta">no baseline judges {_e(host.name)} yet (<code>provision baseline record -i '
                   f"{_e(data.inventory)}</code>)</p>")
    metrics = host_metrics(host)
    if metrics:
        out.append('<h3>figures over time</h3><p class="legend"><span><i class="sw sw-fail"></i>fail band</span>'
                   '<span><i class="sw sw-warn"></i>warn band</span><span><i class="sw sw-base"></i>baseline</span>'
                   '<span><i class="sw sw-change"></i>kernel / driver / NCCL change</span>'
                   '<span><i class="sw sw-rec"></i>the baseline record</span></p><div class="charts">')
        for metric in metrics:
            out.append(f'<figure data-host="{_e(host.name)}" data-metric="{_e(metric)}"><figcaption>'
                       f"<b>{_e(metric)}</b>{' (lower is better)' if lower_is_better(metric) else ''}</figcaption>"
                       f"{chart_svg(host, metric)}</figure>")
        out.append("</div>")
    if record:
        out.append(f"<h3>latest ladder ({_e(record.get('started', '?'))})</h3>")
        out.append(ladder_table(host, entry["ladder"]))
        for failure in entry.get("failures") or []:
            out.append(f'<p class="s-fail">{_e(failure.get("task", "?"))}: {_e(failure.get("msg", ""))}</p>')
    out.append(f"<h3>runs and a bug report</h3><p>reproduce for a bug report: <code>provision snapshot -i "
               f"{_e(data.inventory)} --limit {_e(host.name)} -o {_e(host.name)}-snapshot.tar.gz</code> "
               f"(anyone judges it with <code>provision verify --replay {_e(host.name)}-snapshot.tar.gz</code>)</p>")
    if host.runs:
        out.append("<table class=runs><thead><tr><th>started</th><th>playbook</th><th>host</th><th>worst layer"
                   "</th><th>artifact folder</th></tr></thead><tbody>")
        for run in host.runs[:RUN_LINKS]:
            ladder = run["hosts"][host.name].get("ladder") or []
            worst = max(ladder, key=_rank, default={})
            out.append(f'<tr class="run" data-host="{_e(host.name)}" data-run="{_e(Path(run["dir"]).name)}">'
                       f"<td>{_e(run.get('started', '?'))}</td><td>{_e(Path(str(run.get('playbook', '?'))).name)}"
                       f"</td><td>{_e(run['hosts'][host.name].get('state', '?'))}</td>"
                       f"<td>{_status(worst.get('status'))} {_e(worst.get('layer', ''))}</td>"
                       f'<td><a href="{_e(_file_url(run["dir"]))}">{_e(Path(run["dir"]).name)}</a></td></tr>')
        out.append("</tbody></table>")
    out.append("</section>")
    return "".join(out)


def _row(label: str, cells: list, css: str = "") -> str:
    differs = len({c for c in cells}) > 1
    tds = "".join(f'<td class="{"differs" if differs else ""}">{c}</td>' for c in cells)
    return f'<tr class="{css}{" differs" if differs else ""}"><th>{_e(label)}</th>{tds}</tr>'


def group_section(title: str, names: list, data: ReportData) -> str:
    hosts = [h for h in data.hosts if h.name in names]
    out = [f'<section class="group" data-group="{_e(title)}"><h2>{_e(title)}: side by side</h2>',
           "<table class=side><thead><tr><th></th>" + "".join(f"<th>{_e(h.name)}</th>" for h in hosts)
           + "</tr></thead><tbody>"]
    latest = [_latest(h) for h in hosts]
    out.append(_row("latest run", [_e(r.get("started", "?")) if r else "-" for r, _ in latest]))
    out.append(_row("judged by", [_e(e.get("baseline_source", "-")) if r else "-" for r, e in latest]))
    versions = [_versions(h) for h in hosts]
    for key in VERSION_KEYS:
        if any(v.get(key) for v in versions):
            out.append(_row(key, [_e(v.get(key, "-")) for v in versions], "version"))
    layers = []
    for _, entry in latest:
        for verdict in entry.get("ladder") or []:
            if verdict.get("layer") not in layers:
                layers.append(verdict.get("layer"))
    for layer in layers:
        cells = []
        for _, entry in latest:
            found = [v for v in entry.get("ladder") or [] if v.get("layer") == layer]
            cells.append(_status(found[0].get("status")) if found else "-")
        out.append(_row(f"layer {layer}", cells, "layer"))
    metrics = []
    for h in hosts:
        metrics += [m for m in host_metrics(h) if m not in metrics]
    for metric in metrics:
        cells = []
        for h in hosts:
            points = series(h, metric)
            base = ((h.baseline or {}).get("metrics") or {}).get(metric)
            if points:
                last = points[-1]
                ratio = f" ({last['value'] / base:.2f}x)" if base else ""
                cells.append(f'<span class="s-{last["status"]}">{_fmt(last["value"])}</span>{ratio}')
            else:
                cells.append("-")
        out.append(_row(metric, cells, "metric"))
    out.append("</tbody></table>")
    out.append(_manifest_table(hosts, data))
    out.append("</section>")
    return "".join(out)


def _manifest_table(hosts: list, data: ReportData) -> str:
    with_manifest = [h for h in hosts if h.manifest]
    if len(with_manifest) < 2:
        return ('<p class="meta">manifests: not collected for these hosts yet (<code>provision manifest -i '
                f"{_e(data.inventory)}</code>); then the items that differ show here</p>")
    keys = sorted({k for h in with_manifest for k in (h.manifest.get("items") or {})})
    rows, same, unique = [], 0, 0
    for key in keys:
        items = [(h.manifest.get("items") or {}).get(key) or {} for h in with_manifest]
        values = [json.dumps(i.get("value"), sort_keys=True) if i else "(absent)" for i in items]
        if len(set(values)) == 1:
            same += 1
            continue
        kind = manifests.label_of(key)  # the controller's rule, never the label a box sent
        host_unique = kind["unique"]
        unique += host_unique
        label = f"{key} [{kind['group']}]" + (" (host-unique, expected to differ)" if host_unique else "")
        cells = "".join(f'<td class="{"" if host_unique else "differs"}">{_e(v)}</td>' for v in values)
        rows.append(f'<tr class="manifest{"" if host_unique else " differs"}" data-item="{_e(key)}">'
                    f"<th>{_e(label)}</th>{cells}</tr>")
    head = "".join(f"<th>{_e(h.name)}</th>" for h in with_manifest)
    pinned = len(rows) - unique
    return (f'<h3>manifest (from {_e(data.manifest_run)})</h3><p class="meta">{pinned} pinned item(s) differ '
            f"(highlighted), {unique} host-unique item(s) differ, {same} equal</p>"
            f"<table class=manifest><thead><tr><th>item</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def fleet_layers() -> list:
    """The fleet table's columns: every layer of the ladder's registry, in ladder order."""
    _ladder_utils()  # links the collection
    # deferred: ansible_collections.rigbook.homelab is importable only after link_collection() (_ladder_utils)
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

    return registry.names()


def fleet_table(data: ReportData) -> str:
    """Every host's layers of its newest run in one table, the hosts of a group together (groups side by side)."""
    layers = fleet_layers()
    rows = []
    for host in sorted(data.hosts, key=lambda h: (h.group, data.hosts.index(h))):
        record, entry = _latest(host)
        status = {v.get("layer"): v.get("status") for v in entry.get("ladder") or []}
        cells = "".join(f'<td data-layer="{_e(layer)}" data-status="{_e(status.get(layer) or "")}">'
                        + (_status(status[layer]) if layer in status else "-") + "</td>" for layer in layers)
        rows.append(f'<tr data-host="{_e(host.name)}" data-group="{_e(host.group)}"><th>{_e(host.name)}</th>'
                    f"<td>{_e(host.group or '-')}</td><td>{_e(record.get('started', '?')) if record else '-'}</td>"
                    + cells + "</tr>")
    head = "".join(f"<th>{_e(layer)}</th>" for layer in layers)
    return ('<section class="fleet"><h2>fleet: every box\'s layers (newest run)</h2><table class="fleet">'
            f"<thead><tr><th>host</th><th>group</th><th>run</th>{head}</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></section>")


def roll_section(roll) -> str:
    """The last `--rolling` run: its batches, where it stopped and why, the boxes it did not reach."""
    if not roll:
        return ""
    rows = "".join(f'<tr data-batch="{_e(b.get("batch"))}"><td>{_e(b.get("batch"))}</td>'
                   f'<td>{_e(", ".join(b.get("hosts") or []))}</td>'
                   f'<td>{_status("pass" if b.get("exit_code") == 0 else "fail")} '
                   f'exit {_e(b.get("exit_code"))}</td></tr>'
                   for b in roll.get("batches") or [] if isinstance(b, dict))
    stopped = roll.get("stopped_at_batch")
    said = (f"stopped at batch {_e(stopped)}: {_e(roll.get('why') or '')}; not reached: "
            f"{_e(', '.join(roll.get('untouched') or []) or 'none')}" if stopped else "every batch passed")
    return (f'<section class="roll" data-stopped="{_e(stopped or "")}"><h2>last roll</h2>'
            f"<p>{_e(roll.get('playbook', ''))} --rolling {_e(roll.get('spec', ''))}"
            f"{' (check mode)' if roll.get('check') else ''}, ended {_e(roll.get('ended', '?'))}: {said}</p>"
            "<table class=roll><thead><tr><th>batch</th><th>hosts</th><th>result</th></tr></thead><tbody>"
            + rows + "</tbody></table></section>")


def render(data: ReportData) -> str:
    """The page: one HTML string, inline CSS and SVG, no script, no external URL."""
    toc = " · ".join(f'<a href="#host-{_e(h.name)}">{_e(h.name)}</a>' for h in data.hosts)
    summary = []
    for h in data.hosts:
        record, entry = _latest(h)
        worst = max(entry.get("ladder") or [{}], key=_rank)
        below = [(p["at"], m) for m in host_metrics(h) for p in series(h, m) if p["status"] == "fail"]
        fails = ", ".join(f"{at} {metric}" for at, metric in sorted(below)) or "none"
        summary.append(f"<tr><th>{_e(h.name)}</th><td>{_e(record.get('started', '?')) if record else '-'}</td>"
                       f"<td>{_status(worst.get('status')) if record else '-'} {_e(worst.get('layer', ''))}</td>"
                       f"<td>{_e(_judged(entry) if 'baseline_source' in entry else h.baseline_label)}</td>"
                       f'<td class="{"s-fail" if below else ""}">{_e(fails)}</td></tr>')
    notes = "".join(f'<p class="s-warn">{_e(n)}</p>' for n in data.notes)
    body = [f"<header><h1>rigbook report: {_e(data.inventory)}</h1>",
            f'<p class="meta">inventory {_e(data.inventory_path)}; made {_e(data.generated)} from the saved state '
            f"(baselines, run records, manifests; no host contacted: run <code>provision verify -i "
            f"{_e(data.inventory)}</code> first for fresh figures)</p>{notes}<nav>{toc}</nav></header>",
            "<table class=overview><thead><tr><th>host</th><th>latest run</th><th>worst layer</th>"
            "<th>baseline</th><th>figures below the fail band (any run)</th></tr></thead><tbody>"
            + "".join(summary) + "</tbody></table>", fleet_table(data), roll_section(data.last_roll)]
    body += [host_section(h, data) for h in data.hosts]
    body += [group_section(title, names, data) for title, names in data.groups]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>rigbook report: {_e(data.inventory)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def default_output(inventory_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%SZ", time.gmtime())
    return state_dir() / "reports" / f"{inventory_name}-{stamp}.html"


def write_report(inventory: str, output: str | None = None) -> tuple:
    """Gather, render and write the page; (path, data). OUTPUT: a file in an existing folder (a new one 0600, the
    user's alone like every state file: the page names the hosts, their versions and the run folders; an existing
    one keeps the permissions its owner gave it); by default <state>/reports/<inventory>-<UTC time>.html (the folder
    made, the file 0600). The
    page goes through a temporary file of unpredictable name in the same folder, then os.replace
    (statefile.write_text_atomic, the collection's facts/files.write_atomic): a reader never sees half a page, a
    symbolic link at OUTPUT is refused, not written through, and nothing is left behind when the write fails (a
    UserError naming the path, exit 2)."""
    if output:
        path = Path(output)
        if path.is_dir():
            raise UserError(f"report -o {output}: is a directory; give the HTML file to write, e.g. "
                            f"{path / 'report.html'}")
        if not path.parent.is_dir():
            what = "is not a folder" if path.parent.exists() else "does not exist"
            raise UserError(f"report -o {output}: {path.parent} {what}")
    data = gather(inventory)
    if not output:
        path = default_output(data.inventory)
        statefile.private_dir(path.parent)
    page = render(data)
    try:
        statefile.write_text_atomic(path, page, statefile.NEW_FILE_MODE)
    except OSError as exc:
        raise UserError(f"report: cannot write {path}: {exc.strerror or exc}") from None
    return path, data


def main(argv: list) -> int:
    """`provision report -i INV [-o FILE] [--from-runs]`."""
    parser = argparse.ArgumentParser(
        prog="provision report",
        description="one self-contained HTML page for an inventory: each host's latest ladder, its figures over "
                    "time against the baseline, the hosts side by side. Built from the saved state (baselines, "
                    "run records, manifests); it contacts no host, so run `provision verify -i INV` first for "
                    "fresh figures.")
    parser.add_argument("-i", "--inventory", required=True, help="homelab, lab or a path")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="the HTML file (default <state>/reports/<inventory>-<UTC time>.html)")
    parser.add_argument("--from-runs", action="store_true",
                        help="build from the saved runs only (the default too: the report never contacts a host)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    path, data = write_report(args.inventory, args.output)
    for note in data.notes:  # each is on the page too
        print(terminal_safe(f"warning: {note}"), file=sys.stderr)
    figures = sum(len(series(h, m)) for h in data.hosts for m in host_metrics(h))
    print(terminal_safe(f"report of {data.inventory} ({len(data.hosts)} host(s), {figures} charted point(s), "
                        f"{path.stat().st_size // 1024} KiB, {time.monotonic() - started:.2f} s): {path}"),
          file=sys.stdout)
    return 0
