# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evidence root, bounded file reads, the sha256 of a file and the one atomic write (standard library only).

The evidence root is "/" on a real box, or a recorded tree laid out the same way (lab host, snapshot, test
fixture: docs/evidence.md). Every reader takes paths under it from `path`.

sha256: `sha256_of(PATH)` hashes the file PATH names now (links followed) and raises OSError when it cannot be
read (missing, a folder, no permission) - a caller never gets a digest of nothing. `digest(PATH)` is the same as
(hex, None) or (None, why) for callers that report rather than fail. A path that /proc printed with " (deleted)"
names a file that is gone: the name may now hold another file, so `digest` refuses it (facts/libraries.py reads
such a mapping through /proc/PID/map_files instead).

The atomic write: `write_atomic(PATH, DATA)` writes a temporary file in PATH's folder (created exclusively, so no
link is followed) and renames it over PATH, so a reader sees the old file or the new one, never a part; a PATH that
is a symbolic link is refused, never written through. With sync_folder=True the folder is synced after the rename
too (`fsync_folder`), so the new name itself survives a power cut (the controller's shared state files).

The no-follow reader: what a box's local users can change (a venv's files, a folder named by a process) is read by
`open_nofollow(ROOT, REL)` and the readers over it (`open_regular`, `read_nofollow`, `json_nofollow`,
`sha256_nofollow`, `stat_nofollow`, `list_nofollow`): every component of REL is opened with O_NOFOLLOW relative to
its parent's descriptor, so a link anywhere on the way (planted before the read or swapped in while it runs) is
refused, never followed; the file opened is fstat-ed (a regular file, at most a size, with OWNER: a file OWNER could
read itself) and what is read is that file. It is opened O_NONBLOCK, so a FIFO is refused, not waited on. ROOT itself
is the caller's (the evidence root, a folder the inventory named) and is opened as it is.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile

CHUNK = 1 << 20
MAX_TEXT = 16 << 20  # a text fact (sysfs attribute, /proc file, config, stamp) longer than this is not read whole
DELETED = " (deleted)"
MAX_ENTRIES = 100000  # names of one folder list_nofollow reads
NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def path(root, *parts):
    """PARTS joined under the evidence ROOT ("/" when empty)."""
    return os.path.join(root or "/", *parts)


def is_live(root):
    """True when ROOT is the running system's "/", not a recorded tree."""
    return os.path.realpath(root or "/") == "/"


def read_text(file_path, limit=MAX_TEXT, strip=True):
    """The file's text (UTF-8, undecodable bytes replaced; at most LIMIT characters), stripped unless STRIP is
    False; None when it does not exist or cannot be read."""
    try:
        with open(file_path, "rb") as handle:
            data = handle.read(limit)
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    return text.strip() if strip else text


def read_json(file_path, limit=MAX_TEXT):
    """(data, error) of a JSON file: (None, None) when it does not exist; (None, why) when unreadable or garbled;
    a file over LIMIT bytes is refused."""
    try:
        with open(file_path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "cannot read %s: %s" % (file_path, exc.strerror or exc)
    if len(data) > limit:
        return None, "%s is larger than %d bytes" % (file_path, limit)
    return _json_of(data, file_path)


def _json_of(data, file_path):
    try:
        return json.loads(data.decode("utf-8")), None
    except ValueError as exc:
        return None, "%s is not JSON: %s" % (file_path, exc)


def _hash(handle):
    digest = hashlib.sha256()
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_of(file_path):
    """The sha256 (hex) of the file FILE_PATH names (links followed), read in 1 MiB chunks. Raises OSError when it
    cannot be read: a missing, unreadable or non-regular file has no digest."""
    with open(file_path, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError("not a regular file: %s" % file_path)
        return _hash(handle)


def digest(file_path):
    """(sha256, None), or (None, why) when FILE_PATH cannot be read or is a deleted file /proc named."""
    if file_path.endswith(DELETED):
        return None, "%s was deleted; its name may now hold another file" % file_path[: -len(DELETED)]
    try:
        return sha256_of(file_path), None
    except OSError as exc:
        return None, "cannot read %s: %s" % (file_path, getattr(exc, "strerror", None) or exc)


def readable_by_anyone(file_path):
    """True when any user of the box can read the regular file FILE_PATH (links followed, as a reader would): the file
    is world-readable and every folder above it world-searchable. A file that cannot be stat-ed is not."""
    try:
        st = os.stat(file_path)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IROTH:
            return False
        folder = os.path.dirname(os.path.realpath(file_path))
        while True:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(folder)
            if parent == folder:
                return True
            folder = parent
    except OSError:
        return False


def _parts(rel):
    parts = [part for part in (rel or "").split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise OSError(errno.EINVAL, "a path with . or ..")
    return parts


def open_nofollow(root, rel, directory=False):
    """A descriptor of REL under ROOT ("/" when empty), every component of REL opened with O_NOFOLLOW relative to its
    parent's descriptor (O_DIRECTORY but for the last, and for it too with DIRECTORY); the caller closes it. Raises
    OSError: ELOOP for a link at any component, EINVAL for a "." or ".." in REL."""
    parts = _parts(rel)
    handle = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            folder = directory or i < len(parts) - 1
            try:
                inner = os.open(part, NOFOLLOW | (os.O_DIRECTORY if folder else 0), dir_fd=handle)
            except OSError as exc:
                # O_DIRECTORY|O_NOFOLLOW says ENOTDIR for a link: a link all the same
                if exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(part, dir_fd=handle,
                                                                       follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a symbolic link on the way") from None
                raise
            os.close(handle)
            handle = inner
        return handle
    except BaseException:
        os.close(handle)
        raise


def open_regular(root, rel, owner=None, limit=None):
    """The regular file REL under ROOT opened by open_nofollow as a binary file object (the caller closes it),
    fstat-ed: a regular file, of at most LIMIT bytes when given, and with OWNER (a uid) a file OWNER could read itself
    (its own, or readable by every user: a hard link to a file its owner cannot read is refused). Raises OSError:
    ELOOP for a link on the way, EINVAL for a file that is not regular (a FIFO, a device, a folder), EACCES for one
    OWNER could not read, EFBIG for one over LIMIT bytes."""
    handle = open_nofollow(root, rel)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if owner is not None and info.st_uid != owner and not info.st_mode & stat.S_IROTH:
            raise OSError(errno.EACCES, "a file of uid %d that uid %d cannot read" % (info.st_uid, owner))
        if limit is not None and info.st_size > limit:
            raise OSError(errno.EFBIG, "larger than %d bytes" % limit)
        return os.fdopen(handle, "rb")
    except BaseException:
        os.close(handle)
        raise


def why_not(rel, exc):
    """What to say of REL that open_nofollow or open_regular refused with EXC."""
    why = "a symbolic link on the way" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    return "%s: %s (not read)" % (rel, why)


def read_nofollow(root, rel, limit=MAX_TEXT, owner=None):
    """(bytes, None) of the file REL under ROOT read through open_regular (no link followed; at most LIMIT bytes, the
    file's size when opened and what it holds when read); (None, None) when it does not exist; (None, why) when it
    is refused or cannot be read (why_not)."""
    try:
        with open_regular(root, rel, owner, limit) as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, why_not(rel, exc)
    if len(data) > limit:
        return None, "%s: larger than %d bytes (not read)" % (rel, limit)
    return data, None


def json_nofollow(root, rel, limit=MAX_TEXT, owner=None):
    """(data, error) of the JSON file REL under ROOT read by read_nofollow: (None, None) when it does not exist;
    (None, why) when refused, unreadable or garbled."""
    data, why = read_nofollow(root, rel, limit, owner)
    if data is None:
        return None, why
    return _json_of(data, rel)


def sha256_nofollow(root, rel, owner=None):
    """The sha256 (hex) of the file REL under ROOT opened by open_regular (no link followed). Raises OSError as
    open_regular does (FileNotFoundError when it does not exist)."""
    with open_regular(root, rel, owner) as handle:
        return _hash(handle)


def stat_nofollow(root, rel, directory=False):
    """os.fstat of REL under ROOT opened by open_nofollow (with DIRECTORY: it must be a folder). Raises OSError."""
    handle = open_nofollow(root, rel, directory)
    try:
        return os.fstat(handle)
    finally:
        os.close(handle)


def list_nofollow(root, rel, limit=MAX_ENTRIES):
    """Sorted [(name, kind)] of the folder REL under ROOT opened by open_nofollow; kind "dir", "file" (regular),
    "link" or "other", each as the entry is (a link is not followed). Raises OSError (EFBIG for more than LIMIT
    names: none is read then)."""
    handle = open_nofollow(root, rel, directory=True)
    found = []
    try:
        with os.scandir(handle) as entries:
            for entry in entries:
                if len(found) >= limit:
                    raise OSError(errno.EFBIG, "more than %d names" % limit)
                kind = ("link" if entry.is_symlink() else "dir" if entry.is_dir(follow_symlinks=False)
                        else "file" if entry.is_file(follow_symlinks=False) else "other")
                found.append((entry.name, kind))
    finally:
        os.close(handle)
    return sorted(found)


def fsync_folder(folder):
    """fsync FOLDER, so a rename or link made in it survives a power cut; None, or why it could not be synced (a
    file system that cannot sync a folder: what was renamed there is in place all the same)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        return "cannot open %s: %s" % (folder, exc.strerror or exc)
    try:
        os.fsync(handle)
    except OSError as exc:
        return "cannot sync %s: %s" % (folder, exc.strerror or exc)
    finally:
        os.close(handle)
    return None


def _stage(file_path, data, mode, make_parents):
    """A temporary file beside FILE_PATH holding DATA with MODE, synced; its path. A link at FILE_PATH is refused."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder = os.path.dirname(file_path) or "."
    if make_parents and not os.path.isdir(folder):
        os.makedirs(folder)
    if os.path.islink(file_path):
        raise OSError("%s is a symbolic link; rigbook does not write through links" % file_path)
    # mkstemp opens O_CREAT|O_EXCL|O_NOFOLLOW: a link planted at a name it tries is skipped, never followed
    handle, tmp = tempfile.mkstemp(dir=folder, prefix=".rigbook-")
    try:
        with os.fdopen(handle, "wb") as out:
            os.fchmod(out.fileno(), mode)  # the file opened, not whatever the name holds by now
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        _discard([tmp])
        raise
    return tmp


def _discard(paths):
    for tmp in paths:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_atomic(file_path, data, mode=0o644, make_parents=False, sync_folder=False):
    """Write DATA (bytes, or text as UTF-8) to FILE_PATH atomically with MODE. Raises OSError; a FILE_PATH that is a
    symbolic link is refused (never written through). SYNC_FOLDER: fsync the folder after the rename too
    (fsync_folder; a folder that cannot be synced is no error: the file is written, the rename done)."""
    write_many([(file_path, data)], mode, make_parents, sync_folder)
    return file_path


def write_many(items, mode=0o644, make_parents=False, sync_folder=False):
    """Write every (path, data) of ITEMS or none: each is staged beside its target first (write_atomic's rules),
    then all are renamed into place; a failure before the renames leaves no target changed. Raises OSError."""
    staged = []
    try:
        for file_path, data in items:
            staged.append((_stage(file_path, data, mode, make_parents), file_path))
        for tmp, file_path in staged:
            os.replace(tmp, file_path)
    except BaseException:
        _discard([tmp for tmp, _ in staged])
        raise
    if sync_folder:
        for folder in sorted(set(os.path.dirname(file_path) or "." for _, file_path in staged)):
            fsync_folder(folder)


def write_json(file_path, data, mode=0o644, make_parents=True):
    """DATA as indented, sorted JSON through write_atomic; the error text, or None."""
    try:
        write_atomic(file_path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode, make_parents)
    except (OSError, TypeError, ValueError) as exc:
        return "cannot write %s: %s" % (file_path, getattr(exc, "strerror", None) or exc)
    return None


def link_atomic(target, link_path):
    """Make LINK_PATH a symbolic link to TARGET atomically (a link beside it, renamed over it); raises OSError. A
    folder at LINK_PATH is refused."""
    if os.path.isdir(link_path) and not os.path.islink(link_path):
        raise OSError("%s is a folder; it is not replaced by a link" % link_path)
    tmp = "%s.rigbook-%d" % (link_path, os.getpid())
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link_path)
    except BaseException:
        os.unlink(tmp)
        raise
    return link_path


def move_atomic(source, dest):
    """Put the finished file or folder SOURCE (made beside DEST, on its file system: a download verified before it
    is kept, an archive a tool wrote, a folder unpacked and checked) at DEST in one rename, so a reader sees the old
    DEST or the new one, never a part. Raises OSError; a DEST that is a symbolic link is refused (rigbook does not
    replace what a link names), a folder at DEST must be empty."""
    if os.path.islink(dest):
        raise OSError("%s is a symbolic link; rigbook does not write through links" % dest)
    os.replace(source, dest)
    return dest
