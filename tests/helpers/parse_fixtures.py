"""Parse fixtures: tests/fixtures/parse/KIND/NAME.txt and the facts each must parse to (KIND/expected.yml), as
pytest params and as checks of a parser."""

from __future__ import annotations

import re

import pytest
import yaml

from helpers.cli import REPO

FIXTURES = REPO / "tests" / "fixtures" / "parse"


# --- parse fixtures (tests/fixtures/parse/KIND/NAME.txt and KIND/expected.yml) --------------------------------

def expected(kind: str) -> dict:
    """NAME -> {path: value} facts each fixture of KIND must parse to."""
    return yaml.safe_load((FIXTURES / kind / "expected.yml").read_text())


def cases(kind: str) -> list:
    """The fixtures of KIND as pytest params (name, facts), each with its name as id."""
    return [pytest.param(name, facts, id=name) for name, facts in expected(kind).items()]


def fixture_names(kind: str) -> set:
    return {p.stem for p in (FIXTURES / kind).glob("*.txt")}


def read(kind: str, name: str) -> str:
    return (FIXTURES / kind / (name + ".txt")).read_text(encoding="utf-8")


def lookup(result, path: str):
    """Resolve 'a.b[2].c' (trailing '#' = length) against a parsed result."""
    want_len = path.endswith("#")
    if want_len:
        path = path[:-1]
    value = result
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            value = value[int(part[1:-1])]
        else:
            value = value[part]
    return len(value) if want_len else value


def check(parse, kind, name, facts):
    """PARSE the fixture KIND/NAME and compare every fact; numbers must come back as numbers."""
    result = parse(read(kind, name))
    for path, want in facts.items():
        got = lookup(result, path)
        assert got == want, f"{name}: {path} = {got!r}, expected {want!r}"
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            assert isinstance(got, (int, float)) and not isinstance(got, bool), path
