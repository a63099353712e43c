#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: kernel_state
short_description: "Judge the kernel layer: pinned release, command line, P2PDMA, uvm HMM"
description:
  - The running kernel is the pinned release and its command line has the pinned flags (e.g. C(intel_iommu=on iommu=pt)).
  - AMD with P2P expected: CONFIG_PCI_P2PDMA and CONFIG_HSA_AMD_P2P are built in, and GPUs on different root ports sit under a host bridge the kernel allows for P2PDMA.
  - NVIDIA with C(iommu=pt): nvidia_uvm runs with HMM disabled.
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
- name: Judge the kernel_state layer
  rigbook.homelab.kernel_state:
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
    layer: {description: "V(kernel_state)", type: str}
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
    run_layer("kernel_state")


if __name__ == "__main__":
    main()
