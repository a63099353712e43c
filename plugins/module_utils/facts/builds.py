# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build stamps and group-build archive names: named, written and parsed here alone (standard library only).

Stamps: a source build's prefix holds BUILD_STAMP (.rigbook-build.json: what was built, from what, and each
installed file's sha256), a pinned venv VENV_STAMP (.rigbook-venv.json), an unpacked DKMS source SOURCE_STAMP
(its tarball's sha256). A wheel's own library that the pinned venv replaced by a link is kept as NAME + KEPT_SUFFIX.

A group build's archive is NAME-IDENTITY-SHA256.tar.gz: NAME the build's (source_build's name, the DKMS package),
IDENTITY the 16-hex identity_id of what was built (sources, patches, arguments, kernels), SHA256 the archive's own
digest. `archive_name` is the one writer, `parse_archive_name` the one parser, `archive_glob` what a role lists;
`pack` makes an archive's bytes, the same bytes for the same files wherever and whenever it runs.

The controller keeps, beside each archive in its builds/ folder, a provenance record per inventory and group of boxes
that may install it: NAME-IDENTITY-SHA256.provenance-KEY.json, KEY the 16 hex digits of `provenance_key` (plugins/
action/group_archive.py writes and reads them; `provenance_name` names one, `parse_provenance_name` reads a name).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tarfile

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
PROVENANCE = re.compile(r"^(?P<archive>%s-%s-%s)\.provenance-(?P<key>[0-9a-f]{16})\.json$" % (NAME, IDENTITY, SHA256))


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


def provenance_key(inventory, group):
    """The 16 hex digits that name the provenance records of the boxes of GROUP in INVENTORY."""
    return hashlib.sha256(("%s\0%s" % (inventory, group)).encode("utf-8", "replace")).hexdigest()[:16]


def provenance_name(archive_file, key):
    """The file name of the provenance record of the archive ARCHIVE_FILE (its name) for the boxes KEY names."""
    named = parse_archive_name(archive_file)
    if not named or not re.match(r"[0-9a-f]{16}\Z", key or ""):
        raise ValueError("not an archive's provenance: %r %r" % (archive_file, key))
    return "%s.provenance-%s.json" % (archive_file.rsplit("/", 1)[-1][:-len(SUFFIX)], key)


def parse_provenance_name(file_name):
    """{archive (its file name), name, identity_id, sha256, key} of a provenance record's file name, or None."""
    found = PROVENANCE.match((file_name or "").rsplit("/", 1)[-1])
    if not found:
        return None
    archive = found.group("archive") + SUFFIX
    return dict(parse_archive_name(archive), archive=archive, key=found.group("key"))


def provenance_glob(name):
    """The pattern the provenance records of build NAME's archives match (of every identity, inventory and group;
    parse_provenance_name tells a longer NAME apart)."""
    return "%s-*.provenance-*.json" % name


def pack(entries):
    """The bytes of a .tar.gz holding ENTRIES, [(name in the archive, kind, source)]: kind "file" (SOURCE a path on
    this host, read), "bytes" (SOURCE the data), "folder" or "symlink" (SOURCE its target). Reproducible: members
    sorted by name, every time 0, owner root (0/0), mode 0755 for folders and for files with an execute bit, else
    0644; gzip without a time or a file name."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, source in sorted(entries, key=lambda entry: entry[0]):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
            if kind == "folder":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, source, 0o777
                tar.addfile(info)
            elif kind == "bytes":
                info.size, info.mode = len(source), 0o644
                tar.addfile(info, io.BytesIO(source))
            else:
                with open(source, "rb") as handle:
                    found = os.fstat(handle.fileno())
                    info.size, info.mode = found.st_size, 0o755 if found.st_mode & 0o111 else 0o644
                    tar.addfile(info, handle)
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _stamp(data, error, where):
    """(stamp dict, error) of what a JSON reader gave for the stamp at WHERE: the one shape rule, a JSON object."""
    if error:
        return None, error
    if data is not None and not isinstance(data, dict):
        return None, "%s is not a JSON object" % where
    return data, None


def read_stamp(file_path):
    """(stamp dict, error) of a JSON stamp: (None, None) without one; (None, why) when unreadable, garbled, over
    MAX_STAMP bytes or not a JSON object."""
    data, error = files.read_json(file_path, limit=MAX_STAMP)
    return _stamp(data, error, file_path)


def read_stamp_nofollow(root, rel, owner=None):
    """read_stamp of the stamp REL under ROOT read through facts/files' no-follow reader (files.json_nofollow: no
    link followed on the way, a regular file, with OWNER one that uid could read itself): (None, None) without
    one; (None, why) when refused, unreadable, garbled, over MAX_STAMP bytes or not a JSON object."""
    data, error = files.json_nofollow(root, rel, MAX_STAMP, owner)
    return _stamp(data, error, rel)


def write_stamp(file_path, stamp, mode=0o644):
    """STAMP as JSON at FILE_PATH through the one atomic write; the error text, or None."""
    return files.write_json(file_path, stamp, mode=mode, make_parents=False)


def manifest_problem(root, found, install_files):
    """Why the regular files FOUND (paths relative to ROOT, an unpacked build archive) are not exactly the
    controller's manifest INSTALL_FILES ({path: sha256}), each with its sha256; None when they are."""
    extra = sorted(set(found) - set(install_files))
    if extra:
        return "%s is in it but not in the controller's manifest of it" % extra[0]
    missing = sorted(set(install_files) - set(found))
    if missing:
        return "%s of the controller's manifest is not in it" % missing[0]
    for rel in sorted(found):
        if files.sha256_of(os.path.join(root, rel)) != install_files[rel]:
            return "%s is not the file the controller's manifest names (its sha256 differs)" % rel
    return None
