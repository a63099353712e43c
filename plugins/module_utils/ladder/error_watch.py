# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hardware error counters around the runtime layers of one climb (standard library only).

The climb (ladder/climb.py) starts a watch before the first runtime layer and hands it each runtime verdict;
the layer during which a counter rose gets the fail / warn of judges/error_counters.py (its status worsened,
`why` extended, measured["errors"] added). Which "before" applies:
- live root ("/"): a reading taken just before the first runtime layer, then the reading after each layer
  (each layer is judged on what rose while it ran);
- recorded tree (lab host, replay): the tree cannot change during a run, so the first runtime layer is judged
  against the reading the last run on this host stored in the state file (option error_state; the ladder
  module's default is collect/error_counters.STATE_FILE, on the host, not written in check mode). Without one
  (the first run, or an in-process climb with no state file: replay, tests) only the fail class counted since
  boot is judged (fatal / nonfatal AER, critical Xid, GPU resets, IOMMU faults: those counters reset at boot).
The threshold of correctable AER rises that warn is tolerance["aer_correctable_warn_above"] (default 0).

One pass of the counters (load the "before" -> delta -> judge -> store) is sequence(): the climb runs it after each
runtime layer, the health timer (module_utils/ladder/health.py) once per run.
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import error_counters as collect
from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import error_counters as judges

THRESHOLD_KEY = "aer_correctable_warn_above"


def sequence(ctx, now, state_path=None, before=None, load=True, store=False):
    """The error-counter sequence, the one the climb and the health timer both run: load the "before" (when LOAD:
    the reading stored at STATE_PATH, None without one; else BEFORE as given) -> delta to NOW -> judge it (CTX's
    tolerance THRESHOLD_KEY) -> store NOW at STATE_PATH (when STORE). Returns {"before": the reading judged against
    (None: counts since boot), "delta", "judged" (judges/error_counters.judge), "load_error", "store_error"}: the
    errors are None or what the state file said."""
    load_error = store_error = None
    if load:
        before, load_error = collect.load_state(state_path) if state_path else (None, None)
    delta = collect.delta(before, now)
    judged = judges.judge(delta, ctx.tolerance.get(THRESHOLD_KEY, judges.DEFAULT_CORRECTABLE_WARN_ABOVE))
    if store and state_path:
        store_error = collect.store_state(state_path, now)
    return {"before": before, "delta": delta, "judged": judged, "load_error": load_error, "store_error": store_error}


class ErrorWatch:
    """Readings of the counters around the runtime layers of one climb. TAKE(ctx, evidence) -> reading
    (collect/error_counters.reading_part, or a fake in tests)."""

    def __init__(self, ctx, take):
        self.ctx = ctx
        self.take = take
        self.live = files.is_live(ctx.root)
        self.state_path = ctx.options.get("error_state")
        self.write_state = bool(self.state_path) and not ctx.options.get("check_mode")
        self.before = None
        self.before_is = None
        self.load = False  # the next sequence loads its "before" from the state file (a recorded tree's first layer)
        self.notes = []

    def _reading(self, evidence):
        try:
            return self.take(self.ctx, evidence)
        except Exception as exc:  # the collector never raises; this is the last guard
            return {"aer": {}, "devices": {}, "log": None, "log_source": "reading failed: %r" % (exc,)}

    def start(self, evidence):
        """The "before" of the first runtime layer (see the module doc): a live reading now, or on a recorded
        tree the stored one, loaded by the first layer's sequence."""
        if self.live:
            self.before = self._reading(evidence)
            self.before_is = "a reading just before the layer"
            return
        self.load = True

    def after(self, verdict, evidence):
        """VERDICT of the runtime layer that just ran, worsened by what rose while it ran."""
        now = self._reading(evidence)
        out = sequence(self.ctx, now, self.state_path, self.before, load=self.load, store=self.write_state)
        if self.load:
            self.load = False
            if out["load_error"]:
                self.notes.append(out["load_error"])
            self.before_is = ("the reading the last run stored in %s" % self.state_path if out["before"] else
                              "none: counts since boot, fail class only")
        delta = out["delta"]
        errors = {"before": self.before_is, "aer": delta["aer"], "log": delta["log"],
                  "since_boot": delta["since_boot"], "unknown": delta["unknown"] + self.notes,
                  "log_source": now.get("log_source")}
        if out["store_error"]:
            errors["unknown"].append(out["store_error"])
        self.before, self.before_is = now, "the reading after the layer below"
        return judges.worsen(verdict, out["judged"], errors)
