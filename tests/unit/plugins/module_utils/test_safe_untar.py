"""module_utils/safe_untar.py: the one guard every tarball goes through (replay, snapshot, source_build, dkms_module).

Every crafted tarball is built here with the tarfile module. A refused one must raise UnsafeArchive naming the member
and leave tmp_path exactly as it was: the destination folder empty, the sibling folder `outside` untouched."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import safe_untar
from ansible_collections.rigbook.homelab.plugins.module_utils.safe_untar import UnsafeArchive, unpack
from helpers.cli import tree_listing

# --- building tarballs -----------------------------------------------------------------------------------------


def file(name, data=b"x\n", mode=0o644):
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def folder(name):
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def symlink(name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def hardlink(name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info, None


def special(name, kind):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.devmajor, info.devminor = 1, 3  # /dev/null's numbers, for the device nodes
    return info, None


def tarball(path: Path, *members, mode="w:gz") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def cve_2025_4517(dest: Path, outside: Path):
    """The published CVE-2025-4517 pattern: sixteen folders of ~250-character names, each reached by a one-letter
    symlink, so that `a/b/.../p` is short but its real path nearly PATH_MAX long; a link `a/.../p/lll...` (whose
    real path is over PATH_MAX, so Python 3.11.7's realpath() stops following links there) back up to the
    folder; `escape` through it and one `..` more to OUTSIDE (realpath() believes it stays in), and a file
    written through `escape`. On Python 3.11.7, extractall(filter="data") writes OUTSIDE/pwned."""
    room = len(os.path.realpath(dest))
    comp = "d" * min(254, (4096 - room - 2) // 16 - 1)
    steps = "abcdefghijklmnop"
    members, deep = [], ""
    for step in steps:
        members += [folder(os.path.join(deep, comp)), symlink(os.path.join(deep, step), comp)]
        deep = os.path.join(deep, comp)
    link = "/".join(steps) + "/" + "l" * 254
    members += [symlink(link, "/".join([".."] * len(steps))),
                symlink("escape", link + "/../" + outside.name),
                file("escape/pwned", b"written outside\n")]
    return members


# --- the scene: tmp_path/archive.tar.gz, tmp_path/dest (empty), tmp_path/outside/keep -------------------------


@pytest.fixture
def scene(tmp_path):
    (tmp_path / "dest").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("keep\n")
    return tmp_path


def refused(scene: Path, members, reason: str, member=None, **caps) -> UnsafeArchive:
    """Unpacking MEMBERS is refused with REASON (naming MEMBER when given) and leaves SCENE as it was."""
    archive = tarball(scene / "archive.tar.gz", *members)
    before = tree_listing(scene)
    with pytest.raises(UnsafeArchive) as caught:
        unpack(str(archive), str(scene / "dest"), **caps)
    assert reason in str(caught.value), str(caught.value)
    if member is not None:
        assert caught.value.member == member and str(caught.value).startswith(f"member {member!r} ")
    assert tree_listing(scene) == before
    assert list((scene / "dest").iterdir()) == []
    return caught.value


# --- refused ---------------------------------------------------------------------------------------------------


def test_an_absolute_name(scene):
    refused(scene, [file(str(scene / "outside" / "abs"))], "is an absolute path",
            member=str(scene / "outside" / "abs"))


@pytest.mark.parametrize("name", ["../outside/up", "a/../../outside/up", "./a/../b"])
def test_a_dotdot_component(scene, name):
    refused(scene, [file("a/ok"), file(name)], "has a '..' component", member=name)


def test_a_symlink_to_an_absolute_path(scene):
    refused(scene, [symlink("etc", "/etc")], "is a symlink to '/etc', an absolute path", member="etc")


@pytest.mark.parametrize("target", ["..", "../outside", "a/../../outside", "a/b/../../../outside"])
def test_a_symlink_that_climbs_out(scene, target):
    refused(scene, [folder("a"), folder("a/b"), symlink("up", target)], "which leads out of the folder",
            member="up")


def test_the_chain_x_to_dot_then_x_y_up_and_out(scene):
    # x -> . then x/y -> ../../outside: each link looked inside on its own, the old _unsafe() passed them
    refused(scene, [symlink("x", "."), symlink("x/y", "../../outside"), file("x/y/pwned")],
            "lies under the symlink 'x'", member="x/y")


@pytest.mark.parametrize("order", ["link-first", "target-first"])
def test_a_link_that_leaves_through_another_link(scene, order):
    # y -> x/.. is the folder itself lexically; with x -> . it is the folder's parent. Either order.
    links = [symlink("y", "x/../outside"), symlink("x", ".")]
    refused(scene, links if order == "link-first" else links[::-1], "is a symlink to 'x/../outside', which leads out",
            member="y")


def test_the_cve_2025_4517_pattern(scene):
    error = refused(scene, cve_2025_4517(scene / "dest", scene / "outside"), "lies under the symlink 'a'")
    assert error.member.startswith("a/b/c/") and error.member.endswith("l" * 20)


def test_a_member_under_a_symlinked_folder(scene):
    refused(scene, [folder("real"), symlink("sub", "real"), file("sub/f")], "lies under the symlink 'sub'",
            member="sub/f")


def test_a_member_under_a_file(scene):
    refused(scene, [file("f"), file("f/g")], "lies under the file 'f'", member="f/g")


@pytest.mark.parametrize("members,member,reason", [
    ([file("f"), file("f")], "f", "is a file where the archive already has a file"),
    ([file("d/f"), symlink("d", "../outside")], "d", "is a symlink where the archive already has a folder"),
    ([folder("d"), file("d")], "d", "is a file where the archive already has a folder"),
    ([file("f"), folder("f")], "f", "is a folder where the archive already has a file"),
], ids=["file-twice", "link-over-implied-folder", "file-over-folder", "folder-over-file"])
def test_a_name_used_twice(scene, members, member, reason):
    refused(scene, members, reason, member=member)


@pytest.mark.parametrize("target,reason", [
    ("{outside}/keep", "is a hard link to '{outside}/keep', an absolute path"),
    ("../outside/keep", "is a hard link to '../outside/keep', which has a '..' component"),
    ("missing", "is a hard link to 'missing', which is not an earlier file of the archive"),
    ("link", "is a hard link to 'link', which is not an earlier file of the archive"),
    ("later", "is a hard link to 'later', which is not an earlier file of the archive"),
    ("d", "is a hard link to 'd', which is not an earlier file of the archive"),
], ids=["absolute", "dotdot", "not-a-member", "to-a-symlink", "to-a-later-file", "to-a-folder"])
def test_a_hard_link_that_is_not_to_an_earlier_file(scene, target, reason):
    outside = str(scene / "outside")
    members = [folder("d"), symlink("link", "d"), hardlink("h", target.format(outside=outside)), file("later")]
    refused(scene, members, reason.format(outside=outside), member="h")


@pytest.mark.parametrize("kind,reason", [
    (tarfile.CHRTYPE, "is a device node"), (tarfile.BLKTYPE, "is a device node"), (tarfile.FIFOTYPE, "is a FIFO"),
    (b"V", "has the unsupported type b'V'"),
], ids=["char-device", "block-device", "fifo", "volume-label"])
def test_special_members(scene, kind, reason):
    refused(scene, [file("ok"), special("dev/thing", kind)], reason, member="dev/thing")


def test_a_file_named_like_the_folder_itself(scene):
    refused(scene, [file(".")], "is a file that names the folder itself", member=".")


def test_a_symlink_loop_and_an_empty_target(scene):
    refused(scene, [symlink("a", "b"), symlink("b", "a")], "goes through more than 40 symlinks")
    refused(scene, [symlink("a", "")], "is a symlink with an empty target", member="a")


def test_too_many_members(scene):
    refused(scene, [file(f"f{n}") for n in range(6)], "is over the cap of 5 members", member="f5", max_members=5)


def test_too_many_declared_bytes_in_one_small_gzip(scene):
    zeros = bytes(3 << 20)  # 3 MiB of zeros: a few kilobytes of gzip
    refused(scene, [file("ok", b"fine\n"), file("zeros", zeros)], "brings the archive's files over the cap of 1048576",
            member="zeros", max_bytes=1 << 20)
    assert (scene / "archive.tar.gz").stat().st_size < 64 << 10


def test_many_small_files_over_the_byte_cap(scene):
    refused(scene, [file(f"f{n}", bytes(300)) for n in range(4)], "over the cap of 1000 bytes", member="f3",
            max_bytes=1000)


def test_a_header_that_claims_more_than_the_stream_holds(scene):
    # the size field says 3 GiB, the stream stops after the header: refused on the header, nothing read or written
    info = tarfile.TarInfo("huge")
    info.size = 3 << 30
    archive = scene / "liar.tar"
    archive.write_bytes(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape") + bytes(4096))
    before = tree_listing(scene)
    with pytest.raises(UnsafeArchive, match="member 'huge' brings the archive's files over the cap of"):
        unpack(str(archive), str(scene / "dest"), max_bytes=1 << 30)
    assert tree_listing(scene) == before


def test_an_extended_header_larger_than_the_stream_cap(scene):
    # tarfile reads a pax header whole into memory: 4 MiB of it (a few kilobytes of gzip) is over the stream cap
    info = tarfile.TarInfo("f")
    info.pax_headers = {"comment": "a" * (4 << 20)}
    archive = tarball(scene / "pax.tar.gz", (info, b""))
    before = tree_listing(scene)
    with pytest.raises(UnsafeArchive, match="the archive's stream .* is over the cap of"):
        unpack(str(archive), str(scene / "dest"), max_members=10, max_bytes=1 << 20)
    assert tree_listing(scene) == before


# --- accepted --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz", "w:"])
def test_a_good_archive_unpacks_with_its_internal_links(scene, mode):
    archive = tarball(scene / "good.tar", folder("./top"), file("./top/a.txt", b"hello\n"),
                      file("top/run.sh", b"#!/bin/sh\n", mode=0o6777), file("top/sub/deep.txt", b"deep\n"),
                      symlink("top/link", "a.txt"), symlink("top/sub/up", "../a.txt"), symlink("top/self", "."),
                      symlink("top/sub/back", "../self/sub/deep.txt"), hardlink("top/hard", "./top/a.txt"),
                      folder("top"), mode=mode)
    before = tree_listing(scene)
    assert unpack(str(archive), str(scene / "dest")) == 9  # the repeated folder is counted once
    dest = scene / "dest" / "top"
    assert (dest / "a.txt").read_text() == "hello\n" and (dest / "sub" / "deep.txt").read_text() == "deep\n"
    assert os.readlink(dest / "link") == "a.txt" and (dest / "sub" / "up").read_text() == "hello\n"
    assert (dest / "sub" / "back").read_text() == "deep\n"
    assert os.stat(dest / "hard").st_ino == os.stat(dest / "a.txt").st_ino
    assert stat.S_IMODE(os.stat(dest / "run.sh").st_mode) == 0o755  # no setuid/setgid, no group/other write
    assert {k: v for k, v in tree_listing(scene).items() if not k.startswith("dest/")} == before
    assert {k for k in tree_listing(scene) if k.startswith("dest/")} == {
        "dest/top", "dest/top/a.txt", "dest/top/run.sh", "dest/top/sub", "dest/top/sub/deep.txt", "dest/top/link",
        "dest/top/sub/up", "dest/top/self", "dest/top/sub/back", "dest/top/hard"}


def test_a_symlink_to_a_path_not_in_the_archive_stays_inside(scene):
    archive = tarball(scene / "a.tar.gz", symlink("dangling", "not/there"), symlink("top", "."))
    assert unpack(str(archive), str(scene / "dest")) == 2
    assert os.readlink(scene / "dest" / "dangling") == "not/there"


def test_the_destination_must_be_an_empty_folder(scene):
    archive = tarball(scene / "a.tar.gz", file("f"))
    (scene / "dest" / "old").write_text("old\n")
    with pytest.raises(ValueError, match="must be an empty folder"):
        unpack(str(archive), str(scene / "dest"))
    assert (scene / "dest" / "old").read_text() == "old\n" and not (scene / "dest" / "f").exists()


@pytest.mark.parametrize("content", [b"not a tarball at all\n" * 40, b"\x1f\x8b\x08\x00" + b"junk" * 100],
                         ids=["junk", "broken-gzip"])
def test_a_damaged_archive_is_a_tar_error(scene, content):
    archive = scene / "junk.tar.gz"
    archive.write_bytes(content)
    with pytest.raises(tarfile.TarError):
        unpack(str(archive), str(scene / "dest"))
    assert list((scene / "dest").iterdir()) == []


def test_a_truncated_archive_leaves_the_folder_empty(scene):
    archive = tarball(scene / "t.tar", file("a", b"a" * 10000), file("b", b"b" * 10000), mode="w:")
    data = archive.read_bytes()
    archive.write_bytes(data[:512 + 10240 + 512 + 3000])  # b's data cut short
    with pytest.raises(tarfile.TarError):
        unpack(str(archive), str(scene / "dest"))
    assert list((scene / "dest").iterdir()) == []


def test_a_failure_while_writing_empties_the_folder_again(scene):
    archive = tarball(scene / "a.tar.gz", file("first/a", b"a\n"), file("second/" + "n" * 300, b"b\n"))
    before = tree_listing(scene)
    with pytest.raises(OSError, match="File name too long"):
        unpack(str(archive), str(scene / "dest"))
    assert tree_listing(scene) == before and list((scene / "dest").iterdir()) == []


def test_resolves_inside(tmp_path):
    (tmp_path / "dest" / "sub").mkdir(parents=True)
    (tmp_path / "dest2").mkdir()
    (tmp_path / "dest" / "root").symlink_to("/")
    (tmp_path / "dest" / "in").symlink_to("sub")
    inside = safe_untar.resolves_inside
    assert inside(tmp_path / "dest", tmp_path / "dest") and inside(tmp_path / "dest" / "in", tmp_path / "dest")
    assert inside(tmp_path / "dest" / "missing", tmp_path / "dest")
    assert not inside(tmp_path / "dest" / "root", tmp_path / "dest")
    assert not inside(tmp_path / "dest2", tmp_path / "dest")  # a shared prefix is not inside
    assert not inside(tmp_path / "dest" / "sub" / ".." / "..", tmp_path / "dest")


# --- listing: the same checks, nothing written, every file hashed ----------------------------------------------


@pytest.mark.parametrize("members,caps", [
    (lambda s: [file(str(s / "outside" / "abs"))], {}),
    (lambda s: [file("a/ok"), file("a/../../outside/up")], {}),
    (lambda s: [symlink("etc", "/etc")], {}),
    (lambda s: [folder("a"), symlink("up", "a/../../outside")], {}),
    (lambda s: [symlink("y", "x/../outside"), symlink("x", ".")], {}),
    (lambda s: [folder("real"), symlink("sub", "real"), file("sub/f")], {}),
    (lambda s: cve_2025_4517(s / "dest", s / "outside"), {}),
    (lambda s: [file("f"), hardlink("h", "../outside/keep")], {}),
    (lambda s: [file("f"), hardlink("h", str(s / "outside" / "keep"))], {}),
    (lambda s: [file("ok"), special("dev/null", tarfile.CHRTYPE)], {}),
    (lambda s: [file("ok"), special("dev/sda", tarfile.BLKTYPE)], {}),
    (lambda s: [special("pipe", tarfile.FIFOTYPE)], {}),
    (lambda s: [file(f"f{n}") for n in range(6)], {"max_members": 5}),
    (lambda s: [file("ok", b"fine\n"), file("zeros", bytes(3 << 20))], {"max_bytes": 1 << 20}),
    (lambda s: [file(f"f{n}", bytes(300)) for n in range(4)], {"max_bytes": 1000}),
], ids=["absolute", "dotdot", "symlink-absolute", "symlink-out", "link-through-link", "under-a-symlink",
        "cve-2025-4517", "hard-link-dotdot", "hard-link-absolute", "char-device", "block-device", "fifo", "members-cap",
        "bytes-cap", "many-small-files-bytes-cap"])
def test_listing_refuses_what_unpack_refuses_and_writes_nothing(scene, members, caps):
    archive = tarball(scene / "archive.tar.gz", *members(scene))
    before = tree_listing(scene)
    with pytest.raises(UnsafeArchive) as listed:
        safe_untar.listing(str(archive), **caps)
    assert tree_listing(scene) == before
    with pytest.raises(UnsafeArchive) as unpacked:
        unpack(str(archive), str(scene / "dest"), **caps)
    assert (listed.value.member, str(listed.value)) == (unpacked.value.member, str(unpacked.value))
    assert tree_listing(scene) == before


def test_listing_refuses_a_stream_over_its_cap_as_unpack_does(scene):
    info = tarfile.TarInfo("f")
    info.pax_headers = {"comment": "a" * (4 << 20)}
    archive = tarball(scene / "pax.tar.gz", (info, b""))
    with pytest.raises(UnsafeArchive, match="the archive's stream .* is over the cap of"):
        safe_untar.listing(str(archive), max_members=10, max_bytes=1 << 20)


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz", "w:"])
def test_listing_hashes_every_file_as_unpack_would_write_it(scene, mode):
    run = b"#!/bin/sh\necho run\n"
    big = os.urandom((1 << 20) + 4099)  # over listing's 1 MiB read chunk: two reads, the second short
    archive = tarball(scene / "good.tar", folder("./top"), file("./top/a.txt", b"hello\n"),
                      file("top/run.sh", run, mode=0o6777), file("top/sub/big.bin", big), file("top/empty", b""),
                      symlink("top/link", "a.txt"), symlink("top/sub/up", "../a.txt"),
                      hardlink("top/hard", "./top/a.txt"), folder("top"), mode=mode)
    before = tree_listing(scene)

    def hashed(data):
        return {"kind": "file", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    listed = safe_untar.listing(str(archive))
    assert listed == {
        "top": {"kind": "folder"}, "top/a.txt": hashed(b"hello\n"),
        "top/run.sh": hashed(run), "top/sub/big.bin": hashed(big), "top/empty": hashed(b""),
        "top/link": {"kind": "symlink", "target": "a.txt"}, "top/sub/up": {"kind": "symlink", "target": "../a.txt"},
        "top/hard": hashed(b"hello\n")}  # a hard link: its target's
    assert tree_listing(scene) == before
    # the names are the paths unpack() writes for the members (top/sub: a folder the archive implies, no member)
    unpack(str(archive), str(scene / "dest"))
    written = {k[len("dest/"):] for k in tree_listing(scene) if k.startswith("dest/")}
    assert written == set(listed) | {"top/sub"}
    for name, entry in listed.items():
        if entry["kind"] == "file":
            assert hashed((scene / "dest" / name).read_bytes()) == entry


def test_a_damaged_archive_is_a_tar_error_for_listing_too(scene):
    archive = scene / "junk.tar.gz"
    archive.write_bytes(b"\x1f\x8b\x08\x00" + b"junk" * 100)
    with pytest.raises(tarfile.TarError):
        safe_untar.listing(str(archive))
