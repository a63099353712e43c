#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: gpu_env
short_description: Own one named block of keys in the GPU stack's one environment file
description:
  - The GPU stack has one environment file (default C(/etc/rigbook/gpu.env), C(KEY=value) lines that both
    systemd's C(EnvironmentFile=) and C(set -a; . FILE) read). Several roles write it; each owns one block,
    named by O(owner), between C(# BEGIN <owner>) and C(# END <owner>) lines.
  - A call makes the caller's block hold exactly O(env) (keys sorted) and leaves every other block and line as
    it is, so two roles never undo each other. A key another block or an unmanaged line already sets is an
    error naming its owner (one key, one owner). O(state=absent) removes the caller's block.
  - The file is written atomically, root-owned, mode 0644 (its directory 0755), only when its text changes.
  - Supports check mode and diff mode (the file before and after).
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  path:
    description: The environment file.
    type: path
    default: /etc/rigbook/gpu.env
  owner:
    description: The block's name (the role writing it, e.g. V(amd_rocm), V(rccl)).
    type: str
    required: true
  env:
    description: The keys of the block and their values (booleans become 1 and 0). Values may hold spaces,
      not quotes, backslashes, C($) or backticks.
    type: dict
    default: {}
  state:
    description: V(present) writes the block; V(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: Put ROCm's keys into the GPU environment file
  rigbook.homelab.gpu_env:
    owner: amd_rocm
    env:
      HSA_ENABLE_IPC_MODE_LEGACY: "0"
      NCCL_P2P_LEVEL: PHB

- name: Add the RCCL prefix (another role, another block of the same file)
  rigbook.homelab.gpu_env:
    owner: rccl
    env:
      LD_LIBRARY_PATH: /opt/rigbook/rccl/2.27.7-1a2b3c4d/lib
"""

RETURN = r"""
env:
  description: Every key of the file after the call (all blocks), as the services will see them.
  returned: always
  type: dict
owners:
  description: The owner of each key of the file (V(unmanaged) for lines outside any block).
  returned: always
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.module_utils.gpu_env_file import (
    BARE_RE,
    HEADER,
    KEY_RE,
    OWNER_RE,
    keys_of,
    parse,
)


def render_value(value):
    if isinstance(value, bool):
        value = "1" if value else "0"
    value = "%s" % value
    if any(c in value for c in "\"'\\$`\n\r\0"):
        return None
    return value if BARE_RE.match(value) else '"%s"' % value


def render(blocks, order, loose):
    lines = list(HEADER) + [line for line in loose if line.strip()]
    for owner in order:
        lines += ["# BEGIN %s" % owner] + blocks[owner] + ["# END %s" % owner]
    return "\n".join(lines) + "\n"


def write(module, path, text):
    """TEXT to PATH, mode 0644 (and root's when run as root), through the one atomic write."""
    try:
        files.write_atomic(path, text, 0o644, make_parents=True)
        if os.geteuid() == 0:
            os.lchown(path, 0, 0)
    except OSError as exc:
        module.fail_json(msg="could not write %s: %s" % (path, exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/rigbook/gpu.env"),
            owner=dict(type="str", required=True),
            env=dict(type="dict", default={}),
            state=dict(type="str", choices=["present", "absent"], default="present"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path, owner = p["path"], p["owner"]
    if not OWNER_RE.match(owner):
        module.fail_json(msg="owner %r: use lower-case letters, digits, '_', '.', '-'" % owner)
    before = files.read_text(path, strip=False)
    blocks, order, loose = parse(before or "")
    others = {}
    for other in order:
        if other != owner:
            for key in keys_of(blocks[other]):
                others[key] = other
    for key in keys_of(loose):
        others.setdefault(key, "unmanaged")
    if p["state"] == "present":
        lines = []
        for key in sorted(p["env"]):
            if not KEY_RE.match(key):
                module.fail_json(msg="%s: bad key %r (letters, digits and _, not starting with a digit)" % (owner, key))
            if key in others:
                module.fail_json(msg="%s cannot set %s in %s: the block %r already sets it (one key, one owner)"
                                 % (owner, key, path, others[key]))
            value = render_value(p["env"][key])
            if value is None:
                module.fail_json(msg="%s: the value of %s holds a quote, backslash, $ or backtick: %r"
                                 % (owner, key, p["env"][key]))
            lines.append("%s=%s" % (key, value))
        if owner not in blocks:
            order.append(owner)
        blocks[owner] = lines
    elif owner in blocks:
        del blocks[owner]
        order.remove(owner)
    after = render(blocks, order, loose) if order or any(line.strip() for line in loose) else None
    stat = os.stat(path) if before is not None else None
    fix_mode = stat is not None and after is not None and (
        (stat.st_mode & 0o7777) != 0o644 or (os.geteuid() == 0 and (stat.st_uid, stat.st_gid) != (0, 0)))
    changed = after != before or fix_mode
    if changed and not module.check_mode:
        if after is None:
            os.remove(path)
        else:
            write(module, path, after)
    env, owners = {}, {}
    for name in order:
        for key, value in keys_of(blocks[name]).items():
            env[key], owners[key] = value, name
    for key, value in keys_of(loose).items():
        env.setdefault(key, value)
        owners.setdefault(key, "unmanaged")
    result = dict(changed=changed, env=env, owners=owners, path=path)
    if module._diff and changed:
        result["diff"] = dict(before=before or "", after=after or "", before_header=path, after_header=path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
