# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build stamps and group-build archive names: named, written and parsed here alone (standard library only).

Stamps: a source build's prefix holds BUILD_STAMP (.rigbook-build.json: what was built, from what, and each
installed file's sha256), a pinned venv VENV_STAMP (.rigbook-venv.json), an unpacked DKMS source SOURCE_STAMP
(its tarball's sha256). A wheel's own library that the pinned venv replaced by a link is kept as NAME + KEPT_SUFFIX.

A group build's archive is NAME-IDENTITY-SHA256.tar.gz: NAME the build's (source_build's name, the DKMS package),
IDENTITY the 16-hex identity_id of what was built (sources, patches, arguments, kernels), SHA256 the archive's own
digest. `archive_name` is the one writer, `parse_archive_name` the one parser, `archive_glob` what a role lists.
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

BUILD_STAMP = ".rigbook-build.json"
VENV_STAMP = ".rigbook-venv.json"
SOURCE_STAMP = ".rigbook-source-sha256"
KEPT_SUFFIX = ".rigbook-bundled"
MAX_STAMP = 1 << 20
NAME = r"[A-Za-z0-9][A-Za-z0-9._+]*(?:-[A-Za-z0-9._+]+)*"
IDENTITY = r"[0-9a-f]{16}"
SHA256 = r"[0-9a-f]{64}"
ARCHIVE = re.compile(r"^(?P<name>%s)-(?P<identity>%s)-(?P<sha256>%s)\.tar\.gz$" % (NAME, IDENTITY, SHA256))
SUFFIX = ".tar.gz"


def archive_name(name, identity_id, sha256):
    """The file name of a group build's archive; ValueError for parts of another shape."""
    name_ok = re.match(r"(?:%s)\Z" % NAME, name or "")
    if not name_ok or not re.match(r"(?:%s)\Z" % IDENTITY, identity_id or "") or not re.match(
            r"(?:%s)\Z" % SHA256, sha256 or ""):
        raise ValueError("not an archive name's parts: %r %r %r" % (name, identity_id, sha256))
    return "%s-%s-%s%s" % (name, identity_id, sha256, SUFFIX)


def parse_archive_name(file_name):
    """{name, identity_id, sha256} of a group build's archive file name (a path's last part), or None."""
    found = ARCHIVE.match((file_name or "").rsplit("/", 1)[-1])
    if not found:
        return None
    return {"name": found.group("name"), "identity_id": found.group("identity"), "sha256": found.group("sha256")}


def archive_glob(name, identity_id):
    """The pattern the archives of build NAME with IDENTITY_ID match, whatever their digest."""
    return "%s-%s-*%s" % (name, identity_id, SUFFIX)


def read_stamp(file_path):
    """(stamp dict, error) of a JSON stamp: (None, None) without one; (None, why) when unreadable, garbled, over
    MAX_STAMP bytes or not a JSON object."""
    data, error = files.read_json(file_path, limit=MAX_STAMP)
    if error:
        return None, error
    if data is not None and not isinstance(data, dict):
        return None, "%s is not a JSON object" % file_path
    return data, None


def write_stamp(file_path, stamp, mode=0o644):
    """STAMP as JSON at FILE_PATH through the one atomic write; the error text, or None."""
    return files.write_json(file_path, stamp, mode=mode, make_parents=False)
