#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: gpu_inventory
short_description: List the NVIDIA and AMD GPUs a host has, from sysfs
description:
  - Reads C(sys/bus/pci/devices) under O(root) and lists every display-class PCI function of
    NVIDIA (0x10de) or AMD (0x1002) with its slot, ids and upstream port.
  - Fails when O(expected_count) is given and the host has another number of such GPUs.
  - Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  expected_count:
    description: How many GPUs the inventory says the host has.
    type: int
  expected_vendor:
    description: Only count GPUs of this vendor.
    type: str
    choices: [nvidia, amd]
extends_documentation_fragment:
  - rigbook.homelab.evidence_root
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: List GPUs and insist on two NVIDIA cards
  rigbook.homelab.gpu_inventory:
    expected_count: 2
    expected_vendor: nvidia
"""

RETURN = r"""
gpus:
  description: The GPUs found, sorted by slot.
  returned: always
  type: list
  elements: dict
  sample:
    - slot: "0000:03:00.0"
      vendor: nvidia
      vendor_id: "0x10de"
      device_id: "0x2216"
      class: "0x030000"
      subsystem: "0x10de:0x1535"
      upstream_port: "0000:00:02.0"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.pci import judge_gpu_count, list_gpus


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            expected_count=dict(type="int"),
            expected_vendor=dict(type="str", choices=["nvidia", "amd"]),
        ),
        supports_check_mode=True,
    )
    gpus, error = list_gpus(module.params["root"])
    if error:
        module.fail_json(msg=error, gpus=[])
    ok, message = judge_gpu_count(gpus, module.params["expected_count"], module.params["expected_vendor"])
    if not ok:
        module.fail_json(msg=message, gpus=gpus)
    module.exit_json(changed=False, gpus=gpus, msg=message)


if __name__ == "__main__":
    main()
