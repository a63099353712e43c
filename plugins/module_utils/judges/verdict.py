# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verdict every ladder layer returns, and the one severity order of its statuses (standard library only).
The layers themselves: ladder/registry.py."""

from __future__ import annotations

STATUSES = ("pass", "warn", "fail", "skip", "unknown")
# The one severity order of the statuses, least severe first: every place that ranks statuses (the error-counter
# modifier, the baseline comparison, the collectives' sendrecv check, the report's worst layer) ranks with this.
# unknown is above warn: what was not measured is no milder than a warning, so a warn modifier (a correctable AER
# burst) never turns an unknown into a warn that would hide it from the "expected layer unknown fails" rule.
SEVERITY = ("skip", "pass", "warn", "unknown", "fail")


def rank(status):
    """STATUS's place in SEVERITY (higher is worse); a status it does not know ranks as unknown."""
    return SEVERITY.index(status) if status in SEVERITY else SEVERITY.index("unknown")


def worse(a, b):
    """The worse of statuses A and B (A on a tie)."""
    return b if rank(b) > rank(a) else a


def worst(statuses, default="skip"):
    """The worst of STATUSES; DEFAULT when there are none."""
    out = default
    for status in statuses:
        out = worse(out, status)
    return out


def make(layer, status, measured=None, expected=None, why="", remedy="", metrics=None):
    """A verdict dict. METRICS ({name: number}) are the figures a baseline records and compares."""
    if status not in STATUSES:
        raise ValueError("unknown status %r" % status)
    out = {
        "layer": layer,
        "status": status,
        "measured": measured,
        "expected": expected,
        "why": why,
        "remedy": remedy,
    }
    if metrics:
        out["metrics"] = metrics
    return out


class Findings:
    """Collects problems (fail-class), notes (warn-class) and gaps (unknown) while judging a layer."""

    def __init__(self):
        self.problems = []
        self.notes = []
        self.gaps = []
        self.remedies = []

    def problem(self, text, remedy=None):
        self.problems.append(text)
        if remedy and remedy not in self.remedies:
            self.remedies.append(remedy)

    def note(self, text, remedy=None):
        self.notes.append(text)
        if remedy and remedy not in self.remedies:
            self.remedies.append(remedy)

    def gap(self, text):
        self.gaps.append(text)

    def verdict(self, layer, measured, expected, fail_is_warn=False, ok_text="as expected"):
        """fail when there are problems (warn instead when FAIL_IS_WARN), unknown on gaps, warn on notes."""
        if self.problems:
            status = "warn" if fail_is_warn else "fail"
            why = "; ".join(self.problems + self.notes)
        elif self.gaps:
            status, why = "unknown", "; ".join(self.gaps)
        elif self.notes:
            status, why = "warn", "; ".join(self.notes)
        else:
            status, why = "pass", ok_text
        remedy = " ".join(self.remedies) if status in ("fail", "warn") else ""
        return make(layer, status, measured, expected, why, remedy)
