# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's store of a pinned distribution kernel's .debs: its rules, shared by the box and the controller
(standard library only).

Ubuntu keeps only the current ABI of a kernel series in its -updates and -security pockets (Debian in its point
releases): once superseded, linux-image-7.0.0-31-generic, its modules and headers leave the archive and a box built
later cannot install them. The first box that installs the pinned distribution kernel keeps the .debs apt downloaded
and checked against the signed package index; the controller stores them under the sha256 it computes itself
(plugins/action/deb_store.py) once that sha256 is the one the index names; every later box installs those exact files
when the archive no longer offers the recorded version (plugins/modules/deb_packages.py: store, keep, record).

Here, each rule once:
- `distro_kernel_packages`: what a distribution kernel is installed as (Ubuntu: image, modules, modules-extra,
  headers; Debian has no modules-extra); `keep_patterns`: the installed packages whose .debs the store keeps (those
  plus the release's common headers, which leave the archive with it);
- `parse_show` / `index_sha256`: the package index's SHA256 of one version (`apt-cache show NAME=VERSION`), the hash
  apt checked the download against; `cache_name`: the file apt keeps it as in /var/cache/apt/archives;
- the store's record (`record_name`, `deb_name`, `check_record`, `record_for`, `shown_to_box`) and the decisions
  `from_store` (install the stored files: the archive no longer offers a stored version) and `to_keep`;
- the box's own note of the stored .debs its kernel was installed from (`box_record`, written by deb_packages;
  `read_box_record`, typed and bounded, read by the host manifest: `provision diff` shows each package's sha256).
"""

from __future__ import annotations

import fnmatch
import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, packages, text

FORMAT = 1
SHA256 = r"[0-9a-f]{64}"
ARCH = r"[a-z0-9][a-z0-9-]{0,31}"
RELEASE = r"[A-Za-z0-9][A-Za-z0-9.+~-]{0,127}"
RECORD_NAME = r"[a-z][a-z0-9_-]{0,31}"
# A kernel release's ABI (7.0.0-31 of 7.0.0-31-generic, 6.1.0-47 of 6.1.0-47-amd64): what its packages carry.
ABI = re.compile(r"^\d+\.\d+(?:\.\d+)?-\d+")
ARCHIVES = "/var/cache/apt/archives"
BOX_RECORD_DIR = "/var/lib/rigbook/debs"
MAX_PACKAGES = 64
MAX_RECORD = 1 << 20
SHOW_FIELDS = {"Package": "package", "Version": "version", "Architecture": "architecture", "SHA256": "sha256",
               "Filename": "filename"}


# --- what a distribution kernel is ---------------------------------------------------------------------------------

def distro_kernel_packages(release, os_id, names):
    """The packages a distribution kernel RELEASE is installed as on OS_ID: NAMES (the pin's, image and headers by
    default) and, on Ubuntu, the release's linux-modules and linux-modules-extra (the NIC and DRM helper modules
    Ubuntu splits out of the image), each right after the image. Debian has no modules-extra."""
    out = list(dict.fromkeys(names))
    if os_id != "ubuntu" or not release:
        return out
    extra = [n for n in ("linux-modules-" + release, "linux-modules-extra-" + release) if n not in out]
    image = "linux-image-" + release
    at = out.index(image) + 1 if image in out else len(out)
    return out[:at] + extra + out[at:]


def keep_patterns(release, names):
    """dpkg-query patterns of the installed packages whose .debs the store keeps: NAMES and the release's common
    headers, which the headers depend on exactly and which leave the archive with them (Ubuntu's
    linux-hwe-7.0-headers-7.0.0-31 or linux-headers-6.8.0-31, Debian's linux-headers-6.1.0-47-common)."""
    found = ABI.match(release or "")
    if not found:
        return list(dict.fromkeys(names))
    abi = found.group(0)
    return list(dict.fromkeys(list(names) + ["linux-*headers-" + abi, "linux-headers-%s-common" % abi]))


def matches(name, patterns):
    """Whether the package NAME is one of PATTERNS (names or dpkg-query's shell globs)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


# --- the package index -------------------------------------------------------------------------------------------

def parse_show(output):
    """[{"package", "version", "architecture", "sha256", "filename"}] of `apt-cache show`'s stanzas (a blank line
    between them, continuation lines skipped, the fields in any order); each value typed (None where missing or of
    another shape). A stanza from dpkg's status file (an installed version no index offers) has no sha256 and no
    filename."""
    stanzas, current = [], {}
    for line in (output or "").splitlines() + [""]:
        if not line.strip():
            if current:
                stanzas.append(current)
            current = {}
            continue
        if line[0].isspace():
            continue
        key, sep, value = line.partition(":")
        if sep and key in SHOW_FIELDS:
            current[SHOW_FIELDS[key]] = value.strip()
    return [{"package": text.matching(s.get("package"), packages.PACKAGE),
             "version": text.matching(s.get("version"), packages.VERSION),
             "architecture": text.matching(s.get("architecture"), ARCH),
             "sha256": text.matching((s.get("sha256") or "").lower(), SHA256),
             "filename": text.line(s.get("filename"), 512)} for s in stanzas]


def index_sha256(stanzas, name, version, arch):
    """The sorted SHA256s the package index names for NAME VERSION of ARCH (or "all"): what apt checked the download
    against. Empty when no index lists that version (the archive dropped it and the lists were updated since)."""
    return sorted(set(s["sha256"] for s in stanzas if s["package"] == name and s["version"] == version
                      and s["architecture"] in (arch, "all") and s["sha256"] and s["filename"]))


def cache_name(name, version, arch):
    """The file apt keeps NAME VERSION of ARCH as in /var/cache/apt/archives: NAME_VERSION_ARCH.deb, the epoch's
    colon written %3a."""
    return "%s_%s_%s.deb" % (name, version.replace(":", "%3a"), arch)


# --- the store's record (on the controller) ------------------------------------------------------------------------

def record_name(release, arch):
    """The file name of the store's record of RELEASE's .debs for ARCH; ValueError for parts of another shape."""
    if not text.matching(release, RELEASE) or not text.matching(arch, ARCH):
        raise ValueError("not a kernel release and architecture: %r %r" % (release, arch))
    return "%s_%s.json" % (release, arch)


def deb_name(sha256):
    """The file name a stored .deb has: its sha256 as the controller computed it."""
    if not text.matching(sha256, SHA256):
        raise ValueError("not a sha256: %r" % (sha256,))
    return sha256 + ".deb"


def _entry_problem(name, entry):
    if not text.matching(name, packages.PACKAGE) or not isinstance(entry, dict):
        return "the entry %r is no package" % (text.line(name, 80),)
    for field, pattern in (("version", packages.VERSION), ("architecture", ARCH), ("sha256", SHA256)):
        if not text.matching(entry.get(field), pattern):
            return "%s has no %s" % (name, field)
    return None


def check_record(data, release, arch):
    """(record, None) when DATA is the store's record of RELEASE for ARCH: its shape, every package with a version,
    an architecture and a sha256; else (None, why)."""
    if not isinstance(data, dict):
        return None, "not a JSON object"
    if data.get("format") != FORMAT or data.get("release") != release or data.get("architecture") != arch:
        return None, "not a record of %s for %s (format %d)" % (release, arch, FORMAT)
    found = data.get("packages")
    if not isinstance(found, dict) or not found or len(found) > MAX_PACKAGES:
        return None, "no packages"
    for name, entry in found.items():
        problem = _entry_problem(name, entry)
        if problem:
            return None, problem
    return data, None


def shown_to_box(record):
    """What a box is handed of a record: release, architecture and each package's version, architecture and sha256
    (who recorded it stays on the controller)."""
    return {"release": record["release"], "architecture": record["architecture"],
            "packages": dict((name, {"version": e["version"], "architecture": e["architecture"], "sha256": e["sha256"]})
                             for name, e in sorted(record["packages"].items()))}


def record_for(records, arch):
    """The record of RECORDS (as shown_to_box hands them) for ARCH whose packages are well formed, or None."""
    for record in records or []:
        if not isinstance(record, dict) or record.get("architecture") != arch or not isinstance(
                record.get("release"), str):
            continue
        found = record.get("packages")
        if isinstance(found, dict) and found and not any(_entry_problem(n, e) for n, e in found.items()):
            return record
    return None


# --- the decisions ---------------------------------------------------------------------------------------------------

def from_store(stored, installed, candidates):
    """The packages to install from the store's files: STORED {name: {version, ...}} (the record's packages), INSTALLED
    {name: version or None}, CANDIDATES {name: candidate version or None} from apt-cache policy. Those not installed
    at their stored version, when the archive no longer offers the stored version of one of them (no candidate, or
    another one); [] while it offers each (apt installs them from the archive, checked by its signatures)."""
    lacking = [n for n in sorted(stored) if installed.get(n) != stored[n]["version"]]
    if any(candidates.get(n) != stored[n]["version"] for n in lacking):
        return lacking
    return []


def to_keep(installed, stored):
    """The installed packages (INSTALLED {name: version}) whose .debs go to the store: those it holds no version of
    (a package it holds at another version stays as recorded: twins follow the first box)."""
    return [n for n in sorted(installed) if installed[n] and n not in (stored or {})]


# --- the box's own note -----------------------------------------------------------------------------------------------

def box_record_path(name):
    """Where a box keeps the note NAME (e.g. "kernel") of the stored .debs its packages were installed from."""
    if not text.matching(name, RECORD_NAME):
        raise ValueError("not a record name: %r" % (name,))
    return os.path.join(BOX_RECORD_DIR, name + ".json")


def box_record(record, installed):
    """The box's note of RECORD (as shown_to_box hands it): release, architecture and each package installed at its
    recorded version (INSTALLED {name: version or None}) with that version and sha256; None when none is."""
    if not record:
        return None
    found = dict((name, {"version": e["version"], "sha256": e["sha256"]})
                 for name, e in sorted(record["packages"].items()) if installed.get(name) == e["version"])
    if not found:
        return None
    return {"release": record["release"], "architecture": record["architecture"], "packages": found}


def read_box_record(root, name):
    """({package: {"version", "sha256"}} or None when the box has no such note, why or None) of the note NAME under
    ROOT (the box's "/" or a recorded tree), each name, version and sha256 checked; what is of another shape is
    why, never a value."""
    rel = box_record_path(name).lstrip("/")
    data, error = files.read_json(files.path(root, rel), limit=MAX_RECORD)
    if error:
        return None, text.line(error, 300)
    if data is None:
        return None, None
    found = data.get("packages") if isinstance(data, dict) else None
    if not isinstance(found, dict) or len(found) > MAX_PACKAGES:
        return None, "%s holds no packages" % rel
    out = {}
    for package, entry in found.items():
        entry = entry if isinstance(entry, dict) else {}
        version = text.matching(entry.get("version"), packages.VERSION)
        sha256 = text.matching(entry.get("sha256"), SHA256)
        if not text.matching(package, packages.PACKAGE) or not version or not sha256:
            return None, "%s: the entry %r is no package with a version and sha256" % (rel, text.line(package, 80))
        out[package] = {"version": version, "sha256": sha256}
    return out, None
