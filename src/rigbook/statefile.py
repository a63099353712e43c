"""Files of the state directory that several processes share: one place for how they are locked and written.

- `locked(path)`: an exclusive fcntl lock (on `.NAME.lock` beside PATH) around every read-modify-write of PATH; it
  waits for the holder, and the kernel drops it when the holding process dies.
- `write_json_atomic(path, data)`: the collection's one atomic write (facts/files.write_atomic: a unique temporary
  file in PATH's folder, fsync, os.replace, never through a symbolic link), then an fsync of the folder: a reader
  sees the old file or the new one, never half of one, and two writers never share a temporary name.
- `keep_aside(path)`: move a corrupt file to `NAME.corrupt-<UTC time>` (never over an earlier kept copy).
- `exclusive(path, info)`: a lock that is not waited for (the run lock): `Busy` names the holder from the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from rigbook import paths

# New state files (baselines, history, locks) are the user's alone: a run's figures and lock name its hosts.
NEW_FILE_MODE = 0o600
# And so are the state directory and every folder under it.
PRIVATE_DIR_MODE = 0o700


def private_dir(path) -> Path:
    """PATH made a folder, each missing level (PATH and the folders above it) created 0700; an existing one is left
    as it is (paths.state_dir tightens the state directory itself). Returns PATH."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.parent != path:
        private_dir(path.parent)
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise
    return path


def make_private(root) -> None:
    """Take group and other permissions off ROOT and everything under it (files and folders; a symbolic link is not
    followed): for what another program wrote under the state directory with its own modes (ansible-runner's
    artifacts, Ansible's fact cache). Missing ROOT: nothing to do."""
    root = Path(root)
    if not root.exists() or root.is_symlink():
        return
    todo = [root]
    for folder, dirs, files in os.walk(root):
        todo += [Path(folder, name) for name in (*dirs, *files)]
    for path in todo:
        info = path.lstat()
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)


def lock_path(path: Path) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextmanager
def locked(path):
    """Hold PATH's lock (`.NAME.lock` beside it) for the block: serialises read-modify-writes of PATH between
    processes and threads (flock: one lock per open file, so two holders in one process exclude each other too;
    do not nest it for the same PATH)."""
    path = Path(path)
    private_dir(path.parent)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, NEW_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def write_text_atomic(path, text: str, new_mode: int = NEW_FILE_MODE) -> None:
    """Write TEXT to PATH through facts/files.write_atomic: a unique temporary file in PATH's folder (no predictable
    name), fsync, os.replace, fsync of the folder; the temporary file is removed on any failure, and a PATH that is
    a symbolic link is refused (never written through). Keeps an existing file's permissions (a new one gets
    NEW_MODE). The folder must exist; OSError as the system said it."""
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = new_mode
    paths.facts("files").write_atomic(str(path), text, mode=mode, sync_folder=True)


def write_json_atomic(path, data, default=None) -> None:
    """Write DATA as indented JSON to PATH (its folder made 0700 if missing) through write_text_atomic: a reader
    sees the old file or the new one; an existing file keeps its permissions, a new one gets 0600."""
    path = Path(path)
    private_dir(path.parent)
    write_text_atomic(path, json.dumps(data, indent=2, default=default) + "\n")


def read_json(path) -> tuple:
    """How every state file of JSON is decoded (baselines, run records, manifests): (data, None) for UTF-8 JSON
    text, (None, problem) when it is not UTF-8 or not JSON. OSErrors (no such file, a folder, no permission) are
    raised: the caller says what a missing file means and names the file."""
    raw = Path(path).read_bytes()
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text: {exc.reason} at byte {exc.start}"
    except ValueError as exc:
        return None, f"not valid JSON: {exc}"


def keep_aside(path) -> Path:
    """Move PATH to `NAME.corrupt-YYYYMMDDTHHMMSSZ` beside it (`...Z-2`, `-3`, ... when that name is taken: an earlier
    kept copy is never replaced) and return the new path. The bytes are not touched. Call it holding locked(PATH)."""
    path = Path(path)
    base = f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    number = 1
    while True:
        target = path.with_name(base if number == 1 else f"{base}-{number}")
        number += 1
        try:
            os.link(path, target)  # fails when TARGET exists: no clobbering, no race with another keeper
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
                raise
            if target.exists() or target.is_symlink():  # a filesystem without hard links
                continue
            paths.facts("files").move_atomic(str(path), str(target))
        else:
            os.unlink(path)
        paths.facts("files").fsync_folder(str(path.parent))  # best effort: the file is aside either way
        return target


class Busy(Exception):
    """exclusive(PATH) is held by another process; HOLDER is what it wrote into the file ({} when unreadable)."""

    def __init__(self, path: Path, holder: dict):
        super().__init__(f"{path} is held by {holder or 'another process'}")
        self.path = path
        self.holder = holder


def _holder(fd: int) -> dict:
    """The holder's details from the lock file; a holder that has just taken the lock may not have written them
    yet: read again for up to half a second."""
    for _ in range(10):
        raw = os.pread(fd, 65536, 0)
        try:
            found = json.loads(raw.decode("utf-8"))
        except ValueError:
            found = None
        if isinstance(found, dict):
            return found
        time.sleep(0.05)
    return {}


@contextmanager
def exclusive(path, info: dict):
    """Hold PATH's fcntl lock for the block without waiting: raises Busy (naming the holder) when another process
    holds it. INFO (JSON-able) is written into the file while held and removed on release; the file's content is
    only informational: a killed holder's lock dies with it, and its stale content blocks nobody."""
    path = Path(path)
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, NEW_FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(path, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        os.fsync(fd)
        try:
            yield path
        finally:
            with suppress(OSError):
                os.ftruncate(fd, 0)  # still held here: the file never names a finished run as the holder
    finally:
        os.close(fd)
