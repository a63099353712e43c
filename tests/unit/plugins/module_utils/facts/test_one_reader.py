"""The guard of the house rule "one reader per host fact": each kind of read of a box lives in its one file.

Every Python file under plugins/ and src/rigbook is parsed (docstrings and the modules' DOCUMENTATION, EXAMPLES and
RETURN texts left out) and every role task file is read; a read found outside its one place fails the test with the
file and line. ALLOWED names the few places that are something else, each with why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[5]
FACTS = "plugins/module_utils/facts/"
DOC_NAMES = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
STATUSES = {"pass", "warn", "fail", "unknown"}


def python_files():
    for top in ("plugins", "src/rigbook"):
        for path in sorted((REPO / top).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(), str(path))


def _docstring_nodes(tree):
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOC_NAMES for t in node.targets):
            skip.add(id(node.value))
    return skip


def strings(tree):
    """(line, text) of every string constant that is code, not documentation."""
    skip = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module


def calls(tree):
    """(line, dotted name) of every call, e.g. "module.run_command", "os.replace", "hashlib.sha256"."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts, func = [], node.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                parts.append(func.id)
            yield node.lineno, ".".join(reversed(parts)), node


def literal_sets(tree, ranked=False):
    """(line, set of strings) of every tuple/list/set literal of strings and every dict's keys (with RANKED only the
    dicts whose values are all numbers: an order, not a mapping to words)."""
    for node in ast.walk(tree):
        items = None
        if isinstance(node, ast.Dict):
            numbers = all(isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) for v in node.values)
            items = node.keys if (numbers or not ranked) else None
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        if items:
            found = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
            yield node.lineno, found


def _found(rule):
    out = []
    for rel, tree in python_files():
        if rel in rule["home"]:
            continue
        for line, what in rule["finder"](tree):
            out.append(f"{rel}:{line}: {what}")
    return out


def _subprocess(tree):
    for line, name in imports(tree):
        if name == "subprocess" or name.startswith("subprocess."):
            yield line, "imports subprocess (commands run through facts/runner.py)"


def _run_command(tree):
    for line, name, _node in calls(tree):
        if name.endswith(".run_command"):
            yield line, f"{name} (commands run through facts/runner.py)"


def _sha256_file_loop(tree):
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        incremental = any(name == "hashlib.sha256" and not node.args for _line, name, node in calls(func))
        names = {name for _line, name, _node in calls(func)}
        if incremental and ("open" in names or "iter" in names):
            yield func.lineno, f"{func.name} hashes a file (facts/files.sha256_of)"


def _atomic_write(tree):
    for line, name, _node in calls(tree):
        if name in ("os.replace", "os.rename") or name.endswith(".atomic_move"):
            yield line, f"{name} (the one atomic write is facts/files.write_atomic)"


def _word(pattern, why):
    def finder(tree):
        for line, value in strings(tree):
            if re.search(pattern, value):
                yield line, f"{value[:60]!r}: {why}"
    return finder


def _dpkg(tree):
    for line, value in strings(tree):
        if value == "dpkg-query" or "db:Status" in value:
            yield line, f"{value!r}: dpkg read (facts/packages)"
    for line, name, node in calls(tree):
        if name.split(".")[-1] in ("open", "read_text", "_read", "path", "join", "_under"):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and "var/lib/dpkg/status" in str(arg.value):
                    yield line, "reads dpkg's status file (facts/packages)"


def _status_order(tree):
    for line, found in literal_sets(tree, ranked=True):
        if STATUSES <= found:
            yield line, "a status order (judges/verdict.py SEVERITY is the one)"


def _systemctl_show(tree):
    for line, found in literal_sets(tree):
        if {"systemctl", "show"} <= found:
            yield line, "runs systemctl show (facts/systemd.show)"
    for line, value in strings(tree):
        if re.search(r"systemctl show", value) and not value.startswith(("systemctl show %s failed", )):
            yield line, f"{value[:60]!r}: systemctl show (facts/systemd)"


def _collectives_name(tree):
    for line, name, node in calls(tree):
        if name.split(".")[-1] in ("startswith", "endswith", "match", "search", "compile", "fullmatch"):
            for arg in ast.walk(node):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and re.search(
                        r"lib[nr]ccl", arg.value):
                    yield line, "decides NCCL/RCCL by name (facts/libraries.collective_kind)"


RULES = {
    "runner: subprocess": {"home": {FACTS + "runner.py"}, "finder": _subprocess},
    "runner: run_command": {"home": set(), "finder": _run_command},
    "sha256 file loop": {"home": {FACTS + "files.py"}, "finder": _sha256_file_loop},
    "atomic write": {"home": {FACTS + "files.py"}, "finder": _atomic_write},
    "systemctl show": {"home": {FACTS + "systemd.py"}, "finder": _systemctl_show},
    "dpkg reader": {"home": {FACTS + "packages.py"}, "finder": _dpkg},
    "boot-only words": {"home": {FACTS + "kernel.py"}, "finder": _word(r"^BOOT_IMAGE$", "facts/kernel.BOOT_KEYS")},
    "API key reader": {"home": {FACTS + "api_key.py"},
                       "finder": lambda tree: ((n.lineno, f"{n.name} reads an API key (facts/api_key)")
                                               for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                                               and "api_key" in n.name and "open" in
                                               {c for _l, c, _n in calls(n)})},
    "NCCL/RCCL identity": {"home": {FACTS + "libraries.py"}, "finder": _collectives_name},
    "archive name": {"home": {FACTS + "builds.py"},
                     "finder": _word(r"%s-%s-%s\.tar|\{64\}\)?\\?\.tar|-ID-SHA256", "facts/builds.archive_name")},
    "stamp names": {"home": {FACTS + "builds.py"},
                    "finder": _word(r"^\.rigbook-(build\.json|venv\.json|source-sha256|bundled)$", "facts/builds")},
    "status order": {"home": {"plugins/module_utils/judges/verdict.py"}, "finder": _status_order},
    "Secure Boot reader": {"home": {FACTS + "secure_boot.py"},
                           "finder": _word(r"^SecureBoot-8be4df61|^--sb-state$|^--test-key$",
                                           "facts/secure_boot")},
}
# Places that look like a second reader and are something else.
ALLOWED = {
    # The health metrics' published numeric encoding of a status (docs/health.md, the alert rules): a value, not
    # an order; changing it would break every user's alerts.
    "status order": {"plugins/module_utils/ladder/health.py"},
    # The lab's hand-made box: the shell its owner types on it (dpkg-query | grep), played by the lab, not a read
    # of rigbook's.
    "dpkg reader": {"src/rigbook/lab/handmade.py"},
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_kind_of_read_lives_in_its_one_file(name):
    rule = dict(RULES[name])
    rule["home"] = set(rule["home"]) | ALLOWED.get(name, set())
    assert _found(rule) == []


def test_the_group_build_role_takes_archive_names_from_the_modules():
    tasks = "\n".join(p.read_text() for p in sorted((REPO / "roles").rglob("tasks/*.yml")))
    assert not re.search(r"-\*\.tar\.gz|\.tar\.gz\"", tasks)


def test_the_guard_finds_what_it_guards():
    planted = ast.parse("import subprocess\nimport hashlib, os\n"
                        "def h(p):\n    d = hashlib.sha256()\n"
                        "    with open(p, 'rb') as f:\n        d.update(f.read())\n"
                        "os.replace('a', 'b')\nx = {'pass': 0, 'warn': 1, 'fail': 2, 'unknown': 3}\n"
                        "y = 'x'.startswith(('libnccl.so', 'librccl.so'))\nz = ['systemctl', 'show', 'u']\n"
                        "m = ['mokutil', '--sb-state']\n")
    for name in ("runner: subprocess", "sha256 file loop", "atomic write", "status order", "NCCL/RCCL identity",
                 "systemctl show", "Secure Boot reader"):
        assert list(RULES[name]["finder"](planted)), name
