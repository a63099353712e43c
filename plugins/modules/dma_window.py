#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: dma_window
short_description: "Judge the DMA window layer: every GPU BAR within its peers' DMA reach"
description:
  - Each GPU's highest BAR must end below the peer's DMA mask (amdgpu 44 bits, NVIDIA 47 bits) unless the IOMMU translates peer DMA.
  - One GPU gives C(skip).
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
- name: Judge the dma_window layer
  rigbook.homelab.dma_window:
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
    layer: {description: "V(dma_window)", type: str}
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
    run_layer("dma_window")


if __name__ == "__main__":
    main()
