# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a role left on a box when it last converged, and whether the box still holds it (standard library only).

A role that ran to its end writes its converged state: the digest of the run's inputs (the host model, the role
variables the inventory sets, the collection's own files: plugins/action/host_model.py `inputs_digest`) and, for
every thing the role's tasks check (its WATCH: files, folders, packages, units, the default target, group
membership, the boot), what that thing is now. The next run reads every role's state in one module run
(site.yml's preflight play): a role whose inputs are the same and whose every watched thing reads the same is
converged and its tasks are not run; anything else (no state, other inputs, one thing changed, a thing that cannot
be read) runs the role as before. So a converged box costs one read, and any change the role's tasks would have
seen makes them run.

Watched things (`read_items`), each to a short string:
  file:PATH      "sha256 MODE UID GID" of a regular file, "link TARGET", "dir MODE UID GID", or "absent"
  block:PATH#OWNER  the sha256 of OWNER's block of the GPU environment file PATH (module_utils/gpu_env_file), or
                 "absent": a file several roles write, each watching its own block
  tree:PATH      sha256 over every entry under the folder (name, type, mode, owner, size, mtime, link target;
                 links not followed), "absent"; a folder of more than MAX_TREE entries has no digest
  package:NAME   "VERSION held" / "VERSION" (dpkg), or "absent"
  unit:NAME      LoadState ActiveState SubState UnitFileState MainPID of `systemctl show`
  default_target `systemctl get-default`
  groups:USER    the groups USER is in (the group database), "absent" for no such user
  boot           the boot id: a role that reads what only a boot changes (the booted kernel, a loaded module, what the
                 firmware set) runs again once after every boot - except the boot its own run made, once that run's
                 ladder judged the layer the role prepares (BOOT_LAYERS) pass or warn after it (`restamp`)
A thing that cannot be read has no value (None) and never matches.

The file is the box's: a box can only fool itself with it. It is read bounded and typed (`parse_state`) and written
root-only (0600) through the one atomic write.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat

from ansible_collections.rigbook.homelab.plugins.module_utils import account, gpu_env_file
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import (
    files,
    kernel,
    packages,
    runner,
    systemd,
    text,
)

STATE_DIR = "/var/lib/rigbook/converged"
ROLE = r"[a-z][a-z0-9_]{0,63}"
DIGEST = r"[0-9a-f]{64}"
KINDS = ("files", "trees", "packages", "units", "groups", "blocks")
MAX_TREE = 200000  # entries of one watched folder
MAX_ITEMS = 4096  # watched things of one role
MAX_STATE = 1 << 20  # bytes of one converged state file
MAX_BLOCK_FILE = 1 << 20  # bytes of a GPU environment file whose block is watched
MAX_OUTPUTS = 16  # what a converged role hands the roles after it (the sglang role: its venv)
UNIT_PROPS = ("LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID")
WHY_SHOWN = 3
# The ladder layer that judges, after a boot, what each boot-watching role prepared for it: when site.yml rebooted a
# box and its ladder then judged that layer pass or warn, the role's state holds for the new boot (`restamp`).
BOOT_LAYERS = {"bios_checklist": "firmware", "kernel": "kernel_state", "nvidia_p2p_driver": "driver_state",
               "amd_rocm": "driver_state"}
HOLDS = ("pass", "warn")


def state_path(role, folder=STATE_DIR):
    return os.path.join(folder, "%s.json" % role)


def _file_item(file_path):
    try:
        info = os.lstat(file_path)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return None
    owner = "%o %d %d" % (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    if stat.S_ISLNK(info.st_mode):
        try:
            return "link " + os.readlink(file_path)
        except OSError:
            return None
    if stat.S_ISDIR(info.st_mode):
        return "dir " + owner
    if not stat.S_ISREG(info.st_mode):
        return None
    try:
        return "%s %s" % (files.sha256_of(file_path), owner)
    except OSError:
        return None


def _tree_item(folder):
    """The sha256 over every entry under FOLDER (sorted walk, links not followed); "absent"; None when a part
    cannot be read or there are more than MAX_TREE entries."""
    try:
        top = os.lstat(folder)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return _file_item(folder)
    digest = hashlib.sha256()
    count = 0
    failed = []
    for parent, dirs, names in os.walk(folder, onerror=failed.append):
        dirs.sort()
        for name in sorted(dirs + names):
            count += 1
            if count > MAX_TREE:
                return None
            entry = os.path.join(parent, name)
            try:
                info = os.lstat(entry)
                target = os.readlink(entry) if stat.S_ISLNK(info.st_mode) else ""
            except OSError:
                return None
            digest.update(("%s\0%o\0%d\0%d\0%d\0%d\0%s\n" % (
                os.path.relpath(entry, folder), info.st_mode, info.st_uid, info.st_gid, info.st_size,
                info.st_mtime_ns, target)).encode("utf-8", "surrogateescape"))
    if failed:
        return None
    return "tree %s %o %d %d" % (digest.hexdigest(), stat.S_IMODE(top.st_mode), top.st_uid, top.st_gid)


def _block_item(block):
    file_path, owner = block.rsplit("#", 1)
    data = files.read_text(file_path, limit=MAX_BLOCK_FILE, strip=False)
    if data is None:
        return "absent" if not os.path.lexists(file_path) else None
    return gpu_env_file.block_digest(data, owner)


def _groups_item(user):
    member = account.groups_of(user)
    return "absent" if member is None else " ".join(sorted(member))


def _package_item(listing, name):
    """"VERSION[ held]" of package NAME, "absent"; for a dpkg-query pattern (nvidia-dkms-*), every installed package
    it matches as "NAME=VERSION[ held]", space-separated."""
    def one(found):
        return found["version"] + (" held" if found["held"] else "")

    if not any(c in name for c in "*?["):
        found = listing.get(name)
        return one(found) if found else "absent"
    matched = sorted("%s=%s" % (n, one(f)) for n, f in listing.items() if f and fnmatch.fnmatchcase(n, name))
    return ", ".join(matched) or "absent"


def _yes(value):
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "yes"))


def watch_of(raw):
    """The watch spec RAW typed: {files, trees, packages, units, groups: [str]}, default_target and boot: bool;
    absolute paths only, names of their kinds' shapes; an entry of another shape is dropped."""
    raw = raw if isinstance(raw, dict) else {}
    spec = {}
    for kind in KINDS:
        values = raw.get(kind) or []
        values = values if isinstance(values, list) else [values]
        kept = []
        for value in values:
            if not isinstance(value, str) or not value or "\0" in value or "\n" in value:
                continue
            if kind in ("files", "trees") and not (value.startswith("/") and ".." not in value.split("/")):
                continue
            if kind == "blocks" and not re.match(r"^/[^#]+#[a-z0-9][a-z0-9_.-]*$", value):
                continue
            if kind == "packages" and not re.match(r"^[a-z0-9*?][a-z0-9+.*?-]{0,127}$", value):
                continue
            if kind == "units" and not re.match("^%s$" % systemd.UNIT_NAME, value):
                continue
            if kind == "groups" and not re.match(r"^[a-z_][a-z0-9_.-]{0,31}\$?$", value):
                continue
            if value not in kept:
                kept.append(os.path.normpath(value) if kind in ("files", "trees") else value)
        spec[kind] = kept
    spec["default_target"] = _yes(raw.get("default_target"))
    spec["boot"] = _yes(raw.get("boot"))
    return spec


def read_items(spec, run=None, root="/"):
    """{item key: value or None} of everything SPEC (watch_of) names, as the box is now: one dpkg-query for the
    packages, one `systemctl show` for the units."""
    items = {}
    for file_path in spec["files"]:
        items["file:" + file_path] = _file_item(file_path)
    for folder in spec["trees"]:
        items["tree:" + folder] = _tree_item(folder)
    for block in spec["blocks"]:
        items["block:" + block] = _block_item(block)
    if spec["packages"]:
        listing = packages.listing(spec["packages"], run=run or runner.rc_output)
        for name in spec["packages"]:
            items["package:" + name] = _package_item(listing, name)
    if spec["units"]:
        shown, error = systemd.show(spec["units"], UNIT_PROPS)
        for unit in spec["units"]:
            props = None if error else (shown.get(unit) or {}).get("props")
            items["unit:" + unit] = (" ".join(text.line(props.get(p), 128) or "-" for p in UNIT_PROPS)
                                     if props else None)
    if spec["default_target"]:
        target, error = systemd.default_target()
        items["default_target"] = None if error else target
    for user in spec["groups"]:
        items["groups:" + user] = _groups_item(user)
    if spec["boot"]:
        items["boot"] = kernel.boot_id(root)
    return items


def parse_state(data):
    """A converged state read from the box typed: {role, inputs, items: {key: str}}, or None when it is not one."""
    if not isinstance(data, dict):
        return None
    role = text.matching(data.get("role"), ROLE)
    inputs = text.matching(data.get("inputs"), DIGEST)
    items = data.get("items")
    if not role or not inputs or not isinstance(items, dict) or len(items) > MAX_ITEMS:
        return None
    typed = {}
    for key, value in items.items():
        if not isinstance(key, str) or len(key) > 4096 or not isinstance(value, str) or len(value) > 4096:
            return None
        typed[key] = value
    outputs = data.get("outputs") or {}
    if not isinstance(outputs, dict) or len(outputs) > MAX_OUTPUTS:
        return None
    kept = {}
    for key, value in outputs.items():
        key, value = text.matching(key, ROLE), text.line(value, 4096) if isinstance(value, str) else None
        if not key or value is None:
            return None
        kept[key] = value
    return {"role": role, "inputs": inputs, "items": typed, "outputs": kept}


def judge(state, inputs, current):
    """(converged, why) of one role: its STATE (parse_state, or None) against this run's INPUTS digest and the
    CURRENT values of the things it watched (read_items over the same keys)."""
    if state is None:
        return False, "no converged state on the box"
    if state["inputs"] != inputs:
        return False, "the inputs changed (inventory, host model or collection)"
    changed = [key for key, value in sorted(state["items"].items()) if current.get(key) != value]
    if changed:
        more = len(changed) - WHY_SHOWN
        return False, "changed since it converged: %s%s" % (
            ", ".join(changed[:WHY_SHOWN]), " and %d more" % more if more > 0 else "")
    return True, "converged: %d thing%s as the role left them" % (
        len(state["items"]), "" if len(state["items"]) == 1 else "s")


def spec_of_items(items):
    """The watch spec that reads ITEMS' keys again (the state file holds the keys, not the spec)."""
    spec = {kind: [] for kind in KINDS}
    spec["default_target"] = spec["boot"] = False
    prefixes = {"file:": "files", "tree:": "trees", "package:": "packages", "unit:": "units", "groups:": "groups",
                "block:": "blocks"}
    for key in items:
        if key in ("default_target", "boot"):
            spec[key] = True
            continue
        for prefix, kind in prefixes.items():
            if key.startswith(prefix):
                spec[kind].append(key[len(prefix):])
                break
    return watch_of(spec)


def read_state(role, folder=STATE_DIR):
    data, _error = files.read_json(state_path(role, folder), limit=MAX_STATE)
    return parse_state(data)


def write_state(role, inputs, items, folder=STATE_DIR, outputs=None):
    """Write ROLE's converged state (root-only); the error text, or None. A thing that could not be read (None) is
    written as such: it never matches, so the role runs next time. OUTPUTS ({name: text}): what the role hands the
    roles after it, given back by the read while it is converged (the sglang role's venv for the serve role)."""
    state = {"role": role, "inputs": inputs, "outputs": dict(outputs or {}),
             "items": dict((key, value) for key, value in items.items() if value is not None)}
    unread = sorted(key for key, value in items.items() if value is None)
    if unread:
        state["items"]["unread"] = " ".join(unread)[:4000]
    return files.write_json(state_path(role, folder), state, mode=0o600)


def restamp(roles, inputs, from_boot, layers, folder=STATE_DIR, root="/", check_mode=False):
    """After the reboot a run made: of ROLES, those whose state was written for this run's INPUTS in the boot the run
    started in (FROM_BOOT) and whose BOOT_LAYERS layer the run's ladder then judged pass or warn (LAYERS: {layer:
    status}) get the new boot id as their boot item; every other item is kept as it was (a change there still runs
    the role). ({role: why} of those carried over, {role: why} of those left; nothing written in CHECK_MODE)."""
    now = kernel.boot_id(root)
    carried, left = {}, {}
    for role in roles:
        layer = BOOT_LAYERS.get(role)
        state = read_state(role, folder)
        if state is None or "boot" not in state["items"]:
            continue
        if not now or now == from_boot:
            left[role] = "no reboot since this run began"
        elif state["inputs"] != inputs or state["items"]["boot"] != from_boot:
            left[role] = "its state is not this run's (inputs or boot)"
        elif layers.get(layer) not in HOLDS:
            left[role] = "the ladder judged %s %s after the reboot" % (layer or "no layer",
                                                                       layers.get(layer, "nothing"))
        else:
            items = dict(state["items"], boot=now)
            error = None if check_mode else write_state(role, inputs, items, folder, state["outputs"])
            if error:
                left[role] = error
            else:
                carried[role] = "%s %s after the reboot" % (layer, layers[layer])
    return carried, left


def forget(role, folder=STATE_DIR):
    try:
        os.unlink(state_path(role, folder))
    except FileNotFoundError:
        pass
