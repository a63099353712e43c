# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unpack a tarball into a folder and write nothing outside it (standard library only).

tarfile's extraction filters are not a guard on their own: on Python 3.11.7 `extractall(filter="data")` lets a
chain of symlinks whose real path is longer than PATH_MAX (CVE-2025-4517) write outside the folder, and older
Pythons have no filter at all. `unpack()` therefore never relies on tarfile to decide what is safe:

1. It reads the archive's headers once, through a reader that refuses to decompress more than the caps allow (a
   small gzip that expands to gigabytes, an extended header of gigabytes), and refuses, naming the member:
   an absolute name or one with a `..` component; a member under an earlier symlink member, or under a file; a name
   that repeats an earlier member (two directories excepted); a symlink with an absolute target or one that, once
   the archive's own symlinks are followed, leads out of the folder (or loops); a hard link to anything but an
   earlier regular file of the archive; a device node, a FIFO or any other type; more than MAX_MEMBERS members;
   more than MAX_BYTES of declared file data.
2. Only then does it write, itself, member by member: folders with mkdir (an existing non-folder on the way is
   refused), files opened with O_EXCL|O_NOFOLLOW and copied against a byte budget (at most MAX_BYTES in all,
   whatever the headers say), symlinks and hard links as checked. Modes lose setuid/setgid/sticky and group/other
   write; owners are never changed.
3. Afterwards the real path of every path the archive made must lie in the folder.

DEST must be an empty folder. A refusal raises UnsafeArchive (a ValueError) naming the member and the reason; a
damaged or unreadable archive raises tarfile.TarError or OSError, as tarfile does. Whatever fails after writing
began, DEST is emptied again before the error goes on.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import stat
import tarfile
import zlib

MAX_MEMBERS = 100000
MAX_BYTES = 2 << 30  # 2 GiB of file data
# Beyond the file data, each member may bring this much header stream (its header, a pax or GNU long-name header,
# padding); the decompressed stream may not run past max_bytes + (members + 2) * this + 1 MiB.
HEADER_ALLOWANCE = 8192
# No single read of the stream (tarfile reads a pax or long-name header whole into memory) may be larger.
MAX_READ = 16 << 20
MAX_LINK_HOPS = 40  # symlinks followed while resolving one target (the kernel's limit)
_CHUNK = 1 << 20
_DIR, _FILE, _SYMLINK, _HARDLINK = "folder", "file", "symlink", "hard link"


class UnsafeArchive(ValueError):
    """A tarball refused before (or while) unpacking: MEMBER (its name; None: the archive as a whole) and REASON,
    worded to follow "member NAME" ("is a FIFO")."""

    def __init__(self, member, reason):
        self.member = member
        self.reason = reason
        super().__init__("member %s %s" % (_shown(member), reason) if member is not None else reason)


def _shown(name):
    """NAME quoted for a message (control characters escaped), its middle cut when it is very long."""
    if len(name) > 160:
        name = name[:100] + "..." + name[-50:]
    return repr(name)


def resolves_inside(path, folder):
    """Whether PATH's real path (symlinks followed) is FOLDER's real path or lies under it."""
    real_folder = os.path.realpath(folder)
    real = os.path.realpath(path)
    return os.path.commonpath([real, real_folder]) == real_folder


def unpack(archive, dest, max_members=MAX_MEMBERS, max_bytes=MAX_BYTES):
    """Unpack the tarball ARCHIVE (plain, gzip, bzip2 or xz) into the empty folder DEST after checking every member
    (see the module's docstring). Returns the number of members unpacked."""
    if not os.path.isdir(dest) or os.listdir(dest):
        raise ValueError("unpack: %s must be an empty folder" % dest)
    real_dest = os.path.realpath(dest)
    with open(archive, "rb") as raw:
        stream = _CappedStream(raw, archive, max_bytes + (max_members + 2) * HEADER_ALLOWANCE + (1 << 20))
        try:
            with tarfile.open(fileobj=stream, mode="r:") as tar:
                plan = _checked_plan(tar, max_members, max_bytes)
                try:
                    _write(tar, plan, real_dest, max_bytes)
                    _check_real_paths(plan, real_dest)
                except BaseException:
                    _empty(real_dest)
                    raise
        finally:
            stream.close()
    return len(plan)


# --- reading: a decompressed stream with a ceiling -------------------------------------------------------------

class _CappedStream(object):
    """The decompressed bytes of RAW for tarfile (read, seek, tell), refusing any read past LIMIT or over MAX_READ.
    Damaged compressed data is a tarfile.ReadError."""

    def __init__(self, raw, name, limit):
        self.name = name
        self.limit = limit
        magic = raw.read(6)
        raw.seek(0)
        if magic[:2] == b"\x1f\x8b":
            self._inner = gzip.GzipFile(fileobj=raw, mode="rb")
        elif magic[:3] == b"BZh":
            self._inner = bz2.BZ2File(raw)
        elif magic == b"\xfd7zXZ\x00":
            self._inner = lzma.LZMAFile(raw)
        else:
            self._inner = raw
        self._compressed = self._inner is not raw

    def _too_long(self):
        return UnsafeArchive(None, "the archive's stream (headers and data) is over the cap of %d bytes"
                             % self.limit)

    def read(self, size=-1):
        if size is None or size < 0 or size > MAX_READ:
            raise UnsafeArchive(None, "the archive has a header (or asks for a read) over %d bytes" % MAX_READ)
        try:
            data = self._inner.read(size)
            position = self._inner.tell()
        except (zlib.error, lzma.LZMAError, EOFError, OSError) as exc:
            raise tarfile.ReadError("damaged compressed data: %s" % exc) from exc
        if position > self.limit:
            raise self._too_long()
        return data

    def seek(self, offset, whence=os.SEEK_SET):
        if whence != os.SEEK_SET:
            raise ValueError("the capped stream seeks from its start only")
        if offset > self.limit:
            raise self._too_long()
        try:
            here = self._inner.tell()
            if not self._compressed or offset < here:
                return self._inner.seek(offset)
            while here < offset:  # forward over compressed data in large reads (the modules' seek reads 8 KiB)
                chunk = self._inner.read(min(_CHUNK, offset - here))
                if not chunk:
                    break
                here += len(chunk)
            return here
        except (zlib.error, lzma.LZMAError, EOFError, OSError) as exc:
            raise tarfile.ReadError("damaged compressed data: %s" % exc) from exc

    def tell(self):
        return self._inner.tell()

    def close(self):
        if self._compressed:
            self._inner.close()


# --- checking: every member against a model of the tree the archive makes --------------------------------------

def _parts(member, name, hard_link=False):
    """The components of the archive path NAME (MEMBER's name, or with HARD_LINK the target of MEMBER, a hard
    link): '' and '.' dropped; an absolute path or a '..' component is refused."""
    if name.startswith("/"):
        raise UnsafeArchive(member, "is a hard link to %s, an absolute path" % _shown(name) if hard_link
                            else "is an absolute path")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise UnsafeArchive(member, "is a hard link to %s, which has a '..' component" % _shown(name) if hard_link
                            else "has a '..' component")
    return parts


def _kind(member):
    if member.isdir():
        return _DIR
    if member.issym():
        return _SYMLINK
    if member.islnk():
        return _HARDLINK
    if member.isreg():
        return _FILE
    if member.ischr() or member.isblk():
        raise UnsafeArchive(member.name, "is a device node")
    if member.isfifo():
        raise UnsafeArchive(member.name, "is a FIFO")
    raise UnsafeArchive(member.name, "has the unsupported type %r" % member.type)


def _checked_plan(tar, max_members, max_bytes):
    """[(member, parts, kind, hard link target parts or None)] in archive order, every member checked; nothing is
    written."""
    kinds = {}  # parts -> _DIR / _FILE / _SYMLINK: what the archive puts there (folders named or implied)
    links = {}  # parts -> target, the symlinks
    link_members = {}  # parts -> the symlink member's name as the archive spells it
    plan = []
    declared = 0
    for count, member in enumerate(tar, 1):
        name = member.name
        if count > max_members:
            raise UnsafeArchive(name, "is over the cap of %d members" % max_members)
        parts = _parts(name, name)
        kind = _kind(member)
        if not parts:
            if kind != _DIR:
                raise UnsafeArchive(name, "is a %s that names the folder itself" % kind)
            continue
        for depth in range(1, len(parts)):
            above = kinds.setdefault(parts[:depth], _DIR)
            if above != _DIR:
                raise UnsafeArchive(name, "lies under the %s %s" % (above, _shown("/".join(parts[:depth]))))
        earlier = kinds.get(parts)
        if earlier is not None:
            if earlier == _DIR and kind == _DIR:
                continue
            raise UnsafeArchive(name, "is a %s where the archive already has a %s" % (kind, earlier))
        target = None
        if kind == _SYMLINK:
            if not member.linkname:
                raise UnsafeArchive(name, "is a symlink with an empty target")
            if member.linkname.startswith("/"):
                raise UnsafeArchive(name, "is a symlink to %s, an absolute path" % _shown(member.linkname))
            links[parts] = member.linkname
            link_members[parts] = name
        elif kind == _HARDLINK:
            target = _parts(name, member.linkname, hard_link=True)
            if kinds.get(target) != _FILE:
                raise UnsafeArchive(name, "is a hard link to %s, which is not an earlier file of the archive"
                                    % _shown(member.linkname))
        elif kind == _FILE:
            declared += member.size
            if declared > max_bytes:
                raise UnsafeArchive(name, "brings the archive's files over the cap of %d bytes" % max_bytes)
        kinds[parts] = _FILE if kind == _HARDLINK else kind
        plan.append((member, parts, kind, target))
    for parts, target in links.items():
        if _resolve(links, parts[:-1], target, link_members[parts]) is None:
            raise UnsafeArchive(link_members[parts], "is a symlink to %s, which leads out of the folder"
                                % _shown(target))
    return plan


def _resolve(links, start, target, name):
    """Where TARGET leads from the folder START (parts), following the archive's symlinks LINKS as the kernel would:
    the parts of the path it reaches, or None when it climbs out of the folder. NAME: the link, for messages."""
    reached = list(start)
    todo = list(reversed(target.split("/")))
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not reached:
                return None
            reached.pop()
            continue
        here = tuple(reached) + (part,)
        if here in links:
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise UnsafeArchive(name, "is a symlink that goes through more than %d symlinks (a loop?)"
                                    % MAX_LINK_HOPS)
            todo.extend(reversed(links[here].split("/")))  # relative to the folder the link is in: `reached`
        else:
            reached.append(part)
    return tuple(reached)


# --- writing -----------------------------------------------------------------------------------------------------

def _write(tar, plan, real_dest, max_bytes):
    made = set()  # folders made (or found to be real folders)
    written = 0
    for member, parts, kind, target in plan:
        _make_folders(real_dest, parts if kind == _DIR else parts[:-1], made, member.name)
        path = os.path.join(real_dest, *parts)
        if kind == _FILE:
            written = _write_file(tar, member, path, written, max_bytes)
        elif kind == _SYMLINK:
            os.symlink(member.linkname, path)
        elif kind == _HARDLINK:
            os.link(os.path.join(real_dest, *target), path, follow_symlinks=False)


def _make_folders(real_dest, parts, made, name):
    for depth in range(1, len(parts) + 1):
        if parts[:depth] in made:
            continue
        path = os.path.join(real_dest, *parts[:depth])
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise UnsafeArchive(name, "passes through %s, which is not a folder" % _shown(path)) from None
        made.add(parts[:depth])


def _chunks(tar, member, before, max_bytes, what):
    """MEMBER's data in pieces of at most _CHUNK bytes; UnsafeArchive once BEFORE plus the bytes so far pass
    MAX_BYTES (WHAT: "written" or "read", for the message)."""
    source = tar.extractfile(member)
    total = before
    while True:
        chunk = source.read(_CHUNK)
        if not chunk:
            return
        total += len(chunk)
        if total > max_bytes:
            raise UnsafeArchive(member.name, "brings the bytes %s over the cap of %d" % (what, max_bytes))
        yield chunk


def _write_file(tar, member, path, written, max_bytes):
    """Copy MEMBER's data to PATH (a new file, never through a symlink); returns WRITTEN plus its bytes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(path, flags, 0o600), "wb") as out:
        for chunk in _chunks(tar, member, written, max_bytes, "written"):
            written += len(chunk)
            out.write(chunk)
        mode = member.mode & 0o755 | 0o600
        if not mode & 0o100:
            mode &= ~0o111
        os.fchmod(out.fileno(), mode)
    if isinstance(member.mtime, (int, float)) and 0 <= member.mtime < 1 << 33:
        os.utime(path, (member.mtime, member.mtime))
    return written


def _check_real_paths(plan, real_dest):
    for member, parts, _kind, _target in plan:
        real = os.path.realpath(os.path.join(real_dest, *parts))
        if os.path.commonpath([real, real_dest]) != real_dest:
            raise UnsafeArchive(member.name, "resolves to %s, outside the folder" % _shown(real))


def _empty(real_dest):
    """Remove what unpacking wrote (DEST was empty before)."""
    for name in os.listdir(real_dest):
        path = os.path.join(real_dest, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def listing(archive, max_members=MAX_MEMBERS, max_bytes=MAX_BYTES):
    """What unpack() would make of ARCHIVE, every member checked by the same rules, nothing written: {path: entry},
    PATH the member's name as unpack() writes it ('a/b'), ENTRY {"kind": "file", "size", "sha256"} (a hard link: its
    target's), {"kind": "symlink", "target"} or {"kind": "folder"}. The data of every file is read (and counted
    against MAX_BYTES) to hash it. Raises as unpack() does."""
    found = {}
    with open(archive, "rb") as raw:
        stream = _CappedStream(raw, archive, max_bytes + (max_members + 2) * HEADER_ALLOWANCE + (1 << 20))
        try:
            with tarfile.open(fileobj=stream, mode="r:") as tar:
                read = 0
                for member, parts, kind, target in _checked_plan(tar, max_members, max_bytes):
                    name = "/".join(parts)
                    if kind == _FILE:
                        found[name], read = _hashed(tar, member, read, max_bytes)
                    elif kind == _HARDLINK:
                        found[name] = dict(found["/".join(target)])
                    elif kind == _SYMLINK:
                        found[name] = {"kind": _SYMLINK, "target": member.linkname}
                    else:
                        found[name] = {"kind": _DIR}
        finally:
            stream.close()
    return found


def _hashed(tar, member, read, max_bytes):
    """({"kind": "file", "size", "sha256"} of MEMBER's data, READ plus its bytes), against the same byte budget as
    unpack()."""
    digest, size = hashlib.sha256(), 0
    for chunk in _chunks(tar, member, read, max_bytes, "read"):
        size += len(chunk)
        digest.update(chunk)
    return {"kind": _FILE, "size": size, "sha256": digest.hexdigest()}, read + size


def unpack_or_fail(fail, archive, dest, nothing_done):
    """unpack() for a module: a refused or damaged ARCHIVE calls FAIL(msg) (a module's fail_json, or its own
    wrapper) with one line naming it and NOTHING_DONE ("nothing was built")."""
    try:
        unpack(archive, dest)
    except UnsafeArchive as exc:
        fail("%s: unsafe archive, %s: %s" % (archive, nothing_done, exc))
    except (tarfile.TarError, EOFError, OSError) as exc:
        fail("cannot unpack %s: %s" % (archive, exc))
