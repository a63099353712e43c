#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: apt_source
short_description: A pinned apt repository in one call - signing key by sha256, deb822 source, preferences
description:
  - Fetches the repository's signing key from O(key_url) (V(https://), V(http://) or V(file://)) and refuses it
    unless its sha256 is O(key_sha256); writes it to C(/etc/apt/keyrings/rigbook-<name>.asc) (ASCII-armored) or
    C(.gpg) (binary).
  - Writes the deb822 source C(/etc/apt/sources.list.d/rigbook-<name>.sources) with C(Signed-By) naming that
    keyring only, and the apt preferences C(/etc/apt/preferences.d/rigbook-<name>) from O(preferences) (a pin
    so exactly one version installs, a negative priority so a package never installs).
  - Every other apt source of the same URI and suite (one-line files, deb822 stanzas, C(/etc/apt/sources.list)) is
    disabled first, with a backup, so apt never reads two entries for one repository - with another C(Signed-By)
    apt refuses them all ("Conflicting values set for option Signed-By regarding source ...") and C(apt-get update)
    fails. A file whose every entry is such a source (amdgpu-install's C(rocm.list)) is moved to
    C(NAME.rigbook.disabled) beside it (apt ignores C(*.disabled) silently); in a file with other entries those
    lines are commented out (a deb822 stanza gets C(Enabled) set to C(no)) and the file is first copied to
    C(/var/lib/rigbook/apt/backup/). Each is said in RV(disabled) and as a warning, in check mode too
    (C(would disable ...)).
  - Runs C(apt-get update) only when the source, the key or another source changed; when that update fails, a
    source file this call created is removed again and every source it disabled is put back as it was (nothing
    half-configured stays) and the task fails with apt's message.
  - Without O(uris) only the preferences file is written (offline .deb installs use the same pins).
  - One module run for all three files; supports check mode (the key is still fetched and checked, so a wrong
    sha256 fails in check mode too) and diff mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  name:
    description: Short name of the repository (file names).
    type: str
    required: true
  uris:
    description: The repository URL.
    type: str
  suites:
    description: Suites (distribution code names).
    type: list
    elements: str
    default: []
  components:
    description: Components.
    type: list
    elements: str
    default: [main]
  architectures:
    description: Architectures to read (all of apt's when empty).
    type: list
    elements: str
    default: []
  key_url:
    description: Where the signing key is.
    type: str
  key_sha256:
    description: SHA-256 of the key file at O(key_url).
    type: str
  preferences:
    description:
      - Pins, each a dict with C(package) (names, space-separated), C(pin) (e.g. C(version /^.*\\.70100-.*$/)) and
        C(priority) (1001 installs exactly that version; -1 never installs the package).
      - apt honours a C(version) pin only for named packages, not for C(*), and matches a version glob only as a
        prefix (a trailing C(*)); use an anchored regex for anything else.
    type: list
    elements: dict
    default: []
  update:
    description: Run apt-get update when the source or key changed.
    type: bool
    default: true
  lock_timeout:
    description: Seconds to wait for the package lists' lock another process holds before apt-get update fails.
    type: int
    default: 300
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: Pin ROCm 7.1.0 from AMD's repository
  rigbook.homelab.apt_source:
    name: rocm
    uris: https://repo.radeon.com/rocm/apt/7.1
    suites: [noble]
    components: [main]
    key_url: https://repo.radeon.com/rocm/rocm.gpg.key
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000000"
    preferences:
      - {package: "rocm-core rocminfo rocm-smi-lib hip-runtime-amd", pin: 'version /^.*\.70100-.*$/', priority: 1001}
      - {package: amdgpu-dkms, pin: "version *", priority: -1}
"""

RETURN = r"""
files:
  description: The files this call wrote (or would write).
  returned: always
  type: list
  elements: str
keyring:
  description: The keyring file Signed-By names (null without O(uris)).
  returned: always
  type: str
updated:
  description: Whether apt-get update ran.
  returned: always
  type: bool
disabled:
  description: The other sources of the same URI and suite this call disabled (or would, in check mode), each in words
    with its file, why and where its backup is.
  returned: always
  type: list
  elements: str
"""

import hashlib
import os
import re
from http.client import HTTPException
from urllib.parse import urlparse

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import ConnectionError as UrlConnectionError
from ansible.module_utils.urls import open_url
from ansible_collections.rigbook.homelab.plugins.module_utils.apt import LOCK_TIMEOUT, run_apt
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import apt_sources, files

# Where the files are: under ROOT ("/"; a fake root in tests), as paths on the box.
ROOT = "/"
SOURCES_DIR = "/etc/apt/sources.list.d"
KEYRINGS_DIR = "/etc/apt/keyrings"
PREFERENCES_DIR = "/etc/apt/preferences.d"
BACKUP_DIR = "/var/lib/rigbook/apt/backup"
# apt reads no file of sources.list.d whose name ends in .disabled, and says nothing of it (apt-pkg/init.cc:
# Dir::Ignore-Files-Silently "\.disabled$")
DISABLED_SUFFIX = ".rigbook.disabled"
ARMOR = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"
# apt's refusal of two entries of one repository (apt-pkg/deb/debmetaindex.cc: "Conflicting values set for option %s
# regarding source %s %s: %s != %s", the option, URI, suite and both values)
CONFLICT = re.compile(r"Conflicting values set for option (\S+) regarding source (\S+) (\S+?):? ")


def fetch(module, url):
    scheme = urlparse(url).scheme
    try:
        if scheme == "file":
            with open(urlparse(url).path, "rb") as handle:
                return handle.read()
        if scheme in ("http", "https"):
            response = open_url(url, timeout=60)
            try:
                return response.read()
            finally:
                response.close()
    except (OSError, ValueError, HTTPException, UrlConnectionError) as exc:
        module.fail_json(msg="could not fetch the signing key %s: %s" % (url, exc))
    module.fail_json(msg="unsupported key URL %s: use https://, http:// or file://" % url)


def on_disk(box_path):
    """BOX_PATH (/etc/apt/...) under ROOT."""
    return files.path(ROOT, box_path.lstrip("/"))


def state(content, binary):
    """What a file's CONTENT is compared by: its text, or for a key (BINARY) its sha256."""
    return hashlib.sha256(content).hexdigest() if binary else content


def read(path, binary=False):
    """What PATH holds now, as `state` gives it (facts/files.py); None when it is not there."""
    if binary:
        return files.digest(path)[0]
    return files.read_text(path, strip=False)


def write(path, content):
    """CONTENT (text, or a key's bytes) at PATH through the one atomic write (facts/files.write_atomic)."""
    files.write_atomic(path, content, mode=0o644, make_parents=True)


def _uri(uri):
    """A source URI as apt keys it: apt adds the trailing slash itself, so https://x/y and https://x/y/ are one."""
    return uri.rstrip("/")


def _same_source(entry, uri, suites):
    """Whether the apt ENTRY (facts/apt_sources) is enabled and names URI with one of SUITES: apt keys a repository's
    release by URI and suite, whatever the entry's types, and refuses two with different Signed-By."""
    return entry["enabled"] and any(_uri(u) == _uri(uri) for u in entry["uris"]) and bool(
        set(entry["suites"]) & set(suites))


def _why(entry, uri, suites, keyring):
    """Why ENTRY goes, in words."""
    signed = entry["signed_by"]
    which = "%s %s" % (uri, " ".join(s for s in suites if s in entry["suites"]))
    if signed == [keyring]:
        return "same URI as rigbook's source, the same key: apt would read it twice (%s)" % which
    return "same URI as rigbook's source, another Signed-By: apt refuses two (%s, Signed-By %s)" % (
        which, ", ".join(signed) or "none: the keys apt trusts")


def _one_line_disabled(text, uri, suites, note):
    """TEXT of a one-line file with every line that is an entry of URI and one of SUITES commented out (a comment line
    NOTE above it)."""
    out = []
    for line in text.splitlines(True):
        entries = apt_sources.parse_one_line(line)
        if entries and _same_source(entries[0], uri, suites):
            out.append("# %s\n# %s" % (note, line if line.endswith("\n") else line + "\n"))
        else:
            out.append(line)
    return "".join(out)


def _deb822_disabled(text, uri, suites, note):
    """TEXT of a deb822 file with every stanza of URI and one of SUITES given Enabled: no (replacing an Enabled line;
    a comment line NOTE above the stanza)."""
    out, stanza = [], []

    def flush():
        entries = apt_sources.parse_deb822("".join(stanza))
        if entries and _same_source(entries[0], uri, suites):
            kept = [line for line in stanza if not re.match(r"^Enabled\s*:", line, re.I)]
            if kept and not kept[-1].endswith("\n"):
                kept[-1] += "\n"
            out.extend(["# %s\n" % note] + kept + ["Enabled: no\n"])
        else:
            out.extend(stanza)
        del stanza[:]

    for line in text.splitlines(True):
        if line.strip():
            stanza.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "".join(out)


def plan_disable(name, uri, suites, keyring):
    """[{file, why, text, edited, move_to, backup}]: each other file apt reads with an enabled entry of URI and one of
    SUITES (facts/apt_sources.read_all under ROOT). Its ORIGINAL text; EDITED, the text with those entries disabled;
    a file of sources.list.d whose every enabled entry goes is moved aside instead (MOVE_TO, a name apt ignores),
    another is edited in place after a copy to BACKUP."""
    own = "%s/rigbook-%s.sources" % (SOURCES_DIR, name)
    by_file = {}
    for entry in apt_sources.read_all(ROOT):
        if entry["file"] and entry["file"] != own and _same_source(entry, uri, suites):
            by_file.setdefault(entry["file"], []).append(entry)
    plans = []
    for box_path in sorted(by_file):
        original = files.read_text(on_disk(box_path), limit=apt_sources.MAX_FILE + 1, strip=False)
        if original is None:
            continue
        if len(original) > apt_sources.MAX_FILE:
            raise ValueError("%s is over %d characters: rigbook does not rewrite it; disable its entries of %s "
                             "yourself" % (box_path, apt_sources.MAX_FILE, uri))
        why = _why(by_file[box_path][0], uri, suites, keyring)
        note = "Disabled by rigbook (rigbook.homelab.apt_source %s): %s" % (name, why)
        deb822 = box_path.endswith(".sources")
        edited = (_deb822_disabled if deb822 else _one_line_disabled)(original, uri, suites, note)
        parse = apt_sources.parse_deb822 if deb822 else apt_sources.parse_one_line
        left = [e for e in parse(edited) if e["enabled"]]
        plan = {"file": box_path, "why": why, "text": original, "edited": edited, "move_to": None, "backup": None,
                "kept": False}
        if not left and box_path.startswith(SOURCES_DIR + "/"):
            plan["move_to"] = _free(box_path + DISABLED_SUFFIX, original)
            plan["kept"] = os.path.lexists(on_disk(plan["move_to"]))  # the same text kept there by an earlier run
        else:
            digest = hashlib.sha256(original.encode("utf-8")).hexdigest()[:12]
            plan["backup"] = "%s/%s.%s" % (BACKUP_DIR, box_path.strip("/").replace("/", "_"), digest)
        plans.append(plan)
    return plans


def _free(box_path, text):
    """BOX_PATH, or BOX_PATH with a number before its suffix when another file is there already (never overwritten)."""
    candidate, number = box_path, 1
    while os.path.lexists(on_disk(candidate)):
        if files.read_text(on_disk(candidate), limit=apt_sources.MAX_FILE, strip=False) == text:
            return candidate
        number += 1
        candidate = box_path[:-len(".disabled")] + "-%d.disabled" % number
    return candidate


def said(plan, check_mode):
    """What is done to PLAN's file, in words."""
    how = "Enabled: no in its stanza" if plan["file"].endswith(".sources") else "its entry commented out"
    where = ("the file is kept as %s" % plan["move_to"] if plan["move_to"] else
             "%s, the file first copied to %s" % (how, plan["backup"]))
    return "%s %s: %s; %s" % ("would disable" if check_mode else "disabled", plan["file"], plan["why"], where)


def disable(plan):
    """Do PLAN: move the file aside, or copy it to its backup and write it with the entries disabled."""
    if plan["move_to"]:
        if plan["kept"]:
            os.remove(on_disk(plan["file"]))
        else:
            files.move_atomic(on_disk(plan["file"]), on_disk(plan["move_to"]))
        return
    files.write_atomic(on_disk(plan["backup"]), plan["text"], mode=0o600, make_parents=True)
    write(on_disk(plan["file"]), plan["edited"])


def restore(plan):
    """Undo PLAN (a failed apt-get update): the file back as it was (a moved one moved back)."""
    if plan["move_to"] and not plan["kept"] and os.path.lexists(on_disk(plan["move_to"])):
        files.move_atomic(on_disk(plan["move_to"]), on_disk(plan["file"]))
    else:
        write(on_disk(plan["file"]), plan["text"])


def rollback(changes, plans):
    """Put back what a failed call changed: a source file it created removed, one it rewrote and each source it
    disabled (PLANS) as they were. The key and preferences stay: apt reads no key that no source names."""
    for path, _content, _binary, old in changes:
        if path.startswith(SOURCES_DIR):
            if old is None:
                if os.path.lexists(on_disk(path)):
                    os.remove(on_disk(path))
            else:
                write(on_disk(path), old)
    for plan in plans:
        restore(plan)


def preferences_text(name, prefs):
    stanzas = []
    for pref in prefs:
        if not all(k in pref for k in ("package", "pin", "priority")):
            return None
        stanzas.append("Package: %s\nPin: %s\nPin-Priority: %d\n" % (pref["package"], pref["pin"],
                                                                     int(pref["priority"])))
    return "# Managed by rigbook (rigbook.homelab.apt_source): %s\n" % name + "\n".join(stanzas)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            uris=dict(type="str"),
            suites=dict(type="list", elements="str", default=[]),
            components=dict(type="list", elements="str", default=["main"]),
            architectures=dict(type="list", elements="str", default=[]),
            key_url=dict(type="str", no_log=False),  # a public key's address, no secret
            key_sha256=dict(type="str", no_log=False),  # the public key's hash, no secret
            preferences=dict(type="list", elements="dict", default=[]),
            update=dict(type="bool", default=True),
            lock_timeout=dict(type="int", default=LOCK_TIMEOUT),
        ),
        required_by={"uris": ("key_url", "key_sha256")},
        supports_check_mode=True,
    )
    p = module.params
    name = p["name"]
    if not re.match(r"^[a-z0-9][a-z0-9._-]*$", name):
        module.fail_json(msg="name %r: use lower-case letters, digits, '.', '_', '-'" % name)
    wanted = []  # (path, content, binary)
    keyring = None
    if p["uris"]:
        if not p["suites"]:
            module.fail_json(msg="a repository needs suites")
        if not re.match(r"^[0-9a-fA-F]{64}$", p["key_sha256"] or ""):
            module.fail_json(msg="key_sha256 must be 64 hex digits, not %r" % p["key_sha256"])
        key = fetch(module, p["key_url"])
        found = hashlib.sha256(key).hexdigest()
        if found != p["key_sha256"].lower():
            module.fail_json(msg="refused signing key %s: sha256 %s, pinned %s" % (p["key_url"], found,
                                                                                   p["key_sha256"].lower()))
        keyring = os.path.join(KEYRINGS_DIR, "rigbook-%s.%s" % (name, "asc" if key.lstrip().startswith(ARMOR)
                                                                else "gpg"))
        lines = ["# Managed by rigbook (rigbook.homelab.apt_source): %s" % name, "Types: deb",
                 "URIs: %s" % p["uris"], "Suites: %s" % " ".join(p["suites"]),
                 "Components: %s" % " ".join(p["components"])]
        if p["architectures"]:
            lines.append("Architectures: %s" % " ".join(p["architectures"]))
        lines.append("Signed-By: %s" % keyring)
        wanted += [(keyring, key, True), (os.path.join(SOURCES_DIR, "rigbook-%s.sources" % name),
                                          "\n".join(lines) + "\n", False)]
    if p["preferences"]:
        text = preferences_text(name, p["preferences"])
        if text is None:
            module.fail_json(msg="each preference needs package, pin and priority: %s" % p["preferences"])
        wanted.append((os.path.join(PREFERENCES_DIR, "rigbook-%s" % name), text, False))
    changes = [(path, content, binary, read(on_disk(path), binary)) for path, content, binary in wanted]
    changes = [c for c in changes if c[3] != state(c[1], c[2])]
    try:
        plans = plan_disable(name, p["uris"], p["suites"], keyring) if p["uris"] else []
    except ValueError as exc:
        module.fail_json(msg="another apt source of the %s repository: %s" % (name, exc))
    disabled = [said(plan, module.check_mode) for plan in plans]
    for text in disabled:
        module.warn(text)
    changed_files = [c[0] for c in changes] + [plan["file"] for plan in plans]
    apt_changed = bool(plans) or any(not path.startswith(PREFERENCES_DIR) for path, _c, _b, _o in changes)
    updated = False
    if (changes or plans) and not module.check_mode:
        written, done = [], []
        try:
            for change in changes:
                write(on_disk(change[0]), change[1])
                written.append(change)
            for plan in plans:
                disable(plan)
                done.append(plan)
        except OSError as exc:
            rollback(written, done)
            module.fail_json(msg="could not write the %s repository's files (what was written is put back): %s"
                             % (name, exc), files=changed_files, disabled=[])
        if apt_changed and p["update"]:
            rc, out, err = run_apt(["apt-get", "-q", "update"], p["lock_timeout"])
            updated = True
            if rc != 0 or re.search(r"^(W|E): .*(rigbook-%s|NO_PUBKEY|not signed)" % re.escape(name),
                                    out + err, re.M):
                rollback(changes, plans)
                conflict = CONFLICT.search(out + err)
                module.fail_json(msg="apt-get update failed for the %s repository (source file restored%s): %s%s"
                                 % (name, ", the sources it disabled put back" if plans else "",
                                    (err or out).strip()[-1500:],
                                    "; apt refuses two entries of %s %s with different %s: the other is in no file "
                                    "this module reads (/etc/apt/sources.list, sources.list.d/*.list and *.sources): "
                                    "disable it there"
                                    % (conflict.group(2), conflict.group(3), conflict.group(1)) if conflict else ""),
                                 files=changed_files, disabled=[])
    result = dict(changed=bool(changes or plans), files=changed_files, keyring=keyring, updated=updated,
                  disabled=disabled)
    if module._diff and (changes or plans):
        def show(content, binary):
            return "(%d bytes of key)\n" % len(content) if isinstance(content, bytes) else (
                "(key of sha256 %s)\n" % content if binary else content)

        result["diff"] = [dict(before_header=path, after_header=path,
                               before=show(old, binary) if old is not None else "", after=show(content, binary))
                          for path, content, binary, old in changes]
        result["diff"] += [dict(before_header=plan["file"],
                                after_header=plan["move_to"] or plan["file"],
                                before=plan["text"], after=plan["text"] if plan["move_to"] else plan["edited"])
                           for plan in plans]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
