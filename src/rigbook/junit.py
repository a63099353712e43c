"""JUnit XML for CI systems: one testcase per host, and one per failing task; each failure and skip message names
its failure code first (docs/codes.md), "[RB-P2P-SHM-FALLBACK] why"."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path


def _coded(entry: dict) -> str:
    """"[CODE] " of a verdict or task failure that carries a failure code, "" otherwise."""
    code = entry.get("code") if entry.get("status") != "pass" else None
    return f"[{code}] " if code else ""


def write(path: Path, suite_name: str, hosts: dict, duration_s: float) -> None:
    suite = ET.Element("testsuite", name=suite_name, time=f"{duration_s:.3f}")
    cases = failures = 0
    for name, entry in sorted(hosts.items()):
        cases += 1
        case = ET.SubElement(suite, "testcase", classname=name, name="host")
        if entry["state"] in ("failed", "unreachable"):
            failures += 1
            first = (entry.get("failures") or [{"task": "?", "msg": entry["state"]}])[0]
            node = ET.SubElement(case, "failure", message=f"{entry['state']}: {first['task']}", type=entry["state"])
            node.text = first["msg"]
        counts = ", ".join(f"{k}={entry[k]}" for k in ("ok", "changed", "failed", "unreachable", "skipped"))
        ET.SubElement(case, "system-out").text = counts
        for failure in entry.get("failures") or ():
            cases += 1
            failures += 1
            task_case = ET.SubElement(suite, "testcase", classname=name, name=f"task: {failure['task']}")
            node = ET.SubElement(task_case, "failure", message=(_coded(failure) + failure["msg"])[:500], type="task")
            node.text = failure["msg"]
        for verdict in entry.get("ladder") or ():
            cases += 1
            layer_case = ET.SubElement(suite, "testcase", classname=name, name=f"layer: {verdict.get('layer')}")
            status = verdict.get("status")
            said = _coded(verdict) + str(verdict.get("why", ""))
            if status == "fail":
                failures += 1
                node = ET.SubElement(layer_case, "failure", message=said[:500], type="layer")
                node.text = str(verdict.get("remedy", ""))
            elif status == "skip":
                ET.SubElement(layer_case, "skipped", message=said)
            elif status in ("warn", "unknown"):  # passes in CI's eyes; its code and why are kept beside it
                ET.SubElement(layer_case, "system-out").text = f"{status}: {said}"
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
