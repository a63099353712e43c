# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One climb of the ladder (standard library only): collect what each layer needs, judge it, stop at the first
`fail`. The ladder modules (one per phase), replay and the benchmarks all climb through here.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import expectations
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import recoded
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import beside_engine, error_watch, registry, repeat
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import defaults as probe_defaults

# The runtime and serving layers' options (the ladder module's argument spec gives them their types) and their
# defaults; check_mode is the module's (the serving layer then records no restart count).
OPTION_DEFAULTS = {
    "probe_bytes": probe_defaults.DEFAULT_SIZE,
    "reps": probe_defaults.DEFAULT_REPS,
    "deadline_s": None,
    "ipc_legacy": None,
    "probe_result": None,
    "python": None,
    "nccl_tests_dir": None,
    "collective_bytes": 256 << 20,
    "iters": 10,
    "env": {},
    "env_file": None,
    "ab": False,
    "log": None,
    "unit": None,
    "serve": [],  # the host model's serve profiles (normalised once, by host_model.build)
    "serve_errors": [],  # the host model's: the rigbook_serve items it could not read
    "serving_state": None,
    "error_state": None,  # the error counters' state file (ladder/error_watch.py); None: none kept
    "check_mode": False,
    "allow_unknown": [],  # layers allowed to stay unknown on this run, besides the host model's (--allow-unknown)
    "serving_figures": True,  # false (the health timer): no chat requests, one readiness poll, no figures judged
    "beside": None,  # what ran beside the runtime layers (an engine not stopped: ladder/beside_engine.py); set by the
    # ladder module around its runtime climb (ladder/serving_hold.py)
}


# The failure code of the expected-unknown rule (unknown_expected; ladder/codes.py gathers it): put in front of the
# layer's own codes when the rule fails a layer.
CODES = {
    "RB-EXPECTED-UNMEASURED": {
        "layer": "ladder",
        "title": "a layer this box should measure measured nothing",
        "cause": "The layer's verdict is unknown (its evidence was missing or unreadable: no probe, no NCCL log, a "
                 "program that did not run) although the host model expects this box to measure it; an unknown "
                 "never passes there. The layer's own code follows in `codes` and says what was missing.",
        "measured": "The layer's unknown verdict against the layers the host model expects (ladder/registry."
                    "expected_layers), unless allowed by rigbook_verify.allow_unknown or --allow-unknown.",
        "action": "Make the layer measurable (its why says what was missing); to accept it unknown for now, "
                  "`--allow-unknown LAYER` or rigbook_verify.allow_unknown in the inventory.",
    },
}


class Context:
    """What a climb judges against and where it reads: the ladder view ({gpu, p2p, pins} of the host model,
    host_model.ladder_view), the host's baseline metrics, the tolerance (merged once, judges/expectations.py),
    the evidence root, and the runtime options (OPTION_DEFAULTS, overridden by OPTIONS)."""

    def __init__(self, root="/", ladder_view=None, baseline=None, tolerance=None, options=None):
        self.root = root or "/"
        self.ladder_view = ladder_view or {}
        self.baseline = baseline or {}
        self.tolerance = expectations.tolerance(self.ladder_view, tolerance)
        self.options = dict(OPTION_DEFAULTS)
        self.options.update((k, v) for k, v in (options or {}).items() if v is not None)


def collect(parts, ctx, evidence, collected):
    """Collect the PARTS not yet in COLLECTED into EVIDENCE (each part once per climb)."""
    for part in parts:
        if part not in collected:
            evidence.update(registry.PARTS[part](ctx, evidence))
            collected.add(part)


def climb(layers, ctx, stop_at_fail=True, evidence=None):
    """(verdicts, evidence) of LAYERS (Layer entries or names) in ladder order, stopping after the first fail
    unless not STOP_AT_FAIL (a replay shows every layer). Each layer's evidence is collected just before it is
    judged, so a climb that stops early reads and runs nothing for the layers above. EVIDENCE given (a saved
    evidence dict) is judged as it is: nothing is collected.

    Whatever modifies a verdict is applied in this one order, each ranking statuses by the one severity order
    judges/verdict.SEVERITY (skip < pass < warn < unknown < fail):
    1. the layer's judge, on its own evidence; baselines are compared here (judges/baseline_compare.py);
    2. repeat before fail (ladder/repeat.py; the figures layers): a fail on figures below the baseline's fail line
       alone is measured again once; a figure below the line on both runs fails, on the first run only it is at
       least a warn (never a pass); a replay or a recorded tree says it was not measured again;
    3. beside an engine (a runtime layer measured while an engine ran beside it, option "beside";
       ladder/beside_engine.judged): an unknown whose own evidence ran out of GPU memory is a skip naming the engine
       and its memory (marked not_measured); a figures layer says it was measured beside the engine;
    4. the expected-unknown rule (unknown_expected): an unknown of a layer the host model expects fails unless
       allowed (rigbook_verify.allow_unknown, the run's allow_unknown option): it judges what the layer measured,
       before the counters;
    5. the hardware error counters (runtime layers of a live climb; ladder/error_watch.py: AER, Xid, GPU resets,
       IOMMU faults, read around each runtime layer, repeat included): they only raise a status, and a warn-class
       rise leaves a verdict that measured nothing (an unknown, a not_measured skip) as it is, said in its why.
    So an expected layer that measured nothing never ends pass or warn, whatever came after its judge
    (tests/unit/plugins/module_utils/ladder/test_climb.py crosses every combination)."""
    wanted = set(layer if isinstance(layer, str) else layer.name for layer in layers)
    verdicts = []
    replay = evidence is not None
    if evidence is None:
        evidence, collected = {"root": ctx.root}, set()
    else:
        collected = set(registry.PARTS)
    watch = None
    for layer in registry.LAYERS:
        if layer.name not in wanted:
            continue
        if layer.phase == registry.RUNTIME and not replay and watch is None:
            watch = error_watch.ErrorWatch(ctx, registry.ERROR_COUNTERS)
            watch.start(evidence)
        collect(layer.needs, ctx, evidence, collected)
        verdict = layer.judge(evidence, ctx)
        verdict = repeat.judged(layer, verdict, evidence, ctx, replay)
        if layer.phase == registry.RUNTIME and not replay:
            verdict = beside_engine.judged(verdict, layer.needs, evidence, ctx.options.get("beside"))
        if not replay:
            verdict = unknown_expected(verdict, ctx)
        if watch is not None and layer.phase == registry.RUNTIME:
            verdict = watch.after(verdict, evidence)
        verdicts.append(verdict)
        if stop_at_fail and verdict["status"] == "fail":
            break
    return verdicts, evidence


def unknown_expected(verdict, ctx):
    """An unknown verdict of a layer the host model expects this box to measure (registry.expected_layers) fails,
    unless allowed (the host model's rigbook_verify.allow_unknown, or the run's allow_unknown option): then it stays
    unknown and says it was allowed, so the summary shows it."""
    if verdict["status"] != "unknown" or verdict["layer"] not in registry.expected_layers(ctx.ladder_view):
        return verdict
    if verdict["layer"] in (ctx.ladder_view.get("allow_unknown") or ()):
        return dict(verdict, why=verdict["why"] + " (allowed unknown: rigbook_verify.allow_unknown)",
                    allowed_unknown=True)
    if verdict["layer"] in (ctx.options.get("allow_unknown") or ()):
        return dict(verdict, why=verdict["why"] + " (allowed unknown: --allow-unknown)", allowed_unknown=True)
    return recoded(dict(verdict, status="fail",
                        why="unknown on a box that should measure it: %s" % verdict["why"],
                        remedy=(verdict.get("remedy") or "") + (" " if verdict.get("remedy") else "")
                        + "To accept it unknown for now: `--allow-unknown %s`, or rigbook_verify.allow_unknown in the "
                          "inventory." % verdict["layer"]), "RB-EXPECTED-UNMEASURED")


def message(verdict):
    """One line of a verdict: the layer, its status and why; measured vs expected and what to do when not pass."""
    text = "%s: %s: %s" % (verdict["layer"], verdict["status"], verdict["why"])
    if verdict["status"] in ("fail", "warn", "unknown"):
        text += " (measured %s; expected %s)" % (verdict["measured"], verdict["expected"])
    if verdict.get("remedy"):
        text += ". What to do: " + verdict["remedy"]
    return text
