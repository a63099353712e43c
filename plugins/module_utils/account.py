# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A user in the GPU device groups, checked with the standard library (no command runs when nothing is missing):
used by the device_groups module (amd_rocm) and serve_units (the engine's system user)."""

from __future__ import annotations

import grp
import os
import pwd


def groups_of(user):
    """The names of the groups USER is in (its primary group and every group listing it), or None when there is no
    such user."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    member = set(g.gr_name for g in grp.getgrall() if user in g.gr_mem)
    try:
        member.add(grp.getgrgid(entry.pw_gid).gr_name)
    except KeyError:
        pass
    return member


def changes(user, groups, home=None, create=False):
    """What is missing: [(what, argv or None)] in order - groups to make (groupadd --system), the user (useradd
    --system, only with CREATE), the user's membership, and (with HOME) the home directory owned by the user
    (argv None: make_home does it)."""
    todo = []
    for group in groups:
        try:
            grp.getgrnam(group)
        except KeyError:
            todo.append(("group %s" % group, ["groupadd", "--system", group]))
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        entry = None
        if not create:
            return todo + [("user %s (absent: create it first)" % user, False)]
        todo.append(("user %s" % user, ["useradd", "--system", "--user-group", "--home-dir", home or "/nonexistent",
                                        "--shell", "/usr/sbin/nologin", user]))
    member = groups_of(user) or set()
    missing = [g for g in groups if g not in member]
    if missing:
        todo.append(("%s in %s" % (user, ",".join(missing)), ["usermod", "-aG", ",".join(missing), user]))
    if home and not (entry is not None and os.path.isdir(home) and os.stat(home).st_uid == entry.pw_uid):
        todo.append(("home %s" % home, None))
    return todo


def apply(todo, run, home=None, user=None):
    """Run each argv of TODO through RUN(argv) (which fails the module on an error); make HOME owned by USER."""
    for what, argv in todo:
        if argv is False:
            return "cannot continue: %s" % what
        if argv:
            run(argv)
    if home and any(argv is None for _, argv in todo):
        entry = pwd.getpwnam(user)
        if not os.path.isdir(home):
            os.makedirs(home, 0o750)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    return None
