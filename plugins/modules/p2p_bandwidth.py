#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: p2p_bandwidth
short_description: "Judge the p2p_bandwidth layer: peer copy GB/s vs the host-staged copy, the link and the baseline"
description:
  - Times, for every ordered pair of GPUs, a peer copy and a host-staged copy of the same size (device -> pinned
    host -> device), and both directions at once per pair, with events, through the driver library (ctypes, no
    toolkit), in a forked child with a hard timeout. Host<->device copies per GPU are timed too.
  - With P2P expected, fails when a peer copy is no faster than the host-staged copy (O(tolerance.over_staged),
    default 1.1x; seed 000 6.0 GB/s == host-staged) or when peer access could not be enabled; warns below
    O(tolerance.link_warn_below) of the link limit (rigbook_gpu.pcie, Gen3 x16 = 15.75 GB/s) and when both
    directions at once give less than O(tolerance.bidir_warn_below) x one direction.
  - Every figure with a recorded O(baseline) is compared (fail below O(tolerance.fail_below), warn below
    O(tolerance.warn_below)); with P2P declared unavailable this holds the host-staged path to its baseline.
  - The figures are returned in C(verdict.metrics) (C(peer_gbs_0_1), C(host_staged_gbs_0_1), C(bidir_gbs_0_1),
    C(h2d_gbs_0), ...) for C(provision baseline record). One GPU is C(skip) (its host copies still reported).
  - Under a recorded O(root) the probe's saved JSON is judged. Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  root:
    description: Evidence root; V(/) probes the GPUs, anything else reads a recorded probe.
    type: path
    default: /
  profile:
    description:
      - "The host profile, C({gpu: rigbook_gpu, p2p: rigbook_p2p, pins: rigbook_pins})."
      - C(profile.tolerance) is merged under O(tolerance).
    type: dict
    default: {}
  baseline:
    description: Recorded metrics of a known-good run (C(peer_gbs_0_1), C(host_staged_gbs_0_1), C(bidir_gbs_0_1), ...).
    type: dict
    default: {}
  tolerance:
    description: C({fail_below, warn_below}) as fractions of the baseline, and C(over_staged), C(link_warn_below), C(bidir_warn_below).
    type: dict
    default: {}
  evidence:
    description: A probe result already taken (e.g. the registered C(evidence) of M(rigbook.homelab.peer_access)); judged instead of probing again.
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
- name: Peer access (probes once)
  rigbook.homelab.peer_access:
    profile: {gpu: "{{ rigbook_gpu }}", p2p: "{{ rigbook_p2p }}"}
  register: peer

- name: P2P bandwidth from the same probe, against the baseline
  rigbook.homelab.p2p_bandwidth:
    profile: {gpu: "{{ rigbook_gpu }}", p2p: "{{ rigbook_p2p }}"}
    evidence: "{{ peer.evidence }}"
    baseline: {peer_gbs_0_1: 10.29, peer_gbs_1_0: 10.29, bidir_gbs_0_1: 19.7}
    tolerance: {fail_below: 0.8, warn_below: 0.95}
"""

RETURN = r"""
verdict:
  description: The layer's verdict, with C(metrics) for the baseline.
  returned: always
  type: dict
  contains:
    layer: {description: "V(p2p_bandwidth)", type: str}
    status: {description: "pass, warn, fail, skip or unknown", type: str}
    measured: {description: Per pair, peer and host-staged GB/s and their ratio., type: raw}
    expected: {description: What the profile and baseline ask for., type: raw}
    why: {description: The reason for the status., type: str}
    remedy: {description: What to do when it is not pass., type: str}
    metrics: {description: "Figures by name, GB/s.", type: dict}
evidence:
  description: The probe's result.
  returned: always
  type: dict
"""

from ansible_collections.rigbook.homelab.plugins.module_utils.judges.peer_layers import judge_p2p_bandwidth
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import run_runtime_layer


def judge(evidence, profile, params):
    tolerance = dict(profile.get("tolerance") or {}, **(params["tolerance"] or {}))
    return judge_p2p_bandwidth(evidence, profile, params["baseline"], tolerance)


def main():
    run_runtime_layer("p2p_bandwidth", judge)


if __name__ == "__main__":
    main()
