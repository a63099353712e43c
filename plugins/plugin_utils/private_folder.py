# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rigbook state directory, and a folder of the controller user's alone under it (controller side, standard
library).

What the controller builds there runs on boxes (the health program, module payloads), so the folder must be the
user's alone: made 0700; one that is a link, is not the effective user's or that group or others may write is
refused, as is a parent (the state directory) that group or others may write. The state directory is found by the
CLI's rule (src/rigbook/paths.state_dir), read here from the environment the same way, as plugin code cannot import
the CLI's package.
"""

from __future__ import annotations

import os
import stat

PRIVATE_DIR_MODE = 0o700
PAYLOAD_FOLDER = "ansiballz"  # under the state directory: Ansible's module payloads (callback/ansiballz_cache.py)


class FolderRefused(OSError):
    """The folder is not the controller user's alone."""


def state_dir(environ=None):
    """The rigbook state directory by the CLI's rule (src/rigbook/paths.state_dir): RIGBOOK_STATE_DIR (~ expanded),
    else $XDG_STATE_HOME/rigbook, else ~/.local/state/rigbook. ENVIRON: os.environ by default."""
    env = os.environ if environ is None else environ
    override = env.get("RIGBOOK_STATE_DIR")
    if override:
        return os.path.expanduser(override)
    return os.path.join(env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"),
                        "rigbook")


def _make_dirs(path):
    """PATH and each missing folder above it made 0700 (as the CLI makes the state directory)."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        _make_dirs(parent)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass


def _refuse_shared(path, info, what, why):
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        raise FolderRefused("%s %s is owned by uid %d, not by this user (uid %d): %s; set RIGBOOK_STATE_DIR to one"
                            % (what, path, info.st_uid, os.geteuid(), why))
    if mode & 0o022:
        raise FolderRefused("%s %s is writable by group or others (mode %04o): %s; take those permissions off "
                            "(chmod go-w) or set RIGBOOK_STATE_DIR to another folder" % (what, path, mode, why))


def private_folder(path, parent_is="the folder above it", why="what rigbook keeps there runs on boxes, so it is kept "
                   "only in a folder of your own"):
    """PATH made a folder of the effective user's alone (0700; its parent, PARENT_IS in messages, made 0700 when
    missing) and returned. Raises FolderRefused (its message saying WHY such a folder is needed) when PATH is a link
    or no folder, or it or its parent is another user's or writable by group or others (nothing is changed then),
    OSError when it cannot be made."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        _make_dirs(parent)
    _refuse_shared(parent, os.stat(parent), parent_is, why)  # a link there is the owner's own choice
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise FolderRefused("%s is a symbolic link: %s, never where a link leads; remove the link" % (path, why))
    if not stat.S_ISDIR(info.st_mode):
        raise FolderRefused("%s is not a folder; remove it (rigbook makes it, 0700)" % path)
    _refuse_shared(path, info, "the folder", why)
    return path
