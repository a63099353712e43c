#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: collectives
short_description: "Judge the collectives layer: sendrecv and all_reduce bus bandwidth and correctness"
description:
  - Measures sendrecv and all_reduce between the GPUs with nccl-tests / rccl-tests when installed,
    else with the bundled two-process torch.distributed benchmark run by O(python) (the serving venv).
  - Fails on any wrong result or out-of-bounds value whatever the bandwidth, and when bus bandwidth
    falls below O(tolerance) x O(baseline). Bus bandwidth follows nccl-tests (2 ranks, all_reduce busbw = algbw).
  - Under a recorded O(root) the saved results are judged (lab hosts, replays).
version_added: "1.0.0"
author:
  - rigbook developers
options:
  baseline:
    description: Recorded metrics of a known-good run (C(sendrecv_busbw_gbs), C(all_reduce_busbw_gbs)).
    type: dict
    default: {}
  tolerance:
    description: C({fail_below, warn_below}) as fractions of the baseline.
    type: dict
    default: {}
  python:
    description: Python with PyTorch for the bundled benchmark.
    type: path
  nccl_tests_dir:
    description: Directory holding all_reduce_perf and sendrecv_perf.
    type: path
  size_bytes:
    description: Message size.
    type: int
    default: 268435456
  iters:
    description: Timed iterations per operation.
    type: int
    default: 10
  env:
    description: Extra environment for the benchmark (e.g. NCCL_P2P_LEVEL).
    type: dict
    default: {}
extends_documentation_fragment:
  - rigbook.homelab.ladder
"""

EXAMPLES = r"""
- name: Collectives against the baseline
  rigbook.homelab.collectives:
    profile: {gpu: "{{ rigbook_gpu }}", p2p: "{{ rigbook_p2p }}"}
    python: /opt/sglang/venv/bin/python
    baseline: {sendrecv_busbw_gbs: 9.75, all_reduce_busbw_gbs: 9.51}
"""

RETURN = r"""
verdict:
  description: The layer's verdict, with C(metrics) for the baseline.
  returned: always
  type: dict
evidence:
  description: The benchmark's results (and its NCCL log, for nccl_transport).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.ansible_glue import finish
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.collective_bench import collect_collectives
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.collective_layers import judge_collectives


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            profile=dict(type="dict", default={}),
            baseline=dict(type="dict", default={}),
            tolerance=dict(type="dict", default={}),
            python=dict(type="path"),
            nccl_tests_dir=dict(type="path"),
            size_bytes=dict(type="int", default=256 << 20),
            iters=dict(type="int", default=10),
            env=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    gpus = (p["profile"].get("gpu") or {}).get("count") or 2
    data = collect_collectives(p["root"], p["python"], p["nccl_tests_dir"], p["size_bytes"], p["iters"],
                               gpus=gpus, env={k: str(v) for k, v in p["env"].items()})
    tolerance = dict(p["profile"].get("tolerance") or {}, **p["tolerance"])
    verdict = judge_collectives(data, p["profile"], p["baseline"], tolerance or None)
    finish(module, verdict, data)


if __name__ == "__main__":
    main()
