"""ladder/codes.py: every stable failure code defined once, documented, never removed or moved, and given by every
finding that fails or warns."""

from __future__ import annotations

import ast
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import codes
from helpers.cli import REPO

CODE_RE = re.compile(r"\bRB-[A-Z0-9]+(?:-[A-Z0-9]+)+\b")
# where verdicts are judged and modified
JUDGING = sorted((REPO / "plugins" / "module_utils" / "judges").glob("*.py")) + sorted(
    (REPO / "plugins" / "module_utils" / "ladder").glob("*.py"))


def test_every_code_is_defined_once_with_every_field():
    table = codes.all_codes()
    assert table and all(CODE_RE.fullmatch(code) for code in table)
    for code, entry in table.items():
        assert set(codes.FIELDS) <= set(entry), code


def test_no_code_is_ever_removed_or_moved_and_every_code_is_issued():
    table, issued = codes.all_codes(), codes.issued()
    assert {c: e["layer"] for c, e in table.items() if c in issued} == {c: issued[c] for c in table if c in issued}
    assert sorted(set(issued) - set(table)) == [], "a code was removed: codes never go away"
    assert sorted(set(table) - set(issued)) == [], "add new codes to ladder/codes_issued.txt"


def test_every_code_named_in_the_code_exists():
    table = codes.all_codes()
    named = set()
    for path in list((REPO / "plugins").rglob("*.py")) + list((REPO / "src").rglob("*.py")):
        named |= set(CODE_RE.findall(path.read_text()))
    assert sorted(named - set(table)) == []


def _calls(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            yield name, node


def test_every_failing_or_warning_finding_names_its_code():
    missing = []
    for path in JUDGING:
        for name, call in _calls(path):
            keywords = {k.arg for k in call.keywords}
            if name in ("problem", "note") and "code" not in keywords:
                missing.append(f"{path.name}:{call.lineno} {name}()")
            if name == "make" and len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) \
                    and call.args[1].value in ("fail", "warn") and not keywords & {"code", "codes"}:
                missing.append(f"{path.name}:{call.lineno} make({call.args[1].value!r})")
    assert missing == []


def test_a_verdict_that_is_not_a_pass_always_carries_a_code():
    assert "code" not in verdict.make("firmware", "pass")
    assert verdict.make("firmware", "unknown")["code"] == "RB-FIRMWARE-UNKNOWN"
    assert verdict.make("p2p_bandwidth", "skip")["code"] == "RB-P2P-BANDWIDTH-SKIP"
    found = verdict.Findings()
    found.note("a", code="RB-X-NOTE")
    found.problem("b", code="RB-X-PROBLEM")
    out = found.verdict("firmware", None, None)
    assert out["code"] == "RB-X-PROBLEM" and out["codes"] == ["RB-X-PROBLEM", "RB-X-NOTE"]
    again = verdict.recoded(out, "RB-X-MODIFIER")
    assert again["code"] == "RB-X-MODIFIER" and again["codes"] == ["RB-X-MODIFIER", "RB-X-PROBLEM", "RB-X-NOTE"]
