# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemd units: the one `systemctl show` parser and reader, and the default target (standard library only).

`parse_show(TEXT)` reads `systemctl show UNIT... -p ...` output: one block of PROPERTY=VALUE lines per unit,
blocks separated by blank lines; with several units each block carries its Id. `unit_state(PROPS)` types one
block: the states as bounded words, NRestarts and MainPID as ints, ExecMainStartTimestamp as printed and, where
systemd printed @EPOCH (--timestamp=unix, systemd 248+), as a float.
"""

from __future__ import annotations

import re

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner, text

SYSTEMCTL = "systemctl"
GET_DEFAULT = [SYSTEMCTL, "get-default"]
UNIT_NAME = r"[A-Za-z0-9:_.@\\-]{1,255}"
WORD = r"[A-Za-z0-9_.@:+-]{0,64}"
TIMEOUT_S = 30.0


def parse_show(output):
    """[{property: value}] blocks of `systemctl show` OUTPUT, in order (values bounded, control characters
    dropped)."""
    blocks, block = [], {}
    for line in (output or "").splitlines() + [""]:
        if not line.strip():
            if block:
                blocks.append(block)
            block = {}
            continue
        key, sep, value = line.partition("=")
        if sep and key.strip():
            block[key.strip()] = text.bounded(value.strip(), 1024)
    return blocks


def by_unit(output):
    """{Id: {property: value}} of OUTPUT's blocks that carry an Id (several units shown at once)."""
    return dict((block["Id"], block) for block in parse_show(output) if block.get("Id"))


def unit_state(props):
    """One block typed: {id, load_state, active_state, sub_state, unit_file_state, result, n_restarts, main_pid,
    started_at, started_epoch}; a value of the wrong shape is None."""
    props = props or {}
    started = text.line(props.get("ExecMainStartTimestamp"), 128) or None
    epoch = None
    if started and re.match(r"^@\d+(\.\d+)?$", started):
        epoch = text.finite(started[1:])
    return {
        "id": text.matching(props.get("Id"), UNIT_NAME),
        "load_state": text.matching(props.get("LoadState"), WORD),
        "active_state": text.matching(props.get("ActiveState"), WORD),
        "sub_state": text.matching(props.get("SubState"), WORD),
        "unit_file_state": text.matching(props.get("UnitFileState"), WORD),
        "result": text.matching(props.get("Result"), WORD),
        "n_restarts": text.integer(props.get("NRestarts")),
        "main_pid": text.integer(props.get("MainPID")),
        "started_at": started,
        "started_epoch": epoch,
    }


def show_argv(units, properties, unix_timestamps=False):
    return ([SYSTEMCTL, "show"] + list(units) + ["-p", ",".join(properties)]
            + (["--timestamp=unix"] if unix_timestamps else []))


def show(units, properties, run=None, timeout=TIMEOUT_S):
    """({Id: typed unit_state plus the raw block as "props"}, error) of UNITS through one `systemctl show`
    (with --timestamp=unix where systemd knows it). Properties must include Id; nothing is run without units."""
    run = run or runner.run
    units = list(units)
    if not units:
        return {}, None
    properties = list(properties)
    if "Id" not in properties:
        properties = ["Id"] + properties
    result = run(show_argv(units, properties, unix_timestamps=True), timeout=timeout)
    if result.rc != 0:  # systemd before 248 has no --timestamp
        result = run(show_argv(units, properties), timeout=timeout)
    if result.rc != 0:
        return {}, result.error
    found = {}
    for unit_id, props in by_unit(result.stdout).items():
        state = unit_state(props)
        state["props"] = props
        found[unit_id] = state
    return found, None


def default_target(run=None, timeout=TIMEOUT_S):
    """(the default target, error) from `systemctl get-default`."""
    run = run or runner.run
    result = run(GET_DEFAULT, timeout=timeout)
    if result.rc != 0:
        return None, result.error
    return text.matching(result.stdout, UNIT_NAME), None
