"""facts/apt_sources.py: the one parser of a box's apt sources, both formats, as data.

The files are tests/fixtures/adopt/apt/ (their README says where each comes from: amdgpu-install's rocm.list and
amdgpu.list reconstructed from AMD's documented layout, Ubuntu 24.04's ubuntu.sources and its stub sources.list
reconstructed from what Ubuntu installs); the other texts here are written in sources.list(5)'s formats.
"""

from __future__ import annotations

import shutil

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import apt_sources


def _entry(file, fmt, types, uris, suites, components, signed_by, enabled=True):
    return {"file": file, "format": fmt, "types": types, "uris": uris, "suites": suites, "components": components,
            "signed_by": signed_by, "enabled": enabled}


def test_amdgpu_installs_one_line_sources(fixtures):
    rocm = (fixtures / "adopt/apt/rocm.list").read_text()
    assert apt_sources.parse_one_line(rocm, "/etc/apt/sources.list.d/rocm.list") == [_entry(
        "/etc/apt/sources.list.d/rocm.list", "one-line", ["deb"], ["https://repo.radeon.com/rocm/apt/7.1"], ["noble"],
        ["main"], ["/etc/apt/keyrings/rocm.gpg"])]
    [amdgpu] = apt_sources.parse_one_line((fixtures / "adopt/apt/amdgpu.list").read_text())
    assert amdgpu == _entry(None, "one-line", ["deb"], ["https://repo.radeon.com/amdgpu/7.1/ubuntu"], ["noble"],
                            ["main"], ["/etc/apt/keyrings/rocm.gpg"])


def test_one_line_options_comments_and_lines_commented_out():
    text = ("deb [ arch=amd64 signed-by=/usr/share/keyrings/a.gpg,/etc/apt/keyrings/b.gpg ] https://a.example/x "
            "stable main contrib # a comment\n"
            "#deb-src [signed-by=/k.gpg] https://a.example/x stable main\n"
            "# See the manual for more\n"
            "deb https://flat.example/repo ./\n"
            "deb-src [trusted=yes] file:/srv/repo noble\n"
            "not an entry at all\n"
            "deb [signed-by+=/extra.gpg] https://b.example noble main\n")
    assert apt_sources.parse_one_line(text) == [
        _entry(None, "one-line", ["deb"], ["https://a.example/x"], ["stable"], ["main", "contrib"],
               ["/usr/share/keyrings/a.gpg", "/etc/apt/keyrings/b.gpg"]),
        _entry(None, "one-line", ["deb-src"], ["https://a.example/x"], ["stable"], ["main"], ["/k.gpg"], False),
        _entry(None, "one-line", ["deb"], ["https://flat.example/repo"], ["./"], [], []),
        _entry(None, "one-line", ["deb-src"], ["file:/srv/repo"], ["noble"], [], []),
        _entry(None, "one-line", ["deb"], ["https://b.example"], ["noble"], ["main"], ["/extra.gpg"])]


def test_ubuntus_deb822_sources(fixtures):
    found = apt_sources.parse_deb822((fixtures / "adopt/apt/ubuntu.sources").read_text(), "/x/ubuntu.sources")
    assert found == [
        _entry("/x/ubuntu.sources", "deb822", ["deb"], ["http://archive.ubuntu.com/ubuntu/"],
               ["noble", "noble-updates", "noble-backports"], ["main", "restricted", "universe", "multiverse"],
               ["/usr/share/keyrings/ubuntu-archive-keyring.gpg"]),
        _entry("/x/ubuntu.sources", "deb822", ["deb"], ["http://security.ubuntu.com/ubuntu/"], ["noble-security"],
               ["main", "restricted", "universe", "multiverse"], ["/usr/share/keyrings/ubuntu-archive-keyring.gpg"])]


def test_deb822_an_inline_key_enabled_no_continued_values_and_stanzas_without_uris():
    text = ("# rigbook's own\nTypes: deb deb-src\nURIs: https://a.example/x\n  https://mirror.example/x\n"
            "Suites: noble\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBG\n"
            " -----END PGP PUBLIC KEY BLOCK-----\n\n"
            "Enabled: no\nTypes: deb\nURIs: https://b.example\nSuites: u\nSigned-By: 0123ABCD 4567EF01\n\n"
            "X-Repolib-Name: only a name\n\n\n"
            "types: deb\nuris: https://c.example\nsuites: v\nenabled: yes\n")
    assert apt_sources.parse_deb822(text) == [
        _entry(None, "deb822", ["deb", "deb-src"], ["https://a.example/x", "https://mirror.example/x"], ["noble"],
               ["main"], [apt_sources.INLINE_KEY]),
        _entry(None, "deb822", ["deb"], ["https://b.example"], ["u"], [], ["0123ABCD", "4567EF01"], False),
        _entry(None, "deb822", ["deb"], ["https://c.example"], ["v"], [], [])]


def test_what_a_box_wrote_comes_back_bounded():
    hostile = ("deb [signed-by=/k\x1b[2J.gpg] https://a.example/" + "x" * 6000 + " noble\x07 main\n"
               + "deb https://b.example s c\n" * 600)
    found = apt_sources.parse_one_line(hostile)
    assert len(found) == apt_sources.MAX_ENTRIES
    assert found[0]["signed_by"] == ["/k[2J.gpg"] and found[0]["suites"] == ["noble"]
    assert len(found[0]["uris"][0]) == 4096
    many = "Types: deb\nURIs: https://a.example\nSuites: " + " ".join(f"s{n}" for n in range(100)) + "\n"
    assert len(apt_sources.parse_deb822(many)[0]["suites"]) == apt_sources.MAX_ITEMS
    assert apt_sources.parse_one_line(None) == [] and apt_sources.parse_deb822("") == []


def test_read_all_reads_what_apt_reads_in_its_order(tmp_path, fixtures):
    lists = tmp_path / "etc/apt/sources.list.d"
    lists.mkdir(parents=True)
    shutil.copy(fixtures / "adopt/apt/sources.list", tmp_path / "etc/apt/sources.list")
    for name in ("rocm.list", "amdgpu.list", "ubuntu.sources"):
        shutil.copy(fixtures / "adopt/apt" / name, lists / name)
    (lists / "rocm.list.save").write_text("deb https://old.example x main\n")  # apt ignores these names
    (lists / "odd name.list").write_text("deb https://odd.example x main\n")
    (lists / "rocm.list.distUpgrade").write_text("deb https://old.example y main\n")
    found = apt_sources.read_all(str(tmp_path))
    assert [(e["file"], e["uris"][0]) for e in found] == [
        ("/etc/apt/sources.list.d/amdgpu.list", "https://repo.radeon.com/amdgpu/7.1/ubuntu"),
        ("/etc/apt/sources.list.d/rocm.list", "https://repo.radeon.com/rocm/apt/7.1"),
        ("/etc/apt/sources.list.d/ubuntu.sources", "http://archive.ubuntu.com/ubuntu/"),
        ("/etc/apt/sources.list.d/ubuntu.sources", "http://security.ubuntu.com/ubuntu/")]
    assert apt_sources.source_files(str(tmp_path)) == [
        "/etc/apt/sources.list", "/etc/apt/sources.list.d/amdgpu.list", "/etc/apt/sources.list.d/rocm.list",
        "/etc/apt/sources.list.d/ubuntu.sources"]
    assert apt_sources.read_all(str(tmp_path / "bare")) == []
