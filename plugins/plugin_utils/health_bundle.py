# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""rigbook-health.pyz: the collection's module_utils as one zip Python runs (controller side, standard library).

The health role copies it to every box and root's timer runs `python3 rigbook-health.pyz --config FILE`
(module_utils/ladder/health.py). Built byte for byte reproducibly from the files (fixed times and modes, sorted names),
so a box whose copy is current sees no change, and its name carries the sha256 of its bytes. The file is written
and checked through module_utils/facts/files.py (the one atomic write, the one sha256 of a file).

Where it is built: a folder of the controller user's own, FOLDER under the rigbook state directory (the CLI's rule,
src/rigbook/paths.state_dir: RIGBOOK_STATE_DIR, else $XDG_STATE_HOME/rigbook, else ~/.local/state/rigbook; read here
from the environment the same way, as plugin code cannot import the CLI's package). Never the temporary directory:
a name there is anyone's to take, and what lies at it would run as root on every box. The folder is made 0700; one
that is a link, is not the effective user's or that group or others may write is refused, as is a state directory
that group or others may write. A file at the bundle's name is used only when its sha256 is the bundle's (checked
before it is returned); a link there is removed, never followed.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.plugin_utils.private_folder import private_folder, state_dir

MAIN = ("# rigbook-health: P2P health between runs (module_utils/ladder/health.py)\n"
        "import sys\n\n"
        "from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import health\n\n"
        "sys.exit(health.main())\n")
PACKAGE = "ansible_collections/rigbook/homelab/plugins/module_utils"
FOLDER = "health-bundle"  # under the state directory
NAME = "rigbook-health-%s.pyz"  # the sha256's first 16 hex digits
# what may go wrong with the folder it is built in, in the words of private_folder's refusals
WHY_PRIVATE = "rigbook-health.pyz runs as root on every box, so it is built only in a folder of your own"


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
    """A file holding bundle_bytes, named by its sha256, in FOLDER (default: FOLDER under the state directory), made
    and checked by private_folder. A file of that name is used only when its sha256 is the bundle's: one cut short
    or of other content is replaced, a link there is removed (never followed); the sha256 is checked again before
    the path is returned. Raises OSError (FolderRefused for a folder that is not the user's alone)."""
    data = bundle_bytes(module_utils_dir)
    digest = hashlib.sha256(data).hexdigest()  # of the bytes in hand: no file to hash yet
    folder = (private_folder(folder, why=WHY_PRIVATE) if folder else
              private_folder(os.path.join(state_dir(), FOLDER), "the state directory", why=WHY_PRIVATE))
    path = os.path.join(folder, NAME % digest[:16])
    if os.path.islink(path):
        os.unlink(path)
    if files.digest(path)[0] != digest:
        files.write_atomic(path, data, 0o600)
    there, why = files.digest(path)
    if there != digest:
        raise OSError("%s does not hold rigbook-health.pyz after it was written (%s)" % (path, why or "sha256 %s"
                                                                                         % there))
    return path
