#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: driver_state
short_description: "Judge the driver layer: the pinned driver build is loaded and userspace matches"
description:
  - NVIDIA: the loaded module is the pinned fork version, installed under updates/ for the running kernel, and the userspace driver has the same version.
  - AMD: amdgpu is loaded, ROCm is the pinned version, and with P2P expected every KFD GPU node has a P2P link.
  - Evidence is read under O(root); V(/) on a real box, a recorded tree on a lab host or in a replay.
  - The task fails when the verdict is C(fail); C(warn) and C(unknown) are reported as warnings.
  - Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers
extends_documentation_fragment:
  - rigbook.homelab.ladder
"""

EXAMPLES = r"""
- name: Judge the driver_state layer
  rigbook.homelab.driver_state:
    profile:
      gpu: "{{ rigbook_gpu }}"
      p2p: "{{ rigbook_p2p }}"
      pins: "{{ rigbook_pins | default({}) }}"
"""

RETURN = r"""
verdict:
  description: The layer's verdict.
  returned: always
  type: dict
  contains:
    layer: {description: "V(driver_state)", type: str}
    status: {description: "pass, warn, fail, skip or unknown", type: str}
    measured: {description: What was found., type: raw}
    expected: {description: What the profile asks for., type: raw}
    why: {description: The reason for the status., type: str}
    remedy: {description: What to do when it is not pass., type: str}
evidence:
  description: The raw evidence the verdict was judged from.
  returned: always
  type: dict
"""

from ansible_collections.rigbook.homelab.plugins.module_utils.ansible_glue import run_layer


def main():
    run_layer("driver_state")


if __name__ == "__main__":
    main()
