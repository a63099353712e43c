"""This machine's apt sources: where debootstrap gets the lab's Debian, and what the lab hosts use.

Reads /etc/apt/sources.list and sources.list.d/*.list (one-line format) and *.sources (deb822),
the files apt itself reads. No archive host name is written in rigbook: the mirror is whatever
this machine uses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rigbook.errors import UserError

APT_DIR = Path("/etc/apt")


@dataclass
class Source:
    types: list
    uris: list
    suites: list
    components: list
    options: dict = field(default_factory=dict)  # deb822 field name -> value (Signed-By, ...)
    file: str = ""

    @property
    def signed_by(self):
        return self.options.get("Signed-By")


def parse_one_line(text: str, file: str = "") -> list:
    """`deb [opt=v ...] URI SUITE [COMPONENT ...]` lines (comments and deb-src kept out)."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind not in ("deb", "deb-src"):
            continue
        options = {}
        rest = rest.strip()
        if rest.startswith("["):
            opts, _, rest = rest[1:].partition("]")
            for opt in opts.split():
                key, _, value = opt.partition("=")
                name = {"signed-by": "Signed-By", "arch": "Architectures", "trusted": "Trusted"}.get(key, key)
                options[name] = value.replace(",", " ") if name == "Architectures" else value
        words = rest.split()
        if len(words) < 2:
            continue
        out.append(Source([kind], [words[0]], [words[1]], words[2:], options, file))
    return out


def _paragraphs(text: str):
    """deb822 paragraphs as {field: value}; continuation lines joined with newlines."""
    para, key = {}, None
    for raw in text.splitlines() + [""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if para:
                yield para
            para, key = {}, None
            continue
        if raw[0] in " \t" and key:
            value = raw.strip()
            value = "" if value == "." else value
            para[key] = f"{para[key]}\n{value}" if para[key] else value
            continue
        key, _, value = raw.partition(":")
        key = key.strip()
        para[key] = value.strip()


def parse_deb822(text: str, file: str = "") -> list:
    out = []
    for para in _paragraphs(text):
        fields = {k.lower(): v for k, v in para.items()}
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if not fields.get("types") or not fields.get("uris") or not fields.get("suites"):
            continue
        options = {k: v for k, v in para.items()
                   if k.lower() not in ("types", "uris", "suites", "components", "enabled")}
        out.append(Source(fields["types"].split(), fields["uris"].split(), fields["suites"].split(),
                          fields.get("components", "").split(), options, file))
    return out


def read_sources(apt_dir: Path = APT_DIR) -> list:
    """Every enabled source apt would read on this machine, in apt's file order."""
    files = []
    main = apt_dir / "sources.list"
    if main.is_file():
        files.append(main)
    d = apt_dir / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    out = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        parse = parse_deb822 if path.suffix == ".sources" else parse_one_line
        out += parse(text, str(path))
    return out


def _suite_matches(suite: str, wanted: str) -> bool:
    return suite == wanted or suite.startswith(wanted + "-") or suite.startswith(wanted + "/")


def for_suite(sources: list, suite: str) -> list:
    """The binary sources of SUITE and its companions (-updates, -security, /updates, -backports)."""
    out = []
    for src in sources:
        suites = [s for s in src.suites if _suite_matches(s, suite)]
        if "deb" in src.types and suites:
            out.append(Source(["deb"], src.uris, suites, src.components, dict(src.options), src.file))
    return out


def mirror_for(sources: list, suite: str) -> Source:
    """The source debootstrap should use: the first that carries SUITE itself over http(s)/file."""
    override = os.environ.get("RIGBOOK_LAB_MIRROR")
    if override:
        return Source(["deb"], [override], [suite], ["main"])
    for src in for_suite(sources, suite):
        uris = [u for u in src.uris if u.split(":", 1)[0] in ("http", "https", "file")]
        if suite in src.suites and uris:
            return Source(["deb"], uris[:1], [suite], src.components or ["main"], dict(src.options), src.file)
    raise UserError(
        f"no apt source for Debian {suite} on this machine (looked in /etc/apt/sources.list and "
        f"sources.list.d/): add one, or set RIGBOOK_LAB_MIRROR to a {suite} archive URL"
    )


def render_deb822(sources: list) -> str:
    """Sources as a deb822 .sources file (what the lab hosts get)."""
    blocks = []
    for src in sources:
        lines = [f"Types: {' '.join(src.types)}", f"URIs: {' '.join(src.uris)}",
                 f"Suites: {' '.join(src.suites)}"]
        if src.components:
            lines.append(f"Components: {' '.join(src.components)}")
        for key, value in src.options.items():
            first, *rest = str(value).split("\n")
            lines.append(f"{key}: {first}")
            lines += [f" {r}" if r else " ." for r in rest]
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)
