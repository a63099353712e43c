#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: evidence_snapshot
short_description: Pack the files the P2P ladder reads into a tarball on the target
description:
  - Copies the sysfs/procfs files, kernel config options, module paths and command outputs
    (nvidia-smi, lspci) the ladder judges into a recorded evidence tree and packs it as a
    .tar.gz, for C(provision snapshot) to fetch and C(provision verify --replay) to judge.
  - Serial numbers and GPU UUIDs are scrubbed. Nothing on the host is changed; the archive is
    written under O(dest) (a new temporary directory by default) and its path returned.
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  dest:
    description: Directory for the archive; a new temporary directory when omitted.
    type: path
  label:
    description: Free text stored in the tree's CAPTURED file.
    type: str
    default: rigbook snapshot
extends_documentation_fragment:
  - rigbook.homelab.evidence_root
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Snapshot the evidence
  rigbook.homelab.evidence_snapshot:
  register: snap
"""

RETURN = r"""
archive:
  description: Path of the .tar.gz on the target.
  returned: success
  type: str
manifest:
  description: What was captured (GPUs, PCI functions, files, command sources).
  returned: success
  type: dict
"""

import os
import shutil
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.collect.evidence_tree import capture


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            dest=dict(type="path"),
            label=dict(type="str", default="rigbook snapshot"),
        ),
        supports_check_mode=True,
    )
    dest = module.params["dest"] or tempfile.mkdtemp(prefix="rigbook-snapshot-")
    work = tempfile.mkdtemp(prefix="rigbook-tree-")
    try:
        tree = os.path.join(work, "tree")
        manifest = capture(module.params["root"], tree, module.params["label"])
        archive = os.path.join(dest, "evidence.tar.gz")
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(tree, arcname="tree")
    except (OSError, tarfile.TarError) as exc:
        module.fail_json(msg="snapshot failed: %s" % exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    module.exit_json(changed=False, archive=archive, manifest=manifest)


if __name__ == "__main__":
    main()
