# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body every ladder module shares: collect, judge, exit (fail on a `fail` verdict).

run_layer() serves the static layers. The layers that measure through the GPU driver live in
runtime_module.py, so the static modules' payloads carry none of the probe code.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import evidence as evidence_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder_static import JUDGES

ARGUMENT_SPEC = dict(
    root=dict(type="path", default="/"),
    profile=dict(type="dict", default={}),
)


def message(verdict):
    text = "%s: %s: %s" % (verdict["layer"], verdict["status"], verdict["why"])
    if verdict["status"] in ("fail", "warn", "unknown"):
        text += " (measured %s; expected %s)" % (verdict["measured"], verdict["expected"])
    if verdict.get("remedy"):
        text += ". What to do: " + verdict["remedy"]
    return text


def run_layer(layer):
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    root = module.params["root"]
    evidence = evidence_mod.collect_static(root, evidence_mod.LAYER_PARTS[layer])
    finish(module, JUDGES[layer](evidence, module.params["profile"] or {}), evidence)


def finish(module, verdict, evidence):
    """Every ladder module ends here: fail the task on a fail verdict, warn on warn/unknown."""
    result = dict(changed=False, verdict=verdict, evidence=evidence, msg=message(verdict))
    if verdict["status"] == "fail":
        module.fail_json(**result)
    if verdict["status"] in ("warn", "unknown"):
        module.warn(result["msg"])
    module.exit_json(**result)
