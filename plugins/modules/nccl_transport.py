#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: nccl_transport
short_description: "Judge the NCCL transport layer: every channel via P2P, not a silent SHM fallback"
description:
  - Reads an NCCL/RCCL C(NCCL_DEBUG=INFO) log (given as O(log), from the serving O(unit)'s journal, or from a
    short run of the bundled benchmark with O(python)) and classifies each channel's transport
    (P2P/IPC, P2P/CUMEM, P2P/direct pointer, SHM, NET), C(isAllDirectP2p) and the effective NCCL_P2P_LEVEL.
  - Fails when the profile expects P2P and any channel goes through SHM or NET (the silent fallback after a
    kernel upgrade); a profile that declares P2P unavailable must stay on SHM.
  - Under a recorded O(root) the saved log is judged.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  log:
    description: NCCL INFO log text (e.g. from the collectives task).
    type: str
  unit:
    description: systemd unit whose journal holds the serving engine's NCCL log.
    type: str
  python:
    description: Python with PyTorch, to run a short two-rank init when no log is at hand.
    type: path
  env:
    description: Extra environment for that run (e.g. NCCL_P2P_LEVEL).
    type: dict
    default: {}
extends_documentation_fragment:
  - rigbook.homelab.ladder
"""

EXAMPLES = r"""
- name: NCCL must use P2P
  rigbook.homelab.nccl_transport:
    profile: {gpu: "{{ rigbook_gpu }}", p2p: "{{ rigbook_p2p }}"}
    log: "{{ collectives_result.evidence.nccl_log | default(omit) }}"
"""

RETURN = r"""
verdict:
  description: The layer's verdict.
  returned: always
  type: dict
evidence:
  description: The parsed log (channels, transports, isAllDirectP2p, path, NCCL_P2P_LEVEL, version, source).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.ansible_glue import finish
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.collective_bench import (
    collect_nccl_log,
    transport_evidence,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.collective_layers import judge_nccl_transport


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            profile=dict(type="dict", default={}),
            log=dict(type="str"),
            unit=dict(type="str"),
            python=dict(type="path"),
            env=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    text, source = collect_nccl_log(p["root"], p["log"], p["unit"], p["python"],
                                    env={k: str(v) for k, v in p["env"].items()})
    parsed = transport_evidence(text, source)
    verdict = judge_nccl_transport(parsed, p["profile"])
    finish(module, verdict, parsed)


if __name__ == "__main__":
    main()
