#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: static_ladder
short_description: "Climb the static P2P layers in one call: firmware, PCIe link, DMA window, kernel, driver"
description:
  - Judges the selected static layers in ladder order with the same collectors and judges as the one-layer
    modules (M(rigbook.homelab.firmware), M(rigbook.homelab.pcie_link), M(rigbook.homelab.dma_window),
    M(rigbook.homelab.kernel_state), M(rigbook.homelab.driver_state)), and stops at the first layer whose
    verdict is C(fail); the layers above it are not judged.
  - One module run for all of them, so a host pays for one interpreter start and one payload instead of five.
  - The task fails when a layer fails, with that layer's measured and expected values and remedy in the
    message; C(warn) and C(unknown) verdicts are reported as warnings.
  - Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  layers:
    description:
      - The static layers to judge, any of C(firmware), C(pcie_link), C(dma_window), C(kernel_state),
        C(driver_state). They are judged in ladder order whatever order they are given in.
    type: list
    elements: str
    default: [firmware, pcie_link, dma_window, kernel_state, driver_state]
extends_documentation_fragment:
  - rigbook.homelab.ladder
"""

EXAMPLES = r"""
- name: Judge the five static layers
  rigbook.homelab.static_ladder:
    profile:
      gpu: "{{ rigbook_gpu }}"
      p2p: "{{ rigbook_p2p }}"
      pins: "{{ rigbook_pins }}"

- name: Judge only the PCIe link and the DMA window of a recorded tree
  rigbook.homelab.static_ladder:
    root: /var/lib/rigbook-lab/evidence
    layers: [pcie_link, dma_window]
"""

RETURN = r"""
ladder:
  description: The verdicts in ladder order, up to and including the first C(fail).
  returned: always
  type: list
  elements: dict
  contains:
    layer: {description: "The layer id, e.g. V(pcie_link)", type: str}
    status: {description: "pass, warn, fail, skip or unknown", type: str}
    measured: {description: What was found., type: raw}
    expected: {description: What the profile asks for., type: raw}
    why: {description: The reason for the status., type: str}
    remedy: {description: What to do when it is not pass., type: str}
evidence:
  description: The raw evidence the verdicts were judged from.
  returned: always
  type: dict
"""

from ansible_collections.rigbook.homelab.plugins.module_utils.ansible_glue import run_static_ladder


def main():
    run_static_ladder()


if __name__ == "__main__":
    main()
