#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: device_groups
short_description: Put an existing user into the GPU device groups, making the groups where udev did not
description:
  - One run in place of a group task per group plus a user task - the groups (C(render), C(video)) are made as
    system groups when absent (a minimal system or a container may lack C(render)), then the user is added to those
    it is not in. Reads the group and user databases with the standard library; runs nothing when all is in place.
  - Supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  user:
    description: The user (it must exist).
    type: str
    required: true
  groups:
    description: The device groups.
    type: list
    elements: str
    default: [render, video]
extends_documentation_fragment:
  - rigbook.homelab.attributes.changes
"""

EXAMPLES = r"""
- name: The service user in render and video
  rigbook.homelab.device_groups:
    user: rigbook
    groups: [render, video]
"""

RETURN = r"""
done:
  description: What was (or in check mode would be) made or added.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import account
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner


def main():
    module = AnsibleModule(
        argument_spec=dict(user=dict(type="str", required=True),
                           groups=dict(type="list", elements="str", default=["render", "video"])),
        supports_check_mode=True,
    )
    todo = account.changes(module.params["user"], module.params["groups"])
    if any(argv is False for _, argv in todo):
        module.fail_json(msg="user %s does not exist: create it before adding it to %s"
                         % (module.params["user"], ", ".join(module.params["groups"])))
    done = [what for what, _ in todo]
    if todo and not module.check_mode:
        def run(argv):
            result = runner.run(argv)
            if result.rc is None:
                module.fail_json(msg=result.error, done=done)
            if result.rc != 0:
                module.fail_json(msg="%s failed (rc %d): %s" % (" ".join(argv), result.rc,
                                                                (result.stderr or result.stdout).strip()), done=done)
        account.apply(todo, run)
    module.exit_json(changed=bool(todo), done=done)


if __name__ == "__main__":
    main()
