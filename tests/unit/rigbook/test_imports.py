"""Imports go at the top of the module; one inside a function says why it is there.

A function-local import is kept only where it has to be: a module measured expensive to import that a command
reaching this code may not need (benchmarks/cli_speed.py; e.g. ansible_runner, rich, paramiko, jsonschema), an
import cycle, a package importable only once link_collection() has run, or a package that may be missing (torch on
a box, mitogen, jsonschema). Each says so in a `# deferred: WHY` comment on its own line, or in the comment lines
right above it; one comment above a run of consecutive import statements (blank lines between them allowed, as
isort writes its sections) covers the run. Every other import is hoisted.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROOTS = (REPO / "src" / "rigbook", REPO / "plugins")
MARK = "# deferred:"


def _statement_lists(node):
    """Every list of statements directly under NODE: its body, else and finally (an except clause or a match case
    is a node of its own, with its own body)."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block


def _comment_above(lines: list, lineno: int) -> list:
    """The comment lines right above line LINENO (1-based), nearest first."""
    found, index = [], lineno - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        found.append(lines[index].strip())
        index -= 1
    return found


def undocumented_local_imports(source: str, name: str = "<source>") -> list:
    """"NAME:LINE: STATEMENT" of each import inside a function of SOURCE without a `# deferred:` comment."""
    lines = source.splitlines()
    tree = ast.parse(source)
    bad = []

    def check_block(block):
        run_start = None
        for stmt in block:
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                run_start = None
                continue
            if run_start is None:
                run_start = stmt.lineno
            marked = MARK in lines[stmt.lineno - 1] or any(
                text.startswith(MARK) for start in {stmt.lineno, run_start} for text in _comment_above(lines, start))
            if not marked:
                bad.append(f"{name}:{stmt.lineno}: {lines[stmt.lineno - 1].strip()}")

    def visit(node, in_function):
        if in_function:
            for block in _statement_lists(node):
                check_block(block)
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return bad


def test_every_function_local_import_says_why_it_is_not_at_the_top():
    bad = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            bad += undocumented_local_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert bad == [], ("function-local imports without a `# deferred: WHY` comment (hoist them to the top of the "
                       "module, or say why they cannot be):\n" + "\n".join(bad))


def test_the_checker_finds_an_undocumented_local_import_and_accepts_documented_ones():
    source = '''
import os


def plain():
    import json

    return json


def marked():
    # deferred: rich costs ~25 ms at start-up (benchmarks/cli_speed.py)
    import rich
    import rich.table

    from rigbook import display

    print(display)
    import yaml  # deferred: yaml costs ~13 ms
    import jsonschema
    try:
        # deferred: optional package
        # (the reason may run over two lines)
        import torch
    except ImportError:
        import sys

        class Inner:
            def method(self):
                from pathlib import Path

                return Path
    return rich, yaml, jsonschema, torch, sys, Inner
'''
    assert undocumented_local_imports(source) == [
        "<source>:6: import json",
        "<source>:20: import jsonschema",
        "<source>:26: import sys",
        "<source>:30: from pathlib import Path",
    ]
