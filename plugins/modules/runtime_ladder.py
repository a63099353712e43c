#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: runtime_ladder
short_description: "Climb the runtime P2P layers in one call: peer access, P2P bandwidth, collectives, NCCL transport"
description:
  - Judges the selected runtime layers in ladder order with the same probes and judges as the one-layer
    modules (M(rigbook.homelab.peer_access), M(rigbook.homelab.p2p_bandwidth), M(rigbook.homelab.collectives),
    M(rigbook.homelab.nccl_transport)), and stops at the first layer whose verdict is C(fail).
  - The GPU probe runs once for peer access and P2P bandwidth; the NCCL log of the collectives benchmark feeds
    the NCCL transport layer, so nothing is measured twice.
  - Under a recorded O(root) the saved results are judged (lab hosts, replays).
  - The task fails when a layer fails, with that layer's measured and expected values and remedy in the
    message; C(warn) and C(unknown) verdicts are reported as warnings.
  - Only reads and measures (device memory it allocates is freed); runs the same in check mode.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  layers:
    description:
      - The runtime layers to judge, any of C(peer_access), C(p2p_bandwidth), C(collectives),
        C(nccl_transport), judged in ladder order whatever order they are given in.
    type: list
    elements: str
    default: [peer_access, p2p_bandwidth, collectives, nccl_transport]
  baseline:
    description: Recorded metrics of a known-good run (C(peer_gbs_0_1), C(sendrecv_busbw_gbs), ...).
    type: dict
    default: {}
  tolerance:
    description: C({fail_below, warn_below}) as fractions of the baseline; C(profile.tolerance) is merged under it.
    type: dict
    default: {}
  evidence:
    description: A probe result already taken; judged instead of probing again.
    type: dict
  python:
    description: Python with PyTorch (the serving venv) for the bundled collectives benchmark.
    type: path
  nccl_tests_dir:
    description: Directory holding all_reduce_perf and sendrecv_perf (preferred over the bundled benchmark).
    type: path
  collective_bytes:
    description: Message size of the collectives benchmark.
    type: int
    default: 268435456
  iters:
    description: Timed iterations per collective operation.
    type: int
    default: 10
  env:
    description: Extra environment for the benchmark (e.g. NCCL_P2P_LEVEL).
    type: dict
    default: {}
  log:
    description: NCCL INFO log text to judge the transport from, instead of the benchmark's.
    type: str
  unit:
    description: systemd unit whose journal holds the serving engine's NCCL log.
    type: str
extends_documentation_fragment:
  - rigbook.homelab.probe
  - rigbook.homelab.ladder
"""

EXAMPLES = r"""
- name: Judge the four runtime layers against the recorded baseline
  rigbook.homelab.runtime_ladder:
    profile:
      gpu: "{{ rigbook_gpu }}"
      p2p: "{{ rigbook_p2p }}"
      pins: "{{ rigbook_pins }}"
    baseline: {peer_gbs_0_1: 10.29, sendrecv_busbw_gbs: 9.75}
    python: /opt/sglang/.venv/bin/python
    env: {NCCL_P2P_LEVEL: PHB}

- name: Only peer access and bandwidth (one probe)
  rigbook.homelab.runtime_ladder:
    layers: [peer_access, p2p_bandwidth]
"""

RETURN = r"""
ladder:
  description: The verdicts in ladder order, up to and including the first C(fail).
  returned: always
  type: list
  elements: dict
  contains:
    layer: {description: "The layer id, e.g. V(p2p_bandwidth)", type: str}
    status: {description: "pass, warn, fail, skip or unknown", type: str}
    measured: {description: What was found., type: raw}
    expected: {description: What the profile and baseline ask for., type: raw}
    why: {description: The reason for the status., type: str}
    remedy: {description: What to do when it is not pass., type: str}
    metrics: {description: "Figures by name, for the baseline.", type: dict}
evidence:
  description: "What was judged: C(probe), C(collectives), C(nccl_transport), as far as the ladder got."
  returned: always
  type: dict
"""

from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import run_runtime_ladder


def main():
    run_runtime_ladder()


if __name__ == "__main__":
    main()
