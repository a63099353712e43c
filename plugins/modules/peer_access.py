#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: peer_access
short_description: "Judge the peer_access layer: can-access-peer, enabling it, and a verified pattern copy, both ways"
description:
  - Probes the GPUs through the driver library with ctypes (libcuda.so.1 for NVIDIA, libamdhip64.so for AMD;
    no toolkit needed), in a forked child with a hard timeout.
  - For every ordered pair of GPUs reads can-access-peer, enables peer access, copies a known pattern from one
    GPU to the other and compares it on the host; on AMD also opens the buffer through a HIP IPC handle in a
    second process on the peer GPU.
  - With P2P expected (rigbook_p2p.expected) the task fails unless all of that succeeds both ways, naming the pair
    and the driver's error (seed 000 "mapping of buffer object failed" is C(CUDA_ERROR_MAP_FAILED), a BAR1 too small to map).
  - With P2P declared unavailable, a failing enable is the expected state; the copies must still verify (through host
    memory). Data that comes back wrong fails the task whatever the profile says.
  - One GPU is C(skip). Under a recorded O(root) the probe's saved JSON is judged
    (var/lib/rigbook/commands/cuda-probe.json or hip-probe.json).
  - Read-only (device memory it allocates is freed); supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  root:
    description: Evidence root; V(/) probes the GPUs, anything else reads a recorded probe.
    type: path
    default: /
  profile:
    description: "The host profile, C({gpu: rigbook_gpu, p2p: rigbook_p2p, pins: rigbook_pins})."
    type: dict
    default: {}
  baseline:
    description: Not used by this layer (accepted so one set of arguments serves both runtime layers).
    type: dict
    default: {}
  tolerance:
    description: Not used by this layer.
    type: dict
    default: {}
  evidence:
    description: A probe result already taken (e.g. this module's registered C(evidence)); judged instead of probing.
    type: dict
extends_documentation_fragment:
  - rigbook.homelab.probe
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Peer access between the GPUs
  rigbook.homelab.peer_access:
    profile:
      gpu: "{{ rigbook_gpu }}"
      p2p: "{{ rigbook_p2p }}"
      pins: "{{ rigbook_pins | default({}) }}"
  register: peer

- name: Judge a recorded probe (lab host, replay)
  rigbook.homelab.peer_access:
    root: /var/lib/rigbook/evidence/x99-3080
    profile: {gpu: "{{ rigbook_gpu }}", p2p: "{{ rigbook_p2p }}"}
"""

RETURN = r"""
verdict:
  description: The layer's verdict.
  returned: always
  type: dict
  contains:
    layer: {description: "V(peer_access)", type: str}
    status: {description: "pass, warn, fail, skip or unknown", type: str}
    measured: {description: Per ordered pair, what the driver said and whether the pattern verified., type: raw}
    expected: {description: What the profile asks for., type: raw}
    why: {description: The reason for the status., type: str}
    remedy: {description: What to do when it is not pass., type: str}
evidence:
  description: The probe's result (devices, every ordered pair, bidirectional figures, errors, source).
  returned: always
  type: dict
"""

from ansible_collections.rigbook.homelab.plugins.module_utils.judges.peer_layers import judge_peer_access
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import run_runtime_layer


def main():
    run_runtime_layer("peer_access", lambda evidence, profile, params: judge_peer_access(evidence, profile))


if __name__ == "__main__":
    main()
