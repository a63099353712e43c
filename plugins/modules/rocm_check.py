#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

DOCUMENTATION = r"""
---
module: rocm_check
short_description: Check the installed ROCm userspace against the pin and that its tools list every GPU
description:
  - One read-only pass over what the amd_rocm role installed, failing with every problem named.
  - Packages (dpkg-query) - each of O(packages) installed with a version matching O(version_glob), none of
    O(forbid) installed (amdgpu-dkms when rigbook_pins.rocm.dkms does not ask for it).
  - Tools - C(bin/rocminfo) and C(bin/rocm-smi) under O(rocm_path) present and executable.
  - GPUs - the GPU agents of C(rocminfo) and the device rows of C(rocm-smi) number at least O(gpus). Under
    O(root)=V(/) the tools are run; under another root (a lab host's recorded tree, a snapshot) their recorded
    output C(var/lib/rigbook/commands/rocminfo.txt) and C(rocm-smi.txt) is read, like every hardware fact of
    the ladder. Missing output is a failure, never a pass.
  - Supports check mode (it changes nothing).
version_added: "1.0.0"
author:
  - rigbook developers (!UNKNOWN)
options:
  root:
    description: Evidence root (V(/) on a real box).
    type: path
    default: /
  rocm_path:
    description: The ROCm prefix of the pinned release (C(/opt/rocm-<version>)).
    type: path
    required: true
  packages:
    description: Packages that must be installed at the pinned version.
    type: list
    elements: str
    default: []
  version_glob:
    description: fnmatch pattern every package version must match (ROCm's C(*.<tag>-*), e.g. C(*.70100-*)).
    type: str
    default: "*"
  forbid:
    description: Packages that must not be installed.
    type: list
    elements: str
    default: []
  gpus:
    description: How many GPUs the tools must list (rigbook_gpu.count).
    type: int
    default: 1
extends_documentation_fragment:
  - rigbook.homelab.attributes.read_only
"""

EXAMPLES = r"""
- name: Check that ROCm 7.1.0 lists both GPUs
  rigbook.homelab.rocm_check:
    rocm_path: /opt/rocm-7.1.0
    packages: [rocm-core, rocminfo, rocm-smi-lib, hip-runtime-amd]
    version_glob: "*.70100-*"
    forbid: [amdgpu-dkms]
    gpus: 2
"""

RETURN = r"""
versions:
  description: Installed version of each package of O(packages) and O(forbid) (null when not installed).
  returned: always
  type: dict
gpus:
  description: The GPUs rocminfo listed (agent, gfx name, marketing name, chip id, PCI slot).
  returned: always
  type: list
  elements: dict
smi_devices:
  description: How many device rows rocm-smi listed.
  returned: always
  type: int
source:
  description: V(run) (the tools ran) or the directory of the recorded outputs that were read.
  returned: always
  type: str
problems:
  description: Every problem found (the task fails when there is one).
  returned: always
  type: list
  elements: str
"""

import fnmatch
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files, packages, runner
from ansible_collections.rigbook.homelab.plugins.module_utils.parse import rocm as parse_rocm


def tool_output(root, tool, argv):
    """(text or None, where): the tool run under /, else its recorded output under ROOT (facts/runner.py's
    recorded_or_live)."""
    text, why = runner.recorded_or_live(root, tool, argv)
    live = files.is_live(root)
    if text is None:
        return None, why if live else "no recorded %s output at %s" % (tool, runner.recording_path(root, tool))
    return text, "run" if live else os.path.dirname(runner.recording_path(root, tool))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            rocm_path=dict(type="path", required=True),
            packages=dict(type="list", elements="str", default=[]),
            version_glob=dict(type="str", default="*"),
            forbid=dict(type="list", elements="str", default=[]),
            gpus=dict(type="int", default=1),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problems = []
    names = list(dict.fromkeys(list(p["packages"]) + list(p["forbid"])))
    versions = packages.installed_versions(names)
    for name in p["packages"]:
        if versions[name] is None:
            problems.append("%s is not installed" % name)
        elif not fnmatch.fnmatchcase(versions[name], p["version_glob"]):
            problems.append("%s %s is installed, the pin wants %s" % (name, versions[name], p["version_glob"]))
    for name in p["forbid"]:
        if versions[name] is not None:
            problems.append("%s %s is installed, but rigbook_pins.rocm.dkms does not ask for it"
                            % (name, versions[name]))
    tools = {}
    for tool in ("rocminfo", "rocm-smi"):
        tools[tool] = os.path.join(p["rocm_path"], "bin", tool)
        if not os.access(tools[tool], os.X_OK):
            problems.append("%s is missing (not installed under %s)" % (tools[tool], p["rocm_path"]))
    info_text, source = tool_output(p["root"], "rocminfo", [tools["rocminfo"]])
    smi_text, smi_source = tool_output(p["root"], "rocm-smi", [tools["rocm-smi"]])
    gpus, smi_devices = [], 0
    for text, where, parse, tool in ((info_text, source, parse_rocm.parse_rocminfo, "rocminfo"),
                                     (smi_text, smi_source, parse_rocm.parse_rocm_smi, "rocm-smi")):
        if text is None:
            problems.append(where)
            continue
        parsed = parse(text)
        problems.extend("%s: %s" % (tool, e) for e in parsed["errors"])
        if tool == "rocminfo":
            gpus = [dict(g, slot=parse_rocm.bdfid_to_slot(g["bdfid"])) for g in parsed["gpus"]]
            found = len(gpus)
        else:
            smi_devices = found = len(parsed["gpus"])
        if not parsed["errors"] and found < p["gpus"]:
            problems.append("%s lists %d GPU%s, rigbook_gpu.count is %d"
                            % (tool, found, "" if found == 1 else "s", p["gpus"]))
    result = dict(changed=False, versions=versions, gpus=gpus, smi_devices=smi_devices,
                  source=source if info_text is not None else None, problems=problems)
    if problems:
        module.fail_json(msg="ROCm check failed: " + "; ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
