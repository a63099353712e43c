"""judges/verdict.py: the one severity order of the statuses and its helpers; and the judges' vocabulary (verdict,
expectations, baseline_compare) lives under judges/, so the ladder depends on the judges and never the reverse."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict

JUDGES = Path(__file__).resolve().parents[5] / "plugins" / "module_utils" / "judges"


def test_the_order_is_every_status_once_with_unknown_above_warn():
    assert sorted(verdict.SEVERITY) == sorted(verdict.STATUSES)
    assert verdict.SEVERITY == ("skip", "pass", "warn", "unknown", "fail")
    assert verdict.rank("unknown") > verdict.rank("warn")  # a warn modifier never hides an unknown
    assert verdict.rank("bogus") == verdict.rank(None) == verdict.rank("unknown")  # an odd status is not milder


def test_worse_and_worst():
    for a, b in itertools.product(verdict.STATUSES, repeat=2):
        assert verdict.worse(a, b) == verdict.worse(b, a) == max(a, b, key=verdict.rank)
    assert verdict.worse("unknown", "warn") == "unknown" and verdict.worse("skip", "pass") == "pass"
    assert verdict.worst([]) == "skip" and verdict.worst([], default="pass") == "pass"
    assert verdict.worst(["pass", "unknown", "warn", "skip"]) == "unknown"
    assert verdict.worst(["warn", "fail", "unknown"]) == "fail"


def test_no_judge_imports_the_ladder():
    for path in sorted(JUDGES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert ".module_utils.ladder" not in node.module + ".", (path.name, node.module)
