"""Plain-text output keeps every figure: in a pipe or a CI log the ladder prints one block per layer, in full.

Measured on the 80-column table this replaces: "GPU0->GPU1=peer 6.00 GB/s, host-staged 6.00 GB/s (1.00x), 38% of
Ge…" (rich cut the cell to fit 80 columns). Here the ladder goes through the display with a console that is not a
terminal, and the real CLI replays the H200 snapshot with stdout a pipe.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

from helpers.report import leaves

from rigbook import display
from rigbook.tracker import Running, Tracker

LONG = ("peer 6.00 GB/s, host-staged 6.00 GB/s (1.00x), 38% of Gen3 x16 "
        + "; ".join(f"retry {n}: peer {n}.{n}{n} GB/s at 0x{n:08x}" for n in range(1, 12)))


class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


LADDER = [
    {"layer": "p2p_bandwidth", "status": "fail", "measured": {"GPU0->GPU1": LONG, "GPU1->GPU0": LONG[::-1],
                                                              "nested": {"a": [1.25, "x" * 300], "b": 7}},
     "expected": {"peer": "> 1.1x the host-staged copy, " + "z" * 400},
     "metrics": {"peer_gbs_0_1": 3.141592653589793, "host_staged_gbs_0_1": 6.9, "bidir_gbs_0_1": None},
     "why": "w" * 500 + " [not/markup] end-of-why", "remedy": "r" * 500 + " end-of-remedy"},
    {"layer": "collectives", "status": "pass", "measured": {"sendrecv": "busbw 9.75 GB/s, #wrong 0"},
     "expected": {"wrong": 0}, "metrics": {"sendrecv_busbw_gbs": 9.75}, "why": "ok"},
]


def test_plain_ladder_is_one_block_per_layer_and_never_cut():
    stream = Pipe()
    console = display.make_console(stream)
    assert not console.is_terminal
    display.print_ladder(console, "rig-a", LADDER)
    text = stream.getvalue()
    assert "…" not in text and "..." not in text
    for verdict in LADDER:
        assert f"  {verdict['layer']}: {verdict['status']}\n" in text
        for key in ("measured", "expected", "metrics"):
            for leaf in leaves(verdict[key]):
                assert leaf in text, (key, leaf[:40])
        assert verdict["why"] in text
    assert LADDER[0]["remedy"] in text
    assert "[not/markup]" in text  # brackets are text, not rich markup
    lines = text.splitlines()
    assert max(len(line) for line in lines) > 1000  # nothing wrapped to 80 columns either
    block = lines[lines.index("  p2p_bandwidth: fail") + 1:]
    assert [line.split(":")[0].strip() for line in block[:6]] == ["measured", "expected", "figures", "why",
                                                                  "what to do", "collectives"]


def test_plain_tables_are_as_wide_as_their_content():
    """Any other table on a non-terminal console (summary, baseline show) is not cut to 80 columns either."""
    from rich.table import Table

    stream = Pipe()
    console = display.make_console(stream)
    table = Table()
    table.add_column("metric")
    table.add_column("history")
    table.add_row("peer_gbs_0_1", " ".join(f"{n}.25" for n in range(60)))
    console.print(table)
    assert "…" not in stream.getvalue() and "59.25" in stream.getvalue()


def test_terminal_ladder_wraps_but_never_cuts():
    stream = io.StringIO()
    console = display.make_console(stream)
    console = type(console)(file=stream, force_terminal=True, width=100, no_color=True)
    display.print_ladder(console, "rig-a", LADDER)
    text = stream.getvalue()
    assert "…" not in text and "..." not in text
    for word in ("0x0000000b", "0x00000001", "1.25", "end-of-why"):  # the last words of long values are there
        assert word in text


def test_verify_replay_in_a_pipe_prints_every_figure_of_its_json(fixtures):
    """The real CLI: `provision verify --replay` of the H200 snapshot taken with `provision snapshot`
    (tests/fixtures/device/h200-snapshot.tar.gz), stdout a pipe; every figure of its --json summary is in the text."""
    snapshot = fixtures / "device" / "h200-snapshot.tar.gz"
    run = [sys.executable, "-m", "rigbook", "verify", "--replay", str(snapshot)]
    as_json = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120)
    plain = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert as_json.returncode == plain.returncode == 0, plain.stderr
    workdir = re.compile(r"rigbook-replay-\w+")  # each replay unpacks into a temporary folder of its own
    text = workdir.sub("WORKDIR", plain.stdout)
    assert "…" not in text
    ladder = json.loads(as_json.stdout)["hosts"]["h200"]["ladder"]
    checked = 0
    for verdict in ladder:
        assert f"  {verdict['layer']}: {verdict['status']}" in text
        for key in ("measured", "expected", "metrics", "why", "remedy"):
            for leaf in leaves(verdict.get(key)):
                leaf = workdir.sub("WORKDIR", leaf)
                assert leaf in text, (verdict["layer"], key, leaf)
                checked += 1
    assert checked > 30
    assert "H2D 55.27 GB/s" in text  # the live probe's figure, recorded in the snapshot


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


ODD = "[/x][bold]:smile:"  # a closing tag that matches nothing, an opening one, an emoji code


def test_brackets_in_host_names_messages_and_paths_are_printed_as_they_are():
    """Host names, task names, messages and run folders reach the console as text: `[/x]` is no markup (it made rich
    raise MarkupError), `:smile:` no emoji; on a terminal and in a pipe alike."""
    from rigbook.tracker import Tracker

    tracker = Tracker()
    host = tracker.host(f"rig{ODD}")
    host.state = "failed"
    host.failures.append({"task": f"task {ODD}", "msg": f"msg {ODD}"})
    host.reboot_requested = True
    host.ladder = [{"layer": f"layer{ODD}", "status": "fail", "measured": {ODD: ODD}, "why": f"why {ODD}"}]
    tracker.errors.append(f"error {ODD}")
    for stream in (Pipe(), Tty()):
        console = display.make_console(stream)
        display.print_summary(tracker, console, f"/state{ODD}/runs/1")
        console.print(f"a plain string {ODD}")
        text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue()).split())  # a terminal wraps long lines
        for said in (f"rig{ODD}: FAILED at task 'task {ODD}': msg {ODD}", f"rig{ODD}: a reboot is needed",
                     f"error {ODD}", f"run artifacts: /state{ODD}/runs/1", f"a plain string {ODD}"):
            assert said in text, (type(stream).__name__, said)
        assert f"layer{ODD}" in text and f"why {ODD}" in text


def test_verify_replay_of_a_path_with_brackets(fixtures, tmp_path):
    """`provision verify --replay PATH` where PATH holds `[/x]` and `[bold]`: the path is printed whole, no
    traceback."""
    folder = tmp_path / "odd[bold]" / "snap[" / "x]"
    folder.mkdir(parents=True)
    snapshot = folder / "h200[bold].tar.gz"
    snapshot.write_bytes((fixtures / "device" / "h200-snapshot.tar.gz").read_bytes())
    proc = subprocess.run([sys.executable, "-m", "rigbook", "verify", "--replay", str(snapshot)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"replayed 1 host(s) from {snapshot}: ok" in proc.stdout


# --- box text is made terminal-safe (issue 34) --------------------------------------------------------------------

# ESC[1A ESC[2K: up a line and erase it (a "failed" line hidden); OSC 52: write the clipboard; 0x9b: a one-byte CSI;
# U+202E: right-to-left override (a line that reads otherwise than it is)
ATTACK = "\x1b[1A\x1b[2K\x1b]52;c;ZXZpbA==\x07\x9b2K\u202eok"
SHOWN = "\\x1b[1A\\x1b[2K\\x1b]52;c;ZXZpbA==\\x07\\x9b2K\\u202eok"
OBEYED = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def _box_said(tracker):
    """A tracker holding what a box's module said (a failure message, a ladder) with ATTACK in it."""
    host = tracker.host(f"rig{ATTACK}")
    host.state = "failed"
    host.failures.append({"task": f"task {ATTACK}", "msg": f"line one {ATTACK}\nline two {ATTACK}"})
    host.interrupted_in = f"build {ATTACK}"
    host.ladder = [{"layer": f"pcie_link{ATTACK}", "status": "fail", "measured": {"width": ATTACK},
                    "expected": [ATTACK], "metrics": {"peer_gbs": 1.0}, "why": f"why {ATTACK}",
                    "remedy": f"do {ATTACK}"}]
    tracker.errors.append(f"error {ATTACK}")


def test_the_summary_and_the_ladder_print_no_escape_sequence_on_a_terminal_or_in_a_pipe():
    tracker = Tracker()
    _box_said(tracker)
    for stream in (Pipe(), Tty()):
        console = display.make_console(stream)
        display.print_summary(tracker, console, f"/state/runs/{ATTACK}")
        text = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())  # a terminal's own colours are rich's, not the box's
        assert not any(byte in text for byte in OBEYED), (type(stream).__name__, text)
        flat = "".join(text.split())
        for said in (f"task{SHOWN}", f"lineone{SHOWN}", f"build{SHOWN}", f"why{SHOWN}", f"do{SHOWN}",
                     f"error{SHOWN}", SHOWN):
            assert said in flat, (type(stream).__name__, said)
        assert "line two" in text  # a failure message keeps its lines


def test_progress_lines_echo_a_module_message_without_its_escape_sequences():
    """The plain progress lines of a run (a pipe, a CI log) carry each failed task's message: from the box."""
    tracker = Tracker()
    stream = Pipe()
    display.PlainProgress(tracker, stream)
    tracker.handle({"event": "playbook_on_task_start", "event_data": {"task": f"Collect {ATTACK}"}})
    tracker.handle({"event": "runner_on_failed", "event_data": {"host": "rig-a", "task": f"Collect {ATTACK}",
                                                                "res": {"msg": f"nope {ATTACK}"}}})
    text = stream.getvalue()
    assert not any(byte in text for byte in OBEYED), text
    assert f"  TASK Collect {SHOWN}\n" in text and f"nope {SHOWN}" in text
    # the ticker's "still in" lines name the host and the task the same way
    assert display.still_lines([Running(f"rig{ATTACK}", f"t{ATTACK}", 99.0, 0)], 30) == [
        f"  ... rig{SHOWN}: still in 't{SHOWN}' after 1m39s"]


def test_a_tasks_warnings_reach_the_summary_bounded_and_terminal_safe():
    """A task that warned (the group build's "archive not used, this box builds its own") is named in the summary;
    a task warning in a loop gives at most MAX_WARNINGS lines."""
    tracker = Tracker()
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "rig-b", "task": "Plan this box's part", "res": {"warnings": [
            f"rccl-1.tar.gz: not used: its record names other bytes {ATTACK}; this box builds its own"]}}})
    for n in range(30):
        tracker.handle({"event": "runner_on_ok", "event_data": {"host": "rig-c", "task": "loop",
                                                                "res": {"warnings": [f"w{n}"], "changed": False}}})
    stream = Pipe()
    display.print_summary(tracker, display.make_console(stream), None)
    text = stream.getvalue()
    assert "\x1b" not in text
    assert ("rig-b: warning at task 'Plan this box's part': rccl-1.tar.gz: not used: its record names other bytes "
            f"{SHOWN}; this box builds its own") in text
    assert text.count("rig-c: warning at task 'loop'") == 20 and "w19" in text and "w20" not in text


# --- failure codes (issue 37, docs/codes.md) -----------------------------------------------------------------------

CODED = [
    {"layer": "nccl_transport", "status": "fail", "code": "RB-P2P-SHM-FALLBACK",
     "codes": ["RB-P2P-SHM-FALLBACK", "RB-HW-AER-CORRECTABLE"], "measured": "via SHM", "why": "SHM, not P2P",
     "remedy": "check the peer layers"},
    {"layer": "serving", "status": "warn", "code": "RB-SERVING-API-KEY-LOGGED", "why": "key in the log"},
    {"layer": "firmware", "status": "pass", "code": "RB-NEVER-SHOWN", "why": "ok"},  # a pass shows no code
]


def test_the_code_stands_beside_the_status_in_the_plain_blocks_and_the_table():
    stream = Pipe()
    display.print_ladder(display.make_console(stream), "rig-a", CODED)
    lines = stream.getvalue().splitlines()
    assert "  nccl_transport: fail [RB-P2P-SHM-FALLBACK]" in lines
    assert "    codes: RB-P2P-SHM-FALLBACK, RB-HW-AER-CORRECTABLE" in lines  # every finding's, the worst first
    assert "  serving: warn [RB-SERVING-API-KEY-LOGGED]" in lines and "  firmware: pass" in lines
    assert "RB-NEVER-SHOWN" not in stream.getvalue()
    tty = io.StringIO()
    console = type(display.make_console(tty))(file=tty, force_terminal=True, width=200, no_color=True)
    display.print_ladder(console, "rig-a", CODED)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue())
    rows = {line.split()[0]: line.split() for line in plain.splitlines() if line.strip()}
    assert rows["nccl_transport"][1:3] == ["fail", "[RB-P2P-SHM-FALLBACK]"]
    assert rows["serving"][1:3] == ["warn", "[RB-SERVING-API-KEY-LOGGED]"]
    assert "RB-NEVER-SHOWN" not in tty.getvalue()


def test_a_failed_task_s_code_is_in_the_summary_and_a_box_s_code_prints_no_escape_sequence():
    tracker = Tracker()
    tracker.handle({"event": "runner_on_failed", "event_data": {
        "host": "rig-a", "task": "Ladder 6-9", "res": {"msg": "p2p_bandwidth: fail: slow", "code": "RB-P2P-SLOW"}}})
    tracker.handle({"event": "runner_on_failed", "event_data": {
        "host": "rig-b", "task": "T", "res": {"msg": "nope", "code": f"RB-X{ATTACK}"}}})  # not a code: left out
    hosts = tracker.summary()
    assert hosts["rig-a"]["failures"][0]["code"] == "RB-P2P-SLOW" and "code" not in hosts["rig-b"]["failures"][0]
    host = tracker.host("rig-c")
    host.ladder = [{"layer": "pcie_link", "status": "fail", "code": f"RB-{ATTACK}", "why": "x8"}]
    for stream in (Pipe(), Tty()):
        display.print_summary(tracker, display.make_console(stream), None)
        text = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())
        assert "rig-a: FAILED at task 'Ladder 6-9' [RB-P2P-SLOW]: p2p_bandwidth: fail: slow" in " ".join(text.split())
        assert "rig-b: FAILED at task 'T': nope" in text
        assert not any(byte in text for byte in OBEYED) and f"RB-{SHOWN}" in "".join(text.split())
