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


def code_entry(layer, title, cause, measured, action):
    """One failure code's entry (ladder/codes.py: the judge modules' CODES): its layer, a one-line title, what it
    means on the box, how rigbook sees it and what to do."""
    return {"layer": layer, "title": title, "cause": cause, "measured": measured, "action": action}


def generic_code(layer, status):
    """The code of a LAYER's verdict of STATUS that names no finding of its own: RB-<LAYER>-<STATUS>
    (ladder/codes.py documents one per layer and status)."""
    return "RB-%s-%s" % (str(layer).upper().replace("_", "-"), str(status).upper())


def make(layer, status, measured=None, expected=None, why="", remedy="", metrics=None, code=None, codes=None):
    """A verdict dict. METRICS ({name: number}) are the figures a baseline records and compares. CODE: the stable
    failure code of what the verdict found (ladder/codes.py: defined beside the finding, never reused for another
    meaning); a verdict that is not a pass and names none gets its layer's generic code. CODES: every finding's code,
    most severe first (CODE is the first)."""
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
    if status != "pass":
        out["code"] = code or (codes[0] if codes else generic_code(layer, status))
        found = [c for c in (codes or []) if c]
        if found and found != [out["code"]]:
            out["codes"] = [out["code"]] + [c for c in found if c != out["code"]]
    return out


def recoded(verdict, code):
    """VERDICT after a modifier raised its status for its own reason (error counters, the expected-unknown rule):
    CODE first, the verdict's own codes kept after it."""
    own = verdict.get("codes") or ([verdict["code"]] if verdict.get("code") else [])
    out = dict(verdict, code=code)
    rest = [c for c in own if c != code]
    if rest:
        out["codes"] = [code] + rest
    else:
        out.pop("codes", None)
    return out


class Findings:
    """Collects problems (fail-class), notes (warn-class) and gaps (unknown) while judging a layer, each with its
    code (ladder/codes.py)."""

    def __init__(self):
        self.problems = []
        self.notes = []
        self.gaps = []
        self.remedies = []
        self.problem_codes = []
        self.note_codes = []
        self.gap_codes = []

    def problem(self, text, remedy=None, code=None):
        self.problems.append(text)
        self.problem_codes.append(code)
        if remedy and remedy not in self.remedies:
            self.remedies.append(remedy)

    def note(self, text, remedy=None, code=None):
        self.notes.append(text)
        self.note_codes.append(code)
        if remedy and remedy not in self.remedies:
            self.remedies.append(remedy)

    def gap(self, text, code=None):
        self.gaps.append(text)
        self.gap_codes.append(code)

    def verdict(self, layer, measured, expected, fail_is_warn=False, ok_text="as expected"):
        """fail when there are problems (warn instead when FAIL_IS_WARN), unknown on gaps, warn on notes."""
        if self.problems:
            status = "warn" if fail_is_warn else "fail"
            why = "; ".join(self.problems + self.notes)
            codes = self.problem_codes + self.note_codes
        elif self.gaps:
            status, why, codes = "unknown", "; ".join(self.gaps), self.gap_codes
        elif self.notes:
            status, why, codes = "warn", "; ".join(self.notes), self.note_codes
        else:
            status, why, codes = "pass", ok_text, []
        remedy = " ".join(self.remedies) if status in ("fail", "warn") else ""
        unique = []
        for code in codes:
            if code and code not in unique:
                unique.append(code)
        return make(layer, status, measured, expected, why, remedy, codes=unique)
