"""What a person sees: a live view on a terminal, plain lines elsewhere, and the end-of-run summary."""

from __future__ import annotations

import os
import sys
import threading
from typing import TextIO

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rigbook.terminal import terminal_safe
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
    """The one place the CLI makes a rich console. Markup and emoji codes are off: what it prints (paths, host
    names, messages, values from files) is text as it is, so `[/x]` or `[bold]` in a name is printed, never read as
    a style (nor a MarkupError); styles are given as Text(..., style=...) only."""
    tty = stream.isatty()
    return Console(file=stream, force_terminal=tty, no_color=not tty, highlight=False, soft_wrap=not tty,
                   width=None if tty else PLAIN_WIDTH, markup=False, emoji=False)


PROGRESS_EVERY_ENV = "RIGBOOK_PROGRESS_EVERY"
PROGRESS_EVERY_DEFAULT = 30.0


def elapsed(seconds: float) -> str:
    """42s, 1m30s, 2h05m: whole seconds, for a person."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_every(environ=None) -> tuple:
    """(seconds between the plain "still in" lines, or None for none; a warning line or None), from
    RIGBOOK_PROGRESS_EVERY: seconds (a float), 0 or off for no lines, unset for every 30 s."""
    raw = (os.environ if environ is None else environ).get(PROGRESS_EVERY_ENV, "").strip()
    if not raw:
        return PROGRESS_EVERY_DEFAULT, None
    if raw.lower() in ("0", "off", "no", "false"):
        return None, None
    try:
        every = float(raw)
    except ValueError:
        every = -1.0
    if not every > 0 or every == float("inf"):
        return PROGRESS_EVERY_DEFAULT, (f"{PROGRESS_EVERY_ENV}={raw!r} is not a number of seconds > 0 (or 0/off): "
                                        f"printing progress every {PROGRESS_EVERY_DEFAULT:g}s")
    return every, None


def time_in_task(r) -> str:
    """How long a Running host has been in its task, with the polls of an async job: "1m30s (poll 6)"."""
    return elapsed(r.elapsed) + (f" (poll {r.polls})" if r.polls else "")


def still_lines(running: list, every: float) -> list:
    """The plain progress lines of hosts in a task for at least EVERY seconds (running: tracker.running())."""
    return [terminal_safe(f"  ... {r.host}: still in '{r.task}' after {time_in_task(r)}")
            for r in running if r.elapsed >= every]


class Ticker:
    """A daemon thread that every EVERY seconds writes (through EMIT) one line per host in a task for at least that
    long; nothing while every task is short. stop() ends it: once stop() returns it writes nothing more."""

    def __init__(self, tracker: Tracker, every: float, emit):
        self.tracker = tracker
        self.every = every
        self.emit = emit
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="rigbook-progress", daemon=True)

    def start(self) -> Ticker:
        self.thread.start()
        return self

    def tick(self) -> list:
        lines = still_lines(self.tracker.running(), self.every)
        for line in lines:
            self.emit(line, self.stopped)
        return lines

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a progress line is never worth a traceback in the middle of a run
                pass

    def stop(self) -> None:
        self.stopped.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)


class PlainProgress:
    """One line per play, task and host result: for CI logs and pipes (no control codes). Long tasks get a
    "still in" line per host every EVERY seconds (a Ticker, started and stopped with the run)."""

    def __init__(self, tracker: Tracker, stream: TextIO, every: float | None = None):
        self.stream = stream
        self.lock = threading.Lock()  # the ticker's lines and the event lines, each written whole
        self.ticker = Ticker(tracker, every, self.write) if every else None
        tracker.listeners.append(self.on_line)

    def write(self, text: str, stopped: threading.Event | None = None) -> None:
        with self.lock:
            if stopped is not None and stopped.is_set():
                return  # the ticker was stopped while this line waited: the run is over, the summary may be out
            self.stream.write(text + "\n")
            self.stream.flush()

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
        self.write(terminal_safe(out, newlines=True))

    def __enter__(self):
        if self.ticker:
            self.ticker.start()
        return self

    def __exit__(self, *exc):
        if self.ticker:
            self.ticker.stop()
        return False


class LiveProgress:
    """A table of hosts (state, current task, time in it and polls so far, tasks done), drawn afresh from the tracker
    8 times a second on rich's refresh thread (render() is its get_renderable), so the time runs between events."""

    def __init__(self, tracker: Tracker, console: Console, title: str):
        self.tracker = tracker
        self.console = console
        self.title = title
        self.live = Live(console=console, refresh_per_second=8, transient=True, get_renderable=self.render)
        tracker.listeners.append(self.on_line)

    def render(self):
        table = Table(box=box.SIMPLE, expand=False, title=self.title, title_justify="left")
        for column in ("host", "state", "task", "time", "done", "ok", "changed", "failed"):
            table.add_column(column)
        times = {r.host: r for r in self.tracker.running()}
        with self.tracker.lock:
            rows = [(h.name, h.state, h.task, h.tasks_done, dict(h.counts))
                    for _, h in sorted(self.tracker.hosts.items())]
            play = Text(terminal_safe(f"play: {self.tracker.play}   task: {self.tracker.task}"), style="dim")
        for name, state, task, done, counts in rows:
            now = times.get(name)
            when = time_in_task(now) if now else ""
            table.add_row(
                Text(terminal_safe(name)),
                Text(state, style=STATE_STYLE.get(state, "")),
                Text(terminal_safe(task[:60])),
                Text(when, style="cyan"),
                str(done),
                *(str(counts[k]) for k in ("ok", "changed", "failed")),
            )
        return Group(play, table)

    def on_line(self, line) -> None:
        kind, host, text = line
        if kind in ("failed", "unreachable"):
            self.live.console.print(Text(terminal_safe(f"{kind}: {host}: {text}", newlines=True),
                                         style=STATE_STYLE.get(kind, "")))
        # the table itself is redrawn by rich's refresh thread (8 a second), from the tracker as it is then

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        return self.live.__exit__(*exc)


def progress_for(tracker: Tracker, stream: TextIO, title: str, every: float | None = None):
    """The live view on a terminal; elsewhere plain lines, with a "still in" line per long-running host every EVERY
    seconds (None: none)."""
    if stream.isatty():
        return LiveProgress(tracker, make_console(stream), title)
    return PlainProgress(tracker, stream, every)


def print_summary(tracker: Tracker, console: Console, run_dir) -> None:
    tty = console.is_terminal
    table = Table(box=box.SIMPLE_HEAD if tty else box.ASCII, title="summary", title_justify="left")
    for column in ("host", "state", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column in ("host", "state") else "right")
    for name in sorted(tracker.hosts):
        h = tracker.hosts[name]
        table.add_row(
            Text(terminal_safe(name)),
            Text(h.state, style=STATE_STYLE.get(h.state, "")),
            *(str(h.counts[k]) for k in ("ok", "changed", "failed", "unreachable", "skipped")),
        )
    console.print(table)
    for name in sorted(tracker.hosts):
        h = tracker.hosts[name]
        if h.ladder:
            print_ladder(console, name, h.ladder)
        for note in h.notes:
            console.print(Text(terminal_safe(f"{name}: {note['msg']}")))
        for failure in h.failures:
            what = "UNREACHABLE" if failure.get("unreachable") else "FAILED"
            code = f" [{failure['code']}]" if failure.get("code") else ""
            console.print(Text(terminal_safe(f"{name}: {what} at task '{failure['task']}'{code}: {failure['msg']}",
                                             newlines=True), style="red"))
        for warning in h.warnings:
            console.print(Text(terminal_safe(f"{name}: warning at task '{warning['task']}': {warning['msg']}"),
                               style="yellow"))
        if h.reboot_requested:
            console.print(Text(terminal_safe(f"{name}: a reboot is needed")))
        if h.interrupted_in:
            console.print(Text(terminal_safe(f"{name}: INTERRUPTED in task '{h.interrupted_in}': run the same "
                                             "command again; each role checks the host first and finishes what "
                                             "was cut short"), style="red"))
    for error in tracker.errors:
        console.print(Text(terminal_safe(error, newlines=True), style="red"))
    if run_dir:
        console.print(Text(terminal_safe(f"run artifacts: {run_dir}")))


def print_ladder(console: Console, host: str, ladder: list) -> None:
    """HOST's ladder: on a terminal a table (cells wrap, never cut) then why / what to do of each layer that is not
    fine; elsewhere one block per layer, every field on its own line in full (a CI log keeps every figure)."""
    if not console.is_terminal:
        _print_ladder_blocks(console, host, ladder)
        return
    table = Table(box=box.SIMPLE, title=Text(terminal_safe(f"P2P ladder: {host}")), title_justify="left")
    for column in ("layer", "status", "measured", "expected"):
        table.add_column(column, overflow="fold")
    for verdict in ladder:
        status = str(verdict.get("status", "unknown"))
        cell = Text(terminal_safe(status), style=VERDICT_STYLE.get(status, ""))
        if code_of(verdict):
            cell.append(terminal_safe(f" [{code_of(verdict)}]"))
        table.add_row(
            Text(terminal_safe(verdict.get("layer"))),
            cell,
            Text(terminal_safe(_text(verdict.get("measured")))),
            Text(terminal_safe(_text(verdict.get("expected")))),
        )
    console.print(table)
    for verdict in ladder:
        if verdict.get("status") in ("fail", "warn", "unknown") and (verdict.get("why") or verdict.get("remedy")):
            console.print(Text(terminal_safe(f"  {verdict['layer']}: {verdict.get('why', '')}")))
            if verdict.get("remedy"):
                console.print(Text(terminal_safe(f"    what to do: {verdict['remedy']}")))


def code_of(verdict: dict) -> str:
    """The failure code of a VERDICT that is not a pass (docs/codes.md), "" otherwise."""
    code = verdict.get("code") if verdict.get("status") != "pass" else None
    return str(code) if code else ""


def ladder_blocks(host: str, ladder: list) -> list:
    """The plain-text ladder, one block per layer: lines of full text, nothing shortened (each made terminal_safe:
    one line each, whatever a box put in a value)."""
    lines = [f"P2P ladder: {host}"]
    for verdict in ladder:
        code = f" [{code_of(verdict)}]" if code_of(verdict) else ""
        lines.append(f"  {verdict.get('layer')}: {verdict.get('status', 'unknown')}{code}")
        codes = verdict.get("codes")
        if isinstance(codes, list) and len(codes) > 1:
            lines.append(f"    codes: {', '.join(str(c) for c in codes)}")
        for key, label in (("measured", "measured"), ("expected", "expected"), ("metrics", "figures"),
                           ("baseline", "judged by baseline"), ("why", "why"), ("remedy", "what to do")):
            value = verdict.get(key)
            if key == "metrics" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if v is not None} or None
            if value not in (None, "", {}, []):
                lines.append(f"    {label}: {_text(value)}")
    return [terminal_safe(line) for line in lines]


def _print_ladder_blocks(console: Console, host: str, ladder: list) -> None:
    for line in ladder_blocks(host, ladder):
        console.print(Text(line), soft_wrap=True)


def nested_text(value) -> str:
    """A value inside a measured/expected mapping: a mapping of its own as "(k v, ...)", unknowns left out."""
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {nested_text(v)}" for k, v in value.items() if v is not None) + ")"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(nested_text(v) for v in value) + "]"
    return str(value)


def _text(value) -> str:
    """A measured / expected value as one line of text, in full."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={nested_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(nested_text(v) for v in value)
    return str(value)


def stderr_console() -> Console:
    return make_console(sys.stderr)
