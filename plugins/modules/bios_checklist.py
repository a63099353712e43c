#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: bios_checklist
short_description: Checklist of the BIOS settings GPU P2P needs, each marked done or not from the OS side
description:
  - Reads the firmware evidence of the P2P ladder under O(root) (UEFI boot, where and how large each GPU's VRAM BAR is)
    and returns a checklist of what the user must switch in the BIOS setup - CSM off, Above 4G Decoding, Resizable BAR -
    each item marked done, not done or unknown.
  - It never changes, and never claims to change, a BIOS setting.
  - Fails only when the host variables require P2P (the host model expects P2P) and the firmware layer fails.
  - Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options: {}
extends_documentation_fragment:
  - rigbook.homelab.evidence_root
  - rigbook.homelab.evidence_root.host
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Print what to switch in the BIOS
  rigbook.homelab.bios_checklist:
    host: "{{ rigbook_host }}"
"""

RETURN = r"""
checklist:
  description: One entry per BIOS setting.
  returned: always
  type: list
  elements: dict
  contains:
    item: {description: "V(csm_off), V(above_4g_decoding) or V(resizable_bar)", type: str}
    setting: {description: What to set in the BIOS., type: str}
    done: {description: "true, false, or null when the evidence does not tell", type: bool}
    seen: {description: What the OS shows., type: str}
lines:
  description: The checklist as printable lines.
  returned: always
  type: list
  elements: str
firmware:
  description: The firmware layer's verdict the checklist was judged with.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import bios_checklist
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import static_layers as ladder_static


def main():
    module = AnsibleModule(
        argument_spec=dict(root=dict(type="path", default="/"), host=dict(type="dict", default={})),
        supports_check_mode=True,
    )
    ladder_view = host_model.ladder_view(module.params["host"])
    found = evidence.collect_static(module.params["root"], ("gpus",))
    verdict = ladder_static.judge_firmware(found, ladder_view)
    required = bool((ladder_view.get("p2p") or {}).get("expected"))
    items = bios_checklist.checklist(found, ladder_view)
    lines = bios_checklist.render(items, verdict, required)
    result = dict(changed=False, checklist=items, lines=lines, firmware=verdict, msg="\n".join(lines))
    if required and verdict["status"] == "fail":
        result["msg"] = "P2P is required by the host model but the firmware makes it impossible: %s. %s" % (
            verdict["why"], verdict.get("remedy") or "")
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
