"""What a person sees: a live view on a terminal, plain lines elsewhere, and the end-of-run summary."""

from __future__ import annotations

import sys
from typing import TextIO

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rigbook.tracker import Tracker

STATE_STYLE = {
    "waiting": "dim",
    "running": "cyan",
    "interrupted": "red",
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "unreachable": "bold magenta",
}
VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "unknown": "magenta"}


# Not a terminal (a pipe, a CI log): there is no screen width to fit, so a table is as wide as its content and a
# line is never wrapped or cut (rich would otherwise assume 80 columns and end cells in an ellipsis).
PLAIN_WIDTH = 100_000


def make_console(stream: TextIO) -> Console:
    tty = stream.isatty()
    return Console(file=stream, force_terminal=tty, no_color=not tty, highlight=False, soft_wrap=not tty,
                   width=None if tty else PLAIN_WIDTH)


class PlainProgress:
    """One line per play, task and host result: for CI logs and pipes (no control codes)."""

    def __init__(self, tracker: Tracker, stream: TextIO):
        self.stream = stream
        tracker.listeners.append(self.on_line)

    def on_line(self, line) -> None:
        kind, host, text = line
        if kind == "play":
            out = f"PLAY {text}"
        elif kind == "task":
            out = f"  TASK {text}"
        elif kind in ("ok", "skipped"):
            return
        else:
            out = f"    {kind}: {host}: {text}"
        print(out, file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class LiveProgress:
    """A table of hosts (state, current task, tasks done) refreshed as events arrive."""

    def __init__(self, tracker: Tracker, console: Console, title: str):
        self.tracker = tracker
        self.console = console
        self.title = title
        self.live = Live(self.render(), console=console, refresh_per_second=8, transient=True)
        tracker.listeners.append(self.on_line)

    def render(self):
        table = Table(box=box.SIMPLE, expand=False, title=self.title, title_justify="left")
        for column in ("host", "state", "task", "done", "ok", "changed", "failed"):
            table.add_column(column)
        for name in sorted(self.tracker.hosts):
            h = self.tracker.hosts[name]
            table.add_row(
                name,
                Text(h.state, style=STATE_STYLE.get(h.state, "")),
                h.task[:60],
                str(h.tasks_done),
                *(str(h.counts[k]) for k in ("ok", "changed", "failed")),
            )
        play = Text(f"play: {self.tracker.play}   task: {self.tracker.task}", style="dim")
        return Group(play, table)

    def on_line(self, line) -> None:
        kind, host, text = line
        if kind in ("failed", "unreachable"):
            self.live.console.print(Text(f"{kind}: {host}: {text}", style=STATE_STYLE.get(kind, "")))
        self.live.update(self.render())

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.update(self.render())
        return self.live.__exit__(*exc)


def progress_for(tracker: Tracker, stream: TextIO, title: str):
    if stream.isatty():
        return LiveProgress(tracker, make_console(stream), title)
    return PlainProgress(tracker, stream)


def print_summary(tracker: Tracker, console: Console, run_dir) -> None:
    tty = console.is_terminal
    table = Table(box=box.SIMPLE_HEAD if tty else box.ASCII, title="summary", title_justify="left")
    for column in ("host", "state", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column in ("host", "state") else "right")
    for name in sorted(tracker.hosts):
        h = tracker.hosts[name]
        table.add_row(
            name,
            Text(h.state, style=STATE_STYLE.get(h.state, "")),
            *(str(h.counts[k]) for k in ("ok", "changed", "failed", "unreachable", "skipped")),
        )
    console.print(table)
    for name in sorted(tracker.hosts):
        h = tracker.hosts[name]
        if h.ladder:
            print_ladder(console, name, h.ladder)
        for failure in h.failures:
            what = "UNREACHABLE" if failure.get("unreachable") else "FAILED"
            console.print(Text(f"{name}: {what} at task '{failure['task']}': {failure['msg']}", style="red"))
        if h.reboot_requested:
            console.print(f"{name}: a reboot is needed")
        if h.interrupted_in:
            console.print(Text(f"{name}: INTERRUPTED in task '{h.interrupted_in}': run the same command again; "
                               "each role checks the host first and finishes what was cut short", style="red"))
    for error in tracker.errors:
        console.print(Text(error, style="red"))
    if run_dir:
        console.print(f"run artifacts: {run_dir}")


def print_ladder(console: Console, host: str, ladder: list) -> None:
    """HOST's ladder: on a terminal a table (cells wrap, never cut) then why / what to do of each layer that is not
    fine; elsewhere one block per layer, every field on its own line in full (a CI log keeps every figure)."""
    if not console.is_terminal:
        _print_ladder_blocks(console, host, ladder)
        return
    table = Table(box=box.SIMPLE, title=f"P2P ladder: {host}", title_justify="left")
    for column in ("layer", "status", "measured", "expected"):
        table.add_column(column, overflow="fold")
    for verdict in ladder:
        status = str(verdict.get("status", "unknown"))
        table.add_row(
            Text(str(verdict.get("layer"))),
            Text(status, style=VERDICT_STYLE.get(status, "")),
            Text(_text(verdict.get("measured"))),
            Text(_text(verdict.get("expected"))),
        )
    console.print(table)
    for verdict in ladder:
        if verdict.get("status") in ("fail", "warn", "unknown") and (verdict.get("why") or verdict.get("remedy")):
            console.print(Text(f"  {verdict['layer']}: {verdict.get('why', '')}"))
            if verdict.get("remedy"):
                console.print(Text(f"    what to do: {verdict['remedy']}"))


def ladder_blocks(host: str, ladder: list) -> list:
    """The plain-text ladder, one block per layer: lines of full text, nothing shortened."""
    lines = [f"P2P ladder: {host}"]
    for verdict in ladder:
        lines.append(f"  {verdict.get('layer')}: {verdict.get('status', 'unknown')}")
        for key, label in (("measured", "measured"), ("expected", "expected"), ("metrics", "figures"),
                           ("baseline", "judged by baseline"), ("why", "why"), ("remedy", "what to do")):
            value = verdict.get(key)
            if key == "metrics" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if v is not None} or None
            if value not in (None, "", {}, []):
                lines.append(f"    {label}: {_text(value)}")
    return lines


def _print_ladder_blocks(console: Console, host: str, ladder: list) -> None:
    for line in ladder_blocks(host, ladder):
        console.print(Text(line), soft_wrap=True)


def _nested(value) -> str:
    """A value inside a measured/expected mapping: a mapping of its own as "(k v, ...)", unknowns left out."""
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {_nested(v)}" for k, v in value.items() if v is not None) + ")"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    return str(value)


def _text(value) -> str:
    """A measured / expected value as one line of text, in full."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_nested(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_nested(v) for v in value)
    return str(value)


def stderr_console() -> Console:
    return make_console(sys.stderr)
