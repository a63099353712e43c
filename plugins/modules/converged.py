#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: converged
short_description: Which roles a box still holds as they last converged (one read), and each role's converged state
description:
  - With O(roles), reads the converged state of each role (C(/var/lib/rigbook/converged/ROLE.json)) and everything
    it watched, as the box is now, and says per role whether it is converged - its inputs digest equals O(inputs) and
    every watched thing reads as the role left it - and if not, why. A role in O(force) is never converged. One
    module run for every role; site.yml runs a converged role's tasks not at all
    (plugins/module_utils/converged.py).
  - With O(roles) and O(restamp_boot) (the boot id the run began in, as the read returned it), after site.yml rebooted
    the box and its ladder judged O(layers), carries the state of each boot-watching role written in that boot for
    these inputs over to the new boot, when the layer that judges what the role prepared (firmware, kernel_state,
    driver_state) is pass or warn; its other watched things are kept as they were.
  - With O(role) and O(watch), writes that role's converged state - O(inputs) and what each watched thing is now.
    The role's last task; nothing is written in check mode. The state is rigbook's own bookkeeping, reported as no
    change.
  - Supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  inputs:
    description: The digest of this run's inputs (the host model action's C(inputs_digest)).
    type: str
    required: true
  roles:
    description: The roles to judge (read).
    type: list
    elements: str
  force:
    description: Roles that run whatever their state says (those this run's --tags names).
    type: list
    elements: str
    default: []
  role:
    description: The role whose state is written (write).
    type: str
  watch:
    description: What the role's tasks check, written with their current values - files, trees, packages, units,
      groups, blocks (C(PATH#OWNER), a role's block of the GPU environment file) (lists), default_target and boot
      (booleans).
    type: dict
  outputs:
    description: What the role hands the roles after it (name to text), given back by the read while the role is
      converged (the sglang role's venv, for the serve role).
    type: dict
    default: {}
  restamp_boot:
    description: The boot id the run began in (the read's RV(boot)); with O(roles), carries states over a reboot.
    type: str
  layers:
    description: With O(restamp_boot), the run's ladder verdicts after the reboot (layer to status).
    type: dict
    default: {}
  state_dir:
    description: Where the states are kept.
    type: path
    default: /var/lib/rigbook/converged
attributes:
  check_mode:
    support: full
    description: Reads the same; writes nothing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Read which roles are converged
  rigbook.homelab.converged:
    inputs: "{{ rigbook_inputs }}"
    roles: "{{ rigbook_host.roles }}"
  register: rigbook_converged

- name: Note what the kernel role left
  rigbook.homelab.converged:
    inputs: "{{ rigbook_inputs }}"
    role: kernel
    watch:
      files: [/etc/default/grub.d/60-rigbook.cfg]
      packages: [linux-image-6.8.0-45-generic]
      boot: true
"""

RETURN = r"""
roles:
  description: Per role read, C({converged, why}), and C(outputs) when converged.
  type: dict
  returned: with roles
pending:
  description: The roles read that are not converged, in the order given.
  type: list
  elements: str
  returned: with roles
boot:
  description: The box's boot id now (what O(restamp_boot) is given after a reboot).
  type: str
  returned: with roles
carried:
  description: The roles whose states were carried over the reboot, role to the verdict that vouched for it.
  type: dict
  returned: with restamp_boot
left:
  description: The boot-watching roles whose states were not carried over, role to why (they run at the next run).
  type: dict
  returned: with restamp_boot
watched:
  description: How many things the written state holds.
  type: int
  returned: with role
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import converged
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import kernel


def main():
    module = AnsibleModule(
        argument_spec=dict(
            inputs=dict(type="str", required=True),
            roles=dict(type="list", elements="str"),
            force=dict(type="list", elements="str", default=[]),
            role=dict(type="str"),
            watch=dict(type="dict"),
            outputs=dict(type="dict", default={}),
            restamp_boot=dict(type="str"),
            layers=dict(type="dict", default={}),
            state_dir=dict(type="path", default=converged.STATE_DIR),
        ),
        mutually_exclusive=[("roles", "role")],
        required_one_of=[("roles", "role")],
        required_together=[("role", "watch")],
        supports_check_mode=True,
    )
    p = module.params
    if not re.match("^%s$" % converged.DIGEST, p["inputs"]):
        module.fail_json(msg="inputs: not a sha256 digest: %r" % p["inputs"][:80])
    for name in (p["roles"] or []) + ([p["role"]] if p["role"] else []):
        if not re.match("^%s$" % converged.ROLE, name):
            module.fail_json(msg="not a role name: %r" % name[:80])
    if p["restamp_boot"]:
        if p["role"] or not re.match(r"^[0-9a-f-]{1,64}$", p["restamp_boot"]):
            module.fail_json(msg="restamp_boot: a boot id and roles, not role: %r" % p["restamp_boot"][:80])
        layers = dict((str(k), str(v)) for k, v in p["layers"].items())
        carried, left = converged.restamp(p["roles"], p["inputs"], p["restamp_boot"], layers, p["state_dir"],
                                          check_mode=module.check_mode)
        module.exit_json(changed=False, carried=carried, left=left, msg="%d role state%s carried over the reboot%s" % (
            len(carried), "" if len(carried) == 1 else "s", ": " + ", ".join(sorted(carried)) if carried else ""))
    if p["role"]:
        items = converged.read_items(converged.watch_of(p["watch"]))
        if not module.check_mode:
            outputs = dict((str(k), str(v)) for k, v in p["outputs"].items())
            error = converged.write_state(p["role"], p["inputs"], items, p["state_dir"], outputs)
            if error:
                module.fail_json(msg="%s: %s" % (p["role"], error))
        module.exit_json(changed=False, watched=len(items),
                         msg="%s: %d thing%s noted as converged%s" % (
                             p["role"], len(items), "" if len(items) == 1 else "s",
                             " (check mode: not written)" if module.check_mode else ""))
    states = dict((role, converged.read_state(role, p["state_dir"])) for role in p["roles"])
    # every watched thing of every role read at once (one dpkg-query, one systemctl show)
    watched = {}
    for state in states.values():
        watched.update(state["items"] if state else {})
    current = converged.read_items(converged.spec_of_items(watched))
    roles, pending = {}, []
    for role in p["roles"]:
        if role in p["force"]:
            verdict = (False, "named by --tags")
        else:
            verdict = converged.judge(states[role], p["inputs"], current)
        roles[role] = {"converged": verdict[0], "why": verdict[1]}
        if verdict[0]:
            roles[role]["outputs"] = states[role]["outputs"]
        if not verdict[0]:
            pending.append(role)
    module.exit_json(changed=False, roles=roles, pending=pending, boot=kernel.boot_id("/"),
                     msg="; ".join("%s: %s" % (role, roles[role]["why"]) for role in p["roles"]) or "no roles")


if __name__ == "__main__":
    main()
