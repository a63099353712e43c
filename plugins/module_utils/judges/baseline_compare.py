# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compare a measured figure with its recorded baseline (pure; standard library only).

Thresholds are data (aznhc/nccl-tests style): below fail_below x baseline is a fail, below
warn_below x baseline a warning (judges/expectations.py: one merge, defaults 0.8 and 0.95).
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.judges.expectations import tolerance as merged_tolerance
from ansible_collections.rigbook.homelab.plugins.module_utils.judges.verdict import worse


def compare(name, measured, baseline, tolerance=None):
    """(status, text) for one metric: pass/warn/fail against BASELINE, or skip when none recorded.

    A missing measurement is "unknown": a figure that could not be measured never passes.
    """
    tol = merged_tolerance(override=tolerance)
    if measured is None:
        return "unknown", "%s: not measured" % name
    if baseline is None:
        return "skip", "%s %.2f (no baseline recorded)" % (name, measured)
    if baseline <= 0:
        return "unknown", "%s: baseline %.2f is not usable" % (name, baseline)
    ratio = float(measured) / float(baseline)
    text = "%s %.2f vs baseline %.2f (%.2fx)" % (name, measured, baseline, ratio)
    if ratio < tol["fail_below"]:
        return "fail", text + ", below %.2fx" % tol["fail_below"]
    if ratio < tol["warn_below"]:
        return "warn", text + ", below %.2fx" % tol["warn_below"]
    return "pass", text


def compare_all(metrics, baseline_metrics, tolerance=None):
    """Compare every metric that has a baseline; returns (worst status, [texts], {name: ratio})."""
    worst, texts, ratios = "skip", [], {}
    for name in sorted(metrics):
        status, text = compare(name, metrics[name], (baseline_metrics or {}).get(name), tolerance)
        texts.append(text)
        if status in ("pass", "warn", "fail") and baseline_metrics.get(name):
            ratios[name] = round(float(metrics[name]) / float(baseline_metrics[name]), 3)
        worst = worse(worst, status)
    return worst, texts, ratios
