#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: host_manifest
short_description: Everything that makes two boxes the same, in one run
description:
  - Collects the host manifest that C(provision diff) compares between two boxes, in one module run (one
    interpreter start) - the running, default, installed and held kernels and the kernel command line; DKMS state per
    kernel (C(dkms status)); the NVIDIA/amdgpu driver, ROCm and CUDA versions; the build stamps of RCCL
    and nccl-tests (C(.rigbook-build.json) in C(/opt/rigbook/rccl/current), C(/opt/rigbook/nccl-tests/current)) with
    their files' sha256 and every SGLang venv stamp (C(/opt/rigbook/sglang/*/.rigbook-venv.json)) with their
    applied patch hashes; the serving venv's package list (dist-info names and versions); the held packages (dpkg
    status); the sha256 of C(/etc/rigbook/gpu.env),
    C(/etc/rigbook/cuda.env) and the serve unit and environment files; GPU models, VBIOS, PCIe links and BAR
    sizes.
  - Host-unique items (serials, MAC addresses, machine-id, hostname, addresses, the root disk's id on the kernel
    command line, the API key file's hash) are collected too and marked C(unique), so a diff lists them apart.
  - The labels (C(group), C(unique), C(build), C(bits)) are this box's own account of its items; C(provision diff)
    and C(provision report) never read them, they decide each item's from its name (rigbook's manifests.label_of),
    so a box cannot excuse a drifted item by calling it host-unique or a build's bits.
  - Hardware facts are read under O(root) like the ladder's collectors; installed state and identity under O(system).
  - Read-only; supports check mode.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  system:
    description: Where the installed state (C(/boot), dpkg, C(/opt/rigbook), C(/etc)) is read; V(/) but in tests.
    type: path
    default: /
extends_documentation_fragment:
  - rigbook.homelab.evidence_root
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Collect the host manifest
  rigbook.homelab.host_manifest:
    root: "{{ rigbook_evidence_root | default('/') }}"
  register: manifest
"""

RETURN = r"""
manifest:
  description:
    - "C({schema, root, system, items}); each item C({group, value, unique}): group is the ladder layer or role it
      belongs to (kernel_state, driver_state, firmware, pcie_link, dma_window, rccl, nccl_tests, sglang, serve,
      packages, host). A build's hash (a stamp's, or a kernel's DKMS modules') names its build in C(build); one that
      is only the bits built on the box (the DKMS modules') has C(bits) true."
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.manifest import collect_manifest


def main():
    module = AnsibleModule(
        argument_spec=dict(root=dict(type="path", default="/"), system=dict(type="path", default="/")),
        supports_check_mode=True,
    )
    try:
        manifest = collect_manifest(module.params["root"], module.params["system"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="collecting the host manifest failed: %s" % exc)
    module.exit_json(changed=False, manifest=manifest)


if __name__ == "__main__":
    main()
