# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body every ladder module shares: collect, judge, exit (fail on a `fail` verdict).

run_layer() serves the one-layer static modules, run_static_ladder() the module that climbs several static
layers in one call (one target-side interpreter start instead of five: the p2p_verify role uses it).
The layers that measure through the GPU driver live in runtime_module.py, so the static modules' payloads
carry none of the probe code.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence as evidence_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.static_layers import (
    JUDGES,
    STATIC_LAYERS,
    judge_until_fail,
)

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


def selected_layers(module, known, kind):
    """module.params["layers"] checked against KNOWN (the task fails naming the unknown ones), in ladder order."""
    layers = module.params["layers"]
    unknown = [name for name in layers if name not in known]
    if unknown:
        module.fail_json(msg="layers: unknown %s layer(s) %s; the %s layers are %s"
                         % (kind, ", ".join(unknown), kind, ", ".join(known)))
    return [name for name in known if name in layers]


def run_static_ladder():
    spec = dict(ARGUMENT_SPEC, layers=dict(type="list", elements="str", default=list(STATIC_LAYERS)))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    layers = selected_layers(module, STATIC_LAYERS, "static")
    parts = sorted({part for name in layers for part in evidence_mod.LAYER_PARTS[name]})
    evidence = evidence_mod.collect_static(module.params["root"], parts)
    finish_ladder(module, judge_until_fail(evidence, module.params["profile"] or {}, layers), evidence)


def finish_ladder(module, verdicts, evidence):
    """The several-layer modules end here: fail the task on a fail verdict (the climb stopped there), warn on
    warn/unknown."""
    result = dict(changed=False, ladder=verdicts, evidence=evidence,
                  msg="; ".join(message(v) for v in verdicts) or "no layer selected")
    failed = [v for v in verdicts if v["status"] == "fail"]
    if failed:
        result["msg"] = message(failed[0])
        module.fail_json(**result)
    for verdict in verdicts:
        if verdict["status"] in ("warn", "unknown"):
            module.warn(message(verdict))
    module.exit_json(**result)


def finish(module, verdict, evidence):
    """Every ladder module ends here: fail the task on a fail verdict, warn on warn/unknown."""
    result = dict(changed=False, verdict=verdict, evidence=evidence, msg=message(verdict))
    if verdict["status"] == "fail":
        module.fail_json(**result)
    if verdict["status"] in ("warn", "unknown"):
        module.warn(result["msg"])
    module.exit_json(**result)
