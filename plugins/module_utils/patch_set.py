# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A pinned patch set: each patch a file with its sha256, tried with `patch --dry-run` before it is applied
(standard library only). Used by the source_build module (RCCL) and the pinned_venv module (SGLang)."""

from __future__ import annotations

import hashlib
import os
import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, runner

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def resolve_paths(patches, patch_dir, owner):
    """Give every patch its path on the host (PATCH_DIR joined with its name, or its own path). Returns an error
    message naming OWNER and the patch, or None."""
    for patch in patches:
        given = patch.get("path") or patch.get("name")
        if not given:
            return "%s: every patch needs a path or a name" % owner
        if patch_dir:
            patch["path"] = os.path.join(patch_dir, os.path.basename(given))
        elif not patch.get("path"):
            return "%s: patch %s needs a path (or a patch_dir)" % (owner, given)
    return None


def verify(patches, check_mode, owner):
    """Check each patch's sha256 against its pin. Returns (missing paths, error message or None, sha256 of the
    failing patch or None); a patch not on the host yet is only allowed in check mode."""
    missing = []
    for patch in patches:
        pin = (patch.get("sha256") or "").lower()
        if not SHA256.match(pin):
            return missing, "patch %s: sha256 %r is not 64 hex digits" % (patch["path"], patch.get("sha256")), None
        if not os.path.isfile(patch["path"]):
            if check_mode:
                missing.append(patch["path"])
                continue
            return missing, "patch %s (%s) does not exist" % (patch["path"], owner), None
        got = files.sha256_of(patch["path"])
        if got != pin:
            return missing, ("refused patch %s (%s): its sha256 is %s, pinned %s; nothing was changed"
                             % (patch["path"], owner, got, pin)), got
    return missing, None, None


def set_id(tagged_shas):
    """A short hash naming a patch set ("stock" for none) from its "owner:sha256" strings, in order."""
    if not tagged_shas:
        return "stock"
    return hashlib.sha256("\n".join(tagged_shas).encode()).hexdigest()[:12]


def argv(patch, top, dry_run):
    cmd = ["patch", "-p%d" % patch.get("strip", 1), "--forward", "--batch", "-d", top, "-i", patch["path"]]
    if dry_run:
        cmd.insert(1, "--dry-run")
    return cmd


def apply(patches, top, dry_run, run=None):
    """Try (DRY_RUN) or apply PATCHES in TOP in order through RUN(argv) -> runner.Result (facts/runner.run).

    Returns (names done, files patched, failure) where failure is None or a dict: name, path, files (those GNU
    patch could not patch) and text (its output, or why it could not run)."""
    run = run or runner.run
    names, touched = [], []
    for patch in patches:
        result = run(argv(patch, top, dry_run))
        text = (result.stdout + result.stderr).strip()
        name = os.path.basename(patch["path"])
        if result.rc != 0:
            text = text or result.error or ""
            return names, touched, dict(name=name, path=patch["path"], files=failing_files(text), text=text)
        names.append(name)
        touched += [f for f in patched_files(text) if f not in touched]
    return names, touched, None


def failure_message(failure, what):
    """The words for a patch that no longer applies to WHAT (e.g. "rccl 2.27.8 (/path/to/source)")."""
    files = failure["files"]
    return ("patch %s no longer applies to %s: %s%s. The pinned source changed (a version bump?): update or drop "
            "the patch, or pin the source it was made for"
            % (failure["name"], what, "failed on %s" % ", ".join(files) if files else "patch said",
               ": " + failure["text"][-600:] if not files else ""))


def patched_files(text):
    """The files GNU patch reports patching ("patching file X" / "checking file X")."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(?:checking|patching) file (.+?)\s*$", line)
        if m and m.group(1).strip("'\"") not in out:
            out.append(m.group(1).strip("'\""))
    return out


def failing_files(text):
    """The files GNU patch could not patch, from its output: "checking/patching file X" followed by a FAILED hunk or
    a reversed (already applied) patch, or "can't find file to patch" followed by the diff header naming it."""
    files, current, missing = [], None, False
    for line in text.splitlines():
        m = re.match(r"^(?:checking|patching) file (.+?)\s*$", line)
        if m:
            current, missing = m.group(1).strip("'\""), False
            continue
        if "can't find file to patch" in line:
            missing = True
            continue
        header = re.match(r"^\|?(?:---|\+\+\+) (?:[ab]/)?(\S+)", line)
        if missing and header:
            if header.group(1) not in files and header.group(1) != "/dev/null":
                files.append(header.group(1))
            missing = False
        elif current and ("FAILED" in line or "Reversed (or previously applied)" in line) and current not in files:
            files.append(current)
    return files
