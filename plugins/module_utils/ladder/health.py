# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""P2P health between runs: what the rigbook-health timer runs on a box (standard library only).

The health role installs this collection's module_utils as one zip (rigbook-health.pyz, entry point
health_main.py) and a systemd timer that runs it with the config the role wrote from the host model. One run:

- the static layers of the ladder (firmware, pcie_link, dma_window, kernel_state, driver_state: sysfs, procfs and
  commands; nothing touches the GPUs);
- the hardware error counters (AER, Xid, GPU resets, IOMMU faults) against the last run's reading;
- with serve profiles, the serving layer without its figures: the unit, one readiness poll, the served model and
  the engine's own transport line from its journal (a box that fell back to SHM shows here). It never runs the
  peer probe, the bandwidth or the collectives tests, never sends the engine a request beyond one readiness poll
  (/health_generate) and /v1/models, and never stops, starts or restarts a unit, so a serving engine is not
  disturbed. While a ladder run holds the serve units stopped for its runtime layers (ladder/serving_hold.py: its
  record on the host, its holder still running), the serving layer is a skip that says so, not a fail of an engine
  stopped on purpose;

then writes node_exporter textfile metrics (one file, atomically) and one journal line per layer (stdout).
"""

from __future__ import annotations

import json
import sys
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import verdict as verdict_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import climb as climb_mod
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import error_watch, registry

# rigbook_layer_status's value per verdict status (docs/health.md): the metric's published encoding, which alert
# rules compare with (== 2 is fail), not a severity order (that is judges/verdict.SEVERITY)
STATUS_VALUE = {"pass": 0, "warn": 1, "fail": 2, "unknown": 3, "skip": 4}
# the statuses whose series carry the verdict's failure code as a `code` label (docs/codes.md); the series of a layer
# that passes, is unknown or skips keep the `layer` label alone
CODE_LABELED = ("fail", "warn")
HELD = "RB-SERVING-HELD"  # judges/serving_layer.CODES
STATE_DIR = "/var/lib/rigbook/health"  # the timer's own state (error counters, serve unit restarts)
ERROR_COUNTERS_STATE = "error-counters.json"
SERVING_STATE = "serving-state.json"


def config_of(model, name, state_dir=STATE_DIR):
    """The health run's config for the host NAME of host model MODEL (host_model.build): what the timer reads. The
    serve profiles go without their environment (it may hold tokens; a health run starts no engine)."""
    # deferred: host_model costs ~18 ms to import; the timer's runs (on the box, each interval) never call this
    from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

    serve = [dict((k, v) for k, v in profile.items() if k != "env") for profile in model["serve"]]
    return {"host": name, "ladder_view": host_model.ladder_view(model), "evidence_root": model["evidence_root"],
            "serve": serve, "textfile": model["health"]["textfile"], "state_dir": state_dir}


def layers_of(config):
    """The layers a health run judges: the static ones, and serving when the box has serve profiles."""
    names = registry.names(registry.STATIC)
    return names + ([registry.SERVING] if config.get("serve") else [])


def check(config, climb=None, take=None, now=None):
    """{"host", "time", "duration_s", "layers": [verdict], "error_counters": {...}} of one health run. CLIMB (the
    ladder's climb) and TAKE (a reading of the error counters) are replaceable for tests; NOW a clock."""
    clock = now or time.time
    started = clock()
    state_dir = config.get("state_dir") or STATE_DIR
    ctx = climb_mod.Context(config.get("evidence_root") or "/", config.get("ladder_view") or {},
                            options={"serve": config.get("serve") or [], "serving_figures": False,
                                     "serving_state": state_dir + "/" + SERVING_STATE})
    layers, held = layers_of(config), None
    if registry.SERVING in layers:
        held = held_serving(config)
        if held is not None:
            layers = [name for name in layers if name != registry.SERVING]
    verdicts, evidence = (climb or climb_mod.climb)(layers, ctx, stop_at_fail=False)
    if held is not None:
        verdicts.append(held)
    errors = error_counters(ctx, evidence, state_dir + "/" + ERROR_COUNTERS_STATE, take)
    ended = clock()
    return {"host": config.get("host") or "", "time": ended, "duration_s": round(ended - started, 3),
            "layers": verdicts, "error_counters": errors, "interval_s": config.get("interval_s")}


def held_serving(config):
    """The serving layer's skip while a ladder run holds the serve units stopped for its runtime layers, else None
    (the hold's record: config's hold_state, else ladder/serving_hold.STATE_FILE)."""
    # deferred: only a box with serve profiles reads the hold (with the serving collectors it shares its imports)
    from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import serving_hold

    record = serving_hold.held_now(config.get("hold_state") or serving_hold.STATE_FILE)
    if record is None:
        return None
    return verdict_mod.make(
        registry.SERVING, "skip", measured={"held_by": record["pid"], "units": record["units"],
                                            "since": record["since"]},
        why="a ladder run (pid %s) stopped %s at %s for its runtime layers and starts them again after them: not "
            "judged this run" % (record["pid"], ", ".join(record["units"]), record["since"]), code=HELD)


def error_counters(ctx, evidence, state_path, take=None):
    """{"status", "why", "aer", "since_boot"} (and "code", "codes" when the judgement is no pass and names them) of
    what the error counters did since the last run's reading (stored at STATE_PATH; the first run judges the fail
    class counted since boot), and the new reading stored: the ladder's own sequence (ladder/error_watch.sequence)
    on the ladder's reading (registry.ERROR_COUNTERS)."""
    now = (take or registry.ERROR_COUNTERS)(ctx, evidence)
    out = error_watch.sequence(ctx, now, state_path, load=True, store=True)
    judged, delta = out["judged"], out["delta"]
    errors = [e for e in (out["load_error"], out["store_error"]) if e]
    why = "; ".join(judged["problems"] + judged["notes"] + errors) or "no error rose"
    out = {"status": judged["status"], "why": why, "aer": delta.get("aer"), "since_boot": delta.get("since_boot")}
    codes = judged.get("codes") or ([judged["code"]] if judged.get("code") else [])
    if judged["status"] != "pass" and codes:  # the counters' codes (judges/error_counters.CODES), the worst first
        out.update(code=codes[0], codes=list(codes))
    return out


def _label(value):
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(verdict, **labels):
    """The label set of a status series: LABELS (name: value, in order), then `code` when VERDICT fails or warns
    with a code."""
    pairs = list(labels.items())
    if verdict.get("status") in CODE_LABELED and verdict.get("code"):
        pairs.append(("code", verdict["code"]))
    return ",".join('%s="%s"' % (name, _label(value)) for name, value in pairs)


def _figures(verdict):
    """(name, number) of a verdict's figures: its metrics (what a baseline records), numbers only."""
    for name, value in sorted((verdict.get("metrics") or {}).items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield name, value


def prometheus_text(result):
    """node_exporter textfile format of one health run's RESULT."""
    lines = [
        "# HELP rigbook_layer_status Status of a P2P ladder layer at the last rigbook health run "
        "(0 pass, 1 warn, 2 fail, 3 unknown, 4 skip); a failing or warning layer's carries its failure code "
        "(docs/codes.md) as code.",
        "# TYPE rigbook_layer_status gauge",
    ]
    for verdict in result["layers"]:
        lines.append("rigbook_layer_status{%s} %d" % (_labels(verdict, layer=verdict["layer"]),
                                                      STATUS_VALUE.get(verdict["status"], 3)))
    figures = [(v["layer"], name, value) for v in result["layers"] for name, value in _figures(v)]
    if figures:
        lines += ["# HELP rigbook_layer_figure A figure a layer measured at the last rigbook health run.",
                  "# TYPE rigbook_layer_figure gauge"]
        lines += ['rigbook_layer_figure{layer="%s",figure="%s"} %s' % (_label(layer), _label(name), repr(float(value)))
                  for layer, name, value in figures]
    errors = result["error_counters"]
    error_labels = _labels(errors)
    lines += [
        "# HELP rigbook_error_counters_status Hardware error counters since the last rigbook health run "
        "(0 pass, 1 warn, 2 fail).",
        "# TYPE rigbook_error_counters_status gauge",
        "rigbook_error_counters_status%s %d" % ("{%s}" % error_labels if error_labels else "",
                                                STATUS_VALUE.get(errors["status"], 3)),
        "# HELP rigbook_health_last_run_timestamp_seconds When the last rigbook health run ended (Unix time).",
        "# TYPE rigbook_health_last_run_timestamp_seconds gauge",
        "rigbook_health_last_run_timestamp_seconds %s" % repr(float(result["time"])),
        "# HELP rigbook_health_run_duration_seconds How long the last rigbook health run took.",
        "# TYPE rigbook_health_run_duration_seconds gauge",
        "rigbook_health_run_duration_seconds %s" % repr(float(result["duration_s"])),
    ]
    if result.get("interval_s"):  # the timer's interval (the config's, health_timer): the stale alert's 3 intervals
        lines += ["# HELP rigbook_health_interval_seconds Seconds between two rigbook health runs (the timer's "
                  "interval).",
                  "# TYPE rigbook_health_interval_seconds gauge",
                  "rigbook_health_interval_seconds %s" % repr(float(result["interval_s"]))]
    return "\n".join(lines) + "\n"


def _code_said(verdict):
    """"[CODE] " of a verdict that is not a pass, "" otherwise."""
    return "[%s] " % verdict["code"] if verdict.get("status") != "pass" and verdict.get("code") else ""


def journal_lines(result):
    """One line per layer and one for the error counters (the timer's service writes them to the journal)."""
    lines = ["%s: %s: %s%s" % (v["layer"], v["status"], _code_said(v), " ".join(str(v.get("why") or "").split()))
             for v in result["layers"]]
    errors = result["error_counters"]
    lines.append("error_counters: %s: %s%s" % (errors["status"], _code_said(errors), errors["why"]))
    return lines


def main(argv=None):
    """rigbook-health --config FILE: one run; exit 0 when no layer failed, 1 when one did, 2 on a bad config."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "--config":
        sys.stderr.write("usage: rigbook-health --config FILE\n")
        return 2
    try:
        with open(args[1]) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.stderr.write("rigbook-health: cannot read %s: %s\n" % (args[1], exc))
        return 2
    if not isinstance(config, dict) or not config.get("textfile"):
        sys.stderr.write("rigbook-health: %s names no textfile to write\n" % args[1])
        return 2
    result = check(config)
    for line in journal_lines(result):
        sys.stdout.write(line + "\n")
    try:  # atomically: node_exporter's textfile collector reads the old file or the new one, never a part
        files.write_atomic(config["textfile"], prometheus_text(result), make_parents=True)
    except OSError as exc:
        sys.stderr.write("rigbook-health: cannot write %s: %s\n" % (config["textfile"], exc.strerror or exc))
        return 2
    return 1 if any(v["status"] == "fail" for v in result["layers"]) or result["error_counters"]["status"] == "fail" \
        else 0
