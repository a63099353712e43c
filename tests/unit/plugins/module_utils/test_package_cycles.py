"""The packages of module_utils import each other in one direction only: no package cycle.

The layers, lowest first: facts (reads of the box) - parse, probe - judges (with the verdict, the expectations
and the baseline comparison) - serve - the top-level files (the host model, the pin table, apt, ...) - collect -
ladder (the registry, the climb, the error watch, health). Every import, at module level or inside a function,
counts.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4] / "plugins" / "module_utils"
TOP = "(top-level files)"


def _package(dotted):
    first = dotted.split(".")[0]
    return first if (ROOT / first).is_dir() else TOP


def package_graph():
    """{package: {imported package: [file, ...]}} of module_utils' own imports."""
    graph = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).parts
        mine = rel[0] if len(rel) > 1 else TOP
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and "module_utils" in node.module.split(".")):
                continue
            after = node.module.split(".module_utils", 1)[1].lstrip(".")
            for other in [_package(after)] if after else [_package(alias.name) for alias in node.names]:
                if other != mine:
                    graph[mine][other].append(path.relative_to(ROOT).as_posix())
    return graph


def cycles(graph):
    """Every package that reaches itself again, with the path found."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph.get(node, {})):
                if nxt == start:
                    found.append(" -> ".join(trail + [start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
    return found


def test_no_package_of_module_utils_imports_its_way_back_to_itself():
    assert cycles(package_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"judges": {"ladder": ["x"]}, "ladder": {"judges": ["y"]}}) == ["judges -> ladder -> judges",
                                                                                "ladder -> judges -> ladder"]


def test_facts_import_nothing_above_them():
    assert dict(package_graph().get("facts", {})) == {}
