"""The README and docs stand alone: no pointer to notes outside the repository, every parse kind documented."""

from __future__ import annotations

import re
from pathlib import Path

from rigbook import parse_cmd

ROOT = Path(__file__).resolve().parents[3]
# Notes that live outside the repository (the project's working notes): the repository must not send readers there.
OUTSIDE = re.compile(
    r"/work/|PARSE-FORMATS|DESIGN\.md|research (?:notes|[A-F]\d)|next-stage-facts|p2p-stack-facts|anchors-healthchecks"
    r"|anchors-provisioning|engine-library-facts"
)


def _documents():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted((ROOT / "roles").glob("*/README.md"))
    yield from sorted((ROOT / "roles").glob("*/meta/*.yml"))
    yield from sorted((ROOT / "tests" / "fixtures").glob("*/SOURCES.md"))
    yield from sorted((ROOT / "tests" / "fixtures").glob("*/README.md"))
    yield from sorted((ROOT / "plugins").rglob("*.py"))
    yield from sorted((ROOT / "src" / "rigbook").rglob("*.py"))


def test_readme_and_docs_point_at_nothing_outside_the_repository():
    found = []
    for path in _documents():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_docs_paths_the_readme_and_docs_name_exist():
    missing = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for ref in re.findall(r"\b((?:docs|tests/fixtures/[\w-]+)/[\w.-]+\.(?:md|png))\b", path.read_text()):
            if not (ROOT / ref).is_file():
                missing.append(f"{path.relative_to(ROOT)} names {ref}")
    assert not missing, "\n".join(missing)


def test_docs_parse_formats_has_a_section_per_parse_kind():
    text = (ROOT / "docs" / "parse-formats.md").read_text()
    sections = re.findall(r"^## (\S+)\s*$", text, re.M)
    assert [kind for kind in parse_cmd.KINDS if kind not in sections] == []
