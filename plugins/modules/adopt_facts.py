#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)



DOCUMENTATION = r"""
---
module: adopt_facts
short_description: What a box set up by hand runs, for provision adopt to turn into pins
description:
  - Reads, in one module run, the running kernel, its own command line parameters, the GRUB default, the installed
    kernel packages of the running release with where each came from (C(apt-cache policy)) and, for one no archive
    offers, the .deb found in the apt cache or O(debs_dir) with its sha256; and every running SGLang engine (its
    command line with an API key's value redacted, venv, systemd unit, GPU environment without secrets, the
    NCCL/RCCL and runtime libraries it has mapped with their sha256, its venv's packages, with O(wheels_dir) the
    wheel files of those packages with their sha256, the files of its sglang that differ from the sha256 its RECORD
    lists and their diff from sglang's wheel).
  - Read-only; supports check mode. Changes nothing on the host.
version_added: "1.0.0"
author:
  - rigbook developers
options:
  system:
    description: Where the box's files and /proc are read; V(/) but in tests.
    type: path
    default: /
  debs_dir:
    description: A folder on the host holding the kernel .debs that were installed by hand.
    type: path
  evidence_root:
    description: Where the running kernel's release and command line are read, as the P2P ladder reads them.
    type: path
    default: /
  wheels_dir:
    description:
      - Folders on the host holding the wheels the engine's venv was installed from; each one of an installed
        distribution's name and version is read with its sha256 (the lock's hashes), and sglang's wheel gives the
        original of its locally changed files (the diff adopt writes as a patch).
    type: list
    elements: path
    default: []
  gpu_env_file:
    description:
      - rigbook's GPU environment file; a variable an engine got from it (same name and value) belongs to the host
        model, not to the serve profile adopt writes.
    type: path
    default: /etc/rigbook/gpu.env
  engine:
    description:
      - The inventory's serve_engine argv; a process started by it (any interpreter) is an engine too, besides
        C(-m sglang.launch_server).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Read what the box runs
  rigbook.homelab.adopt_facts:
    debs_dir: /home/admin/kernel-debs
  register: adopted
"""

RETURN = r"""
facts:
  description: C({kernel, engines}); see plugins/module_utils/collect/adopt.py.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.adopt import adopt_facts
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner


def main():
    module = AnsibleModule(
        argument_spec=dict(system=dict(type="path", default="/"), debs_dir=dict(type="path"),
                           engine=dict(type="list", elements="str", default=[]),
                           evidence_root=dict(type="path", default="/"), wheels_dir=dict(type="list", elements="path", default=[]),
                           gpu_env_file=dict(type="path", default="/etc/rigbook/gpu.env")),
        supports_check_mode=True,
    )
    try:
        # RUN: (rc, stdout) of an argv through the one runner; rc -1 when the box has no such command (no dkms)
        facts = adopt_facts(module.params["system"], runner.rc_output, module.params["debs_dir"],
                            module.params["engine"], module.params["evidence_root"], module.params["wheels_dir"],
                            module.params["gpu_env_file"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="reading the box failed: %s" % exc)
    module.exit_json(changed=False, facts=facts)


if __name__ == "__main__":
    main()
