# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Repeat before fail: a figure below the baseline's fail line is measured again before it fails (standard library
only; the climb, ladder/climb.py, calls judged() once per layer, right after the layer's own judge).

Real bandwidth figures move from run to run: the probe's host copies on a real H200 read H2D 46.16-55.35 GB/s over
runs, one of them 0.84x of the first (shared research real-gpu-run.md), and 29.74 GB/s on the first run after a
machine start (tests/fixtures/device/verify-1.json). benchmarks/judge_noise.py measures what this rule does to the
false fails of healthy runs and to the drops it catches.

The rule, for the figures layers (REPEATABLE: p2p_bandwidth's probe, collectives' run):
- repeatable: a fail that comes from figures below the fail line alone. It is decided from the judge itself, not
  from its words: the same judge on the same evidence WITHOUT the baseline does not fail. So a fail for anything
  else - wrong results, a peer copy no faster than the host-staged one, a link far below its limit, sendrecv below
  the peer copy or isAllDirectP2p 0 (an SHM fallback), a probe that hung, a GPU missing - is never repeated, and
  the hardware error counters (ladder/error_watch.py) are applied after this rule, to both runs together.
- the layer's evidence part is collected once more (one repeat, never more) and the two runs are judged together
  by the same judge: each figure counts at the better (higher) of its two measurements (`better`), everything else
  is the second run's (a wrong result or an SHM fallback in the repeat fails as in any run).
- a figure below the line on both runs fails: "measured again: h2d_gbs_0 41.20 then 42.00 GB/s (baseline 51.50),
  both below 0.80x".
- a figure below the line on the first run only leaves the layer at least a warn, never a pass ("below 0.80x on
  the first run only"): the false-pass risk of repeating is an intermittent fault that shows on one run of two;
  it stays in view as a warn, with both figures.
- a repeat that measured nothing (the probe could not run the second time, none of the figures timed) or left the
  layer unknown leaves the first fail standing.
- what cannot measure again says so and keeps the fail: a replay (evidence given to the climb) and a recorded tree
  (a snapshot, a lab host: collecting again reads the same recording), or a probe result given as the option
  probe_result. A replay of evidence that holds the repeat (evidence[REPEATED][part], stored by the live climb) is
  judged exactly as the live climb judged it.
"""

from __future__ import annotations

import copy

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import baseline_compare
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import recoded, worse
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import registry

# The evidence key under which the live climb stores each repeated part's second run: {part: its evidence}.
REPEATED = "repeated"


def _higher(a, b):
    """The better of two figures (GB/s: higher); the one measured when the other was not."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _keyed(items, key):
    return dict((key(item), item) for item in items or [] if isinstance(item, dict))


def better_probe(first, second):
    """The probe SECOND (judges/peer_layers.py reads it) with each figure the better of FIRST's and SECOND's: host
    copies per GPU, peer and host-staged copies per ordered pair, both-ways copies per pair. Every other field is
    SECOND's. Taking the higher host-staged copy too never makes a peer copy look "no faster than host-staged" where
    neither run did (the higher peer copy is at least the peer copy of the run with the higher host-staged one)."""
    if not (second or {}).get("available") or not (first or {}).get("available"):
        return second
    out = copy.deepcopy(second)
    devices = _keyed(first.get("devices"), lambda d: d.get("index"))
    for dev in out.get("devices") or []:
        old = devices.get(dev.get("index")) or {}
        for key in ("h2d_gbs", "d2h_gbs"):
            dev[key] = _higher(old.get(key), dev.get(key))
    pairs = _keyed(first.get("pairs"), lambda p: (p.get("src"), p.get("dst")))
    for pair in out.get("pairs") or []:
        old = pairs.get((pair.get("src"), pair.get("dst"))) or {}
        for key in ("peer_gbs", "host_staged_gbs"):
            pair[key] = _higher(old.get(key), pair.get(key))
    bidir = _keyed(first.get("bidir"), lambda e: (e.get("a"), e.get("b")))
    for entry in out.get("bidir") or []:
        entry["gbs"] = _higher((bidir.get((entry.get("a"), entry.get("b"))) or {}).get("gbs"), entry.get("gbs"))
    return out


def better_collectives(first, second):
    """The collectives run SECOND (judges/collective_layers.py) with each op's busbw the better of FIRST's and
    SECOND's; #wrong, the log, the A/B and everything else are SECOND's."""
    if not (second or {}).get("results") or not (first or {}).get("results"):
        return second
    out = copy.deepcopy(second)
    rows = _keyed(first.get("results"), lambda r: r.get("op"))
    for row in out["results"]:
        row["busbw_gbs"] = _higher((rows.get(row.get("op")) or {}).get("busbw_gbs"), row.get("busbw_gbs"))
    return out


# layer -> (the evidence part measured again, how two runs of it make one)
REPEATABLE = {
    "p2p_bandwidth": ("probe", better_probe),
    "collectives": ("collectives", better_collectives),
}


def _first_run_code(layer, what):
    return {
        "layer": layer,
        "title": "%s below the baseline's fail line on the first run only" % what,
        "cause": "The first run measured a figure below the tolerance's fail_below share (0.8x) of this host's "
                 "baseline; measured again at once, it was above the line. Real figures move from run to run, so it "
                 "is no fail, but an intermittent fault shows on one run of two: it stays in view as a warn, with "
                 "both figures.",
        "measured": "The layer's evidence collected once more (ladder/repeat.py); each figure counts at the better of "
                    "its two measurements.",
        "action": "Watch whether it recurs (the health timer's history); if it does, check the layers below "
                  "(pcie_link, peer_access, nccl_transport) and the hardware error counters.",
    }


# The failure codes of the rule (ladder/codes.py gathers them): a figure below the line on the first run only.
CODES = {
    "RB-P2P-BANDWIDTH-BASELINE-FIRST-RUN": _first_run_code("p2p_bandwidth", "a copy figure"),
    "RB-COLLECTIVES-BASELINE-FIRST-RUN": _first_run_code("collectives", "a bus bandwidth figure"),
}
FIRST_RUN_CODES = {"p2p_bandwidth": "RB-P2P-BANDWIDTH-BASELINE-FIRST-RUN",
                   "collectives": "RB-COLLECTIVES-BASELINE-FIRST-RUN"}


def _without_baseline(ctx):
    out = copy.copy(ctx)
    out.baseline = {}
    return out


def below_line(verdict, ctx):
    """{name: (measured, baseline)} of VERDICT's figures below the fail line (judges/baseline_compare.compare)."""
    out = {}
    for name, value in sorted((verdict.get("metrics") or {}).items()):
        base = (ctx.baseline or {}).get(name)
        if baseline_compare.compare(name, value, base, ctx.tolerance)[0] == "fail":
            out[name] = (value, base)
    return out


def repeatable(layer, verdict, evidence, ctx):
    """The figures below the line when VERDICT (LAYER's, on EVIDENCE) fails on them alone, else {}: the same judge
    without the baseline does not fail."""
    if layer.name not in REPEATABLE or verdict.get("status") != "fail":
        return {}
    figures = below_line(verdict, ctx)
    if not figures or layer.judge(evidence, _without_baseline(ctx)).get("status") == "fail":
        return {}
    return figures


def cannot_measure_again(part, ctx, replay):
    """Why PART cannot be measured again on this climb; None when it can."""
    if replay:
        return "a replay judges the recorded evidence"
    if not files.is_live(ctx.root):
        return "the figures are read from a recording under %s" % ctx.root
    if part == "probe" and ctx.options.get("probe_result"):
        return "the probe result was given (probe_result)"
    return None


def _figure_text(name, first, second, base, line, still):
    if second is None:
        return "%s %.2f then not measured (baseline %.2f)" % (name, first, base)
    return "%s %.2f then %.2f GB/s (baseline %.2f), %s" % (
        name, first, second, base, ("both below %.2fx" % line) if still else ("below %.2fx on the first run only"
                                                                              % line))


def judged(layer, verdict, evidence, ctx, replay=False):
    """VERDICT of LAYER (registry.Layer) after the repeat rule (the module doc). EVIDENCE is the climb's: the live
    climb stores the second run under EVIDENCE[REPEATED][part]; EVIDENCE[part] stays the first run (what the layers
    above read)."""
    figures = repeatable(layer, verdict, evidence, ctx)
    if not figures:
        return verdict
    part, better = REPEATABLE[layer.name]
    line = ctx.tolerance["fail_below"]
    second = (evidence.get(REPEATED) or {}).get(part)
    if second is None:
        why_not = cannot_measure_again(part, ctx, replay)
        if why_not:
            return dict(verdict, why="%s; not measured again (%s)" % (verdict["why"], why_not), not_repeated=why_not)
        second = registry.PARTS[part](ctx, evidence)[part]
        evidence.setdefault(REPEATED, {})[part] = second
    alone = layer.judge(dict(evidence, **{part: second}), ctx)
    both = layer.judge(dict(evidence, **{part: better(evidence.get(part), second)}), ctx)
    again = (alone.get("metrics") or {})
    held = below_line(both, ctx)
    texts = [_figure_text(name, value, again.get(name), base, line, name in held)
             for name, (value, base) in sorted(figures.items())]
    record = {"figures": dict((name, [value, again.get(name)]) for name, (value, base) in figures.items()),
              "fail_below": line}
    said = "measured again: " + "; ".join(texts)
    if both["status"] == "fail":
        return dict(both, why="%s; %s" % (both["why"], said), repeated=record)
    measured_again = any(again.get(name) is not None for name in figures)
    if measured_again and both["status"] in ("skip", "pass", "warn"):  # skip: a one-GPU box's host copies
        out = dict(both, status=worse(both["status"], "warn"), repeated=record,
                   why="%s, so a warn, not a fail; %s" % (said, both["why"]))
        out["remedy"] = both.get("remedy") or verdict.get("remedy") or ""
        if both["status"] != "warn":  # a pass's none, a skip's generic code: not what this warn found
            out.pop("code", None)
            out.pop("codes", None)
        return recoded(out, FIRST_RUN_CODES[layer.name])
    return dict(verdict, repeated=record,
                why="%s; %s, and the repeat measured nothing (%s): the first run's figures stand"
                    % (verdict["why"], said, both["why"]))
