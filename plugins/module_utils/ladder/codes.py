# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every stable failure code, gathered (standard library only).

A code names one finding and never changes meaning: an alert, a dashboard or a forum answer can point at it. Each
code is defined once, beside the finding that gives it, in its module's CODES ({code: entry}); this module gathers
them with the generic codes (verdict.generic_code: a layer's verdict of a status that names no finding of its own) and
is what docs/codes.md is generated from (src/rigbook/codes_doc.py; a test fails when the page lacks a code) and what
tests check a code against. ISSUED (codes_issued.txt beside this file) lists every code ever given with its layer:
a code may be added, never removed or moved to another layer.

An entry: {"layer": the ladder layer (or "kernel_log", "error_counters", "ladder"), "title": one line,
"cause": what it means on the box, "measured": how rigbook sees it, "action": what to do}.
"""

from __future__ import annotations

import os

from ansible_collections.rigbook.homelab.plugins.module_utils.judges import (
    collective_layers,
    error_counters,
    peer_layers,
    serving_layer,
    static_layers,
    verdict,
)
from ansible_collections.rigbook.homelab.plugins.module_utils.ladder import beside_engine, climb, registry, repeat

STATUSES_CODED = ("fail", "warn", "unknown", "skip")
FIELDS = ("layer", "title", "cause", "measured", "action")
ISSUED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codes_issued.txt")


def _modules():
    return (static_layers, peer_layers, collective_layers, serving_layer, error_counters, climb, beside_engine,
            repeat)


def layers():
    """The ladder's layer names (registry order) and summaries."""
    return [(layer.name, layer.summary) for layer in registry.LAYERS]


def generic():
    """{code: entry} of the generic codes: one per layer and coded status."""
    words = {
        "fail": ("failed on a finding that has no code of its own", "the verdict's why"),
        "warn": ("warned on a finding that has no code of its own", "the verdict's why"),
        "unknown": ("was not measured: its evidence was missing or unreadable", "the verdict's why says what was "
                    "missing"),
        "skip": ("does not apply to this box (one GPU, no serve profile, nothing to compare)", "the verdict's why "
                 "says why it does not apply"),
    }
    out = {}
    for name, summary in layers():
        for status in STATUSES_CODED:
            cause, action = words[status]
            out[verdict.generic_code(name, status)] = {
                "layer": name, "title": "%s: %s" % (name, status), "cause": "The %s layer %s." % (name, cause),
                "measured": summary, "action": action[0].upper() + action[1:] + ".",
            }
    return out


def all_codes():
    """{code: entry} of every code: the modules' own, then the generic ones. ValueError on a code defined twice or
    an entry missing a field."""
    out = {}
    for module in _modules():
        for code, entry in (getattr(module, "CODES", None) or {}).items():
            if code in out:
                raise ValueError("code %s is defined twice (again in %s)" % (code, module.__name__))
            missing = [f for f in FIELDS if not entry.get(f)]
            if missing:
                raise ValueError("code %s lacks %s" % (code, ", ".join(missing)))
            out[code] = dict(entry)
    for code, entry in generic().items():
        if code in out:
            raise ValueError("code %s is both a module's and a generic one" % code)
        out[code] = entry
    return out


def issued(path=ISSUED_FILE):
    """{code: layer} of codes_issued.txt: every code ever given."""
    out = {}
    with open(path) as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if line:
                code, layer = line.split()
                out[code] = layer
    return out
