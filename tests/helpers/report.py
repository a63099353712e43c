"""What `provision report` and the ladder output are checked against: a lab run history written through rigbook's
own writers (`REPORT_HISTORY`, `lab_report_history()`), the elements of an HTML page (`html_elements()`), and every
figure of a value as the text a person must find (`leaves()`)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from helpers.cli import REPO

# --- a lab run history for `provision report` ----------------------------------------------------------------
# (tests/unit/rigbook/test_report.py, tests/integration/test_report_browser.py)

REPORT_HISTORY = (  # (when, playbook, fault on lab-r9700 or None); the first run records the baselines
    ("2026-03-02 09:14:05", "baseline", None),
    ("2026-03-03 09:15:41", "verify", None),
    ("2026-03-04 09:13:12", "verify", None),
    ("2026-03-05 09:16:58", "verify", "busbw-half"),
    ("2026-03-06 09:14:30", "verify", None),
)


def lab_report_history(work: Path) -> dict:
    """Write a lab run history into the state directory (RIGBOOK_STATE_DIR) through rigbook's own writers
    (baselines.record / append_history / annotate, runs.save_record), the way `provision baseline record -i lab`
    then four `provision verify -i lab` would: every ladder is the real climb (snapshots.judge_tree) over the lab's
    recorded hardware trees (src/rigbook/lab/rigs, the pinned kernel "booted" as the lab's boot hook records
    it), later runs judged against the recorded baseline; the fourth run has `provision lab break lab-r9700
    busbw-half` applied to the R9700 twin's tree (every recorded busbw figure times 0.5), the fifth is after `lab
    heal`. The figures are the recorded trees' (the two write-ups'): 3080 twin host-staged 6.00 GB/s, R9700 twin
    peer 10.29 GB/s, busbw 9.75 / 9.51 GB/s. Returns {"runs": [run folder names], "faulted": folder name,
    "hosts": {host: {run folder: ladder}}}."""
    import time as real_time

    from rigbook import baselines, paths, runs
    from rigbook.lab import faults, hardware_trees
    from rigbook.snapshots import judge_tree, ladder_view_of
    from rigbook.validate import validate

    inventory = REPO / "inventory" / "lab"
    inv = validate(inventory)
    rigs = {"lab-3080": "x99-3080", "lab-r9700": "x99-r9700"}
    out = {"runs": [], "faulted": None, "hosts": {h: {} for h in rigs}}

    class Clock:  # baselines stamps "at" with time.strftime: each run gets its own day
        now = ""

        @classmethod
        def strftime(cls, fmt, *args):
            return cls.now if fmt == "%Y-%m-%d %H:%M:%S" and not args else real_time.strftime(fmt, *args)

        def __getattr__(self, name):
            return getattr(real_time, name)

    for number, (when, kind, fault) in enumerate(REPORT_HISTORY):
        Clock.now = when
        run_dir = runs.runs_dir() / f"{when[:10].replace('-', '')}-{when[11:].replace(':', '')}-verify-{number:06x}"
        run_dir.mkdir(parents=True)
        hosts = {}
        for host, rig in rigs.items():
            tree = hardware_trees.materialize(rig, work / f"run{number}" / host)
            release = inv.host_vars(host)["rigbook_pins"]["kernel"]["release"]
            (tree / "proc/sys/kernel/osrelease").write_text(release + "\n")
            module = tree / "lib/modules" / release / "updates/dkms/nvidia.ko"
            module.parent.mkdir(parents=True, exist_ok=True)
            module.write_text("")
            if fault and host == "lab-r9700":
                faults.apply(faults.plan(fault, tree, hardware_trees.load_rig(rig)))
            label, recorded = baselines.resolve(host, inv)
            ladder = judge_tree(str(tree), ladder_view_of(inv, host), (recorded or {}).get("metrics"))
            failed = any(v["status"] == "fail" for v in ladder)
            hosts[host] = {"ok": 20, "changed": 0, "failed": int(failed), "unreachable": 0, "skipped": 3,
                           "state": "failed" if failed else "ok", "ladder": ladder}
            with mock.patch.object(baselines, "time", Clock()):
                if kind == "baseline":
                    baselines.record(host, ladder, str(run_dir), inv)
                    hosts[host]["baseline"] = "recorded"
                else:
                    baselines.append_history(host, ladder, {v["layer"]: v["status"] for v in ladder}, str(run_dir),
                                             inv)
            out["hosts"][host][run_dir.name] = ladder
        if kind != "baseline":
            baselines.annotate(hosts, baselines.judged_by(list(hosts), baselines.extra_vars(list(hosts), inv)),
                               inventory)
        code = 1 if any(h["state"] == "failed" for h in hosts.values()) else 0
        runs.save_record(run_dir, {"playbook": str(REPO / "playbooks" / "verify.yml"), "inventory": str(inventory),
                                   "inventory_key": paths.inventory_key(inventory),
                                   "limit": None, "check": False, "started": when, "exit_code": code,
                                   "duration_s": 9.5, "hosts": hosts, "status": "successful", "rc": code})
        out["runs"].append(run_dir.name)
        if fault:
            out["faulted"] = run_dir.name
    return out


def html_elements(text: str) -> tuple:
    """(elements, problems) of an HTML page: every start tag as {"tag", **attributes}, and what an HTML parser
    found unbalanced (a closing tag with no open one, an element left open at the end; void elements aside)."""
    from html.parser import HTMLParser

    void = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
    elements, stack, problems = [], [], []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            elements.append({"tag": tag, **{k: (v if v is not None else "") for k, v in attrs}})
            if tag not in void:
                stack.append(tag)

        def handle_startendtag(self, tag, attrs):
            elements.append({"tag": tag, **{k: (v if v is not None else "") for k, v in attrs}})

        def handle_endtag(self, tag):
            if tag in void:
                return
            if not stack or stack[-1] != tag:
                problems.append(f"</{tag}> closes <{stack[-1] if stack else 'nothing'}>")
                if tag in stack:
                    del stack[len(stack) - 1 - stack[::-1].index(tag):]
                return
            stack.pop()

    parser = Collect(convert_charrefs=True)
    parser.feed(text)
    parser.close()
    problems += [f"<{tag}> never closed" for tag in stack]
    return elements, problems


def leaves(value):
    """Every scalar inside a measured / expected / metrics value, as the text a person must find."""
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from leaves(item)
    elif value is not None:
        yield str(value)
