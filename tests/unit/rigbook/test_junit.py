"""rigbook.junit: the JUnit XML a CI system reads; each failure and skip message names its failure code first
(docs/codes.md), "[RB-P2P-SHM-FALLBACK] why"."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from rigbook import junit

HOSTS = {
    "rig-a": {
        "state": "failed", "ok": 3, "changed": 0, "failed": 1, "unreachable": 0, "skipped": 0,
        "failures": [{"task": "Ladder 6-9", "msg": "nccl_transport: fail: SHM", "code": "RB-P2P-SHM-FALLBACK"},
                     {"task": "Build", "msg": "make failed"}],
        "ladder": [
            {"layer": "firmware", "status": "pass", "why": "ok"},
            {"layer": "collectives", "status": "skip", "code": "RB-COLLECTIVES-SKIP", "why": "one GPU"},
            {"layer": "serving", "status": "warn", "code": "RB-SERVING-API-KEY-LOGGED", "why": "key in the log"},
            {"layer": "nccl_transport", "status": "fail", "code": "RB-P2P-SHM-FALLBACK",
             "codes": ["RB-P2P-SHM-FALLBACK", "RB-HW-AER-CORRECTABLE"], "why": "via SHM, not P2P <&>",
             "remedy": "check the peer layers"},
        ],
    },
}


def _cases(tmp_path):
    path = tmp_path / "junit.xml"
    junit.write(path, "rigbook verify.yml", HOSTS, 1.5)
    suite = ET.parse(path).getroot()
    return suite, {case.get("name"): case for case in suite.iter("testcase")}


def test_failure_and_skip_messages_name_the_code_first(tmp_path):
    suite, cases = _cases(tmp_path)
    assert suite.get("failures") == "4" and suite.get("tests") == "7"  # the host, two tasks, one layer
    failure = cases["layer: nccl_transport"].find("failure")
    assert failure.get("message") == "[RB-P2P-SHM-FALLBACK] via SHM, not P2P <&>"  # escaped by the XML writer
    assert failure.text == "check the peer layers"
    assert cases["layer: collectives"].find("skipped").get("message") == "[RB-COLLECTIVES-SKIP] one GPU"
    assert cases["task: Ladder 6-9"].find("failure").get("message") == "[RB-P2P-SHM-FALLBACK] nccl_transport: fail: SHM"
    assert cases["task: Build"].find("failure").get("message") == "make failed"  # a task failure with no code


def test_a_warning_keeps_its_code_beside_it_and_a_pass_has_none(tmp_path):
    _, cases = _cases(tmp_path)
    serving = cases["layer: serving"]
    assert serving.find("failure") is None and serving.find("skipped") is None  # a warning does not fail CI
    assert serving.find("system-out").text == "warn: [RB-SERVING-API-KEY-LOGGED] key in the log"
    assert list(cases["layer: firmware"]) == []
