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
  - Runs C(apt-get update) only when the source or the key changed; when that update fails, a source file this
    call created is removed again (nothing half-configured stays) and the task fails with apt's message.
  - Without O(uris) only the preferences file is written (offline .deb installs use the same pins).
  - One module run for all three files; supports check mode (the key is still fetched and checked, so a wrong
    sha256 fails in check mode too) and diff mode.
version_added: "1.0.0"
author:
  - rigbook developers
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
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

SOURCES_DIR = "/etc/apt/sources.list.d"
KEYRINGS_DIR = "/etc/apt/keyrings"
PREFERENCES_DIR = "/etc/apt/preferences.d"
ARMOR = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"


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
            key_url=dict(type="str"),
            key_sha256=dict(type="str"),
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
    changes = [(path, content, binary, read(path, binary)) for path, content, binary in wanted]
    changes = [c for c in changes if c[3] != state(c[1], c[2])]
    changed_files = [c[0] for c in changes]
    apt_changed = any(not path.startswith(PREFERENCES_DIR) for path in changed_files)
    updated = False
    if changes and not module.check_mode:
        for path, content, _binary, _old in changes:
            write(path, content)
        if apt_changed and p["update"]:
            rc, out, err = run_apt(["apt-get", "-q", "update"], p["lock_timeout"])
            updated = True
            if rc != 0 or re.search(r"^(W|E): .*(rigbook-%s|NO_PUBKEY|not signed)" % re.escape(name),
                                    out + err, re.M):
                for path, _content, _binary, old in changes:
                    if path.startswith(SOURCES_DIR):
                        if old is None:
                            os.remove(path)
                        else:
                            write(path, old)
                module.fail_json(msg="apt-get update failed for the %s repository (source file restored): %s"
                                 % (name, (err or out).strip()[-1500:]), files=changed_files)
    result = dict(changed=bool(changes), files=changed_files, keyring=keyring, updated=updated)
    if module._diff and changes:
        def show(content, binary):
            return "(%d bytes of key)\n" % len(content) if isinstance(content, bytes) else (
                "(key of sha256 %s)\n" % content if binary else content)

        result["diff"] = [dict(before_header=path, after_header=path,
                               before=show(old, binary) if old is not None else "", after=show(content, binary))
                          for path, content, binary, old in changes]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
