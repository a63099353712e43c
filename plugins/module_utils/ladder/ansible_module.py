# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The body of the ladder module (plugins/modules/ladder.py): argument spec, layer selection, climb, exit. The only
file under module_utils that imports AnsibleModule; everything it calls is plain Python (collect, judge, climb).

One module run climbs a phase (or the whole ladder): one interpreter start on the host for several layers. The
task passes the host model (`host`) and what is its own (phase, layers, baseline, ...); where the evidence is read,
the tolerance, the GPU environment file, the collectives tests and their Python, the benchmark's environment and the
serve profiles are the model's (model_options), an option given only overriding one. The task fails at the first
failing layer with its measured and expected values and remedy; warn and unknown verdicts are reported as warnings.
A runtime climb on the GPUs runs inside a hold of this host's serve units (ladder/serving_hold.py: stopped for the
layers, started again after, whatever the layers did); check mode runs the same checks and stops nothing.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import beside_engine, registry
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder.climb import (
    OPTION_DEFAULTS,
    Context,
    climb,
    message,
)

ALL_PHASES = "all"
ARGUMENT_SPEC = dict(
    phase=dict(type="str", choices=list(registry.PHASES) + [ALL_PHASES], default=ALL_PHASES),
    layers=dict(type="list", elements="str"),
    run_tags=dict(type="list", elements="str", default=[]),
    host=dict(type="dict", default={}),
    # Overrides of what the host model decides (model_options); omitted, the model's.
    root=dict(type="path"),
    baseline=dict(type="dict", default={}),
    tolerance=dict(type="dict", default={}),
    probe_bytes=dict(type="int", default=OPTION_DEFAULTS["probe_bytes"]),
    reps=dict(type="int", default=OPTION_DEFAULTS["reps"]),
    deadline_s=dict(type="float"),
    ipc_legacy=dict(type="bool"),
    probe_result=dict(type="dict"),
    python=dict(type="path"),
    nccl_tests_dir=dict(type="path"),
    collective_bytes=dict(type="int", default=OPTION_DEFAULTS["collective_bytes"]),
    iters=dict(type="int", default=OPTION_DEFAULTS["iters"]),
    env=dict(type="dict"),
    env_file=dict(type="path"),
    ab=dict(type="bool", default=False),
    log=dict(type="str"),
    unit=dict(type="str"),
    serving_state=dict(type="path"),  # None: collect/serving_evidence.STATE_FILE
    error_state=dict(type="path", default="/var/lib/rigbook/error-counters.json"),  # collect/error_counters.STATE_FILE
    allow_unknown=dict(type="list", elements="str", default=[]),
    # This host's serve units around the runtime layers (ladder/serving_hold.py)
    serving=dict(type="str", choices=["stop", "keep", "resume"], default="stop"),
    serving_when=dict(type="str", choices=["always", "changed"], default="always"),
    serving_figures=dict(type="bool"),  # serving phase: false - no chat requests, no TTFT or decode figures
    changes=dict(type="list", elements="str", default=[]),
    engine=dict(type="list", elements="str"),
    hold_state=dict(type="path"),  # None: ladder/serving_hold.STATE_FILE
)


def selected_layers(module):
    """The `layers` option checked against the registry (the task fails naming a name that is no layer of any
    phase), else the layers that --tags names (run_tags), else every layer of the phase. Layers of the other
    phase in `layers` are left to the other phase's task."""
    params = module.params
    phases = registry.PHASES if params["phase"] == ALL_PHASES else [params["phase"]]
    if params["layers"] is None:
        return [layer for phase in phases for layer in registry.select_by_run_tags(phase, params["run_tags"])]
    _, unknown = registry.select(None, params["layers"])
    if unknown:
        module.fail_json(msg="layers: unknown layer(s) %s; the layers are %s"
                         % (", ".join(unknown), ", ".join(registry.names())))
    return [layer for phase in phases for layer in registry.select(phase, params["layers"])[0]]


def model_options(model):
    """What the climb reads of the host model MODEL (rigbook_host) besides its ladder view: the evidence root, the
    collectives tests and the Python of the bundled benchmark, the GPU environment file, the benchmark's environment
    (the first serve profile's: the serving unit's) and the serve profiles (normalised once, by host_model.build)."""
    model = model if isinstance(model, dict) else {}
    serve = model.get("serve") or []
    python = (model.get("verify") or {}).get("collectives_python")
    return {
        "root": model.get("evidence_root") or "/",
        "python": python.rstrip("/") + "/bin/python" if python else None,
        "nccl_tests_dir": model.get("collectives_tests_dir") or None,
        "env_file": model.get("gpu_env_file") or None,
        "env": dict(serve[0].get("env") or {}) if serve else {},
        "serve": serve,
        "serve_errors": model.get("serve_errors") or [],
    }


def context_of(params, check_mode=False):
    """The climb's Context: the host model's ladder view and options (model_options), each option the task gives
    overriding the model's."""
    options = model_options(params["host"])
    root = options.pop("root")
    options.update((name, params[name]) for name in OPTION_DEFAULTS if params.get(name) is not None)
    options["check_mode"] = check_mode
    return Context(params.get("root") or root, host_model.ladder_view(params["host"]), params.get("baseline"),
                   params.get("tolerance"), options)


def asked_for_runtime(params):
    """Whether this run names a runtime layer itself: the layers option, or --tags (run_tags)."""
    if params["layers"] is not None:
        return bool(registry.select(registry.RUNTIME, params["layers"])[0])
    return bool(registry.select(registry.RUNTIME, params["run_tags"] or [])[0])


def hold_of(params, ctx, check_mode):
    """The hold of this host's serve units around the runtime layers (ladder/serving_hold.py), begun."""
    # deferred: serving_hold imports the readiness wait (HTTP) and the engine reader (/proc); a static or serving
    # climb needs neither
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import serving_hold

    host = params["host"] if isinstance(params["host"], dict) else {}
    return serving_hold, serving_hold.Hold(
        ctx.options.get("serve"), params["serving"], check_mode, params["hold_state"], params["engine"],
        ctx.root, host.get("vendor") or (ctx.ladder_view.get("gpu") or {}).get("vendor")).begin()


def finish_ladder(module, verdicts, evidence, hold=None):
    """Fail the task on a fail verdict (the climb stopped there) or a serve unit not ready again after the runtime
    layers, warn on warn/unknown and on a layer skipped because an engine beside it held the memory, exit
    otherwise. HOLD: the serve units' report (serving_hold), returned as serving_hold, its notes as notes."""
    result = dict(changed=False, ladder=verdicts, evidence=evidence,
                  msg="; ".join(message(v) for v in verdicts) or "no layer selected")
    problems = []
    if hold is not None:
        result.update(serving_hold=hold, notes=hold["notes"])
        problems = hold["problems"] + ([hold["busy"]] if hold["busy"] else [])
    failed = [v for v in verdicts if v["status"] == "fail"]
    if failed or problems:
        result["msg"] = "; ".join(([message(failed[0])] if failed else []) + problems)
        # the failure's code (docs/codes.md): the failing verdict's, else the hold's first problem's
        codes = [c for c in ([failed[0].get("code")] if failed else []) + list((hold or {}).get("codes") or []) if c]
        if codes:
            result["code"] = codes[0]
        module.fail_json(**result)
    for verdict in verdicts:
        if verdict["status"] in ("warn", "unknown") or (verdict["status"] == "skip" and verdict.get("beside")):
            module.warn(message(verdict))
    module.exit_json(**result)


def run_ladder_module():
    """main() of rigbook.homelab.ladder."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    layers = selected_layers(module)
    ctx = context_of(params, module.check_mode)
    if params["serving"] != "resume" and not beside_engine.gpu_work(layers, ctx.options):
        verdicts, evidence = climb(layers, ctx)
        finish_ladder(module, verdicts, evidence)
        return
    serving_hold, hold = hold_of(params, ctx, module.check_mode)
    if hold.busy:
        finish_ladder(module, [], {"root": ctx.root}, hold.report())
        return
    if params["serving"] == "resume":  # the role's always task: start what a run cut short left stopped, climb nothing
        hold.release()
        finish_ladder(module, [], {"root": ctx.root}, hold.report())
        return
    verdicts, evidence = serving_hold.climb_around(layers, ctx, climb, hold, params["serving_when"],
                                                   params["changes"], asked_for_runtime(params))
    finish_ladder(module, verdicts, evidence, hold.report())
