#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: artifact
short_description: Make a pinned artifact available on the host, refusing it when its sha256 differs
description:
  - An artifact of C(rigbook_pins) is a O(url) (V(https://), V(http://) or V(file://)) or a O(path) on the host
    (an offline artifact directory, a mounted share), with its O(sha256).
  - A O(path) is verified where it is; a O(url) is downloaded into O(dest_dir) (kept there; an existing copy with
    the right sha256 is reused) and verified before it is moved into place.
  - A sha256 mismatch fails the task and leaves nothing new on the host, so later tasks install nothing.
  - Supports check mode (a verified existing file is reported unchanged; a missing download as a change).
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  url:
    description: Where to download the artifact from.
    type: str
  path:
    description: The artifact's path on the host.
    type: path
  sha256:
    description: Expected SHA-256 (hex) of O(url) or O(path).
    type: str
  artifacts:
    description: Several artifacts at once (each C({url or path, sha256}), optionally with its own C(dest_dir));
      the first mismatch fails the task.
    type: list
    elements: dict
  dest_dir:
    description: Download directory for O(url) artifacts.
    type: path
    default: /var/cache/rigbook/artifacts
extends_documentation_fragment:
  - rigbook.homelab.attributes.fetches
"""

EXAMPLES = r"""
- name: Verify the driver source tarball
  rigbook.homelab.artifact:
    path: /var/cache/rigbook/artifacts/open-gpu-kernel-modules-615.71.09-p2p.tar.gz
    sha256: 6d1cb368de6119af24d6144e51143270bec84cd1f4c5a9d6045f09df5e1b9ff8
"""

RETURN = r"""
path:
  description: Where the (first) verified artifact is on the host.
  returned: always
  type: str
paths:
  description: Where each verified artifact is on the host.
  returned: always
  type: list
  elements: str
"""

import os
import re
import shutil
import tempfile
from http.client import HTTPException
from urllib.parse import urlparse

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import ConnectionError as UrlConnectionError
from ansible.module_utils.urls import open_url
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

SCHEMES = ("https", "http", "file")


def ensure(module, url, path, want, dest_dir):
    """(changed, path) of one artifact; fails the module on a mismatch (nothing new stays on the host)."""
    want = want.lower()
    if path:
        if not os.path.isfile(path):
            module.fail_json(msg="artifact %s does not exist on the host" % path, path=path)
        found = files.sha256_of(path)
        if found != want:
            module.fail_json(msg="refused artifact %s: sha256 %s, pinned %s" % (path, found, want), path=path,
                             sha256=found)
        return False, path
    name = os.path.basename(urlparse(url).path) or "artifact"
    dest = os.path.join(dest_dir, name)
    if os.path.isfile(dest) and files.sha256_of(dest) == want:
        return False, dest
    if module.check_mode:
        return True, dest
    if not os.path.isdir(dest_dir):
        os.makedirs(dest_dir, 0o755)
    fd, tmp = tempfile.mkstemp(prefix=".download-", dir=dest_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            if url.startswith("file://"):
                with open(urlparse(url).path, "rb") as src:
                    shutil.copyfileobj(src, out)
            else:
                response = open_url(url, timeout=60)
                try:
                    shutil.copyfileobj(response, out)
                finally:
                    response.close()
        found = files.sha256_of(tmp)
        if found != want:
            module.fail_json(msg="refused artifact %s: sha256 %s, pinned %s (download discarded)" % (url, found, want),
                             sha256=found, path=dest)
        os.chmod(tmp, 0o644)
        files.move_atomic(tmp, dest)  # verified, then kept: nothing unverified is ever at DEST
    except (OSError, ValueError, HTTPException, UrlConnectionError) as exc:
        module.fail_json(msg="could not fetch %s: %s" % (url, exc), path=dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return True, dest


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str"),
            path=dict(type="path"),
            sha256=dict(type="str"),
            artifacts=dict(type="list", elements="dict"),
            dest_dir=dict(type="path", default="/var/cache/rigbook/artifacts"),
        ),
        mutually_exclusive=[("url", "path", "artifacts")],
        required_one_of=[("url", "path", "artifacts")],
        required_by={"url": "sha256", "path": "sha256"},
        supports_check_mode=True,
    )
    p = module.params
    items = p["artifacts"] if p["artifacts"] is not None else [dict(url=p["url"], path=p["path"], sha256=p["sha256"])]
    changed, paths = False, []
    for item in items:
        if not item.get("sha256") or bool(item.get("url")) == bool(item.get("path")):
            module.fail_json(msg="an artifact needs a sha256 and exactly one of url or path: %s" % item)
        if not isinstance(item["sha256"], str) or not re.match(r"^[0-9a-fA-F]{64}$", item["sha256"]):
            module.fail_json(msg="sha256 of %s must be 64 hex digits, not %r" % (item.get("url") or item.get("path"),
                                                                                 item["sha256"]))
        if item.get("url") and urlparse(item["url"]).scheme not in SCHEMES:
            module.fail_json(msg="unsupported URL %s: use https://, http:// or file://" % item["url"])
        one, path = ensure(module, item.get("url"), item.get("path"), item["sha256"],
                           item.get("dest_dir") or p["dest_dir"])
        changed = changed or one
        paths.append(path)
    module.exit_json(changed=changed, path=paths[0] if paths else None, paths=paths)


if __name__ == "__main__":
    main()
