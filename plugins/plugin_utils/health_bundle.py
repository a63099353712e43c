# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""rigbook-health.pyz: the collection's module_utils as one zip Python runs (controller side, standard library).

The health role copies it to the box and its timer runs `python3 rigbook-health.pyz --config FILE`
(module_utils/ladder/health.py). Built byte for byte reproducibly from the files (fixed times and modes, sorted names),
so a box whose copy is current sees no change, and its name carries the sha256 of its bytes. The file is written
and checked through module_utils/facts/files.py (the one atomic write, the one sha256 of a file).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

MAIN = ("# rigbook-health: P2P health between runs (module_utils/ladder/health.py)\n"
        "import sys\n\n"
        "from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import health\n\n"
        "sys.exit(health.main())\n")
PACKAGE = "ansible_collections/rigbook/homelab/plugins/module_utils"


def bundle_bytes(module_utils_dir):
    """The zip's bytes: MODULE_UTILS_DIR's .py files under PACKAGE, an __init__.py in every package directory that
    lacks one (zipimport needs them), and __main__.py."""
    members = {"__main__.py": MAIN.encode()}
    for folder, dirs, names in os.walk(module_utils_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, module_utils_dir).replace(os.sep, "/")
        prefix = PACKAGE if rel == "." else PACKAGE + "/" + rel
        for name in sorted(n for n in names if n.endswith(".py")):
            with open(os.path.join(folder, name), "rb") as handle:
                members[prefix + "/" + name] = handle.read()
    packages = set()
    for name in members:
        parts = name.split("/")[:-1]
        packages.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for package in packages:
        members.setdefault(package + "/__init__.py", b"")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, members[name])
    return out.getvalue()


def bundle_path(module_utils_dir, folder=None):
    """A file holding bundle_bytes, named by its sha256 (written atomically into FOLDER: the temporary directory by
    default). A file of that name is used only when its sha256 is the bundle's: one cut short, or put there by
    someone else (the temporary directory is everyone's), is replaced; raises OSError when it cannot be (a link
    there is never written through)."""
    data = bundle_bytes(module_utils_dir)
    digest = hashlib.sha256(data).hexdigest()  # of the bytes in hand: no file to hash yet
    folder = folder or tempfile.gettempdir()
    path = os.path.join(folder, "rigbook-health-%s.pyz" % digest[:16])
    there = None if os.path.islink(path) else files.digest(path)[0]
    if there != digest:
        files.write_atomic(path, data, 0o644)
    return path
