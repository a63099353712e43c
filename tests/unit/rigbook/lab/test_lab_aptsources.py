"""Reading this machine's apt sources (one-line and deb822) for debootstrap and the lab hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigbook.errors import UserError
from rigbook.lab import aptsources

# Example archive names below are placeholders under .invalid (RFC 2606), never contacted.
DEB822 = """\
Types: deb
# a comment inside a paragraph
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://security.invalid/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://off.invalid/debian
Suites: bookworm-backports
Components: main
Enabled: no

Types: deb
URIs: https://vendor.invalid/node
Suites: nodistro
Components: main
Architectures: amd64
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----
"""

ONE_LINE = """\
# the main archive
deb [arch=amd64 signed-by=/usr/share/keyrings/a.gpg] http://mirror.invalid/debian bookworm main non-free-firmware
deb-src http://mirror.invalid/debian bookworm main
deb http://mirror.invalid/debian bookworm-updates main   # trailing comment
deb http://security.invalid/debian-security bookworm-security main
deb https://vendor.invalid/apt cloud-sdk-bookworm main
deb broken
"""


def test_one_line_format():
    sources = aptsources.parse_one_line(ONE_LINE, "x.list")
    assert [(s.types, s.suites) for s in sources] == [
        (["deb"], ["bookworm"]), (["deb-src"], ["bookworm"]), (["deb"], ["bookworm-updates"]),
        (["deb"], ["bookworm-security"]), (["deb"], ["cloud-sdk-bookworm"])]
    first = sources[0]
    assert first.uris == ["http://mirror.invalid/debian"]
    assert first.components == ["main", "non-free-firmware"]
    assert first.signed_by == "/usr/share/keyrings/a.gpg"
    assert first.options["Architectures"] == "amd64"
    assert sources[2].components == ["main"]  # the comment is not a component


def test_deb822_format():
    sources = aptsources.parse_deb822(DEB822, "debian.sources")
    assert [s.suites for s in sources] == [["bookworm", "bookworm-updates"], ["bookworm-security"], ["nodistro"]]
    assert sources[0].components == ["main", "contrib"]
    assert sources[1].types == ["deb", "deb-src"]
    assert sources[2].signed_by.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF")


def test_for_suite_keeps_every_companion_suite_and_nothing_else():
    sources = aptsources.parse_deb822(DEB822) + aptsources.parse_one_line(ONE_LINE)
    picked = aptsources.for_suite(sources, "bookworm")
    suites = [s for src in picked for s in src.suites]
    assert suites == ["bookworm", "bookworm-updates", "bookworm-security", "bookworm", "bookworm-updates",
                      "bookworm-security"]
    assert all(src.types == ["deb"] for src in picked)  # deb-src left out
    assert "nodistro" not in suites and "cloud-sdk-bookworm" not in suites


def test_old_style_security_suite():
    sources = aptsources.parse_one_line("deb http://security.invalid/ bookworm/updates main\n")
    assert aptsources.for_suite(sources, "bookworm")[0].suites == ["bookworm/updates"]


def test_mirror_is_the_source_of_the_suite_itself():
    sources = aptsources.parse_deb822(DEB822)
    mirror = aptsources.mirror_for(sources, "bookworm")
    assert mirror.uris == ["http://mirror.invalid/debian"]
    assert mirror.suites == ["bookworm"] and mirror.components == ["main", "contrib"]
    assert mirror.signed_by == "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_no_source_for_the_suite_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("RIGBOOK_LAB_MIRROR", raising=False)
    sources = aptsources.parse_one_line("deb http://mirror.invalid/debian trixie main\n")
    with pytest.raises(UserError, match="no apt source for Debian bookworm"):
        aptsources.mirror_for(sources, "bookworm")


def test_mirror_override(monkeypatch):
    monkeypatch.setenv("RIGBOOK_LAB_MIRROR", "file:///srv/mirror")
    assert aptsources.mirror_for([], "bookworm").uris == ["file:///srv/mirror"]


def test_read_sources_reads_what_apt_reads(tmp_path: Path):
    (tmp_path / "sources.list").write_text("deb http://mirror.invalid/debian bookworm main\n")
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(DEB822)
    (d / "extra.list").write_text("deb http://extra.invalid/debian bookworm-backports main\n")
    (d / "old.list.disabled").write_text("deb http://no.invalid/debian bookworm main\n")
    (d / "notes.txt").write_text("deb http://no.invalid/debian bookworm main\n")
    sources = aptsources.read_sources(tmp_path)
    assert [Path(s.file).name for s in sources] == ["sources.list", "debian.sources", "debian.sources",
                                                    "debian.sources", "extra.list"]
    assert not [s for s in sources if "no.invalid" in s.uris[0]]


def test_rendered_deb822_reads_back_the_same():
    sources = aptsources.for_suite(aptsources.parse_deb822(DEB822) + aptsources.parse_one_line(ONE_LINE),
                                   "bookworm")
    text = aptsources.render_deb822(sources)
    again = aptsources.parse_deb822(text)
    assert [(s.types, s.uris, s.suites, s.components, s.options) for s in again] == [
        (s.types, s.uris, s.suites, s.components, s.options) for s in sources]
    inline = aptsources.parse_deb822(DEB822)[2]
    assert aptsources.parse_deb822(aptsources.render_deb822([inline]))[0].signed_by == inline.signed_by


def test_this_machine_has_a_bookworm_source_or_says_so():
    try:
        mirror = aptsources.mirror_for(aptsources.read_sources(), "bookworm")
    except UserError as exc:
        assert "no apt source" in str(exc)
    else:
        assert mirror.uris[0].split(":")[0] in ("http", "https", "file")
