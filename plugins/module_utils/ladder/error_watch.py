# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hardware error counters around the runtime layers of one climb (standard library only).

The climb (ladder/climb.py) starts a watch before the first runtime layer and hands it each runtime verdict;
the layer during which a counter rose gets the fail / warn of judges/error_counters.py (its status worsened,
`why` extended, measured["errors"] added). Which "before" applies:
- live root ("/"): a snapshot taken just before the first runtime layer, then the snapshot after each layer
  (each layer is judged on what rose while it ran);
- recorded tree (lab host, replay): the tree cannot change during a run, so the first runtime layer is judged
  against the snapshot the last run on this host stored in the state file (option error_state; the ladder
  module's default is collect/error_counters.STATE_FILE, on the host, not written in check mode). Without one
  (the first run, or an in-process climb with no state file: replay, tests) only the fail class counted since
  boot is judged (fatal / nonfatal AER, critical Xid, GPU resets, IOMMU faults: those counters reset at boot).
The threshold of correctable AER rises that warn is tolerance["aer_correctable_warn_above"] (default 0).
"""

from __future__ import annotations

from ansible_collections.rigbook.homelab.plugins.module_utils.collect import error_counters as collect
from ansible_collections.rigbook.homelab.plugins.module_utils.collect import static_evidence
from ansible_collections.rigbook.homelab.plugins.module_utils.judges import error_counters as judges

THRESHOLD_KEY = "aer_correctable_warn_above"


class ErrorWatch:
    """Snapshots around the runtime layers of one climb. TAKE(ctx, evidence) -> snapshot
    (collect/error_counters.snapshot_part, or a fake in tests)."""

    def __init__(self, ctx, take):
        self.ctx = ctx
        self.take = take
        self.live = static_evidence.is_live(ctx.root)
        self.state_path = ctx.options.get("error_state")
        self.write_state = bool(self.state_path) and not ctx.options.get("check_mode")
        self.before = None
        self.before_is = None
        self.notes = []

    def _snapshot(self, evidence):
        try:
            return self.take(self.ctx, evidence)
        except Exception as exc:  # the collector never raises; this is the last guard
            return {"aer": {}, "devices": {}, "log": None, "log_source": "snapshot failed: %r" % (exc,)}

    def start(self, evidence):
        """The "before" of the first runtime layer (see the module doc)."""
        if self.live:
            self.before = self._snapshot(evidence)
            self.before_is = "a snapshot just before the layer"
            return
        stored, error = collect.load_state(self.state_path) if self.state_path else (None, None)
        if error:
            self.notes.append(error)
        self.before = stored
        self.before_is = ("the snapshot the last run stored in %s" % self.state_path if stored else
                          "none: counts since boot, fail class only")

    def after(self, verdict, evidence):
        """VERDICT of the runtime layer that just ran, worsened by what rose while it ran."""
        now = self._snapshot(evidence)
        delta = collect.delta(self.before, now)
        judged = judges.judge(delta, self.ctx.tolerance.get(THRESHOLD_KEY, judges.DEFAULT_CORRECTABLE_WARN_ABOVE))
        errors = {"before": self.before_is, "aer": delta["aer"], "log": delta["log"],
                  "since_boot": delta["since_boot"], "unknown": delta["unknown"] + self.notes,
                  "log_source": now.get("log_source")}
        if self.write_state:
            error = collect.store_state(self.state_path, now)
            if error:
                errors["unknown"].append(error)
        self.before, self.before_is = now, "the snapshot after the layer below"
        return judges.worsen(verdict, judged, errors)
